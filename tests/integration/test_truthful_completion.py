"""A coflow is done only on reports about its own flows' current attempts, from their own
endpoints; ids are never reused; a file is written by one flow at a time.

Controllers run in this process with their real agent channel (mutual TLS) and API server;
agents are in-test peers speaking terra_wire/control.py. Triangle WAN A, B, C as in
tests/integration/test_controller_channel.py.
"""

from __future__ import annotations

import socket
import threading
import time

import pytest
from test_controller_channel import Agent, Endpoint, daemon_spawn, triangle, wait_until
from tls_helpers import security

from terra_controller import agent_core, coflow_registry
from terra_controller.agent_channel import AgentChannel, start_agent_server
from terra_controller.api_server import ApiHandler, serve_connection_on_loop
from terra_controller.client import TerraClient, TerraError
from terra_controller.coflow_state import RegistryError
from terra_controller.controller import Controller
from terra_controller.request_checks import MAX_FLOWS_PER_REQUEST
from terra_controller.transport import listen_and_serve, stop_listener
from terra_controller.tunnel_table import TunnelTable
from terra_core.terra_policy import TerraPolicy
from terra_wire import control as protocol

CAP = 1e8
DIGEST = "ab" * 32


class System:
    """A controller with its agent channel on a real TLS listener (state_dir: its journal)."""

    def __init__(self, pki, state_dir=None) -> None:
        topology = triangle()
        kwargs = {} if state_dir is None else {"state_dir": state_dir}
        self.controller = Controller(topology, TerraPolicy(topology, k=2), **kwargs)
        self.chan = AgentChannel(self.controller, TunnelTable(topology, 2))
        self.listener, _, bound = start_agent_server(
            self.chan, "127.0.0.1", 0, security(pki), daemon_spawn
        )
        self.addr, self.pki = bound, pki

    def stop(self) -> None:
        stop_listener(self.listener)
        self.chan.close_all(grace_s=0)
        self.controller.close()


class Peer(Agent):
    """An in-test agent of `system` (test_controller_channel.Agent), registered."""

    def __init__(self, system: System, agent: str, dc: str, port: int, inflight=None) -> None:
        addr = Endpoint(system.addr)
        addr.pki = system.pki
        super().__init__(addr, agent, dc, port, inflight=inflight)
        self.wait_for(lambda m: m["t"] == "registered")


def complete(spec: dict, tag: str | None = None) -> dict:
    """The receiver's "complete" of a descriptor, with its attempt's tag (or `tag`)."""
    k = protocol.report_tag(spec["digest_key"]) if tag is None else tag
    return protocol.complete_message(spec["coflow"], spec["flow"], DIGEST, spec["size"], k)


def submitted_then_stopped(system: System, finish: bool) -> tuple[int, dict]:
    """Submit one flow a1 -> b1 on `system` (in-test agents), let b1 complete it when
    `finish`, then stop the system and both agents: (coflow id, b1's descriptor)."""
    a1, b1 = Peer(system, "a1", "A", 30000), Peer(system, "b1", "B", 31000)
    cid = system.controller.submit(one_flow())
    spec = b1.spec(cid, "f")
    if finish:
        b1.send(complete(spec))
        wait_until(lambda: system.controller.status(cid)["state"] == "done")
    system.stop()
    a1.close()
    b1.close()
    return cid, spec


def one_flow(**extra) -> list[dict]:
    return [{"id": "f", "src": "a1", "dst": "b1", "bytes": 10_000_000, **extra}]


@pytest.fixture
def systems(pki):
    started: list[System] = []

    def start(state_dir=None) -> System:
        system = System(pki, state_dir)
        started.append(system)
        return system

    yield start
    for system in started:
        system.stop()


# ---- a completion from before a restart finishes nothing ---------------------------


