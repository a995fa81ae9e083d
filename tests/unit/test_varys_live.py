"""Varys on bigswitch: the flat fast path of Varys and Rapier against
the straightforward computations it replaces, on random small instances.

- `MaddPolicy.live_coflow_rates` (only the unfinished flows, volumes and Γ of all
  coflows by one bincount, the MADD pass per coflow on its used links) and
  `coflow_rates` built on it, against the earlier per-coflow code (below,
  `per_coflow_rates`), bit for bit: on random WANs (flows with different hop counts, the
  general gather), on small bigswitch fabrics (every flow two entries, the matrix
  gather), with finished flows, with unrouted flows (a link down cuts a pair off);
- `madd_kernels.madd_pass` against the MADD loop on whole capacity vectors;
- `madd_kernels.flow_volumes`' single-path branch against its general one;
- the simulator's coflow path (`_allocate_by_coflow`, route entries per position)
  against its generic `allocate` path on bigswitch fabrics.
Capacities are in bytes/s, remaining amounts in bytes.
"""

from __future__ import annotations

import random

import numpy as np
import pytest
from test_sparse_baselines import _AllocateOnly, _gamma, random_coflows, random_wan

from terra_core.flow_bundles import FlowBundle
from terra_core.madd_kernels import coflow_gammas, flow_volumes, madd_pass
from terra_core.rapier import RapierPolicy
from terra_core.varys import VarysPolicy
from terra_model import Coflow
from terra_sim.simulator import WanChange, simulate
from topologies.bigswitch import bigswitch_topology


def per_coflow_rates(policy, remaining):
    """`MaddPolicy.coflow_rates` as it was before: per coflow its volume by bincount over
    all its flows' entries, Γ, the MADD loop on whole capacity vectors, one backfill."""
    capacity = policy._capacity()
    n_links = len(capacity)
    coflows = []
    for cid, rem in remaining.items():
        policy._before_allocate(cid, rem)
        info = policy._coflow_incidence(cid)
        alive = rem > 0
        per_member = rem / info.members
        volume = np.bincount(
            info.rows, weights=info.vals * per_member[info.cols], minlength=n_links
        )
        gamma = np.inf if (alive & ~info.routed).any() else _gamma(volume, capacity)
        coflows.append((gamma, len(coflows), cid, volume, per_member, info, alive))
    if not coflows:
        return {}
    madd = {cid: np.zeros(len(info.fids)) for _, _, cid, _, _, info, _ in coflows}
    left = capacity.copy()
    for gamma, _, cid, volume, per_member, _, _ in sorted(coflows, key=lambda c: c[:2]):
        g = _gamma(volume, left)
        if gamma == np.inf or g == np.inf or not volume.any():
            continue
        madd[cid] = per_member / g
        left = np.maximum(left - volume / g, 0.0)
    takes = [(info, alive & info.routed) for _, _, _, _, _, info, alive in coflows]
    extra = policy._backfill(
        np.concatenate([info.shape[take] for info, take in takes]),
        np.concatenate([info.weight[take] for info, take in takes]),
        left,
    )
    out = {}
    for (_, _, cid, _, _, info, alive), (_, take) in zip(coflows, takes, strict=True):
        rate = madd[cid] * info.routed
        rate[take] += extra[info.shape[take]]
        rate[~alive] = 0.0
        out[cid] = rate
    return out


def fabric_coflows(rng: random.Random, racks: int, count: int) -> list[Coflow]:
    """`count` coflows of 1-12 bundles (1-3 members, 1-40 MB each) between random racks."""
    coflows = []
    for c in range(count):
        flows = []
        for f in range(rng.randint(1, 12)):
            src, dst = rng.sample([str(r) for r in range(racks)], 2)
            members = rng.randint(1, 3)
            flows.append(FlowBundle(f"f{f}", src, dst, members * rng.randint(1, 40) * 1e6, members))
        coflows.append(Coflow(f"c{c}", 0.0, flows))
    return coflows


def random_remaining(rng: random.Random, coflows) -> dict[str, np.ndarray]:
    """Each flow finished (0) with probability 1/4, else a random share of its bytes."""
    return {
        c.id: np.array(
            [0.0 if rng.random() < 0.25 else rng.uniform(0.01, 1.0) * f.bytes for f in c.flows]
        )
        for c in coflows
    }


def instance(kind: str, cls, rng: random.Random):
    """(policy with coflows added, the coflows) on a random WAN or a bigswitch fabric."""
    if kind == "wan":
        n = rng.randint(4, 9)
        topology = random_wan(rng, n, rng.randint(0, 4))
        coflows = random_coflows(rng, topology, rng.randint(1, 7))
    else:
        racks = rng.randint(3, 7)
        topology = bigswitch_topology(racks=racks, port_bytes_per_s=rng.randint(1, 5) * 1e7)
        coflows = fabric_coflows(rng, racks, rng.randint(1, 7))
    policy = cls(topology, k=rng.choice([1, 3]))
    for c in coflows:
        policy.add_coflow(c, 0.0)
    return policy, coflows


