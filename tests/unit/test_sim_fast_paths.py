"""The simulator's Terra fast path (`group_rates`) against the generic
`allocate` path on seeded random instances: the very same run, every coflow's finish time
equal to the bit, the same rounds and LPs (it sums and splits with the same operations in
the same order)."""

import random

import pytest
import reference_mcf

from terra_core.flat_rates import FlatRates
from terra_core.mcf import McfWarmStart, maxmin_mcf
from terra_core.terra_policy import TerraPolicy
from terra_model import Coflow, Flow
from terra_sim.errors import SimulationError
from terra_sim.simulator import WanChange, simulate
from topologies import Topology, all_pairs_paths, path_links

G = 1e9


class GenericTerra(TerraPolicy):
    """TerraPolicy without the fast paths: the simulator falls back to `allocate`."""

    group_rates = None
    group_rate_arrays = None


class DictTerra(TerraPolicy):
    """TerraPolicy whose fast path answers in dicts (`group_rates`), as a tenants' policy."""

    group_rate_arrays = None


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
            flows.extend(
                Flow(f"g{f}", flows[0].src, flows[0].dst, flows[0].bytes) for f in range(3)
            )
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
    dicts = simulate(DictTerra(wan.copy(), k=3, guard=guard), coflows, changes)
    for other in (slow, dicts):
        assert [c.finish_s for c in fast.coflows] == [c.finish_s for c in other.coflows]
        assert fast.rounds == other.rounds and fast.lps_per_round == other.lps_per_round
        assert fast.bytes_delivered == pytest.approx(other.bytes_delivered, rel=1e-12)
        assert fast.wan_utilization == pytest.approx(other.wan_utilization, rel=1e-9)


def test_fast_path_is_taken():
    wan = random_wan(random.Random(1), 4)
    policy = TerraPolicy(wan.copy())
    calls = []
    original = policy.group_rate_arrays

    def spy(now, volumes):
        calls.append(now)
        return original(now, volumes)

    policy.group_rate_arrays = spy
    policy.allocate = None  # the generic path would fail
    simulate(policy, random_coflows(random.Random(2), list(wan.dcs), 5))
    assert calls


def test_a_coflow_without_a_rate_is_handed_its_last_volumes_dict_again():
    """The fast path gives a coflow none of whose FlowGroups got a rate the same dict next
    round (its flows did not move), and a new one otherwise."""
    # One link: a round serves the smallest coflows first and gives step 6's spare to
    # the first coflow on the pair, so the others wait with no rate.
    wan = Topology("l", ["A", "B"], {("A", "B"): G, ("B", "A"): G})
    coflows = [Coflow(f"c{i}", 0.1 * i, [Flow("f", "A", "B", (10 - i) * G)]) for i in range(6)]
    policy = TerraPolicy(wan.copy(), k=1)
    rounds = []
    original = policy.group_rate_arrays

    def spy(now, volumes):
        rates = original(now, volumes)
        rounds.append(({cid: (v, dict(v)) for cid, v in volumes.items()}, set(rates.as_dict())))
        return rates

    policy.group_rate_arrays = spy
    simulate(policy, coflows)
    again = 0
    for (before, rated), (after, _) in zip(rounds, rounds[1:], strict=False):
        for cid, (vol, copy) in after.items():
            if cid in before and before[cid][0] is vol:
                again += 1
                assert cid not in rated and copy == before[cid][1]
    assert again > 0


@pytest.mark.parametrize("seed", range(10))
def test_maxmin_mcf_equals_the_reference_bit_for_bit(seed):
    rng = random.Random(100 + seed)
    wan = random_wan(rng, rng.randint(3, 9))
    paths = all_pairs_paths(wan, 3)
    pairs = [p for p in paths if paths[p]]
    chosen = rng.sample(pairs, rng.randint(1, len(pairs)))
    demands = {p: (paths[p], rng.choice([None, None, rng.random() * G])) for p in chosen}
    capacity = dict(wan.capacity)
    if seed % 3 == 0:  # a link at 0: paths through it are unusable
        capacity[next(iter(capacity))] = 0.0
    priority = {p: rng.randrange(3) for p in chosen} if seed % 2 else None
    weights = {p: rng.choice([1.0, 2.0, 0.5]) for p in chosen} if seed % 4 < 2 else None
    rounds = rng.choice([1, 2, 64])
    got_stats, want_stats = {}, {}
    got = maxmin_mcf(demands, capacity, priority, rounds, weights, got_stats)
    want = reference_mcf.maxmin_mcf(demands, capacity, priority, rounds, weights, want_stats)
    assert got == want
    assert got_stats == want_stats


