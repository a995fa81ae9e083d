"""Failed and cancelled coflows, restarts after digest mismatches, timeouts, bounded history.

Controller-level tests drive a hand-built Controller (TerraPolicy on SWAN, a fake clock);
the agent channel's messages are checked with fake connections, the client's wait /
cancel / resubmission through an ApiHandler without sockets. The end-to-end test at
the bottom runs the loopback system of test_controller_e2e.py (real processes).

SWAN: HK reaches BA over two disjoint 125 MB/s paths (HK-NY-BA, HK-LA-FL-BA), so one
HK -> BA coflow alone gets 250 MB/s.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import trio
from test_agent import loopback

from benchmarks.harness import free_port, free_port_block, stop_processes
from terra_agent.sources import SyntheticSource, flow_key, synthetic_digest
from terra_controller.api_server import ApiHandler
from terra_controller.client import TerraClient
from terra_controller.coflow_state import RegistryError
from terra_controller.controller import Controller
from terra_core.terra_policy import TerraPolicy
from terra_model.states import MAX_CLIENT_ID, MAX_COFLOW_ID, CoflowStatus, FlowStatus
from terra_security.integrity import FlowKeys
from terra_wire import control as protocol
from terra_wire.api import API_VERSION
from terra_wire.control import GroupRates, flows_message
from topologies import load_topology

HK_BA = 250e6  # bytes/s: the HK -> BA max flow on SWAN
AGENTS = [("hk1", "HK"), ("hk2", "HK"), ("ba1", "BA"), ("ba2", "BA"), ("la1", "LA")]


class Clock:
    """A controller clock the test moves by hand (seconds)."""

    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def make_controller(**kwargs) -> tuple[Controller, Clock]:
    """A Controller with TerraPolicy on SWAN, a hand-moved clock and AGENTS registered;
    kwargs go to Controller (agent_timeout_s, keep_finished, ...)."""
    swan = load_topology("swan")
    clock = Clock()
    controller = Controller(swan, TerraPolicy(swan), clock=clock, **kwargs)
    for agent, dc in AGENTS:
        controller.registry.register_agent(agent, dc, "127.0.0.1:1")
    return controller, clock


def flow(fid, src="hk1", dst="ba1", size=1000, **extra):
    """A submit request's flow map (HK -> BA by default)."""
    return {"id": fid, "src": src, "dst": dst, "bytes": size, **extra}


def total_rate(controller: Controller, cid: int) -> float:
    """Bytes/s the last round gave coflow `cid` (all flows and paths)."""
    return sum(r for paths in controller.rates.get(cid, {}).values() for _, r in paths)


def small_and_big(controller: Controller) -> tuple[int, int]:
    """A 1000-byte and a 200 MB coflow on the same DC pair (HK -> BA), one round run."""
    small = controller.submit([flow("small")])
    big = controller.submit([flow("big", "hk2", "ba2", 200_000_000)])
    controller.run_round()
    return small, big


# ---- cancel -------------------------------------------------------------------------------


def test_cancel_releases_capacity_to_the_other_coflow_in_the_next_round():
    controller, clock = make_controller()
    drops = []
    controller.on_drop.append(lambda c, flows, restart: drops.append((c.id, flows, restart)))
    small, big = small_and_big(controller)
    assert total_rate(controller, small) > 0
    assert total_rate(controller, big) < 0.5 * HK_BA  # the small one comes first
    clock.t = 1.0
    status = controller.cancel(small)
    assert status["state"] == "cancelled" and status["reason"]
    assert [f["state"] for f in status["flows"]] == ["cancelled"]
    assert drops == [(small, [controller.registry.get(small).flows["small"]], False)]
    assert small not in controller.rates  # dropped at once, before the next round
    controller.run_round()
    with pytest.raises(KeyError):
        controller.policy.state(str(small))  # the round removed it from the policy first
    assert total_rate(controller, small) == 0
    assert total_rate(controller, big) == pytest.approx(HK_BA)
    assert controller.status(small)["state"] == "cancelled"
    assert controller.status(big)["state"] == "running"
    assert controller.stats["cancelled"] == 1


