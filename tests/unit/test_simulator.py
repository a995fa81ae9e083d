"""The event-driven simulator (terra_sim/simulator.py): hand-computed runs, scripted WAN
changes, policy-bug detection, byte conservation, and random instances with every policy.

Capacities are 1e9 B/s unless stated, so times are bytes / 1e9.
"""

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from terra_core.per_flow import PerFlowPolicy
from terra_core.policy import PairLevels, PairTable
from terra_core.registry import make_scheduler, scheduler_names
from terra_core.terra_policy import TerraPolicy
from terra_core.varys import VarysPolicy
from terra_model import Coflow, Flow
from terra_sim.errors import SimulationError
from terra_sim.simulator import (
    WanChange,
    empty_wan_gammas,
    simulate,
    with_deadline_factor,
)
from topologies import Topology, load_topology

G = 1e9

BASELINES = [name for name in scheduler_names() if name != "terra"]


def topo(links, cap=G):
    names = sorted({x for link in links for x in link})
    capacity = {}
    for a, b in links:
        capacity[(a, b)] = capacity[(b, a)] = cap
    return Topology("t", names, capacity)


LINE = [("A", "B"), ("B", "C")]


def by_id(result):
    return {c.id: c for c in result.coflows}


def test_two_flows_share_a_link_then_the_survivor_speeds_up():
    # 1e9 and 3e9 bytes on one 1e9 B/s link: 5e8 each until t = 2 (1e9 / 5e8), the big one
    # then has 3e9 - 1e9 = 2e9 left at full rate: finishes at 2 + 2 = 4.
    coflows = [
        Coflow("s", 0, [Flow("f", "A", "B", G)]),
        Coflow("b", 0, [Flow("f", "A", "B", 3 * G)]),
    ]
    r = simulate(PerFlowPolicy(topo([("A", "B")])), coflows)
    assert by_id(r)["s"].cct_s == pytest.approx(2.0)
    assert by_id(r)["b"].cct_s == pytest.approx(4.0)
    assert r.avg_cct_s == pytest.approx(3.0)
    assert r.bytes_delivered == pytest.approx(4 * G)
    assert r.unfinished == []


def test_late_arrival_and_wan_utilization():
    # c1: 2e9 bytes A->C over 2 hops, alone until c2 (1e9 bytes A->B) arrives at t = 1;
    # then A-B is shared: 5e8 each. c2 done at 1 + 2 = 3; c1 has 2e9 - 1e9 - 1e9 = 0 left at t=3
    # too. Byte-hops: 2e9 x 2 + 1e9 x 1 = 5e9; capacity: 4 links x 1e9 x 3 s = 1.2e10.
    coflows = [
        Coflow("c1", 0, [Flow("f", "A", "C", 2 * G)]),
        Coflow("c2", 1, [Flow("f", "A", "B", G)]),
    ]
    r = simulate(PerFlowPolicy(topo(LINE)), coflows)
    assert by_id(r)["c1"].finish_s == pytest.approx(3.0)
    assert by_id(r)["c2"].cct_s == pytest.approx(2.0)
    assert r.wan_utilization == pytest.approx(5 / 12)


def test_intra_dc_coflow_finishes_at_arrival_and_is_left_out_of_statistics():
    coflows = [
        Coflow("local", 5, [Flow("f", "A", "A", G)]),
        Coflow("wan", 0, [Flow("f", "A", "B", G), Flow("g", "B", "B", 9 * G)]),
    ]
    r = simulate(PerFlowPolicy(topo([("A", "B")])), coflows)
    local = by_id(r)["local"]
    assert (local.wan, local.finish_s, local.cct_s) == (False, 5, 0.0)
    # the WAN coflow's intra-DC flow is instant: CCT = 1e9 / 1e9 = 1 s
    assert by_id(r)["wan"].cct_s == pytest.approx(1.0)
    assert r.avg_cct_s == pytest.approx(1.0)  # "local" not averaged in
    assert r.intra_dc_coflows == 1 and r.to_json()["intra_dc_coflows"] == 1
    assert [c["wan"] for c in r.to_json()["coflows"]] == [False, True]


def test_link_failure_stalls_a_flow_whose_only_path_died():
    # 2e9 bytes A->C; B-C down during [1, 3): 1e9 done by t = 1, rate 0 until 3, the other
    # 1e9 by t = 4.
    changes = [WanChange(1.0, "B", "C", up=False), WanChange(3.0, "B", "C", up=True)]
    r = simulate(PerFlowPolicy(topo(LINE)), [Coflow("c", 0, [Flow("f", "A", "C", 2 * G)])], changes)
    assert by_id(r)["c"].finish_s == pytest.approx(4.0)
    assert r.bytes_delivered == pytest.approx(2 * G)


