"""A lower bound on the average CCT that any scheduler can reach on a workload.

Used by ``benchmarks/foi_ceiling.py`` to tell how far Terra is from the best
possible schedule and which FoI over a baseline is attainable at all: no
scheduler can average below the bound, so FoI over a baseline can never exceed
``baseline avg CCT / bound``.

Two valid bounds, the larger is returned:

- *Cut bound* (any routing, any number of paths). For a set S of DCs, every byte
  a coflow sends from a DC in S to a DC outside S crosses the directed links
  leaving S, whose capacities add up to c(S). Treat those links as one machine
  of speed c(S): coflow j needs p_j = bytes_j(S -> not S) / c(S) seconds of it,
  from its arrival r_j on, and its CCT is at least the time until its last byte
  crosses. Preemptive shortest-remaining-processing-time (SRPT) minimizes the
  sum of (completion - release) on one machine with release dates and
  preemption (Schrage 1968; the problem 1|r_j, pmtn|ΣC_j), so SRPT's sum on the
  cut machine is a lower bound on the sum of CCTs of every schedule. The bound
  is the largest over the cuts searched: every cut when the WAN has at most
  `exhaustive_max_dcs` DCs (2^N - 2 of them), else the single-DC cuts, their
  complements and a local search (add or remove one DC while the bound grows)
  from the best few. The search only affects how tight the bound is, never its
  validity. Cost: each coflow's FlowGroups are kept sparse, as (source, destination,
  bytes) rows, and a step of the local search moves one DC, so the crossing bytes
  of every coflow change only by that DC's outgoing and incoming groups
  (`_CutSums`); the search never builds a coflows x DCs x DCs array.
- *Isolation bound* (only for schedulers that route every FlowGroup over the K
  shortest paths of the WAN as given, as all of ours do while no link changes
  state): a coflow's CCT is at least its Γ alone on the empty WAN
  (Optimization (1), docs/design.md section 4.1), so the sum of Γ_empty is a bound.
  It is NOT a bound for other routings, nor once a link goes down: the
  schedulers then recompute their K paths over the links that are up, and the
  new paths can avoid a bottleneck of the old ones (Γ can drop). Γ_empty comes
  from an LP (HiGHS), so it is exact only up to the solver's tolerance.

So `cut_avg_cct_s` bounds every scheduler (any routing, any number of paths,
also when links only lose capacity during the run), `avg_cct_s` only the
K-shortest-path schedulers on an unchanged WAN.

Coflows with no WAN flow are left out, as in every CCT statistic of the
simulator (SimResult.avg_cct_s averages over finished, admitted WAN coflows:
the same set when every WAN coflow is admitted and finishes).
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

from terra_model import Coflow
from topologies import Topology

EXHAUSTIVE_MAX_DCS = 12  # G-Scale (12 DCs): 4094 cuts; ATT (25): searched
_LOCAL_SEARCH_STARTS = 50


class CctBound(NamedTuple):
    """A lower bound on the average CCT of every scheduler (see the module docstring).

    Attributes:
        avg_cct_s: max of the two bounds below, seconds (valid for K-shortest-path
            schedulers on an unchanged WAN only when the isolation bound is given).
        cut_avg_cct_s: the cut bound, seconds; valid for every scheduler.
        cut: the DCs of the source side S of the best cut found (frozenset of names).
        cuts_searched: number of cuts evaluated.
        isolation_avg_cct_s: mean Γ_empty, seconds, or None when not computed.
        coflows: number of WAN coflows averaged over (those with a FlowGroup).
    """

    avg_cct_s: float
    cut_avg_cct_s: float
    cut: frozenset
    cuts_searched: int
    isolation_avg_cct_s: float | None
    coflows: int


def srpt_flow_time(release_s: Sequence[float], work_s: Sequence[float]) -> float:
    """Sum over jobs of (completion - release) under preemptive SRPT on one unit-speed machine.

    This is the minimum of that sum over all schedules (Schrage 1968, 1|r_j, pmtn|ΣC_j).

    At every release and completion the job with the least remaining work runs (ties:
    the earlier release); the machine idles only while no released job has work left.

    Args:
        release_s: release time of each job, seconds (finite).
        work_s: processing time of each job, seconds (>= 0; inf makes the sum inf).

    Returns:
        The sum of flow times, seconds (0.0 for no jobs or no work; jobs without work
        add 0).

    Raises:
        ValueError: lengths differ (or not 1-D), a negative or NaN work, or a
            non-finite release time.
    """
    release = np.asarray(release_s, dtype=float)
    work = np.asarray(work_s, dtype=float)
    if release.ndim != 1 or release.shape != work.shape:
        raise ValueError(f"{release.size} release times for {work.size} jobs")
    if not np.isfinite(release).all() or np.isnan(work).any() or (work < 0).any():
        raise ValueError("release times must be finite numbers and work non-negative numbers")
    if np.isinf(work).any():
        return float("inf")
    jobs = sorted((r, w) for r, w in zip(release.tolist(), work.tolist(), strict=True) if w > 0)
    total, now, i, queue = 0.0, 0.0, 0, []  # queue: [(remaining work, release)]
    while i < len(jobs) or queue:
        if not queue:
            now = max(now, jobs[i][0])
        while i < len(jobs) and jobs[i][0] <= now:
            heapq.heappush(queue, (jobs[i][1], jobs[i][0]))
            i += 1
        left, released = heapq.heappop(queue)
        next_release = jobs[i][0] if i < len(jobs) else float("inf")
        if now + left <= next_release:
            now += left
            total += now - released
        else:
            heapq.heappush(queue, (max(left - (next_release - now), 0.0), released))
            now = next_release
    return total


def avg_cct_lower_bound(
    coflows: Sequence[Coflow],
    topology: Topology,
    gamma_empty_s: dict[str, float] | None = None,
    exhaustive_max_dcs: int = EXHAUSTIVE_MAX_DCS,
) -> CctBound:
    """A lower bound on the average CCT of any schedule of `coflows` on `topology`.

    Args:
        coflows: the workload (arrival_s seconds, flows in bytes between DC names).
        topology: the WAN; `available` capacities (bytes/s) are used, down links count 0.
        gamma_empty_s: optional {coflow id: Γ_empty seconds} (simulator.empty_wan_gammas,
            same K as the schedulers) for the isolation bound; None leaves it out (then
            avg_cct_s == cut_avg_cct_s, a bound for every scheduler).
        exhaustive_max_dcs: search every cut up to this many DCs (module docstring).

    Returns:
        CctBound. avg_cct_s is inf when some coflow's bytes cannot cross a cut at all.

    Raises:
        ValueError: an empty workload (no WAN coflow), a DC unknown to the topology, or
            a WAN coflow missing from `gamma_empty_s`.
    """
    wan = [c for c in coflows if c.flowgroups()]
    if not wan:
        raise ValueError("no coflow with WAN flows: the average CCT is undefined")
    sums = _CutSums(wan, topology)
    best_sum, best_cut, searched = _search_cuts(sums, exhaustive_max_dcs)
    cut_avg = best_sum / len(wan)
    isolation = None
    if gamma_empty_s is not None:
        missing = [c.id for c in wan if c.id not in gamma_empty_s]
        if missing:
            raise ValueError(f"no Γ_empty for WAN coflows {missing[:5]}")
        isolation = sum(gamma_empty_s[c.id] for c in wan) / len(wan)
    bound = max(cut_avg, isolation or 0.0)
    return CctBound(bound, cut_avg, best_cut, searched, isolation, len(wan))


class _CutSums:
    """Per-cut SRPT sums from sparse FlowGroups, updated incrementally one DC at a time.

    A cut is its source side S as a boolean vector over the DCs. Its *state* is
    (crossing bytes per coflow, shape (coflows,); c(S) in bytes/s). Each coflow's
    FlowGroups are kept as flat arrays (coflow index, source, destination, bytes),
    sorted once by source and once by destination, so the groups leaving or entering
    a DC are contiguous slices. Moving one DC x into S adds the bytes of x's outgoing
    groups to a DC outside S and removes those of its incoming groups from a DC in S
    (they no longer cross); moving x out does the reverse. Links are handled the
    same way for c(S). So a move costs O(groups and links at x + coflows), not
    O(coflows x DCs^2) as a dense per-cut sum does.

    Rounding: a coflow's crossing bytes are a sum of some of its FlowGroups, so they
    are 0 or at least its smallest group; values below half of that (left by
    adding and subtracting along a search path) are set to exactly 0; likewise a
    c(S) below half the smallest link capacity.
    """

    def __init__(self, wan: Sequence[Coflow], topology: Topology) -> None:
        """Index the FlowGroups of `wan` (coflows with WAN flows) and the links of `topology`.

        Raises:
            ValueError: a FlowGroup names a DC unknown to the topology.
        """
        self.dcs = list(topology.dcs)
        index = {dc: i for i, dc in enumerate(self.dcs)}
        columns: list[tuple[np.ndarray, ...]] = []  # per coflow: (coflow, src, dst, bytes)
        for j, c in enumerate(wan):
            groups = c.flowgroups()
            unknown = [pair for pair in groups if pair[0] not in index or pair[1] not in index]
            if unknown:
                src, dst = unknown[0]
                raise ValueError(f"coflow {c.id}: DC pair {src}->{dst} not in {topology.name}")
            n = len(groups)
            columns.append(
                (
                    np.full(n, j, dtype=np.int64),
                    np.fromiter((index[a] for a, _ in groups), dtype=np.int64, count=n),
                    np.fromiter((index[b] for _, b in groups), dtype=np.int64, count=n),
                    np.fromiter(groups.values(), dtype=float, count=n),
                )
            )
        group, src, dst, nbytes = (np.concatenate(col) for col in zip(*columns, strict=True))
        self.coflows = len(wan)
        self.release = [c.arrival_s for c in wan]
        self.group, self.src, self.dst, self.bytes = group, src, dst, nbytes
        smallest = np.full(self.coflows, np.inf)
        np.minimum.at(smallest, group, nbytes)
        self.zero_below = smallest / 2
        links = [(index[u], index[v], topology.available((u, v))) for u, v in topology.capacity]
        self.link_u = np.array([lk[0] for lk in links], dtype=np.int64)
        self.link_v = np.array([lk[1] for lk in links], dtype=np.int64)
        self.link_cap = np.array([lk[2] for lk in links], dtype=float)
        positive = self.link_cap[self.link_cap > 0]
        self.capacity_zero_below = positive.min() / 2 if positive.size else 0.0
        n = len(self.dcs)
        self.out_groups = _slices(src, n, (group, dst, nbytes))  # per DC: (coflow, dst, bytes)
        self.in_groups = _slices(dst, n, (group, src, nbytes))  # per DC: (coflow, src, bytes)
        self.out_links = _slices(self.link_u, n, (self.link_v, self.link_cap))
        self.in_links = _slices(self.link_v, n, (self.link_u, self.link_cap))

    def mask(self, side: frozenset) -> np.ndarray:
        """Boolean vector over the DCs, True for the DCs of `side`."""
        return np.array([dc in side for dc in self.dcs], dtype=bool)

    def state(self, inside: np.ndarray) -> tuple[np.ndarray, float]:
        """(crossing bytes per coflow, c(S) bytes/s) of the cut `inside`, from scratch."""
        cross = inside[self.src] & ~inside[self.dst]
        crossing = _sum_by(self.group[cross], self.bytes[cross], self.coflows)
        capacity = float(self.link_cap[inside[self.link_u] & ~inside[self.link_v]].sum())
        return crossing, capacity

    def moved(
        self, inside: np.ndarray, crossing: np.ndarray, capacity: float, dc: int
    ) -> tuple[np.ndarray, float]:
        """State of the cut `inside` with DC index `dc` flipped, from the state of `inside`.

        `inside` itself is not changed.
        """
        sign = -1.0 if inside[dc] else 1.0  # +: dc joins S
        og, odst, obytes = self.out_groups[dc]
        ig, isrc, ibytes = self.in_groups[dc]
        gained = ~inside[odst]  # dc's groups to DCs outside S cross iff dc is in S
        lost = inside[isrc]  # groups from S into dc cross iff dc is outside S
        delta = _sum_by(og[gained], obytes[gained], self.coflows)
        delta -= _sum_by(ig[lost], ibytes[lost], self.coflows)
        crossing = crossing + sign * delta
        crossing[crossing < self.zero_below] = 0.0
        ov, ocap = self.out_links[dc]
        iu, icap = self.in_links[dc]
        capacity += sign * (float(ocap[~inside[ov]].sum()) - float(icap[inside[iu]].sum()))
        if capacity < self.capacity_zero_below:
            capacity = 0.0
        return crossing, capacity

    def total(self, crossing: np.ndarray, capacity: float) -> float:
        """SRPT sum of flow times (seconds) on the cut machine of this state."""
        if capacity <= 0:
            return float("inf") if crossing.any() else 0.0
        return srpt_flow_time(self.release, crossing / capacity)


def _sum_by(index: np.ndarray, weights: np.ndarray, n: int) -> np.ndarray:
    """Float vector of length n: the sum of `weights` per value of `index` (0 where none)."""
    return np.bincount(index, weights, minlength=n).astype(float, copy=False)


def _slices(key: np.ndarray, n: int, columns: tuple[np.ndarray, ...]) -> list[tuple]:
    """Per value v in 0..n-1 of `key`, the `columns` restricted to the rows where key == v."""
    order = np.argsort(key, kind="stable")
    bounds = np.searchsorted(key[order], np.arange(n + 1))
    sorted_cols = [col[order] for col in columns]
    return [tuple(col[bounds[v] : bounds[v + 1]] for col in sorted_cols) for v in range(n)]


def _search_cuts(sums: _CutSums, exhaustive_max_dcs: int):
    """(best sum, its source side, cuts evaluated) over the cuts described in the module doc.

    Exhaustive search evaluates every cut from scratch (sparse); the local search
    evaluates each neighbour of the current cut incrementally (_CutSums.moved).
    """
    dcs = sums.dcs
    seen: dict[frozenset, float] = {}

    def value(side: frozenset) -> float:
        if side not in seen:
            seen[side] = sums.total(*sums.state(sums.mask(side)))
        return seen[side]

    everything = frozenset(dcs)
    if len(dcs) <= exhaustive_max_dcs:
        for size in range(1, len(dcs)):
            for side in itertools.combinations(dcs, size):
                value(frozenset(side))
    else:
        starts = [frozenset([dc]) for dc in dcs] + [everything - {dc} for dc in dcs]
        for side in sorted(starts, key=value, reverse=True)[:_LOCAL_SEARCH_STARTS]:
            _climb(side, sums, seen)
    best = max(seen, key=lambda s: (seen[s], sorted(s)))
    return seen[best], best, len(seen)


def _climb(side: frozenset, sums: _CutSums, seen: dict[frozenset, float]) -> None:
    """Flip one DC in or out of `side` while that raises the cut bound (first improvement).

    Records every cut it evaluates in `seen` (cut -> SRPT sum). Neighbours are
    evaluated from the current cut's state by moving one DC (_CutSums.moved).
    """
    dcs = sums.dcs
    inside = sums.mask(side)
    crossing, capacity = sums.state(inside)
    if side not in seen:
        seen[side] = sums.total(crossing, capacity)
    improved = True
    while improved:
        improved = False
        for i, dc in enumerate(dcs):
            other = side ^ {dc}
            if not 0 < len(other) < len(dcs):
                continue
            if other in seen:
                if seen[other] > seen[side]:
                    crossing, capacity = sums.moved(inside, crossing, capacity, i)
                else:
                    continue
            else:
                moved = sums.moved(inside, crossing, capacity, i)
                seen[other] = sums.total(*moved)
                if not seen[other] > seen[side]:
                    continue
                crossing, capacity = moved
            inside = inside.copy()
            inside[i] = not inside[i]
            side, improved = other, True
