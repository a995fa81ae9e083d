"""The agents' core (terra_controller/agent_core.py): events in, effects out.

A Controller without threads or sockets holds the registry the core reads; the core's
registry updates (ApplyReport) are applied through `agent_channel.apply_report`, as the
channel applies them, and their outcomes fed back as events.
"""

from __future__ import annotations

import logging
from collections import deque

from terra_controller import agent_core as core
from terra_controller.agent_channel import AgentChannel, apply_report
from terra_controller.controller import Controller
from terra_controller.tunnel_table import TunnelTable
from terra_core.terra_policy import TerraPolicy
from terra_security.pki import INSECURE, Identity, Role
from terra_wire import control as protocol
from topologies import Topology

AGENTS = [("a1", "A"), ("a2", "A"), ("b1", "B"), ("c1", "C")]
CONNECTED = frozenset(a for a, _ in AGENTS)


def make_controller() -> Controller:
    """A Controller on a triangle A-B-C (100 MB/s links) with AGENTS registered."""
    links = {}
    for u, v in [("A", "B"), ("B", "C"), ("A", "C")]:
        links[(u, v)] = links[(v, u)] = 1e8
    topology = Topology("tri", ["A", "B", "C"], links)
    controller = Controller(topology, TerraPolicy(topology, k=2))
    for agent, dc in AGENTS:
        controller.registry.register_agent(agent, dc, "127.0.0.1:30000")
    return controller


def with_coflow(size: int = 1000) -> tuple[Controller, str]:
    """make_controller() plus one coflow: flow "f" a1 (A) -> b1 (B) of `size` bytes."""
    controller = make_controller()
    cid = controller.submit([{"id": "f", "src": "a1", "dst": "b1", "bytes": size}])
    return controller, str(cid)


def tag(controller: Controller, coflow: str, flow: str = "f") -> str:
    """The report tag of the flow's current attempt."""
    return protocol.report_tag(controller.registry.flow(int(coflow), flow).digest_key)


def run(state, controller, event, now=0.0, record=None) -> list:
    """Step the core with `event`, apply its ApplyReport effects through the controller and
    step the outcomes too (as the channel does); every effect and outcome event, in order.
    Each event stepped is appended to `record` as (now, event) when given."""
    if record is not None:
        record.append((now, event))
    effects = []
    for effect in core.step(state, controller.registry, event, now):
        effects.append(effect)
        if isinstance(effect, core.ApplyReport):
            outcome = apply_report(controller, effect.report, CONNECTED)
            effects.append(outcome)
            effects += run(state, controller, outcome, now, record)
    return effects


def of(effects: list, kind: type) -> list:
    return [e for e in effects if isinstance(e, kind)]


def sent(effects: list, agent: str | None = None) -> list[tuple[str, str]]:
    """(agent, message type) of the Send effects (to `agent` only, when given)."""
    return [(e.agent, e.message["t"]) for e in of(effects, core.Send) if agent in (None, e.agent)]


# ---- registration ---------------------------------------------------------------------------


def test_a_registration_is_checked_then_recorded_then_answered():
    state = core.AgentState()
    event = core.Register("a1", "A", "0.0.0.0:7000", "127.0.0.1", INSECURE, generation=3)
    effects = core.step(state, make_controller().registry, event, 0.0)
    # an unspecified host becomes the control connection's own address
    assert effects == [core.RecordAgent("a1", "A", "127.0.0.1:7000", (), 3)]
    recorded = core.AgentRecorded("a1", "A", "127.0.0.1:7000", (), 3)
    state.sent_rates["a1"] = {("1", "B"): {"t1": 5.0}}  # from an earlier connection
    effects = core.step(state, make_controller().registry, recorded, 1.0)
    assert effects[-1] == core.Send("a1", {"t": "registered", "agent": "a1", "generation": 3})
    assert core.Metric("registrations", 1) in effects
    assert core.Note("agent_registered", (("agent", "a1"), ("dc", "A"))) in effects
    assert state.sent_rates["a1"] == {}  # it gets all its rates again