def test_cancel_is_idempotent_and_a_cancelled_coflow_takes_no_more_reports():
    controller, _ = make_controller()
    small, _big = small_and_big(controller)
    controller.cancel(small)
    assert controller.cancel(small)["state"] == "cancelled"  # again: harmless
    assert controller.progress(small, "small", 500) is False  # agents should drop it
    assert controller.complete(small, "small", "abc") is False
    status = controller.status(small)
    assert status["state"] == "cancelled" and status["bytes_delivered"] == 0
    with pytest.raises(RegistryError) as info:
        controller.update(small, [flow("more")])
    assert info.value.code == "coflow_done"


def test_cancel_of_a_finished_or_unknown_coflow_is_an_error():
    controller, _ = make_controller()
    done = controller.submit([flow("local", "hk1", "hk2")])  # intra-DC only: done at once
    assert controller.status(done)["state"] == "done"
    with pytest.raises(RegistryError) as info:
        controller.cancel(done)
    assert info.value.code == "coflow_done"
    failed = controller.submit([flow("x")])
    controller.fail_flow(failed, "x", "source file missing")
    with pytest.raises(RegistryError) as info:
        controller.cancel(failed)
    assert info.value.code == "coflow_done"
    for bad in (12345, -1, "0", None):
        with pytest.raises(RegistryError) as info:
            controller.cancel(bad)
        assert info.value.code == "unknown_coflow"


# ---- failed flows -------------------------------------------------------------------------


def test_a_failed_flow_fails_its_coflow_and_releases_capacity_in_the_next_round():
    controller, clock = make_controller()
    drops = []
    controller.on_drop.append(lambda c, flows, restart: drops.append((c.id, flows, restart)))
    small = controller.submit([flow("small"), flow("other", "hk2", "ba2", 5000)])
    big = controller.submit([flow("big", "hk2", "ba2", 200_000_000)])
    controller.run_round()
    assert total_rate(controller, big) < 0.5 * HK_BA
    clock.t = 2.0
    outcome = controller.fail_flow(small, "small", "cannot open source file 'x': No such file")
    assert outcome == "failed"
    status = controller.status(small)
    assert status["state"] == "failed"
    assert "small" in status["reason"] and "No such file" in status["reason"]
    states = {f["id"]: (f["state"], f["reason"]) for f in status["flows"]}
    assert states["small"][0] == "failed" and "No such file" in states["small"][1]
    assert states["other"][0] == "cancelled"  # the rest of the coflow stops too
    assert {f.id for f in drops[0][1]} == {"small", "other"} and drops[0][2] is False
    controller.run_round()
    assert total_rate(controller, big) == pytest.approx(HK_BA)
    # a second report of the same failure, or about the other flow, changes nothing
    assert controller.fail_flow(small, "other", "late") == "ignored"
    assert controller.stats["failed"] == 1


def test_digest_mismatch_restarts_the_flow_up_to_max_restarts_then_fails():
    controller, _ = make_controller(max_restarts=3)
    drops = []
    controller.on_drop.append(
        lambda c, flows, restart: drops.append(([f.id for f in flows], restart))
    )
    cid = controller.submit([flow("f", size=10_000_000)])
    for attempt in range(1, 4):
        controller.progress(cid, "f", 10_000_000)  # every byte acknowledged, then mismatch
        controller.run_round()
        assert total_rate(controller, cid) == 0  # nothing left to send...
        assert controller.fail_flow(cid, "f", "digest mismatch", retry=True) == "restarted"
        f = controller.registry.get(cid).flows["f"]
        assert (f.delivered, f.restarts, f.state) == (0, attempt, FlowStatus.QUEUED)
        assert controller.registry.remaining() == {str(cid): {"f": 10_000_000.0}}
        controller.run_round()
        assert total_rate(controller, cid) == pytest.approx(HK_BA)  # ...until it restarts
        assert controller.status(cid)["state"] == "running"
    assert drops == [(["f"], True)] * 3
    assert controller.fail_flow(cid, "f", "digest mismatch", retry=True) == "failed"
    status = controller.status(cid)
    assert status["state"] == "failed" and "after 3 re-transfers" in status["reason"]
    assert controller.stats["restarts"] == 3


# ---- the client: wait, cancel ------------------------------------------------------------


def local_client(handler: ApiHandler) -> TerraClient:
    """A TerraClient whose requests go straight to `handler` (no sockets)."""
    client = TerraClient("127.0.0.1", 1, insecure=True, timeout=5)

    def exchange(request: dict) -> dict:
        return handler.handle(dict(request, v=API_VERSION))

    client._exchange = exchange
    client._roundtrip = exchange
    return client


