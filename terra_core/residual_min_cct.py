"""Optimization (1) on a round's residual capacity, reusing an earlier round's solution
while weak duality proves it still minimal (docs/design.md section 4.2, step 4 and the
aged guard's step 2').
"""

from __future__ import annotations

import math
import operator
from itertools import chain, islice, repeat
from operator import itemgetter

import numpy as np

from terra_core.group_volumes import GroupVolumes, same_pairs
from terra_core.min_cct import TIGHT, DualBound, MinCct, Pair, PairRates
from terra_core.round_memo import ResidualEntry, RoundMemo
from terra_core.round_rates import RoundResult, solve_min_cct
from topologies import Link, Path

R_SAME = 1e-12  # relative: step 4's memo takes capacities this close as unchanged


def min_cct_on_residual(
    cid: str,
    volumes: dict[Pair, float],
    paths: dict[Pair, list[Path]],
    r: dict[Link, float],
    memo: RoundMemo | None,
    result: RoundResult,
    starving: bool = False,
    solved: MinCct | None = None,
) -> MinCct:
    """Optimization (1) on the residual r, reusing the memo of an earlier round when exact.

    A memo entry (r then, volumes d then, MinCct then) is reused when r is
    unchanged and the bounds of min_cct.DualBound and of monotonicity
    (Γ' <= Γ · max_k d'_k/d_k) meet: then Γ' is that value and scaling FlowGroup
    k's old rates by (d'_k/d_k) / max_k(d'_k/d_k) is a minimal allocation.
    "Unchanged" allows round-off: every link within R_SAME (1e-12) relative of r
    then, which moves both bounds by ~1e-12, far inside the 1e-9 (TIGHT) they must
    meet by; the few bytes/s a reused allocation may then exceed r by are scaled
    away with the round's other round-off (`_finish`). Such r come from the
    reused allocations before it in the round (step 2', earlier coflows), whose
    scale factors differ from 1 in the last bits (docs/design.md 4.2).
    The entry is the coflow's (`memo.residual[cid]`), or with `starving` step 2''s one
    entry of the aged guard (`memo.starving`). The reuse depends only
    on r and the volumes, so an entry is valid whichever coflow meets it.
    `solved`, when given, is Optimization (1) already solved on these volumes and on
    capacities equal to r (with its rates): it stands for the LP when no entry is reused.
    """
    if memo is None:
        return solved if solved is not None else solve_min_cct(volumes, paths, r, result)
    entry = memo.starving if starving else memo.residual.get(cid)
    if entry is not None:
        r_then, d_then, res, bound = entry
        shrink = _shrink(volumes, d_then)
        if (
            shrink is not None
            and not math.isinf(res.gamma_s)
            and (r_then == r or _same_capacity(r_then, r))
        ):
            pairs, ratios, top = shrink
            upper = res.gamma_s * top
            if upper <= bound.gamma(volumes) * (1 + TIGHT):
                rates = _rescaled(res.rates, pairs, ratios, top)
                return MinCct(upper, rates, prices=res.prices)
    res = solved if solved is not None else solve_min_cct(volumes, paths, r, result)
    bound = DualBound.build(volumes, paths, r, res.prices)
    kept = volumes if isinstance(volumes, GroupVolumes) else dict(volumes)  # (read only)
    entry = ResidualEntry(dict(r), kept, res, bound)
    if starving:
        memo.starving = entry
    else:
        memo.residual[cid] = entry
    return res


def _shrink(
    volumes: dict[Pair, float], then: dict[Pair, float]
) -> tuple[list[Pair], list[float] | np.ndarray, float] | None:
    """(the pairs of `volumes`, each one's d'_k / d_k against `then`, their largest), or
    None when `volumes` has a pair `then` has not. One numpy division for two
    GroupVolumes on one pair list (float64 quotients and maximum: the scalar values)."""
    if isinstance(then, GroupVolumes) and same_pairs(volumes, then.pairs):
        ratio = volumes.array / then.array  # type: ignore[attr-defined]
        return then.pairs, ratio, float(ratio.max())
    if not volumes.keys() <= then.keys():
        return None
    shrunk = map(operator.truediv, volumes.values(), map(then.__getitem__, volumes))
    ratios = list(shrunk)  # (C loops)
    return list(volumes), ratios, max(ratios)


def _same_capacity(then: dict[Link, float], now: dict[Link, float]) -> bool:
    """The same links, each with capacity within R_SAME relative of `then` (bytes/s)."""
    if then.keys() != now.keys():
        return False
    for link, c in now.items():
        c0 = then[link]
        if not abs(c - c0) <= R_SAME * c0:  # (NaN fails too)
            return False
    return True


def _rescaled(
    pair_rates: PairRates, pairs: list[Pair], ratios: list[float] | np.ndarray, top: float
) -> PairRates:
    """{pair: [(path, x × ratio / top) for (path, x) in pair_rates[pair]]} for `pairs` and
    their `ratios` (d'_k / d_k), in order, bytes/s: one numpy pass (float64 products, then
    quotients: the scalar expression's operations)."""
    lists = list(map(pair_rates.__getitem__, pairs))
    counts = np.fromiter(map(len, lists), np.intp, len(lists))
    items = list(chain.from_iterable(lists))
    x = np.fromiter(map(itemgetter(1), items), float, len(items))
    scaled = (x * np.repeat(np.asarray(ratios, dtype=float), counts) / top).tolist()
    it = zip(map(itemgetter(0), items), scaled, strict=True)
    return dict(zip(pairs, map(list, map(islice, repeat(it), counts.tolist())), strict=True))
