"""One Terra scheduling round (terra_core/scheduling_round.py, docs/design.md 4.2)."""

import random

import pytest

from terra_core import round_fair_share
from terra_core.path_masks import PathIndex
from terra_core.round_memo import RoundMemo
from terra_core.scheduling_round import (
    DEADLINE,
    PREEMPTED,
    SCHEDULED,
    _fill_pair_flow,
    _quick_bound,
    schedule_round,
)
from topologies import all_pairs_paths, load_topology

AB = ("A", "B")
BC = ("B", "C")
LINK = {AB: 10.0}
LINK_PATHS = {AB: [("A", "B")]}
CHAIN = {AB: 10.0, BC: 10.0}
CHAIN_PATHS = {AB: [("A", "B")], BC: [("B", "C")]}


def total(rates, cid, pair):
    return sum(r for _, r in rates.get(cid, {}).get(pair, []))


def test_smaller_gamma_goes_first_and_takes_the_link():
    # One 10 B/s link. c1 has 100 bytes (Γ = 10 s), c2 has 10 bytes (Γ = 1 s). Order c2, c1:
    # c2 gets all 10 B/s (finishes at 1 s, then c1 at 1 + 10 = 11 s: average 6 s, against
    # (10 + 11) / 2 = 10.5 s in arrival order). With α = 0 nothing is left for c1.
    res = schedule_round({"c1": {AB: 100.0}, "c2": {AB: 10.0}}, LINK_PATHS, LINK, alpha=0.0)
    assert res.order == ["c2", "c1"]
    assert res.gammas == pytest.approx({"c1": 10.0, "c2": 1.0})
    assert res.state == {"c2": SCHEDULED, "c1": PREEMPTED}
    assert total(res.rates, "c2", AB) == pytest.approx(10.0)
    assert "c1" not in res.rates


@pytest.fixture(params=["mcf", "waterfill"])
def fair_share(request, monkeypatch):
    """Run a test with steps 5-6 on the MCF and on path-level water-filling."""
    if request.param == "waterfill":
        monkeypatch.setattr(round_fair_share, "MCF_MAX_COLUMNS", 0)
    return request.param


def test_alpha_reservation_goes_to_the_preempted_coflow(fair_share):
    # α = 0.1: c2 is scheduled on r = 0.9 x 10 = 9 B/s; the reserved 1 B/s goes to c1.
    res = schedule_round({"c1": {AB: 100.0}, "c2": {AB: 10.0}}, LINK_PATHS, LINK, alpha=0.1)
    assert total(res.rates, "c2", AB) == pytest.approx(9.0)
    assert total(res.rates, "c1", AB) == pytest.approx(1.0)
    assert res.state["c1"] == PREEMPTED


def test_work_conservation_fills_an_otherwise_idle_link(fair_share):
    # c1: A->B 100 bytes, B->C 10 bytes on a chain of 10 B/s links. Γ = max(100/10, 10/10) =
    # 10 s, so the minimal allocation is A->B 10 B/s and B->C 10/10 = 1 B/s; link B-C would
    # idle at 9 B/s. Work conservation hands those 9 B/s to the only B->C FlowGroup: 10 B/s.
    res = schedule_round({"c1": {AB: 100.0, BC: 10.0}}, CHAIN_PATHS, CHAIN, alpha=0.0)
    assert res.state == {"c1": SCHEDULED}
    assert total(res.rates, "c1", AB) == pytest.approx(10.0)
    assert total(res.rates, "c1", BC) == pytest.approx(10.0)


def test_coflow_missing_one_flowgroup_is_preempted_but_work_conservation_uses_its_pair(
    fair_share,
):
    # c1 (Γ = 10 s) takes link A-B. c2 needs A->B and B->C; A-B is full, so c2 is preempted
    # (α = 0). Link B-C is idle, so work conservation gives c2's B->C FlowGroup all 10 B/s.
    res = schedule_round(
        {"c1": {AB: 100.0}, "c2": {AB: 200.0, BC: 10.0}}, CHAIN_PATHS, CHAIN, alpha=0.0
    )
    assert res.order == ["c1", "c2"]
    assert res.state == {"c1": SCHEDULED, "c2": PREEMPTED}
    assert total(res.rates, "c2", AB) == 0.0
    assert total(res.rates, "c2", BC) == pytest.approx(10.0)


