"""The numba-compiled paths against the numpy code they replaced, on
random instances: the same float operations in the same order, so equal to the bit.

- `maxmin.maxmin_levels_sparse` against `reference_maxmin.maxmin_levels_sparse_numpy`
  (whole, real and widely spread weights, repeated entries, links down);
- `maxmin.maxmin_levels_entries` with whole-number entries (now always the compiled sparse
  filling) against `maxmin_levels` on the dense matrix, which kept the loads exact too;
- `sparse_index.csr_ranges` against its numpy version;
- `maxmin.maxmin_levels_scaled` (fixed columns, weights changing) against
  `maxmin_levels_entries` on the entries it stands for, whole and real weights;
- the simulator's passes over the live flows against the numpy expressions they replaced.
Capacities are in bytes/s, rates in bytes/s, times in seconds.
"""

from __future__ import annotations

import numpy as np
import pytest
from numba import njit
from reference_maxmin import csr_ranges_numpy, maxmin_levels_sparse_numpy

from terra_core.maxmin import (
    columns_by_row,
    maxmin_levels,
    maxmin_levels_entries,
    maxmin_levels_scaled,
    maxmin_levels_sparse,
)
from terra_core.sparse_index import add_held, csr_ranges, flush_held
from terra_sim import engine, kernels


def random_instance(rng: np.random.Generator, kind: str):
    """Entries (rows, cols, vals), capacities and entity count of a random incidence:
    up to 300 links and 1,500 entities crossing 1-4 links each, in shuffled entry order
    (repeats of a (link, entity) entry happen); one in ten links down in some."""
    n_links, n = int(rng.integers(1, 300)), int(rng.integers(1, 1500))
    cols = np.repeat(np.arange(n), rng.integers(1, 5, size=n))
    rows = rng.integers(0, n_links, size=len(cols))
    if kind == "whole":
        vals = rng.integers(1, 30, size=len(cols)).astype(float)
    elif kind == "real":
        vals = rng.uniform(0.01, 2.0, size=len(cols))
    else:  # weights 1e-3 .. 1e6 apart: the loads are summed again after cancellation
        vals = 10.0 ** rng.uniform(-3, 6, size=len(cols))
    capacity = rng.uniform(1e6, 1.25e8, size=n_links)
    if rng.random() < 0.3:
        capacity[:] = 1.25e8  # equal capacities: ties, several links saturating at once
    if rng.random() < 0.3:
        capacity[rng.random(n_links) < 0.1] = 0.0
    perm = rng.permutation(len(cols))
    return rows[perm], cols[perm], vals[perm], capacity, n


@pytest.mark.parametrize("kind", ["whole", "real", "spread"])
@pytest.mark.parametrize("seed", range(15))
def test_compiled_sparse_filling_equals_the_numpy_one(kind, seed):
    rng = np.random.default_rng(1000 * seed + len(kind))
    rows, cols, vals, capacity, n = random_instance(rng, kind)
    want = maxmin_levels_sparse_numpy(rows, cols, vals, capacity, n)
    got = maxmin_levels_sparse(rows, cols, vals, capacity, n)
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("seed", range(15))
def test_whole_entries_equal_the_dense_integral_filling(seed):
    rng = np.random.default_rng(77 + seed)
    rows, cols, vals, capacity, n = random_instance(rng, "whole")
    matrix = np.zeros((len(capacity), n))
    np.add.at(matrix, (rows, cols), vals)
    want = maxmin_levels(matrix, capacity)
    np.testing.assert_array_equal(maxmin_levels_entries(rows, cols, vals, capacity, n), want)
    np.testing.assert_array_equal(
        maxmin_levels_entries(rows, cols, vals, capacity, n, integer=True), want
    )


def test_compiled_sparse_filling_hand_case():
    # link 0 (10 B/s): entities 0 and 1; link 1 (4 B/s): entities 1 (2 members) and 2.
    # Water rises to 4 / 3 on link 1 first (load 3); then entity 0 alone to 10 - 4 / 3.
    rows = np.array([0, 0, 1, 1])
    cols = np.array([0, 1, 1, 2])
    vals = np.array([1.0, 1.0, 2.0, 1.0])
    levels = maxmin_levels_sparse(rows, cols, vals, np.array([10.0, 4.0]), 3)
    np.testing.assert_allclose(levels, [10 - 4 / 3, 4 / 3, 4 / 3])


