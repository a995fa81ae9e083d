"""The scheduling round runs outside the registry lock (snapshot -> allocate -> apply)."""

from __future__ import annotations

import gc
import threading

from test_failure_semantics import flow, make_controller, total_rate


def test_status_and_reports_are_answered_while_a_round_allocates():
    controller, _ = make_controller()
    cid = controller.submit([flow("f", size=10_000_000)])
    inside, release = threading.Event(), threading.Event()
    allocate = controller.policy.allocate

    def slow_allocate(now, remaining):  # the real allocation, held until released
        inside.set()
        assert release.wait(10)
        return allocate(now, remaining)

    controller.policy.allocate = slow_allocate
    gc_was = gc.isenabled()
    round_thread = threading.Thread(target=controller.run_round)
    round_thread.start()
    try:
        assert inside.wait(10)
        # While the policy allocates: status, progress and listing need only the registry.
        assert controller.status(cid)["id"] == cid
        controller.progress(cid, "f", 1_000_000)
        assert controller.status(cid)["bytes_delivered"] == 1_000_000
        assert gc.isenabled() == gc_was  # the round does not switch the collector off
        # A cancel during the allocation: the coflow gets no rates from this round.
        other = controller.registry.get(cid)
        assert other.state.value in ("queued", "running", "preempted")
        controller.cancel(cid)
    finally:
        release.set()
        round_thread.join(10)
    assert not round_thread.is_alive()
    assert total_rate(controller, cid) == 0 and cid not in controller.rates
    assert controller.status(cid)["state"] == "cancelled"


def test_a_coflow_cancelled_mid_round_leaves_the_policy_in_the_next_round():
    controller, _ = make_controller()
    a = controller.submit([flow("f", size=10_000_000)])
    b = controller.submit([flow("g", "hk2", "ba2", 10_000_000)])
    controller.run_round()
    controller.cancel(a)
    controller.run_round()
    assert set(controller.allocation) == {str(b)}
    assert total_rate(controller, b) > 0