def test_wait_returns_on_failed_and_cancelled_and_cancel_coflow_works():
    controller, _ = make_controller()
    client = local_client(ApiHandler(controller))
    a = client.submit_coflow([flow("a")])
    b = client.submitCoflow([flow("b", "hk2", "ba2")])
    controller.fail_flow(a, "a", "cannot open sink: Permission denied")
    status = client.wait(a, timeout=1)
    assert status["state"] == "failed" and "Permission denied" in status["reason"]
    client.cancelCoflow(b)
    assert client.wait(b, timeout=1)["state"] == "cancelled"
    assert client.check_status(b)["state"] == "cancelled"
    assert client.open == {}  # neither is resubmitted after a controller restart
    with pytest.raises(Exception) as info:
        client.cancel_coflow(a)
    assert info.value.code == "coflow_done"
    c = client.submit_coflow([flow("c", "hk1", "hk2")])  # intra-DC: done
    with pytest.raises(Exception) as info:
        client.cancel_coflow(c)
    assert info.value.code == "coflow_done"
    with pytest.raises(TimeoutError):
        client.wait(client.submit_coflow([flow("d")]), timeout=0.1, poll_s=0.01)


# ---- resubmission keeps the arrival time --------------------------------------------------


def test_a_resubmitted_coflow_keeps_its_arrival_time_and_cct_counts_from_it():
    controller, clock = make_controller()
    clock.t = 100.0
    cid = controller.submit([flow("f", size=10_000_000)], deadline=30, coflow_id=7, age_s=10)
    coflow = controller.registry.get(cid)
    assert coflow.submitted_s == pytest.approx(90.0)
    assert coflow.submitted_s + coflow.deadline_s == pytest.approx(130.0)  # still 30 s from now
    clock.t = 100.5  # the transfer ends half a second after the resubmission...
    controller.complete(cid, "f", "digest")
    assert controller.status(cid)["cct_s"] == pytest.approx(10.5)  # ...10.5 s after the first


@pytest.mark.parametrize("age", [-1, math.nan, math.inf, "10", True])
def test_a_bad_age_is_refused(age):
    controller, _ = make_controller()
    with pytest.raises(RegistryError) as info:
        controller.submit([flow("f")], coflow_id=3, age_s=age)
    assert info.value.code == "bad_request"
    assert controller.registry.coflows == {}


def test_the_client_resubmits_with_the_age_of_its_coflows():
    first, clock1 = make_controller()
    client = local_client(ApiHandler(first))
    cid = client.submit_coflow([flow("f", size=10_000_000)])
    client.open[cid]["submitted_at"] -= 10.0  # as if submitted 10 s ago
    second, clock2 = make_controller()  # the controller restarted: knows nothing
    clock2.t = 3.0
    handler = ApiHandler(second)
    client._roundtrip = lambda request: handler.handle(dict(request, v=API_VERSION))
    client._resubmit()
    coflow = second.registry.get(cid)
    assert coflow.submitted_s == pytest.approx(3.0 - 10.0, abs=0.5)
    clock2.t = 4.0
    second.complete(cid, "f", "digest")
    assert second.status(cid)["cct_s"] == pytest.approx(11.0, abs=0.5)


# ---- id bounds ----------------------------------------------------------------------------


def test_coflow_ids_are_63_bit():
    controller, _ = make_controller()
    for bad in (2**64 - 1, 2**63, -1, 1.0, True, "5"):
        with pytest.raises(RegistryError) as info:
            controller.submit([flow("f")], coflow_id=bad)
        assert info.value.code == "bad_request"
    assert controller.registry.coflows == {}
    # the top 2**32 ids are not for clients to ask: ids never wrap around to used ones
    with pytest.raises(RegistryError) as info:
        controller.submit([flow("f")], coflow_id=MAX_COFLOW_ID)
    assert info.value.code == "bad_request"
    assert controller.submit([flow("f")], coflow_id=MAX_CLIENT_ID) == MAX_CLIENT_ID
    assert controller.status(MAX_CLIENT_ID)["id"] == 2**63 - 1 - 2**32
    assert controller.submit([flow("g")]) == MAX_CLIENT_ID + 1  # above every id used


def test_flow_and_agent_ids_are_length_capped():
    controller, _ = make_controller()
    with pytest.raises(RegistryError):
        controller.submit([flow("x" * 257)])
    assert controller.submit([flow("x" * 256)]) == 0
    with pytest.raises(RegistryError):
        controller.registry.register_agent("a" * 257, "HK", "127.0.0.1:1")
    with pytest.raises(RegistryError):
        controller.registry.register_agent("a", "HK", "h" * 300 + ":1")


