"""Max-min fair multi-commodity flow (terra_core/mcf.py) on hand-computed cases."""

import functools

import numpy as np
import pytest

from terra_core.mcf import McfWarmStart, _CompactMcfLp, _McfLp, maxmin_mcf
from topologies import all_pairs_paths, load_topology, path_links

TRIANGLE = {("A", "B"): 10.0, ("B", "C"): 10.0, ("A", "C"): 10.0}


@pytest.fixture(params=[False, True], ids=["two-row", "compact"])
def maxmin(request):
    """maxmin_mcf with either LP (the hand-computed totals hold for both)."""
    return functools.partial(maxmin_mcf, compact=request.param)


def totals(rates):
    return {key: sum(r for _, r in lst) for key, lst in rates.items()}


def link_loads(rates):
    load = {}
    for lst in rates.values():
        for path, r in lst:
            for link in path_links(path):
                load[link] = load.get(link, 0.0) + r
    return load


def test_two_path_commodity_and_single_path_commodity_share_fairly(maxmin):
    # ac may use A-C or A-B-C; ab only A-B. Raising both together: ac takes A-C (10),
    # ab takes A-B (10); ac cannot grow further since A-B is full -> 10 and 10.
    rates = maxmin(
        {"ac": ([("A", "C"), ("A", "B", "C")], None), "ab": ([("A", "B")], None)}, TRIANGLE
    )
    assert totals(rates) == pytest.approx({"ac": 10.0, "ab": 10.0})
    assert rates["ab"][0][0] == ("A", "B")


def test_single_link_max_min_with_a_capped_demand(maxmin):
    # Link of 12 shared by a (cap 2), b and c: a gets 2, the other 10 split 5 / 5.
    link = {("A", "B"): 12.0}
    demands = {"a": ([("A", "B")], 2.0), "b": ([("A", "B")], None), "c": ([("A", "B")], None)}
    assert totals(maxmin(demands, link)) == pytest.approx({"a": 2.0, "b": 5.0, "c": 5.0})


def test_parking_lot_is_fair_not_throughput_maximal(maxmin):
    # Chain A-B-C of 10 each: AC crosses both links, AB and BC one each. Max throughput
    # would starve AC (AB=BC=10, total 20); max-min gives everyone 5 (total 15).
    chain = {("A", "B"): 10.0, ("B", "C"): 10.0}
    demands = {
        "ac": ([("A", "B", "C")], None),
        "ab": ([("A", "B")], None),
        "bc": ([("B", "C")], None),
    }
    assert totals(maxmin(demands, chain)) == pytest.approx({"ac": 5, "ab": 5, "bc": 5})


def test_cap_lets_others_take_the_rest(maxmin):
    # ac capped at 3 uses A-C; ab alone on A-B gets all 10.
    rates = maxmin(
        {"ac": ([("A", "C"), ("A", "B", "C")], 3.0), "ab": ([("A", "B")], None)}, TRIANGLE
    )
    assert totals(rates) == pytest.approx({"ac": 3.0, "ab": 10.0})


def test_priority_class_is_served_first(maxmin):
    # Class 0 (ac) takes both its paths, 10 + 10 = 20, leaving A-B full for class 1 (ab).
    rates = maxmin(
        {"ac": ([("A", "C"), ("A", "B", "C")], None), "ab": ([("A", "B")], None)},
        TRIANGLE,
        priority={"ac": 0, "ab": 1},
    )
    assert totals(rates) == pytest.approx({"ac": 20.0, "ab": 0.0})
    assert rates["ab"] == []


def test_paths_over_missing_or_zero_links_carry_nothing(maxmin):
    cap = {("A", "B"): 10.0, ("B", "C"): 0.0}
    rates = maxmin({"x": ([("A", "B", "C"), ("A", "D", "C")], None), "y": ([], None)}, cap)
    assert rates == {"x": [], "y": []}


def test_round_limit_still_fills_the_links(maxmin):
    # With one LP round only, the rest is frozen at the current level and one LP maximizes
    # their total: every link of the parking lot is still full.
    chain = {("A", "B"): 10.0, ("B", "C"): 10.0}
    demands = {
        "ac": ([("A", "B", "C")], None),
        "ab": ([("A", "B")], None),
        "bc": ([("B", "C")], None),
    }
    rates = maxmin(demands, chain, max_rounds=1)
    assert link_loads(rates) == pytest.approx(chain)
    assert min(totals(rates).values()) >= 5.0 * (1 - 1e-6)


