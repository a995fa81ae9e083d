"""FlatRates (a round's rates as flat arrays) and the round's final merge that builds them:
the dict form they stand for, to the bit, against the reference round's merge."""

import random

import numpy as np
import pytest
import reference_round

from terra_core.flat_rates import FlatRates
from terra_core.path_masks import PathIndex
from terra_core.scheduling_round import _finish

G = 1e9


def _random_rates(rng: random.Random, dcs: list[str]) -> dict:
    """{cid: {pair: {path: bytes/s}}}: pairs shared between coflows, rates > 0 (the
    reference divides by every link's load), some coflows without a pair."""
    pairs = [(a, b) for a in dcs for b in dcs if a != b]
    paths = {pair: [pair, (pair[0], *[d for d in dcs if d not in pair][:1], pair[1])]
             for pair in pairs}  # fmt: skip
    rates = {}
    for c in range(rng.randint(1, 6)):
        mine = {}
        for pair in rng.sample(pairs, rng.randint(0, 4)):
            mine[pair] = {p: rng.choice([rng.random() * G + 1.0, G / 3])
                          for p in rng.sample(paths[pair], rng.randint(1, 2))}  # fmt: skip
        rates[f"c{c}"] = mine
    return rates


@pytest.mark.parametrize("seed", range(40))
def test_finish_gives_the_reference_merge_to_the_bit(seed):
    rng = random.Random(seed)
    dcs = ["A", "B", "C", "D"]
    rates = _random_rates(rng, dcs)
    links = [(a, b) for a in dcs for b in dcs if a != b]
    # tight capacities: some links are loaded over them and their paths scaled down
    capacity = {link: rng.choice([G / 2, G, 3 * G]) for link in links}
    flat = _finish(rates, capacity, PathIndex(links))
    want = reference_round._finish(rates, capacity)
    got = flat.as_dict()
    assert got == want
    assert [list(per) for per in got.values()] == [list(per) for per in want.values()]


def test_a_link_missing_from_the_index_has_no_capacity():
    rates = {"c": {("A", "B"): {("A", "B"): 5.0, ("A", "C", "B"): 4.0}}}
    flat = _finish(rates, {("A", "B"): 10.0, ("A", "C"): 10.0}, PathIndex([("A", "B"), ("A", "C")]))
    assert flat.as_dict() == {"c": {("A", "B"): [(("A", "B"), 5.0), (("A", "C", "B"), 0.0)]}}


def test_from_dict_keeps_every_entry_and_as_dict_drops_empty_pairs_and_coflows():
    answer = {"x": {("A", "B"): [(("A", "B"), 0.0), (("A", "B"), float("nan"))]},
              "y": {("B", "C"): [(("B", "C"), 2.0)]}}  # fmt: skip
    flat = FlatRates.from_dict(answer)
    assert flat.coflows == ["x", "y"] and flat.pairs == [("A", "B"), ("B", "C")]
    assert flat.counts.tolist() == [2, 1] and len(flat.rates) == 3
    empty = FlatRates(["x", "y", "z"], np.array([2, 1, 0]), [("A", "B"), ("A", "C"), ("B", "C")],
                      np.array([1, 0, 0]), [("A", "B")], np.array([1.5]))  # fmt: skip
    assert empty.as_dict() == {"x": {("A", "B"): [(("A", "B"), 1.5)]}}
    assert empty.coflow_of_segment().tolist() == [0, 0, 1]
    assert empty.segment_of_rate().tolist() == [0]


def test_lengths_that_do_not_add_up_are_refused():
    with pytest.raises(ValueError, match="do not add up"):
        FlatRates(["x"], np.array([1]), [("A", "B")], np.array([2]), [("A", "B")], np.array([1.0]))
