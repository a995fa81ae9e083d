"""Sparse incidence in the baselines and the simulator against dense references.

The per-flow / multipath water-filling (`FixedRouteFairPolicy.pair_levels`), Varys' and Rapier's
MADD plus backfill (`MaddPolicy.coflow_rates`) and the simulator's fast paths now keep
links x paths and links x flows incidences as their nonzero entries. The references below
are the dense computations they replaced (a links x paths matrix, `maxmin.maxmin_levels`,
`matrix @ vector`), run on the same random small instances; capacities are in bytes/s.
"""

import random

import networkx as nx
import numpy as np
import pytest

from terra_core.flow_bundles import FlowBundle
from terra_core.maxmin import maxmin_levels
from terra_core.multipath import MultipathPolicy
from terra_core.per_flow import PerFlowPolicy
from terra_core.rapier import RapierPolicy
from terra_core.sparse_index import path_entries, path_incidence
from terra_core.varys import VarysPolicy
from terra_model import Coflow
from terra_sim.simulator import simulate
from topologies import Topology, all_pairs_paths, k_shortest_paths
from topologies.bigswitch import bigswitch_topology
from topologies.paths import up_graph


def _gamma(volume: np.ndarray, capacity: np.ndarray) -> float:
    """The per-coflow reference code's Γ: max over links of volume / capacity (seconds);
    inf if a used link has no capacity."""
    used = volume > 0
    if not used.any():
        return 0.0
    if (capacity[used] <= 0).any():
        return np.inf
    return float(np.max(volume[used] / capacity[used]))


def random_wan(rng: random.Random, n: int, extra: int) -> Topology:
    """A connected WAN of n DCs: a random tree plus `extra` chords, both directions,
    capacities 1-5 x 1e9 B/s (whole numbers, so sums stay exact)."""
    names = [f"D{i}" for i in range(n)]
    capacity = {}
    edges = {(names[i], names[rng.randrange(i)]) for i in range(1, n)}
    while len(edges) < n - 1 + extra:
        a, b = rng.sample(names, 2)
        if (b, a) not in edges:
            edges.add((a, b))
    for a, b in edges:
        capacity[(a, b)] = capacity[(b, a)] = rng.randint(1, 5) * 1e9
    return Topology("random", names, capacity)


def random_coflows(rng: random.Random, topology: Topology, count: int) -> list[Coflow]:
    """`count` coflows of 1-6 bundles (1-3 members, 1-40 MB each) between random DCs."""
    dcs = topology.dcs
    coflows = []
    for c in range(count):
        flows = []
        for f in range(rng.randint(1, 6)):
            src, dst = rng.sample(dcs, 2)
            members = rng.randint(1, 3)
            size = rng.randint(1, 40) * 1e6
            flows.append(FlowBundle(f"f{f}", src, dst, members * size, members))
        coflows.append(Coflow(f"c{c}", 0.0, flows))
    return coflows


# ---- paths -----------------------------------------------------------------------------


def yen_reference(topology: Topology, src: str, dst: str, k: int) -> list[tuple]:
    """The K shortest paths as before (dense): Yen for the K-th hop count, then a second
    pass over every simple path of at most that many hops, ranked by (hops, names)."""
    graph = up_graph(topology)
    found = []
    try:
        for p in nx.shortest_simple_paths(graph, src, dst):
            found.append(tuple(p))
            if len(found) == k:
                break
    except nx.NetworkXNoPath:
        return []
    if len(found) < k:
        return sorted(found, key=lambda p: (len(p), p))
    bound = len(found[-1])
    every = []
    for p in nx.shortest_simple_paths(graph, src, dst):
        if len(p) > bound:
            break
        every.append(tuple(p))
    return sorted(every, key=lambda p: (len(p), p))[:k]


@pytest.mark.parametrize("seed", range(6))
def test_k_shortest_paths_match_yen_on_random_wans(seed):
    rng = random.Random(seed)
    topology = random_wan(rng, rng.randint(4, 9), rng.randint(0, 6))
    a, b = rng.choice(topology.links)
    topology.set_link_state(a, b, False)  # one link down: some pairs lose paths
    for k in (1, 2, 4):
        for s in topology.dcs:
            for d in topology.dcs:
                if s != d:
                    assert k_shortest_paths(topology, s, d, k) == yen_reference(topology, s, d, k)


