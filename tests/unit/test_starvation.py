"""Starvation guards (terra_core/starvation.py; docs/design.md 4.2 steps 2 and 5).

The adversarial case runs the real simulator (terra_sim/simulator.py): a stream of
small coflows that starves a large one without a guard.
"""

import math

import pytest

from terra_core import round_fair_share
from terra_core.path_masks import index_for
from terra_core.round_memo import RoundMemo
from terra_core.scheduling_round import PREEMPTED, RoundResult, schedule_round
from terra_core.starvation import Guard, StarvationClock, serve_starving
from terra_core.terra_policy import TerraPolicy
from terra_model import Coflow, Flow
from terra_sim.simulator import simulate
from topologies import Topology

AB = ("A", "B")
LINK = {AB: 10.0}
LINK_PATHS = {AB: [("A", "B")]}


def line() -> Topology:
    """Two DCs, one undirected link of 10 bytes/s (each direction)."""
    return Topology("line", ["A", "B"], {("A", "B"): 10.0, ("B", "A"): 10.0})


def one_flow(cid: str, size: float, arrival: float) -> Coflow:
    return Coflow(cid, arrival, [Flow(f"{cid}f", "A", "B", size)])


def total(rates, cid):
    return sum(r for _, r in rates.get(cid, {}).get(AB, []))


@pytest.fixture(params=["mcf", "waterfill"])
def fair_share(request, monkeypatch):
    """Run a test with the fair shares on the MCF and on path-level water-filling."""
    if request.param == "waterfill":
        monkeypatch.setattr(round_fair_share, "MCF_MAX_COLUMNS", 0)
    return request.param


# ----- the stream of small coflows (the adversarial case) --------------------------------


def small_stream(n: int = 300) -> list[Coflow]:
    """big: 100 bytes at t = 0 (Γ = 100/10 = 10 s alone); s0..s{n-1}: 10 bytes each (Γ = 1 s),
    one every second from t = 0.5 on: together they ask for the whole 10 B/s link until
    t = n + 0.5."""
    return [one_flow("big", 100.0, 0.0)] + [one_flow(f"s{i}", 10.0, 0.5 + i) for i in range(n)]


def run_stream(**kw) -> dict[str, float]:
    res = simulate(TerraPolicy(line(), **kw), small_stream())
    assert not res.unfinished
    return {c.id: c.cct_s for c in res.coflows}


def test_without_a_guard_the_big_coflow_waits_for_the_stream_to_end():
    # α = 0: big runs alone on [0, 0.5) (5 bytes), then every small (Γ 1 s) beats big
    # (Γ >= 9.5 s) and the smalls keep the link full until the last one finishes at
    # 299.5 + 1 = 300.5 s; big's 95 bytes then take 9.5 s: CCT 310 s.
    cct = run_stream(alpha=0.0, guard="fixed")
    assert cct["big"] == pytest.approx(310.0)


def test_the_papers_fixed_reserve_does_not_save_it_either():
    # α = 0.1, fixed: the smalls get 9 B/s in Γ order and need 10/9 s each, so a backlog
    # of preempted smalls builds up and shares the 1 B/s reserve max-min with big; big
    # still finishes only after the stream.
    cct = run_stream(guard="fixed")
    assert cct["big"] >= 300.5


def test_aged_guard_finishes_the_big_coflow_within_its_bound():
    # aged, c = 2, floor 1 s, α = 0.1: T_big = max(2 x 10, 1) = 20 s. No small waits 2 s
    # before t = 20 (each is served at 10 B/s in 1 s), so big is the only starving coflow
    # at s_big = 20 and the bound is T + Γ/α = 20 + 10/0.1 = 120 s. From t = 20 big holds
    # 1 B/s (its min-CCT on α x 10 B/s), so it is done by 20 + 95/1 = 115 s at the latest
    # (steps 3-4 give it the rest of the link once its Γ falls below the smalls').
    cct = run_stream(guard="aged", guard_factor=2.0, guard_floor_s=1.0)
    assert 20.0 < cct["big"] <= 115.0 + 1e-9
    assert cct["big"] <= 20.0 + 10.0 / 0.1
    # and the smalls pay a bounded price: none waits more than 11 s (9 B/s left to them)
    assert max(v for k, v in cct.items() if k != "big") < 11.0


