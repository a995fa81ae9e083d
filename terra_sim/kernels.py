"""The simulator's passes over the live flows, compiled with numba (docs/design.md 4.4):
rates set from per-pair levels, the time to the next finish, moving flows on and
finishing them, checking and storing per-coflow rates with their link loads.

Each does the float operations of the numpy expressions it replaced, in their order, so
every rate, remaining byte count and finish time is the same to the bit; the callers check
nothing here that they did not check before.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from terra_core.sparse_index import add_held, flush_held


@njit(cache=True, error_model="numpy")
def set_rates(live, pair_of, members, per_member, rate, rem):  # pragma: no cover - compiled
    """``rate[live] = members[live] * per_member[pair_of[live]]`` (bytes/s), in place, and
    what `next_finish(live, rem, rate)` then answers (seconds), in the same pass.

    Args:
        live: int array of flow positions; pair_of: int array (flows,) of pair indices;
        members: float array (flows,); per_member: float array (pairs,) of bytes/s;
        rate: float array (flows,), written; rem: float array (flows,) of bytes.
    """
    best = np.inf
    for p in live:
        r = members[p] * per_member[pair_of[p]]
        rate[p] = r
        if r > 0 and not np.isnan(best):
            t = rem[p] / r
            if t < best or np.isnan(t):
                best = t
    return best


@njit(cache=True, error_model="numpy")
def next_finish(live, rem, rate):  # pragma: no cover - compiled
    """Seconds until the first live flow with a positive rate finishes at its rate (the
    smallest rem / rate; inf when none moves).

    Args:
        live: int array of flow positions; rem: float array (flows,) of remaining bytes;
        rate: float array (flows,) of bytes/s.
    """
    best = np.inf
    for p in live:
        r = rate[p]
        if r > 0:
            t = rem[p] / r
            if t < best or np.isnan(t):
                best = t
                if np.isnan(t):
                    break
    return best


@njit(cache=True, error_model="numpy")
def _moved_on(before, r, step, limit, finish_bytes):  # pragma: no cover - compiled
    """One flow's remaining bytes after `step` seconds at `r` bytes/s (> 0), and whether it
    finishes: when before / r <= `limit` (seconds) or what is left is <= `finish_bytes`,
    and then 0.0 bytes are left. The finish rule of `advance_flows` and `advance_live`."""
    after = before - r * step
    if before / r <= limit or after <= finish_bytes:
        return 0.0, True
    return after, False


@njit(cache=True, error_model="numpy")
def advance_flows(live, rem, rate, step, limit, finish_bytes):  # pragma: no cover - compiled
    """Move the live flows with a positive rate `step` seconds on, in place in `rem`; a
    flow whose rem / rate <= `limit` (seconds) or whose remaining bytes after the step are
    <= `finish_bytes` finishes (its remaining bytes become 0).

    Args:
        live: int array of flow positions, ascending; rem, rate: float arrays (flows,) of
            bytes and bytes/s; step, limit: seconds; finish_bytes: bytes.

    Returns:
        (bytes each moving flow delivered, float array in position order; positions of the
        flows that finished, int array, ascending; the other live flows, ascending).
    """
    n = len(live)
    moved = np.empty(n)
    done = np.empty(n, dtype=np.intp)
    kept = np.empty(n, dtype=np.intp)
    k = 0
    d = 0
    n_kept = 0
    for i in range(n):
        p = live[i]
        r = rate[p]
        finished = False
        if r > 0:
            before = rem[p]
            after, finished = _moved_on(before, r, step, limit, finish_bytes)
            if finished:
                done[d] = p
                d += 1
            moved[k] = before - after
            rem[p] = after
            k += 1
        if not finished:
            kept[n_kept] = p
            n_kept += 1
    return moved[:k], done[:d], kept[:n_kept]


@njit(cache=True, error_model="numpy")
def advance_live(
    live, tag, live_rem, live_rate, rem, step, limit, finish_bytes
):  # pragma: no cover - compiled
    """`advance_flows` on flows kept in live order, in place: the live flows with a
    positive rate move `step` seconds on in `live_rem`; a flow whose remaining bytes /
    rate <= `limit` (seconds) or whose remaining bytes after the step are <= `finish_bytes`
    finishes: its remaining bytes become 0 in `rem` and its entries leave `live`, `tag`
    and `live_rem`, the others moving forward in order (the first n_kept entries are then
    the kept flows'; `live_rate` is left as it is). The same float operations as
    `advance_flows`, so the same bytes to the bit.

    Args:
        live: int array (n,) of flow positions, ascending; tag: int array (n,) of values
            carried along (each flow's index in its coflow); live_rem, live_rate: float
            arrays (n,) of each live flow's remaining bytes and bytes/s; rem: float array
            (flows,) of bytes by position; step, limit: seconds; finish_bytes: bytes.

    Returns:
        (bytes each moving flow delivered, float array in live order; positions of the
        flows that finished, int array, ascending; n_kept, the number of flows left).
    """
    n = len(live)
    moved = np.empty(n)
    done = np.empty(n, dtype=np.intp)
    k = 0
    d = 0
    n_kept = 0
    for i in range(n):
        r = live_rate[i]
        if r > 0:
            before = live_rem[i]
            after, finished = _moved_on(before, r, step, limit, finish_bytes)
            moved[k] = before - after
            k += 1
            if finished:
                rem[live[i]] = after
                done[d] = live[i]
                d += 1
                continue
            live_rem[i] = after
        if n_kept != i:
            live[n_kept] = live[i]
            tag[n_kept] = tag[i]
            live_rem[n_kept] = live_rem[i]
        n_kept += 1
    return moved[:k], done[:d], n_kept


@njit(cache=True, error_model="numpy")
def store_rates(
    live,
    per_member,
    routed_members,
    rate,
    entry_start,
    entry_count,
    pool_rows,
    pool_vals,
    hops,
    single,
    n_rows,
    some_unrouted,
    live_rem,
):  # pragma: no cover - compiled
    """``rate[:] = routed_members[live] * per_member`` (bytes/s, in live order: rate is a
    float array (len(live),)), the link loads it puts on the `n_rows` link rows (the
    flow at position p has entry_count[p] pool entries from entry_start[p]; hops: their
    number when every flow has as many, else 0; summed in flow position order, then entry
    order: np.bincount's order of old), and the seconds to the first finish (the smallest
    live_rem / rate over positive rates, as `next_finish`), all in one pass; live_rem:
    float array (len(live),), the live flows' remaining bytes, in live order; single: every
    flow's route is one path with all its routed members (each entry's value is then the
    flow's routed members, and the loads add the flow's rate: the same floats, without
    reading pool_vals).

    Returns:
        (index into `live` of a faulty rate or -1: the first that is not finite and >= 0,
        else, when `some_unrouted`, the first positive one with no member routed (the
        caller raises; what was written then does not matter); float array (n_rows,) of
        bytes/s per link row; seconds to the first finish).
    """
    load = np.zeros(n_rows)
    h0, a0, h1, a1 = -1, 0.0, -1, 0.0  # link rows summed in registers (sparse_index.add_held)
    unrouted = -1
    best = np.inf
    for i in range(len(live)):
        p = live[i]
        r = per_member[i]
        if not (r >= 0 and r < np.inf):
            return i, load, best
        members = routed_members[p]
        if some_unrouted and unrouted < 0 and r > 0 and members == 0:
            unrouted = i
        flow_rate = members * r
        rate[i] = flow_rate
        start = entry_start[p]
        if single and hops == 2:  # (bigswitch's routes; the loop below, unrolled)
            # (flow_rate = pool_vals[start] * r: the same floats; flows to one DC follow
            # each other: each hop's loads are summed in a register, the same floats)
            h0, a0, h1, a1 = add_held(load, pool_rows[start], flow_rate, 0, h0, a0, h1, a1)
            h0, a0, h1, a1 = add_held(load, pool_rows[start + 1], flow_rate, 1, h0, a0, h1, a1)
        else:
            for h in range(start, start + entry_count[p]):
                load[pool_rows[h]] += pool_vals[h] * r
        if flow_rate > 0 and not np.isnan(best):
            t = live_rem[i] / flow_rate
            if t < best or np.isnan(t):
                best = t
    flush_held(load, h0, a0, h1, a1)
    return unrouted, load, best