# ---- bounded history ----------------------------------------------------------------------


def test_finished_coflows_beyond_the_limit_are_dropped_and_counted():
    controller, clock = make_controller(keep_finished=5)
    ids = []
    for i in range(8):
        clock.t = float(i)
        cid = controller.submit([flow(f"f{i}")])
        controller.complete(cid, f"f{i}", "digest")
        ids.append(cid)
    failed = controller.submit([flow("x")])
    controller.fail_flow(failed, "x", "source error")
    cancelled = controller.submit([flow("y")])
    controller.cancel(cancelled)
    kept = sorted(controller.registry.coflows)
    assert kept == [*ids[5:], failed, cancelled]
    for old in ids[:5]:
        with pytest.raises(RegistryError) as info:
            controller.status(old)
        assert info.value.code == "unknown_coflow"
    assert controller.stats["dropped_finished"]["done"] == 5
    assert controller.stats["dropped_bytes_delivered"] == 5 * 1000
    # active coflows are never dropped, whatever their number
    active = [controller.submit([flow(f"a{i}")]) for i in range(7)]
    assert all(controller.status(a)["state"] == "queued" for a in active)
    assert len(controller.registry.finished) == 5


def test_finished_coflows_older_than_keep_finished_s_are_dropped():
    controller, clock = make_controller(keep_finished=None, keep_finished_s=60.0)
    cid = controller.submit([flow("f")])
    controller.cancel(cid)
    clock.t = 59.0
    controller.check_timeouts()
    assert controller.status(cid)["state"] == "cancelled"
    clock.t = 61.0
    controller.check_timeouts()
    with pytest.raises(RegistryError):
        controller.status(cid)
    assert controller.stats["dropped_finished"]["cancelled"] == 1


def test_round_statistics_are_bounded():
    controller, _ = make_controller()
    for _ in range(1100):
        controller.run_round()
    assert controller.stats["rounds"] == 1100
    assert len(controller.stats["round_ms"]) == len(controller.stats["allocate_ms"]) == 1000


# ---- timeouts -----------------------------------------------------------------------------


def test_an_agent_gone_longer_than_the_timeout_fails_its_unfinished_coflows():
    controller, clock = make_controller(agent_timeout_s=60.0)
    connected = {agent for agent, _ in AGENTS}
    controller.connected_agents = lambda: connected
    mine = controller.submit([flow("f", "hk1", "ba1", 10_000_000)])
    other = controller.submit([flow("g", "hk2", "ba2", 10_000_000)])
    finished = controller.submit([flow("h", "hk2", "ba1")])
    controller.complete(finished, "h", "digest")
    assert controller.check_timeouts() == []
    connected.discard("ba1")
    clock.t = 10.0
    assert controller.check_timeouts() == []  # gone since t = 10
    clock.t = 69.0
    assert controller.check_timeouts() == []
    clock.t = 70.5
    assert controller.check_timeouts() == [mine]
    status = controller.status(mine)
    assert status["state"] == "failed" and "agent ba1 gone" in status["reason"]
    assert controller.status(other)["state"] != "failed"
    assert controller.status(finished)["state"] == "done"
    controller.run_round()
    assert total_rate(controller, other) == pytest.approx(HK_BA)
    # an agent that comes back is no longer counted as gone
    connected.add("ba1")
    controller.check_timeouts()
    assert "ba1" not in controller.agent_gone_since


def test_a_coflow_whose_deadline_passed_unfinished_fails():
    controller, clock = make_controller()
    cid = controller.submit([flow("f", size=10_000_000)], deadline=5.0)
    assert cid >= 0  # admitted: 10 MB take 40 ms at 250 MB/s
    controller.run_round()
    clock.t = 4.9
    assert controller.check_timeouts() == []
    clock.t = 5.1
    assert controller.check_timeouts() == [cid]
    status = controller.status(cid)
    assert status["state"] == "failed" and "deadline missed" in status["reason"]


# ---- the agent channel: drop, restart order, failed reports ------------------------------


class FakeConnection:
    """Stands in for an AgentConnection: records what the channel sends."""

    def __init__(self, agent: str) -> None:
        self.agent = agent
        self.sent: list[dict] = []
        self.sent_rates: dict = {}
        self.closed = False

    def send(self, header: dict) -> None:
        self.sent.append(protocol.validate_control(header))