def test_a_registration_under_another_name_role_or_address_is_refused_for_good():
    registry = make_controller().registry
    agent_cert = Identity("a1", Role.AGENT)

    def register(identity, agent="a1", bound=None, data_addr="127.0.0.1:7000"):
        event = core.Register(agent, "A", data_addr, "127.0.0.1", identity, bound)
        return core.step(core.AgentState(), registry, event, 0.0)

    assert register(agent_cert) == [core.RecordAgent("a1", "A", "127.0.0.1:7000")]
    assert register(agent_cert, bound="a1")[0].agent == "a1"  # the same agent again
    assert register(agent_cert, agent="a2") == [
        core.RefuseRegistration("certificate of 'a1' cannot register as 'a2'")
    ]
    assert register(Identity("j", Role.JOB)) == [core.RefuseRegistration("job 'j' is not an agent")]
    assert register(INSECURE, agent="a2", bound="a1") == [
        core.RefuseRegistration("one connection cannot register two agents")
    ]
    (refused,) = register(agent_cert, data_addr="10.1.2.3:7000")
    assert isinstance(refused, core.RefuseRegistration) and "10.1.2.3" in refused.message


def test_the_registry_refuses_an_agent_of_an_unknown_dc():
    """RecordAgent of an unknown DC: the channel refuses the registration with the
    registry's error (RegistrationRefused, fatal)."""
    import pytest

    from terra_controller.registration_checks import RegistrationRefused

    controller = make_controller()
    chan = AgentChannel(controller, TunnelTable(controller.topology, 2))
    event = core.Register("z1", "Z", "127.0.0.1:7000", "127.0.0.1", INSECURE)
    with pytest.raises(RegistrationRefused, match="unknown DC 'Z'"):
        chan.dispatch(event)
    assert "z1" not in controller.registry.agents and chan.connections == {}


def test_an_inflight_row_with_a_digest_completes_its_flow_before_registered():
    controller, cid = with_coflow(1000)
    state = core.AgentState()
    row = {"coflow": cid, "flow": "f", "role": "recv", "offset": 1000, "k": tag(controller, cid)}
    row["digest"] = "00" * 32
    effects = run(state, controller, core.AgentRecorded("b1", "B", "127.0.0.1:1", (row,)))
    applied = of(effects, core.ReportApplied)
    assert [(a.report.kind, a.result) for a in applied] == [("progress", True), ("complete", True)]
    assert controller.status(int(cid))["state"] == "done"
    assert sent(effects) == [("b1", "registered")]  # last, once the rows are applied


# ---- reports --------------------------------------------------------------------------------


def test_a_forged_report_is_refused_forbidden_and_never_applied():
    controller, cid = with_coflow()
    state = core.AgentState()
    progress = core.Report("c1", "progress", cid, "f", (10, tag(controller, cid)))
    assert core.step(state, controller.registry, progress, 0.0) == [
        core.Refused(
            "c1", "progress", "forbidden", f"agent 'c1' is not the any endpoint of {cid}/f"
        )
    ]
    # a "source" failure comes from the sender only; the receiver's is refused
    failed = core.Report("b1", "failed", cid, "f", ("gone", "source", 0, tag(controller, cid)))
    (refused,) = core.step(state, controller.registry, failed, 0.0)
    assert (refused.code, refused.label) == ("forbidden", "failed")
    assert controller.status(int(cid))["flows"][0]["bytes_delivered"] == 0
    assert controller.status(int(cid))["state"] == "queued"


