"""Invariants of the Terra scheduler on random small instances (hypothesis)."""

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from terra_core.min_cct import min_cct
from terra_core.residual_min_cct import min_cct_on_residual
from terra_core.round_memo import RoundMemo
from terra_core.scheduling_round import (
    DEADLINE,
    PREEMPTED,
    SCHEDULED,
    RoundResult,
    schedule_round,
)
from terra_core.terra_policy import TerraPolicy
from terra_model import Coflow, Flow
from terra_sim.simulator import WanChange, simulate
from topologies import Topology, all_pairs_paths, path_links

DCS = ["D0", "D1", "D2", "D3", "D4"]
ALL_LINKS = [(a, b) for i, a in enumerate(DCS) for b in DCS[i + 1 :]]


@st.composite
def wans(draw):
    """A random WAN on 3-5 DCs: a ring (so it is connected) plus random chords, some down."""
    n = draw(st.integers(3, 5))
    dcs = DCS[:n]
    undirected = {(dcs[i], dcs[(i + 1) % n]) for i in range(n)}
    undirected |= set(draw(st.lists(st.sampled_from([lk for lk in ALL_LINKS if lk[1] in dcs]))))
    cap = {}
    for a, b in sorted(undirected):
        c = draw(st.sampled_from([1.0, 5.0, 10.0, 40.0]))
        cap[(a, b)] = cap[(b, a)] = c
    topo = Topology("random", dcs, cap)
    for a, b in sorted(undirected):
        if draw(st.booleans()) and draw(st.booleans()):
            topo.set_link_state(a, b, False)
    return topo


@st.composite
def rounds(draw):
    topo = draw(wans())
    paths = {pair: ps for pair, ps in all_pairs_paths(topo, draw(st.integers(1, 4))).items() if ps}
    pairs = sorted(paths)
    coflows, deadlines = {}, {}
    for i in range(draw(st.integers(1, 6)) if pairs else 0):
        chosen = draw(st.lists(st.sampled_from(pairs), min_size=1, max_size=4, unique=True))
        coflows[f"c{i}"] = {p: draw(st.floats(1.0, 1e4)) for p in chosen}
        if draw(st.integers(0, 3)) == 0:
            deadlines[f"c{i}"] = draw(st.floats(0.5, 1e3))
    alpha = draw(st.sampled_from([0.0, 0.1, 0.3]))
    return topo, paths, coflows, deadlines, alpha


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rounds())
def test_round_invariants(case):
    topo, paths, coflows, deadlines, alpha = case
    capacity = {link: topo.available(link) for link in topo.links if link not in topo.down}
    res = schedule_round(coflows, paths, capacity, 0.0, deadlines, alpha)
    load = {}
    for cid, per_pair in res.rates.items():
        for pair, lst in per_pair.items():
            assert pair in coflows[cid]
            for path, rate in lst:
                assert rate > 0
                assert (path[0], path[-1]) == pair  # a path of the right DC pair
                for link in path_links(path):
                    assert link not in topo.down  # only links that are up
                    load[link] = load.get(link, 0.0) + rate
    for link, used in load.items():
        assert used <= topo.capacity[link] * (1 + 1e-6)  # no link over capacity
    assert set(res.state) == set(coflows)
    for cid, state in res.state.items():
        got = res.rates.get(cid, {})
        positive = all(sum(r for _, r in got.get(p, [])) > 0 for p in coflows[cid])
        if state == SCHEDULED:
            assert positive  # scheduled: every FlowGroup has a rate
        else:
            assert state in (PREEMPTED, DEADLINE)