def channel_with_agents():
    """make_controller() plus an AgentChannel whose agents are FakeConnections (all of
    AGENTS connected): (controller, clock, channel, {agent: FakeConnection})."""
    from terra_controller.agent_channel import AgentChannel
    from terra_controller.tunnel_table import TunnelTable

    controller, clock = make_controller()
    chan = AgentChannel(controller, TunnelTable(controller.topology, 4))
    conns = {agent: FakeConnection(agent) for agent, _ in AGENTS}
    chan.connections.update(conns)
    return controller, clock, chan, conns


def tag(controller, cid, flow_id="f"):
    """The report tag of the flow's current attempt (what its agents put in "k")."""
    return protocol.report_tag(controller.registry.flow(cid, flow_id).digest_key)


def test_cancel_sends_drop_to_both_endpoints():
    controller, _, chan, conns = channel_with_agents()
    cid = controller.submit([flow("f", "hk1", "ba1"), flow("g", "hk2", "ba1")])
    for conn in conns.values():
        conn.sent.clear()
    controller.cancel(cid)
    drops = {a: [m for m in c.sent if m["t"] == "drop"] for a, c in conns.items()}
    assert drops["hk1"] == [{"t": "drop", "coflow": str(cid), "flows": ["f"]}]
    assert drops["hk2"] == [{"t": "drop", "coflow": str(cid), "flows": ["g"]}]
    assert drops["ba1"] == [{"t": "drop", "coflow": str(cid), "flows": ["f", "g"]}]
    assert drops["ba2"] == [] and drops["la1"] == []
    # a sender still reporting progress for it is told again
    conns["hk1"].sent.clear()
    report = protocol.progress_message([(str(cid), "f", 10, tag(controller, cid))])
    chan._handle(conns["hk1"], report)
    assert [m["t"] for m in conns["hk1"].sent] == ["drop"]


def test_failed_reports_fail_the_flow_and_only_its_endpoints_may_send_them():
    controller, _, chan, conns = channel_with_agents()
    cid = controller.submit([flow("f", "hk1", "ba1")])
    report = protocol.failed_message(
        str(cid), "f", "cannot open source file", "source", tag=tag(controller, cid)
    )
    chan._handle(conns["ba1"], report)  # the receiver cannot report a source error
    chan._handle(conns["la1"], report)  # nor can an outsider
    assert controller.status(cid)["state"] == "queued"
    chan._handle(conns["hk1"], report)
    status = controller.status(cid)
    assert status["state"] == "failed" and "cannot open source file" in status["reason"]


def test_a_digest_mismatch_restarts_at_the_receiver_first_then_the_sender():
    controller, _, chan, conns = channel_with_agents()
    cid = controller.submit([flow("f", "hk1", "ba1", 10_000)])
    controller.progress(cid, "f", 10_000)
    for conn in conns.values():
        conn.sent.clear()
    report = protocol.failed_message(
        str(cid), "f", "digest mismatch", "digest", tag=tag(controller, cid)
    )
    chan._handle(conns["ba1"], report)
    receiver = conns["ba1"].sent
    assert [m["t"] for m in receiver] == ["drop", "flows"]
    spec = receiver[1]["flows"][0]
    assert (spec["attempt"], spec["offset"]) == (1, 0) and "id" in receiver[1]
    assert conns["hk1"].sent == []  # the sender waits for the receiver's ack
    chan._acked(receiver[1]["id"])
    assert [m["t"] for m in conns["hk1"].sent] == ["drop", "flows"]
    assert conns["hk1"].sent[1]["flows"][0]["attempt"] == 1
    assert controller.status(cid)["flows"][0]["restarts"] == 1
    chan._handle(conns["ba1"], report)  # the same report again (attempt 0): stale, ignored
    assert controller.status(cid)["flows"][0]["restarts"] == 1
    again = protocol.failed_message(
        str(cid), "f", "digest mismatch", "digest", attempt=1, tag=tag(controller, cid)
    )
    chan._handle(conns["ba1"], again)
    assert controller.status(cid)["flows"][0]["restarts"] == 2