def test_aged_guard_with_a_larger_patience_waits_longer_but_keeps_its_bound():
    # c = 4: T_big = 40 s, bound 40 + 100 = 140 s; big holds 1 B/s from t = 40 on.
    cct = run_stream(guard="aged", guard_factor=4.0)
    assert 40.0 < cct["big"] <= 40.0 + 95.0 + 1e-9


def test_aged_fair_has_no_such_bound():
    # aged-fair shares the reserve among all starving coflows: from t = 20 the smalls get
    # 9 B/s and need 10/9 s each, so they queue, wait over 2 s and starve too; the growing
    # crowd of starving smalls shares big's 1 B/s, and big misses aged's 120 s bound (on
    # this stream it finishes only after the stream, as without a guard).
    cct = run_stream(guard="aged-fair")
    assert cct["big"] > 120.0


class _Recorder(TerraPolicy):
    """TerraPolicy that records the time of every round (allocate, or group_rates: the
    simulator's fast path)."""

    def __init__(self, *args, **kw):
        super().__init__(*args, **kw)
        self.calls: list[float] = []

    def allocate(self, now, remaining):
        self.calls.append(now)
        return super().allocate(now, remaining)

    def group_rates(self, now, volumes):
        self.calls.append(now)
        return super().group_rates(now, volumes)

    def group_rate_arrays(self, now, volumes):
        self.calls.append(now)
        return super().group_rate_arrays(now, volumes)


def test_simulator_runs_a_round_when_a_coflow_starts_starving():
    # Arrivals and finishes of the stream fall on x.5 s; the only event at t = 20.0 is
    # big's starvation time (T = 20 s), asked for through next_wakeup.
    policy = _Recorder(line(), guard="aged")
    simulate(policy, small_stream(30))
    assert 20.0 in policy.calls
    assert policy.next_wakeup(0.0) is None  # every coflow finished and was forgotten


# ----- one round ---------------------------------------------------------------------------


def test_aged_round_without_starving_coflows_is_alpha_zero(fair_share):
    # No starving coflow: nothing is held back; c2 (Γ 1 s) takes all 10 B/s, c1 nothing.
    # The fixed guard gives c2 9 B/s on r = 0.9 x 10 and the reserve 1 B/s to c1.
    vols = {"c1": {AB: 100.0}, "c2": {AB: 10.0}}
    aged = schedule_round(vols, LINK_PATHS, LINK, alpha=0.1, starving=[])
    assert total(aged.rates, "c2") == pytest.approx(10.0)
    assert total(aged.rates, "c1") == 0.0
    fixed = schedule_round(vols, LINK_PATHS, LINK, alpha=0.1)
    assert total(fixed.rates, "c2") == pytest.approx(9.0)
    assert total(fixed.rates, "c1") == pytest.approx(1.0)


def test_aged_round_serves_only_the_oldest_starving_coflow(fair_share):
    # c1 and c3 (100 bytes each) starve, c1 first; c2 (10 bytes) does not. c1 gets its
    # min-CCT on α x 10 = 1 B/s; c2 is scheduled on the 9 B/s left; c3 gets nothing.
    vols = {"c1": {AB: 100.0}, "c2": {AB: 10.0}, "c3": {AB: 100.0}}
    res = schedule_round(vols, LINK_PATHS, LINK, alpha=0.1, starving=["c1", "c3"])
    assert total(res.rates, "c1") == pytest.approx(1.0)
    assert total(res.rates, "c2") == pytest.approx(9.0)
    assert total(res.rates, "c3") == 0.0
    assert res.state["c3"] == PREEMPTED


def test_aged_fair_round_splits_the_reserve_among_starving_coflows(fair_share):
    # Same coflows, aged-fair: c1 and c3 share the 1 B/s reserve max-min (0.5 B/s each).
    vols = {"c1": {AB: 100.0}, "c2": {AB: 10.0}, "c3": {AB: 100.0}}
    res = schedule_round(
        vols, LINK_PATHS, LINK, alpha=0.1, starving=["c1", "c3"], starving_fair=True
    )
    assert total(res.rates, "c1") == pytest.approx(0.5)
    assert total(res.rates, "c3") == pytest.approx(0.5)
    assert total(res.rates, "c2") == pytest.approx(9.0)