@st.composite
def workloads(draw):
    topo = draw(wans())
    topo.down.clear()
    dcs = topo.dcs
    coflows = []
    for i in range(draw(st.integers(1, 5))):
        flows = []
        for j in range(draw(st.integers(1, 3))):
            src, dst = draw(st.sampled_from([(a, b) for a in dcs for b in dcs if a != b]))
            flows.append(Flow(f"f{j}", src, dst, draw(st.floats(1.0, 200.0))))
        deadline = draw(st.one_of(st.none(), st.floats(1.0, 200.0)))
        coflows.append(Coflow(f"c{i}", draw(st.floats(0.0, 20.0)), flows, deadline))
    changes = []
    links = sorted({tuple(sorted(lk)) for lk in topo.capacity})
    if draw(st.booleans()):
        a, b = draw(st.sampled_from(links))
        t = draw(st.floats(0.0, 30.0))
        changes.append(WanChange(t, a, b, capacity=topo.capacity[(a, b)] * 2))
    if draw(st.booleans()):
        # one link down (the ring keeps every pair connected), maybe back up later
        a, b = draw(st.sampled_from(links))
        t = draw(st.floats(0.0, 30.0))
        changes.append(WanChange(t, a, b, up=False))
        if draw(st.booleans()):
            changes.append(WanChange(t + draw(st.floats(0.1, 30.0)), a, b, up=True))
    return topo, coflows, sorted(changes, key=lambda ch: ch.time_s)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(workloads(), st.sampled_from([0.0, 0.1]))
def test_simulated_runs_finish_meet_admitted_deadlines_and_conserve_bytes(case, alpha):
    topo, coflows, changes = case
    policy = TerraPolicy(topo, alpha=alpha)
    res = simulate(policy, coflows, changes)  # checks capacity and byte conservation itself
    assert res.bytes_delivered == pytest.approx(res.bytes_total, rel=1e-6)
    for c in res.coflows:
        if c.admitted:
            assert c.finish_s is not None  # every admitted coflow finishes
            if c.deadline_s is not None and not any(ch.up is False for ch in changes):
                assert c.met_deadline  # admitted deadline coflows meet their deadline


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    rounds(),
    st.lists(st.floats(0.05, 1.0), min_size=4, max_size=4),
    st.booleans(),
    st.sampled_from([0.0, 1e-13, -1e-13]),
)
def test_memo_reuse_equals_a_fresh_min_cct(case, shrink, proportional, nudge):
    # residual_min_cct.min_cct_on_residual reuses an earlier solution when its bounds meet (and
    # the capacities are the same up to 1e-12 relative: `nudge` moves them by 1e-13);
    # whatever it returns must be the exact Γ and minimal allocation for the new volumes.
    topo, paths, coflows, _, _ = case
    capacity = {link: topo.available(link) for link in topo.links if link not in topo.down}
    nudged = {link: c * (1 + nudge) for link, c in capacity.items()}
    for cid, fgs in coflows.items():
        memo, stats = RoundMemo(), RoundResult()
        min_cct_on_residual(cid, fgs, paths, capacity, memo, stats)
        factors = [shrink[0]] * 4 if proportional else shrink
        later = {pair: v * factors[i] for i, (pair, v) in enumerate(fgs.items())}
        got = min_cct_on_residual(cid, later, paths, nudged, memo, stats)
        want = min_cct(later, paths, nudged)
        assert got.gamma_s == pytest.approx(want.gamma_s, rel=1e-6)
        for pair, d in later.items():
            if got.rates:
                assert sum(r for _, r in got.rates[pair]) == pytest.approx(d / want.gamma_s)
        if proportional:
            assert stats.lps <= 1  # proportional shrink: always reused, no second LP


@pytest.mark.parametrize(("moved", "kept"), [(0.0, True), (1e-13, True), (1e-9, False)])
def test_memo_takes_capacities_as_unchanged_only_up_to_round_off(moved, kept):
    # One FlowGroup of 10 bytes on a 10 B/s link: Γ = 1 s. The next round has the same
    # volume and the link shrunk by `moved` (relative): up to 1e-12 the kept allocation is
    # reused (its excess is round-off); at 1e-9 it is infeasible by more, so the LP runs
    # again and Γ = 1/(1 - 1e-9) s.
    paths = {("A", "B"): [("A", "B")]}
    memo, stats = RoundMemo(), RoundResult()
    min_cct_on_residual("c", {("A", "B"): 10.0}, paths, {("A", "B"): 10.0}, memo, stats)
    entry = memo.residual["c"]
    got = min_cct_on_residual(
        "c", {("A", "B"): 10.0}, paths, {("A", "B"): 10.0 * (1 - moved)}, memo, stats
    )
    assert (memo.residual["c"] is entry) == kept
    assert got.gamma_s == pytest.approx(1.0 / (1 - moved), rel=1e-15 if not kept else 1e-12)
