"""One offline Terra scheduling round (docs/design.md section 4.2; Pseudocode 1 of the paper).

Steps, for the coflows active now (each given by its FlowGroups' remaining volumes):

1. Admitted deadline coflows get the rates that end them exactly at their
   deadlines (d_k/(D − now)) in the split they were admitted on, or, when it no
   longer fits, earliest deadline first, in a fewest-link-bytes split on what is
   left (their min-CCT rates when D − now ≤ Γ: best effort); see
   `reserve_deadlines`. Their usage leaves the capacity.
2. α of every link's remaining capacity is reserved: r_e = (1 − α)·c_e
   (fixed guard; with an aged guard, see `starving` and starvation.py, only the
   oldest starving coflow's min-CCT allocation on α·c is taken, and nothing
   when no coflow starves).
3. The other coflows are ordered by Γ on the full current capacities (smallest
   first; ties by the order they were given in), or on the capacities the caller
   gives as `order_capacity` (same links; e.g. the whole WAN's for a round in a
   tenant's share, docs/design.md 4.5; result.exact then holds Γs on them).
4. In that order each gets its min-CCT allocation (Optimization (1)) on r if every
   FlowGroup can get a positive rate, and r shrinks by it; otherwise it is
   preempted for this round. Steps 3 and 4 run together lazily (see
   `_sequential`): exact Γs are computed only for coflows that can still get
   capacity, which gives the same schedule with far fewer LPs.
5. (fixed guard) The reserved α share (α·c_e) goes to the preempted coflows, max-min fair over
   their FlowGroups (FlowGroups of one DC pair share the pair's paths, so the
   fair share runs per DC pair weighted by the number of FlowGroups, and a
   pair's rate is split equally among them).
6. Work conservation, earlier coflows in the order first (scheduled ones, then
   preempted ones, then deadline coflows, which already finish in time): each DC
   pair belongs to the earliest coflow with a FlowGroup on it, and the coflows
   take the capacity still unused one after the other, each max-min fair over its
   FlowGroups weighted by their remaining volumes (so its FlowGroups first grow in
   proportion and its CCT falls; see `_work_conservation`).
Steps 5 and 6 use the SWAN-style max-min MCF (mcf.py) while it is small (up to
round_fair_share.MCF_MAX_COLUMNS (pair, path) columns: SWAN, most G-Scale rounds) and
path-level progressive filling, shortest paths first, beyond (ATT), see
round_fair_share.fair_share.
Step 4's allocations are Optimization (1)'s with the fewest link-bytes among the
optimal ones (min_cct.py), so FlowGroups off a coflow's bottleneck take short paths.

The function is pure: it reads its arguments and returns a new RoundResult.
"""

from __future__ import annotations

import heapq
import math
import operator
from collections.abc import Iterable
from itertools import chain, compress, repeat

import numpy as np

from terra_core.flat_rates import FlatRates
from terra_core.group_volumes import GroupVolumes, same_pairs
from terra_core.min_cct import MinCct, Pair, PairRates, links_of
from terra_core.path_masks import FULL, PathIndex, all_reachable, full_mask, index_for, mark_full
from terra_core.residual_min_cct import min_cct_on_residual
from terra_core.round_fair_share import ClassFill, alpha_share, fill_classes, fill_rates
from terra_core.round_memo import ActiveCache, PairNumbers, RoundMemo
from terra_core.round_rates import (
    DEADLINE,
    PREEMPTED,
    SCHEDULED,
    PathRates,
    RoundResult,
    add_rates,
    solve_min_cct,
    take,
)
from terra_core.starvation import serve_starving
from topologies import Link, Path

Split = dict[Pair, list[tuple[Path, float]]]  # {pair: [(path, fraction of its rate)]}
_MIN_WEIGHT = 1e-3  # step 6: smallest FlowGroup weight relative to its coflow's largest
# (smaller weights would put the MCF's freezing duals near the solver tolerance)