def assert_reference_totals(got, want):
    """Each commodity's total rate in `got` is the one in `want` to 1e-9 relative (maxmin_mcf
    answers: {key: [(path, bytes/s)]})."""
    for key, lst in got.items():
        total = sum(r for _, r in lst)
        assert total == pytest.approx(sum(r for _, r in want[key]), rel=1e-9, abs=1e-3)


@pytest.mark.parametrize("seed", range(10))
def test_compact_maxmin_mcf_has_the_reference_totals(seed):
    # The compact LP (and its warm start) may split a commodity over its paths differently,
    # but max-min fair totals are unique: the same as the reference to 1e-9 relative.
    rng = random.Random(200 + seed)
    wan = random_wan(rng, rng.randint(3, 9))
    paths = all_pairs_paths(wan, 3)
    pairs = [p for p in paths if paths[p]]
    warm = McfWarmStart()
    for _ in range(3):  # consecutive calls share the warm start
        chosen = rng.sample(pairs, rng.randint(1, len(pairs)))
        demands = {p: (paths[p], rng.choice([None, None, rng.random() * G])) for p in chosen}
        capacity = {
            link: cap * rng.choice([0.0, 0.5, 1.0, 1.0]) for link, cap in wan.capacity.items()
        }
        priority = {p: rng.randrange(3) for p in chosen} if seed % 2 else None
        weights = {p: rng.choice([1.0, 2.0, 0.5]) for p in chosen} if seed % 4 < 2 else None
        want = reference_mcf.maxmin_mcf(demands, capacity, priority, 64, weights)
        for start in (None, warm):
            got = maxmin_mcf(demands, capacity, priority, 64, weights, compact=True, warm=start)
            assert got.keys() == want.keys()
            assert_reference_totals(got, want)


@pytest.mark.parametrize("seed", range(4))
def test_compact_maxmin_mcf_has_the_reference_totals_on_degenerate_wans(seed):
    # Every link at one capacity and every DC pair active: many pairs tie at each level, the
    # LPs are degenerate (where the compact LP runs without bound perturbation). Totals as
    # the reference's (two-row LP, default HiGHS options) to 1e-9 relative, cold and warm.
    rng = random.Random(300 + seed)
    wan = random_wan(rng, rng.randint(8, 12))
    capacity = dict.fromkeys(wan.capacity, G)
    paths = all_pairs_paths(wan, 4)
    warm = McfWarmStart()
    pairs = [p for p in paths if paths[p]]
    for drop in (0, 3):  # a second call without three pairs, warm from the first
        demands = {p: (paths[p], None) for p in pairs[drop:]}
        want = reference_mcf.maxmin_mcf(demands, capacity)
        for start in (None, warm):
            got = maxmin_mcf(demands, capacity, compact=True, warm=start)
            assert_reference_totals(got, want)