def test_a_restart_reaches_the_sender_even_if_the_receiver_never_acks(monkeypatch):
    from terra_controller import agent_core

    monkeypatch.setattr(agent_core, "RESTART_ACK_S", 0.0)
    controller, _, chan, conns = channel_with_agents()
    cid = controller.submit([flow("f", "hk1", "ba1", 10_000)])
    conns["hk1"].sent.clear()
    controller.fail_flow(cid, "f", "digest mismatch", retry=True)
    assert conns["hk1"].sent == []
    controller.check_timeouts()  # the tick runs overdue sends
    assert [m["t"] for m in conns["hk1"].sent] == ["drop", "flows"]


def test_connected_agents_feed_the_agent_timeout():
    controller, clock, chan, conns = channel_with_agents()
    cid = controller.submit([flow("f", "hk1", "ba1")])
    del chan.connections["hk1"]
    controller.check_timeouts()
    clock.t = controller.agent_timeout_s + 1
    assert controller.check_timeouts() == [cid]


# ---- protocol -----------------------------------------------------------------------------


def test_drop_and_failed_messages_validate():
    assert protocol.failed_message("1", "f", "x" * 5000, "digest")["reason"] == "x" * 1024
    with pytest.raises(protocol.ProtocolError):
        protocol.failed_message("1", "f", "why", "cosmic rays")
    with pytest.raises(protocol.ProtocolError):
        protocol.validate_control({"t": "drop", "coflow": "1", "flows": [""]})
    msgs = protocol.drop_messages("1", [f"f{i}" for i in range(250)], msg_id=7)
    assert [len(m["flows"]) for m in msgs] == [100, 100, 50] and msgs[-1]["id"] == 7
    spec = protocol.FlowSpec("1", "f", "a", "b", "B", 10, attempt=2)
    assert protocol.parse_flows(protocol.flows_message([spec]))[0].attempt == 2
    assert "attempt" not in protocol.FlowSpec("1", "f", "a", "b", "B", 10).to_dict()
    assert CoflowStatus.FAILED == "failed" and CoflowStatus("cancelled").final


# ---- agents: "failed" reports, "drop", restart with a new attempt -----------------------

MB = 1_000_000


async def start_flows(h, flows, rate):
    """Announce flows (receiver first) and give every tunnel of their FlowGroups `rate`."""
    await h.controller.add_flows(flows)
    for coflow in sorted({f.coflow for f in flows}):
        paths = {t.tunnel: rate for t in h.tunnels}
        await h.controller.set_rates("a", [GroupRates(coflow, "LA", paths)])


async def wait_for(h, predicate, timeout=30):
    """Wait (at most `timeout` s) until predicate() holds for the controller peer's records."""
    with trio.fail_after(timeout):
        await h.controller.wait_until(predicate)


async def test_agents_report_source_and_sink_failures_as_failed(tmp_path):
    async with loopback(tmp_path, k=2) as h:
        bad_source = h.flow("c1", "src", "a", "b", 1000, source="file:missing")
        (h.data_root / "plain").write_bytes(b"")  # a file where the sink needs a directory
        bad_sink = h.flow("c1", "sink", "a", "b", 1000, sink="file:plain/dir/x")
        await h.controller.send("b", flows_message([bad_sink]))
        await start_flows(h, [bad_source], 1 * MB)
        await wait_for(h, lambda: len(h.controller.failed) >= 2)
        causes = {(f["agent"], f["flow"]): f["cause"] for f in h.controller.failed}
        assert causes == {("a", "src"): "source", ("b", "sink"): "sink"}
        assert "missing" in next(f["reason"] for f in h.controller.failed if f["flow"] == "src")


async def test_drop_stops_a_flow_at_both_ends_and_its_late_chunks_do_no_harm(tmp_path):
    async with loopback(tmp_path, k=2) as h:
        a, b = h.agents["a"].agent, h.agents["b"].agent
        doomed = h.flow("c1", "doomed", "a", "b", 50 * MB)
        other = h.flow("c2", "other", "a", "b", 4 * MB)
        await start_flows(h, [doomed, other], 2 * MB)  # 4 MB/s per coflow: 50 MB take long
        with trio.fail_after(30):
            while a.out_flows[doomed.key].acked < 1 * MB:
                await trio.sleep(0.01)
        for agent in ("b", "a"):  # as the controller does on a cancel: both ends
            await h.controller.send(agent, {"t": "drop", "coflow": "c1", "flows": ["doomed"]})
        assert doomed.key not in a.out_flows and doomed.key not in b.in_flows
        assert b.dropped[doomed.key] == 0
        with trio.fail_after(30):
            await h.controller.wait_until(lambda: h.controller.all_complete([other.key]))
        assert h.controller.completed[other.key] == synthetic_digest(
            "c2", "other", 4 * MB, other.digest_key
        )
        assert doomed.key not in h.controller.completed
        assert b.closed_connections == 0  # late chunks / acks of the dropped flow were ignored
        assert all(link.connects == 1 for link in a.links.values())
        assert not [f for f in h.controller.failed if f["flow"] == "doomed"]


