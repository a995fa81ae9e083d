"""A submit naming agents that have not come back yet after a controller restart waits for
them on the controller's loop (controller_resume.await_agents), at most for the return
window."""

from __future__ import annotations

import threading
import time

from terra_controller.controller import Controller
from terra_core.terra_policy import TerraPolicy
from topologies import Topology

FLOWS = [{"id": "f", "src": "a1", "dst": "b1", "bytes": 10**6}]


def controller(window_s: float) -> Controller:
    links = {("A", "B"): 1e8, ("B", "A"): 1e8}
    topology = Topology("pair", ["A", "B"], links)
    c = Controller(topology, TerraPolicy(topology, k=1))
    c.agent_return_s, c.started_mono = window_s, time.monotonic()
    c.register_agent("a1", "A", "127.0.0.1:1")
    return c


def waited(c: Controller) -> tuple[threading.Thread, list[float]]:
    out: list[float] = []

    def run():
        t0 = time.monotonic()
        c.await_agents(FLOWS)
        out.append(time.monotonic() - t0)

    thread = threading.Thread(target=run)
    thread.start()
    return thread, out


def test_a_submit_waits_for_its_agent_and_goes_on_when_it_registers():
    c = controller(window_s=10.0)
    thread, out = waited(c)
    time.sleep(0.3)
    assert not out  # b1 is not back: still waiting
    c.register_agent("a9", "A", "127.0.0.1:9")
    c.agent_registered()  # another agent: it checks again and waits on
    time.sleep(0.1)
    assert not out
    c.register_agent("b1", "B", "127.0.0.1:2")
    c.agent_registered()
    thread.join(5)
    assert out and 0.3 < out[0] < 2.0
    assert c.submit(FLOWS) >= 0
    c.close()


def test_the_wait_ends_with_the_return_window():
    c = controller(window_s=0.4)
    thread, out = waited(c)
    thread.join(5)
    assert out and out[0] < 1.0  # (the submit's own checks then refuse the unknown agent)
    c.close()