def schedule_round(
    coflows: dict[str, dict[Pair, float]],
    paths: dict[Pair, list[Path]],
    capacity: dict[Link, float],
    now: float = 0.0,
    deadlines: dict[str, float] | None = None,
    alpha: float = 0.1,
    hints: dict[str, tuple[float, bool]] | None = None,
    memo: RoundMemo | None = None,
    starving: list[str] | None = None,
    starving_fair: bool = False,
    order_capacity: dict[Link, float] | None = None,
    pinned: dict[str, Split] | None = None,
) -> RoundResult:
    """Run one scheduling round (docs/design.md 4.2 steps 1-6).

    Args:
        coflows: {coflow id: {(src DC, dst DC): remaining bytes}} of the active
            coflows, in arrival order (the Γ order's tie-break); none positive: ignored.
            With `memo`, a dict given again is taken as checked (read only once given).
        paths: {(src, dst): [path, ...]}: candidate paths per DC pair, over links
            that are up (every link of a path must be a key of `capacity`).
        capacity: {(u, v): bytes/s} available now (down links 0 or absent).
        now: current time in seconds (for deadlines).
        deadlines: {coflow id: absolute deadline s} of the admitted deadline coflows.
        alpha: starvation share in [0, 1).
        hints: optional {coflow id: (lower bound on Γ on step 3's capacities in seconds,
            exact)} known to the caller (e.g. a cached Γ rescaled, or a weak-duality
            bound, min_cct.DualBound). Coflows without a hint start from the bound
            max_k d_k / Σ_{p ∈ P_k} bottleneck(p).
        memo: optional round_memo.RoundMemo the caller keeps between rounds (cleared
            when paths change): step 4's min-CCT solutions on r (residual_min_cct),
            step 3's per-pair denominators, the path masks (path_masks.PathIndex) and
            step 2''s allocation (aged guard).
        starving: None for the fixed guard (steps 2 and 5 as above). Otherwise an
            aged guard (starvation.py): the starving coflow ids, oldest first;
            steps 2 and 5 are replaced by step 2' (starvation.serve_starving: the
            oldest starving coflow, or with `starving_fair` all of them, get the
            reserve α of what step 1 left) and the unused reserve joins r.
        starving_fair: see `starving`.
        order_capacity: step 3's {link: bytes/s} when not `capacity` (module docstring).
        pinned: the deadline coflows' admitted splits (`reserve_deadlines`).

    Returns:
        RoundResult (link loads within `capacity`: round-off is scaled away).

    Raises:
        ValueError: alpha outside [0, 1), or a FlowGroup whose DC pair has no
            entry in `paths` (the message names the coflow and the pair).
    """
    if not 0.0 <= alpha < 1.0:
        raise ValueError(f"alpha must be in [0, 1), got {alpha!r}")
    active = _active_coflows(coflows, paths, memo)
    result = RoundResult()
    left = {link: max(0.0, c) for link, c in capacity.items()}
    rates: dict[str, dict[Pair, dict[Path, float]]] = {}
    # Step 1: admitted deadline coflows (in their splits first), earliest deadline first.
    dl = deadlines or {}
    deadline_ids = reserve_deadlines(active, paths, left, now, dl, rates, result, pinned=pinned)
    # Steps 2-4: reserve α, order by Γ on the full capacities, sequential min-CCT on r.
    index = index_for(None if memo is None else memo.index, capacity)
    if starving is not None:  # an aged guard: the reserve only for starving coflows
        _aged_guard(active, starving, paths, left, capacity, alpha, starving_fair, rates,
                    result, index, memo)  # fmt: skip
        alpha = 0.0
    reserve = {link: alpha * c for link, c in left.items()}
    r = {link: c - reserve[link] for link, c in left.items()}
    others = [cid for cid in active if cid not in result.state]
    scheduled, preempted = _sequential(
        active, others, paths, capacity, r, hints, memo, rates, result, index, order_capacity
    )
    # Step 5: the α share to the preempted coflows.
    if preempted and alpha > 0:
        alpha_share(active, preempted, paths, reserve, capacity, rates, result, index)
    spare = {link: r[link] + reserve[link] for link in left}
    # Step 6: work conservation, earlier coflows in the order first.
    order = scheduled + preempted + deadline_ids
    tail = _work_conservation(active, order, paths, spare, capacity, rates, result, index, memo)
    result.flat = _finish(rates, capacity, index, tail)
    return result