async def test_a_digest_mismatch_is_reported_and_a_new_attempt_completes(tmp_path, monkeypatch):
    import terra_agent.receiver as receiver

    poisoned = []

    class OncePoisoned(FlowKeys):  # the first receiving digest starts with junk: a mismatch
        def fold_hasher(self):
            h = super().fold_hasher()
            if not poisoned:
                poisoned.append(True)
                h.update(b"junk")
            return h

    monkeypatch.setattr(receiver, "FlowKeys", OncePoisoned)
    size = 3 * MB
    async with loopback(tmp_path, k=2) as h:
        first = h.flow("c1", "f", "a", "b", size)
        await start_flows(h, [first], 5 * MB)
        await wait_for(h, lambda: h.controller.failed)
        report = h.controller.failed[0]
        assert (report["agent"], report["cause"]) == ("b", "digest")
        assert "digest mismatch" in report["reason"]
        # the controller's restart: drop at both ends, then attempt 1, receiver first
        for agent in ("b", "a"):
            await h.controller.send(agent, {"t": "drop", "coflow": "c1", "flows": ["f"]})
        again = h.flow("c1", "f", "a", "b", size, attempt=1)
        await h.controller.add_flows([again])
        await wait_for(h, lambda: h.controller.all_complete([again.key]))
        assert h.controller.completed[again.key] == synthetic_digest(
            "c1", "f", size, again.digest_key
        )
        assert h.agents["b"].agent.in_flows[again.key].spec.attempt == 1
        assert h.agents["b"].agent.closed_connections == 0


async def test_a_dropped_file_flow_leaves_no_part_file_and_a_new_attempt_commits(tmp_path):
    """A cancelled / failed / restarting file flow: its DST.terra-part goes at the drop (the
    destination never appears); the restart's attempt writes its own and commits it."""
    async with loopback(tmp_path, k=2) as h:
        b = h.agents["b"].agent
        size = 8 * MB
        doomed = h.flow("c1", "f", "a", "b", size, sink="file:out.bin")
        part = h.data_root / "out.bin.terra-part"
        await start_flows(h, [doomed], 0.5 * MB)  # 1 MB/s: 8 s for all of it
        with trio.fail_after(30):
            while b.in_flows[doomed.key].acknowledged < 1 * MB:
                await trio.sleep(0.01)
        assert part.stat().st_size >= 1 * MB
        for agent in ("b", "a"):
            await h.controller.send(agent, {"t": "drop", "coflow": "c1", "flows": ["f"]})
        assert not part.exists() and not (h.data_root / "out.bin").exists()
        again = h.flow("c1", "f", "a", "b", size, sink="file:out.bin", attempt=1)
        await start_flows(h, [again], 20 * MB)
        await wait_for(h, lambda: h.controller.all_complete([again.key]))
        with trio.fail_after(30):
            while part.exists():  # renamed over the destination after the report
                await trio.sleep(0.01)
        data = (h.data_root / "out.bin").read_bytes()
        assert len(data) == size
        source = SyntheticSource(flow_key("c1", "f"), size)
        step = 1 << 20
        pieces = (bytes(source.read(o, min(step, size - o))) for o in range(0, size, step))
        expected = b"".join(pieces)
        assert data == expected  # the synthetic bytes, in order


# ---- end to end: real controller and agents on loopback ----------------------------------

E2E_AGENTS = [("a1", "A", "127.0.0.31"), ("b1", "B", "127.0.0.32"), ("c1", "C", "127.0.0.33")]
E2E_K = 2  # A -> B: the direct link and A-C-B, 20 MB/s each: 40 MB/s in all


