"""The controller's owner loop: work handed to it runs on its thread, one piece at a time;
the policy is held by one holder at a time; errors come back to the caller."""

from __future__ import annotations

import threading
import time

import pytest
import trio

from terra_controller.owner_loop import OwnerLoop


@pytest.fixture
def loop():
    owner = OwnerLoop("test-owner")
    yield owner
    owner.stop()


def test_work_runs_on_the_loops_thread_and_errors_come_back(loop):
    assert loop.run(threading.current_thread) is loop.thread
    assert loop.run(lambda a, b: a + b, 2, 3) == 5
    with pytest.raises(KeyError, match="nope"):
        loop.run(lambda: {}["nope"])
    assert loop.run(lambda: loop.on_loop)  # and a call made on the loop runs at once
    assert loop.run(lambda: loop.run(lambda: 7)) == 7


def test_work_from_many_threads_never_overlaps(loop):
    inside, most, counts = [0], [0], {"n": 0}

    def step() -> None:
        inside[0] += 1
        most[0] = max(most[0], inside[0])
        n = counts["n"]
        time.sleep(0.0001)  # a thread switch here would expose an unguarded read-modify-write
        counts["n"] = n + 1
        inside[0] -= 1

    threads = [threading.Thread(target=lambda: [loop.run(step) for _ in range(200)])
               for _ in range(4)]  # fmt: skip
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert counts["n"] == 800 and most[0] == 1


def test_a_round_holds_the_policy_and_the_worker_runs_off_the_loop(loop):
    started, release = threading.Event(), threading.Event()
    order: list[str] = []

    def allocate() -> str:
        assert not loop.on_loop
        started.set()
        release.wait(5)
        order.append("round")
        return "rates"

    async def round_task() -> None:
        order.append(await loop.holding_policy(lambda: loop.in_worker(allocate)))

    loop.start_task(round_task)
    assert started.wait(5)
    assert loop.run(lambda: "served") == "served"  # the loop serves others meanwhile
    with pytest.raises(trio.WouldBlock):  # on the loop, the held policy cannot be waited for
        loop.run(lambda: loop.run_with_policy(lambda: None))
    admitted = threading.Thread(target=lambda: order.append(loop.run_with_policy(lambda: "in")))
    admitted.start()
    time.sleep(0.05)
    assert order == []  # the admission waits for the round
    release.set()
    admitted.join(5)
    assert order == ["round", "rates", "in"]


def test_a_worker_error_reaches_the_awaiting_task(loop):
    async def failing() -> str:
        try:
            await loop.in_worker(lambda: 1 / 0)
        except ZeroDivisionError:
            return "caught"
        return "not raised"

    assert loop.run_async(failing) == "caught"


def test_after_stop_work_runs_in_the_calling_thread():
    owner = OwnerLoop("test-stopped")
    owner.stop()
    assert not owner.running
    assert owner.run(threading.current_thread) is threading.current_thread()


def test_a_failed_loop_refuses_work_instead_of_running_it_unguarded():
    owner = OwnerLoop("test-failed")

    async def broken() -> None:
        raise ValueError("a bug in a task")

    owner.start_task(broken)
    owner.thread.join(5)
    assert isinstance(owner.failed, BaseExceptionGroup | ValueError)
    with pytest.raises(RuntimeError, match="failed"):
        owner.run(lambda: None)
