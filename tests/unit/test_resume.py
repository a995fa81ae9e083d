"""A controller restarted on the same state directory resumes the coflows of its journal.

In-process controllers over one journal directory (no agents run: agents are registered in
the registry as the agent channel would); tests/integration/test_agent_controller_crash.py
does the same with real processes and bytes.
"""

from __future__ import annotations

import threading
import time

import pytest

from terra_controller.coflow_state import RegistryError, flow_key
from terra_controller.controller import Controller
from terra_controller.journal import CoflowJournal, JournalEntry
from terra_core.terra_policy import TerraPolicy
from topologies import Topology

FLOWS = [
    {"id": "f1", "src": "a1", "dst": "b1", "bytes": 10**9},
    {"id": "f2", "src": "b1", "dst": "c1", "bytes": 5 * 10**8, "dst_path": "out/f2"},
]


def controller(state_dir, agents=("a1", "b1", "c1"), **kwargs) -> Controller:
    links = {}
    for u, v in [("A", "B"), ("B", "C"), ("A", "C")]:
        links[(u, v)] = links[(v, u)] = 1e8
    topology = Topology("tri", ["A", "B", "C"], links)
    c = Controller(topology, TerraPolicy(topology, k=2), state_dir=state_dir, **kwargs)
    for agent in agents:
        c.registry.register_agent(agent, agent[0].upper(), "127.0.0.1:30000")
    return c


def test_the_journal_replays_flows_attempts_and_ends(tmp_path):
    first = CoflowJournal(tmp_path)
    rows = [["f1", "a1", "b1", 100, None, "x/y"]]
    first.admitted(3, "job", b"\x02" * 16, ("etl", ("a",)), rows, 30.0, 1_000.0)
    first.added(3, [["f2", "b1", "c1", 50, None, None]])
    first.attempt(3, "f1", 2)
    first.admitted(
        4, "job", b"\x03" * 16, (None, ()), [["g", "a1", "c1", 7, None, None]], None, 5.0
    )
    first.ended(4, {"state": "done", "reason": None, "cct_s": 1.5, "bytes_total": 7,
                    "bytes_delivered": 7})  # fmt: skip
    first.close()
    again = CoflowJournal(tmp_path)
    rows3 = rows + [["f2", "b1", "c1", 50, None, None]]
    want3 = JournalEntry("job", b"\x02" * 16, "etl", ("a",), rows3, 30.0, 1_000.0, {"f1": 2})
    assert again.live[3] == want3 and again.live[3].resumable
    assert again.live[4].ended == {"state": "done", "reason": None, "cct_s": 1.5,
                                   "bytes_total": 7, "bytes_delivered": 7}  # fmt: skip
    assert not again.live[4].resumable and again.live[4].flows == []
    again._rewrite()  # compaction keeps the same entries
    again.close()
    third = CoflowJournal(tmp_path)
    assert third.live[3] == want3 and third.live[4] == again.live[4]
    third.close()


def test_a_restarted_controller_resumes_a_coflow_with_its_arrival_keys_and_attempts(tmp_path):
    first = controller(tmp_path)
    cid = first.submit(FLOWS, deadline=3600, name="etl", tags=["nightly"])
    assert first.fail_flow(cid, "f1", "digest mismatch", retry=True) == "restarted"
    secret = first.registry.get(cid).secret
    first.close()
    time.sleep(0.05)
    second = controller(tmp_path, agents=())
    assert list(second.resuming) == [cid] and cid not in second.registry.coflows
    waiting = second.status(cid)
    assert waiting["state"] == "queued" and "waiting for agents a1, b1, c1" in waiting["reason"]
    assert second.resume() == []  # its agents are not back
    for agent in ("a1", "b1", "c1"):
        second.registry.register_agent(agent, agent[0].upper(), "127.0.0.1:30000")
    assert second.resume() == [cid]
    coflow = second.registry.get(cid)
    assert coflow.submitted_s < -0.04  # arrival kept: the CCT counts from the first submit
    assert coflow.deadline_s == pytest.approx(3600)  # the same instant as before
    assert (coflow.name, coflow.tags, coflow.secret) == ("etl", ("nightly",), secret)
    f1, f2 = coflow.flows["f1"], coflow.flows["f2"]
    assert f1.restarts == 1 and f1.digest_key == flow_key(secret, "f1", 1)
    assert f2.restarts == 0 and f2.dst_path == "out/f2"
    assert second.registry.sinks  # its file is busy again
    assert second.resuming == {}
    second.close()