@pytest.mark.parametrize("seed", range(6))
def test_compact_maxmin_mcf_taking_rounds_from_the_last_call_has_the_reference_totals(seed):
    # The simulator's usual sequence: every DC pair active, then pairs leave one or two at
    # a time; each call takes the rounds before the first dropped pair froze from the
    # call before it (mcf.py `_CompactMcfLp.fill`). Totals as the reference's (two-row LP,
    # solved from scratch) to 1e-9 relative, and fewer LPs than the calls from scratch.
    rng = random.Random(400 + seed)
    wan = random_wan(rng, rng.randint(6, 10))
    capacity = {link: G * rng.choice([1.0, 1.0, 0.5]) for link in wan.capacity}
    paths = all_pairs_paths(wan, 3)
    pairs = [p for p in paths if paths[p]]
    warm = McfWarmStart()
    taken = cold = 0
    while len(pairs) > 1:
        demands = {p: (paths[p], None) for p in pairs}
        want = reference_mcf.maxmin_mcf(demands, capacity)
        stats, cold_stats = {}, {}
        got = maxmin_mcf(demands, capacity, compact=True, warm=warm, stats=stats)
        maxmin_mcf(demands, capacity, compact=True, stats=cold_stats)
        taken += stats["lps"]
        cold += cold_stats["lps"]
        assert_reference_totals(got, want)
        load = dict.fromkeys(capacity, 0.0)
        for path_rate in got.values():
            for path, rate in path_rate:
                for link in path_links(path):
                    load[link] += rate
        assert all(load[link] <= capacity[link] * (1 + 1e-9) for link in load)
        for _ in range(rng.choice([1, 1, 2])):
            pairs.remove(rng.choice(pairs))
    assert taken < cold


class _BadGroups(TerraPolicy):
    """A buggy Terra: every round answers `answer` ({coflow: {pair: [(path, bytes/s)]}})."""

    def __init__(self, topology, answer):
        super().__init__(topology)
        self.answer = answer

    group_rate_arrays = None

    def group_rates(self, now, volumes, capacity=None):
        return self.answer


class _BadArrays(TerraPolicy):
    """The same buggy answer through the flat fast path (`group_rate_arrays`)."""

    def __init__(self, topology, answer):
        super().__init__(topology)
        self.answer = answer

    def group_rate_arrays(self, now, volumes):
        return FlatRates.from_dict(self.answer)


_LINE = Topology("line", ["A", "B", "C"], {("A", "B"): G, ("B", "C"): G, ("B", "A"): G})


@pytest.mark.parametrize(
    "answer, message",
    [
        ({"c": {("A", "B"): [(("A", "B"), 0.0), (("A", "B"), float("nan"))]}}, "rate nan"),
        ({"c": {("A", "B"): [(("A", "B"), G / 2), (("A", "B"), -1.0)]}}, "rate -1.0"),
        ({"c": {("A", "C"): [(("A", "B", "C"), 1.0)]}}, "where it has no active flow"),
        ({"x": {("A", "B"): [(("A", "B"), 1.0)]}}, "where it has no active flow"),
        ({"c": {("A", "B"): [(("B", "C"), 1.0)]}}, "does not join A and B"),
        ({"c": {("A", "B"): [(("A", "C", "B"), 1.0)]}}, "unknown link"),
        ({"c": {("A", "B"): [(("A", "C", "B"), 1.0), (("B", "C"), 1.0)]}}, "unknown link"),
        ({"c": {("A", "B"): [(("A", "B"), 2 * G)]}}, "loaded"),
    ],
)
@pytest.mark.parametrize("bad", [_BadGroups, _BadArrays])
def test_malformed_group_rates_are_policy_bugs(answer, message, bad):
    # the split checks the answer path rate by path rate, in its order: the first bad one
    # is reported, and a rate of 0 is never checked further
    coflow = Coflow("c", 0, [Flow("f", "A", "B", G)])
    with pytest.raises(SimulationError, match=message):
        simulate(bad(_LINE, answer), [coflow])


def test_zero_group_rates_off_the_flowgroups_are_ignored():
    # rates of 0 for a pair or coflow without active flows are no error; the flow of
    # (A, B) gets the sum of its two path rates, split in the answer's order
    answer = {
        "x": {("A", "B"): [(("A", "B"), 0.0)]},
        "c": {("A", "C"): [(("A", "B", "C"), 0.0)], ("A", "B"): [(("A", "B"), G / 4)] * 2},
    }
    for bad in (_BadGroups, _BadArrays):
        result = simulate(bad(_LINE, answer), [Coflow("c", 0, [Flow("f", "A", "B", G)])])
        assert result.coflows[0].cct_s == pytest.approx(2.0)
