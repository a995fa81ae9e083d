"""On bigswitch: the fast paths added for it against the
straightforward computations they replace, on random small instances.

- `maxmin.maxmin_levels_entries` (dense below DENSE_CELLS, sparse above) against
  `maxmin_levels` on the dense matrix;
- `FixedRouteFairPolicy.pair_table` / `table_levels` (pairs by index) against `pair_levels`;
- `MaddPolicy._backfill` (one water-filling entity per route shape) against one entity
  per flow (`maxmin_levels_sparse` on the flows' own entries);
- the simulator's pair-table path against its `pair_levels` path.
Capacities are in bytes/s.
"""

from __future__ import annotations

import random

import numpy as np
import pytest
from test_sparse_baselines import random_coflows, random_wan

from terra_core import maxmin
from terra_core.maxmin import maxmin_levels, maxmin_levels_entries, maxmin_levels_sparse
from terra_core.multipath import MultipathPolicy
from terra_core.per_flow import PerFlowPolicy
from terra_core.rapier import RapierPolicy
from terra_core.varys import VarysPolicy
from terra_model import Coflow
from terra_sim.simulator import simulate
from topologies.bigswitch import bigswitch_topology


def random_entries(rng: np.random.Generator, n_links: int, n: int, whole: bool):
    """Entries of a random links x entities incidence: 1-3 links per entity, values
    1-4 (whole) or 0.01-100; capacities 1-10, one in ten links down (0)."""
    hops = rng.integers(1, 4, n)
    cols = np.repeat(np.arange(n), hops)
    rows = rng.integers(0, n_links, len(cols))
    if whole:
        vals = rng.integers(1, 5, len(cols)).astype(float)
    else:
        vals = rng.uniform(0.01, 100.0, len(cols))
    capacity = rng.uniform(1.0, 10.0, n_links)
    capacity[rng.random(n_links) < 0.1] = 0.0
    return rows, cols, vals, capacity


@pytest.mark.parametrize("seed", range(20))
def test_entries_dense_and_sparse_sides_match_the_dense_filling(seed, monkeypatch):
    rng = np.random.default_rng(seed)
    n_links, n = int(rng.integers(2, 40)), int(rng.integers(1, 200))
    rows, cols, vals, capacity = random_entries(rng, n_links, n, whole=seed % 2 == 0)
    matrix = np.zeros((n_links, n))
    np.add.at(matrix, (rows, cols), vals)
    want = maxmin_levels(matrix, capacity)
    for cells in (0, 1 << 30):  # every instance sparse, then every instance dense
        monkeypatch.setattr(maxmin, "DENSE_CELLS", cells)
        got = maxmin_levels_entries(rows, cols, vals, capacity, n)
        np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-12)


def test_entries_reject_what_the_sparse_side_rejects():
    with pytest.raises(ValueError, match="> 0"):
        maxmin_levels_entries(np.array([0]), np.array([0]), np.array([0.0]), np.ones(1), 1)
    with pytest.raises(ValueError, match="out of range"):
        maxmin_levels_entries(np.array([1]), np.array([0]), np.array([1.0]), np.ones(1), 1)
    with pytest.raises(ValueError, match="crosses no link"):
        maxmin_levels_entries(np.array([0]), np.array([0]), np.array([1.0]), np.ones(1), 2)


# ---- per-flow and multipath: pairs by index ------------------------------------------------