def test_forced_paths_on_bigswitch_match_yen():
    # rack -> core -> rack is the only path between two racks; core <-> rack is one link
    fabric = bigswitch_topology(racks=5)
    fabric.set_link_state("3", "core", False)  # rack 3 cut off: no path to or from it
    paths = all_pairs_paths(fabric, 4)
    for (s, d), found in paths.items():
        assert found == yen_reference(fabric, s, d, 4)
    assert paths[("0", "1")] == [("0", "core", "1")]
    assert paths[("core", "2")] == [("core", "2")]
    assert paths[("0", "3")] == []


# ---- incidence entries -------------------------------------------------------------------


def test_path_entries_are_the_nonzeros_of_path_incidence():
    rng = random.Random(7)
    topology = random_wan(rng, 7, 4)
    paths = all_pairs_paths(topology, 3)
    rows = {link: i for i, link in enumerate(topology.links)}
    pairs = [pair for pair, ps in paths.items() if ps]
    entities = []
    for _ in range(30):
        pair = rng.choice(pairs)
        entities.append([(p, rng.randint(0, 3)) for p in paths[pair]])
    dense = path_incidence(entities, rows)
    r, c, v = path_entries(entities, rows)
    rebuilt = np.zeros_like(dense)
    np.add.at(rebuilt, (r, c), v)
    assert (v > 0).all()
    assert np.array_equal(rebuilt, dense)


# ---- per-flow and multipath ----------------------------------------------------------------


def dense_pair_levels(policy, pairs, members):
    """Levels as before (dense): the 0/1 links x paths matrix of the pairs' paths times
    their pairs' member counts, water-filled by the dense maxmin_levels."""
    paths, pair = [], []
    for i, p in enumerate(pairs):
        for path in policy._pair_paths(p):
            paths.append(path)
            pair.append(i)
    crossing = path_incidence([[(p, 1.0)] for p in paths], policy._rows)
    pair = np.array(pair, dtype=np.intp)
    return paths, pair, maxmin_levels(crossing * members[pair], policy._capacity(), integer=True)


@pytest.mark.parametrize("cls", [PerFlowPolicy, MultipathPolicy])
@pytest.mark.parametrize("seed", range(8))
def test_pair_levels_match_the_dense_water_filling(cls, seed):
    rng = random.Random(seed)
    topology = random_wan(rng, rng.randint(4, 10), rng.randint(1, 8))
    policy = cls(topology, k=3)
    every = [pair for pair, ps in policy._paths.items() if ps]
    for _ in range(4):  # several sets of pairs on one policy: the per-pair numbering is shared
        pairs = tuple(rng.sample(every, rng.randint(1, len(every))))
        members = np.array([rng.randint(1, 9) for _ in pairs], dtype=float)
        got = policy.pair_levels(0.0, pairs, members)
        paths, pair, level = dense_pair_levels(policy, pairs, members)
        assert got.paths == paths
        assert np.array_equal(got.pair, pair)
        np.testing.assert_allclose(got.level, level, rtol=1e-12, atol=0)
        assert policy.pair_levels(0.0, pairs, members).paths is got.paths  # cached list


def test_per_flow_levels_on_a_small_fabric_by_hand():
    # Three racks, every port 6 B/s but rack 1's downlink 3 B/s; per-flow members:
    # 0->1: 2, 0->2: 1, 2->1: 1. Water-filling: downlink 1 carries 3 members, 3 / 3 = 1
    # per member, the first to fill (uplink 0: 6 / 3 = 2); 0->1 and 2->1 stop at 1. Uplink
    # 0 then has 6 - 3 x 1 = 3 left for 0->2's one member: 1 + 3 = 4 (downlink 2 would
    # allow 1 + 5). Levels 1, 4, 1.
    fabric = bigswitch_topology(racks=3, port_bytes_per_s=6.0)
    fabric.set_capacity("core", "1", 3.0, both=False)
    policy = PerFlowPolicy(fabric)
    pairs = (("0", "1"), ("0", "2"), ("2", "1"))
    got = policy.pair_levels(0.0, pairs, np.array([2.0, 1.0, 1.0]))
    assert got.paths == [("0", "core", "1"), ("0", "core", "2"), ("2", "core", "1")]
    assert got.level.tolist() == pytest.approx([1.0, 4.0, 1.0], rel=1e-12)


# ---- varys and rapier ------------------------------------------------------------------


