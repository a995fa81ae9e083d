"""The compiled water-filling of the scheduling round (steps 5-6 and the aged-fair guard
beyond round_fair_share.MCF_MAX_COLUMNS columns) against the Python code it replaced
(tests/reference_waterfill.py), on random WANs: the same rates in the same order and the
same capacities left, to the bit. Capacities and rates are in bytes/s.
"""

from __future__ import annotations

import struct

import numpy as np
import pytest
from reference_waterfill import waterfill_classes as reference

from terra_core.path_masks import PathIndex
from terra_core.round_fair_share import _waterfill_classes
from topologies import path_links


def bits(x: float) -> bytes:
    """The float's 8 bytes (so -0.0 and 0.0, or two NaNs, are told apart as stored)."""
    return struct.pack("<d", x)


def random_case(rng: np.random.Generator):
    """(classes, weights, paths, avail, capacity) of a random WAN: 4-12 DCs, a random set
    of directed links (some outside the capacity map: their paths are always blocked),
    1-5 paths per DC pair of 1-5 hops, pairs in 1-6 classes, weights in [1e-3, 1] (some
    equal), and each link's spare capacity 0, a sliver or a random part of its capacity."""
    n = int(rng.integers(4, 13))
    dcs = [f"d{i}" for i in range(n)]
    links = [(a, b) for a in dcs for b in dcs if a != b and rng.random() < 0.6]
    capacity = {link: float(rng.choice([1e9, 1.25e8, rng.uniform(1e6, 1e9)])) for link in links}
    for link in links[: len(links) // 10]:
        del capacity[link]  # (a link no capacity names: its paths count as full)
    pairs = list({(a, b) for a in dcs for b in dcs if a != b})
    rng.shuffle(pairs)
    pairs = pairs[: int(rng.integers(1, min(len(pairs), 120) + 1))]
    paths = {}
    for a, b in pairs:
        found = []
        for _ in range(int(rng.integers(1, 6))):
            hops = int(rng.integers(1, 6))
            others = [d for d in dcs if d not in (a, b)]
            mid = [str(x) for x in rng.choice(others, size=min(hops - 1, n - 2), replace=False)]
            found.append((a, *mid, b))
        paths[(a, b)] = sorted(dict.fromkeys(found), key=len)
    avail = {}
    for link, c in capacity.items():
        kind = rng.random()
        avail[link] = 0.0 if kind < 0.15 else c * 1e-7 if kind < 0.25 else c * rng.random()
    weights = {pair: float(rng.choice([1.0, 0.5, 1e-3, rng.uniform(1e-3, 1.0)])) for pair in pairs}
    cuts = sorted(set(rng.integers(1, len(pairs) + 1, size=int(rng.integers(0, 6)))))
    bounds = [0, *[c for c in cuts if c < len(pairs)], len(pairs)]
    classes = [pairs[lo:hi] for lo, hi in zip(bounds, bounds[1:], strict=False) if hi > lo]
    return classes, weights, paths, avail, capacity


def answer_bits(rates) -> list:
    """The answer's pairs, paths and rates, in its order, floats as their bytes."""
    return [(pair, [(p, bits(x)) for p, x in lst]) for pair, lst in rates.items()]


@pytest.mark.parametrize("seed", range(60))
def test_compiled_waterfill_equals_the_python_rounds_to_the_bit(seed):
    rng = np.random.default_rng(seed)
    classes, weights, paths, avail, capacity = random_case(rng)
    avail_ref = dict(avail)
    want = reference(classes, weights, paths, avail_ref, capacity, PathIndex(capacity))
    got = _waterfill_classes(classes, weights, paths, avail, capacity, PathIndex(capacity))
    assert answer_bits(got) == answer_bits(want)
    assert list(avail) == list(avail_ref)
    assert [bits(x) for x in avail.values()] == [bits(x) for x in avail_ref.values()]


def test_a_path_over_a_link_outside_the_capacities_gets_nothing():
    """Link (b, c) has no capacity: the pair's only path through it is blocked, the other
    pair's path (a, b) takes all of its 10 bytes/s at weight 1 (level 10 x 1)."""
    capacity = {("a", "b"): 10.0}
    paths = {("a", "c"): [("a", "b", "c")], ("a", "b"): [("a", "b")]}
    avail = dict(capacity)
    got = _waterfill_classes([[("a", "c"), ("a", "b")]], {("a", "c"): 1.0, ("a", "b"): 1.0},
                             paths, avail, capacity, PathIndex(capacity))  # fmt: skip
    assert got == {("a", "b"): [(("a", "b"), 10.0)]}
    assert avail == {("a", "b"): 0.0}
    assert list(path_links(("a", "b", "c"))) == [("a", "b"), ("b", "c")]


def test_two_classes_the_later_gets_what_the_earlier_left():
    """One 12 bytes/s link: class 1's pair (weight 1) takes it all on its only path; class
    2's pair, on the same link, then finds it full and gets nothing; a third pair of class
    2 on its own 6 bytes/s link gets 6."""
    capacity = {("a", "b"): 12.0, ("c", "d"): 6.0}
    paths = {("a", "b"): [("a", "b")], ("x", "y"): [("a", "b")], ("c", "d"): [("c", "d")]}
    avail = dict(capacity)
    classes = [[("a", "b")], [("x", "y"), ("c", "d")]]
    w = {("a", "b"): 1.0, ("x", "y"): 1.0, ("c", "d"): 0.5}
    got = _waterfill_classes(classes, w, paths, avail, capacity, PathIndex(capacity))
    assert got == {("a", "b"): [(("a", "b"), 12.0)], ("c", "d"): [(("c", "d"), 6.0)]}
    assert avail == {("a", "b"): 0.0, ("c", "d"): 0.0}


@pytest.mark.parametrize(
    ("classes", "weights", "paths", "message"),
    [
        ([[("a", "b")]], {("a", "b"): 0.0}, {("a", "b"): [("a", "b")]}, "weights"),
        ([[("a", "b")]], {("a", "b"): float("nan")}, {("a", "b"): [("a", "b")]}, "weights"),
        ([[("a", "b")], [("a", "b")]], {("a", "b"): 1.0}, {("a", "b"): [("a", "b")]}, "two"),
        ([[("a", "a")]], {("a", "a"): 1.0}, {("a", "a"): [("a",)]}, "without a link"),
    ],
)
def test_bad_input_is_refused_and_changes_nothing(classes, weights, paths, message):
    """A weight of 0 or NaN, a pair in two classes or a path of one node: a one-line
    ValueError, and the spare capacity left as it was."""
    capacity = {("a", "b"): 10.0}
    avail = dict(capacity)
    with pytest.raises(ValueError, match=message):
        _waterfill_classes(classes, weights, paths, avail, capacity, PathIndex(capacity))
    assert avail == capacity