def test_a_completion_from_before_a_restart_does_not_finish_a_new_coflow(systems, tmp_path):
    state = tmp_path / "state"
    old, spec = submitted_then_stopped(systems(state), finish=True)
    second = systems(state)  # a new controller on the same state directory
    Peer(second, "a1", "A", 30000)
    # the receiver registers again and sends its finished flow's completion again
    row = {"coflow": str(old), "flow": "f", "role": "recv", "offset": spec["size"],
           "digest": DIGEST, "k": protocol.report_tag(spec["digest_key"])}  # fmt: skip
    b1 = Peer(second, "b1", "B", 31000, inflight=[row])
    b1.send(complete(spec))
    wait_until(lambda: second.chan.pending_count.get("b1") == 2)  # its progress and completion
    new = second.controller.submit(one_flow())
    assert new != old  # ids are never reused, whatever the restarts
    b1.spec(new, "f")  # the new coflow's descriptor: it is still to be moved
    time.sleep(0.3)
    status = second.controller.status(new)
    assert status["state"] != "done" and status["bytes_delivered"] == 0


def test_ids_of_a_restarted_controller_continue_above_every_id_used(tmp_path):
    topology = triangle()
    first = Controller(topology, TerraPolicy(topology), state_dir=tmp_path)
    for agent, dc in [("a1", "A"), ("b1", "B")]:
        first.registry.register_agent(agent, dc, "127.0.0.1:1")
    ids = [first.submit(one_flow()) for _ in range(3)]
    asked = first.submit(one_flow(), coflow_id=1000)
    first.close()
    second = Controller(topology, TerraPolicy(topology), state_dir=tmp_path)
    for agent, dc in [("a1", "A"), ("b1", "B")]:
        second.registry.register_agent(agent, dc, "127.0.0.1:1")
    assert ids == [0, 1, 2] and asked == 1000
    assert second.submit(one_flow()) == 1001
    with pytest.raises(RegistryError) as info:  # the top of the range: ids cannot wrap
        second.submit(one_flow(), coflow_id=2**63 - 1)
    assert info.value.code == "bad_request"
    second.close()
    assert (tmp_path / "coflows.jsonl").stat().st_mode & 0o777 == 0o600


# ---- the attempt tag: forged and stale reports -------------------------------------------


def test_a_complete_without_the_attempts_tag_is_refused(systems):
    system = systems()
    Peer(system, "a1", "A", 30000)
    b1 = Peer(system, "b1", "B", 31000)
    cid = system.controller.submit(one_flow())
    spec = b1.spec(cid, "f")
    b1.send(complete(spec, tag="0" * 32))  # the receiver, but not for this attempt
    b1.send(protocol.complete_message(str(cid), "f", DIGEST, spec["size"], ""))  # no tag
    b1.send(protocol.progress_message([(str(cid), "f", spec["size"], "1" * 32)]))
    wait_until(lambda: system.controller.stats["refused_reports"] == 3)
    status = system.controller.status(cid)
    assert status["state"] != "done" and status["bytes_delivered"] == 0
    b1.send(complete(spec))
    wait_until(lambda: system.controller.status(cid)["state"] == "done")


def test_a_stale_completion_after_a_restart_without_a_journal_is_refused(systems):
    """A memory-only controller starts its ids at 0 again: the same (coflow, flow) ids, but
    another coflow; the agent's completion of the old one carries the old attempt's tag."""
    old, spec = submitted_then_stopped(systems(), finish=True)
    second = systems()
    a1 = Peer(second, "a1", "A", 30000)
    b1 = Peer(second, "b1", "B", 31000)
    b1.send(complete(spec))  # the old coflow's completion, sent again on registering ...
    wait_until(lambda: second.chan.pending_count.get("b1") == 1)
    new = second.controller.submit(one_flow())
    assert new == old  # ... the same ids, but another coflow
    fresh = b1.spec(new, "f")
    assert fresh["digest_key"] != spec["digest_key"]
    b1.send(complete(spec))
    wait_until(lambda: second.controller.stats["refused_reports"] >= 2)
    status = second.controller.status(new)
    assert status["state"] != "done" and status["bytes_delivered"] == 0
    # both agents are told to forget what they hold under these ids and get the new flow
    for agent in (b1, a1):
        agent.wait_for(lambda m: m["t"] == "drop" and m["coflow"] == str(new))
        assert agent.spec(new, "f")["digest_key"] == fresh["digest_key"]