def _aged_guard(
    active: dict[str, dict[Pair, float]],
    starving: list[str],
    paths: dict[Pair, list[Path]],
    left: dict[Link, float],
    capacity: dict[Link, float],
    alpha: float,
    starving_fair: bool,
    rates: dict[str, PathRates],
    result: RoundResult,
    index: PathIndex,
    memo: RoundMemo | None,
) -> None:
    """Step 2' of `schedule_round` (starvation.serve_starving): the starving coflow ids
    (oldest first) still unscheduled after step 1 get the reserve α of `left` (bytes/s)."""
    starving = [cid for cid in starving if cid in active and cid not in result.state]
    if starving and alpha > 0:
        serve_starving(
            active, starving, paths, left, capacity, alpha, starving_fair, rates, result,
            index, memo,
        )  # fmt: skip


def _active_coflows(
    coflows: dict[str, dict[Pair, float]],
    paths: dict[Pair, list[Path]],
    memo: RoundMemo | None = None,
) -> dict[str, dict[Pair, float]]:
    """The coflows of `schedule_round` with their positive FlowGroup volumes (bytes), those
    with none left out, in arrival order. Raises ValueError naming the coflow and the DC
    pair when a FlowGroup's pair has no entry in `paths`. With `memo`, a volumes dict that
    the last round checked against the same `paths` dict is not checked again."""
    active = {}
    given: dict[str, dict[Pair, float]] = {}  # last round's dicts, when on the same paths
    kept: dict[str, dict[Pair, float]] = {}  # ... and their positive FlowGroups
    routed: dict[str, list[Pair]] = {}  # ... and the GroupVolumes pair lists checked
    if memo is not None and memo.active is not None and memo.active.paths is paths:
        given, kept, routed = memo.active.given, memo.active.active, memo.active.routed
    checked: dict[str, list[Pair]] = {}
    for cid, fgs in coflows.items():
        if given.get(cid) is fgs:  # (the same dict as last round's: checked then)
            if cid in kept:
                active[cid] = kept[cid]
            if cid in routed:
                checked[cid] = routed[cid]
            continue
        if not _all_positive(fgs):
            fgs = {p: v for p, v in fgs.items() if v > 0}
        if fgs:
            active[cid] = fgs  # (read only: the round never writes into a coflow's volumes)
        if not same_pairs(fgs, routed.get(cid)) and not fgs.keys() <= paths.keys():
            pair = next(p for p in fgs if p not in paths)
            raise ValueError(f"coflow {cid!r}: no path set for DC pair {pair[0]}->{pair[1]}")
        if isinstance(fgs, GroupVolumes):
            checked[cid] = fgs.pairs
    if memo is not None:
        memo.active = ActiveCache(paths, dict(coflows), active, checked)
    return active


def _all_positive(volumes: dict[Pair, float]) -> bool:
    """Every volume of `volumes` is > 0 (False for NaN): one numpy pass over a
    GroupVolumes' array, C loops over a dict's values otherwise."""
    if isinstance(volumes, GroupVolumes):
        return bool((volumes.array > 0).all())
    return all(map(operator.gt, volumes.values(), repeat(0)))


