"""GroupVolumes: a coflow's volumes as a read-only dict with its arrays. The round fed them
gives the very rates, order and Γs it gives fed plain dicts (its numpy passes over the
arrays are the dict loops' operations), round after round as the volumes shrink."""

import random

import numpy as np
import pytest

from terra_core.group_volumes import GroupVolumes, same_pairs
from terra_core.round_memo import PairNumbers, RoundMemo
from terra_core.scheduling_round import schedule_round
from terra_core.terra_policy import TerraPolicy
from terra_model import Coflow, Flow
from topologies import Topology

G = 1e9


def test_build_and_updated_are_the_dicts_of_their_values():
    pairs = [("A", "B"), ("B", "C"), ("A", "C")]
    first = GroupVolumes.build(pairs, np.array([3.0, 2.0, 1.0]))
    assert first == {("A", "B"): 3.0, ("B", "C"): 2.0, ("A", "C"): 1.0}
    assert list(first) == pairs and first.pairs is pairs
    later = GroupVolumes.updated(first, np.array([0, 2]), np.array([2.5, 2.0, 0.5]))
    assert later == {("A", "B"): 2.5, ("B", "C"): 2.0, ("A", "C"): 0.5}
    assert list(later) == pairs and same_pairs(later, pairs)
    assert first[("A", "B")] == 3.0  # (the old one unchanged)
    assert not same_pairs({("A", "B"): 1.0}, pairs) and not same_pairs(first, None)


def test_read_only_and_lengths_checked():
    pairs = [("A", "B")]
    vol = GroupVolumes.build(pairs, np.array([1.0]))
    for write in (
        lambda: vol.__setitem__(("A", "B"), 2.0),
        lambda: vol.update({("A", "B"): 2.0}),
        lambda: vol.pop(("A", "B")),
        lambda: vol.clear(),
        lambda: vol.setdefault(("B", "A"), 1.0),
    ):
        with pytest.raises(TypeError, match="read only"):
            write()
    assert vol == {("A", "B"): 1.0}
    with pytest.raises(ValueError, match="1 pairs but 2 volumes"):
        GroupVolumes.build(pairs, np.array([1.0, 2.0]))
    with pytest.raises(ValueError, match="1 pairs but 2 volumes"):
        GroupVolumes.updated(vol, np.array([0]), np.array([1.0, 2.0]))


def _wan(rng: random.Random, n: int) -> Topology:
    names = [f"D{i}" for i in range(n)]
    capacity = {}
    for i in range(1, n):
        j = rng.randrange(i)
        capacity[(names[i], names[j])] = capacity[(names[j], names[i])] = rng.choice([1, 2]) * G
    for _ in range(n):
        a, b = rng.sample(names, 2)
        capacity[(a, b)] = capacity[(b, a)] = rng.choice([1, 2, 5]) * G
    return Topology("r", names, capacity)


def _policy(wan: Topology, coflows: list[Coflow], guard: str) -> TerraPolicy:
    policy = TerraPolicy(wan.copy(), k=3, guard=guard)
    for c in coflows:
        policy.add_coflow(c, 0.0)
    return policy


