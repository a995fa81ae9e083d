"""The simulator's Terra fast path (`group_rates`, issue 13 item 3) against the generic
`allocate` path, and swan-mcf's hot-started McfSolver against maxmin_mcf, on seeded random
instances.

The fast path must give the very same run: every coflow's finish time equal to the bit,
the same rounds and LPs (it sums and splits with the same operations in the same order).
The McfSolver must give every commodity the same total (the max-min vector is unique) up to
solver tolerance; its split over paths may differ.
"""

import random

import pytest

from terra_core.baselines import SwanMcfPolicy
from terra_core.mcf import McfSolver, maxmin_mcf
from terra_core.terra_policy import TerraPolicy
from terra_sim.simulator import WanChange, simulate
from topologies import Topology, all_pairs_paths, path_links
from workloads import Coflow, Flow

G = 1e9


class GenericTerra(TerraPolicy):
    """TerraPolicy without the fast path: the simulator falls back to `allocate`."""

    group_rates = None


def random_wan(rng: random.Random, n: int) -> Topology:
    names = [f"D{i}" for i in range(n)]
    capacity = {}
    for i in range(1, n):  # a random tree keeps it connected, then extra links
        j = rng.randrange(i)
        capacity[(names[i], names[j])] = capacity[(names[j], names[i])] = rng.choice([1, 2, 5]) * G
    for _ in range(n):
        a, b = rng.sample(names, 2)
        capacity[(a, b)] = capacity[(b, a)] = rng.choice([1, 2, 5]) * G
    return Topology("r", names, capacity)


def random_coflows(rng: random.Random, dcs: list[str], count: int) -> list[Coflow]:
    out = []
    t = 0.0
    for c in range(count):
        t += rng.expovariate(1.0)
        flows = []
        for f in range(rng.randint(1, 8)):
            src = rng.choice(dcs)
            dst = rng.choice(dcs)  # may equal src: an intra-DC flow
            size = rng.choice([0.5, 1.0, 1.0, 3.0]) * G * rng.random() + 1e6
            flows.append(Flow(f"f{f}", src, dst, size))
        if rng.random() < 0.3:  # identical flows: bundled by the simulator
            flows.extend(Flow(f"g{f}", flows[0].src, flows[0].dst, flows[0].bytes) for f in range(3))
        out.append(Coflow(f"c{c}", t, flows))
    return out


@pytest.mark.parametrize("guard", ["aged", "fixed", "aged-fair"])
@pytest.mark.parametrize("seed", range(8))
def test_terra_fast_path_equals_allocate(seed, guard):
    rng = random.Random(seed)
    wan = random_wan(rng, rng.randint(3, 7))
    coflows = random_coflows(rng, list(wan.dcs), rng.randint(4, 25))
    link = next(iter(wan.capacity))
    changes = [WanChange(2.0, *link, up=False), WanChange(4.0, *link, up=True)] if seed % 2 else []
    fast_policy = TerraPolicy(wan.copy(), k=3, guard=guard)
    slow_policy = GenericTerra(wan.copy(), k=3, guard=guard)
    try:
        fast = simulate(fast_policy, coflows, changes)
    except ValueError as exc:  # a pair cut off by the failure: both must say so
        with pytest.raises(ValueError, match=str(exc)[:20]):
            simulate(slow_policy, coflows, changes)
        return
    slow = simulate(slow_policy, coflows, changes)
    assert [c.finish_s for c in fast.coflows] == [c.finish_s for c in slow.coflows]
    assert fast.rounds == slow.rounds and fast.lps_per_round == slow.lps_per_round
    assert fast.bytes_delivered == pytest.approx(slow.bytes_delivered, rel=1e-12)
    assert fast.wan_utilization == pytest.approx(slow.wan_utilization, rel=1e-9)


def test_fast_path_is_taken():
    wan = random_wan(random.Random(1), 4)
    policy = TerraPolicy(wan.copy())
    calls = []
    original = policy.group_rates

    def spy(now, volumes):
        calls.append(now)
        return original(now, volumes)

    policy.group_rates = spy
    policy.allocate = None  # the generic path would fail
    simulate(policy, random_coflows(random.Random(2), list(wan.dcs), 5))
    assert calls


@pytest.mark.parametrize("seed", range(6))
def test_mcf_solver_totals_equal_maxmin_mcf(seed):
    rng = random.Random(seed)
    wan = random_wan(rng, rng.randint(4, 9))
    paths = all_pairs_paths(wan, 3)
    pairs = [p for p in paths if paths[p]]
    solver = McfSolver(dict(wan.capacity))
    for _ in range(12):  # changing sets of pairs on one solver
        chosen = rng.sample(pairs, rng.randint(1, len(pairs)))
        demands = {pair: paths[pair] for pair in chosen}
        got = solver.solve(demands)
        want = maxmin_mcf({pair: (ps, None) for pair, ps in demands.items()}, dict(wan.capacity))
        assert got.keys() == want.keys()
        for pair in demands:
            total = sum(r for _, r in got[pair])
            assert total == pytest.approx(sum(r for _, r in want[pair]), rel=1e-6, abs=1e-7 * G)
            assert all(r > 0 and p in paths[pair] for p, r in got[pair])
        load = {}
        for lst in got.values():
            for path, r in lst:
                for link in path_links(path):
                    load[link] = load.get(link, 0.0) + r
        assert all(x <= wan.capacity[link] * (1 + 1e-7) for link, x in load.items())


def test_swan_mcf_runs_with_the_solver_like_before():
    rng = random.Random(5)
    wan = random_wan(rng, 6)
    coflows = random_coflows(rng, list(wan.dcs), 15)
    result = simulate(SwanMcfPolicy(wan.copy()), coflows)
    assert result.unfinished == []