def test_a_coflow_whose_agents_stay_away_fails_with_their_names(tmp_path):
    first = controller(tmp_path)
    cid = first.submit(FLOWS)
    first.close()
    second = controller(tmp_path, agents=("a1",), agent_timeout_s=0.0)
    assert second.check_timeouts() == []
    status = second.status(cid)
    assert status["state"] == "failed" and "agents b1, c1 did not register" in status["reason"]
    assert status["bytes_total"] == 15 * 10**8 and status["bytes_delivered"] == 0
    with pytest.raises(RegistryError, match="already failed"):
        second.cancel(cid)
    second.close()
    third = controller(tmp_path)  # the end is in the journal too
    assert third.resuming == {} and third.status(cid)["state"] == "failed"
    third.close()


def test_a_deadline_that_passed_while_the_controller_was_down_fails_the_coflow(tmp_path):
    journal = CoflowJournal(tmp_path)
    rows = [["f1", "a1", "b1", 100, None, None]]
    journal.admitted(0, None, b"\x01" * 16, (None, ()), rows, 10.0, time.time() - 60)
    journal.close()
    c = controller(tmp_path)
    assert c.resume() == []
    status = c.status(0)
    assert status["state"] == "failed" and status["reason"].startswith("deadline missed")
    c.close()


def test_a_coflow_waiting_to_resume_can_be_cancelled(tmp_path):
    first = controller(tmp_path)
    cid = first.submit(FLOWS, name="x")
    first.close()
    second = controller(tmp_path, agents=())
    assert second.cancel(cid)["state"] == "cancelled"
    for agent in ("a1", "b1", "c1"):
        second.registry.register_agent(agent, agent[0].upper(), "127.0.0.1:30000")
    assert second.resume() == [] and cid not in second.registry.coflows
    second.close()


def test_a_resubmission_of_a_coflow_done_before_the_restart_does_not_run_it_again(tmp_path):
    first = controller(tmp_path)
    cid = first.submit([{"id": "f", "src": "a1", "dst": "b1", "bytes": 100}], owner="job")
    first.complete(cid, "f", "00" * 32)
    assert first.status(cid)["state"] == "done"
    first.close()
    second = controller(tmp_path)
    again = second.submit([{"id": "f", "src": "a1", "dst": "b1", "bytes": 100}], coflow_id=cid,
                          owner="job")  # fmt: skip
    assert again == cid and cid not in second.registry.coflows
    assert second.status(cid)["state"] == "done"
    with pytest.raises(RegistryError, match="in use"):  # another job may not take it over
        second.submit([{"id": "f", "src": "a1", "dst": "b1", "bytes": 100}], coflow_id=cid,
                      owner="intruder")  # fmt: skip
    second.close()


def test_a_submit_just_after_a_restart_waits_for_its_agents_instead_of_being_refused(tmp_path):
    fresh = controller(tmp_path / "fresh", agents=())
    begun = time.monotonic()
    fresh.await_agents(FLOWS)  # no past: no agent is expected back
    assert time.monotonic() - begun < 0.5
    before = controller(tmp_path)
    before.submit(FLOWS)
    before.close()
    time.sleep(0.05)
    c = controller(tmp_path, agents=())
    c.resuming.clear()  # this test is about new submits, not the resumed coflow
    with pytest.raises(RegistryError, match="unknown agent"):
        c.submit(FLOWS)  # the registry alone refuses it: the API waits first
    done = []
    waiter = threading.Thread(target=lambda: done.append((c.await_agents(FLOWS),
                                                          time.monotonic())))  # fmt: skip
    waiter.start()
    time.sleep(0.3)
    assert not done  # a1, b1, c1 have not registered
    for agent in ("a1", "b1", "c1"):
        c.registry.register_agent(agent, agent[0].upper(), "127.0.0.1:30000")
        registered = time.monotonic()
        c.agent_registered()
    waiter.join(5)
    assert done and done[0][1] - registered < 1.0
    assert c.submit([dict(f, id=f"n{i}") for i, f in enumerate(FLOWS)]) >= 0


def test_after_the_agents_return_window_an_unknown_agent_is_refused_at_once(tmp_path):
    c = controller(tmp_path)
    c.started_mono -= 10.0  # started 10 s ago: past the window
    typo = [dict(FLOWS[0], dst="b2")]
    begun = time.monotonic()
    c.await_agents(typo)
    assert time.monotonic() - begun < 0.5
    with pytest.raises(RegistryError, match="unknown agent 'b2'"):
        c.submit(typo)
    c.started_mono = time.monotonic()
    begun = time.monotonic()
    c.await_agents(typo, window_s=0.4)  # within the window it waits, but not past it
    assert 0.3 < time.monotonic() - begun < 2.0


def test_coflows_ended_before_a_restart_are_listed_for_their_owner_only(tmp_path):
    first = controller(tmp_path)
    cid = first.submit(FLOWS[:1], owner="job1")
    first.cancel(cid)
    first.close()
    second = controller(tmp_path)
    assert [s["id"] for s in second.journal_only_statuses("job1")] == [cid]
    assert second.journal_only_statuses("job2") == []
    assert [s["state"] for s in second.journal_only_statuses(every=True)] == ["cancelled"]