def _sequential(
    active: dict[str, dict[Pair, float]],
    others: list[str],
    paths: dict[Pair, list[Path]],
    capacity: dict[Link, float],
    r: dict[Link, float],
    hints: dict[str, tuple[float, bool]] | None,
    memo: RoundMemo | None,
    rates: dict[str, PathRates],
    result: RoundResult,
    index: PathIndex,
    order_capacity: dict[Link, float] | None = None,
) -> tuple[list[str], list[str]]:
    """Steps 3-4 with lazy ordering: a heap keyed by lower bounds on Γ (on `order_capacity`
    when given, else on `capacity`; the turns always on r, which is within `capacity`).

    Popping the smallest key: a coflow that cannot reach r any more (some
    FlowGroup has every path through a full link) is preempted at once — r only
    shrinks, so it would be preempted at its exact place too; the full links of r
    are one bitmask (path_masks), updated with the links a scheduled coflow took; a key that is
    only a bound is replaced by the exact Γ (an LP on the full capacities) and
    pushed back; an exact key is the coflow's turn: min-CCT on r. So the
    coflows that can still be scheduled are taken in exact Γ order, and no LP
    is spent ordering coflows that will be preempted anyway. While no coflow has
    been scheduled and no earlier step took capacity, r is the order's capacities, so
    the LP for the exact Γ is also the one the coflow's turn would solve on r: it is
    solved once, with its rates (min_cct's fewest-link-bytes stage leaves Γ and the
    prices of the first stage as they are), and kept for the turn.

    Returns:
        (scheduled ids, preempted ids), each in the order taken; result.order,
        result.gammas (the keys used), result.exact and result.state are filled in.
    """
    hints = hints or {}
    heap = []
    on = capacity if order_capacity is None else order_capacity  # (Γ's capacities)
    pair_flow = {} if memo is None else memo.pair_flows(on)
    _fill_pair_flow([active[cid] for cid in others if cid not in hints], paths, on,
                    pair_flow, index)  # fmt: skip
    for pos, cid in enumerate(others):
        key, exact = hints.get(cid) or (
            _quick_bound(active[cid], paths, on, pair_flow),
            False,
        )
        heap.append((key, pos, cid, exact))
    heapq.heapify(heap)
    scheduled: list[str] = []
    preempted: list[str] = []
    full = full_mask(index, r, capacity, FULL)
    untouched = r == on  # r is still the order's capacities (no step before took any)
    solved: dict[str, MinCct] = {}  # Γ's LP with its rates, solved while `untouched`
    while heap:
        key, pos, cid, exact = heapq.heappop(heap)
        if not all_reachable(active[cid], paths, index, full):
            result.state[cid] = PREEMPTED
        elif not exact:
            res = solve_min_cct(active[cid], paths, on, result, rates_needed=untouched)
            result.exact[cid] = solved[cid] = res
            heapq.heappush(heap, (res.gamma_s, pos, cid, True))
            continue
        else:
            same = solved.get(cid) if untouched else None  # (r then = r now: the same LP)
            res = min_cct_on_residual(cid, active[cid], paths, r, memo, result, solved=same)
            result.state[cid] = PREEMPTED if math.isinf(res.gamma_s) else SCHEDULED
            if result.state[cid] == SCHEDULED:
                crossed = take(rates, cid, res.rates, r, 1.0, index)
                untouched = False
                full = mark_full(full, index, crossed, r, capacity, FULL)
        result.order.append(cid)
        result.gammas[cid] = key
        (scheduled if result.state[cid] == SCHEDULED else preempted).append(cid)
    return scheduled, preempted


def _quick_bound(
    volumes: dict[Pair, float],
    paths: dict[Pair, list[Path]],
    capacity: dict[Link, float],
    pair_flow: dict[Pair, float] | None = None,
) -> float:
    """Γ >= max_k d_k / Σ_{p ∈ P_k} min_{e ∈ p} c_e (each FlowGroup alone, paths unshared).

    `pair_flow` ({pair: Σ_p bottleneck(p) in bytes/s}) caches the denominators
    across the coflows of one round (they depend only on the pair and `capacity`).
    """
    pair_flow = {} if pair_flow is None else pair_flow
    bound = 0.0
    for pair, d in volumes.items():
        flow = pair_flow.get(pair)
        if flow is None:
            flow = pair_flow[pair] = sum(
                min(capacity.get(e, 0.0) for e in links_of(p)) for p in paths[pair]
            )
        bound = max(bound, d / flow if flow > 0 else math.inf)
    return bound


