"""Compiled loops of the scheduling round's rate passes (round_rates.consume), kept in
their own module so that their compiled code in `__pycache__` stays valid while the
passes around them change.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from terra_core.array_types import BoolArray, FloatArray, IntArray
from terra_core.maxmin import _RESUM, _SAT_TOL, _sparse_fill


@njit(cache=True, error_model="numpy")
def consume_kernel(
    left: FloatArray, ids: IntArray, lens: IntArray, x: FloatArray, hit: BoolArray
) -> None:  # pragma: no cover - compiled
    """left[i] = max(0, left[i] - x[p]) for every link i of every path p, in order.

    Args:
        left: float array (links,) of bytes/s, changed in place.
        ids: int array (entries,), the link indices of every path, one path after the other.
        lens: int array (paths,), the links per path.
        x: float array (paths,), each path's rate in bytes/s.
        hit: bool array (links,), set for every link a path crosses (in place).
    """
    k = 0
    for p in range(len(x)):
        xp = x[p]
        for _ in range(lens[p]):
            i = ids[k]
            k += 1
            hit[i] = True
            v = left[i] - xp
            left[i] = v if v > 0.0 else 0.0


def warm() -> None:
    """Load the kernels (from numba's cache in `__pycache__`, or compile them) with the
    argument types the round passes, so the first scheduling round does not pay it: about
    1.4 s from the cache, several seconds to compile. The controller builds its policy, and
    with it this, before it says it is ready."""
    consume_kernel(np.zeros(1), np.zeros(1, np.intp), np.ones(1, np.intp), np.zeros(1),
                   np.zeros(1, dtype=bool))  # fmt: skip
    one = np.ones(1, np.intp)
    waterfill(np.array([0, 1], np.intp), one, np.zeros(1, np.intp), one, np.zeros(1, np.intp),
              np.zeros(1, np.intp), np.ones(1), np.ones(1), np.ones(1),
              np.zeros(2, dtype=bool), np.zeros(1, dtype=bool), 1e-6)  # fmt: skip


def waterfill(
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
    """`waterfill_kernel` with progressive filling's tolerances of maxmin.py (its resum and
    saturation fractions); the arguments and the result are the kernel's."""
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
    maxmin._sparse_fill's levels on max(avail, 0) of the links they cross (ascending), each
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
        resum, sat_tol: maxmin._sparse_fill's tolerances.

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