def test_all_pairs_on_swan_stay_within_capacity_and_are_fair(maxmin):
    topo = load_topology("swan")
    demands = {pair: (paths, None) for pair, paths in all_pairs_paths(topo, 4).items()}
    rates = maxmin(demands, dict(topo.capacity))
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
def test_bad_input_is_a_clear_value_error(demands, capacity, match, maxmin):
    with pytest.raises(ValueError, match=match):
        maxmin(demands, capacity)


def test_weights_split_a_link_in_proportion(maxmin):
    # Link of 12: weight 2 vs weight 1 -> 8 and 4 (raised together as 2t and t, t = 4).
    link = {("A", "B"): 12.0}
    demands = {"two": ([("A", "B")], None), "one": ([("A", "B")], None)}
    rates = maxmin(demands, link, weights={"two": 2.0, "one": 1.0})
    assert totals(rates) == pytest.approx({"two": 8.0, "one": 4.0})
    with pytest.raises(ValueError, match="weight"):
        maxmin(demands, link, weights={"two": 0.0})


def test_capped_commodity_freezes_at_its_cap_and_the_other_takes_the_rest(maxmin):
    # a (cap 2) only on A-B; b on A-B or A-C-B. a is held by its cap at 2; b takes the rest
    # of A-B (12 - 2 = 10) plus A-C-B (min(10, 10) = 10): 20.
    capacity = {("A", "B"): 12.0, ("A", "C"): 10.0, ("C", "B"): 10.0}
    demands = {"a": ([("A", "B")], 2.0), "b": ([("A", "B"), ("A", "C", "B")], None)}
    assert totals(maxmin(demands, capacity)) == pytest.approx({"a": 2.0, "b": 20.0})


def test_compact_lp_has_one_row_per_commodity_and_cap_rows_only_where_finite():
    # Links numbered by first use: A-B 0, A-C 1, C-B 2; rows C_a 3, C_b 4; a's cap row D_a 5.
    # Columns: (a, A-B) in rows 0, 3, 5; (b, A-B) in 0, 4; (b, A-C-B) in 1, 2, 4.
    capacity = {("A", "B"): 12.0, ("A", "C"): 10.0, ("C", "B"): 10.0}
    demands = {"a": ([("A", "B")], 2.0), "b": ([("A", "B"), ("A", "C", "B")], None)}
    lp = _CompactMcfLp(demands, capacity, {})
    assert (lp.h.getNumRow(), lp.h.getNumCol()) == (6, 3)
    starts, index = lp._x_entries(lp.c_row + lp.owner, np.array([5, -1])[lp.owner])
    assert starts.tolist() == [0, 3, 5, 8]
    assert index.tolist() == [0, 3, 5, 0, 4, 1, 2, 4]


def test_warm_start_carries_over_calls_with_the_same_totals():
    # Triangle of 10s, one McfWarmStart for three calls:
    # 1) ac (A-C or A-B-C) and ab (A-B): ac 10 on A-C, ab 10 on A-B.
    # 2) bc (B-C) joins: everyone 10 (ac would need A-B or B-C to go beyond).
    # 3) A-C down to 4: ac = 4 + y over A-B-C, ab = bc = 10 - y; equal at y = 3, so 7 each.
    warm = McfWarmStart()
    ac = ([("A", "C"), ("A", "B", "C")], None)
    first = {"ac": ac, "ab": ([("A", "B")], None)}
    got = maxmin_mcf(first, TRIANGLE, compact=True, warm=warm)
    assert totals(got) == pytest.approx({"ac": 10.0, "ab": 10.0})
    assert warm.keys.keys() == {"ac", "ab"}
    second = {**first, "bc": ([("B", "C")], None)}
    got = maxmin_mcf(second, TRIANGLE, compact=True, warm=warm)
    assert totals(got) == pytest.approx({"ac": 10.0, "ab": 10.0, "bc": 10.0})
    third = {**TRIANGLE, ("A", "C"): 4.0}
    got = maxmin_mcf(second, third, compact=True, warm=warm)
    assert totals(got) == pytest.approx({"ac": 7.0, "ab": 7.0, "bc": 7.0})
    for link, load in link_loads(got).items():
        assert load <= third[link] * (1 + 1e-9)