def test_a_flow_restarted_after_a_digest_mismatch_takes_no_report_of_the_old_attempt(systems):
    system = systems()
    Peer(system, "a1", "A", 30000)
    b1 = Peer(system, "b1", "B", 31000)
    cid = system.controller.submit(one_flow())
    first = b1.spec(cid, "f")
    b1.send(protocol.failed_message(str(cid), "f", "digest mismatch", "digest",
                                    tag=protocol.report_tag(first["digest_key"])))  # fmt: skip
    wait_until(lambda: system.controller.status(cid)["flows"][0]["restarts"] == 1)
    b1.send(complete(first))  # a late completion of attempt 0
    wait_until(lambda: system.controller.stats["refused_reports"] == 1)
    assert system.controller.status(cid)["state"] != "done"
    second = b1.wait_for(lambda m: m["t"] == "flows" and m["flows"][0].get("attempt") == 1)
    assert second["flows"][0]["digest_key"] != first["digest_key"]
    b1.send(complete(second["flows"][0]))
    wait_until(lambda: system.controller.status(cid)["state"] == "done")


# ---- one flow at a time writes a file --------------------------------------------


def test_a_file_being_written_cannot_be_the_sink_of_another_flow(systems):
    system = systems()
    Peer(system, "a1", "A", 30000)
    b1 = Peer(system, "b1", "B", 31000)
    Peer(system, "c1", "C", 32000)
    controller = system.controller
    first = controller.submit(one_flow(src_path="in/x", dst_path="out/x"))
    for other in (
        [{"id": "g", "src": "c1", "dst": "b1", "bytes": 5, "dst_path": "out/./x"}],
        [{"id": "g", "src": "c1", "dst": "b1", "bytes": 5, "dst_path": "out//x"}],
    ):
        with pytest.raises(RegistryError) as info:
            controller.submit(other)
        assert info.value.code == "path_busy" and "out/x" in str(info.value)
    twice = [
        {"id": "g", "src": "c1", "dst": "b1", "bytes": 5, "dst_path": "y"},
        {"id": "h", "src": "a1", "dst": "b1", "bytes": 5, "dst_path": "y"},
    ]
    with pytest.raises(RegistryError) as info:
        controller.submit(twice)
    assert info.value.code == "path_busy"
    with pytest.raises(RegistryError) as info:
        controller.update(first, [{"id": "g", "src": "c1", "dst": "b1", "bytes": 5,
                                   "dst_path": "out/x"}])  # fmt: skip
    assert info.value.code == "path_busy"
    # the same path at another agent is another file
    controller.submit([{"id": "g", "src": "b1", "dst": "c1", "bytes": 5, "dst_path": "out/x"}])
    b1.send(complete(b1.spec(first, "f")))
    wait_until(lambda: controller.status(first)["state"] == "done")
    later = controller.submit([{"id": "g", "src": "c1", "dst": "b1", "bytes": 5,
                                "dst_path": "out/x"}])  # fmt: skip
    controller.cancel(later)  # a cancelled flow frees its file too
    controller.submit([{"id": "g", "src": "c1", "dst": "b1", "bytes": 5, "dst_path": "out/x"}])


# ---- file flows cross DCs ------------------------------------------------------------