def test_unused_reserve_goes_back_to_the_round(fair_share):
    # The starving coflow c1 (A->B) holds 1 B/s of the reserve on A->B only; on B->C
    # nothing starves, so c2 (B->C) takes all 10 B/s there.
    cap = {AB: 10.0, ("B", "C"): 10.0}
    paths = {AB: [("A", "B")], ("B", "C"): [("B", "C")]}
    vols = {"c1": {AB: 100.0}, "c2": {("B", "C"): 50.0}, "c3": {AB: 10.0}}
    res = schedule_round(vols, paths, cap, alpha=0.1, starving=["c1"])
    assert total(res.rates, "c1") == pytest.approx(1.0)
    assert total(res.rates, "c3") == pytest.approx(9.0)
    assert sum(r for _, r in res.rates["c2"][("B", "C")]) == pytest.approx(10.0)


# ----- the clock and the settings ----------------------------------------------------------


def test_clock_orders_by_starvation_time_then_arrival():
    # factor 2, floor 1 s: a (Γ 10 s at t 0) starves at 20; b (Γ 0.1 s at t 5) at 5 + 1 = 6;
    # c (Γ 3 s at t 14) at 14 + 6 = 20, after a (same time, later arrival).
    clock = StarvationClock(Guard("aged", 0.1, 2.0, 1.0))
    clock.start("a", 0.0, 10.0)
    clock.start("b", 5.0, 0.1)
    clock.start("c", 14.0, 3.0)
    assert clock.starving(5.9, "abc") == []
    assert clock.next_wakeup(0.0) == pytest.approx(6.0)
    assert clock.next_wakeup(6.0) == pytest.approx(20.0)
    assert clock.starving(20.0, "abc") == ["b", "a", "c"]
    assert clock.starving(20.0, "ac") == ["a", "c"]
    clock.update("a", 20.0)  # more flows: s = 0 + 40
    assert clock.starving(20.0, "abc") == ["b", "c"]
    clock.forget("b")
    clock.start("inf", 0.0, math.inf)  # no path: never starves
    assert clock.starving(1e9, ["b", "inf"]) == []


@pytest.mark.parametrize(
    "kw",
    [
        {"mode": "paper"},
        {"alpha": 1.0},
        {"alpha": -0.1},
        {"factor": -1.0},
        {"factor": math.inf},
        {"floor_s": -1.0},
        {"floor_s": math.nan},
    ],
)
def test_bad_guard_settings(kw):
    with pytest.raises(ValueError):
        Guard(**kw)


def test_policy_rejects_an_unknown_guard_and_reports_starving_coflows():
    with pytest.raises(ValueError, match="guard"):
        TerraPolicy(line(), guard="none")
    policy = TerraPolicy(line(), guard="aged", guard_factor=2.0, guard_floor_s=1.0)
    assert policy.add_coflow(one_flow("big", 100.0, 0.0), 0.0)  # Γ 10 s: starves at 20 s
    assert policy.next_wakeup(0.0) == pytest.approx(20.0)
    assert policy.starving(19.0) == []
    assert policy.starving(20.0) == ["big"]
    policy.add_flows("big", [Flow("more", "A", "B", 50.0)], 1.0)  # Γ 15 s: starves at 30 s
    assert policy.starving(20.0) == []
    assert policy.next_wakeup(0.0) == pytest.approx(30.0)
    fixed = TerraPolicy(line(), guard="fixed")
    fixed.add_coflow(one_flow("big", 100.0, 0.0), 0.0)
    assert fixed.next_wakeup(0.0) is None and fixed.starving(1e9) == []


def test_terra_sim_flags_reach_the_policy():
    from terra_sim.cli import build_parser, make_policy, run_meta

    args = build_parser().parse_args(
        ["--topology", "swan", "--workload", "fb", "--guard", "aged-fair", "--guard-factor",
         "3", "--guard-floor", "2.5", "--alpha", "0.2"]
    )  # fmt: skip
    policy = make_policy("terra", line(), args)
    assert policy.guard == Guard("aged-fair", 0.2, 3.0, 2.5)
    meta = run_meta(args)
    assert (meta["guard"], meta["guard_factor"], meta["guard_floor_s"]) == ("aged-fair", 3.0, 2.5)
    default = make_policy("terra", line(), build_parser().parse_args(
        ["--topology", "swan", "--workload", "fb"]))  # fmt: skip
    assert default.guard == Guard("aged", 0.1, 2.0, 1.0)