def ring_of_four():
    """Directed 4-ring A→B→C→D→A at 12 one way, 6 the other (D→C→B→A→D); every ordered
    pair may go either way round."""
    ring = "ABCD"
    capacity, demands = {}, {}
    for i, u in enumerate(ring):
        capacity[(u, ring[(i + 1) % 4])] = 12.0
        capacity[(u, ring[(i - 1) % 4])] = 6.0
        for d in (1, 2, 3):
            cw = tuple(ring[(i + s) % 4] for s in range(d + 1))
            ccw = tuple(ring[(i - s) % 4] for s in range(4 - d + 1))
            demands[(u, cw[-1])] = ([cw, ccw], None)
    return demands, capacity


@pytest.mark.parametrize("warm", [None, McfWarmStart()], ids=["cold", "warm"])
def test_degenerate_ring_freezes_every_pair_at_one_level(maxmin, warm):
    # 12 pairs; the cheapest way round costs a pair at clockwise distance d
    # min(d, 4 - d) hops: 4 pairs x (1 + 2 + 1) hops = 16 hop-units per unit of level
    # on 4 x 12 + 4 x 6 = 72 capacity, so t <= 4.5. t = 4.5 is feasible (d = 1 clockwise,
    # d = 3 the other way, d = 2: 3.75 clockwise and 0.75 the other way fill both rings
    # exactly), and every link is then full, so nobody gets more: 4.5 each (a degenerate LP:
    # every pair is pinned at the first level, however many rounds the duals take to show it).
    demands, capacity = ring_of_four()
    kwargs = {"warm": warm} if maxmin.keywords["compact"] else {}
    for _ in range(2):  # the second call starts warm from the first
        rates = maxmin(demands, capacity, **kwargs)
        assert totals(rates) == pytest.approx(dict.fromkeys(demands, 4.5), rel=1e-9)
        for link, load in link_loads(rates).items():
            assert load <= capacity[link] * (1 + 1e-9)


def test_only_the_compact_lp_turns_off_bound_perturbation():
    # The compact LP (swan-mcf) solves without HiGHS's primal bound perturbation (fewer
    # iterations on degenerate rounds); the two-row LP (Terra's round, whose split over
    # paths shows in CCTs) keeps HiGHS's default.
    demands, capacity = ring_of_four()
    option = "primal_simplex_bound_perturbation_multiplier"
    assert _CompactMcfLp(demands, capacity, {}).h.getOptionValue(option)[1] == 0.0
    assert _McfLp(demands, capacity, {}).h.getOptionValue(option)[1] == 1.0


def chain_wan():
    """A-B at 4, B-C and C-D at 10; ab (A-B), ac (A-B-C), bc (B-C), cd (C-D).
    Progressive filling: round 1, ab and ac share A-B: 2 each, A-B full; round 2, bc
    takes what ac left of B-C: 10 - 2 = 8; round 3, cd alone on C-D: 10."""
    capacity = {("A", "B"): 4.0, ("B", "C"): 10.0, ("C", "D"): 10.0}
    demands = {
        "ab": ([("A", "B")], None),
        "ac": ([("A", "B", "C")], None),
        "bc": ([("B", "C")], None),
        "cd": ([("C", "D")], None),
    }
    return demands, capacity


