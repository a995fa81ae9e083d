"""Agents survive a controller killed with SIGKILL, and every coflow completes after a restart.

With the clients' help (they resubmit their open coflows) or without it: the restarted
controller resumes the coflows of its journal by itself.

Real processes on loopback, the system of tests/integration/test_controller_e2e.py (terra-controller
--no-openflow, three terra-agent processes, a TerraClient): the controller is killed (SIGKILL, so
the agents' control channels are reset, not closed), a new one is started on the same ports, the
client resubmits its open coflows on reconnect and the agents re-register and report what they
acknowledged and completed meanwhile.
"""

from __future__ import annotations

import signal
import time

import pytest
from test_controller_e2e import System, assert_digests, flow, wait_until

from terra_controller.client import TerraClient

MB = 1_000_000


@pytest.fixture(scope="module")
def shared_system(tmp_path_factory, pki):
    """One controller and three agents for the module's tests (each starts a controller and
    four processes' worth of imports). Each test submits coflows of its own and ends with
    them done and a controller running, restarted on the same ports and state directory."""
    s = System(tmp_path_factory.mktemp("crash"), pki)
    yield s
    s.stop()


@pytest.fixture
def system(shared_system):
    """`shared_system` with a controller running (a test that failed may have left it dead)
    and the three agents registered with it."""
    if shared_system.ctl.poll() is not None:
        shared_system.start_controller()
    shared_system.wait_agents()
    return shared_system


def kill_controller(system: System) -> None:
    """Freeze the controller (SIGSTOP), let the agents' reports pile up unread in its sockets
    (progress every 0.5 s, heartbeats every 2 s), then SIGKILL it: the kernel answers a close
    with unread data by a reset, so the agents' control channels get ECONNRESET, not an EOF."""
    system.ctl.send_signal(signal.SIGSTOP)
    time.sleep(2.5)
    system.ctl.kill()
    system.ctl.wait(timeout=10)


def agents_alive(system: System) -> dict[str, int | None]:
    """{agent: exit status or None while running}."""
    return {agent: p.poll() for agent, p in system.agents.items()}


def flow_state(system: System, cid: int, fid: str) -> dict:
    return next(f for f in system.client.check_status(cid)["flows"] if f["id"] == fid)


def test_controller_sigkill_mid_transfer_agents_survive_and_coflows_complete(system):
    c = system.client
    # k1 and k2 share B's 40 MB/s ingress (two 20 MB/s links): ~2.5 s of data in all
    first = c.submit_coflow([flow("k1", "a1", "b1", 60 * MB), flow("k2", "c1", "b1", 40 * MB)])
    second = c.submit_coflow([flow("m1", "b1", "c1", 30 * MB)])
    wait_until(lambda: c.check_status(first)["bytes_delivered"] >= 10 * MB, 30, "progress")
    kill_controller(system)
    time.sleep(1.0)  # agents see the reset and retry with backoff; data keeps moving
    assert agents_alive(system) == {"a1": None, "b1": None, "c1": None}
    system.start_controller()
    # the client reconnects, sees a new instance and resubmits both coflows under their ids
    s1 = c.wait(first, timeout=120)
    s2 = c.wait(second, timeout=120)
    assert_digests(s1)
    assert_digests(s2)
    system.wait_agents()  # all three re-registered
    assert agents_alive(system) == {"a1": None, "b1": None, "c1": None}


def test_flow_finished_before_controller_crash_still_completes_its_coflow(system):
    c = system.client
    # "small" (2 MB C->A) finishes within ~0.1 s; "big" (80 MB A->B, <= 40 MB/s) takes >= 2 s
    cid = c.submit_coflow([flow("small", "c1", "a1", 2 * MB), flow("big", "a1", "b1", 80 * MB)])
    wait_until(lambda: flow_state(system, cid, "small")["done"], 30, "small flow done")
    assert not flow_state(system, cid, "big")["done"]
    kill_controller(system)
    system.start_controller()
    # the new controller learns that "small" is done only from its receiver a1
    status = c.wait(cid, timeout=60)
    assert_digests(status)  # includes the digest of "small", reported again by its receiver
    assert agents_alive(system) == {"a1": None, "b1": None, "c1": None}


def fresh_client(system: System) -> TerraClient:
    """A new client of the same job (operator1) that has submitted nothing, so it has nothing
    to resubmit; it replaces the system's client (stop() closes it)."""
    system.client.close()
    host, port = system.api.split(":")
    system.client = TerraClient(host, int(port), pki=system.pki, name="operator1", timeout=20)
    return system.client


def test_a_restarted_controller_resumes_its_coflows_with_no_client_resubmitting(system):
    c = system.client
    start = time.monotonic()
    cid = c.submit_coflow(
        [flow("r1", "a1", "b1", 80 * MB), flow("r2", "c1", "a1", 30 * MB)], name="nightly"
    )
    wait_until(lambda: c.check_status(cid)["bytes_delivered"] >= 10 * MB, 30, "progress")
    c.close()  # the job that submitted it is gone: nobody will resubmit
    kill_controller(system)
    killed_after = time.monotonic() - start
    system.start_controller()
    status = fresh_client(system).wait(cid, timeout=120)
    assert status["state"] == "done" and status["name"] == "nightly"
    assert_digests(status)
    assert status["bytes_delivered"] == status["bytes_total"] == 110 * MB
    assert status["cct_s"] > killed_after  # counted from the first submission
    assert agents_alive(system) == {"a1": None, "b1": None, "c1": None}


def test_a_coflow_done_before_a_restart_keeps_its_status_and_is_not_sent_again(system):
    c = system.client
    cid = c.submit_coflow([flow("d1", "a1", "c1", 4 * MB)])
    done = c.wait(cid, timeout=60)
    assert_digests(done)
    system.stop_controller()
    system.start_controller()
    client = fresh_client(system)
    after = client.check_status(cid)
    assert after["state"] == "done" and after["cct_s"] == done["cct_s"]
    assert after["bytes_delivered"] == after["bytes_total"] == 4 * MB
    listed = {row["id"]: row for row in client.list_coflows()}  # the journal's, listed too
    assert listed[cid]["state"] == "done" and listed[cid]["cct_s"] == done["cct_s"]
    with pytest.raises(Exception, match="already done"):
        client.cancel_coflow(cid)
