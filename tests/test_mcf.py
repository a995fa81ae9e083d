"""Max-min fair multi-commodity flow (terra_core/mcf.py) on hand-computed cases."""

import pytest

from terra_core.mcf import maxmin_mcf
from topologies import all_pairs_paths, load_topology, path_links

TRIANGLE = {("A", "B"): 10.0, ("B", "C"): 10.0, ("A", "C"): 10.0}


def totals(rates):
    return {key: sum(r for _, r in lst) for key, lst in rates.items()}


def link_loads(rates):
    load = {}
    for lst in rates.values():
        for path, r in lst:
            for link in path_links(path):
                load[link] = load.get(link, 0.0) + r
    return load


def test_two_path_commodity_and_single_path_commodity_share_fairly():
    # ac may use A-C or A-B-C; ab only A-B. Raising both together: ac takes A-C (10),
    # ab takes A-B (10); ac cannot grow further since A-B is full -> 10 and 10.
    rates = maxmin_mcf(
        {"ac": ([("A", "C"), ("A", "B", "C")], None), "ab": ([("A", "B")], None)}, TRIANGLE
    )
    assert totals(rates) == pytest.approx({"ac": 10.0, "ab": 10.0})
    assert rates["ab"][0][0] == ("A", "B")


def test_single_link_max_min_with_a_capped_demand():
    # Link of 12 shared by a (cap 2), b and c: a gets 2, the other 10 split 5 / 5.
    link = {("A", "B"): 12.0}
    demands = {"a": ([("A", "B")], 2.0), "b": ([("A", "B")], None), "c": ([("A", "B")], None)}
    assert totals(maxmin_mcf(demands, link)) == pytest.approx({"a": 2.0, "b": 5.0, "c": 5.0})


def test_parking_lot_is_fair_not_throughput_maximal():
    # Chain A-B-C of 10 each: AC crosses both links, AB and BC one each. Max throughput
    # would starve AC (AB=BC=10, total 20); max-min gives everyone 5 (total 15).
    chain = {("A", "B"): 10.0, ("B", "C"): 10.0}
    demands = {
        "ac": ([("A", "B", "C")], None),
        "ab": ([("A", "B")], None),
        "bc": ([("B", "C")], None),
    }
    assert totals(maxmin_mcf(demands, chain)) == pytest.approx({"ac": 5, "ab": 5, "bc": 5})


def test_cap_lets_others_take_the_rest():
    # ac capped at 3 uses A-C; ab alone on A-B gets all 10.
    rates = maxmin_mcf(
        {"ac": ([("A", "C"), ("A", "B", "C")], 3.0), "ab": ([("A", "B")], None)}, TRIANGLE
    )
    assert totals(rates) == pytest.approx({"ac": 3.0, "ab": 10.0})


def test_priority_class_is_served_first():
    # Class 0 (ac) takes both its paths, 10 + 10 = 20, leaving A-B full for class 1 (ab).
    rates = maxmin_mcf(
        {"ac": ([("A", "C"), ("A", "B", "C")], None), "ab": ([("A", "B")], None)},
        TRIANGLE,
        priority={"ac": 0, "ab": 1},
    )
    assert totals(rates) == pytest.approx({"ac": 20.0, "ab": 0.0})
    assert rates["ab"] == []


def test_paths_over_missing_or_zero_links_carry_nothing():
    cap = {("A", "B"): 10.0, ("B", "C"): 0.0}
    rates = maxmin_mcf({"x": ([("A", "B", "C"), ("A", "D", "C")], None), "y": ([], None)}, cap)
    assert rates == {"x": [], "y": []}


def test_round_limit_still_fills_the_links():
    # With one LP round only, the rest is frozen at the current level and one LP maximizes
    # their total: every link of the parking lot is still full.
    chain = {("A", "B"): 10.0, ("B", "C"): 10.0}
    demands = {
        "ac": ([("A", "B", "C")], None),
        "ab": ([("A", "B")], None),
        "bc": ([("B", "C")], None),
    }
    rates = maxmin_mcf(demands, chain, max_rounds=1)
    assert link_loads(rates) == pytest.approx(chain)
    assert min(totals(rates).values()) >= 5.0 * (1 - 1e-6)


def test_all_pairs_on_swan_stay_within_capacity_and_are_fair():
    topo = load_topology("swan")
    demands = {pair: (paths, None) for pair, paths in all_pairs_paths(topo, 4).items()}
    rates = maxmin_mcf(demands, dict(topo.capacity))
    for link, load in link_loads(rates).items():
        assert load <= topo.capacity[link] * (1 + 1e-9)
    for (src, dst), lst in rates.items():
        assert lst and all(p[0] == src and p[-1] == dst for p, _ in lst)


@pytest.mark.parametrize(
    "demands, capacity, match",
    [
        ({"x": ([("A", "B")], None)}, {("A", "B"): -1.0}, "capacity"),
        ({"x": ([("A", "B")], -2.0)}, {("A", "B"): 1.0}, "demand cap"),
        ({"x": ([("A",)], None)}, {("A", "B"): 1.0}, "two DCs"),
    ],
)
def test_bad_input_is_a_clear_value_error(demands, capacity, match):
    with pytest.raises(ValueError, match=match):
        maxmin_mcf(demands, capacity)


def test_weights_split_a_link_in_proportion():
    # Link of 12: weight 2 vs weight 1 -> 8 and 4 (raised together as 2t and t, t = 4).
    link = {("A", "B"): 12.0}
    demands = {"two": ([("A", "B")], None), "one": ([("A", "B")], None)}
    rates = maxmin_mcf(demands, link, weights={"two": 2.0, "one": 1.0})
    assert totals(rates) == pytest.approx({"two": 8.0, "one": 4.0})
    with pytest.raises(ValueError, match="weight"):
        maxmin_mcf(demands, link, weights={"two": 0.0})