def test_a_call_without_a_pair_takes_the_rounds_before_it_froze_from_the_last_call():
    # cd froze in round 3, so without it rounds 1-2 (ab, ac at 2; bc at 8) are taken from
    # the first call, and every pair is frozen after them: one solve, for the split.
    # Without the first call the same pairs take 2 LPs (the two levels 2 and 8).
    demands, capacity = chain_wan()
    warm = McfWarmStart()
    stats = {}
    got = maxmin_mcf(demands, capacity, compact=True, warm=warm, stats=stats)
    assert totals(got) == pytest.approx({"ab": 2.0, "ac": 2.0, "bc": 8.0, "cd": 10.0})
    assert stats["lps"] == 3
    assert [sorted(r.frozen) for r in warm.record.rounds] == [["ab", "ac"], ["bc"], ["cd"]]
    fewer = {k: v for k, v in demands.items() if k != "cd"}
    stats, cold = {}, {}
    got = maxmin_mcf(fewer, capacity, compact=True, warm=warm, stats=stats)
    want = maxmin_mcf(fewer, capacity, compact=True, stats=cold)
    assert totals(got) == pytest.approx({"ab": 2.0, "ac": 2.0, "bc": 8.0})
    assert totals(want) == pytest.approx(totals(got))
    assert (stats["lps"], cold["lps"]) == (1, 2)
    # this call's record holds the two rounds it took: without bc (froze in round 2),
    # round 1 is taken and ab, ac are frozen: one solve again
    stats = {}
    got = maxmin_mcf(
        {k: fewer[k] for k in ("ab", "ac")}, capacity, compact=True, warm=warm, stats=stats
    )
    assert totals(got) == pytest.approx({"ab": 2.0, "ac": 2.0})
    assert stats["lps"] == 1


@pytest.mark.parametrize(
    "change",
    ["none", "pair added", "first-round pair dropped", "capacity", "paths", "cap", "weights"],
)
def test_rounds_are_taken_only_for_a_subset_of_the_last_calls_pairs_on_the_same_wan(change):
    # After the 4-pair call, {ab, ac, bc} takes rounds 1-2 (one solve, as above); with
    # any of these changes it is solved from its first round, as without the warm start,
    # and gets its own max-min totals.
    demands, capacity = chain_wan()
    warm = McfWarmStart()
    first = dict(demands)
    if change == "pair added":  # the last call had no bc
        first.pop("bc")
    if change == "paths":  # the last call's bc could also go B-D-C (at 1): 9
        first["bc"] = ([("B", "C"), ("B", "D", "C")], None)
        capacity = {**capacity, ("B", "D"): 1.0, ("D", "C"): 1.0}
    maxmin_mcf(first, capacity, compact=True, warm=warm)
    second = {k: demands[k] for k in ("ab", "ac", "bc")}
    want, want_lps, kwargs = {"ab": 2.0, "ac": 2.0, "bc": 8.0}, 2, {}
    if change == "none":
        want_lps = 1
    elif change == "first-round pair dropped":  # ab froze in round 1: ac alone on A-B
        second = {k: demands[k] for k in ("ac", "bc", "cd")}
        want, want_lps = {"ac": 4.0, "bc": 6.0, "cd": 10.0}, 3
    elif change == "capacity":  # A-B at 6: ab, ac at 3, bc at 7
        capacity = {**capacity, ("A", "B"): 6.0}
        want = {"ab": 3.0, "ac": 3.0, "bc": 7.0}
    elif change == "paths":  # bc on B-C alone again: 8 (its links are the last call's)
        pass
    elif change == "cap":  # bc capped at 5
        second["bc"] = ([("B", "C")], 5.0)
        want["bc"] = 5.0
    elif change == "weights":  # bc at twice the level: 4 in round 1, then 8
        kwargs["weights"] = {"bc": 2.0}
    stats = {}
    got = maxmin_mcf(second, capacity, compact=True, warm=warm, stats=stats, **kwargs)
    assert totals(got) == pytest.approx(want)
    assert stats["lps"] == want_lps


def test_a_failed_solve_after_rounds_taken_solves_the_call_afresh(monkeypatch):
    # The solve that follows the rounds taken from the last call fails (forced here): the
    # call is solved again from its first round (2 LPs) and gets its max-min totals, not
    # the rate 0 of a failed fill.
    demands, capacity = chain_wan()
    warm = McfWarmStart()
    maxmin_mcf(demands, capacity, compact=True, warm=warm)
    solve = _CompactMcfLp._solve
    failed = []

    def fail_after_taken_rounds(self):
        if self.h.getNumCol() > len(self.cols) + 1 and self.solves == 0 and not failed:
            failed.append(True)  # (the first solve of an LP with taken rounds' Δ columns)
            self.solves += 1
            return False
        return solve(self)

    monkeypatch.setattr(_CompactMcfLp, "_solve", fail_after_taken_rounds)
    stats = {}
    fewer = {k: v for k, v in demands.items() if k != "cd"}
    got = maxmin_mcf(fewer, capacity, compact=True, warm=warm, stats=stats)
    assert failed
    assert totals(got) == pytest.approx({"ab": 2.0, "ac": 2.0, "bc": 8.0})
    assert stats["lps"] == 2
    assert warm.record is not None  # the fresh solve left its rounds