def test_a_file_flow_within_one_dc_is_refused(tmp_path):
    topology = triangle()
    controller = Controller(topology, TerraPolicy(topology))
    for agent, dc in [("a1", "A"), ("a2", "A"), ("b1", "B")]:
        controller.registry.register_agent(agent, dc, "127.0.0.1:1")
    for src, dst, paths in [
        ("a1", "a2", {"src_path": "x", "dst_path": "y"}),
        ("a1", "a1", {"src_path": "x", "dst_path": "y"}),
        ("a1", "a2", {"dst_path": "y"}),
        ("a2", "a1", {"src_path": "x"}),
    ]:
        with pytest.raises(RegistryError) as info:
            controller.submit([{"id": "f", "src": src, "dst": dst, "bytes": 5, **paths}])
        assert info.value.code == "bad_request" and "between DCs" in str(info.value)
    assert controller.registry.coflows == {}
    # synthetic flows within a DC stay as they were: done with their coflow
    cid = controller.submit([{"id": "f", "src": "a1", "dst": "a2", "bytes": 5}])
    assert controller.status(cid)["state"] == "done"


# ---- owners outlive a restart ------------------------------------------------------


class ApiServer:
    """The API server on `port` (0: any) over mutual TLS, its controller on `state_dir`."""

    def __init__(self, pki, state_dir, port: int = 0) -> None:
        topology = triangle()
        self.controller = Controller(topology, TerraPolicy(topology), state_dir=state_dir)
        for agent, dc in [("a1", "A"), ("b1", "B")]:
            self.controller.registry.register_agent(agent, dc, "127.0.0.1:1")
        handler = ApiHandler(self.controller)
        self.conns: list[socket.socket] = []

        async def serve(sock, addr, identity):
            self.conns.append(sock)
            await serve_connection_on_loop(handler, sock, addr, identity)

        self.listener, _, (self.host, self.port) = listen_and_serve(
            "127.0.0.1", port, serve, security(pki), daemon_spawn, owner=self.controller.owner
        )

    def stop(self) -> None:
        stop_listener(self.listener)
        for sock in self.conns:
            try:
                socket.socket.shutdown(sock, socket.SHUT_RDWR)
            except OSError:
                pass
        self.controller.close()


def test_another_job_cannot_take_a_coflow_id_after_a_restart(pki, tmp_path):
    first = ApiServer(pki, tmp_path)
    job1 = TerraClient(first.host, first.port, pki=pki, name="job1", timeout=10)
    job2 = TerraClient(first.host, first.port, pki=pki, name="job2", timeout=10)
    second = None
    try:
        cid = job1.submit_coflow(one_flow())
        first.stop()
        second = ApiServer(pki, tmp_path, first.port)
        with pytest.raises(TerraError) as info:  # job2 asks for job1's id
            job2._call({"op": "submit", "flows": one_flow(), "coflow": cid})
        assert info.value.code == "bad_request"
        with pytest.raises(TerraError) as info:  # nor may it see it
            job2.check_status(cid)
        assert info.value.code == "unknown_coflow"
        # job1 reconnects, resubmits its coflow under its id, and follows it as before
        assert job1.check_status(cid)["state"] in ("queued", "running", "preempted")
        assert second.controller.owner_of(cid) == (True, "job1")
    finally:
        job1.close()
        job2.close()
        first.stop()
        if second is not None:
            second.stop()


# ---- kept reports are per agent, and capped ------------------------------------------


def test_kept_reports_are_per_agent_so_an_agent_cannot_erase_anothers(
    systems, tmp_path, monkeypatch
):
    monkeypatch.setattr(agent_core, "MAX_PENDING_PER_AGENT", 1000)
    state = tmp_path / "state"
    cid, spec = submitted_then_stopped(systems(state), finish=False)
    second = systems(state)
    b1 = Peer(second, "b1", "B", 31000)
    b1.send(complete(spec))  # it finished while the controller was down
    c1 = Peer(second, "c1", "C", 32000)
    tag = protocol.report_tag(spec["digest_key"])  # even an agent that knows the tag
    c1.send(protocol.complete_message(str(cid), "f", "cd" * 32, spec["size"], tag))
    rows = [(str(cid + 1 + i), "f", 1, "0" * 32) for i in range(2000)]  # a flood
    for i in range(0, len(rows), 500):
        c1.send(protocol.progress_message(rows[i : i + 500]))
    c1.send({"t": "heartbeat"})
    wait_until(lambda: second.chan.pending_count.get("c1") == 1000)
    assert second.chan.pending_count.get("b1") == 1
    Peer(second, "a1", "A", 30000)
    assert second.controller.submit(one_flow(), coflow_id=cid) == cid  # resubmitted
    wait_until(lambda: second.controller.status(cid)["state"] == "done")
    assert second.controller.status(cid)["flows"][0]["digest"] == DIGEST