@pytest.mark.parametrize("seed", range(10))
def test_csr_ranges_equal_the_numpy_version(seed):
    rng = np.random.default_rng(seed)
    lens = rng.integers(0, 5, size=int(rng.integers(1, 50)))
    ptr = np.concatenate(([0], np.cumsum(lens))).astype(np.intp)
    for size in (0, 1, 2, 40):
        ids = rng.integers(0, len(lens), size=size).astype(np.intp)
        got = csr_ranges(ptr, ids)
        assert got.dtype == np.intp
        np.testing.assert_array_equal(got, csr_ranges_numpy(ptr, ids))


def scaled_entries(ptr, rows, vals, scale):
    """The entries `maxmin_levels_scaled` stands for: columns with scale > 0, numbered in
    order, values times their column's scale (numpy, as varys' backfill built them)."""
    present = np.flatnonzero(scale)
    entries = csr_ranges(ptr, present)
    cols = np.repeat(np.arange(len(present), dtype=np.intp), ptr[present + 1] - ptr[present])
    return present, rows[entries], cols, vals[entries] * scale[present][cols]


@pytest.mark.parametrize("seed", range(30))
def test_scaled_columns_equal_freshly_built_entries(seed):
    # fixed columns (1-4 entries, a row may repeat within one), a sequence of weights on
    # one memo: drawn afresh (most columns or a fifth taking part),
    # a few changed (as from event to event), real (the fallback on built entries) or
    # huge (the loads could pass 2^53: the fallback too, the memo emptied); whole weights
    # take the compiled filling on the kept loads, equal to the bit every time
    rng = np.random.default_rng(500 + seed)
    n_links, n = int(rng.integers(1, 200)), int(rng.integers(1, 800))
    lens = rng.integers(1, 5, size=n)
    ptr = np.concatenate(([0], np.cumsum(lens))).astype(np.intp)
    rows = rng.integers(0, n_links, size=int(ptr[-1])).astype(np.intp)
    vals = rng.integers(1, 4, size=len(rows)).astype(float)
    by_row = columns_by_row(ptr, rows, vals, n_links)  # (its memo carries over the calls)
    scale = np.zeros(n)
    for _ in range(12):
        kind = rng.choice(["whole", "few", "few", "few", "real", "huge"])
        if kind == "whole":
            scale = rng.integers(0, 9, size=n) * (rng.random(n) < rng.choice([0.2, 1.0]))
            scale = scale.astype(float)
        elif kind == "few":
            scale = np.round(scale)  # (after real weights: whole again)
            scale[scale >= 2.0**52] = 1.0
            changed = rng.integers(0, n, size=int(rng.integers(1, 6)))
            scale[changed] = rng.integers(0, 9, size=len(changed))
        elif kind == "huge":
            scale = scale.copy()
            scale[rng.integers(0, n, size=3)] = 2.0**52
        else:
            scale = rng.uniform(0.0, 3.0, size=n) * (rng.random(n) < 0.7)
        capacity = rng.uniform(1e6, 1.25e8, size=n_links)
        if rng.random() < 0.4:
            capacity[:] = 1.25e8  # ties: several links saturate at once
        capacity[rng.random(n_links) < 0.1] = 0.0
        present, e_rows, e_cols, e_vals = scaled_entries(ptr, rows, vals, scale)
        want = np.zeros(n)
        if len(present):
            want[present] = maxmin_levels_entries(e_rows, e_cols, e_vals, capacity, len(present))
        np.testing.assert_array_equal(
            maxmin_levels_scaled(ptr, rows, vals, scale, capacity, by_row), want
        )
        np.testing.assert_array_equal(maxmin_levels_scaled(ptr, rows, vals, scale, capacity), want)


def test_scaled_columns_with_real_values_take_the_built_entries():
    ptr, rows, vals = np.array([0, 1, 2]), np.array([0, 0]), np.array([0.5, 1.0])
    capacity = np.array([3.0])
    want = maxmin_levels_entries(rows, np.array([0, 1]), vals * 2.0, capacity, 2)
    got = maxmin_levels_scaled(ptr, rows, vals, np.array([2.0, 2.0]), capacity)
    np.testing.assert_array_equal(got, want)


def test_scaled_columns_reject_negative_scales_and_capacities():
    ptr, rows, vals = np.array([0, 1]), np.array([0]), np.array([1.0])
    with pytest.raises(ValueError):
        maxmin_levels_scaled(ptr, rows, vals, np.array([-1.0]), np.array([1.0]))
    with pytest.raises(ValueError):
        maxmin_levels_scaled(ptr, rows, vals, np.array([1.0]), np.array([-1.0]))
    with pytest.raises(ValueError):  # a memo made for other columns
        by_row = columns_by_row(np.array([0, 1, 2]), np.array([0, 0]), np.ones(2), 1)
        maxmin_levels_scaled(ptr, rows, vals, np.array([1.0]), np.array([1.0]), by_row)