class LoopbackSystem:
    """terra-controller --no-openflow --insecure and three terra-agents (--data-root) as
    subprocesses on a triangle WAN of 20 MB/s links; stop() ends exactly those processes."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.data_root = workdir / "data"
        self.data_root.mkdir()
        topo = workdir / "tri.json"
        topo.write_text(
            json.dumps(
                {
                    "name": "tri",
                    "dcs": ["A", "B", "C"],
                    "default_capacity_gbps": 0.16,
                    "links": [{"a": "A", "b": "B"}, {"a": "B", "b": "C"}, {"a": "A", "b": "C"}],
                }
            )
        )
        api, agents, rest = (f"127.0.0.1:{free_port()}" for _ in range(3))
        self.rest = "http://" + rest
        self.logs = [open(workdir / "controller.log", "a")]  # noqa: SIM115
        self.procs = [
            subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "terra_controller.cli",
                    "--topology",
                    str(topo),
                    "--no-openflow",
                    "--k",
                    str(E2E_K),
                    "--api",
                    api,
                    "--agents",
                    agents,
                    "--rest",
                    rest,
                    "--insecure",
                ],
                stdout=subprocess.PIPE,
                stderr=self.logs[0],
                text=True,
            )  # fmt: skip
        ]
        line = self.procs[0].stdout.readline()
        assert line.startswith("terra-controller ready"), line
        for agent, dc, host in E2E_AGENTS:
            self.logs.append(open(workdir / f"{agent}.log", "a"))  # noqa: SIM115
            port = free_port_block(host, E2E_K + 8)
            self.procs.append(
                subprocess.Popen(
                    [
                        sys.executable,
                        "-m",
                        "terra_agent.cli",
                        "--controller",
                        agents,
                        "--dc",
                        dc,
                        "--id",
                        agent,
                        "--data-addr",
                        f"{host}:{port}",
                        "--spill-dir",
                        str(workdir),
                        "--data-root",
                        str(self.data_root),
                        "--insecure",
                    ],
                    stdout=self.logs[-1],
                    stderr=subprocess.STDOUT,
                )  # fmt: skip
            )
        end = time.monotonic() + 20
        while sum(a["connected"] for a in self.get("/status")["agents"]) < len(E2E_AGENTS):
            assert time.monotonic() < end, "agents did not register"
            time.sleep(0.1)
        host, port = api.split(":")
        self.client = TerraClient(host, int(port), insecure=True, timeout=20)

    def get(self, path: str):
        """GET a REST resource (JSON); retries while the REST server is not up yet."""
        for attempt in range(50):
            try:
                with urllib.request.urlopen(self.rest + path, timeout=5) as reply:
                    return json.loads(reply.read())
            except OSError:
                if attempt == 49:
                    raise
                time.sleep(0.1)

    def stop(self) -> None:
        """Close the client, stop the processes, close the logs."""
        self.client.close()
        stop_processes(self.procs)
        for log in self.logs:
            log.close()


@pytest.fixture(scope="module")
def system(tmp_path_factory):
    s = LoopbackSystem(tmp_path_factory.mktemp("failures-e2e"))
    yield s
    s.stop()


def e2e_flow(fid, size, **extra):
    return {"id": fid, "src": "a1", "dst": "b1", "bytes": size, **extra}


def test_e2e_a_missing_source_fails_and_the_other_coflow_gets_full_speed(system):
    client = system.client
    broken = client.submit_coflow([e2e_flow("x", 1000, src_path="missing.bin")])
    big = client.submit_coflow([e2e_flow("y", 40_000_000)])  # 1 s at 40 MB/s
    status = client.wait(broken, timeout=30)
    assert status["state"] == "failed", status
    assert "missing.bin" in status["reason"]
    assert status["flows"][0]["state"] == "failed"
    done = client.wait(big, timeout=60)
    assert done["state"] == "done"
    assert done["cct_s"] < 2.5, done  # full speed: about 1 s (with the fix; held 0 before)
    assert system.get(f"/coflows/{broken}")["state"] == "failed"
    assert system.get("/status")["failed"] >= 1


def test_e2e_cancel_stops_a_transfer_and_frees_its_capacity(system):
    client = system.client
    huge = client.submit_coflow([e2e_flow("h", 2_000_000_000)])  # 50 s at 40 MB/s
    time.sleep(0.5)
    client.cancel_coflow(huge)
    assert client.wait(huge, timeout=5)["state"] == "cancelled"
    started = time.monotonic()
    after = client.submit_coflow([e2e_flow("z", 40_000_000)])
    done = client.wait(after, timeout=60)
    assert done["state"] == "done" and time.monotonic() - started < 3.0, done
    delivered = client.check_status(huge)["bytes_delivered"]
    time.sleep(0.5)
    assert client.check_status(huge)["bytes_delivered"] == delivered  # nothing moves any more