def test_deadline_coflow_is_stretched_to_its_deadline():
    # d1: 100 bytes, Γ = 10 s, deadline at t = 20 s, now = 0: rate 100/20 = 5 B/s.
    # c2 (50 bytes) is scheduled on what is left (α = 0): 5 B/s.
    res = schedule_round(
        {"d1": {AB: 100.0}, "c2": {AB: 50.0}},
        LINK_PATHS,
        LINK,
        now=0.0,
        deadlines={"d1": 20.0},
        alpha=0.0,
    )
    assert res.state == {"d1": DEADLINE, "c2": SCHEDULED}
    assert total(res.rates, "d1", AB) == pytest.approx(5.0)
    assert total(res.rates, "c2", AB) == pytest.approx(5.0)


def test_late_deadline_coflow_gets_its_full_min_cct_rate():
    # now = 15 > Γ-feasible: deadline 20 leaves 5 s < Γ = 10 s, so no stretching: 10 B/s.
    res = schedule_round({"d1": {AB: 100.0}}, LINK_PATHS, LINK, now=15.0, deadlines={"d1": 20.0})
    assert total(res.rates, "d1", AB) == pytest.approx(10.0)


def test_exact_hints_are_used_for_the_order_and_bounds_are_refined():
    # Exact hints are trusted (no LP): c1 before c2 although its true Γ is larger.
    res = schedule_round(
        {"c1": {AB: 100.0}, "c2": {AB: 10.0}},
        LINK_PATHS,
        LINK,
        alpha=0.0,
        hints={"c1": (0.5, True), "c2": (1.0, True)},
    )
    assert res.order == ["c1", "c2"] and res.exact == {}
    # A mere lower bound is replaced by the exact Γ (10 s) before c1 may go: c2 first.
    res = schedule_round(
        {"c1": {AB: 100.0}, "c2": {AB: 10.0}},
        LINK_PATHS,
        LINK,
        alpha=0.0,
        hints={"c1": (0.5, False), "c2": (1.0, True)},
    )
    assert res.order == ["c2", "c1"]
    assert res.exact["c1"].gamma_s == pytest.approx(10.0)


def test_bad_input():
    with pytest.raises(ValueError, match="'c9'.*B->C"):
        schedule_round({"c9": {BC: 1.0}}, LINK_PATHS, LINK)
    with pytest.raises(ValueError, match="alpha"):
        schedule_round({}, LINK_PATHS, LINK, alpha=1.0)


def test_a_volumes_dict_given_again_is_checked_again_on_new_paths():
    memo = RoundMemo()
    volumes = {"c": {AB: 5.0}, "d": {BC: 5.0}}
    first = schedule_round(volumes, CHAIN_PATHS, CHAIN, memo=memo)
    again = schedule_round(volumes, CHAIN_PATHS, CHAIN, memo=memo)
    assert again.rates == first.rates
    with pytest.raises(ValueError, match="'d'.*B->C"):
        schedule_round(volumes, dict(LINK_PATHS), CHAIN, memo=memo)


