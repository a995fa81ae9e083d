"""Max-min fair rates on fixed paths by progressive filling (water-filling): numpy, and
the sparse filling's step loops compiled with numba (in maxmin_kernels.py, called from here).

Used by the per-flow, multipath, varys (backfill) and rapier baselines
(docs/design.md section 4.4), and by Terra's round, which water-fills DC pairs
over their paths, shortest first (maxmin_kernels.waterfill_kernel, design.md 4.2
steps 5-6).
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

from terra_core.array_types import FloatArray, IntArray
from terra_core.maxmin_kernels import (
    _RESUM,
    _SAT_TOL,
    _scaled_fill,
    _scan_entries,
    _sparse_fill,
)
from terra_core.sparse_index import csr_ranges, link_index, path_incidence
from topologies import Link, Path, path_links

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