@pytest.mark.parametrize("seed", range(10))
def test_live_flow_passes_equal_the_numpy_expressions(seed):
    rng = np.random.default_rng(seed)
    n_flows, n_pairs = 2000, 40
    live = np.sort(rng.choice(n_flows, size=int(rng.integers(1, n_flows)), replace=False))
    live = live.astype(np.intp)
    pair_of = rng.integers(0, n_pairs, size=n_flows).astype(np.intp)
    members = rng.integers(1, 9, size=n_flows).astype(float)
    per_member = rng.uniform(0.0, 1e7, size=n_pairs)
    per_member[rng.random(n_pairs) < 0.2] = 0.0  # some pairs get nothing
    want_rate = np.zeros(n_flows)
    want_rate[live] = members[live] * per_member[pair_of[live]]
    rem = rng.uniform(1.0, 1e9, size=n_flows)
    rem[live[:3]] = want_rate[live[:3]] * 0.25  # a few finish together at the step
    moving = want_rate[live] > 0
    want_step = float(np.min(rem[live[moving]] / want_rate[live[moving]]))

    rate = np.zeros(n_flows)
    step = kernels.set_rates(live, pair_of, members, per_member, rate, rem)
    np.testing.assert_array_equal(rate, want_rate)
    assert step == want_step
    assert kernels.next_finish(live, rem, rate) == want_step

    step = step * 3.0
    limit = step * (1 + engine.FINISH_REL)
    pos = live[moving]
    before = rem[pos]
    after = before - rate[pos] * step
    done = (before / rate[pos] <= limit) | (after <= engine.FINISH_BYTES)
    after[done] = 0.0
    got_rem = rem.copy()
    moved, finished, kept = kernels.advance_flows(
        live, got_rem, rate, step, limit, engine.FINISH_BYTES
    )
    np.testing.assert_array_equal(moved, before - after)
    assert float(moved.sum()) == float((before - after).sum())
    np.testing.assert_array_equal(finished, pos[done])
    np.testing.assert_array_equal(kept, np.setdiff1d(live, pos[done]))
    want_rem = rem.copy()
    want_rem[pos] = after
    np.testing.assert_array_equal(got_rem, want_rem)

    # the same pass on arrays kept in live order, in place (the coflow policies' path)
    tag = rng.integers(0, 1000, size=len(live)).astype(np.intp)
    live_copy, tag_copy, live_rem = live.copy(), tag.copy(), rem[live].copy()
    got_rem = rem.copy()
    moved2, finished2, n_kept = kernels.advance_live(
        live_copy, tag_copy, live_rem, rate[live], got_rem, step, limit, engine.FINISH_BYTES
    )
    np.testing.assert_array_equal(moved2, moved)
    np.testing.assert_array_equal(finished2, finished)
    np.testing.assert_array_equal(live_copy[:n_kept], kept)
    np.testing.assert_array_equal(tag_copy[:n_kept], tag[np.isin(live, kept)])  # carried along
    np.testing.assert_array_equal(live_rem[:n_kept], want_rem[kept])
    assert (got_rem[finished] == 0).all()  # the finished flows' bytes, by position
    np.testing.assert_array_equal(np.delete(got_rem, finished), np.delete(rem, finished))


def test_next_finish_without_moving_flows_is_inf():
    live = np.arange(3, dtype=np.intp)
    assert kernels.next_finish(live, np.ones(3), np.zeros(3)) == float("inf")
    moved, done, kept = kernels.advance_flows(live, np.ones(3), np.zeros(3), 1.0, 1.0, 1e-6)
    assert len(moved) == 0 and len(done) == 0
    np.testing.assert_array_equal(kept, live)


@njit
def _held_sums(out, bins, values, slots):
    h0, a0, h1, a1 = -1, 0.0, -1, 0.0
    for k in range(len(bins)):
        h0, a0, h1, a1 = add_held(out, bins[k], values[k], slots[k], h0, a0, h1, a1)
    flush_held(out, h0, a0, h1, a1)