def dense_coflow_rates(policy, remaining):
    """`MaddPolicy.coflow_rates` as before (dense): each coflow's dense links x flows
    matrix, `matrix @ per_member` volumes, and one dense max-min backfill over all
    coflows' alive routed columns side by side."""
    capacity = policy._capacity()
    coflows, columns = [], []
    for cid, rem in remaining.items():
        info = policy._coflow_incidence(cid)
        matrix = np.zeros((len(capacity), len(info.fids)))
        np.add.at(matrix, (info.rows, info.cols), info.vals)
        alive = rem > 0
        per_member = rem / info.members
        volume = matrix @ per_member
        gamma = np.inf if (alive & ~info.routed).any() else _gamma(volume, capacity)
        coflows.append((gamma, len(coflows), cid, volume, per_member, info, alive))
        columns.append(matrix[:, alive & info.routed])
    madd = {cid: np.zeros(len(info.fids)) for _, _, cid, _, _, info, _ in coflows}
    left = capacity.copy()
    for gamma, _, cid, volume, per_member, _, _ in sorted(coflows, key=lambda c: c[:2]):
        g = _gamma(volume, left)
        if gamma == np.inf or g == np.inf or not volume.any():
            continue
        madd[cid] = per_member / g
        left = np.maximum(left - volume / g, 0.0)
    levels = maxmin_levels(np.hstack(columns), left, integer=True)
    backfill = np.split(levels, np.cumsum([c.shape[1] for c in columns])[:-1])
    out = {}
    for (_, _, cid, _, _, info, alive), extra in zip(coflows, backfill, strict=True):
        rate = madd[cid] * info.routed
        rate[alive & info.routed] += extra
        rate[~alive] = 0.0
        out[cid] = rate
    return out


@pytest.mark.parametrize("cls", [VarysPolicy, RapierPolicy])
@pytest.mark.parametrize("seed", range(8))
def test_coflow_rates_match_the_dense_madd_and_backfill(cls, seed):
    rng = random.Random(100 + seed)
    topology = random_wan(rng, rng.randint(4, 9), rng.randint(1, 6))
    policy = cls(topology, k=3)
    coflows = random_coflows(rng, topology, rng.randint(1, 6))
    for c in coflows:
        policy.add_coflow(c, 0.0)
    for _ in range(3):  # some flows done (0 bytes left), the rest at random amounts
        remaining = {
            c.id: np.array(
                [0.0 if rng.random() < 0.25 else rng.uniform(0.1, 1.0) * f.bytes for f in c.flows]
            )
            for c in coflows
        }
        got = policy.coflow_rates(0.0, remaining)
        want = dense_coflow_rates(policy, remaining)
        assert got.keys() == want.keys()
        for cid, (rate, routes) in got.items():
            np.testing.assert_allclose(rate, want[cid], rtol=1e-9, atol=1e-6)
            assert routes is policy._coflow_incidence(cid).routes


# ---- the simulator's fast paths against its generic path ----------------------------------


class _AllocateOnly:
    """A policy seen only through the Policy interface: the simulator then uses `allocate`
    and its dict checks, not the sparse fast paths (pair_levels / coflow_rates)."""

    def __init__(self, policy):
        self._p = policy
        self.name = policy.name
        self.topology = policy.topology

    def add_coflow(self, coflow, now):
        return self._p.add_coflow(coflow, now)

    def add_flows(self, coflow_id, flows, now):
        self._p.add_flows(coflow_id, flows, now)

    def remove_coflow(self, coflow_id, now):
        self._p.remove_coflow(coflow_id, now)

    def wan_changed(self, now):
        return self._p.wan_changed(now)

    def allocate(self, now, remaining):
        return self._p.allocate(now, remaining)


@pytest.mark.parametrize("cls", [PerFlowPolicy, MultipathPolicy, VarysPolicy, RapierPolicy])
@pytest.mark.parametrize("seed", range(3))
def test_fast_paths_give_the_generic_paths_ccts_and_utilization(cls, seed):
    rng = random.Random(200 + seed)
    topology = random_wan(rng, 6, 4)
    coflows = [
        Coflow(c.id, rng.uniform(0, 0.05), c.flows) for c in random_coflows(rng, topology, 8)
    ]
    fast = simulate(cls(topology.copy(), k=2), coflows)
    generic = simulate(_AllocateOnly(cls(topology.copy(), k=2)), coflows)
    for x, y in zip(fast.coflows, generic.coflows, strict=True):
        assert x.cct_s == pytest.approx(y.cct_s, rel=1e-9)
    assert fast.wan_utilization == pytest.approx(generic.wan_utilization, rel=1e-9)
