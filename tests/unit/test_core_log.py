"""The controller core's events, recorded and replayed (terra_controller/core_log.py): a
controller driven through submits, agent reports, rounds, a link failure, a cancel, a failed
flow and the timer, with its events recorded, then a fresh controller fed the log."""

from __future__ import annotations

import json

import pytest

from terra_controller.coflow_state import RegistryError
from terra_controller.controller import Controller
from terra_controller.core_log import CoreRecorder, read_events, replay
from terra_core.terra_policy import TerraPolicy
from topologies import Topology

AGENTS = {"a1": "A", "b1": "B", "c1": "C", "d1": "D"}


class StepClock:
    """A clock the test moves (seconds)."""

    def __init__(self) -> None:
        self.t = 100.123456789  # (times whose differences are not exact in binary)

    def __call__(self) -> float:
        return self.t


def make_controller(clock=None) -> Controller:
    links = {}
    for u, v in [("A", "B"), ("B", "C"), ("C", "D"), ("A", "D"), ("A", "C")]:
        links[(u, v)] = links[(v, u)] = 1e8
    topology = Topology("square", list("ABCD"), links)
    return Controller(topology, TerraPolicy(topology, k=3), clock=clock, state_dir=None)


def drive(c: Controller, clock: StepClock) -> None:
    """A run of the core: every kind of event, with the clock moving between them."""
    for agent, dc in AGENTS.items():
        c.register_agent(agent, dc, "127.0.0.1:30000")
    flows = [{"id": f"f{i}", "src": "a1", "dst": "c1", "bytes": 4 * 10**8} for i in range(3)]
    big = c.submit([*flows, {"id": "g", "src": "b1", "dst": "d1", "bytes": 10**8}])
    small = c.submit([{"id": "s", "src": "d1", "dst": "b1", "bytes": 10**7}], deadline=60)
    other = c.submit([{"id": "x", "src": "c1", "dst": "a1", "bytes": 3 * 10**8}], owner="job")
    with pytest.raises(RegistryError):
        c.submit([{"id": "bad", "src": "a1", "dst": "nobody", "bytes": 1}])
    c.run_round()
    clock.t += 0.5772156649
    c.progress(small, "s", 5 * 10**6)
    c.complete(small, "s", "00" * 32)
    c.progress(big, "f0", 10**8)
    with pytest.raises(RegistryError):  # refused in the core: an event with its error
        c.update(small, [{"id": "late", "src": "a1", "dst": "b1", "bytes": 1}])
    c.run_round()
    clock.t += 0.2718281828
    c.set_link_state("A", "C", False)
    c.run_round()
    c.update(big, [{"id": "h", "src": "d1", "dst": "a1", "bytes": 2 * 10**7}])
    c.fail_flow(other, "x", "disk full")
    clock.t += 1.4142135623
    c.set_capacity("A", "B", 5e7)
    c.run_round()
    c.cancel(big)
    c.check_timeouts()
    c.run_round()


def recorded_run(tmp_path) -> Controller:
    """A controller driven by `drive` with its events recorded in tmp_path/core.log."""
    clock = StepClock()
    live = make_controller(clock)
    live.recorder = CoreRecorder(tmp_path / "core.log")
    drive(live, clock)
    live.recorder.close()
    return live


def test_a_replayed_log_gives_the_same_outcomes_rates_and_states(tmp_path):
    live = recorded_run(tmp_path)
    events = list(read_events(tmp_path / "core.log"))
    kinds = {e.kind for e in events}
    assert kinds >= {"agent", "submit", "progress", "complete", "round", "round_applied",
                     "link", "update", "fail_flow", "capacity", "cancel", "timeouts"}  # fmt: skip
    assert [e.seq for e in events] == list(range(len(events)))
    assert {"error": "coflow_done"} in [e.outcome for e in events if e.kind == "update"]
    by_kind = {e.kind: e for e in events}  # (the last of each kind)
    big, other = by_kind["cancel"].args[0], by_kind["fail_flow"].args[0]
    assert by_kind["cancel"].effects == [["drop", big, ["f0", "f1", "f2", "g", "h"], False],
                                         ["round", False]]  # fmt: skip
    assert by_kind["fail_flow"].effects == [["drop", other, ["x"], False], ["round", False]]
    assert ["round", True] in by_kind["link"].effects
    again = make_controller()  # (its own clock: every event brings its time)
    report = replay(again, events)
    assert report.identical, report.mismatches
    assert report.events == len(events) and report.rounds == 5
    assert _states(again) == _states(live)
    assert again.rates == live.rates


