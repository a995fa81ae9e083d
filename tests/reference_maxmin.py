"""The numpy version of the sparse progressive filling, kept as the tests' reference for
the compiled `terra_core.maxmin.maxmin_levels_sparse` (Bertsekas & Gallager, "Data
Networks", section 6.5.2; the same float operations in the same order, so the same
levels to the bit)."""

from __future__ import annotations

import numpy as np

from terra_core.maxmin import _RESUM, _SAT_TOL, _entry_arrays


def maxmin_levels_sparse_numpy(
    rows: np.ndarray, cols: np.ndarray, vals: np.ndarray, capacity: np.ndarray, n: int
) -> np.ndarray:
    """`terra_core.maxmin.maxmin_levels_sparse` as plain numpy (its code before it was compiled,
    before the step loop was compiled with numba): the reference the tests hold it to.

    The same progressive filling, step for step, but a step costs O(links) plus
    the entries of the links that saturate and of the entities that freeze,
    not O(links x entities): the entries are indexed by link and by entity once,
    the number of active entities per link (it decides which links still carry
    load) and the loads are updated by subtracting the entries of the entities
    that freeze, and a load that fell below _RESUM of its last exact sum is
    summed again (so round-off stays about 1e3 x machine epsilon of the load).
    Used by the scheduling round's water-filling (docs/design.md 4.2 steps 5-6),
    where thousands of single-path entities cross a few links each.

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
    rows, cols, vals, capacity = _entry_arrays(rows, cols, vals, capacity, n)[:4]
    n_links = len(capacity)
    per_col = np.bincount(cols, minlength=n)
    if (per_col == 0).any():
        raise ValueError("an entity crosses no link: its rate would be unbounded")
    by_row = np.argsort(rows, kind="stable")
    row_ptr = np.concatenate(([0], np.cumsum(np.bincount(rows, minlength=n_links))))
    row_cols, row_ids, row_vals = cols[by_row], rows[by_row], vals[by_row]
    by_col = np.argsort(cols, kind="stable")
    col_ptr = np.concatenate(([0], np.cumsum(per_col)))
    col_rows, col_vals = rows[by_col], vals[by_col]
    level = np.zeros(n)
    frozen = np.zeros(n, dtype=bool)
    frozen[cols[capacity[rows] <= 0]] = True
    live = ~frozen[cols]
    load = np.bincount(rows[live], weights=vals[live], minlength=n_links)
    count = np.bincount(rows[live], minlength=n_links)
    exact = load.copy()  # each link's load when it was last summed (not subtracted)
    # a link no active entity crosses has leftover inf and load 0: its ratio is inf and it
    # never saturates, which spares a mask of the links in use per step
    leftover = np.where(count > 0, capacity, np.inf)
    tol = _SAT_TOL * capacity
    water = 0.0
    left = n - int(frozen.sum())
    with np.errstate(divide="ignore", invalid="ignore"):
        while left:
            ratio = leftover / load
            step = max(float(ratio.min()), 0.0)
            water += step
            leftover -= load * step
            limit = step * (1 + _SAT_TOL)
            sat = np.flatnonzero((ratio <= limit) | (leftover <= tol))
            cand = row_cols[csr_ranges_numpy(row_ptr, sat)]
            newly = np.sort(cand[~frozen[cand]])  # ascending, as a mask's flatnonzero
            if len(newly) > 1:  # an entity crossing two saturated links appears twice
                newly = newly[np.concatenate(([True], newly[1:] != newly[:-1]))]
            level[newly] = water
            frozen[newly] = True
            left -= len(newly)
            gone = csr_ranges_numpy(col_ptr, newly)
            touched = col_rows[gone]
            count -= np.bincount(touched, minlength=n_links)
            load -= np.bincount(touched, weights=col_vals[gone], minlength=n_links)
            # a load that fell below _RESUM of its last exact sum is summed again over the
            # active entries: subtracting alone leaves round-off of the order of the larger
            # value, which matters when weights differ by 1e6 (hypothesis found 1.2e-9)
            low = np.flatnonzero((load < _RESUM * exact) & (count > 0))
            if low.size:
                idx = csr_ranges_numpy(row_ptr, low)
                live_vals = row_vals[idx] * ~frozen[row_cols[idx]]
                load[low] = np.bincount(row_ids[idx], weights=live_vals, minlength=n_links)[low]
                exact[low] = load[low]
            empty = touched[count[touched] == 0]  # every saturated link is among them
            load[empty] = 0.0
            leftover[empty] = np.inf
    return level


def csr_ranges_numpy(ptr: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """`terra_core.maxmin.csr_ranges` as plain numpy (before it was compiled): the
    concatenated index ranges [ptr[i], ptr[i + 1]) for i in `ids` (CSR-style).

    Args:
        ptr: int array (m + 1,), non-decreasing: row i's entries are ptr[i] .. ptr[i + 1] - 1.
        ids: int array of rows in 0 .. m - 1 (any order, repeats allowed).

    Returns:
        int array of entry indices, row by row in the order of `ids`.
    """
    if len(ids) == 1:  # the common case of one saturated link
        return np.arange(ptr[ids[0]], ptr[ids[0] + 1])
    starts = ptr[ids]
    lens = ptr[ids + 1] - starts
    total = int(lens.sum())
    if total == 0:
        return np.zeros(0, dtype=np.intp)
    ends = np.cumsum(lens)
    return np.arange(total) + np.repeat(starts - (ends - lens), lens)