def test_alpha_share_is_max_min_over_preempted_flowgroups(fair_share):
    # Chain A-B-C of 10 B/s links, α = 0.5: c0 (Γ 5/5 = 1 s) is scheduled on r = 5 B/s of
    # A-B. c1, c2, c3 are preempted (A-B is full); all three have a FlowGroup A->B, c3 also
    # one B->C. The reserve on A-B (5 B/s) is split three ways (5/3 each); on B-C, c3 alone
    # gets the 5 B/s reserve, and work conservation gives it the other 5 B/s of B-C.
    res = schedule_round(
        {"c0": {AB: 5.0}, "c1": {AB: 100.0}, "c2": {AB: 200.0}, "c3": {AB: 300.0, BC: 50.0}},
        CHAIN_PATHS,
        CHAIN,
        alpha=0.5,
    )
    assert res.state == {"c0": SCHEDULED, "c1": PREEMPTED, "c2": PREEMPTED, "c3": PREEMPTED}
    assert total(res.rates, "c0", AB) == pytest.approx(5.0)
    # A-B reserve: three preempted FlowGroups (c1, c2, c3) on A->B share 5 B/s: 5/3 each.
    for cid in ["c1", "c2", "c3"]:
        assert total(res.rates, cid, AB) == pytest.approx(5.0 / 3)
    assert total(res.rates, "c3", BC) == pytest.approx(10.0)


def test_work_conservation_serves_the_earlier_coflow_first(fair_share):
    # Star: A-B 10, D-B 10, B-C 18 B/s. c1: A->C 100 bytes on A-B-C (Γ = 100/10 = 10 s);
    # c2: D->C 1000 bytes on D-B-C (Γ = 1000/10 = 100 s). α = 0.1: r = A-B 9, D-B 9, B-C 16.2.
    # Step 4: c1 gets 9 (A-B), B-C keeps 7.2; c2 gets min(9, 7.2) = 7.2. Nobody is preempted,
    # so the reserve is spare: A-B 1, D-B 1.8, B-C 1.8. Step 6 serves c1 first: +1 -> 10 B/s
    # (its full min-CCT rate), then c2 gets the 0.8 left on B-C -> 8 B/s. (A fair split of
    # B-C's spare between the two pairs would leave c1 at 9.9 B/s.)
    capacity = {("A", "B"): 10.0, ("D", "B"): 10.0, ("B", "C"): 18.0}
    paths = {("A", "C"): [("A", "B", "C")], ("D", "C"): [("D", "B", "C")]}
    res = schedule_round(
        {"c1": {("A", "C"): 100.0}, "c2": {("D", "C"): 1000.0}}, paths, capacity, alpha=0.1
    )
    assert res.state == {"c1": SCHEDULED, "c2": SCHEDULED}
    assert total(res.rates, "c1", ("A", "C")) == pytest.approx(10.0)
    assert total(res.rates, "c2", ("D", "C")) == pytest.approx(8.0)


def test_work_conservation_grows_a_coflow_in_proportion_to_its_volumes(fair_share):
    # Chain A-B-C-D, 10 B/s links, α = 0. c0 (C->D 10 bytes, Γ = 1 s) takes C-D, so c1
    # (C->D 1000, A->C 300 on A-B-C, B->C 100 on B-C) is preempted. Work conservation gives
    # c1's two other FlowGroups link B-C weighted by volume, 300 : 100, so they progress
    # together: t + t/3 = 10 -> A->C 7.5 B/s, B->C 2.5 B/s (not 5 and 5).
    capacity = {("A", "B"): 10.0, ("B", "C"): 10.0, ("C", "D"): 10.0}
    paths = {
        ("C", "D"): [("C", "D")],
        ("A", "C"): [("A", "B", "C")],
        ("B", "C"): [("B", "C")],
    }
    res = schedule_round(
        {
            "c0": {("C", "D"): 10.0},
            "c1": {("C", "D"): 1000.0, ("A", "C"): 300.0, ("B", "C"): 100.0},
        },
        paths,
        capacity,
        alpha=0.0,
    )
    assert res.state == {"c0": SCHEDULED, "c1": PREEMPTED}
    assert total(res.rates, "c0", ("C", "D")) == pytest.approx(10.0)
    assert total(res.rates, "c1", ("C", "D")) == 0.0
    assert total(res.rates, "c1", ("A", "C")) == pytest.approx(7.5)
    assert total(res.rates, "c1", ("B", "C")) == pytest.approx(2.5)


