"""FlatRates (a round's rates as flat arrays) and the round's final merge that builds them:
the dict form they stand for, to the bit, against the reference round's merge."""

import random

import numpy as np
import pytest
import reference_round

from terra_core.flat_rates import FlatRates
from terra_core.path_masks import PathIndex
from terra_core.round_fair_share import ClassFill, fill_rates
from terra_core.round_rates import add_rates
from terra_core.scheduling_round import _add_fill, _finish

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


def _fill(keys, rows):
    """A ClassFill of (k, j, class, rate) rows, in the fill's order."""
    ks, js, cls, rates = (np.array(col) for col in zip(*rows, strict=True))
    return ClassFill(keys, ks, js, cls, rates.astype(float))


def test_step_6_rates_of_new_coflows_come_flat_in_the_order_the_dicts_would_take():
    ab, ac, ad = ("A", "B"), ("A", "C"), ("A", "D")
    paths = {ab: [("A", "B"), ("A", "C", "B")], ac: [("A", "C"), ("A", "B", "C")],
             ad: [("A", "D"), ("A", "B", "D")]}  # fmt: skip
    # class 0 (c0, with rates from step 4) has ab; class 1 (c1, new) has ac and ad, and ad
    # gets a rate on its path 0 before ac gets one on its path 1: ad comes first
    rows = [(0, 0, 0, 1.0), (2, 0, 1, 3.0), (1, 1, 1, 2.0), (2, 1, 1, 4.0)]
    fill = _fill([ab, ac, ad], rows)
    rates = {"c0": {ab: {("A", "B"): 5.0}}}
    owner = {ab: "c0", ac: "c1", ad: "c1"}
    tail = _add_fill(fill, ["c0", "c1"], paths, rates, PathIndex([]))
    assert rates == {"c0": {ab: {("A", "B"): 6.0}}}
    got = tail.as_dict()
    assert got == {"c1": {ad: [(("A", "D"), 3.0), (("A", "B", "D"), 4.0)],
                          ac: [(("A", "B", "C"), 2.0)]}}  # fmt: skip
    assert list(got["c1"]) == [ad, ac]
    dicts: dict = {"c0": {ab: {("A", "B"): 5.0}}}  # the dict route: the same order
    for pair, lst in fill_rates(fill, paths).items():
        add_rates(dicts.setdefault(owner[pair], {}), pair, lst)
    assert list(dicts["c1"]) == [ad, ac] and list(dicts["c1"][ad]) == [("A", "D"), ("A", "B", "D")]


def test_a_pair_whose_paths_repeat_goes_through_the_dicts():
    ab = ("A", "B")
    paths = {ab: [("A", "B"), ("A", "B")]}
    fill = _fill([ab], [(0, 0, 0, 1.0), (0, 1, 0, 2.0)])
    rates: dict = {}
    tail = _add_fill(fill, ["c"], paths, rates, PathIndex([]))
    assert tail is None and rates == {"c": {ab: {("A", "B"): 3.0}}}