def _fill_pair_flow(
    coflows: Iterable[dict[Pair, float]],
    paths: dict[Pair, list[Path]],
    capacity: dict[Link, float],
    pair_flow: dict[Pair, float],
    index: PathIndex,
) -> None:
    """Put `_quick_bound`'s denominator Σ_{p ∈ P_k} min_{e ∈ p} c_e (bytes/s) of every pair
    of `coflows` ({pair: bytes} dicts) missing from `pair_flow` into it, in one pass.

    The bottlenecks come from one numpy minimum over the links' capacities (a minimum is
    exact, so each is the float `_quick_bound` takes) and each pair's are summed in path
    order as `_quick_bound` sums them: the same values, without a Python loop per link."""
    todo = {pair: None for fgs in coflows for pair in fgs if pair not in pair_flow}
    if len(todo) < 8:
        return  # (`_quick_bound` fills the few that are left)
    per_pair = [len(paths[pair]) for pair in todo]
    ids = index.ids_of(p for pair in todo for p in paths[pair])
    lens = np.fromiter(map(len, ids), np.intp, len(ids))
    if not ids or not lens.all():
        return  # (a path without links: `_quick_bound` raises as it always has)
    flat = np.fromiter(chain.from_iterable(ids), np.intp, int(lens.sum()))
    n = len(index.links)
    cap = np.fromiter((capacity.get(link, 0.0) for link in index.links), float, n)
    cap = np.append(cap, 0.0)  # (-1: a link outside the index has no capacity)
    flat[flat < 0] = n
    starts = np.concatenate(([0], np.cumsum(lens)[:-1]))
    bottleneck = np.minimum.reduceat(cap[flat], starts).tolist()
    at = 0
    for pair, count in zip(todo, per_pair, strict=True):
        pair_flow[pair] = sum(bottleneck[at : at + count])
        at += count


def reserve_deadlines(
    coflows: dict[str, dict[Pair, float]],
    paths: dict[Pair, list[Path]],
    left: dict[Link, float],
    now: float,
    deadlines: dict[str, float],
    rates: dict[str, PathRates] | None = None,
    result: RoundResult | None = None,
    gammas: dict[str, float] | None = None,
    pinned: dict[str, Split] | None = None,
    force: bool = False,
) -> list[str]:
    """Step 1: the admitted deadline coflows' rates that end them at their deadlines, EDF.

    A coflow with a split in `pinned` (the one it was admitted on) gets first, in that
    split, the rates that end it exactly at its deadline (every FlowGroup at
    d_k/(D − now)) when they fit on `left` over paths still in `paths`. Every other one
    gets, on what is left, those rates split over its paths with the fewest link-bytes
    (min_cct's `finish_s`), or its min-CCT rates when D − now ≤ Γ (it is late, best
    effort). `left` shrinks by them (in place).

    Args:
        coflows: {coflow id: {(src, dst): remaining bytes}} (others are ignored).
        paths: per DC pair paths.
        left: {link: bytes/s} capacity, reduced in place.
        now: seconds.
        deadlines: {coflow id: absolute deadline, seconds}.
        rates: optional {cid: {pair: {path: bytes/s}}} accumulator, updated in place.
        result: optional RoundResult whose `state` and `lps` are updated.
        gammas: optional {cid: Γ in seconds on what the earlier ones left (D − now for
            one served in its split)}, filled in.
        pinned: optional {cid: {pair: [(path, fraction of the pair's rate)]}}.
        force: take a split even where it does not fit (`left` may go below 0), as
            admission charges the admitted coflows.

    Returns:
        The deadline coflow ids that are in `coflows`, earliest deadline first.
    """
    result = RoundResult() if result is None else result
    rates = {} if rates is None else rates
    gammas = {} if gammas is None else gammas
    by_deadline = sorted((d, i, cid) for i, (cid, d) in enumerate(deadlines.items()))
    ids = [cid for _, _, cid in by_deadline if cid in coflows]
    rest = []
    for cid in ids:
        result.state[cid] = DEADLINE
        time_left = deadlines[cid] - now
        split = (pinned or {}).get(cid)
        mine = None if split is None else _in_split(coflows[cid], split, time_left, paths,
                                                    None if force else left)  # fmt: skip
        if mine is None:
            rest.append(cid)
            continue
        gammas[cid] = time_left
        take(rates, cid, mine, left, 1.0)
    for cid in rest:
        time_left = deadlines[cid] - now
        finish = time_left if time_left > 0 else None
        res = solve_min_cct(coflows[cid], paths, left, result, finish_s=finish)
        gammas[cid] = res.gamma_s
        if math.isinf(res.gamma_s):
            continue
        take(rates, cid, res.rates, left, 1.0)  # (rates ending at the deadline: min_cct)
    return ids