def test_work_conservation_fills_shortest_paths_first(fair_share):
    # Triangle A, B, C (10 B/s links) plus X-A at 1 B/s. c1: X->A, A->C (paths A-C, A-B-C)
    # and A->B (path A-B), 100 bytes each: X-A makes Γ = 100 s, so step 4 gives every
    # FlowGroup 1 B/s, A->C on A-C (its fewest link-bytes). Spare: A-C 9, A-B 9, B-C 10.
    # Filling A->C's one-link path before its two-link one gives A->C +9 and A->B +9:
    # 10 B/s each, what the max-min MCF gives. (Raising all three (pair, path) subflows
    # together would give A-C 9 and 4.5 each to A-B-C and A-B: A->C 14.5, A->B 5.5.)
    capacity = {("X", "A"): 1.0, ("A", "B"): 10.0, ("B", "C"): 10.0, ("A", "C"): 10.0}
    paths = {
        ("X", "A"): [("X", "A")],
        ("A", "C"): [("A", "C"), ("A", "B", "C")],
        ("A", "B"): [("A", "B")],
    }
    res = schedule_round(
        {"c1": {("X", "A"): 100.0, ("A", "C"): 100.0, ("A", "B"): 100.0}},
        paths,
        capacity,
        alpha=0.0,
    )
    assert total(res.rates, "c1", ("X", "A")) == pytest.approx(1.0)
    assert total(res.rates, "c1", ("A", "C")) == pytest.approx(10.0)
    assert total(res.rates, "c1", ("A", "B")) == pytest.approx(10.0)


def test_deadline_coflow_gets_spare_capacity_after_the_others():
    # Chain A-B, C-D: A-B 10 B/s, C-D 1 B/s, α = 0. d1: A->B 100 bytes, deadline 20 s:
    # 100/20 = 5 B/s (on time). c2: A->B 100 and C->D 1000: Γ = max(100/5, 1000/1) = 1000 s
    # on what d1 leaves, so A->B 0.1 B/s and C->D 1 B/s. A-B has 10 - 5 - 0.1 = 4.9 spare:
    # d1 already meets its deadline, so step 6 gives it to c2 (A->B 0.1 + 4.9 = 5 B/s).
    capacity = {("A", "B"): 10.0, ("C", "D"): 1.0}
    paths = {("A", "B"): [("A", "B")], ("C", "D"): [("C", "D")]}
    res = schedule_round(
        {"d1": {("A", "B"): 100.0}, "c2": {("A", "B"): 100.0, ("C", "D"): 1000.0}},
        paths,
        capacity,
        now=0.0,
        deadlines={"d1": 20.0},
        alpha=0.0,
    )
    assert res.state == {"d1": DEADLINE, "c2": SCHEDULED}
    assert total(res.rates, "d1", ("A", "B")) == pytest.approx(5.0)
    assert total(res.rates, "c2", ("A", "B")) == pytest.approx(5.0)
    assert total(res.rates, "c2", ("C", "D")) == pytest.approx(1.0)


def test_quick_bounds_filled_at_once_equal_the_pair_by_pair_ones():
    # The round's seed bounds on Γ: every pair's Σ of path bottlenecks taken from one numpy
    # minimum equals, to the bit, the sum _quick_bound makes link by link (ATT, a random
    # share with some links absent, which count as no capacity).
    topo = load_topology("att")
    paths = all_pairs_paths(topo, 4)
    rng = random.Random(3)
    cap = {e: c * rng.random() for e, c in topo.capacity.items() if rng.random() > 0.1}
    pairs = sorted(paths)
    coflows = [{p: rng.uniform(1, 1e9) for p in rng.sample(pairs, 3)} for _ in range(40)]
    filled: dict = {}
    _fill_pair_flow(coflows, paths, cap, filled, PathIndex(tuple(cap)))
    assert len(filled) > 8
    for vol in coflows:
        one_by_one: dict = {}
        assert _quick_bound(vol, paths, cap, filled) == _quick_bound(vol, paths, cap, one_by_one)
        assert all(filled[pair] == one_by_one[pair] for pair in vol)