@pytest.mark.parametrize("guard", ["aged", "fixed"])
@pytest.mark.parametrize("seed", range(4))
def test_round_on_group_volumes_equals_round_on_dicts(seed, guard):
    """Coflows of 70-90 FlowGroups (the numpy passes run from 64), shrunk round after
    round by their rates, some FlowGroups unchanged (GroupVolumes.updated)."""
    rng = random.Random(seed)
    wan = _wan(rng, 10)
    pairs_all = [(a, b) for a in wan.dcs for b in wan.dcs if a != b]
    coflows = []
    for c in range(4):
        mine = rng.sample(pairs_all, rng.randint(70, 90))
        flows = [Flow(f"f{i}", a, b, rng.random() * G + 1e6) for i, (a, b) in enumerate(mine)]
        coflows.append(Coflow(f"c{c}", 0.0, flows))
    plain, shared = _policy(wan, coflows, guard), _policy(wan, coflows, guard)
    pairs = {c.id: [(f.src, f.dst) for f in c.flows] for c in coflows}
    vols = {c.id: np.array([f.bytes for f in c.flows]) for c in coflows}
    last: dict[str, GroupVolumes] = {}
    now = 0.0
    for _ in range(12):
        given = {}
        for cid, v in vols.items():
            old = last.get(cid)
            if old is None:
                given[cid] = GroupVolumes.build(pairs[cid], v)
            else:
                changed = np.flatnonzero(v != old.array)
                given[cid] = old if not len(changed) else GroupVolumes.updated(old, changed, v)
        last = given
        ra = plain._round(now, {cid: dict(v) for cid, v in given.items()})
        rb = shared._round(now, given)
        a = ra.rates
        assert a == rb.rates and ra.order == rb.order and ra.state == rb.state
        assert ra.gammas == rb.gammas  # (the Γ keys: the hints' sums to the bit)
        step = 0.3
        for cid, per_pair in a.items():
            v = vols[cid].copy()
            for k, pair in enumerate(pairs[cid]):
                rate = sum(x for _, x in per_pair.get(pair, []))
                v[k] = max(v[k] - rate * step, 0.0)
            vols[cid] = v
        vols = {cid: v for cid, v in vols.items() if (v > 0).all()}
        now += step
        if not vols:
            break


def test_group_volumes_with_a_pair_without_path_refused_as_a_dict():
    paths = {("A", "B"): [("A", "B")], ("B", "C"): [("B", "C")]}
    capacity = {("A", "B"): G, ("B", "C"): G}
    memo = RoundMemo()
    good = GroupVolumes.build([("A", "B"), ("B", "C")], np.array([G, 2 * G]))
    for _ in range(2):  # (the second round skips the check of the same pair list)
        got = schedule_round({"c": good}, paths, capacity, memo=memo)
        assert got.rates == schedule_round({"c": dict(good)}, paths, capacity).rates
    bad = GroupVolumes.build([("A", "B"), ("A", "C")], np.array([G, G]))
    for kept in (None, RoundMemo(), memo):
        with pytest.raises(ValueError, match="no path set for DC pair A->C"):
            schedule_round({"c": bad}, paths, capacity, memo=kept)


def test_group_volumes_with_zero_or_nan_volumes_read_as_their_positive_pairs():
    wan = Topology("t", ["A", "B", "C"], {(a, b): G for a in "ABC" for b in "ABC" if a != b})
    flows = [Flow("f", "A", "B", G), Flow("g", "A", "C", G), Flow("h", "B", "C", G)]
    coflow = Coflow("c", 0.0, flows)
    pairs = [("A", "B"), ("A", "C"), ("B", "C")]
    for bad in (0.0, float("nan")):
        values = np.array([G, bad, 2 * G])
        plain, shared = _policy(wan, [coflow], "aged"), _policy(wan, [coflow], "aged")
        a = plain.group_rates(0.0, {"c": dict(zip(pairs, values.tolist(), strict=True))})
        b = shared.group_rates(0.0, {"c": GroupVolumes.build(pairs, values)})
        assert a == b and ("A", "C") not in b["c"]


def test_pair_numbers_kept_while_a_coflows_pairs_are_the_same():
    ab, ac, ad = ("A", "B"), ("A", "C"), ("A", "D")
    numbers = PairNumbers()
    first = GroupVolumes.build([ab, ac], np.array([2.0, 1.0]))
    nos = numbers.of("c", first)
    assert nos.tolist() == [0, 1]
    later = GroupVolumes.updated(first, np.array([0]), np.array([1.5, 1.0]))
    assert numbers.of("c", later) is nos  # (the same pair list: not numbered again)
    plain = {ad: 1.0, ac: 3.0}
    assert numbers.of("d", plain).tolist() == [2, 1]
    assert numbers.of("d", plain) is numbers.of("d", plain)
    assert numbers.of("d", {ac: 3.0}).tolist() == [1]  # (another dict: numbered again)
    other = GroupVolumes.build([ad, ab], np.array([1.0, 1.0]))
    assert numbers.of("c", other).tolist() == [2, 0]
    assert numbers.number == {ab: 0, ac: 1, ad: 2}