def _in_split(
    volumes: dict[Pair, float],
    split: Split,
    time_left: float,
    paths: dict[Pair, list[Path]],
    left: dict[Link, float] | None,
) -> PairRates | None:
    """The rates ending `volumes` in `time_left` seconds in `split`, or None when that is
    not possible: no time left, a pair without a split, a path gone, or more than `left`
    on some link (not checked without `left`)."""
    if not time_left > 0:
        return None
    out: PairRates = {}
    load: dict[Link, float] = {}
    for pair, v in volumes.items():
        if v <= 0 or pair[0] == pair[1]:
            continue
        lst = split.get(pair)
        if not lst or not all(p in paths.get(pair, ()) for p, _ in lst):
            return None
        out[pair] = [(p, v / time_left * f) for p, f in lst]
        for p, x in out[pair]:
            for link in links_of(p):
                load[link] = load.get(link, 0.0) + x
    if left is not None and any(x > left.get(e, 0.0) * (1 + 1e-9) + 1e-12 for e, x in load.items()):
        return None
    return out


def split_of(pair_rates: PairRates) -> Split:
    """{pair: [(path, fraction of the pair's rate)]} of `pair_rates` (paths with a rate)."""
    out: Split = {}
    for pair, lst in pair_rates.items():
        total = sum(x for _, x in lst)
        if total > 0:
            out[pair] = [(p, x / total) for p, x in lst if x > 0]
    return out


def _work_conservation(
    active: dict[str, dict[Pair, float]],
    order: list[str],
    paths: dict[Pair, list[Path]],
    spare: dict[Link, float],
    capacity: dict[Link, float],
    rates: dict[str, PathRates],
    result: RoundResult,
    index: PathIndex,
    memo: RoundMemo | None,
) -> FlatRates | None:
    """Step 6: the spare capacity to the coflows in `order`, earlier coflows first.

    Every DC pair belongs to the earliest coflow in `order` with a FlowGroup on it. The
    coflows' pairs are filled one coflow at a time (priority classes of the max-min MCF),
    and within a coflow max-min fair weighted by the FlowGroups' remaining volumes: its
    FlowGroups first all grow in proportion to their volumes (its λ rises, so its CCT
    falls, as in Optimization (1) on the spare capacity) until some FlowGroup is blocked,
    then the others keep growing. A later coflow gets only what the earlier ones cannot
    use, and nothing on a pair an earlier coflow holds (that pair's paths are full): the
    pairs held are one bool array over pair numbers (round_memo.PairNumbers, the memo's).

    Returns:
        The water-filled rates of the coflows without earlier rates as FlatRates, to go
        after `rates` (`_add_fill`), or None (all added to `rates`).
    """
    numbers = PairNumbers() if memo is None else memo.pairs
    nos = [numbers.of(cid, active[cid]) for cid in order]
    held = np.zeros(len(numbers.number), dtype=bool)  # (by pair number)
    classes: list[list[Pair]] = []  # each coflow's pairs no earlier one holds, if any
    owners: list[str] = []  # ... and that coflow
    weights: dict[Pair, float] = {}
    for cid, ids in zip(order, nos, strict=True):
        free = ~held[ids]
        n_free = int(np.count_nonzero(free))
        if not n_free:
            continue
        held[ids] = True
        fgs = active[cid]
        among = None if n_free == len(ids) else free  # (None: every pair of the coflow)
        mine = list(fgs) if among is None else list(compress(fgs, among.tolist()))
        classes.append(mine)
        owners.append(cid)
        weights.update(_volume_weights(fgs, mine, among))
    fill = fill_classes(weights, paths, spare, capacity, result, index, classes)
    if isinstance(fill, ClassFill):
        return _add_fill(fill, owners, paths, rates, index)
    owner = {pair: cid for cid, pairs in zip(owners, classes, strict=True) for pair in pairs}
    for pair, lst in fill.items():
        add_rates(rates.setdefault(owner[pair], {}), pair, lst)
    return None


