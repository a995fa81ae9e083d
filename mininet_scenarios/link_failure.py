"""The testbed's link failure: a thread that sets a WAN link down and up at its times and
measures the controller's reaction."""

from __future__ import annotations

import threading
import time

from mininet_scenarios.run_result import Failure, RunResult
from mininet_scenarios.testbed_processes import TestbedError, link_capacity


class FailureThread(threading.Thread):
    """Sets the failure link down and up at its times; measures the reaction (Terra run).

    Args:
        wan: the WanNet. failure: the Failure. t0: time.monotonic() of the run's start.
        controller: the TestbedController to watch for the reaction, or None (baseline run).
        result: RunResult receiving failure_down_s / failure_up_s / reaction_s.
        on_event: called with "down" (after the reaction was measured) and "up".
    """

    def __init__(self, wan, failure: Failure, t0: float, controller, result: RunResult,
                 on_event=None):  # fmt: skip
        super().__init__(daemon=True)
        self.on_event = on_event or (lambda kind: None)
        self.wan, self.failure, self.t0 = wan, failure, t0
        self.controller, self.result = controller, result
        self.stop_event = threading.Event()
        self.error: BaseException | None = None
        self.flow_mods_before: int | None = None

    def run(self) -> None:
        try:
            self._run()
        except BaseException as exc:  # reported by the caller
            self.error = exc

    def _run(self) -> None:
        f = self.failure
        if self.stop_event.wait(max(0.0, self.t0 + f.down_s - time.monotonic())):
            return
        before = 0
        if self.controller is not None:
            before = self.controller.get("/status")["reactions_total"]
            self.flow_mods_before = self.controller.get("/tunnels")["switches"]["flow_mods"]
        t_down = time.monotonic()
        self.result.failed_capacity_bps = link_capacity(self.wan, f.a, f.b)
        self.wan.set_link(f.a, f.b, up=False)
        self.result.failure_down_s = t_down - self.t0
        if self.controller is not None:
            self._measure_reaction(before, t_down)
        self.on_event("down")
        if self.stop_event.wait(max(0.0, self.t0 + f.up_s - time.monotonic())):
            self.wan.set_link(f.a, f.b, up=True)
            return
        self.result.failure_up_s = time.monotonic() - self.t0
        self.wan.set_link(f.a, f.b, up=True)
        self.on_event("up")

    def _measure_reaction(self, before: int, t_down: float) -> None:
        end = t_down + 10
        while time.monotonic() < end:
            status = self.controller.get("/status")
            if status["reactions_total"] > before:
                last = status["reactions"][-1]
                if last["event_to_applied_ms"] is not None:
                    self.result.reaction_s = time.monotonic() - t_down
                    self.result.controller_reaction_ms = last["event_to_applied_ms"]
                    return
            time.sleep(0.01)


# ---- the two runs -----------------------------------------------------------------------------


def start_failure(wan, failure, t0, ctl, result, on_event=None) -> FailureThread | None:
    """Start a FailureThread for `failure` (None: no failure, returns None)."""
    if failure is None:
        return None
    thread = FailureThread(wan, failure, t0, ctl, result, on_event)
    thread.start()
    return thread


def finish_failure(thread: FailureThread | None) -> int | None:
    """Stop the failure thread (the link is set up again if it was down); re-raise its error."""
    if thread is None:
        return None
    thread.stop_event.set()
    thread.join(timeout=30)
    if thread.error is not None:
        raise TestbedError(f"link failure thread: {thread.error!r}") from thread.error
    return thread.flow_mods_before