def flat(remaining):
    """`remaining` ({coflow id: full array}) as live_coflow_rates' arguments."""
    live = {cid: np.flatnonzero(rem > 0) for cid, rem in remaining.items()}
    return (
        list(remaining),
        [len(idx) for idx in live.values()],
        np.concatenate([np.zeros(0, dtype=np.intp), *live.values()]),
        np.concatenate([np.zeros(0)] + [remaining[cid][idx] for cid, idx in live.items()]),
    )


@pytest.mark.parametrize("kind", ["wan", "fabric"])
@pytest.mark.parametrize("cls", [VarysPolicy, RapierPolicy])
@pytest.mark.parametrize("seed", range(10))
def test_live_rates_equal_the_per_coflow_code_bit_for_bit(kind, cls, seed):
    rng = random.Random(800 + seed)
    policy, coflows = instance(kind, cls, rng)
    reference, _ = instance(kind, cls, random.Random(800 + seed))
    for _ in range(4):
        remaining = random_remaining(rng, coflows)
        if rng.random() < 0.3:  # some coflows not active (not asked about)
            remaining = {cid: rem for cid, rem in remaining.items() if rng.random() < 0.7}
        want = per_coflow_rates(reference, remaining)
        got = policy.coflow_rates(0.0, remaining)
        assert got.keys() == want.keys()
        for cid, (rate, routes) in got.items():
            np.testing.assert_array_equal(rate, want[cid])
            assert routes is policy._coflow_incidence(cid).routes
        cids, counts, local, rem = flat(remaining)
        rate, routes = policy.live_coflow_rates(0.0, cids, counts, local, rem)
        np.testing.assert_array_equal(
            rate,
            np.concatenate([np.zeros(0)] + [got[cid][0][r > 0] for cid, r in remaining.items()]),
        )
        assert [r is got[cid][1] for cid, r in zip(cids, routes, strict=True)] == [True] * len(cids)


@pytest.mark.parametrize("seed", range(6))
def test_single_path_volumes_equal_the_general_pass(seed):
    # on bigswitch every flow is one path with all its members: `flow_volumes` then uses
    # the member count for the entries' values and the weight; the general branch, which
    # reads them, gives the same floats
    rng = random.Random(300 + seed)
    policy, coflows = instance("fabric", VarysPolicy, rng)
    cids, counts, local, rem = flat(random_remaining(rng, coflows))
    lay = policy._layout(cids)
    assert lay.single and lay.hops == 2
    counts = np.asarray(counts, dtype=np.intp)
    args = (counts, local, rem, lay.base, lay.size, lay.members, lay.ptr, lay.rows, lay.vals)
    tail = (lay.shape, lay.weight, lay.routed, lay.hops)
    ends = (len(policy._capacity()), len(policy._shapes))
    single = flow_volumes(*args, *tail, True, *ends)
    general = flow_volumes(*args, *tail, False, *ends)
    for x, y in zip(single, general, strict=True):
        np.testing.assert_array_equal(x, y)


@pytest.mark.parametrize("cls", [VarysPolicy, RapierPolicy])
@pytest.mark.parametrize("seed", range(6))
def test_live_rates_with_unrouted_flows_and_reroutes(cls, seed):
    # a tree link down cuts pairs off: Varys' flows across it lose their route (Γ inf,
    # rate 0); Rapier re-routes the coflows whose routes broke before the next rates.
    rng = random.Random(900 + seed)
    n = rng.randint(4, 8)
    topology = random_wan(rng, n, 0)  # a tree: every link cuts the WAN
    policy = cls(topology, k=2)
    reference = cls(topology.copy(), k=2)
    coflows = random_coflows(rng, topology, rng.randint(2, 6))
    for c in coflows:
        policy.add_coflow(c, 0.0)
        reference.add_coflow(c, 0.0)
    a, b = rng.choice(sorted(topology.capacity))
    for p in (policy, reference):
        WanChange(0.0, a, b, up=False).apply(p.topology)
        p.wan_changed(0.0)
    for _ in range(3):
        remaining = random_remaining(rng, coflows)
        want = per_coflow_rates(reference, remaining)
        got = policy.coflow_rates(0.0, remaining)
        for cid, (rate, _) in got.items():
            np.testing.assert_array_equal(rate, want[cid])