def _add_fill(
    fill: ClassFill,
    owners: list[str],
    paths: dict[Pair, list[Path]],
    rates: dict[str, PathRates],
    index: PathIndex,
) -> FlatRates | None:
    """Step 6's water-filled rates (`fill`; class i is coflow owners[i]'s) added to `rates`
    for the coflows that have rates already; those of the others (each class's coflow new
    to `rates`) as FlatRates in the order `rates` would
    have taken them (after every coflow of `rates`, class after class; a coflow's pairs in
    order of their first rate, each pair's paths in path order), or None when there are
    none. A pair whose paths repeat one (which a dict would merge) goes through the dicts."""
    keys, ks, js, cls, values = fill
    new = np.fromiter((cid not in rates for cid in owners), bool, len(owners))
    fresh = new[cls]
    if fresh.any() and not all(map(index.distinct, set(map(keys.__getitem__, ks[fresh].tolist())),
                                   repeat(paths))):  # fmt: skip
        fresh[:] = False
    if not fresh.all():  # (the coflows with rates: through the dicts)
        old = np.flatnonzero(~fresh)
        part = ClassFill(keys, ks[old], js[old], cls[old], values[old])
        mine = map(keys.__getitem__, part.ks.tolist())
        owner = dict(zip(mine, map(owners.__getitem__, part.cls.tolist()), strict=True))
        for pair, lst in fill_rates(part, paths).items():
            add_rates(rates.setdefault(owner[pair], {}), pair, lst)
    sel = np.flatnonzero(fresh)
    if not len(sel):
        return None
    ks, js, cls, values = ks[sel], js[sel], cls[sel], values[sel]
    first = np.full(len(keys), len(sel), dtype=np.intp)
    np.minimum.at(first, ks, np.arange(len(sel), dtype=np.intp))  # each pair's first rate
    order = np.lexsort((js, first[ks]))
    ks, js, cls, values = ks[order], js[order], cls[order], values[order]
    cut = np.flatnonzero(np.diff(ks) != 0) + 1  # a pair's rates are one run
    seg_start = np.concatenate(([0], cut)).astype(np.intp)
    counts = np.diff(np.append(seg_start, len(ks))).astype(np.intp)
    seg_cls = cls[seg_start]
    classes_in = np.flatnonzero(np.bincount(seg_cls, minlength=len(owners)))
    per_coflow = np.bincount(seg_cls, minlength=len(owners))[classes_in].astype(np.intp)
    pair_of = list(map(keys.__getitem__, ks.tolist()))
    path_lists = map(paths.__getitem__, pair_of)
    return FlatRates(
        [owners[c] for c in classes_in.tolist()],
        per_coflow,
        [pair_of[i] for i in seg_start.tolist()],
        counts,
        list(map(list.__getitem__, path_lists, js.tolist())),
        values,
    )


def _volume_weights(
    volumes: dict[Pair, float], pairs: list[Pair], among: np.ndarray | None = None
) -> dict[Pair, float]:
    """{pair: max(volume / largest volume, _MIN_WEIGHT)} over `pairs` of one coflow (step 6):
    all of `volumes`' pairs, or those where the bool array `among` is True, in order.

    (Vectorized for many pairs: numpy's float64 division and maximum give the values of
    the scalar expressions; a GroupVolumes' array is its values, all > 0 in a round.)"""
    if isinstance(volumes, GroupVolumes):
        vol = volumes.array if among is None else volumes.array[among]
        w = np.maximum(vol / vol.max(), _MIN_WEIGHT)
        return dict(zip(pairs, w.tolist(), strict=True))
    if len(pairs) == len(volumes):
        vols = list(volumes.values())
    else:
        vols = [volumes[pair] for pair in pairs]
    top = max(vols)
    if len(vols) < 32:
        return {pair: max(v / top, _MIN_WEIGHT) for pair, v in zip(pairs, vols, strict=True)}
    w = np.maximum(np.asarray(vols, dtype=float) / top, _MIN_WEIGHT)
    return dict(zip(pairs, w.tolist(), strict=True))


