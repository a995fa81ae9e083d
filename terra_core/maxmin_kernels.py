"""The compiled loops of progressive filling (maxmin.py's step loops and the scheduling
round's water-filling of DC pairs over their paths), all in one module: numba's cache of a
function is invalidated only by changes to its own file, so compiled functions that call
each other are kept together (maxmin.py holds their Python entry points and checks).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from terra_core.array_types import BoolArray, FloatArray, IntArray

_RESUM = 1e-3  # maxmin_levels_sparse sums a link's load again below this share of its last sum
_SAT_TOL = 1e-12  # a link is saturated when its leftover is below this fraction of its capacity
_EXACT = 2.0**53  # whole numbers below this add up exactly in float64


@njit(cache=True, error_model="numpy")
def _next_step(
    busy: IntArray, n_busy: int, leftover: FloatArray, load: FloatArray, ratio: FloatArray
) -> float:  # pragma: no cover - compiled
    """The water rise of a progressive-filling step: the lowest leftover / load over the
    first `n_busy` links of `busy` (each one's ratio kept in `ratio`), NaN if any is NaN,
    floored at 0."""
    low = np.inf
    for t in range(n_busy):
        i = busy[t]
        ratio[i] = leftover[i] / load[i]
        if ratio[i] < low or np.isnan(ratio[i]):
            low = ratio[i]
    return low if low > 0.0 or np.isnan(low) else 0.0


@njit(cache=True, error_model="numpy")  # numpy: x / 0 is inf, not an exception
def _sparse_fill(rows: IntArray, cols: IntArray, vals: FloatArray, capacity: FloatArray, n: int,
                 resum: float, sat_tol: float) -> FloatArray:  # pragma: no cover  # fmt: skip
    """`maxmin_levels_sparse`'s step loop, compiled (same floats; arguments checked there)."""
    n_links = capacity.shape[0]
    row_ptr, row_cols, row_vals = _csr(rows, cols, vals, n_links)
    col_ptr, col_rows, col_vals = _csr(cols, rows, vals, n)
    level = np.zeros(n)
    frozen = np.zeros(n, dtype=np.bool_)
    for k in range(rows.shape[0]):
        if capacity[rows[k]] <= 0:
            frozen[cols[k]] = True
    load, count = _active_loads(rows, cols, vals, frozen, n_links)
    exact = load.copy()
    leftover, tol = _leftover_and_tolerance(capacity, count, sat_tol)
    left = n - int(frozen.sum())
    ratio = np.empty(n_links)
    sub = np.zeros(n_links)  # the bincount of the step's frozen entries, per link
    mark = np.zeros(n_links, dtype=np.bool_)
    touched = np.empty(n_links, dtype=np.intp)
    newly = np.empty(n, dtype=np.intp)
    is_new = np.zeros(n, dtype=np.bool_)
    # the links some active entity crosses, ascending; the others have leftover inf and
    # load 0 (ratio inf, never saturated, leftover unchanged by a step), so they are skipped
    busy = np.flatnonzero(count > 0)
    n_busy = busy.shape[0]
    water = 0.0
    while left:
        step = _next_step(busy, n_busy, leftover, load, ratio)
        water += step
        limit = step * (1 + sat_tol)
        n_new = 0
        for t in range(n_busy):
            i = busy[t]
            leftover[i] -= load[i] * step
            if ratio[i] <= limit or leftover[i] <= tol[i]:
                for k in range(row_ptr[i], row_ptr[i + 1]):
                    c = row_cols[k]
                    if not frozen[c] and not is_new[c]:
                        is_new[c] = True
                        newly[n_new] = c
                        n_new += 1
        _ascending(newly, n_new, is_new)
        n_touched = 0
        for t in range(n_new):
            c = newly[t]
            is_new[c] = False
            level[c] = water
            frozen[c] = True
            for k in range(col_ptr[c], col_ptr[c + 1]):
                r = col_rows[k]
                count[r] -= 1
                sub[r] += col_vals[k]
                if not mark[r]:
                    mark[r] = True
                    touched[n_touched] = r
                    n_touched += 1
        left -= n_new
        emptied = False
        for t in range(n_touched):
            r = touched[t]
            load[r] -= sub[r]
            sub[r] = 0.0
        for t in range(n_touched):
            r = touched[t]
            mark[r] = False
            # a load below resum of its last exact sum is summed again over the active
            # entries (see maxmin_levels_sparse)
            if load[r] < resum * exact[r] and count[r] > 0:
                total = 0.0
                for k in range(row_ptr[r], row_ptr[r + 1]):
                    total += row_vals[k] * (0.0 if frozen[row_cols[k]] else 1.0)
                load[r] = total
                exact[r] = total
            if count[r] == 0:
                load[r] = 0.0
                leftover[r] = np.inf
                emptied = True
        if emptied:
            n_busy = _compact_busy(busy, n_busy, count)
    return level


@njit(cache=True)
def _forget(
    memo_scale: FloatArray, memo_load: FloatArray, memo_count: IntArray, sums: FloatArray
) -> None:  # pragma: no cover - compiled
    """Empty the memo of `maxmin_levels_scaled` (no column with a weight)."""
    memo_scale[:] = 0.0
    memo_load[:] = 0.0
    memo_count[:] = 0
    sums[0] = 0.0
    sums[1] = 0.0


@njit(cache=True, error_model="numpy")  # numpy: x / 0 is inf, not an exception
def _scaled_fill(
    ptr: IntArray, rows: IntArray, vals: FloatArray, row_ptr: IntArray, row_cols: IntArray,
    memo_scale: FloatArray, memo_load: FloatArray, memo_count: IntArray, sums: FloatArray,
    scale: FloatArray, capacity: FloatArray,
) -> tuple[FloatArray, bool]:  # pragma: no cover - compiled  # fmt: skip
    """The step loop of `_sparse_fill` on the scaled columns of `maxmin_levels_scaled`,
    compiled, with the memo (ColumnsByRow) brought to `scale` first. Returns (levels,
    exact); exact is False, the levels are not computed and the memo is emptied, unless
    every capacity is >= 0, every scale is 0 or a whole number > 0 whose column has an
    entry, the values are whole numbers and all scaled entries add up to less than 2^53.
    The loads are then exact integers, so the memo's sums equal fresh ones,
    `_sparse_fill`'s re-summing is a no-op and is left out, and the order in which a
    step's columns freeze does not matter; every other float operation is `_sparse_fill`'s,
    link by link in ascending order."""
    n_links = capacity.shape[0]
    n = scale.shape[0]
    level = np.zeros(n)
    for i in range(n_links):
        if capacity[i] < 0:
            return level, False
    if sums[2] != 1.0:  # (some value is not a whole number)
        return level, False
    if not _bring_memo(ptr, rows, vals, memo_scale, memo_load, memo_count, sums, scale):
        return level, False
    # the columns taking part: those with a weight, but none crossing a link with no capacity
    frozen = np.empty(n, dtype=np.bool_)
    for j in range(n):
        frozen[j] = scale[j] == 0.0
    load = memo_load.copy()
    count = memo_count.copy()
    left = int(sums[0]) - _freeze_dead(
        ptr, rows, vals, row_ptr, row_cols, scale, capacity, frozen, load, count
    )
    sat_tol = _SAT_TOL
    leftover, tol = _leftover_and_tolerance(capacity, count, sat_tol)
    ratio = np.empty(n_links)
    sub = np.zeros(n_links)
    mark = np.zeros(n_links, dtype=np.bool_)
    touched = np.empty(n_links, dtype=np.intp)
    newly = np.empty(n, dtype=np.intp)
    busy = np.flatnonzero(count > 0)
    n_busy = busy.shape[0]
    water = 0.0
    while left:
        step = _next_step(busy, n_busy, leftover, load, ratio)
        water += step
        limit = step * (1 + sat_tol)
        n_new = 0
        for t in range(n_busy):
            i = busy[t]
            leftover[i] -= load[i] * step
            if ratio[i] <= limit or leftover[i] <= tol[i]:
                for e in range(row_ptr[i], row_ptr[i + 1]):
                    c = row_cols[e]
                    if not frozen[c]:
                        frozen[c] = True
                        newly[n_new] = c
                        n_new += 1
        n_touched = _take_out(newly, n_new, ptr, rows, vals, scale, count, sub, mark, touched)
        level[newly[:n_new]] = water
        left -= n_new
        emptied = False
        for t in range(n_touched):
            r = touched[t]
            mark[r] = False
            load[r] -= sub[r]
            sub[r] = 0.0
            if count[r] == 0:
                load[r] = 0.0
                leftover[r] = np.inf
                emptied = True
        if emptied:
            n_busy = _compact_busy(busy, n_busy, count)
    return level, True


@njit(cache=True)
def _csr(
    rows: IntArray, cols: IntArray, vals: FloatArray, n_rows: int
) -> tuple[IntArray, IntArray, FloatArray]:  # pragma: no cover - compiled
    """(ptr int[n_rows + 1], cols, vals) of the entries (rows[k], cols[k], vals[k]) grouped by
    row; a counting sort keeps each row's entries in entry order, as a stable argsort."""
    nnz = rows.shape[0]
    ptr = np.zeros(n_rows + 1, dtype=np.intp)
    for k in range(nnz):
        ptr[rows[k] + 1] += 1
    for i in range(n_rows):
        ptr[i + 1] += ptr[i]
    by_row_cols = np.empty(nnz, dtype=np.intp)
    by_row_vals = np.empty(nnz)
    fill = ptr[:-1].copy()
    for k in range(nnz):
        r = rows[k]
        by_row_cols[fill[r]] = cols[k]
        by_row_vals[fill[r]] = vals[k]
        fill[r] += 1
    return ptr, by_row_cols, by_row_vals


@njit(cache=True)
def _active_loads(
    rows: IntArray, cols: IntArray, vals: FloatArray, frozen: BoolArray, n_links: int
) -> tuple[FloatArray, IntArray]:  # pragma: no cover - compiled
    """(load float[n_links], count int[n_links]): the entries of the entities not frozen,
    summed per link in entry order, and their number."""
    load = np.zeros(n_links)
    count = np.zeros(n_links, dtype=np.intp)
    for k in range(rows.shape[0]):
        if not frozen[cols[k]]:
            load[rows[k]] += vals[k]
            count[rows[k]] += 1
    return load, count


@njit(cache=True)
def _leftover_and_tolerance(
    capacity: FloatArray, count: IntArray, sat_tol: float
) -> tuple[FloatArray, FloatArray]:  # pragma: no cover - compiled
    """(leftover, tol) per link: its capacity (inf when no active entity crosses it) and
    the saturation tolerance sat_tol x capacity."""
    n_links = capacity.shape[0]
    leftover = np.empty(n_links)
    tol = np.empty(n_links)
    for i in range(n_links):
        leftover[i] = capacity[i] if count[i] > 0 else np.inf
        tol[i] = sat_tol * capacity[i]
    return leftover, tol


@njit(cache=True)
def _ascending(
    newly: IntArray, n_new: int, is_new: BoolArray
) -> None:  # pragma: no cover - compiled
    """Put the step's `n_new` newly frozen entities in ascending order, as the numpy
    version's: a sort when they are few, else a scan of `is_new`."""
    n = is_new.shape[0]
    if n_new * 16 < n:
        newly[:n_new].sort()
        return
    n_new = 0
    for c in range(n):
        if is_new[c]:
            newly[n_new] = c
            n_new += 1


@njit(cache=True)
def _compact_busy(
    busy: IntArray, n_busy: int, count: IntArray
) -> int:  # pragma: no cover - compiled
    """Drop the links no active entity crosses any more from busy[:n_busy], in place and
    in order; returns the new count."""
    kept = 0
    for t in range(n_busy):
        if count[busy[t]] > 0:
            busy[kept] = busy[t]
            kept += 1
    return kept


@njit(cache=True)
def _bring_memo(
    ptr: IntArray, rows: IntArray, vals: FloatArray, memo_scale: FloatArray,
    memo_load: FloatArray, memo_count: IntArray, sums: FloatArray, scale: FloatArray,
) -> bool:  # pragma: no cover - compiled  # fmt: skip
    """Bring `_scaled_fill`'s memo (loads and counts of every column with a weight) to
    `scale`, updated where a weight changed. False, with the memo emptied, when a weight is
    not 0 or a whole number > 0 whose column has an entry (NaN and inf fail too), or the
    scaled entries add up to 2^53 or more."""
    for j in range(scale.shape[0]):
        w = scale[j]
        old = memo_scale[j]
        if w == old:
            continue
        if not (w == 0.0 or (np.floor(w) == w and w > 0 and ptr[j] < ptr[j + 1])):
            _forget(memo_scale, memo_load, memo_count, sums)
            return False
        if old > 0:
            sums[0] -= 1
            for k in range(ptr[j], ptr[j + 1]):
                memo_load[rows[k]] -= vals[k] * old
                memo_count[rows[k]] -= 1
                sums[1] -= vals[k] * old
        if w > 0:
            sums[0] += 1
            for k in range(ptr[j], ptr[j + 1]):
                memo_load[rows[k]] += vals[k] * w
                memo_count[rows[k]] += 1
                sums[1] += vals[k] * w
            if not sums[1] < _EXACT:  # (partial sums of whole numbers below 2^53 are exact)
                _forget(memo_scale, memo_load, memo_count, sums)
                return False
        memo_scale[j] = w
    return True


@njit(cache=True)
def _take_out(
    newly: IntArray, n_new: int, ptr: IntArray, rows: IntArray, vals: FloatArray,
    scale: FloatArray, count: IntArray, sub: FloatArray, mark: BoolArray, touched: IntArray,
) -> int:  # pragma: no cover - compiled  # fmt: skip
    """Take the step's newly frozen columns newly[:n_new] out of the links' counts, adding
    their scaled entries to `sub` per link; the links touched go to `touched` (marked in
    `mark`) in the order first met. Returns how many links were touched."""
    n_touched = 0
    for t in range(n_new):
        c = newly[t]
        for k in range(ptr[c], ptr[c + 1]):
            r = rows[k]
            count[r] -= 1
            sub[r] += vals[k] * scale[c]
            if not mark[r]:
                mark[r] = True
                touched[n_touched] = r
                n_touched += 1
    return n_touched


@njit(cache=True)
def _freeze_dead(
    ptr: IntArray, rows: IntArray, vals: FloatArray, row_ptr: IntArray, row_cols: IntArray,
    scale: FloatArray, capacity: FloatArray, frozen: BoolArray, load: FloatArray,
    count: IntArray,
) -> int:  # pragma: no cover - compiled  # fmt: skip
    """Freeze the columns crossing a link with no capacity, taking their scaled entries
    out of `load` and `count` (in place); returns how many were frozen."""
    n_frozen = 0
    for i in range(capacity.shape[0]):
        if capacity[i] <= 0:
            for e in range(row_ptr[i], row_ptr[i + 1]):
                c = row_cols[e]
                if not frozen[c]:
                    frozen[c] = True
                    n_frozen += 1
                    for k in range(ptr[c], ptr[c + 1]):
                        load[rows[k]] -= vals[k] * scale[c]
                        count[rows[k]] -= 1
    return n_frozen


@njit(cache=True)
def _scan_entries(
    rows: IntArray, cols: IntArray, vals: FloatArray, capacity: FloatArray, n: int
) -> tuple[int, bool, bool]:  # pragma: no cover - compiled
    """The checks of `_entry_arrays` in one pass: (fault: 0 none, 1 an entry <= 0 or a
    negative capacity, 2 a row or column out of range; whole: every value a whole number
    (as ``np.array_equal(vals, np.round(vals))``); covered: every entity has an entry).
    A NaN value or capacity is no fault here (as in the numpy checks before)."""
    for v in vals:
        if v <= 0:
            return 1, False, False
    for c in capacity:
        if c < 0:
            return 1, False, False
    n_links = capacity.shape[0]
    for k in range(rows.shape[0]):
        if rows[k] < 0 or rows[k] >= n_links or cols[k] < 0 or cols[k] >= n:
            return 2, False, False
    whole = True
    for v in vals:
        if np.floor(v) != v:
            whole = False
            break
    seen = np.zeros(n, dtype=np.bool_)
    for c in cols:
        seen[c] = True
    return 0, whole, bool(seen.all())


@njit(cache=True, error_model="numpy")
def waterfill_kernel(
    class_ptr: IntArray,
    count: IntArray,
    first: IntArray,
    hops: IntArray,
    starts: IntArray,
    ids: IntArray,
    w: FloatArray,
    avail: FloatArray,
    cap: FloatArray,
    full: BoolArray,
    touched: BoolArray,
    full_below: float,
) -> FloatArray:  # pragma: no cover - compiled
    """Water-filling of several classes of keys (DC pairs) over their paths, shortest paths
    first, the classes one after the other (round_fair_share.fair_share; docs/design.md 4.2
    steps 5-6): class c (keys class_ptr[c] .. class_ptr[c + 1] - 1) fills, for j = 0, 1,
    ..., every key's j-th path that crosses no full link, max-min fair weighted by the
    keys' weights, on what the rounds before left; the links used lose what they carry and
    join `full` when at most full_below of their capacity is left.

    The float operations, in order, of round_fair_share's water-filling in Python: one open
    path gets min over its links of max(avail, 0) / weight (floored at 0); several get
    `_sparse_fill`'s levels on max(avail, 0) of the links they cross (ascending), each
    link's use summed in entry order; avail = max(0, avail − use). (max(a, 0) is Python's:
    a unless 0 > a.)

    Args:
        class_ptr: int (classes + 1,), each class's first key.
        count, first: int (keys,), each key's paths and its first path's number.
        hops, starts: int (paths,), each path's links and its first entry in `ids`.
        ids: int (entries,), link indices (n_links: a link outside the index, always full).
        w: float (keys,), the keys' weights (> 0).
        avail: float (n_links,), bytes/s left, changed in place.
        cap: float (n_links,), the capacities `full_below` is taken of.
        full: bool (n_links + 1,), the full links (the last: outside the index), in place.
        touched: bool (n_links,), set for every link a path took rate from, in place.
        full_below: the fraction of a link's capacity at or below which it is full.
        (`_sparse_fill` runs with this module's tolerances, _RESUM and _SAT_TOL.)

    Returns:
        float (keys, most paths of a key): each key's level (rate / weight) on each path,
        0 where the path was closed or got nothing.
    """
    levels = np.zeros((count.shape[0], count.max() if count.shape[0] else 0))
    open_keys = np.empty(count.shape[0], dtype=np.intp)
    for c in range(class_ptr.shape[0] - 1):
        lo, hi = class_ptr[c], class_ptr[c + 1]
        depth = count[lo:hi].max() if hi > lo else 0
        for j in range(depth):
            n_open = _open_keys(lo, hi, j, count, first, hops, starts, ids, full, open_keys)
            if n_open == 1:
                k = open_keys[0]
                q = first[k] + j
                levels[k, j] = _fill_one(ids[starts[q] : starts[q] + hops[q]], w[k], avail,
                                         cap, full, touched, full_below)  # fmt: skip
            elif n_open > 1:
                _fill_several(open_keys[:n_open], j, first, hops, starts, ids, w, avail, cap,
                              full, touched, full_below, levels)  # fmt: skip
    return levels


@njit(cache=True)
def _open_keys(
    lo: int,
    hi: int,
    j: int,
    count: IntArray,
    first: IntArray,
    hops: IntArray,
    starts: IntArray,
    ids: IntArray,
    full: BoolArray,
    out: IntArray,
) -> int:  # pragma: no cover - compiled
    """Put the keys lo .. hi - 1 whose j-th path exists and crosses no `full` link into
    `out`, ascending; return how many."""
    n_open = 0
    for k in range(lo, hi):
        if count[k] <= j:
            continue
        q = first[k] + j
        blocked = False
        for e in range(starts[q], starts[q] + hops[q]):
            if full[ids[e]]:
                blocked = True
                break
        if not blocked:
            out[n_open] = k
            n_open += 1
    return n_open


@njit(cache=True, error_model="numpy")
def _fill_one(
    links: IntArray,
    weight: float,
    avail: FloatArray,
    cap: FloatArray,
    full: BoolArray,
    touched: BoolArray,
    full_below: float,
) -> float:  # pragma: no cover - compiled
    """One open path over `links` (indices) with `weight`: its level min_e max(avail_e, 0)
    / weight, floored at 0 (Python's min and max), taken from `avail`; returns the level."""
    a = avail[links[0]]
    low = (0.0 if 0.0 > a else a) / weight
    for e in range(1, links.shape[0]):
        a = avail[links[e]]
        v = (0.0 if 0.0 > a else a) / weight
        if v < low:
            low = v
    level = 0.0 if 0.0 > low else low
    x = weight * level
    for e in range(links.shape[0]):
        i = links[e]
        v = avail[i] - x
        avail[i] = v if v > 0.0 else 0.0
        touched[i] = True
        if not avail[i] > full_below * cap[i]:
            full[i] = True
    return level


@njit(cache=True, error_model="numpy")
def _fill_several(
    keys: IntArray,
    j: int,
    first: IntArray,
    hops: IntArray,
    starts: IntArray,
    ids: IntArray,
    w: FloatArray,
    avail: FloatArray,
    cap: FloatArray,
    full: BoolArray,
    touched: BoolArray,
    full_below: float,
    levels: FloatArray,
) -> None:  # pragma: no cover - compiled
    """Several open j-th paths (of `keys`): `_sparse_fill` over the links they cross, in
    index order, on max(avail, 0); each link's use summed in entry order is taken from
    `avail`; the levels go to levels[key, j]."""
    n_links = avail.shape[0]
    row = np.zeros(n_links, dtype=np.intp)  # a crossed link's row + 1 (0: not crossed)
    n_entries = 0
    for t in range(keys.shape[0]):
        q = first[keys[t]] + j
        n_entries += hops[q]
        for e in range(starts[q], starts[q] + hops[q]):
            row[ids[e]] = 1
    crossed = np.flatnonzero(row)
    row[crossed] = np.arange(1, crossed.shape[0] + 1)
    rows = np.empty(n_entries, dtype=np.intp)
    cols = np.empty(n_entries, dtype=np.intp)
    vals = np.empty(n_entries)
    m = 0
    for t in range(keys.shape[0]):
        q = first[keys[t]] + j
        for e in range(starts[q], starts[q] + hops[q]):
            rows[m] = row[ids[e]] - 1
            cols[m] = t
            vals[m] = w[keys[t]]
            m += 1
    capc = np.empty(crossed.shape[0])
    for r in range(crossed.shape[0]):
        a = avail[crossed[r]]
        capc[r] = 0.0 if 0.0 > a else a
    got = _sparse_fill(rows, cols, vals, capc, keys.shape[0], _RESUM, _SAT_TOL)
    used = np.zeros(crossed.shape[0])
    for e in range(n_entries):
        used[rows[e]] += vals[e] * got[cols[e]]
    for r in range(crossed.shape[0]):
        i = crossed[r]
        v = avail[i] - used[r]
        avail[i] = v if v > 0.0 else 0.0
        touched[i] = True
        if not avail[i] > full_below * cap[i]:
            full[i] = True
    for t in range(keys.shape[0]):
        levels[keys[t], j] = got[t]