def test_capacity_change_mid_transfer():
    # 2e9 bytes A->B; capacity halves at t = 1: 1e9 left at 5e8 B/s -> done at 1 + 2 = 3
    changes = [WanChange(1.0, "A", "B", capacity=G / 2)]
    r = simulate(
        PerFlowPolicy(topo([("A", "B")])), [Coflow("c", 0, [Flow("f", "A", "B", 2 * G)])], changes
    )
    assert by_id(r)["c"].finish_s == pytest.approx(3.0)


def test_link_down_forever_reports_unfinished_instead_of_looping():
    changes = [WanChange(1.0, "B", "C", up=False)]
    r = simulate(PerFlowPolicy(topo(LINE)), [Coflow("c", 0, [Flow("f", "A", "C", 2 * G)])], changes)
    assert r.unfinished == ["c"]
    assert r.bytes_delivered == pytest.approx(G)  # 1 s at 1e9 B/s before the failure
    assert r.avg_cct_s is None


def test_terra_survives_a_link_failure_by_rerouting():
    # SWAN, 2e9 bytes LA->NY; LA-NY fails at t = 1. Terra uses every LA->NY path (K = 4),
    # so the coflow keeps moving over the others and finishes; no allocation may use LA-NY
    # while it is down (the simulator would raise SimulationError).
    swan = load_topology("swan")
    c = Coflow("c", 0, [Flow("f", "LA", "NY", 20 * 1.25e8)])
    changes = [WanChange(1.0, "LA", "NY", up=False)]
    r = simulate(TerraPolicy(swan), [c], changes)
    assert r.unfinished == []
    assert by_id(r)["c"].finish_s > 1.0
    assert r.bytes_delivered == pytest.approx(20 * 1.25e8)


class _Greedy:
    """A deliberately buggy policy: gives every flow twice the capacity of its path."""

    name = "greedy"

    def __init__(self, topology, factor=2.0, path=None):
        self.topology, self.factor, self.path, self.flows = topology, factor, path, {}

    def add_coflow(self, coflow, now):
        self.flows[coflow.id] = {f.id: f for f in coflow.flows}
        return True

    def add_flows(self, coflow_id, flows, now):
        pass

    def remove_coflow(self, coflow_id, now):
        self.flows.pop(coflow_id, None)

    def wan_changed(self, now):
        return True

    def allocate(self, now, remaining):
        return {
            cid: {
                fid: [
                    (
                        self.path or (self.flows[cid][fid].src, self.flows[cid][fid].dst),
                        self.factor * G,
                    )
                ]
                for fid in flows
            }
            for cid, flows in remaining.items()
        }


def test_overloaded_link_is_a_policy_bug():
    with pytest.raises(SimulationError, match="loaded"):
        simulate(_Greedy(topo([("A", "B")])), [Coflow("c", 0, [Flow("f", "A", "B", G)])])


def test_rate_on_a_down_link_is_a_policy_bug():
    changes = [WanChange(0.5, "A", "B", up=False)]
    with pytest.raises(SimulationError, match="available 0"):
        simulate(
            _Greedy(topo([("A", "B")]), factor=1.0),
            [Coflow("c", 0, [Flow("f", "A", "B", G)])],
            changes,
        )


def test_path_that_does_not_join_the_flow_is_a_policy_bug():
    policy = _Greedy(topo(LINE), factor=0.5, path=("B", "C"))
    with pytest.raises(SimulationError, match="does not join"):
        simulate(policy, [Coflow("c", 0, [Flow("f", "A", "C", G)])])


def test_rejected_coflow_is_recorded_and_not_run():
    # Terra admits c1 (Γ = 1e9 / 1e9 = 1 s, deadline 2 s) and rejects c2 (deadline 0.5 s < Γ)
    t = topo([("A", "B")])
    coflows = [
        Coflow("c1", 0, [Flow("f", "A", "B", G)], deadline_s=2.0),
        Coflow("c2", 0, [Flow("f", "A", "B", G)], deadline_s=0.5),
    ]
    r = simulate(TerraPolicy(t), coflows)
    res = by_id(r)
    assert res["c1"].admitted and res["c1"].met_deadline
    assert not res["c2"].admitted and res["c2"].met_deadline is False
    assert res["c2"].finish_s is None
    assert (r.admitted, r.deadlines_met) == (1, 1)
    assert r.bytes_total == pytest.approx(G)


