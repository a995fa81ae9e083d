"""The five baselines (terra_core/per_flow.py, multipath.py, swan_mcf.py, varys.py, rapier.py)
on hand-computed cases.

Capacities are in bytes/s; 1e9 B/s keeps the arithmetic simple.
"""

import numpy as np
import pytest

from terra_core.multipath import MultipathPolicy
from terra_core.per_flow import PerFlowPolicy
from terra_core.rapier import RapierPolicy
from terra_core.registry import SchedulerOptions, make_scheduler, scheduler_names
from terra_core.swan_mcf import SwanMcfPolicy
from terra_core.varys import VarysPolicy
from terra_model import Coflow, Flow
from terra_sim.simulator import simulate
from topologies import Topology, load_topology
from workloads import load_workload

G = 1e9
BASELINES = [name for name in scheduler_names() if name != "terra"]


def topo(links, cap=G, dcs=None):
    """Undirected links [(a, b)] -> Topology with both directions at `cap`."""
    names = dcs or sorted({x for link in links for x in link})
    capacity = {}
    for a, b in links:
        capacity[(a, b)] = capacity[(b, a)] = cap
    return Topology("t", names, capacity)


SQUARE = [("A", "B"), ("B", "D"), ("A", "C"), ("C", "D")]  # two disjoint 2-hop paths A->D


def total_rate(entries):
    return sum(r for _, r in entries)


def cct(result, cid):
    return next(c.cct_s for c in result.coflows if c.id == cid)


def test_per_flow_two_flows_on_one_link_get_half_each():
    p = PerFlowPolicy(topo([("A", "B")]))
    p.add_coflow(Coflow("c1", 0, [Flow("f", "A", "B", G)]), 0)
    p.add_coflow(Coflow("c2", 0, [Flow("f", "A", "B", G)]), 0)
    alloc = p.allocate(0, {"c1": {"f": G}, "c2": {"f": G}})
    # 1e9 B/s shared by two flows: 5e8 each, on the only path
    assert alloc["c1"]["f"] == [(("A", "B"), pytest.approx(G / 2))]
    assert alloc["c2"]["f"] == [(("A", "B"), pytest.approx(G / 2))]


def test_per_flow_uses_one_shortest_path_only():
    p = PerFlowPolicy(topo(SQUARE), k=2)
    p.add_coflow(Coflow("c", 0, [Flow("f1", "A", "D", G), Flow("f2", "A", "D", G)]), 0)
    alloc = p.allocate(0, {"c": {"f1": G, "f2": G}})
    # both on A-B-D (first by name among the two 2-hop paths): 1e9 / 2 each
    assert alloc["c"]["f1"] == [(("A", "B", "D"), pytest.approx(G / 2))]


def test_multipath_splits_every_flow_equally_over_its_paths():
    p = MultipathPolicy(topo(SQUARE), k=2)
    p.add_coflow(Coflow("c", 0, [Flow("f1", "A", "D", G), Flow("f2", "A", "D", G)]), 0)
    alloc = p.allocate(0, {"c": {"f1": G, "f2": G}})
    # each path carries one subflow of each flow: 1e9 / 2 per subflow, 1e9 per flow
    for fid in ("f1", "f2"):
        assert dict(alloc["c"][fid]) == {
            ("A", "B", "D"): pytest.approx(G / 2),
            ("A", "C", "D"): pytest.approx(G / 2),
        }


def test_swan_mcf_fills_both_paths_for_one_pair_and_shares_by_flow():
    p = SwanMcfPolicy(topo(SQUARE), k=2)
    p.add_coflow(Coflow("c1", 0, [Flow("f", "A", "D", G)]), 0)
    p.add_coflow(Coflow("c2", 0, [Flow("f", "A", "D", 3 * G)]), 0)
    alloc = p.allocate(0, {"c1": {"f": G}, "c2": {"f": 3 * G}})
    # the A->D demand gets both disjoint paths (2e9 B/s), split 1:1 by flow regardless of size
    assert total_rate(alloc["c1"]["f"]) == pytest.approx(G, rel=1e-6)
    assert total_rate(alloc["c2"]["f"]) == pytest.approx(G, rel=1e-6)


