"""Optimization (1) (terra_core/min_cct.py) on hand-computed cases (docs/design.md 4.1)."""

import math
import random

import pytest

from terra_core.min_cct import DualBound, min_cct
from topologies import all_pairs_paths, load_topology, path_links

# Triangle A, B, C: every directed link carries 10 bytes/s.
TRIANGLE = {(u, v): 10.0 for u in "ABC" for v in "ABC" if u != v}
PATHS = {
    ("A", "C"): [("A", "C"), ("A", "B", "C")],
    ("A", "B"): [("A", "B"), ("A", "C", "B")],
    ("B", "C"): [("B", "C"), ("B", "A", "C")],
}


def totals(res):
    return {pair: sum(r for _, r in lst) for pair, lst in res.rates.items()}


@pytest.mark.parametrize("shortcuts", [True, False])
def test_one_flowgroup_needs_both_paths(shortcuts):
    # 100 bytes A->C over A-C (10 B/s) and A-B-C (10 B/s): 20 B/s in all, Γ = 100/20 = 5 s.
    res = min_cct({("A", "C"): 100.0}, PATHS, TRIANGLE, use_shortcuts=shortcuts)
    assert res.gamma_s == pytest.approx(5.0)
    assert dict(res.rates[("A", "C")]) == pytest.approx({("A", "B", "C"): 10.0, ("A", "C"): 10.0})


@pytest.mark.parametrize("shortcuts", [True, False])
def test_flowgroups_on_one_shared_link(shortcuts):
    # A->B 100 bytes on A-B, A->C 50 bytes on A-B-C: link A-B carries λ·(100 + 50) <= 10,
    # so λ = 1/15 and Γ = 15 s; rates 100/15 = 6.667 and 50/15 = 3.333 B/s.
    paths = {("A", "B"): [("A", "B")], ("A", "C"): [("A", "B", "C")]}
    res = min_cct({("A", "B"): 100.0, ("A", "C"): 50.0}, paths, TRIANGLE, use_shortcuts=shortcuts)
    assert res.gamma_s == pytest.approx(15.0)
    assert totals(res) == pytest.approx({("A", "B"): 100 / 15, ("A", "C"): 50 / 15})
    assert res.lp_solved is not shortcuts


def test_two_flowgroups_competing_for_the_source():
    # A->C 100 and A->B 100: A has 20 B/s out (A-B, A-C), the coflow needs 200 bytes out of A,
    # so Γ >= 10; each FlowGroup on its direct link reaches it: Γ = 10, 10 B/s each.
    res = min_cct({("A", "C"): 100.0, ("A", "B"): 100.0}, PATHS, TRIANGLE)
    assert res.gamma_s == pytest.approx(10.0)
    assert totals(res) == pytest.approx({("A", "C"): 10.0, ("A", "B"): 10.0})
    assert res.lp_solved


def test_full_link_means_infinite_gamma():
    cap = {**TRIANGLE, ("A", "C"): 0.0, ("A", "B"): 0.0}
    res = min_cct({("A", "C"): 100.0}, PATHS, cap)
    assert math.isinf(res.gamma_s) and res.rates == {}


def test_no_volume_is_zero_gamma_and_intra_dc_is_ignored():
    assert min_cct({("A", "A"): 5.0, ("A", "C"): 0.0}, PATHS, TRIANGLE).gamma_s == 0.0


def test_bad_input():
    with pytest.raises(ValueError, match="A->D"):
        min_cct({("A", "D"): 1.0}, PATHS, TRIANGLE)
    with pytest.raises(ValueError, match="finite"):
        min_cct({("A", "C"): float("nan")}, PATHS, TRIANGLE)


@pytest.mark.parametrize("name", ["swan", "att"])
def test_random_coflows_lp_agrees_with_shortcuts_and_respects_capacity(name):
    topo = load_topology(name)
    paths = all_pairs_paths(topo, 4)
    cap = dict(topo.capacity)
    rng = random.Random(7)
    for n in [1, 1, 2, 5, 12]:
        volumes = {p: rng.uniform(1e6, 1e11) for p in rng.sample(sorted(paths), n)}
        lp = min_cct(volumes, paths, cap, use_shortcuts=False)
        fast = min_cct(volumes, paths, cap)
        assert fast.gamma_s == pytest.approx(lp.gamma_s, rel=1e-7)
        load = {}
        for pair, lst in lp.rates.items():
            # the minimal allocation: FlowGroup k gets exactly d_k / Γ
            assert sum(r for _, r in lst) == pytest.approx(volumes[pair] / lp.gamma_s, rel=1e-9)
            for path, r in lst:
                assert (path[0], path[-1]) == pair
                for link in path_links(path):
                    load[link] = load.get(link, 0.0) + r
        assert all(v <= cap[link] * (1 + 1e-6) for link, v in load.items())