def test_kept_reports_of_a_flood_over_many_coflows_stay_bounded(systems, monkeypatch):
    monkeypatch.setattr(agent_core, "MAX_PENDING_PER_AGENT", 50)
    system = systems()
    c1 = Peer(system, "c1", "C", 32000)
    rows = [(str(1000 + i), "f", 1, "0" * 32) for i in range(500)]  # 500 unknown coflows
    c1.send(protocol.progress_message(rows))
    c1.send({"t": "heartbeat"})
    wait_until(lambda: system.chan.pending_count.get("c1") == 50)
    pending, pending_agents = system.chan.owner.run(
        lambda: (len(system.chan.pending.get("c1", {})), len(system.chan.pending_agents))
    )
    assert pending == 50
    assert pending_agents == 50  # no entry left for a dropped coflow


def test_a_report_naming_a_coflow_in_non_ascii_digits_is_refused_alone(systems):
    system = systems()
    c1 = Peer(system, "c1", "C", 32000)
    for coflow in ("\u00b2", "\u0663"):  # superscript two, Arabic-Indic three
        c1.send(protocol.progress_message([(coflow, "f", 1, "0" * 32)]))
    c1.send(protocol.progress_message([("77", "f", 1, "0" * 32)]))
    wait_until(lambda: system.chan.pending_count.get("c1") == 1)  # the connection lives on
    assert list(system.chan.pending_agents) == ["77"]


@pytest.mark.parametrize(
    "report",
    [
        {"t": "complete", "coflow": "0", "flow": "f" * 257, "digest": DIGEST, "size": 1},
        {"t": "complete", "coflow": "0", "flow": "f", "digest": "a" * 129, "size": 1},
        {"t": "complete", "coflow": "0", "flow": "f", "digest": "not hex", "size": 1},
        {"t": "failed", "coflow": "0", "flow": "f", "reason": "x" * 1025, "cause": "sink"},
        {"t": "failed", "coflow": "c" * 257, "flow": "f", "reason": "x", "cause": "sink"},
        {"t": "progress", "flows": [{"coflow": "0", "flow": "f" * 257, "acked": 1}]},
        {"t": "progress", "flows": [{"coflow": "0", "flow": "f", "acked": 1, "k": "0" * 65}]},
        {"t": "register", "dc": "A", "agent": "a1", "data_addr": "127.0.0.1:1",
         "inflight": [{"coflow": "0", "flow": "f" * 257, "role": "recv", "offset": 0}]},
    ],
)  # fmt: skip
def test_report_fields_beyond_their_caps_are_refused(report):
    with pytest.raises(protocol.ProtocolError):
        protocol.validate_control(report)


# ---- submits are bounded, and a large one does not stall the others ------------------


def test_submits_are_bounded_per_request_and_per_job(monkeypatch):
    topology = triangle()
    controller = Controller(topology, TerraPolicy(topology))
    for agent, dc in [("a1", "A"), ("b1", "B")]:
        controller.registry.register_agent(agent, dc, "127.0.0.1:1")
    too_many = [{"id": i, "src": "a1", "dst": "b1", "bytes": 1} for i in range(100_001)]
    with pytest.raises(RegistryError) as info:
        controller.submit(too_many)
    assert info.value.code == "bad_request" and MAX_FLOWS_PER_REQUEST == 100_000
    monkeypatch.setattr(coflow_registry, "MAX_OPEN_FLOWS", 3)
    first = controller.submit(too_many[:2], owner="job1")
    with pytest.raises(RegistryError) as info:
        controller.submit(too_many[:2], owner="job1")
    assert info.value.code == "too_many_flows"
    controller.submit(too_many[:2], owner="job2")  # another job's own bound
    controller.cancel(first)  # flows of finished coflows no longer count
    controller.submit(too_many[:2], owner="job1")


