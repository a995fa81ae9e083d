"""Max-min fair rates on fixed paths by progressive filling (water-filling): numpy, and
the sparse filling's step loop compiled with numba.

Used by the per-flow, multipath, varys (backfill) and rapier baselines
(docs/design.md section 4.4), and by Terra's round, which water-fills DC pairs
over their paths, shortest first (`waterfill_paths`, design.md 4.2 steps 5-6).
This is the classic progressive-filling algorithm
(Bertsekas & Gallager, "Data Networks", section 6.5.2): every unfrozen entity
raises its level at the same pace; when a link saturates, every entity crossing
it freezes; when an entity reaches its cap, it freezes. Each step freezes at
least one link or entity, so there are at most (links + entities) steps, each
one matrix-vector product.

An *entity* is anything whose members share one rate: a flow on one path, a
bundle of n identical flows on one path (coefficient n on each link of the
path), or a bundle whose members are spread over several paths (coefficient =
number of members on a path through the link). The level of an entity is the
rate of one of its members in bytes/s; its load on link e is
``incidence[e, j] * level[j]``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import numpy as np
from numba import njit

from terra_core.array_types import BoolArray, FloatArray, IntArray
from terra_core.sparse_index import csr_ranges, link_index, path_incidence
from topologies import Link, Path, path_links

_RESUM = 1e-3  # maxmin_levels_sparse sums a link's load again below this share of its last sum
_SAT_TOL = 1e-12  # a link is saturated when its leftover is below this fraction of its capacity
DENSE_CELLS = 1 << 18  # maxmin_levels_entries fills densely up to this many links x entities


def maxmin_levels(
    incidence: np.ndarray,
    capacity: np.ndarray,
    caps: np.ndarray | None = None,
    integer: bool | None = None,
) -> np.ndarray:
    """Max-min fair levels (per-member rates) of entities sharing links.

    Args:
        incidence: float array (n_links, n_entities) >= 0; entry (e, j) is the
            number of entity j's members that cross link e (0 = not at all).
        capacity: float array (n_links,) of link capacities in bytes/s (>= 0;
            0 means the link is down and everything crossing it gets 0).
        caps: optional float array (n_entities,) of per-member rate caps in
            bytes/s (np.inf = uncapped; 0 = entity gets 0).
        integer: True when every entry of `incidence` is a whole number (member
            counts; saves the check), None to check. Whole numbers let the loads be
            updated exactly per frozen column instead of one product per step.

    Returns:
        float array (n_entities,) of levels in bytes/s: the max-min fair
        allocation, i.e. no level can grow without lowering a level that is
        not larger. Link loads ``incidence @ levels`` stay within capacity up to
        floating-point rounding.

    Raises:
        ValueError: mismatched shapes, negative entries, or an uncapped entity
            that crosses no link (its max-min rate would be infinite).
    """
    incidence = np.asarray(incidence, dtype=float)
    capacity = np.asarray(capacity, dtype=float)
    n_links, n = incidence.shape
    if capacity.shape != (n_links,):
        raise ValueError(f"capacity has shape {capacity.shape}, expected ({n_links},)")
    caps = np.full(n, np.inf) if caps is None else np.asarray(caps, dtype=float)
    if caps.shape != (n,):
        raise ValueError(f"caps has shape {caps.shape}, expected ({n},)")
    if (incidence < 0).any() or (capacity < 0).any() or (caps < 0).any():
        raise ValueError("incidence, capacity and caps must be >= 0")
    crosses = incidence > 0
    if (~crosses.any(axis=0) & np.isinf(caps)).any():
        raise ValueError("an uncapped entity crosses no link: its rate would be unbounded")
    level = np.zeros(n)
    leftover = capacity.copy()
    frozen = (caps <= 0) | crosses[capacity <= 0].any(axis=0)
    has_caps = bool(np.isfinite(caps).any())
    # with integer entries the load of the active entities is kept exactly by subtracting
    # the columns that freeze (each column once) instead of a product per step
    integral = integer if integer is not None else np.array_equal(incidence, np.round(incidence))
    load = incidence @ (~frozen).astype(float)
    water = 0.0  # the level of every active entity (they all rose together from 0)
    left = n - int(frozen.sum())
    while left:
        if not integral:
            load = incidence @ (~frozen).astype(float)
        used = load > 0
        ratio = np.full(n_links, np.inf)
        ratio[used] = leftover[used] / load[used]
        step = float(ratio.min(initial=np.inf))
        if has_caps:
            gap = np.where(frozen, np.inf, caps - water)
            step = min(step, float(gap.min(initial=np.inf)))
        step = max(step, 0.0)
        water += step
        leftover -= load * step
        # the links / caps that set the step are saturated by construction (ensures progress)
        limit = step * (1 + _SAT_TOL)
        saturated = used & ((ratio <= limit) | (leftover <= _SAT_TOL * capacity))
        leftover[saturated] = 0.0
        hit = crosses[saturated].any(axis=0)
        if has_caps:
            hit |= gap <= limit
        newly = hit & ~frozen
        level[newly] = water
        frozen |= newly
        left -= int(newly.sum())
        if integral:
            load = load - incidence[:, newly].sum(axis=1)
    return level


def maxmin_levels_sparse(
    rows: np.ndarray, cols: np.ndarray, vals: np.ndarray, capacity: np.ndarray, n: int
) -> np.ndarray:
    """`maxmin_levels` without caps for an incidence matrix given by its nonzero entries.

    The same progressive filling, step for step, but a step costs O(links) plus
    the entries of the links that saturate and of the entities that freeze,
    not O(links x entities): the entries are indexed by link and by entity once,
    the number of active entities per link (it decides which links still carry
    load) and the loads are updated by subtracting the entries of the entities
    that freeze, and a load that fell below _RESUM of its last exact sum is
    summed again (so round-off stays about 1e3 x machine epsilon of the load).
    Used by the scheduling round's water-filling (docs/design.md 4.2 steps 5-6),
    where thousands of single-path entities cross a few links each, and by the
    baselines. Progressive filling: Bertsekas & Gallager, "Data Networks", 6.5.2.

    The step loop runs compiled (numba, `_sparse_fill`): the float operations of the
    numpy version (tests/reference_maxmin.py) in its order (loads summed in entry order,
    a step's frozen entries summed per link and then subtracted, entities frozen in
    ascending order), so the same levels to the bit. The first call in a process loads
    the compiled code from `__pycache__` (~0.7 CPU s; it is compiled there on first use).

    Args:
        rows, cols: int arrays (nnz,) of link rows and entity columns; an entry
            may repeat (its values add up, as in the dense matrix).
        vals: float array (nnz,) > 0 of the entries (members, or weights).
        capacity: float array (n_links,) >= 0 of bytes/s (0: everything crossing gets 0).
        n: number of entities (columns).

    Returns:
        float array (n,) of levels in bytes/s, as `maxmin_levels(dense, capacity)`
        up to floating-point round-off in the loads.

    Raises:
        ValueError: mismatched lengths, an entry <= 0 or an index out of range,
            negative capacity, or an entity with no entry (unbounded rate).
    """
    rows, cols, vals, capacity, _, covered = _entry_arrays(rows, cols, vals, capacity, n)
    return _sparse_levels(rows, cols, vals, capacity, n, covered)


def _sparse_levels(
    rows: IntArray, cols: IntArray, vals: FloatArray, capacity: FloatArray, n: int, covered: bool
) -> np.ndarray:
    """`maxmin_levels_sparse` of entries already checked by `_entry_arrays` (`covered`:
    its answer whether every entity has an entry).

    Raises:
        ValueError: an entity with no entry (unbounded rate).
    """
    if not covered:
        raise ValueError("an entity crosses no link: its rate would be unbounded")
    return _sparse_fill(rows, cols, vals, capacity, n, _RESUM, _SAT_TOL)


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


def maxmin_levels_entries(
    rows: np.ndarray,
    cols: np.ndarray,
    vals: np.ndarray,
    capacity: np.ndarray,
    n: int,
    integer: bool | None = None,
) -> np.ndarray:
    """Max-min fair levels of an incidence given by its nonzero entries: the compiled
    `maxmin_levels_sparse` when every value is a whole number (member counts) or the
    matrix is large (links x entities > DENSE_CELLS), else `maxmin_levels` on the dense
    matrix (a small WAN with real-valued weights). With whole numbers both fillings keep
    the loads as exact integer sums (while they stay below 2^53), so they take the same
    steps and give the same levels to the bit; with real weights they agree up to
    floating-point round-off in the loads, and the dense side is kept there so that small
    WANs keep their results.

    Args:
        rows, cols, vals, capacity, n: as `maxmin_levels_sparse` (entries may repeat).
        integer: True when every value is a whole number (e.g. member counts), False when
            not, None to check.

    Returns:
        float array (n,) of levels in bytes/s.

    Raises:
        ValueError: as `maxmin_levels_sparse` (the same checks on either side).
    """
    rows, cols, vals, capacity, whole, covered = _entry_arrays(rows, cols, vals, capacity, n)
    if integer is None:
        integer = whole
    if integer or len(capacity) * n > DENSE_CELLS:
        return _sparse_levels(rows, cols, vals, capacity, n, covered)
    if not covered:
        raise ValueError("an entity crosses no link: its rate would be unbounded")
    matrix = np.zeros((len(capacity), n))
    np.add.at(matrix, (rows, cols), vals)
    return maxmin_levels(matrix, capacity, integer=False)


_EXACT = 2.0**53  # whole numbers below this add up exactly in float64


class ColumnsByRow(NamedTuple):
    """A fixed incidence's transpose and the memo `maxmin_levels_scaled` keeps in it
    (`columns_by_row`).

    Attributes:
        row_ptr, row_cols: int arrays (n_links + 1,) and (nnz,): the entries of row i
            belong to the columns row_cols[row_ptr[i]:row_ptr[i + 1]] (one per entry, so
            a column with two entries on a row is there twice), in entry order.
        scale: float array (n,), the weights of the last call (0 at first).
        load: float array (n_links,), the sum of the entries times those weights per row.
        count: int array (n_links,), the entries of columns with a weight > 0 per row.
        sums: float array (3,): columns with a weight > 0, the sum of all entries times
            their weights, 1.0 when every value is a whole number (else 0.0).
    """

    row_ptr: np.ndarray
    row_cols: np.ndarray
    scale: np.ndarray
    load: np.ndarray
    count: np.ndarray  # type: ignore[assignment]  # (a field named as tuple.count, read by name)
    sums: np.ndarray


def columns_by_row(
    ptr: np.ndarray, rows: np.ndarray, vals: np.ndarray, n_links: int
) -> ColumnsByRow:
    """The transpose of an incidence stored by column with an empty memo, for
    `maxmin_levels_scaled` (see ColumnsByRow).

    Args:
        ptr: int array (n + 1,): column j's entries are ptr[j] .. ptr[j + 1] - 1.
        rows, vals: int and float arrays (nnz,): the link row (0 .. n_links - 1) and the
            value of each entry.
        n_links: number of link rows.
    """
    ptr = np.asarray(ptr, dtype=np.intp)
    rows = np.asarray(rows, dtype=np.intp)
    vals = np.asarray(vals, dtype=float)
    cols = np.repeat(np.arange(len(ptr) - 1, dtype=np.intp), np.diff(ptr))
    row_ptr = np.concatenate(([0], np.cumsum(np.bincount(rows, minlength=n_links))))
    return ColumnsByRow(
        row_ptr.astype(np.intp),
        cols[np.argsort(rows, kind="stable")],
        np.zeros(len(ptr) - 1),
        np.zeros(n_links),
        np.zeros(n_links, dtype=np.intp),
        np.array([0.0, 0.0, float(np.array_equal(vals, np.floor(vals)))]),
    )


def maxmin_levels_scaled(
    ptr: np.ndarray,
    rows: np.ndarray,
    vals: np.ndarray,
    scale: np.ndarray,
    capacity: np.ndarray,
    by_row: ColumnsByRow | None = None,
) -> np.ndarray:
    """Max-min fair levels of the columns of a fixed incidence, each column's entries
    scaled by a weight that changes from call to call (0: the column takes no part).

    This is `maxmin_levels_entries` on the entries (rows[k], j, vals[k] * scale[j]) of
    the columns j with scale[j] > 0, numbered in order, but without building those
    entries: when every value and weight is a whole number and the loads stay below
    2^53, every load the filling sums is exact whatever the order of the entries, so the
    progressive filling (Bertsekas & Gallager, "Data Networks", 6.5.2; see
    `maxmin_levels_sparse`) takes the same steps on the fixed structure, by column
    (`ptr`) and by row (`by_row`), as on freshly built entries, and gives the same
    levels to the bit (`_scaled_fill`, compiled, which also checks those conditions).
    For the same reason the loads of all columns with a weight are kept in `by_row`
    from call to call and updated for the columns whose weight changed only. Otherwise
    the entries are built and `maxmin_levels_entries` fills them. Used by the varys /
    rapier backfill, where the columns are route shapes and the weights their flows'
    total weight, which changes for a few shapes per event (docs/design.md section 4.4).

    Args:
        ptr: int array (n + 1,): column j's entries are ptr[j] .. ptr[j + 1] - 1 (each
            column has at least one).
        rows, vals: int and float arrays (nnz,): link row and value (> 0) of each entry.
        scale: float array (n,) >= 0: the weight of each column (0: no part, level 0).
        capacity: float array (n_links,) >= 0 of bytes/s.
        by_row: `columns_by_row(ptr, rows, vals, n_links)`, when the caller keeps it (for
            these ptr, rows and vals only; its memo is updated here).

    Returns:
        float array (n,) of levels in bytes/s (0 where scale is 0).

    Raises:
        ValueError: as `maxmin_levels_entries` (a negative capacity; a negative scale);
            `scale`, `capacity` or `by_row` of other sizes than the columns and links.
    """
    capacity = np.ascontiguousarray(capacity, dtype=float)
    scale = np.ascontiguousarray(scale, dtype=float)
    vals = np.ascontiguousarray(vals, dtype=float)
    if by_row is None:
        by_row = columns_by_row(ptr, rows, vals, len(capacity))
    if not len(ptr) - 1 == len(scale) == len(by_row.scale) or len(by_row.load) != len(capacity):
        raise ValueError("scale, capacity or by_row do not fit the columns")
    level, exact = _scaled_fill(ptr, rows, vals, *by_row, scale, capacity)
    if exact:
        return level
    if (scale < 0).any():
        raise ValueError("scales must be >= 0")
    present = np.flatnonzero(scale)
    entries = csr_ranges(ptr, present)
    cols = np.repeat(np.arange(len(present), dtype=np.intp), ptr[present + 1] - ptr[present])
    level = np.zeros(len(scale))
    level[present] = maxmin_levels_entries(
        rows[entries], cols, vals[entries] * scale[present][cols], capacity, len(present)
    )
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


def _entry_arrays(
    rows: np.ndarray, cols: np.ndarray, vals: np.ndarray, capacity: np.ndarray, n: int
) -> tuple[IntArray, IntArray, FloatArray, FloatArray, bool, bool]:
    """(rows, cols, vals, capacity, whole, covered) of an incidence given by its entries:
    contiguous int, int, float and float arrays, checked as `maxmin_levels_sparse`
    documents (in one compiled pass, `_scan_entries`); whole: every value is a whole
    number; covered: every entity 0 .. n - 1 has an entry.

    Raises:
        ValueError: mismatched lengths, an entry <= 0, a negative capacity, or a row or
            column out of range.
    """
    rows = np.ascontiguousarray(rows, dtype=np.intp)
    cols = np.ascontiguousarray(cols, dtype=np.intp)
    vals = np.ascontiguousarray(vals, dtype=float)
    capacity = np.ascontiguousarray(capacity, dtype=float)
    if not rows.shape == cols.shape == vals.shape or rows.ndim != 1:
        raise ValueError("rows, cols and vals must have the same length")
    if capacity.ndim != 1:
        raise ValueError(f"capacity has shape {capacity.shape}, expected (n_links,)")
    fault, whole, covered = _scan_entries(rows, cols, vals, capacity, n)
    if fault == 1:
        raise ValueError("entries must be > 0 and capacities >= 0")
    if fault == 2:
        raise ValueError("an entry's row or column is out of range")
    return rows, cols, vals, capacity, whole, covered


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


def maxmin_on_paths(
    entities: Sequence[Sequence[tuple[Path, float]]],
    capacity: dict[Link, float],
    caps: Sequence[float] | None = None,
) -> np.ndarray:
    """Max-min fair per-member rates for entities on fixed paths (see `maxmin_levels`).

    Args:
        entities: for each entity, [(path, members on that path), ...].
        capacity: {link: bytes/s} available on each link (0 = down or full);
            links missing from it count as 0.
        caps: optional per-member rate caps in bytes/s (inf = none).

    Returns:
        float array of per-member rates in bytes/s, one per entity; the entity's
        rate on a path is its rate times the members on that path.

    Raises:
        ValueError: as `maxmin_levels`.
    """
    links = sorted({link for members in entities for p, _ in members for link in path_links(p)})
    rows = link_index(links)
    cap_vec = np.array([capacity.get(link, 0.0) for link in links], dtype=float)
    return maxmin_levels(
        path_incidence(entities, rows), cap_vec, None if caps is None else np.asarray(caps)
    )


def waterfill_paths(
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
) -> FloatArray:
    """`waterfill_kernel` with this module's progressive-filling tolerances (_RESUM,
    _SAT_TOL); the arguments and the result are the kernel's. The kernel lives here, beside
    `_sparse_fill`, which it calls compiled: numba's cache of a function is invalidated only
    by changes to its own file."""
    return waterfill_kernel(class_ptr, count, first, hops, starts, ids, w, avail, cap, full,
                            touched, full_below, _RESUM, _SAT_TOL)  # fmt: skip


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
    resum: float,
    sat_tol: float,
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
        resum, sat_tol: `_sparse_fill`'s tolerances.

    Returns:
        float (keys, most paths of a key): each key's level (rate / weight) on each path,
        0 where the path was closed or got nothing.
    """
    n_keys = count.shape[0]
    depth_all = 0
    for k in range(n_keys):
        if count[k] > depth_all:
            depth_all = count[k]
    levels = np.zeros((n_keys, depth_all))
    n_links = avail.shape[0]
    present = np.zeros(n_links, dtype=np.intp)  # a crossed link's row + 1 (0: not crossed)
    crossed = np.empty(n_links, dtype=np.intp)
    for c in range(class_ptr.shape[0] - 1):
        lo, hi = class_ptr[c], class_ptr[c + 1]
        depth = 0
        for k in range(lo, hi):
            if count[k] > depth:
                depth = count[k]
        for j in range(depth):
            open_keys = np.empty(hi - lo, dtype=np.intp)
            n_open = 0
            n_entries = 0
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
                    open_keys[n_open] = k
                    n_open += 1
                    n_entries += hops[q]
            if n_open == 0:
                continue
            if n_open == 1:
                k = open_keys[0]
                q = first[k] + j
                weight = w[k]
                s = starts[q]
                a = avail[ids[s]]
                low = (0.0 if 0.0 > a else a) / weight
                for e in range(s + 1, s + hops[q]):
                    a = avail[ids[e]]
                    v = (0.0 if 0.0 > a else a) / weight
                    if v < low:
                        low = v
                level = 0.0 if 0.0 > low else low
                x = weight * level
                for e in range(s, s + hops[q]):
                    i = ids[e]
                    v = avail[i] - x
                    avail[i] = v if v > 0.0 else 0.0
                    touched[i] = True
                    if not avail[i] > full_below * cap[i]:
                        full[i] = True
                levels[k, j] = level
                continue
            # several open paths: max-min over the links they cross, in index order
            for t in range(n_open):
                q = first[open_keys[t]] + j
                for e in range(starts[q], starts[q] + hops[q]):
                    present[ids[e]] = 1
            n_crossed = 0
            for i in range(n_links):
                if present[i]:
                    crossed[n_crossed] = i
                    n_crossed += 1
                    present[i] = n_crossed
            rows = np.empty(n_entries, dtype=np.intp)
            cols = np.empty(n_entries, dtype=np.intp)
            vals = np.empty(n_entries)
            m = 0
            for t in range(n_open):
                k = open_keys[t]
                q = first[k] + j
                for e in range(starts[q], starts[q] + hops[q]):
                    rows[m] = present[ids[e]] - 1
                    cols[m] = t
                    vals[m] = w[k]
                    m += 1
            capc = np.empty(n_crossed)
            for r in range(n_crossed):
                a = avail[crossed[r]]
                capc[r] = 0.0 if 0.0 > a else a
            got = _sparse_fill(rows, cols, vals, capc, n_open, resum, sat_tol)
            used = np.zeros(n_crossed)
            for e in range(n_entries):
                used[rows[e]] += vals[e] * got[cols[e]]
            for r in range(n_crossed):
                i = crossed[r]
                present[i] = 0
                v = avail[i] - used[r]
                avail[i] = v if v > 0.0 else 0.0
                touched[i] = True
                if not avail[i] > full_below * cap[i]:
                    full[i] = True
            for t in range(n_open):
                levels[open_keys[t], j] = got[t]
    return levels