@pytest.mark.parametrize("shortcuts", [True, False])
def test_dual_bound_is_tight_at_the_solved_volumes_and_a_lower_bound_elsewhere(shortcuts):
    topo = load_topology("swan")
    paths = all_pairs_paths(topo, 4)
    cap = dict(topo.capacity)
    rng = random.Random(11)
    for n in [1, 3, 8]:
        volumes = {p: rng.uniform(1e6, 1e10) for p in rng.sample(sorted(paths), n)}
        res = min_cct(volumes, paths, cap, use_shortcuts=shortcuts)
        bound = DualBound.build(volumes, paths, cap, res.prices)
        assert bound.gamma(volumes) == pytest.approx(res.gamma_s, rel=1e-7)  # strong duality
        for _ in range(5):
            other = {p: v * rng.uniform(0.0, 1.0) for p, v in volumes.items()}
            assert bound.gamma(other) <= min_cct(other, paths, cap).gamma_s * (1 + 1e-7)


def test_dual_bound_by_hand():
    # Single link A-B of 10 B/s, FlowGroup A->B: price 1 on A-B, m = 1, Σ c y = 10, so
    # Γ(d) >= d / 10 -- exact here: 50 bytes -> 5 s.
    res = min_cct({("A", "B"): 100.0}, {("A", "B"): [("A", "B")]}, {("A", "B"): 10.0})
    bound = DualBound.build(
        [("A", "B")], {("A", "B"): [("A", "B")]}, {("A", "B"): 10.0}, res.prices
    )
    assert bound.gamma({("A", "B"): 50.0}) == pytest.approx(5.0)


def test_flowgroup_off_the_bottleneck_takes_its_shortest_path(monkeypatch):
    # A->B 100 bytes has only A-B (10 B/s): λ <= 10/100, Γ = 10 s. B->C (10 bytes) needs
    # only 10/10 = 1 B/s, and any split of it over B-A-C (2 links) and B-C (1 link) is
    # optimal for λ. The second stage takes the one with the fewest link-bytes: 1 B/s on B-C
    # alone (1 link-byte/s, against 2 over B-A-C), leaving B-A and A-C free for others.
    paths = {("A", "B"): [("A", "B")], ("B", "C"): [("B", "A", "C"), ("B", "C")]}
    volumes = {("A", "B"): 100.0, ("B", "C"): 10.0}
    res = min_cct(volumes, paths, TRIANGLE)
    assert res.gamma_s == pytest.approx(10.0)
    assert dict(res.rates[("B", "C")]) == pytest.approx({("B", "C"): 1.0})
    assert res.prices.keys() == {("A", "B")}  # the prices still come from Optimization (1)


def test_flowgroup_below_solver_tolerance_still_gets_its_rate():
    # B->C is 1e-9 of the largest volume, under HiGHS' feasibility tolerance in the scaled
    # LP, so the second stage may zero it; it must still get d·λ = 1e3 · 10/1e12 = 1e-8 B/s.
    paths = {("A", "B"): [("A", "B")], ("B", "C"): [("B", "A", "C"), ("B", "C")]}
    res = min_cct({("A", "B"): 1e12, ("B", "C"): 1e3}, paths, TRIANGLE)
    assert res.gamma_s == pytest.approx(1e11)
    assert sum(r for _, r in res.rates[("B", "C")]) == pytest.approx(1e-8)


def test_path_over_a_full_link_is_dropped_and_repeated_paths_count_once():
    # A->C over A-C (full: 0 B/s), A-B-C (10 B/s, listed twice) and B's way back is not a
    # path. Only A-B-C is usable, once: 100 bytes at 10 B/s, Γ = 10 s, all on A-B-C (the
    # LP, shortcuts off, sees one column; with a repeat it would still give 10 B/s in all).
    cap = {**TRIANGLE, ("A", "C"): 0.0}
    paths = {("A", "C"): [("A", "C"), ("A", "B", "C"), ("A", "B", "C")]}
    res = min_cct({("A", "C"): 100.0}, paths, cap, use_shortcuts=False)
    assert res.gamma_s == pytest.approx(10.0)
    assert res.rates[("A", "C")] == [(("A", "B", "C"), pytest.approx(10.0))]
    # A link missing from the capacities counts as full too.
    del cap[("B", "C")]
    assert math.isinf(min_cct({("A", "C"): 100.0}, paths, cap, use_shortcuts=False).gamma_s)