def test_a_stale_report_is_refused_and_resynchronizes_the_flow_once():
    controller, cid = with_coflow()
    state = core.AgentState()
    stale = core.Report("a1", "progress", cid, "f", (10, "0" * 32))
    effects = run(state, controller, stale, now=100.0)
    (refused,) = of(effects, core.Refused)
    assert refused == core.Refused(
        "a1", "progress", "stale_attempt", "flow f: report not about its current attempt"
    )
    assert controller.stats["refused_reports"] == 1
    assert controller.status(int(cid))["flows"][0]["bytes_delivered"] == 0
    # the receiver gets "drop" and the descriptor at once, the sender once it acked them
    assert sent(effects) == [("b1", "drop"), ("b1", "flows")]
    msg_id = of(effects, core.Send)[-1].message["id"]
    assert state.after_ack[msg_id][0] == 100.0 + core.RESTART_ACK_S
    again = run(state, controller, stale, now=100.0 + core.RESYNC_S / 2)
    assert sent(again) == [] and len(of(again, core.Refused)) == 1  # not within RESYNC_S
    released = core.step(state, controller.registry, core.Ack(msg_id), 101.0)
    assert sent(released) == [("a1", "drop"), ("a1", "flows")]


def test_a_report_without_a_tag_is_refused_without_a_resync():
    controller, cid = with_coflow()
    effects = run(core.AgentState(), controller, core.Report("a1", "progress", cid, "f", (5, "")))
    assert [e.code for e in of(effects, core.Refused)] == ["stale_attempt"] and sent(effects) == []


def test_progress_about_a_cancelled_coflow_gets_drop_back():
    controller, cid = with_coflow()
    controller.cancel(int(cid))
    effects = run(core.AgentState(), controller,
                  core.Report("a1", "progress", cid, "f", (10, tag(controller, cid))))  # fmt: skip
    assert of(effects, core.ReportApplied)[0].result is False
    assert of(effects, core.Send) == [core.Send("a1", {"t": "drop", "coflow": cid, "flows": ["f"]})]


def test_a_duplicate_completion_is_applied_once():
    controller, cid = with_coflow(1000)
    state = core.AgentState()
    complete = core.Report("b1", "complete", cid, "f", ("00" * 32, None, tag(controller, cid)))
    first = run(state, controller, complete)
    assert controller.status(int(cid))["state"] == "done"
    assert controller.metrics.bytes_delivered._value.get() == 1000
    second = run(state, controller, complete)
    assert of(first, core.ReportApplied)[0].result is True
    assert of(second, core.ReportApplied)[0].result is True and not of(second, core.Refused)
    assert controller.metrics.bytes_delivered._value.get() == 1000  # not counted twice


def test_reports_about_an_unknown_coflow_are_kept_once_each_and_applied_when_it_is_known():
    controller, cid = with_coflow(1000)
    state = core.AgentState()
    future = str(int(cid) + 1)
    for acked in (300, 200, 300):  # duplicates and an older offset: the highest is kept
        assert (
            run(state, controller, core.Report("a1", "progress", future, "f", (acked, "t"))) == []
        )
    assert state.pending_count == {"a1": 1}
    assert state.pending["a1"][future][("progress", "f")] == (300, "t")
    # a coflow id that is not one is refused, not kept
    (refused,) = run(state, controller, core.Report("a1", "progress", "x", "f", (1, "t")))
    assert refused.code == "unknown_coflow" and state.pending_count == {"a1": 1}
    controller.submit([{"id": "f", "src": "a1", "dst": "b1", "bytes": 1000}])
    effects = run(state, controller, core.ApplyKept((future,)))
    # applied with the usual checks: "t" is not the new coflow's tag
    assert [(e.label, e.code) for e in of(effects, core.Refused)] == [
        ("kept progress", "stale_attempt")
    ]
    assert state.pending == {} and state.pending_agents == {} and state.pending_count == {"a1": 0}