def test_a_log_whose_outcomes_or_effects_differ_is_reported(tmp_path):
    recorded_run(tmp_path)
    lines = (tmp_path / "core.log").read_text().splitlines()
    forged = []
    for line in lines:
        seq, at, kind, args, outcome, effects = json.loads(line)
        if kind == "round_applied" and not forged:
            outcome = "0" * 64
            forged.append(seq)
        elif kind == "complete":
            outcome = not outcome
            forged.append(seq)
        elif kind == "cancel":  # (the agents were told to drop other flows)
            effects = [["drop", args[0], ["f0"], False]]
            forged.append(seq)
        line = json.dumps([seq, at, kind, args, outcome, effects])
        (tmp_path / "forged.log").open("a").write(line + "\n")
    report = replay(make_controller(), read_events(tmp_path / "forged.log"))
    assert [m[0] for m in report.mismatches] == forged and not report.identical


def test_bad_logs_get_one_line_errors(tmp_path):
    (tmp_path / "bad.log").write_text('[0, 1.0, "submit", [], null, []]\nnot json\n')
    with pytest.raises(ValueError, match=r"bad.log:2: not an event"):
        list(read_events(tmp_path / "bad.log"))
    (tmp_path / "kind.log").write_text('[0, 1.0, "reboot", [], null, []]\n')
    with pytest.raises(ValueError, match="unknown kind 'reboot'"):
        replay(make_controller(), read_events(tmp_path / "kind.log"))
    (tmp_path / "half.log").write_text('[0, 1.0, "round_applied", [], "00", []]\n')
    with pytest.raises(ValueError, match="round_applied without its round"):
        replay(make_controller(), read_events(tmp_path / "half.log"))


def test_the_log_is_private_and_holds_the_time_of_each_event(tmp_path):
    clock = StepClock()
    live = make_controller(clock)
    live.recorder = CoreRecorder(tmp_path / "core.log")
    live.register_agent("a1", "A", "127.0.0.1:30000")
    clock.t += 2.5
    live.register_agent("b1", "B", "127.0.0.1:30000")
    live.recorder.close()
    assert (tmp_path / "core.log").stat().st_mode & 0o077 == 0  # (it holds coflow secrets)
    assert [e.at for e in read_events(tmp_path / "core.log")] == [0.0, 2.5]


def _states(c: Controller) -> dict:
    out = {}
    for cid, coflow in c.registry.coflows.items():
        flows = {fid: (f.state.value, f.delivered, f.restarts, f.digest_key)
                 for fid, f in coflow.flows.items()}  # fmt: skip
        out[cid] = (
            coflow.state.value,
            coflow.submitted_s,
            coflow.finished_s,
            coflow.ended_s,
            coflow.reason,
            flows,
        )
    return out


def test_a_log_that_cannot_be_written_stops_recording_not_the_controller(tmp_path):
    live = make_controller(StepClock())
    live.recorder = CoreRecorder(tmp_path / "core.log")
    live.recorder._file = open("/dev/full", "wb")  # (a full disk)
    for agent, dc in AGENTS.items():
        live.register_agent(agent, dc, "127.0.0.1:30000")
    cid = live.submit([{"id": "f", "src": "a1", "dst": "c1", "bytes": 10**6}])
    live.run_round()
    assert live.rates[cid]["f"] and live.recorder.failed
    assert live.status(cid)["state"] == "running"


def test_an_existing_log_is_kept_and_the_new_one_is_private(tmp_path):
    old = tmp_path / "core.log"
    old.write_text("an earlier run\n")
    old.chmod(0o644)
    CoreRecorder(old).close()
    assert (tmp_path / "core.log.1").read_text() == "an earlier run\n"
    assert old.stat().st_mode & 0o077 == 0 and old.read_text() == ""


def test_a_restarted_controller_s_log_starts_from_its_journal(tmp_path):
    """A controller restarted on its state directory records what its journal gave it (the
    next coflow id, an operator's link state); `terra-controller replay` starts from there.
    A log whose controller resumed coflows of its journal is refused: they are not in it."""
    import argparse

    from terra_controller.replay_cli import RECORDED_OPTIONS, recorder_of, run_replay

    topo = tmp_path / "square.json"
    links = [
        {"a": u, "b": v} for u, v in [("A", "B"), ("B", "C"), ("C", "D"), ("A", "D"), ("A", "C")]
    ]
    topo.write_text(json.dumps({"name": "sq", "dcs": list("ABCD"), "links": links,
                                "default_capacity_gbps": 0.8}))  # fmt: skip
    options = dict.fromkeys(RECORDED_OPTIONS)
    options.update(topology=str(topo), scheduler="terra", k=3, alpha=0.1, guard="aged",
                   guard_factor=2.0, guard_floor_s=1.0, epsilon=0.1, delta=0.1,
                   no_openflow=True, agent_timeout=60.0, keep_finished=10_000,
                   max_restarts=3)  # fmt: skip
    state = tmp_path / "state"

    def start(log: str | None) -> Controller:
        from topologies import load_topology

        t = load_topology(str(topo))
        c = Controller(t, TerraPolicy(t, k=3), state_dir=state)
        if log is not None:
            c.recorder = recorder_of(argparse.Namespace(record=tmp_path / log, **options), c)
        for agent, dc in AGENTS.items():
            c.register_agent(agent, dc, "127.0.0.1:30000")
        return c

    first = start(None)
    done = first.submit([{"id": "f", "src": "a1", "dst": "c1", "bytes": 10**6}])
    first.complete(done, "f", "00" * 32)
    first.set_link_state("A", "C", False)
    first.close()
    second = start("second.log")  # (nothing to resume: the coflow is done)
    again = second.submit([{"id": "g", "src": "a1", "dst": "c1", "bytes": 10**6}])
    second.run_round()
    assert again == done + 1  # (the journal's next id)
    assert all(("A", "C") != p[:2] for p, _ in second.rates[again]["g"])  # (A-C still down)
    pending = second.submit([{"id": "h", "src": "b1", "dst": "d1", "bytes": 10**9}])
    second.close()
    assert run_replay(argparse.Namespace(log=tmp_path / "second.log", topology=None, show=5)) == 0
    third = start("third.log")  # (coflows `again` and `pending` wait to be resumed)
    third.close()
    code = run_replay(argparse.Namespace(log=tmp_path / "third.log", topology=None, show=5))
    assert code == 2 and pending > again