def test_swan_mcf_solves_a_set_of_pairs_once_whatever_their_order(monkeypatch):
    # SQUARE, k = 2: A->D on A-B-D or A-C-D, A->B on A-B or A-C-D-B. Max-min: A->D takes
    # A-C-D (G) and A->B takes A-B (G); either going beyond would take the other's only
    # free path: G each, per member G / 2 for A->D's two members, G for A->B's one.
    import terra_core.swan_mcf as swan_mcf

    solves = []
    real = swan_mcf.maxmin_mcf
    monkeypatch.setattr(swan_mcf, "maxmin_mcf", lambda *a, **k: solves.append(1) or real(*a, **k))
    p = SwanMcfPolicy(topo(SQUARE), k=2)
    ad, ab = ("A", "D"), ("A", "B")
    first = p.pair_levels(0.0, (ad, ab), np.array([2.0, 1.0]))
    again = p.pair_levels(0.0, (ab, ad), np.array([1.0, 2.0]))  # same set, other order
    assert len(solves) == 1
    members = {ad: 2, ab: 1}
    for got, pairs in ((first, (ad, ab)), (again, (ab, ad))):
        total = {ad: 0.0, ab: 0.0}
        for path, i, level in zip(got.paths, got.pair, got.level, strict=True):
            assert (path[0], path[-1]) == pairs[i]
            total[pairs[i]] += level * members[pairs[i]]
        assert total == pytest.approx({ad: G, ab: G}, rel=1e-9)


def test_varys_madd_makes_a_coflows_flows_finish_together():
    p = VarysPolicy(topo([("A", "B")]))
    p.add_coflow(Coflow("c", 0, [Flow("f1", "A", "B", G), Flow("f2", "A", "B", 3 * G)]), 0)
    alloc = p.allocate(0, {"c": {"f1": G, "f2": 3 * G}})
    # Γ = 4e9 B / 1e9 B/s = 4 s; MADD: f1 at 1e9/4 = 2.5e8, f2 at 3e9/4 = 7.5e8 (no leftover)
    assert total_rate(alloc["c"]["f1"]) == pytest.approx(G / 4)
    assert total_rate(alloc["c"]["f2"]) == pytest.approx(3 * G / 4)


def test_varys_finishes_the_smaller_coflow_first():
    t = topo([("A", "B")])
    coflows = [
        Coflow("big", 0, [Flow("f", "A", "B", 3 * G)]),
        Coflow("small", 0, [Flow("f", "A", "B", G)]),
    ]
    # SEBF: small alone at 1e9 B/s finishes at 1 s, then big at 1 + 3 = 4 s: average 2.5 s.
    r = simulate(VarysPolicy(t), coflows)
    assert cct(r, "small") == pytest.approx(1.0)
    assert cct(r, "big") == pytest.approx(4.0)
    # per-flow shares: small finishes at 2 s (5e8 B/s), big at 4 s: average 3 s.
    r = simulate(PerFlowPolicy(topo([("A", "B")])), coflows)
    assert cct(r, "small") == pytest.approx(2.0)
    assert r.avg_cct_s == pytest.approx(3.0)


def test_varys_backfills_leftover_capacity():
    p = VarysPolicy(topo([("A", "B"), ("B", "C")]))
    p.add_coflow(Coflow("c", 0, [Flow("f1", "A", "B", G), Flow("f2", "B", "C", 2 * G)]), 0)
    alloc = p.allocate(0, {"c": {"f1": G, "f2": 2 * G}})
    # Γ = 2 s (B-C); MADD f1 = 5e8, f2 = 1e9; backfill gives f1 the other 5e8 of A-B
    assert total_rate(alloc["c"]["f1"]) == pytest.approx(G)
    assert total_rate(alloc["c"]["f2"]) == pytest.approx(G)


