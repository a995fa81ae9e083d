"""Sparse index helpers of the max-min and MCF code: link rows, links x paths incidence
(dense and as nonzero entries), CSR ranges, and two-register bin sums for compiled loops.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from numba import njit

from terra_core.array_types import FloatArray, IntArray
from topologies import Link, Path, path_links


@njit(cache=True)
def add_held(
    out: FloatArray, b: int, x: float, slot: int, h0: int, a0: float, h1: int, a1: float
) -> tuple[int, float, int, float]:  # pragma: no cover - compiled
    """``out[b] += x`` with the running sums of up to two bins of `out` held in registers
    by the caller's loop: bin h0 in a0 and bin h1 in a1 (-1: no bin; out[h] is stale for
    a held bin h), returned as (h0, a0, h1, a1). A bin in neither slot goes into slot
    `slot` (0 or 1), whose bin is written back first; the caller writes the held bins back
    at the end (`flush_held`). The same additions in the same order as
    ``out[b] += x``, so the same floats; a run of additions to one bin then waits on each
    addition only, not on a store and a load of `out` (compiled, numba; out: float array,
    b: int, x: float).
    """
    if b == h0:
        a0 += x
    elif b == h1:
        a1 += x
    elif slot == 0:
        if h0 >= 0:
            out[h0] = a0
        h0 = b
        a0 = out[b] + x
    else:
        if h1 >= 0:
            out[h1] = a1
        h1 = b
        a1 = out[b] + x
    return h0, a0, h1, a1


@njit(cache=True)
def flush_held(
    out: FloatArray, h0: int, a0: float, h1: int, a1: float
) -> None:  # pragma: no cover - compiled
    """Write the bins `add_held` holds in registers back to `out` (``out[h] = a`` for
    each held bin h >= 0)."""
    if h0 >= 0:
        out[h0] = a0
    if h1 >= 0:
        out[h1] = a1


@njit(cache=True)
def csr_ranges(ptr: IntArray, ids: IntArray) -> IntArray:  # pragma: no cover - compiled
    """The concatenated index ranges [ptr[i], ptr[i + 1]) for i in `ids` (CSR-style);
    compiled (numba).

    Args:
        ptr: int array (m + 1,), non-decreasing: row i's entries are ptr[i] .. ptr[i + 1] - 1.
        ids: int array of rows in 0 .. m - 1 (any order, repeats allowed; not checked).

    Returns:
        int array (intp) of entry indices, row by row in the order of `ids`.
    """
    total = 0
    for i in ids:
        total += ptr[i + 1] - ptr[i]
    out = np.empty(total, dtype=np.intp)
    k = 0
    for i in ids:
        for j in range(ptr[i], ptr[i + 1]):
            out[k] = j
            k += 1
    return out


def link_index(links: Sequence[Link]) -> dict[Link, int]:
    """Return {link: row} for building incidence matrices over `links` (in that order)."""
    return {link: i for i, link in enumerate(links)}


def path_incidence(
    entities: Sequence[Sequence[tuple[Path, float]]],
    rows: dict[Link, int],
    path_rows: dict[Path, list[int]] | None = None,
) -> np.ndarray:
    """Build the incidence matrix of entities given as [(path, members on that path), ...].

    Args:
        entities: for each entity, its paths with the number of members on each
            (a single flow on one path is ``[(path, 1)]``).
        rows: {link: row index} (see `link_index`); every link of every path must be in it.
        path_rows: optional cache {path: row indices of its links} for these `rows`,
            filled as paths are met (pass the same dict across calls to reuse it).

    Returns:
        float array (len(rows), len(entities)).

    Raises:
        KeyError: a path crosses a link missing from `rows`.
    """
    matrix = np.zeros((len(rows), len(entities)))
    path_rows = {} if path_rows is None else path_rows
    for j, members in enumerate(entities):
        for path, count in members:
            hit = path_rows.get(path)
            if hit is None:
                hit = path_rows[path] = [rows[link] for link in path_links(path)]
            matrix[hit, j] += count
    return matrix


def path_entries(
    entities: Sequence[Sequence[tuple[Path, float]]],
    rows: dict[Link, int],
    path_rows: dict[Path, list[int]] | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The nonzero entries of `path_incidence(entities, rows, path_rows)`, for
    `maxmin_levels_sparse`.

    Args:
        entities, rows, path_rows: as `path_incidence`.

    Returns:
        (link rows, entity columns, members): int, int and float arrays (nnz,), one entry
        per (entity, path with > 0 members, link of the path) in entity order; an entity
        with members on several paths through one link has one entry per path there
        (they add up, as in the dense matrix).

    Raises:
        KeyError: a path crosses a link missing from `rows`.
    """
    path_rows = {} if path_rows is None else path_rows
    link_rows: list[int] = []
    cols: list[int] = []
    vals: list[float] = []
    for j, members in enumerate(entities):
        for path, count in members:
            if count <= 0:
                continue
            hit = path_rows.get(path)
            if hit is None:
                hit = path_rows[path] = [rows[link] for link in path_links(path)]
            link_rows.extend(hit)
            cols.extend([j] * len(hit))
            vals.extend([count] * len(hit))
    return (
        np.array(link_rows, dtype=np.intp),
        np.array(cols, dtype=np.intp),
        np.array(vals, dtype=float),
    )