def test_registry_defaults_are_the_guard_defaults():
    # registry.py spells the defaults out (it imports no solver code); they must agree.
    from terra_core import starvation
    from terra_core.registry import SchedulerOptions

    o = SchedulerOptions()
    assert (o.guard, o.guard_factor, o.guard_floor_s) == (
        starvation.DEFAULT_GUARD,
        starvation.DEFAULT_FACTOR,
        starvation.DEFAULT_FLOOR_S,
    )


# ----- the starving coflow's allocation is reused while it stays optimal -------------------


def test_starving_allocation_is_reused_while_it_stays_optimal():
    # c1 starves with FlowGroups A->B (20 bytes) and A->C (10 bytes) on links of 10 B/s;
    # the reserve is α x 10 = 1 B/s per link, so Γ = max(20/1, 10/1) = 20 s and step 2'
    # gives 20/20 = 1 B/s and 10/20 = 0.5 B/s.
    #   * both halved (10, 5): upper bound 20 x 1/2 = 10 s = the dual bound 10 x 1/1 (price
    #     on A->B), so the kept allocation is reused: the same rates, no new memo entry;
    #   * A->C alone shrinks to 1: upper 20 x max(10/20, 1/10) = 10 = the dual bound, exact
    #     again: A->B 1 B/s, A->C 0.5 x (1/10)/(1/2) = 0.1 B/s;
    #   * A->B grows to 30: upper 20 x 30/20 = 30 s = the dual bound 30 x 1/1: still exact
    #     (Γ is homogeneous in the volumes), 1 B/s and 0.5 x (5/10)/(30/20) = 1/6 B/s;
    #   * A->C grows past A->B (10, 30): the bottleneck moves; upper 20 x 30/10 = 60 s >
    #     the dual bound 10 s, so the LP is solved anew: Γ = 30 s, 10/30 and 1 B/s.
    ac = ("A", "C")
    cap = {AB: 10.0, ac: 10.0}
    paths = {AB: [("A", "B")], ac: [("A", "C")]}
    memo = RoundMemo()

    def step_2(volumes):
        rates: dict = {}
        index = index_for(None, cap)
        serve_starving(
            {"c1": volumes}, ["c1"], paths, dict(cap), cap, 0.1, False, rates, RoundResult(),
            index, memo,
        )  # fmt: skip
        return {pair: sum(per_path.values()) for pair, per_path in rates["c1"].items()}

    assert step_2({AB: 20.0, ac: 10.0}) == pytest.approx({AB: 1.0, ac: 0.5})
    kept = memo.starving
    assert step_2({AB: 10.0, ac: 5.0}) == pytest.approx({AB: 1.0, ac: 0.5})
    assert memo.starving is kept
    assert step_2({AB: 10.0, ac: 1.0}) == pytest.approx({AB: 1.0, ac: 0.1})
    assert memo.starving is kept
    assert step_2({AB: 30.0, ac: 5.0}) == pytest.approx({AB: 1.0, ac: 1.0 / 6.0})
    assert memo.starving is kept
    assert step_2({AB: 10.0, ac: 30.0}) == pytest.approx({AB: 1.0 / 3.0, ac: 1.0})
    assert memo.starving is not kept


def test_round_keeps_the_starving_allocation_in_its_memo():
    # schedule_round hands its memo to step 2': the starving c1 (A->B 20 and A->C 10 bytes,
    # as above) gets 1 and 0.5 B/s of the reserve; with both volumes halved next round the
    # kept entry is reused (not replaced). Steps 3-6 then add the rest of each link.
    ac = ("A", "C")
    cap = {AB: 10.0, ac: 10.0}
    paths = {AB: [("A", "B")], ac: [("A", "C")]}
    memo = RoundMemo()
    schedule_round({"c1": {AB: 20.0, ac: 10.0}}, paths, cap, memo=memo, starving=["c1"])
    kept = memo.starving
    res = schedule_round({"c1": {AB: 10.0, ac: 5.0}}, paths, cap, memo=memo, starving=["c1"])
    assert memo.starving is kept
    assert total(res.rates, "c1") == pytest.approx(10.0)