def test_rapier_routes_a_coflows_flows_over_different_paths():
    p = RapierPolicy(topo(SQUARE), k=2)
    p.add_coflow(Coflow("c", 0, [Flow("f1", "A", "D", G), Flow("f2", "A", "D", G)]), 0)
    alloc = p.allocate(0, {"c": {"f1": G, "f2": G}})
    # greedy: f1 on A-B-D, then A-C-D lowers the bottleneck for f2; Γ = 1 s, 1e9 B/s each
    paths = {alloc["c"][f][0][0] for f in ("f1", "f2")}
    assert paths == {("A", "B", "D"), ("A", "C", "D")}
    assert total_rate(alloc["c"]["f1"]) == pytest.approx(G)
    # per-flow would put both on A-B-D at 5e8 each: rapier's CCT is half of it
    r = simulate(RapierPolicy(topo(SQUARE), k=2), [Coflow("c", 0, p.flows["c"].values())])
    assert cct(r, "c") == pytest.approx(1.0)


def test_per_flow_reroutes_and_a_flow_without_path_gets_zero():
    t = topo([("A", "B"), ("B", "C")])
    p = PerFlowPolicy(t)
    p.add_coflow(Coflow("c", 0, [Flow("f", "A", "C", G)]), 0)
    t.set_link_state("B", "C", up=False)
    assert p.wan_changed(1.0)
    assert total_rate(p.allocate(1.0, {"c": {"f": G}})["c"]["f"]) == 0
    t.set_link_state("B", "C", up=True)
    p.wan_changed(2.0)
    assert total_rate(p.allocate(2.0, {"c": {"f": G}})["c"]["f"]) == pytest.approx(G)


@pytest.mark.parametrize("name", sorted(BASELINES))
def test_bad_coflows_are_refused(name):
    t = topo([("A", "B")], dcs=["A", "B", "Z"])
    p = make_scheduler(name, t)
    with pytest.raises(ValueError, match="no path"):
        p.add_coflow(Coflow("c", 0, [Flow("f", "A", "Z", G)]), 0)
    assert p.add_coflow(Coflow("c", 0, [Flow("f", "A", "B", G)]), 0) is True
    with pytest.raises(ValueError, match="duplicate"):
        p.add_coflow(Coflow("c", 0, [Flow("f", "A", "B", G)]), 0)
    with pytest.raises(ValueError):
        make_scheduler(name, t, SchedulerOptions(k=0))


@pytest.mark.parametrize("name", ["per-flow", "multipath", "swan-mcf", "varys"])
def test_bundling_identical_flows_changes_no_cct(name):
    # bundling is exact for these policies: the same CCTs with and without it
    swan = load_topology("swan")
    # the first 40 FB coflows minus the 5 with thousands of flows (too slow unbundled)
    coflows = [c for c in load_workload("fb", swan, limit=40) if len(c.flows) < 200]
    a = simulate(make_scheduler(name, swan.copy()), coflows, bundle=True)
    b = simulate(make_scheduler(name, swan.copy()), coflows, bundle=False)
    for x, y in zip(a.coflows, b.coflows, strict=True):
        assert x.cct_s == pytest.approx(y.cct_s, rel=1e-6)


def test_varys_backfill_is_not_a_flowgroup_rate_split_by_remaining_bytes():
    """Why the simulator keeps a per-flow fast path for Varys (docs/architecture.md): MADD's
    backfill gives each member of a route the same extra rate, so the flows of one
    FlowGroup do not share its rate in proportion to their remaining bytes."""
    p = VarysPolicy(topo([("A", "B"), ("B", "C")]))
    flows = [Flow("f1", "A", "B", G), Flow("f2", "A", "B", 3 * G), Flow("f3", "B", "C", 8 * G)]
    p.add_coflow(Coflow("c", 0, flows), 0)
    alloc = p.allocate(0, {"c": {"f1": G, "f2": 3 * G, "f3": 8 * G}})
    # Γ = 8 s (B-C); MADD: f1 G/8, f2 3G/8 (A-B half used), f3 G; backfill: the other G/2
    # of A-B, G/4 to each of f1 and f2. Split by remaining bytes it would be G/4 and 3G/4.
    f1, f2 = total_rate(alloc["c"]["f1"]), total_rate(alloc["c"]["f2"])
    assert (f1, f2) == (pytest.approx(3 * G / 8), pytest.approx(5 * G / 8))
    assert f1 + f2 == pytest.approx(G) and f2 / f1 == pytest.approx(5 / 3)