def test_live_rates_reject_malformed_arguments():
    policy = VarysPolicy(bigswitch_topology(racks=3, port_bytes_per_s=10.0))
    policy.add_coflow(
        Coflow("a", 0.0, [FlowBundle("x", "0", "1", 2.0, 1), FlowBundle("y", "0", "2", 3.0, 1)]),
        0.0,
    )
    ok = (["a"], [2], np.array([0, 1]), np.array([1.0, 2.0]))
    assert policy.live_coflow_rates(0.0, *ok)[0].shape == (2,)
    with pytest.raises(ValueError, match="do not agree"):
        policy.live_coflow_rates(0.0, ["a"], [1], np.array([0, 1]), np.array([1.0, 2.0]))
    with pytest.raises(ValueError, match="do not agree"):
        policy.live_coflow_rates(0.0, ["a"], [2], np.array([0, 1]), np.array([1.0]))
    with pytest.raises(ValueError, match="outside"):
        policy.live_coflow_rates(0.0, ["a"], [2], np.array([0, 2]), np.array([1.0, 2.0]))
    with pytest.raises(ValueError, match="outside"):
        policy.live_coflow_rates(0.0, ["a"], [1], np.array([-1]), np.array([1.0]))
    for bad in (0.0, np.inf, np.nan):  # (inf would give NaN rates)
        with pytest.raises(ValueError, match="finite and > 0"):
            policy.live_coflow_rates(0.0, ["a"], [2], np.array([0, 1]), np.array([1.0, bad]))
    # counts that sum to n but go negative: the compiled pass would read past the arrays
    policy.add_coflow(Coflow("c", 0.0, [FlowBundle("z", "1", "2", 4.0, 1)]), 0.0)
    for counts in ([-1, 2], [3, -2], [-100000, 100001]):
        with pytest.raises(ValueError, match="counts must be >= 0"):
            policy.live_coflow_rates(0.0, ["a", "c"], counts, np.array([0]), np.array([1.0]))
    with pytest.raises(KeyError):
        policy.live_coflow_rates(0.0, ["b"], [0], np.zeros(0, dtype=int), np.zeros(0))
    with pytest.raises(ValueError, match="remaining bytes for 2 flows"):
        policy.coflow_rates(0.0, {"a": np.array([1.0])})
    assert policy.live_coflow_rates(0.0, [], [], np.zeros(0, dtype=int), np.zeros(0))[1] == []


def whole_vector_madd(volume, gamma, capacity):
    """The earlier MADD loop on whole capacity vectors: (g per coflow, left)."""
    g = np.full(len(gamma), np.inf)
    left = capacity.copy()
    for c in sorted(range(len(gamma)), key=lambda c: (gamma[c], c)):
        gc = _gamma(volume[c], left)
        if gamma[c] == np.inf or gc == np.inf or not volume[c].any():
            continue
        g[c] = gc
        left = np.maximum(left - volume[c] / gc, 0.0)
    return g, left


@pytest.mark.parametrize("seed", range(20))
def test_madd_pass_equals_the_whole_vector_loop(seed):
    rng = np.random.default_rng(seed)
    coflows, links = int(rng.integers(1, 8)), int(rng.integers(1, 12))
    volume = rng.uniform(0.0, 50.0, (coflows, links)) * (rng.random((coflows, links)) < 0.4)
    capacity = rng.uniform(1.0, 10.0, links)
    capacity[rng.random(links) < 0.15] = 0.0  # links down
    gamma = coflow_gammas(volume, capacity)
    assert gamma.tolist() == [_gamma(v, capacity) for v in volume]
    gamma[rng.random(coflows) < 0.2] = np.inf  # an unrouted flow
    g, left = madd_pass(volume, gamma, capacity)
    want_g, want_left = whole_vector_madd(volume, gamma, capacity)
    np.testing.assert_array_equal(g, want_g)
    np.testing.assert_array_equal(left, want_left)


@pytest.mark.parametrize("cls", [VarysPolicy, RapierPolicy])
@pytest.mark.parametrize("seed", range(3))
def test_simulator_coflow_path_equals_allocate_on_fabrics(cls, seed):
    rng = random.Random(1000 + seed)
    racks = rng.randint(3, 6)
    topology = bigswitch_topology(racks=racks, port_bytes_per_s=1e7)
    coflows = [Coflow(c.id, rng.uniform(0, 2.0), c.flows) for c in fabric_coflows(rng, racks, 10)]
    fast = simulate(cls(topology.copy()), coflows)
    generic = simulate(_AllocateOnly(cls(topology.copy())), coflows)
    for x, y in zip(fast.coflows, generic.coflows, strict=True):
        assert x.cct_s == pytest.approx(y.cct_s, rel=1e-12)
    assert fast.wan_utilization == pytest.approx(generic.wan_utilization, rel=1e-12)
    assert fast.rounds == generic.rounds