def recording_controller(tmp_path) -> Controller:
    """A controller recording to tmp_path/core.log with AGENTS registered."""
    c = make_controller(StepClock())
    c.recorder = CoreRecorder(tmp_path / "core.log")
    for agent, dc in AGENTS.items():
        c.register_agent(agent, dc, "127.0.0.1:30000")
    return c


def test_effects_are_performed_after_their_event_in_order_and_not_on_replay(tmp_path):
    c = recording_controller(tmp_path)
    seen = []

    def on_drop(coflow, flows, restart):  # (runs after the handler: the state is final)
        seen.append(("drop", coflow.id, [f.id for f in flows], restart, coflow.state.value,
                     c.effects is None, c.round_wanted))  # fmt: skip

    def broken(*args):
        raise RuntimeError("a listener that fails")

    c.on_drop += [broken, on_drop]
    c.on_tick.append(lambda: seen.append(("tick",)))
    cid = c.submit([{"id": f"f{i}", "src": "a1", "dst": "c1", "bytes": 10**8} for i in range(2)])
    c.run_round()
    c.round_wanted = False
    c.fail_flow(cid, "f1", "disk hiccup", retry=True)  # a restart: drop and send again
    c.cancel(cid)
    c.check_timeouts()
    assert seen == [("drop", cid, ["f1"], True, "running", True, True),
                    ("drop", cid, ["f0", "f1"], False, "cancelled", True, True),
                    ("tick",)]  # fmt: skip
    c.recorder.close()
    events = list(read_events(tmp_path / "core.log"))
    by_kind = {e.kind: e for e in events}
    assert by_kind["fail_flow"].effects == [["drop", cid, ["f1"], True], ["round", False]]
    assert by_kind["timeouts"].effects == [["tick"]]
    again = make_controller()
    again.on_drop.append(lambda *args: seen.append("replayed"))
    again.on_tick.append(lambda: seen.append("replayed"))
    assert replay(again, events).identical
    assert "replayed" not in seen  # (a replay compares the effects and performs none)


def test_an_effect_emitted_outside_an_event_is_performed_at_once():
    c = make_controller()
    c.round_wanted = False
    c.round_asked = type(c.round_asked)()
    c.want_round(wan=True)  # (not a core event: the round is asked for at once)
    assert c.round_wanted and c.wan_dirty and c.round_asked.is_set()
    assert c.effects is None and c.last_effects is None


def test_a_round_s_rates_go_out_as_its_effect_after_they_are_applied(tmp_path):
    c = recording_controller(tmp_path)
    seen = []

    def on_rates(rates, wan):  # (the round's state is applied when the rates go out)
        seen.append((rates == c.rates, wan, c.registry.coflows[cid].state.value))

    def broken(*args):
        raise RuntimeError("a listener that fails")

    c.on_rates += [broken, on_rates]
    cid = c.submit([{"id": "f0", "src": "a1", "dst": "c1", "bytes": 10**8}])
    c.run_round()
    c.set_link_state("A", "C", False)
    c.run_round()
    assert seen == [(True, False, "running"), (True, True, "running")]
    c.recorder.close()
    events = list(read_events(tmp_path / "core.log"))
    applied = [e.effects for e in events if e.kind == "round_applied"]
    assert applied == [[["push", False]], [["push", True]]]
    again = make_controller()
    again.on_rates.append(lambda *args: seen.append("replayed"))
    assert replay(again, events).identical and "replayed" not in seen
    forged = [e if e.kind != "round_applied" else
              type(e)(e.seq, e.at, e.kind, e.args, e.outcome, [["push", not e.effects[0][1]]])
              for e in events]  # fmt: skip
    assert not replay(make_controller(), forged).identical