def test_rounds_taken_count_towards_max_rounds():
    # With bd (B-C-D) added to the chain: ab, ac 2 (A-B full); bc, bd 4 (B-C full); cd 6.
    # Without cd and with max_rounds 1, only round 1 is taken, then the round limit's last
    # LP (total rate, everyone at least 2) runs, as in a call without a warm start.
    demands, capacity = chain_wan()
    demands["bd"] = ([("B", "C", "D")], None)
    warm = McfWarmStart()
    got = maxmin_mcf(demands, capacity, compact=True, warm=warm)
    assert totals(got) == pytest.approx({"ab": 2.0, "ac": 2.0, "bc": 4.0, "bd": 4.0, "cd": 6.0})
    fewer = {k: v for k, v in demands.items() if k != "cd"}
    warm_got = maxmin_mcf(fewer, capacity, max_rounds=1, compact=True, warm=warm)
    cold_got = maxmin_mcf(fewer, capacity, max_rounds=1, compact=True)
    assert totals(warm_got) == pytest.approx(totals(cold_got))


def test_a_warm_start_recomputes_a_commodity_whose_paths_or_open_links_changed():
    # The warm start keeps each commodity's usable paths. ab may take A-B or A-C-B. Call 1:
    # both paths, A-B at 4 and A-C, C-B at 10: 14. Call 2: the caller gives ab only A-B
    # (same key, new paths): 4, not 14. Call 3: A-B closed (capacity 0): the kept
    # entry is for other open links, so ab's only column is A-C-B: 10. Call 4: a path of one DC
    # is refused although the key was kept.
    capacity = {("A", "B"): 4.0, ("A", "C"): 10.0, ("C", "B"): 10.0}
    warm = McfWarmStart()
    both = [("A", "B"), ("A", "C", "B")]
    assert totals(maxmin_mcf({"ab": (both, None)}, capacity, compact=True, warm=warm)) == (
        pytest.approx({"ab": 14.0})
    )
    got = maxmin_mcf({"ab": ([("A", "B")], None)}, capacity, compact=True, warm=warm)
    assert totals(got) == pytest.approx({"ab": 4.0})
    closed = {**capacity, ("A", "B"): 0.0}
    assert _CompactMcfLp({"ab": (both, None)}, closed, {}, warm).cols == [(0, ("A", "C", "B"))]
    got = maxmin_mcf({"ab": (both, None)}, closed, compact=True, warm=warm)
    assert got == {"ab": [(("A", "C", "B"), pytest.approx(10.0))]}
    with pytest.raises(ValueError, match="at least two DCs"):
        maxmin_mcf({"ab": ([("A",)], None)}, capacity, compact=True, warm=warm)


def test_the_lp_of_a_call_with_a_warm_start_is_the_lp_without_it():
    # The same columns, link rows (numbered in order of first use) and entries whether a
    # call builds them or looks them up in the warm start's kept commodities, on ATT's
    # pairs taken in two orders and with a link closed.
    topo = load_topology("att")
    paths = all_pairs_paths(topo, 4)
    capacity = dict(topo.capacity)
    warm = McfWarmStart()
    pairs = sorted(paths)[:300]
    closed = {**capacity, next(iter(capacity)): 0.0}
    for order, caps in ((pairs, capacity), (pairs[::-1], capacity), (pairs, closed)):
        demands = {pair: (paths[pair], None) for pair in order}
        _CompactMcfLp(demands, caps, {}, warm)  # fills the kept commodities
        kept, fresh = _CompactMcfLp(demands, caps, {}, warm), _CompactMcfLp(demands, caps, {})
        assert kept.cols == fresh.cols
        assert list(kept.link_rows.items()) == list(fresh.link_rows.items())
        for name in ("entry_row", "link_count", "entry_col", "owner", "entry_start"):
            np.testing.assert_array_equal(getattr(kept, name), getattr(fresh, name))
