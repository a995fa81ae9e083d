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
  validity.
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

from topologies import Topology
from workloads import Coflow

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
    dcs = list(topology.dcs)
    index = {dc: i for i, dc in enumerate(dcs)}
    volume = np.zeros((len(wan), len(dcs), len(dcs)))  # bytes per coflow, source, destination
    for j, c in enumerate(wan):
        for (src, dst), nbytes in c.flowgroups().items():
            if src not in index or dst not in index:
                raise ValueError(f"coflow {c.id}: DC pair {src}->{dst} not in {topology.name}")
            volume[j, index[src], index[dst]] += nbytes
    link_cap = np.zeros((len(dcs), len(dcs)))
    for u, v in topology.capacity:
        link_cap[index[u], index[v]] = topology.available((u, v))
    release = [c.arrival_s for c in wan]

    def cut_sum(side: frozenset) -> float:
        out = np.array([dc in side for dc in dcs], dtype=float)
        capacity = out @ link_cap @ (1.0 - out)
        work = np.einsum("i,jik,k->j", out, volume, 1.0 - out)
        if capacity <= 0:
            return float("inf") if work.any() else 0.0
        return srpt_flow_time(release, work / capacity)

    best_sum, best_cut, searched = _search_cuts(dcs, cut_sum, exhaustive_max_dcs)
    cut_avg = best_sum / len(wan)
    isolation = None
    if gamma_empty_s is not None:
        missing = [c.id for c in wan if c.id not in gamma_empty_s]
        if missing:
            raise ValueError(f"no Γ_empty for WAN coflows {missing[:5]}")
        isolation = sum(gamma_empty_s[c.id] for c in wan) / len(wan)
    bound = max(cut_avg, isolation or 0.0)
    return CctBound(bound, cut_avg, best_cut, searched, isolation, len(wan))


def _search_cuts(dcs: list[str], cut_sum, exhaustive_max_dcs: int):
    """(best sum, its source side, cuts evaluated) over the cuts described in the module doc."""
    seen: dict[frozenset, float] = {}

    def value(side: frozenset) -> float:
        if side not in seen:
            seen[side] = cut_sum(side)
        return seen[side]

    everything = frozenset(dcs)
    if len(dcs) <= exhaustive_max_dcs:
        for size in range(1, len(dcs)):
            for side in itertools.combinations(dcs, size):
                value(frozenset(side))
    else:
        starts = [frozenset([dc]) for dc in dcs] + [everything - {dc} for dc in dcs]
        for side in sorted(starts, key=value, reverse=True)[:_LOCAL_SEARCH_STARTS]:
            _climb(side, dcs, value)
    best = max(seen, key=lambda s: (seen[s], sorted(s)))
    return seen[best], best, len(seen)


def _climb(side: frozenset, dcs: list[str], value) -> None:
    """Flip one DC in or out of `side` while that raises the cut bound (first improvement)."""
    improved = True
    while improved:
        improved = False
        for dc in dcs:
            other = side ^ {dc}
            if 0 < len(other) < len(dcs) and value(other) > value(side):
                side, improved = other, True