@pytest.mark.parametrize("seed", range(20))
def test_held_sums_equal_the_additions_in_memory(seed):
    # runs of one bin, bins alternating between the slots and a bin held in the other slot:
    # every sum is the sequential `out[b] += x`'s to the bit
    rng = np.random.default_rng(seed)
    n_bins = int(rng.integers(1, 6))
    bins = np.repeat(rng.integers(0, n_bins, size=60), rng.integers(1, 4, size=60))
    values = rng.uniform(-1e6, 1e9, size=len(bins)) * rng.choice([1.0, 1e-9], size=len(bins))
    slots = rng.integers(0, 2, size=len(bins))
    start = rng.uniform(0, 1e3, size=n_bins)
    want = start.copy()
    for b, x in zip(bins, values, strict=True):
        want[b] += x
    got = start.copy()
    _held_sums(got, bins, values, slots)
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("seed", range(10))
def test_single_path_store_pass_equals_the_general_one(seed):
    # one path per flow with all its members (bigswitch): the loads add the flow's rate,
    # with runs of flows to one DC summed in registers; the general branch reads each
    # entry's members and adds through memory: the same rates, loads and step to the bit
    rng = np.random.default_rng(seed)
    n_flows, n_rows = 3000, 12
    live = np.sort(rng.choice(n_flows, size=2000, replace=False)).astype(np.intp)
    members = rng.integers(1, 9, size=n_flows).astype(float)
    src = rng.integers(0, n_rows // 2, size=n_flows)
    dst = np.sort(rng.integers(n_rows // 2, n_rows, size=n_flows))  # runs to one DC
    pool_rows = np.stack((src, dst), axis=1).reshape(-1).astype(np.int32)
    pool_vals = np.repeat(members, 2)
    entry_start = 2 * np.arange(n_flows, dtype=np.intp)
    per_member = rng.uniform(0.0, 1e7, size=len(live))
    per_member[rng.random(len(live)) < 0.1] = 0.0
    live_rem = rng.uniform(1.0, 1e9, size=len(live))
    out = []
    for single in (True, False):
        rate = np.empty(len(live))
        got = kernels.store_rates(
            live,
            per_member,
            members,
            rate,
            entry_start,
            np.full(n_flows, 2, dtype=np.intp),
            pool_rows,
            pool_vals,
            2,
            single,
            n_rows,
            False,
            live_rem,
        )
        out.append((rate, *got))
    for x, y in zip(*out, strict=True):
        np.testing.assert_array_equal(x, y)
    np.testing.assert_array_equal(out[0][0], members[live] * per_member)
    entries = (entry_start[live][:, None] + np.arange(2)).reshape(-1)
    want = np.bincount(
        pool_rows[entries], weights=pool_vals[entries] * np.repeat(per_member, 2), minlength=n_rows
    )
    np.testing.assert_array_equal(out[0][2], want)  # np.bincount's order of old


@pytest.mark.parametrize("seed", range(10))
def test_store_pass_with_routes_of_any_length_equals_the_numpy_gather(seed):
    # flows with 0 to 5 entries (paths of any length, several paths, unrouted flows): the
    # rates, loads (np.bincount over the gathered entries, in flow then entry order) and
    # the seconds to the first finish of the numpy code this pass replaced, to the bit
    rng = np.random.default_rng(100 + seed)
    n_flows, n_rows = 2000, 40
    count = rng.integers(0, 6, size=n_flows).astype(np.intp)
    entry_start = (np.cumsum(count) - count).astype(np.intp)
    pool_rows = rng.integers(0, n_rows, size=int(count.sum())).astype(np.int32)
    pool_vals = rng.integers(1, 5, size=int(count.sum())).astype(float)
    members = np.where(count > 0, rng.integers(1, 9, size=n_flows), 0).astype(float)
    live = np.sort(rng.choice(n_flows, size=1500, replace=False)).astype(np.intp)
    per_member = np.where(members[live] > 0, rng.uniform(0.0, 1e7, size=len(live)), 0.0)
    live_rem = rng.uniform(1.0, 1e9, size=len(live))
    rate = np.empty(len(live))
    bad, load, first = kernels.store_rates(
        live, per_member, members, rate, entry_start, count, pool_rows, pool_vals, 0, False,
        n_rows, True, live_rem,
    )  # fmt: skip
    assert bad == -1
    np.testing.assert_array_equal(rate, members[live] * per_member)
    nnz = count[live]
    starts = entry_start[live]
    entry = np.concatenate([np.arange(s, s + n) for s, n in zip(starts, nnz, strict=True)])
    weights = pool_vals[entry] * per_member[np.repeat(np.arange(len(live)), nnz)]
    np.testing.assert_array_equal(load, np.bincount(pool_rows[entry], weights, n_rows))
    moving = rate > 0
    assert first == np.min(live_rem[moving] / rate[moving])
    per_member[7] = np.nan
    assert kernels.store_rates(
        live, per_member, members, rate, entry_start, count, pool_rows, pool_vals, 0, False,
        n_rows, True, live_rem,
    )[0] == 7  # fmt: skip