def test_empty_wan_gamma_slowdown_and_deadline_factor():
    # alone, 2e9 bytes A->C take Γ = 2 s; two such coflows sharing the path (per-flow)
    # both finish at 4 s: slowdown 4 / 2 = 2 each.
    t = topo(LINE)
    coflows = [Coflow(c, 0, [Flow("f", "A", "C", 2 * G)]) for c in ("x", "y")]
    gammas = empty_wan_gammas(coflows, t, k=4)
    assert gammas == {"x": pytest.approx(2.0), "y": pytest.approx(2.0)}
    timed = with_deadline_factor(coflows, gammas, 3.0)  # deadline 3 x 2 = 6 s
    assert [c.deadline_s for c in timed] == [pytest.approx(6.0)] * 2
    r = simulate(PerFlowPolicy(t), timed, gammas=gammas)
    assert r.avg_slowdown == pytest.approx(2.0)
    assert r.deadlines_met == 2
    with pytest.raises(ValueError):
        with_deadline_factor(coflows, gammas, 0)


def test_terra_allocation_is_refreshed_on_every_event_and_counts_rounds():
    coflows = [Coflow("a", 0, [Flow("f", "A", "B", G)]), Coflow("b", 0.5, [Flow("f", "A", "B", G)])]
    r = simulate(TerraPolicy(topo([("A", "B")])), coflows)
    assert r.rounds >= 2 and len(r.round_ms) == r.rounds
    assert r.lps_per_round is not None
    assert r.bytes_delivered == pytest.approx(2 * G)


SWAN_DCS = ["HK", "LA", "NY", "FL", "BA"]


@st.composite
def workloads(draw):
    n = draw(st.integers(1, 6))
    coflows = []
    for i in range(n):
        flows = []
        for j in range(draw(st.integers(1, 4))):
            src, dst = draw(st.sampled_from(SWAN_DCS)), draw(st.sampled_from(SWAN_DCS))
            flows.append(Flow(f"f{j}", src, dst, draw(st.floats(1e6, 5e9))))
        deadline = draw(st.one_of(st.none(), st.floats(1.0, 200.0)))
        coflows.append(Coflow(f"c{i}", draw(st.floats(0, 20)), flows, deadline))
    return coflows


@pytest.mark.parametrize("name", ["terra", *sorted(BASELINES)])
@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(coflows=workloads(), fail=st.floats(0, 30))
def test_random_runs_finish_conserve_bytes_and_keep_capacity(name, coflows, fail):
    # any infeasible allocation raises SimulationError; every admitted coflow finishes,
    # and with Terra every admitted deadline coflow meets its deadline.
    swan = load_topology("swan")
    policy = TerraPolicy(swan) if name == "terra" else make_scheduler(name, swan)
    changes = [WanChange(fail, "LA", "NY", up=False), WanChange(fail + 10, "LA", "NY", up=True)]
    if name == "terra":
        changes = []  # a failure can legitimately break a deadline promise
    r = simulate(policy, coflows, changes)
    assert r.unfinished == []
    assert r.bytes_delivered == pytest.approx(r.bytes_total, rel=1e-6)
    assert r.bytes_total == pytest.approx(
        sum(c.wan_bytes for c, res in zip(coflows, r.coflows, strict=True) if res.admitted)
    )
    if name == "terra":
        for res in r.coflows:
            if res.admitted and res.deadline_s is not None and res.wan:
                assert res.met_deadline, res


class _Fixed(_Greedy):
    """A buggy policy returning one fixed allocation whatever is active."""

    def __init__(self, topology, alloc):
        super().__init__(topology)
        self.alloc = alloc

    def allocate(self, now, remaining):
        return self.alloc


@pytest.mark.parametrize(
    "alloc, message",
    [
        ({"c": {"f": [(("A", "B"), -1.0)]}}, "rate -1.0"),
        ({"c": {"f": [(("A", "B"), float("nan"))]}}, "rate nan"),
        ({"c": {"nope": [(("A", "B"), 1.0)]}}, "unknown or done flow"),
        ({"other": {"f": [(("A", "B"), 1.0)]}}, "not active"),
    ],
)
def test_malformed_allocations_are_policy_bugs(alloc, message):
    with pytest.raises(SimulationError, match=message):
        simulate(_Fixed(topo([("A", "B")]), alloc), [Coflow("c", 0, [Flow("f", "A", "B", G)])])


class _DictOnly:
    """Wraps a baseline but hides `pair_levels` and `coflow_rates`, so the simulator takes
    its per-flow dict path."""

    def __init__(self, policy):
        self._policy = policy

    def __getattr__(self, name):
        if name in ("pair_levels", "coflow_rates", "live_coflow_rates"):
            raise AttributeError(name)
        return getattr(self._policy, name)


