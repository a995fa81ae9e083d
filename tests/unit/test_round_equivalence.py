"""The faster round gives the rates of the reference round (tests/reference_round.py).

terra_core/scheduling_round.py keeps the set of full links incrementally and
water-fills each priority class on the links it crosses only (docs/design.md 4.2
steps 4-6); tests/reference_round.py is the round as it was before (e29c38f). On
seeded random WANs and coflow sets both must give the same states, order, LP count
and per-(coflow, pair, path) rates within 1e-9 relative (of the largest capacity).
"""

import random

import networkx as nx
import pytest
import reference_round

from terra_core import round_fair_share, scheduling_round
from terra_core.round_memo import RoundMemo
from topologies import Topology, all_pairs_paths

REL = 1e-9


def random_instance(seed: int, dcs: int, n: int):
    """A connected random WAN (tree + extra links, capacities 1..10 units of 1e8 B/s),
    K = 1..4 paths per pair, `n` coflows of 1-6 FlowGroups with 1e6..1e10 bytes."""
    rng = random.Random(seed)
    names = [f"D{i}" for i in range(dcs)]
    graph = nx.random_labeled_tree(dcs, seed=seed) if dcs > 2 else nx.path_graph(dcs)
    for _ in range(dcs):
        u, v = rng.sample(range(dcs), 2)
        graph.add_edge(u, v)
    capacity = {}
    for u, v in graph.edges():
        capacity[(names[u], names[v])] = rng.randint(1, 10) * 1e8
        capacity[(names[v], names[u])] = rng.randint(1, 10) * 1e8
    topo = Topology("rand", names, capacity)
    paths = all_pairs_paths(topo, rng.randint(1, 4))
    coflows = {}
    for c in range(n):
        fgs = {}
        for _ in range(rng.randint(1, 6)):
            pair = tuple(rng.sample(names, 2))
            fgs[pair] = 10 ** rng.uniform(6, 10)
        coflows[f"c{c}"] = fgs
    return coflows, paths, capacity, rng


def assert_same(new, old, scale):
    assert new.state == old.state
    assert new.order == old.order
    assert new.lps == old.lps
    assert new.gammas == pytest.approx(old.gammas, rel=REL)
    assert new.rates.keys() == old.rates.keys()
    for cid, pairs in old.rates.items():
        assert new.rates[cid].keys() == pairs.keys(), cid
        for pair, lst in pairs.items():
            got = dict(new.rates[cid][pair])
            want = dict(lst)
            assert got.keys() == want.keys(), (cid, pair)
            for path, x in want.items():
                assert got[path] == pytest.approx(x, rel=REL, abs=REL * scale), (cid, pair, path)


@pytest.mark.parametrize("force_waterfill", [True, False])
@pytest.mark.parametrize("seed", range(12))
def test_same_rates_as_reference(seed, force_waterfill, monkeypatch):
    # force_waterfill: steps 5-6 always on the water-filling (the branch the rewrite
    # changed); otherwise the MCF runs where it has at most MCF_MAX_COLUMNS columns.
    if force_waterfill:
        monkeypatch.setattr(round_fair_share, "MCF_MAX_COLUMNS", 0)
        monkeypatch.setattr(reference_round, "MCF_MAX_COLUMNS", 0)
    dcs = 4 + seed % 9
    coflows, paths, capacity, rng = random_instance(seed, dcs, 5 + 4 * seed)
    alpha = rng.choice([0.0, 0.1, 0.3])
    ids = list(coflows)
    deadlines = {cid: rng.uniform(1.0, 100.0) for cid in rng.sample(ids, min(2, seed % 3))}
    memo_new, memo_old = RoundMemo(), {}
    scale = max(capacity.values())
    for step in range(3):  # later rounds: shrunken volumes, so the memo is exercised
        new = scheduling_round.schedule_round(
            coflows, paths, capacity, 0.0, deadlines, alpha, memo=memo_new
        )
        old = reference_round.schedule_round(
            coflows, paths, capacity, 0.0, deadlines, alpha, memo=memo_old
        )
        assert_same(new, old, scale)
        if step == 0:
            assert any(new.rates.values())  # the instance is not trivial
        coflows = {
            cid: {pair: v * rng.choice([1.0, 0.5, 0.9]) for pair, v in fgs.items()}
            for cid, fgs in coflows.items()
        }


def test_a_full_link_blocks_later_classes():
    # Chain A-B-C, 10 B/s each. Step 6 classes in order: c1 on A->C (path A,B,C) fills both
    # links at 10 B/s (α = 0, nothing preempted); c2 on A->B then finds A->B full and gets
    # nothing: the incremental full set must carry c1's saturation over to c2's class.
    cap = {("A", "B"): 10.0, ("B", "C"): 10.0}
    paths = {("A", "C"): [("A", "B", "C")], ("A", "B"): [("A", "B")]}
    coflows = {"c1": {("A", "C"): 10.0}, "c2": {("A", "B"): 1000.0}}
    old_max = round_fair_share.MCF_MAX_COLUMNS
    try:
        round_fair_share.MCF_MAX_COLUMNS = 0
        res = scheduling_round.schedule_round(coflows, paths, cap, alpha=0.0)
    finally:
        round_fair_share.MCF_MAX_COLUMNS = old_max
    assert res.order == ["c1", "c2"]  # Γ: 10/10 = 1 s before 1000/10 = 100 s
    assert res.rates["c1"][("A", "C")] == [(("A", "B", "C"), pytest.approx(10.0))]
    assert "c2" not in res.rates
