"""Max-min fair water-filling (terra_core/maxmin.py): hand-computed cases and invariants."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from terra_core.maxmin import maxmin_levels, maxmin_levels_sparse, maxmin_on_paths


def test_two_flows_sharing_a_link_get_half_each():
    # one link of 10 B/s, two flows on it: 10 / 2 = 5 each
    levels = maxmin_levels(np.array([[1.0, 1.0]]), np.array([10.0]))
    assert levels == pytest.approx([5.0, 5.0])


def test_classic_bottleneck_example():
    # links L1 = 10, L2 = 4; flow a on L1, b on L1+L2, c on L2.
    # L2 saturates first: b = c = 4 / 2 = 2; then a gets the rest of L1: 10 - 2 = 8.
    incidence = np.array([[1.0, 1.0, 0.0], [0.0, 1.0, 1.0]])
    levels = maxmin_levels(incidence, np.array([10.0, 4.0]))
    assert levels == pytest.approx([8.0, 2.0, 2.0])


def test_weighted_entity_counts_its_members():
    # a bundle of 3 flows and a single flow on a link of 8: 4 flows at 8 / 4 = 2 each,
    # so the bundle's load is 3 * 2 = 6 and the single flow's is 2.
    levels = maxmin_levels(np.array([[3.0, 1.0]]), np.array([8.0]))
    assert levels == pytest.approx([2.0, 2.0])


def test_caps_free_capacity_for_others():
    # link of 10; flow 0 capped at 2, so flow 1 gets 10 - 2 = 8
    levels = maxmin_levels(np.array([[1.0, 1.0]]), np.array([10.0]), np.array([2.0, np.inf]))
    assert levels == pytest.approx([2.0, 8.0])


def test_down_link_gives_zero_and_leaves_others_alone():
    # link 0 is down (capacity 0): flow 0 crosses it and gets 0; flow 1 alone on link 1 gets 5
    levels = maxmin_levels(np.array([[1.0, 0.0], [1.0, 1.0]]), np.array([0.0, 5.0]))
    assert levels == pytest.approx([0.0, 5.0])


def test_on_paths_shares_the_common_link():
    # A->B->C and B->C share B-C (cap 6): 3 each; A-B (cap 10) is not a bottleneck
    cap = {("A", "B"): 10.0, ("B", "C"): 6.0}
    rates = maxmin_on_paths([[(("A", "B", "C"), 1)], [(("B", "C"), 1)]], cap)
    assert rates == pytest.approx([3.0, 3.0])


def test_bad_input_raises():
    with pytest.raises(ValueError, match="unbounded"):
        maxmin_levels(np.zeros((1, 1)), np.array([1.0]))
    with pytest.raises(ValueError, match="shape"):
        maxmin_levels(np.ones((2, 1)), np.array([1.0]))
    with pytest.raises(ValueError, match=">= 0"):
        maxmin_levels(np.ones((1, 1)), np.array([-1.0]))


@st.composite
def instances(draw):
    n_links = draw(st.integers(1, 6))
    n = draw(st.integers(1, 12))
    inc = np.array(
        draw(
            st.lists(
                st.lists(st.sampled_from([0, 0, 1, 2, 3]), min_size=n, max_size=n),
                min_size=n_links,
                max_size=n_links,
            )
        ),
        dtype=float,
    )
    inc[0, inc.sum(axis=0) == 0] = 1.0  # every entity crosses at least one link
    cap = np.array(draw(st.lists(st.floats(0.0, 1e9), min_size=n_links, max_size=n_links)))
    caps = np.array(
        draw(st.lists(st.one_of(st.just(np.inf), st.floats(0.0, 1e9)), min_size=n, max_size=n))
    )
    return inc, cap, caps


@settings(max_examples=200, deadline=None)
@given(instances())
def test_maxmin_is_feasible_and_every_entity_is_bottlenecked(inst):
    inc, cap, caps = inst
    level = maxmin_levels(inc, cap, caps)
    assert (level >= 0).all()
    load = inc @ level
    assert (load <= cap * (1 + 1e-9) + 1e-6).all()
    assert (level <= caps * (1 + 1e-9) + 1e-9).all()
    # max-min optimality: each entity is at its cap, or crosses a saturated link on which
    # no other entity has a larger level (the bottleneck condition).
    saturated = load >= cap * (1 - 1e-9) - 1e-6
    for j in range(len(level)):
        if level[j] >= caps[j] * (1 - 1e-9):
            continue
        links = np.flatnonzero((inc[:, j] > 0) & saturated)
        assert any(level[inc[e] > 0].max() <= level[j] * (1 + 1e-9) + 1e-6 for e in links)


@settings(max_examples=100, deadline=None)
@given(instances())
def test_exact_load_updates_for_whole_counts_match_a_product_per_step(inst):
    # integer=True keeps the active load by subtracting frozen columns; integer=False
    # recomputes it as one product per step. With whole-number entries both are exact.
    inc, cap, caps = inst
    np.testing.assert_array_equal(
        maxmin_levels(inc, cap, caps, integer=True), maxmin_levels(inc, cap, caps, integer=False)
    )
    uncapped = np.full(inc.shape[1], np.inf)
    np.testing.assert_array_equal(
        maxmin_levels(inc, cap, uncapped, integer=True), maxmin_levels(inc, cap, integer=False)
    )


def test_sparse_classic_bottleneck_example():
    # the classic example as nonzero entries: a on L1; b on L1, L2; c on L2 (L1 = 10, L2 = 4):
    # b = c = 4 / 2 = 2 when L2 saturates, then a = 10 - 2 = 8.
    rows, cols, vals = [0, 0, 1, 1], [0, 1, 1, 2], [1.0, 1.0, 1.0, 1.0]
    levels = maxmin_levels_sparse(rows, cols, vals, np.array([10.0, 4.0]), 3)
    assert levels == pytest.approx([8.0, 2.0, 2.0])


def test_sparse_bad_input_raises():
    with pytest.raises(ValueError, match="crosses no link"):
        maxmin_levels_sparse([0], [0], [1.0], np.array([1.0]), 2)
    with pytest.raises(ValueError, match="> 0"):
        maxmin_levels_sparse([0], [0], [0.0], np.array([1.0]), 1)
    with pytest.raises(ValueError, match="out of range"):
        maxmin_levels_sparse([1], [0], [1.0], np.array([1.0]), 1)


@st.composite
def weighted_instances(draw):
    inc, cap, _ = draw(instances())
    weights = np.array(
        draw(st.lists(st.floats(1e-3, 1e3), min_size=inc.shape[1], max_size=inc.shape[1]))
    )
    return inc * weights, cap  # non-integral entries: a weight per entity on its links


@settings(max_examples=200, deadline=None)
@given(st.one_of(weighted_instances(), instances().map(lambda t: t[:2])))
def test_sparse_levels_match_dense_levels(inst):
    # the scheduling round's water-filling uses the sparse form; it must give the dense
    # form's levels (same steps, only the summation order of the loads differs)
    inc, cap = inst
    rows, cols = np.nonzero(inc)
    sparse = maxmin_levels_sparse(rows, cols, inc[rows, cols], cap, inc.shape[1])
    dense = maxmin_levels(inc, cap)
    np.testing.assert_allclose(sparse, dense, rtol=1e-9, atol=1e-9 * max(cap.max(), 1.0))


def test_sparse_loads_are_resummed_not_subtracted():
    # L0 (4 B/s): a (weight 1e-3) and b (weight 1842.6); L1 (1e-3 B/s): b (weight 1).
    # L1 sets the first step: b freezes at 1e-3 / 1 = 1e-3 (L0's ratio 4 / 1842.601 = 0.00217
    # is larger). L0 has 4 - 1842.601 x 1e-3 = 2.157399 left for a alone, whose load is 1e-3:
    # a = 1e-3 + 2.157399 / 1e-3 = 2157.4. Subtracting b's 1842.6 from the load 1842.601
    # leaves 0.00099999999990905 (relative error 9e-11), so the load must be summed again.
    rows, cols, vals = [0, 0, 1], [0, 1, 1], [1e-3, 1842.6, 1.0]
    levels = maxmin_levels_sparse(rows, cols, vals, np.array([4.0, 1e-3]), 2)
    assert levels[1] == pytest.approx(1e-3, rel=1e-12)
    assert levels[0] == pytest.approx(1e-3 + (4.0 - (1842.6 + 1e-3) * 1e-3) / 1e-3, rel=1e-12)