@pytest.mark.parametrize("name", sorted(BASELINES))
@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(coflows=workloads(), fail=st.floats(0, 30))
def test_array_paths_match_the_per_flow_dict_path(name, coflows, fail):
    # the simulator's shortcuts (pair_levels: one call per event with members per DC pair;
    # coflow_rates: arrays per coflow) must give the CCTs the generic allocate() path
    # gives, failures included.
    changes = [WanChange(fail, "LA", "NY", up=False), WanChange(fail + 10, "LA", "NY", up=True)]
    fast = simulate(make_scheduler(name, load_topology("swan")), coflows, changes)
    slow = simulate(_DictOnly(make_scheduler(name, load_topology("swan"))), coflows, changes)
    assert [c.cct_s for c in fast.coflows] == pytest.approx([c.cct_s for c in slow.coflows])
    assert fast.wan_utilization == pytest.approx(slow.wan_utilization)
    assert fast.rounds == slow.rounds


class _BadPairs(PerFlowPolicy):
    """A buggy pair policy: gives every pair the paths `paths` at per-member rates `levels`."""

    def __init__(self, topology, paths, levels):
        super().__init__(topology)
        self.paths, self.levels = paths, levels

    pair_table = None  # not a PairTablePolicy: the simulator asks pair_levels

    def pair_levels(self, now, pairs, members):
        return PairLevels(self.paths, np.zeros(len(self.paths), dtype=int), np.array(self.levels))


@pytest.mark.parametrize(
    "paths, levels, message",
    [
        ([("A", "B")], [-1.0], "rate -1.0"),
        ([("A", "B")], [float("inf")], "rate inf"),
        ([("A", "B")], [1.0, 2.0], "rates for 1 paths"),
        ([("B", "C")], [1.0], "does not join"),
        ([("A", "D")], [1.0], "unknown link"),
        ([("A", "B")], [2 * G], "loaded"),
    ],
)
def test_malformed_pair_levels_are_policy_bugs(paths, levels, message):
    with pytest.raises(SimulationError, match=message):
        simulate(_BadPairs(topo(LINE), paths, levels), [Coflow("c", 0, [Flow("f", "A", "B", G)])])


class _BadTable(PerFlowPolicy):
    """A buggy pair-table policy: every pair gets the paths `paths`, their per-member rates
    are `levels`."""

    def __init__(self, topology, paths, levels):
        super().__init__(topology)
        self.paths, self.levels = paths, levels

    def pair_table(self, pairs):
        n = len(self.paths)
        ptr = np.arange(len(pairs) + 1) * n
        return PairTable(pairs, self.paths * len(pairs), ptr, np.zeros(1, dtype=int), np.zeros(0))

    def table_levels(self, now, table, active, members):
        return np.array(self.levels)


@pytest.mark.parametrize(
    "paths, levels, message",
    [
        ([("A", "B")], [-1.0], "rate -1.0"),
        ([("A", "B")], [float("nan")], "rate nan"),
        ([("A", "B")], [1.0, 2.0], "rates for 1 paths"),
        ([("B", "C")], [1.0], "does not join"),
        ([("A", "D")], [1.0], "unknown link"),
        ([("A", "B")], [2 * G], "loaded"),
    ],
)
def test_malformed_table_levels_are_policy_bugs(paths, levels, message):
    with pytest.raises(SimulationError, match=message):
        simulate(_BadTable(topo(LINE), paths, levels), [Coflow("c", 0, [Flow("f", "A", "B", G)])])


class _BadCoflows(VarysPolicy):
    """A buggy coflow-array policy: per-member rates `rates`, routes `routes` (None: its own)."""

    def __init__(self, topology, rates, routes=None):
        super().__init__(topology)
        self.rates, self.bad_routes = rates, routes

    def live_coflow_rates(self, now, cids, counts, local, remaining):
        _, routes = super().live_coflow_rates(now, cids, counts, local, remaining)
        return np.array(self.rates), [self.bad_routes or r for r in routes]


@pytest.mark.parametrize(
    "rates, routes, message",
    [
        ([-1.0], None, "rate -1.0"),
        ([float("nan")], None, "rate nan"),
        ([1.0, 1.0], None, "rates for 1 flows"),
        ([2 * G], None, "loaded"),
        ([1.0], [[(("B", "C"), 1)]], "does not join"),
        ([1.0], [[]], "unrouted"),
    ],
)
def test_malformed_coflow_rates_are_policy_bugs(rates, routes, message):
    with pytest.raises(SimulationError, match=message):
        simulate(_BadCoflows(topo(LINE), rates, routes), [Coflow("c", 0, [Flow("f", "A", "B", G)])])