def test_a_large_submit_does_not_stall_another_jobs_submit(systems):
    system = systems()
    agents = [Peer(system, "a1", "A", 30000), Peer(system, "b1", "B", 31000)]
    controller = system.controller
    big = [{"id": i, "src": "a1", "dst": "b1", "bytes": 1000} for i in range(MAX_FLOWS_PER_REQUEST)]
    result: dict = {}

    def submit_big():
        start = time.monotonic()
        result["cid"] = controller.submit(big, owner="job1")
        result["s"] = time.monotonic() - start

    thread = threading.Thread(target=submit_big)
    thread.start()
    waits = []
    while thread.is_alive():
        start = time.monotonic()
        controller.submit([{"id": "s", "src": "b1", "dst": "a1", "bytes": 1000}], owner="job2")
        waits.append(time.monotonic() - start)
        time.sleep(0.05)
    thread.join()
    print(f"100,000-flow submit {result['s']:.2f} s; small submits meanwhile: "
          f"{len(waits)}, slowest {max(waits):.3f} s")  # fmt: skip
    assert result["cid"] >= 0
    assert max(waits) < 5.0  # generous on a loaded machine; measured figure printed above
    for agent in agents:
        agent.close()


# ---- the coflow journal ----------------------------------------------------------------------


def test_the_journal_survives_a_cut_line_stays_bounded_and_has_one_user(tmp_path, monkeypatch):
    from terra_controller import journal as journal_module
    from terra_controller.journal import CoflowJournal, JournalEntry, JournalError

    monkeypatch.setattr(journal_module, "COMPACT_SLACK", 10)
    first = CoflowJournal(tmp_path)
    with pytest.raises(JournalError, match="another controller"):
        CoflowJournal(tmp_path)
    for cid in range(100):
        first.admitted(cid, "job1", bytes(16))
        first.forgotten(cid)
    first.admitted(100, "job2", b"\x01" * 16)
    first.burned(205)
    first.close()
    lines = (tmp_path / "coflows.jsonl").read_bytes().splitlines()
    assert len(lines) < 30  # rewritten with the live entries only
    with open(tmp_path / "coflows.jsonl", "ab") as f:
        f.write(b'{"c": 300, "o": "jo')  # a line cut by a crash
    again = CoflowJournal(tmp_path)
    assert again.next_id == 206 and list(again.live) == [100]
    assert again.live[100] == JournalEntry("job2", b"\x01" * 16)
    assert again.owner(100) == (True, "job2") and again.owner(5) == (False, None)
    again.close()
    assert (tmp_path.stat().st_mode & 0o777) == 0o700


def test_a_replayed_journal_forgets_the_same_coflows_as_the_live_one(tmp_path, monkeypatch):
    from terra_controller import journal as journal_module
    from terra_controller.journal import CoflowJournal

    monkeypatch.setattr(journal_module, "MAX_LIVE", 2)
    first = CoflowJournal(tmp_path)
    first.admitted(0, "job0", bytes(16))
    first.admitted(1, "job1", bytes(16))
    first.admitted(0, "job0", bytes(16))  # resubmitted: now the newest
    first.admitted(2, "job2", bytes(16))  # over the cap: coflow 1 is forgotten
    assert list(first.live) == [0, 2]
    first.close()
    again = CoflowJournal(tmp_path)
    assert list(again.live) == [0, 2] and again.owner(0) == (True, "job0")
    again.close()