def _finish(
    rates: dict[str, PathRates],
    capacity: dict[Link, float],
    index: PathIndex,
    tail: FlatRates | None = None,
) -> FlatRates:
    """The round's rates as FlatRates (coflows, pairs and paths in the order they were
    first given a rate; rates > 0 before the scaling), every path through a link that
    round-off left over its capacity scaled down by its smallest capacity / load.

    The link loads come from each path's total over the coflows (summed in their order,
    np.add.at: one addition after the other), one np.bincount over the links of
    `index` in the paths' order of first appearance; a link missing from `index` has
    capacity 0. A rate is multiplied by its path's factor (1.0 where none is below 1).
    `tail` (coflows not in `rates`) comes after `rates`' coflows."""
    per_pair = list(rates.values())
    segments = list(chain.from_iterable(map(dict.values, per_pair)))
    counts = np.fromiter(map(len, segments), np.intp, len(segments))
    paths = list(chain.from_iterable(segments))
    x = np.fromiter(chain.from_iterable(map(dict.values, segments)), float, len(paths))
    coflows, pairs = list(rates), list(chain.from_iterable(per_pair))
    per_coflow = np.fromiter(map(len, per_pair), np.intp, len(per_pair))
    if tail is not None:
        coflows += tail.coflows
        pairs += tail.pairs
        per_coflow = np.concatenate((per_coflow, tail.pairs_per_coflow))
        counts = np.concatenate((counts, tail.counts))
        paths += tail.paths
        x = np.concatenate((x, tail.rates))
    factor = _round_off_factors(paths, x, capacity, index)
    scaled = x if factor is None else x * factor
    keep = x > 0
    if not keep.all():
        kept = np.concatenate(([0], np.cumsum(keep)))  # (kept rates before each place)
        ends = np.cumsum(counts)
        counts = (kept[ends] - kept[ends - counts]).astype(np.intp)
        paths = list(compress(paths, keep.tolist()))
        scaled = scaled[keep]
    return FlatRates(coflows, per_coflow, pairs, counts, paths, scaled)


def _round_off_factors(
    paths: list[Path], x: np.ndarray, capacity: dict[Link, float], index: PathIndex
) -> np.ndarray | None:
    """Per path rate (`paths`, `x` bytes/s) its path's factor (float array: the smallest
    capacity / load over its links, 1.0 when none is below 1), or None when no link is
    loaded over its capacity."""
    unique = dict.fromkeys(paths)  # (in order of first appearance)
    if len(unique) == len(paths):
        at, totals = None, x
    else:
        place = dict(zip(unique, range(len(unique)), strict=False))
        at = np.fromiter(map(place.__getitem__, paths), np.intp, len(paths))
        totals = np.zeros(len(unique))
        np.add.at(totals, at, x)
    n_links = len(index.links)
    ids = index.ids_of(unique)  # each path's link indices (every path has one)
    lens = np.fromiter(map(len, ids), np.intp, len(ids))
    rows = np.fromiter(chain.from_iterable(ids), np.intp, int(lens.sum()))
    rows[rows < 0] = n_links
    load = np.bincount(rows, weights=np.repeat(totals, lens), minlength=n_links + 1)
    cap = np.fromiter((capacity.get(link, 0.0) for link in index.links), float, n_links)
    cap = np.append(cap, 0.0)
    ratio = np.full(n_links + 1, np.inf)
    loaded = load > 0
    ratio[loaded] = cap[loaded] / load[loaded]
    if not (ratio < 1.0).any():
        return None
    starts = np.concatenate(([0], np.cumsum(lens)[:-1])).astype(np.intp)
    least = np.minimum.reduceat(ratio[rows], starts)
    per_path = np.where(least < 1.0, least, 1.0)
    return per_path if at is None else per_path[at]
