"""The compiled (numba) passes of Varys' and Rapier's rates (madd.py): volumes and Γ per
coflow, the sequential MADD pass, and the passes over the flows.

Each does the float operations of the numpy expressions it replaced, in their order
(np.bincount adds its weights one by one in index order), so the same values to the bit.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from terra_core.array_types import BoolArray, FloatArray, IntArray
from terra_core.sparse_index import add_held, flush_held


@njit(cache=True, error_model="numpy")
def coflow_gammas(
    volume: FloatArray, capacity: FloatArray
) -> FloatArray:  # pragma: no cover - compiled
    """`_gamma` of every row of `volume` (float array (coflows, links), bytes) on
    `capacity` (float array (links,), bytes/s): float array (coflows,) in seconds, the
    same values (a max is exact whatever the order); compiled (numba), the values of the
    numpy expressions of old (max of the used links' volume / capacity and 0, NaN if one
    is NaN; inf when a used link has no capacity)."""
    n_coflows, n_links = volume.shape
    gamma = np.zeros(n_coflows)
    for c in range(n_coflows):
        high = 0.0
        blocked = False
        for e in range(n_links):
            v = volume[c, e]
            if v > 0:
                if capacity[e] > 0:
                    r = v / capacity[e]
                    if r > high or np.isnan(r):
                        if not np.isnan(high):
                            high = r
                elif capacity[e] <= 0:
                    blocked = True
        gamma[c] = np.inf if blocked else high
    return gamma


@njit(cache=True, error_model="numpy")
def madd_pass(
    volume: FloatArray, gamma: FloatArray, capacity: FloatArray
) -> tuple[FloatArray, FloatArray]:  # pragma: no cover - compiled
    """The sequential MADD pass of Varys (Chowdhury et al., SIGCOMM 2014): coflows in the
    order of (Γ, row), each with finite Γ and some volume takes volume / g from what the
    earlier ones left, g = max over its links of volume / left, unless g is inf. Only the links a
    coflow uses are touched: on the others volume / g is 0 and left stays (the same floats
    as the whole-vector arithmetic). Compiled (numba): the float operations of the numpy
    version of old (a stable argsort; max with NaN propagating; np.maximum(x, 0.0)).

    Args:
        volume: float array (coflows, links), remaining bytes per coflow and link (>= 0).
        gamma: float array (coflows,), each coflow's Γ on `capacity` (inf: never served).
        capacity: float array (links,), bytes/s.

    Returns:
        (float array (coflows,): each coflow's g in seconds, inf where it got no MADD
        rates; float array (links,): the capacity left, bytes/s).
    """
    n_coflows, n_links = volume.shape
    g = np.full(n_coflows, np.inf)
    left = capacity.copy()
    for c in np.argsort(gamma, kind="mergesort"):
        if gamma[c] == np.inf:
            break  # the rest are inf too
        used = False
        blocked = False
        for e in range(n_links):
            if volume[c, e] != 0:
                used = True
                if left[e] <= 0:
                    blocked = True
        if not used or blocked:
            continue
        gc = -np.inf
        for e in range(n_links):
            if volume[c, e] != 0:
                r = volume[c, e] / left[e]
                if r > gc or np.isnan(r):
                    if not np.isnan(gc):
                        gc = r
        g[c] = gc
        for e in range(n_links):
            if volume[c, e] != 0:
                x = left[e] - volume[c, e] / gc
                left[e] = x if x > 0.0 or np.isnan(x) else 0.0
    return g, left


# ---- compiled passes over the flows of live_coflow_rates (numba) ------------------------
# Each does the float operations of the numpy expressions it replaced, in their order
# (np.bincount adds its weights one by one in index order), so the same values to the bit.


@njit(cache=True, error_model="numpy")
def flow_volumes(
    counts: IntArray,
    local: IntArray,
    remaining: FloatArray,
    base: IntArray,
    size: IntArray,
    members: FloatArray,
    ptr: IntArray,
    rows: IntArray,
    vals: FloatArray,
    shape: IntArray,
    weight: FloatArray,
    routed: BoolArray,
    hops: int,
    single: bool,
    n_links: int,
    n_shapes: int,
) -> tuple[IntArray, FloatArray, FloatArray, FloatArray, BoolArray, bool]:  # pragma: no cover
    """The per-flow pass before MADD.

    Args:
        counts: int array (coflows,); local, remaining: int and float arrays (flows,), as
            in `live_coflow_rates`; base, size: int arrays (coflows,) of `MaddLayout`;
            members, shape, weight, routed: per layout flow; ptr: int array (layout flows
            + 1,), layout flow f's entries are ptr[f] .. ptr[f + 1] - 1 of rows, vals
            (link rows and members); hops: entries of every flow if all equal, else 0;
            single: `MaddLayout.single` (then the member count is used for the equal
            values and weight, which are not read: the same floats, fewer bytes per
            flow); n_links, n_shapes: ints.

    Returns:
        (shape_of: int array (flows,), each given flow's route shape, -1 when it is not
        routed; per_member: float array (flows,), remaining bytes per member; volume:
        float array (coflows * n_links,), bytes per coflow and link row; total: float
        array (n_shapes,), the weight of the given routed flows per shape; unrouted: bool
        array (coflows,), the coflow has a given flow not routed; bad: True when an
        index is outside its coflow, the other results then incomplete).
    """
    n = len(local)
    shape_of = np.empty(n, dtype=np.intp)
    per_member = np.empty(n)
    volume = np.zeros(len(counts) * n_links)
    total = np.zeros(n_shapes)
    unrouted = np.zeros(len(counts), dtype=np.bool_)
    h0, a0, h1, a1 = -1, 0.0, -1, 0.0  # bins summed in registers (sparse_index.add_held)
    i = 0
    for c in range(len(counts)):
        offset = c * n_links
        for _ in range(counts[c]):
            j = local[i]
            if j < 0 or j >= size[c]:
                return shape_of, per_member, volume, total, unrouted, True
            f = base[c] + j
            m = members[f]
            pm = remaining[i] / m
            per_member[i] = pm
            start = ptr[f]
            if single and hops == 2:  # (bigswitch's routes; the loops below, unrolled)
                # (a coflow's flows to one DC follow each other: each hop's bins are
                # summed in a register, the same floats)
                x = m * pm
                h0, a0, h1, a1 = add_held(volume, offset + rows[start], x, 0, h0, a0, h1, a1)
                h0, a0, h1, a1 = add_held(volume, offset + rows[start + 1], x, 1, h0, a0, h1, a1)
            elif single:
                for h in range(start, ptr[f + 1]):
                    volume[offset + rows[h]] += m * pm
            else:
                for h in range(start, ptr[f + 1]):
                    volume[offset + rows[h]] += vals[h] * pm
            if routed[f]:
                s = shape[f]
                shape_of[i] = s
                total[s] += m if single else weight[f]
            else:
                shape_of[i] = -1
                unrouted[c] = True
            i += 1
    flush_held(volume, h0, a0, h1, a1)
    return shape_of, per_member, volume, total, unrouted, False


@njit(cache=True, error_model="numpy")
def flow_rates(
    counts: IntArray, per_member: FloatArray, g: FloatArray, shape_of: IntArray, extra: FloatArray
) -> FloatArray:  # pragma: no cover - compiled
    """Per-member rates: MADD's remaining / g of the flow's coflow plus the backfill
    level of its shape (float array (flows,), bytes/s); arguments as `flow_volumes`'
    results, g: float array (coflows,) in seconds, extra: float array (shapes,). A flow
    not routed (shape -1) gets (remaining / g) * 0.0. A coflow MADD skipped (g inf) adds
    0.0, which is what remaining / inf gives for finite remaining bytes per member (> 0,
    checked by the caller), without the division."""
    rate = np.empty(len(per_member))
    i = 0
    for c in range(len(counts)):
        gc = g[c]
        skipped = gc == np.inf
        for _ in range(counts[c]):
            pm = per_member[i]
            madd = 0.0 if skipped and pm < np.inf else pm / gc
            s = shape_of[i]
            rate[i] = madd + extra[s] if s >= 0 else madd * 0.0
            i += 1
    return rate
