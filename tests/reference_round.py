"""Reference: Terra's scheduling round as it was before the incremental rewrite (e29c38f).

A frozen copy of terra_core/scheduling_round.py at e29c38f (docs/design.md 4.2),
kept only so that tests/unit/test_round_equivalence.py can check that the faster round
(incremental full-link set, per-class water-filling on the links a class uses)
gives the same rates, states and order. Not used by the package; do not optimise.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, field

import numpy as np

from terra_core.maxmin import maxmin_levels
from terra_core.mcf import maxmin_mcf
from terra_core.min_cct import (
    DualBound,
    MinCct,
    Pair,
    PairRates,
    links_of,
    min_cct,
)
from topologies import Link, Path

SCHEDULED, PREEMPTED, DEADLINE = "scheduled", "preempted", "deadline"
_FULL = 1e-6  # a link with less than this fraction of its capacity left counts as full
_TIGHT = 1e-9  # relative gap under which bounds on Γ count as exact
_MIN_WEIGHT = 1e-3  # step 6: smallest FlowGroup weight relative to its coflow's largest
# (smaller weights would put the MCF's freezing duals near the solver tolerance)
MCF_MAX_COLUMNS = 160  # steps 5-6 use the MCF up to this many (pair, path) columns


@dataclass
class RoundResult:
    """What one round decided.

    Attributes:
        rates: {coflow id: {(src, dst): [(path, bytes/s), ...]}} for every
            coflow that gets any rate (paths merged, rates > 0).
        state: {coflow id: "deadline" | "scheduled" | "preempted"} for every input coflow.
        order: non-deadline coflow ids in the order steps 3-4 took them.
        gammas: {coflow id: the key it was taken with}: Γ in seconds on the full
            capacities for coflows that could still be scheduled, a lower bound on
            it for coflows preempted without an LP.
        exact: {coflow id: MinCct on the full capacities} solved in this round (for Γ
            and prices; its rates skip the fewest-link-bytes stage)
            (with link prices: the caller may cache them, see terra_policy.py).
        lps: LPs solved in this round (min-CCT and MCF).
    """

    rates: dict[str, PairRates] = field(default_factory=dict)
    state: dict[str, str] = field(default_factory=dict)
    order: list[str] = field(default_factory=list)
    gammas: dict[str, float] = field(default_factory=dict)
    exact: dict[str, MinCct] = field(default_factory=dict)
    lps: int = 0


def schedule_round(
    coflows: dict[str, dict[Pair, float]],
    paths: dict[Pair, list[Path]],
    capacity: dict[Link, float],
    now: float = 0.0,
    deadlines: dict[str, float] | None = None,
    alpha: float = 0.1,
    hints: dict[str, tuple[float, bool]] | None = None,
    memo: dict | None = None,
) -> RoundResult:
    """Run one scheduling round (docs/design.md 4.2 steps 1-6).

    Args:
        coflows: {coflow id: {(src DC, dst DC): remaining bytes}} of the active
            coflows, in arrival order (the tie-break of the Γ order). Coflows
            with no positive volume are ignored.
        paths: {(src, dst): [path, ...]}: candidate paths per DC pair, over links
            that are up (every link of a path must be a key of `capacity`).
        capacity: {(u, v): bytes/s} available now (down links 0 or absent).
        now: current time in seconds (for deadlines).
        deadlines: {coflow id: absolute deadline in seconds} of the admitted
            deadline coflows among `coflows`.
        alpha: starvation share in [0, 1).
        hints: optional {coflow id: (lower bound on Γ on `capacity` in seconds,
            exact)} known to the caller (e.g. a cached Γ rescaled, or a
            weak-duality bound, min_cct.DualBound). Coflows without a
            hint start from the bound max_k d_k / Σ_{p ∈ P_k} bottleneck(p).
        memo: optional dict the caller keeps between rounds (and clears when
            paths change): step 4's min-CCT solutions on r, reused without an LP
            when r is unchanged and the volumes allow it (see `_min_cct_on_r`).

    Returns:
        RoundResult. Link loads stay within `capacity` (solver round-off is
        scaled away).

    Raises:
        ValueError: alpha outside [0, 1), or a FlowGroup whose DC pair has no
            entry in `paths` (the message names the coflow and the pair).
    """
    if not 0.0 <= alpha < 1.0:
        raise ValueError(f"alpha must be in [0, 1), got {alpha!r}")
    deadlines = deadlines or {}
    active = {cid: {p: v for p, v in fgs.items() if v > 0} for cid, fgs in coflows.items()}
    active = {cid: fgs for cid, fgs in active.items() if fgs}
    for cid, fgs in active.items():
        for pair in fgs:
            if pair not in paths:
                raise ValueError(f"coflow {cid!r}: no path set for DC pair {pair[0]}->{pair[1]}")
    result = RoundResult()
    left = {link: max(0.0, c) for link, c in capacity.items()}
    rates: dict[str, dict[Pair, dict[Path, float]]] = {}

    # Step 1: admitted deadline coflows, earliest deadline first.
    deadline_ids = reserve_deadlines(active, paths, left, now, deadlines, rates, result)

    # Steps 2-4: reserve α, order by Γ on the full capacities, sequential min-CCT on r.
    reserve = {link: alpha * c for link, c in left.items()}
    r = {link: c - reserve[link] for link, c in left.items()}
    others = [cid for cid in active if cid not in result.state]
    scheduled, preempted = _sequential(
        active, others, paths, capacity, r, hints, memo, rates, result
    )

    # Step 5: the α share to the preempted coflows.
    if preempted and alpha > 0:
        _alpha_share(active, preempted, paths, reserve, capacity, rates, result)
    spare = {link: r[link] + reserve[link] for link in left}

    # Step 6: work conservation, earlier coflows in the order first.
    _work_conservation(
        active, scheduled + preempted + deadline_ids, paths, spare, capacity, rates, result
    )

    result.rates = _finish(rates, capacity)
    return result


def _sequential(active, others, paths, capacity, r, hints, memo, rates, result) -> tuple:
    """Steps 3-4 with lazy ordering: a heap keyed by lower bounds on Γ.

    Popping the smallest key: a coflow that cannot reach r any more (some
    FlowGroup has every path through a full link) is preempted at once — r only
    shrinks, so it would be preempted at its exact place too; a key that is
    only a bound is replaced by the exact Γ (an LP on the full capacities) and
    pushed back; an exact key is the coflow's turn: min-CCT on r. So the
    coflows that can still be scheduled are taken in exact Γ order, and no LP
    is spent ordering coflows that will be preempted anyway.

    Returns:
        (scheduled ids, preempted ids), each in the order taken; result.order,
        result.gammas (the keys used), result.exact and result.state are filled in.
    """
    hints = hints or {}
    heap = []
    for pos, cid in enumerate(others):
        key, exact = hints.get(cid) or (_quick_bound(active[cid], paths, capacity), False)
        heap.append((key, pos, cid, exact))
    heapq.heapify(heap)
    scheduled: list[str] = []
    preempted: list[str] = []
    while heap:
        key, pos, cid, exact = heapq.heappop(heap)
        if not _all_reachable(active[cid], paths, r, capacity):
            result.state[cid] = PREEMPTED
        elif not exact:
            res = _solve(active[cid], paths, capacity, result, rates_needed=False)
            result.exact[cid] = res
            heapq.heappush(heap, (res.gamma_s, pos, cid, True))
            continue
        else:
            res = _min_cct_on_r(cid, active[cid], paths, r, memo, result)
            result.state[cid] = PREEMPTED if math.isinf(res.gamma_s) else SCHEDULED
            if result.state[cid] == SCHEDULED:
                _take(rates, cid, res.rates, r, 1.0)
        result.order.append(cid)
        result.gammas[cid] = key
        (scheduled if result.state[cid] == SCHEDULED else preempted).append(cid)
    return scheduled, preempted


def _min_cct_on_r(cid, volumes, paths, r, memo, result) -> MinCct:
    """Optimization (1) on the residual r, reusing the memo of an earlier round when exact.

    A memo entry (r then, volumes d then, MinCct then) is reused when r is
    unchanged and the bounds of min_cct.DualBound and of monotonicity
    (Γ' <= Γ · max_k d'_k/d_k) meet: then Γ' is that value and scaling FlowGroup
    k's old rates by (d'_k/d_k) / max_k(d'_k/d_k) is a minimal allocation.
    """
    if memo is None:
        return _solve(volumes, paths, r, result)
    entry = memo.get(cid)
    if entry is not None:
        r_then, d_then, res, bound = entry
        if r_then == r and volumes.keys() <= d_then.keys() and not math.isinf(res.gamma_s):
            ratio = {pair: v / d_then[pair] for pair, v in volumes.items()}
            top = max(ratio.values())
            upper = res.gamma_s * top
            if upper <= bound.gamma(volumes) * (1 + _TIGHT):
                rates = {
                    pair: [(path, x * ratio[pair] / top) for path, x in res.rates[pair]]
                    for pair in volumes
                }
                return MinCct(upper, rates, prices=res.prices)
    res = _solve(volumes, paths, r, result)
    memo[cid] = (dict(r), dict(volumes), res, DualBound.build(volumes, paths, r, res.prices))
    return res


def _quick_bound(volumes, paths, capacity) -> float:
    """Γ >= max_k d_k / Σ_{p ∈ P_k} min_{e ∈ p} c_e (each FlowGroup alone, paths unshared)."""
    bound = 0.0
    for pair, d in volumes.items():
        flow = sum(min(capacity.get(e, 0.0) for e in links_of(p)) for p in paths[pair])
        bound = max(bound, d / flow if flow > 0 else math.inf)
    return bound


def reserve_deadlines(
    coflows: dict[str, dict[Pair, float]],
    paths: dict[Pair, list[Path]],
    left: dict[Link, float],
    now: float,
    deadlines: dict[str, float],
    rates: dict | None = None,
    result: RoundResult | None = None,
) -> list[str]:
    """Step 1: stretched min-CCT allocations of the admitted deadline coflows, EDF.

    Each deadline coflow in `coflows` gets its min-CCT rates on `left` scaled by
    Γ/(D − now) (by 1 when D − now ≤ Γ: it is late, best effort), and `left`
    shrinks by them (in place).

    Args:
        coflows: {coflow id: {(src, dst): remaining bytes}} (others are ignored).
        paths: per DC pair paths.
        left: {link: bytes/s} capacity, reduced in place.
        now: seconds.
        deadlines: {coflow id: absolute deadline, seconds}.
        rates: optional {cid: {pair: {path: bytes/s}}} accumulator, updated in place.
        result: optional RoundResult whose `state` and `lps` are updated.

    Returns:
        The deadline coflow ids that are in `coflows`, earliest deadline first.
    """
    result = RoundResult() if result is None else result
    rates = {} if rates is None else rates
    by_deadline = sorted((d, i, cid) for i, (cid, d) in enumerate(deadlines.items()))
    ids = [cid for _, _, cid in by_deadline if cid in coflows]
    for cid in ids:
        time_left = deadlines[cid] - now
        # (step 1's rates: d_k / time_left split with the fewest link-bytes, min_cct's
        # finish_s)
        finish = time_left if time_left > 0 else None
        res = min_cct(coflows[cid], paths, left, finish_s=finish)
        result.lps += res.lp_solved
        result.state[cid] = DEADLINE
        if math.isinf(res.gamma_s):
            continue
        _take(rates, cid, res.rates, left, 1.0)
    return ids


def _solve(volumes, paths, capacity, result: RoundResult, rates_needed: bool = True):
    res = min_cct(volumes, paths, capacity, fewest_link_bytes=rates_needed)
    result.lps += res.lp_solved
    return res


def _all_reachable(volumes, paths, r, capacity) -> bool:
    """Every FlowGroup has a path whose links all have more than _FULL of capacity left."""
    open_links = _open_links(r, capacity)
    for pair in volumes:
        if not any(open_links.issuperset(links_of(p)) for p in paths[pair]):
            return False
    return True


def _open_links(avail: dict[Link, float], capacity: dict[Link, float]) -> set[Link]:
    """The links of `avail` with more than _FULL of their capacity left (not full)."""
    get = capacity.get
    return {link for link, a in avail.items() if a > _FULL * get(link, 0.0)}


def _take(rates, cid: str, pair_rates: PairRates, left: dict[Link, float], scale: float) -> None:
    """Add `pair_rates` × scale to coflow `cid` and subtract them from `left`."""
    mine = rates.setdefault(cid, {})
    for pair, lst in pair_rates.items():
        _assign(mine, pair, lst, scale)
        _consume(left, lst, scale)


def _assign(mine: dict, pair: Pair, lst: list[tuple[Path, float]], scale: float) -> None:
    """Add the path rates `lst` × scale to one coflow's {pair: {path: bytes/s}}."""
    per_path = mine.setdefault(pair, {})
    for path, rate in lst:
        per_path[path] = per_path.get(path, 0.0) + rate * scale


def _consume(left: dict[Link, float], lst: list[tuple[Path, float]], scale: float = 1.0) -> None:
    """Subtract the path rates `lst` × scale from the capacities `left` (floored at 0)."""
    for path, rate in lst:
        x = rate * scale
        for link in links_of(path):
            left[link] = max(0.0, left[link] - x)


def _alpha_share(active, preempted, paths, reserve, capacity, rates, result) -> None:
    """Step 5: max-min over the preempted FlowGroups on the reserved capacity.

    FlowGroups of one DC pair have the same paths, so the fair share is computed
    per DC pair weighted by its number of preempted FlowGroups and split equally.
    """
    members: dict[Pair, list[str]] = {}
    for cid in preempted:
        for pair in active[cid]:
            members.setdefault(pair, []).append(cid)
    weights = {pair: float(len(cids)) for pair, cids in members.items()}
    pair_rates = _fair_share(weights, paths, reserve, capacity, result)
    for pair, lst in pair_rates.items():
        share = 1.0 / len(members[pair])
        for cid in members[pair]:
            _assign(rates.setdefault(cid, {}), pair, lst, share)


def _work_conservation(active, order, paths, spare, capacity, rates, result) -> None:
    """Step 6: the spare capacity to the coflows in `order`, earlier coflows first.

    Every DC pair belongs to the earliest coflow in `order` with a FlowGroup on it. The
    coflows' pairs are filled one coflow at a time (priority classes of the max-min MCF),
    and within a coflow max-min fair weighted by the FlowGroups' remaining volumes: its
    FlowGroups first all grow in proportion to their volumes (its λ rises, so its CCT
    falls, as in Optimization (1) on the spare capacity) until some FlowGroup is blocked,
    then the others keep growing. A later coflow gets only what the earlier ones cannot
    use, and nothing on a pair an earlier coflow holds (that pair's paths are full).
    """
    owner: dict[Pair, str] = {}
    for cid in order:
        for pair in active[cid]:
            owner.setdefault(pair, cid)
    rank = {cid: i for i, cid in enumerate(order)}
    priority = {pair: rank[cid] for pair, cid in owner.items()}
    top: dict[str, float] = {}
    for pair, cid in owner.items():
        top[cid] = max(top.get(cid, 0.0), active[cid][pair])
    weights = {pair: max(active[cid][pair] / top[cid], _MIN_WEIGHT) for pair, cid in owner.items()}
    pair_rates = _fair_share(weights, paths, spare, capacity, result, priority)
    for pair, lst in pair_rates.items():
        _assign(rates.setdefault(owner[pair], {}), pair, lst, 1.0)


def _fair_share(weights, paths, avail, capacity, result: RoundResult, priority=None) -> PairRates:
    """Weighted max-min rates of DC pairs over their paths on `avail` capacity,
    which shrinks by them (in place); with `priority` ({pair: class}), lower classes
    are filled first and a class sees only what the earlier ones left.

    Up to MCF_MAX_COLUMNS (pair, path) columns: the max-min fair MCF
    (mcf.py, SWAN-style; a pair may shift its rate between paths). Beyond:
    progressive filling on fixed paths, one subflow per (pair, path) weighted
    like its pair (maxmin.maxmin_levels), because the MCF's LPs cost ~0.2 s per
    round on ATT's 600 DC pairs (measured) while water-filling costs ~5 ms.
    Both leave no path with spare capacity on every link unused.
    """
    priority = priority or {}
    if sum(len(paths[pair]) for pair in weights) > MCF_MAX_COLUMNS:
        classes: dict[int, list[Pair]] = {}
        for pair in weights:
            classes.setdefault(priority.get(pair, 0), []).append(pair)
        out: PairRates = {}
        for cls in sorted(classes):
            out.update(_waterfill_pairs(classes[cls], weights, paths, avail, capacity))
        return out
    open_links = _open_links(avail, capacity)
    usable = {
        pair: [p for p in paths[pair] if open_links.issuperset(links_of(p))] for pair in weights
    }
    demands = {pair: (ps, None) for pair, ps in usable.items() if ps}
    if not demands:
        return {}
    stats = {"lps": 0}
    out = maxmin_mcf(demands, _positive(avail), priority=priority, weights=weights, stats=stats)
    result.lps += stats["lps"]
    out = {pair: lst for pair, lst in out.items() if lst}
    for lst in out.values():
        _consume(avail, lst)
    return out


def _waterfill_pairs(pairs, weights, paths, avail, capacity) -> PairRates:
    """Water-filling of `pairs` on `avail`, which shrinks by the result (in place):
    shortest paths first. Round j fills every pair's j-th path (paths come fewest hops
    first) max-min fair weighted like its pair, on what rounds 0..j-1 left; paths through
    a full link get 0. A byte sent over a longer path takes capacity on more links, so
    the pairs' short paths are used up before any pair spills onto a longer one."""
    out: PairRates = {}
    depth = max((len(paths[pair]) for pair in pairs), default=0)
    for j in range(depth):
        open_links = _open_links(avail, capacity)
        columns = [
            (pair, paths[pair][j])
            for pair in pairs
            if j < len(paths[pair]) and open_links.issuperset(links_of(paths[pair][j]))
        ]
        if not columns:
            continue
        levels, used = _waterfill([(p, weights[pair]) for pair, p in columns], avail)
        for link, x in zip(avail, used.tolist(), strict=True):
            avail[link] = max(0.0, avail[link] - x)
        for (pair, p), level in zip(columns, levels.tolist(), strict=True):
            if level > 0:
                out.setdefault(pair, []).append((p, level * weights[pair]))
    return out


def _waterfill(
    entities: list[tuple[Path, float]], capacity: dict[Link, float]
) -> tuple[np.ndarray, np.ndarray]:
    """Max-min levels of single-path entities [(path, weight)] (maxmin.maxmin_levels).

    Returns:
        (levels per entity, bytes/s used per link in the order of `capacity`).
    """
    row = {link: i for i, link in enumerate(capacity)}
    rows, cols, vals = [], [], []
    for j, (path, weight) in enumerate(entities):
        ids = [row[link] for link in links_of(path)]
        rows.extend(ids)
        cols.extend([j] * len(ids))
        vals.extend([weight] * len(ids))
    incidence = np.zeros((len(row), len(entities)))
    np.add.at(incidence, (rows, cols), vals)
    cap = np.fromiter((max(c, 0.0) for c in capacity.values()), float, len(row))
    levels = maxmin_levels(incidence, cap)
    return levels, incidence @ levels


def _positive(capacity: dict[Link, float]) -> dict[Link, float]:
    return {link: c for link, c in capacity.items() if c > 0}


def _finish(rates, capacity: dict[Link, float]) -> dict[str, PairRates]:
    """Merge into lists and scale down any link that round-off left over its capacity."""
    path_total: dict[Path, float] = {}
    for per_pair in rates.values():
        for per_path in per_pair.values():
            for path, x in per_path.items():
                path_total[path] = path_total.get(path, 0.0) + x
    load: dict[Link, float] = {}
    for path, x in path_total.items():
        for link in links_of(path):
            load[link] = load.get(link, 0.0) + x
    over = {link: capacity.get(link, 0.0) / x for link, x in load.items()}
    over = {link: f for link, f in over.items() if f < 1.0}
    factor: dict[Path, float] = {}
    if over:
        for path in path_total:
            f = min((over[link] for link in links_of(path) if link in over), default=1.0)
            if f < 1.0:
                factor[path] = f
    out: dict[str, PairRates] = {}
    for cid, per_pair in rates.items():
        mine: PairRates = {}
        for pair, per_path in per_pair.items():
            lst = [(p, x * factor.get(p, 1.0)) for p, x in per_path.items() if x > 0]
            if lst:
                mine[pair] = lst
        if mine:
            out[cid] = mine
    return out