def test_link_rows_shared_by_flowgroups_in_any_order():
    # A->C 100 bytes on A-B-C; B->C 100 bytes on B-C or B-A-C. Link B-C is met first by
    # A->C's column, B-A by B->C's second. By hand: A->C has only A-B-C, so B-C carries
    # 100λ from it plus B->C's share x there: 100λ + x <= 10; B->C's other path B-A-C
    # (B-A, A-C: 10 B/s each) takes 100λ - x <= 10. Adding: 200λ <= 20, λ = 0.1, Γ = 10 s,
    # x = 0: B->C all on B-A-C, A->C 10 B/s on A-B-C.
    paths = {("A", "C"): [("A", "B", "C")], ("B", "C"): [("B", "C"), ("B", "A", "C")]}
    res = min_cct({("A", "C"): 100.0, ("B", "C"): 100.0}, paths, TRIANGLE)
    assert res.gamma_s == pytest.approx(10.0)
    assert totals(res) == pytest.approx({("A", "C"): 10.0, ("B", "C"): 10.0})
    split = dict(res.rates[("B", "C")])
    assert split[("B", "A", "C")] == pytest.approx(10.0)
    assert split.get(("B", "C"), 0.0) == pytest.approx(0.0, abs=1e-6)
    assert ("B", "C") in res.prices  # the shared link is the bottleneck


def test_dual_bound_pairs_off_the_priced_links_cost_nothing():
    # Prices y(A-B) = 1, y(B-C) = 0.5: A->C's paths cost 1.5 (A-B-C) and 0 (A-C, unpriced),
    # so m = 0; C->A crosses no priced link (m = 0); A->B (path A-B only) costs 1.
    # Σ c y = 10 + 5 = 15.
    prices = {("A", "B"): 1.0, ("B", "C"): 0.5}
    paths = {**PATHS, ("A", "B"): [("A", "B")], ("C", "A"): [("C", "A"), ("C", "B", "A")]}
    bound = DualBound.build([("A", "C"), ("C", "A"), ("A", "B")], paths, TRIANGLE, prices)
    assert bound.path_price == {("A", "C"): 0.0, ("C", "A"): 0.0, ("A", "B"): 1.0}
    assert bound.capacity_price == 15.0
    assert bound.gamma({("A", "B"): 30.0, ("C", "A"): 99.0}) == 2.0  # 30 x 1 / 15


def test_gamma_only_lp_gives_the_same_gamma_and_prices_without_rates():
    # ATT, random coflows on a random residual: the LP solved for Γ only (the ordering LPs
    # of a round) has Γ and prices equal to the bit to the full solve's, and no rates.
    topo = load_topology("att")
    paths = all_pairs_paths(topo, 4)
    rng = random.Random(5)
    cap = {e: c * rng.uniform(0.05, 1.0) for e, c in topo.capacity.items()}
    pairs = sorted(paths)
    for _ in range(20):
        vol = {pair: rng.uniform(1e6, 1e9) for pair in rng.sample(pairs, rng.randint(2, 6))}
        full = min_cct(vol, paths, cap)
        only = min_cct(vol, paths, cap, fewest_link_bytes=False)
        assert only.lp_solved and full.lp_solved
        assert only.gamma_s == full.gamma_s and only.prices == full.prices
        assert only.rates == {} and full.rates


def test_a_path_over_a_link_without_capacity_is_not_used():
    # A-C has no capacity (absent): A->C goes over A-B-C only, Γ = 100/10 = 10 s; with A-B
    # absent too, A->C has no usable path.
    cap = {e: c for e, c in TRIANGLE.items() if e != ("A", "C")}
    res = min_cct({("A", "C"): 100.0, ("B", "C"): 1.0}, PATHS, cap, use_shortcuts=False)
    assert res.gamma_s == pytest.approx(101 / 10)
    assert [p for p, _ in res.rates[("A", "C")]] == [("A", "B", "C")]
    del cap[("A", "B")]
    assert min_cct({("A", "C"): 100.0}, PATHS, cap).gamma_s == math.inf


@pytest.mark.parametrize("shortcuts", [True, False])
def test_finish_s_ends_the_coflow_then_with_the_fewest_link_bytes(shortcuts):
    # 100 bytes A->C over A-C and A-B-C: Γ = 5 s (both paths). To end in 20 s it needs
    # 5 B/s, which A-C alone carries: all of it there, none over the two links of A-B-C
    # (a min-CCT split scaled by 5/20 would put 2.5 B/s on each path).
    res = min_cct({("A", "C"): 100.0}, PATHS, TRIANGLE, use_shortcuts=shortcuts, finish_s=20.0)
    assert res.gamma_s == pytest.approx(5.0)
    assert {p: x for p, x in res.rates[("A", "C")] if x > 1e-9} == pytest.approx({("A", "C"): 5.0})
    # 150 bytes in 10 s: 15 B/s, 10 on A-C and 5 over A-B-C.
    res = min_cct({("A", "C"): 150.0}, PATHS, TRIANGLE, use_shortcuts=shortcuts, finish_s=10.0)
    assert dict(res.rates[("A", "C")]) == pytest.approx({("A", "C"): 10.0, ("A", "B", "C"): 5.0})
    # finish_s sooner than Γ: the min-CCT rates (a late coflow's best effort).
    late = min_cct({("A", "C"): 100.0}, PATHS, TRIANGLE, use_shortcuts=shortcuts, finish_s=2.0)
    assert totals(late) == pytest.approx({("A", "C"): 20.0})