@pytest.mark.parametrize("cls", [PerFlowPolicy, MultipathPolicy])
@pytest.mark.parametrize("seed", range(8))
def test_table_levels_equal_pair_levels(cls, seed):
    rng = random.Random(300 + seed)
    n = rng.randint(4, 10)
    topology = random_wan(rng, n, rng.randint(1, min(8, (n - 1) * (n - 2) // 2)))  # chords fit
    policy = cls(topology, k=3)
    pairs = [pair for pair, ps in policy._paths.items() if ps]
    rng.shuffle(pairs)
    table = policy.pair_table(pairs)
    assert policy.pair_table(pairs) is table
    for _ in range(4):
        active = np.array(sorted(rng.sample(range(len(pairs)), rng.randint(1, len(pairs)))))
        members = np.array([rng.randint(1, 9) for _ in active], dtype=float)
        got = policy.table_levels(0.0, table, active, members)
        want = policy.pair_levels(0.0, tuple(pairs[i] for i in active), members)
        ids = [j for i in active for j in range(table.ptr[i], table.ptr[i + 1])]
        assert [table.paths[j] for j in ids] == want.paths
        np.testing.assert_allclose(got, want.level, rtol=1e-12, atol=0)


def test_table_levels_on_a_small_fabric_by_hand():
    # The fabric of test_per_flow_levels_on_a_small_fabric_by_hand (3 racks, ports 6 B/s,
    # rack 1's downlink 3 B/s), pairs asked by index, one pair of the table not active:
    # members 0->1: 2, 0->2: 1, 2->1: 1. Downlink 1 carries 3 members and fills first, at
    # 3 / 3 = 1 per member (uplink 0 would at 6 / 3 = 2): 0->1 and 2->1 stop at 1. Uplink 0
    # then has 6 - 3 x 1 = 3 left for 0->2's one member: 1 + 3 = 4 (downlink 2 would
    # allow 1 + 5). Levels in table order (0->1, 0->2, 2->1): 1, 4, 1.
    fabric = bigswitch_topology(racks=3, port_bytes_per_s=6.0)
    fabric.set_capacity("core", "1", 3.0, both=False)
    policy = PerFlowPolicy(fabric)
    pairs = [("0", "1"), ("1", "0"), ("0", "2"), ("2", "1")]
    table = policy.pair_table(pairs)
    got = policy.table_levels(0.0, table, np.array([0, 2, 3]), np.array([2.0, 1.0, 1.0]))
    assert got.tolist() == pytest.approx([1.0, 4.0, 1.0], rel=1e-12)


def test_a_table_goes_stale_when_the_wan_changes():
    policy = PerFlowPolicy(bigswitch_topology(racks=3, port_bytes_per_s=6.0))
    table = policy.pair_table([("0", "1")])
    policy.wan_changed(0.0)
    with pytest.raises(ValueError, match="stale"):
        policy.table_levels(0.0, table, np.array([0]), np.array([1.0]))
    assert policy.pair_table([("0", "1")]) is not table


@pytest.mark.parametrize("cls", [PerFlowPolicy, MultipathPolicy])
@pytest.mark.parametrize("seed", range(3))
def test_simulator_table_path_equals_its_pair_levels_path(cls, seed):
    rng = random.Random(400 + seed)
    topology = random_wan(rng, 6, 4)
    coflows = [
        Coflow(c.id, rng.uniform(0, 0.05), c.flows) for c in random_coflows(rng, topology, 8)
    ]
    slow_cls = type("Slow", (cls,), {"pair_table": None})  # not a PairTablePolicy
    fast = simulate(cls(topology.copy(), k=2), coflows)
    slow = simulate(slow_cls(topology.copy(), k=2), coflows)
    for x, y in zip(fast.coflows, slow.coflows, strict=True):
        assert x.cct_s == pytest.approx(y.cct_s, rel=1e-12)
    assert fast.rounds == slow.rounds


# ---- varys and rapier: one backfill entity per route shape ---------------------------------


def per_flow_backfill(policy, remaining, left):
    """The backfill as before its fast path: one water-filling entity per alive routed flow,
    with the flow's own (link, members) entries."""
    rows, cols, vals, where = [], [], [], []
    offset = 0
    for cid, rem in remaining.items():
        info = policy._coflow_incidence(cid)
        take = (rem > 0) & info.routed
        column = np.cumsum(take) - 1 + offset
        keep = take[info.cols]
        rows.append(info.rows[keep])
        cols.append(column[info.cols[keep]])
        vals.append(info.vals[keep])
        where.append((cid, take))
        offset += int(take.sum())
    levels = maxmin_levels_sparse(
        np.concatenate(rows), np.concatenate(cols), np.concatenate(vals), left, offset
    )
    return levels, where


@pytest.mark.parametrize("cls", [VarysPolicy, RapierPolicy])
@pytest.mark.parametrize("seed", range(8))
def test_backfill_per_shape_equals_one_entity_per_flow(cls, seed):
    rng = random.Random(500 + seed)
    n = rng.randint(4, 9)
    topology = random_wan(rng, n, rng.randint(1, min(6, (n - 1) * (n - 2) // 2)))  # chords fit
    policy = cls(topology, k=3)
    coflows = random_coflows(rng, topology, rng.randint(2, 8))
    for c in coflows:
        policy.add_coflow(c, 0.0)
    left = policy._capacity() * np.array([rng.uniform(0.0, 1.0) for _ in policy._rows])
    remaining = {
        c.id: np.array([0.0 if rng.random() < 0.25 else float(f.bytes) for f in c.flows])
        for c in coflows
    }
    want, where = per_flow_backfill(policy, remaining, left)
    shapes, weights = [], []
    for cid, take in where:
        info = policy._coflow_incidence(cid)
        shapes.append(info.shape[take])
        weights.append(info.weight[take])
    per_shape = policy._backfill(np.concatenate(shapes), np.concatenate(weights), left)
    np.testing.assert_allclose(per_shape[np.concatenate(shapes)], want, rtol=1e-12, atol=0)


def test_backfill_of_bundles_on_one_path_by_hand():
    # Three racks, ports 10 B/s. Coflow a: a bundle of 2 and a bundle of 3 flows
    # 0->1 (one shape: path 0-core-1, weight 2 + 3 = 5); coflow b: one flow 0->2. Uplink
    # 0 carries 6 members: 10 / 6 per member for all (downlinks 1 and 2 allow 10 / 5 and
    # 10 / 1). Per-member levels: 5/3 for every flow.
    from terra_core.flow_bundles import FlowBundle

    policy = VarysPolicy(bigswitch_topology(racks=3, port_bytes_per_s=10.0))
    policy.add_coflow(
        Coflow("a", 0.0, [FlowBundle("x", "0", "1", 2.0, 2), FlowBundle("y", "0", "1", 3.0, 3)]),
        0.0,
    )
    policy.add_coflow(Coflow("b", 0.0, [FlowBundle("z", "0", "2", 1.0, 1)]), 0.0)
    a, b = policy._coflow_incidence("a"), policy._coflow_incidence("b")
    assert a.shape[0] == a.shape[1] != b.shape[0]
    shape = np.concatenate((a.shape, b.shape))
    level = policy._backfill(shape, np.array([2.0, 3.0, 1.0]), policy._capacity())
    assert level[shape].tolist() == pytest.approx([10 / 6] * 3, rel=1e-12)