def test_kept_reports_are_bounded_per_agent_oldest_first(monkeypatch):
    monkeypatch.setattr(core, "MAX_PENDING_PER_AGENT", 3)
    controller, cid = with_coflow()
    state = core.AgentState()
    for n in range(1, 6):
        run(state, controller, core.Report("a1", "progress", str(int(cid) + n), "f", (1, "t")))
    run(state, controller, core.Report("a2", "progress", str(int(cid) + 1), "f", (1, "t")))
    assert state.pending_count == {"a1": 3, "a2": 1}
    assert list(state.pending["a1"]) == [str(int(cid) + n) for n in (3, 4, 5)]
    assert state.pending_agents[str(int(cid) + 1)] == {"a2"}  # another agent's stays


# ---- disconnects, drops, acks, rates --------------------------------------------------------


def test_a_disconnect_is_remembered_and_its_rates_forgotten():
    state = core.AgentState(sent_rates={"a1": {("1", "B"): {"t1": 1.0}}})
    effects = core.step(state, make_controller().registry, core.Disconnect("a1", 1234.5), 9.0)
    assert state.last_seen == {"a1": 1234.5} and "a1" not in state.sent_rates
    assert core.Note("agent_lost", (("agent", "a1"),)) in effects
    assert core.Log(logging.INFO, "agent a1 disconnected") in effects


def test_a_cancel_drops_at_both_endpoints_and_a_restart_waits_for_the_receiver():
    controller, cid = with_coflow()
    state = core.AgentState()
    drop = core.Drop(cid, (("f", "a1", "b1"), ("g", "a2", "b1")), False)
    effects = core.step(state, controller.registry, drop, 0.0)
    assert [(e.agent, e.message["flows"]) for e in effects] == [
        ("a1", ["f"]), ("b1", ["f", "g"]), ("a2", ["g"])
    ]  # fmt: skip
    restart = core.Drop(cid, (("f", "a1", "b1"),), True, frozenset({"a1"}))
    assert sent(core.step(state, controller.registry, restart, 0.0)) == [
        ("a1", "drop"),
        ("a1", "flows"),
    ]  # fmt: skip  (the receiver is not connected: the sender at once)
    restart = core.Drop(cid, (("f", "a1", "b1"),), True, CONNECTED)
    assert sent(core.step(state, controller.registry, restart, 0.0)) == [
        ("b1", "drop"), ("b1", "flows")
    ]  # fmt: skip
    assert core.step(state, controller.registry, core.Tick(), core.RESTART_ACK_S - 0.1) == []
    late = core.step(state, controller.registry, core.Tick(), core.RESTART_ACK_S)
    assert sent(late) == [("a1", "drop"), ("a1", "flows")] and state.after_ack == {}


def test_an_ack_of_a_message_never_sent_changes_nothing():
    state = core.AgentState()
    assert core.step(state, make_controller().registry, core.Ack(99), 1.0) == []
    assert state.acks == {}


def test_rates_send_only_changes_and_pause_lost_groups():
    registry = make_controller().registry
    state = core.AgentState()
    wanted = {"a1": {("1", "B"): {"t1": 5.0}, ("2", "C"): {"t2": 1.0}}}
    first = core.step(state, registry, core.Rates(wanted, ("a1", "b1")), 0.0)
    assert [len(e.message["rates"]) for e in first] == [2]  # b1 sends nothing: no message
    changed = {"a1": {("1", "B"): {"t1": 5.0}, ("2", "C"): {"t2": 2.0}}}
    (second,) = core.step(state, registry, core.Rates(changed, ("a1",)), 1.0)
    assert second.message["rates"] == [
        {"coflow": "2", "dst_dc": "C", "paths": [{"tunnel": "t2", "rate": 2.0}]}
    ]
    (third,) = core.step(
        state, registry, core.Rates({"a1": {("1", "B"): {"t1": 5.0}}}, ("a1",)), 2.0
    )
    assert third.message["rates"] == [{"coflow": "2", "dst_dc": "C", "paths": []}]  # paused
    assert (
        core.step(state, registry, core.Rates({"a1": {("1", "B"): {"t1": 5.0}}}, ("a1",)), 3.0)
        == []
    )
    (fresh,) = core.step(
        state, registry, core.Rates({"a1": {("1", "B"): {"t1": 5.0}}}, ("a1",), ("a1",)), 4.0
    )
    assert len(fresh.message["rates"]) == 1  # a new registration gets all again


def test_a_wan_event_reaction_completes_on_the_last_ack():
    registry = make_controller().registry
    state = core.AgentState()
    wanted = {"a1": {("1", "B"): {"t1": 5.0}}, "a2": {("1", "B"): {"t1": 3.0}}}
    effects = core.step(state, registry, core.Rates(wanted, ("a1", "a2"), event_at=10.0), 10.5)
    ids = [e.message["id"] for e in effects]
    (reaction,) = state.reactions
    assert reaction.pending == set(ids) and reaction.agents == {"a1", "a2"}
    assert core.step(state, registry, core.Ack(ids[0]), 11.0) == []
    assert core.step(state, registry, core.Ack(ids[1]), 12.0) == [core.Metric("reaction", 2.0)]
    assert reaction.applied_at == 12.0 and state.reaction_count == 1


# ---- record and replay ----------------------------------------------------------------------


def test_a_recorded_sequence_replays_to_the_same_state_and_effects():
    controller, cid = with_coflow(1000)
    state, record = core.AgentState(), []
    k = tag(controller, cid)
    future = str(int(cid) + 1)
    row = {"coflow": future, "flow": "f", "role": "send", "offset": 10, "k": "t"}
    events = [
        core.Register("a1", "A", "127.0.0.1:7000", "127.0.0.1", INSECURE, None, (row,)),
        core.AgentRecorded("a1", "A", "127.0.0.1:7000", (row,)),
        core.Report("a1", "progress", cid, "f", (400, k)),
        core.Report("c1", "progress", cid, "f", (500, k)),  # forged
        core.Report("a1", "progress", cid, "f", (500, "0" * 32)),  # stale: resync
        core.Rates({"a1": {(cid, "B"): {"t1": 5.0}}}, ("a1", "b1"), event_at=1.0),
        core.Ack(1),
        core.Tick(),
        core.Disconnect("a1", 99.0),
    ]
    effects = [run(state, controller, e, now=float(n), record=record) for n, e in enumerate(events)]
    assert len(record) > len(events)  # the outcomes of registry updates are events too
    # replayed over the registry the events were recorded with (the core only reads it)
    fresh = core.AgentState()
    replayed = core.replay(fresh, controller.registry, record)
    assert fresh == state
    flat = [e for effs in effects for e in effs]
    assert [e for effs in replayed for e in effs] == [
        e for e in flat if not isinstance(e, core.ReportApplied | core.ReportRefused)
    ]
    assert sent(flat, "b1") == [("b1", "drop"), ("b1", "flows")]  # the resync did happen
    assert fresh.pending_count == {"a1": 1} and fresh.last_seen == {"a1": 99.0}


def test_the_channel_records_what_it_dispatches():
    controller, cid = with_coflow()
    chan = AgentChannel(controller, TunnelTable(controller.topology, 2))
    chan.record = []
    chan.dispatch(core.Report("a1", "progress", cid, "f", (100, tag(controller, cid))))
    chan.dispatch(core.Report("b1", "failed", cid, "f", ("bad", "digest", 0, tag(controller, cid))))
    kinds = [type(e).__name__ for _, e in chan.record]
    # the restart after the digest failure reaches the core as a Drop inside the report's step
    assert kinds == ["Report", "ReportApplied", "Report", "Drop", "ReportApplied"]
    fresh = core.AgentState(leaf_mac=chan.leaf_mac)
    core.replay(fresh, controller.registry, chan.record)
    assert fresh == chan.core and isinstance(fresh.reactions, deque)
