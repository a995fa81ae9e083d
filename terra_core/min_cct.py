"""Optimization (1): the minimum CCT Γ of one coflow over K paths (docs/design.md section 4.1).

    maximize    λ
    subject to  Σ_{p ∈ P_k} x_{k,p} = λ · d_k          for every FlowGroup k
                Σ_{(k,p) : e ∈ p} x_{k,p} ≤ r_e         for every link e
                x_{k,p} ≥ 0

Γ = 1/λ* (seconds; infinite when λ* = 0). The minimal allocation gives
FlowGroup k exactly d_k/Γ bytes/s split over its paths (the path form of
Optimization (1) in You & Chowdhury, "Terra", arXiv 1904.08480, section 3).

Optimization (1) fixes only the FlowGroups on the coflow's bottleneck; the others
may be split in many optimal ways. A second stage, solved warm in the same HiGHS
instance, keeps λ at its optimum and picks the split with the fewest link-bytes
(minimum Σ x_{k,p}·hops(p)), so the minimal allocation leaves as much of the WAN
as it can to the coflows after it (docs/design.md 4.1: "nothing more is taken").

The LP is passed to HiGHS as numpy CSC arrays in one call, with capacities
scaled by the largest one and volumes by the largest volume so every
coefficient is O(1). Two exact shortcuts skip the LP:
  * every FlowGroup has exactly one usable path: λ* = min_e r_e / Σ_{k: e ∈ p_k} d_k;
  * a single FlowGroup whose usable paths are link-disjoint: λ* = Σ_p min_{e ∈ p} r_e / d.
"""

from __future__ import annotations

import math
import operator
import threading
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from functools import lru_cache
from itertools import count, repeat
from typing import NamedTuple

import highspy
import numpy as np
from numpy.typing import NDArray

from terra_core.array_types import FloatArray, IntArray
from terra_core.lp import INF, new_highs, pass_lp, solve
from topologies import Link, Path, path_links

Pair = tuple[str, str]
PairRates = dict[Pair, list[tuple[Path, float]]]

_MIN_CAPACITY = 1e-9  # bytes/s: links with less residual capacity count as full
_SECOND_STAGE_SLACK = 1e-9  # relative: λ may drop this much in the fewest-link-bytes stage
_local = threading.local()


@dataclass(frozen=True)
class MinCct:
    """Result of Optimization (1).

    Attributes:
        gamma_s: Γ, the minimum CCT in seconds (math.inf when some FlowGroup
            cannot get any rate, i.e. λ* = 0).
        rates: {(src, dst): [(path, bytes/s), ...]}: the minimal allocation
            (FlowGroup k gets d_k/Γ in total); empty when gamma_s is inf, and when an
            LP was solved for Γ only (min_cct's fewest_link_bytes False).
        lp_solved: True when an LP was solved, False when a shortcut was exact.
        prices: {link: y_e >= 0}: an optimal dual solution (link prices) of
            Optimization (1). For any volumes d', with m_k(y) = min over the
            FlowGroup's paths of Σ_{e ∈ p} y_e, weak duality gives the lower bound
            Γ(d') >= Σ_k d'_k·m_k(y) / Σ_e c_e·y_e, tight for the solved volumes
            (see `DualBound`). Empty when Γ is 0 or inf.
    """

    gamma_s: float
    rates: PairRates = field(default_factory=dict)
    lp_solved: bool = False
    prices: dict[Link, float] = field(default_factory=dict)


TIGHT = 1e-9  # relative gap under which a lower and an upper bound on Γ count as exact


@dataclass(frozen=True)
class DualBound:
    """Weak-duality lower bound on Γ from fixed link prices y (docs/design.md 4.1).

    λ* = min {Σ_e c_e y_e : Σ_k d_k m_k(y) >= 1, y >= 0} with m_k(y) = the
    cheapest path of FlowGroup k under prices y, so for any volumes d,
    Γ(d) >= Σ_k d_k m_k(y) / Σ_e c_e y_e, with equality at an optimal y.

    Attributes:
        path_price: {(src, dst): m_k(y)} for the DC pairs it was built for.
        capacity_price: Σ_e c_e y_e (bytes/s · price).
    """

    path_price: dict[Pair, float]
    capacity_price: float

    @classmethod
    def build(
        cls,
        pairs: Iterable[Pair],
        paths: dict[Pair, list[Path]],
        capacity: dict[Link, float],
        prices: dict[Link, float],
    ) -> DualBound:
        """Precompute m_k(y) for `pairs` over `paths` and Σ c_e y_e over `capacity`.

        (A pair whose paths cross no priced link has m_k = 0.0 without summing: most
        pairs, as only the coflow's bottleneck links have a price.)"""
        priced = prices.keys()
        path_price = {}
        for pair in pairs:
            ps = paths[pair]
            if ps and priced.isdisjoint(_distinct_paths(tuple(ps))[1]):
                path_price[pair] = 0.0
            else:
                path_price[pair] = min(sum(prices.get(e, 0.0) for e in links_of(p)) for p in ps)
        cy = sum(capacity.get(link, 0.0) * y for link, y in prices.items())
        return cls(path_price, cy)

    def gamma(self, volumes: dict[Pair, float]) -> float:
        """The bound in seconds for `volumes` (0 when it says nothing).

        Raises:
            KeyError: a FlowGroup's pair is not among those the bound was built for.
        """
        if self.capacity_price <= 0:
            return 0.0
        m = self.path_price
        d = volumes.values()
        if all(map(operator.gt, d, repeat(0))):  # (the same sum, in C loops)
            bound: float = sum(map(operator.mul, d, map(m.__getitem__, volumes)))
            return bound / self.capacity_price
        return sum(d * m[pair] for pair, d in volumes.items() if d > 0) / self.capacity_price


def min_cct(
    volumes: dict[Pair, float],
    paths: dict[Pair, list[Path]],
    capacity: dict[Link, float],
    use_shortcuts: bool = True,
    fewest_link_bytes: bool = True,
    finish_s: float | None = None,
) -> MinCct:
    """Solve Optimization (1) for one coflow.

    Args:
        volumes: {(src DC, dst DC): remaining bytes (> 0)} per FlowGroup; pairs
            with src == dst or volume <= 0 are ignored.
        paths: {(src, dst): [path, ...]}: candidate paths per DC pair (tuples of
            DC names from src to dst).
        capacity: {(u, v): bytes/s} available on each directed link; links
            missing from it or below 1e-9 bytes/s carry nothing.
        use_shortcuts: allow the exact closed forms (False forces the LP; tests).
        fewest_link_bytes: run the second stage (see the module docstring); callers
            that need only Γ and the prices, not the rates, skip it (and get no rates
            when an LP is solved: Γ and the prices are the same either way).
        finish_s: when given and Γ < finish_s (seconds), the rates end every FlowGroup
            exactly in finish_s (d_k / finish_s each), split with the fewest link-bytes
            (the second stage held at λ >= 1 / finish_s instead of λ*): a deadline
            coflow's allocation (docs/design.md 4.3). Γ stays the minimum.

    Returns:
        MinCct with Γ in seconds and the per-path rates in bytes/s. Γ is 0 with
        empty rates when there is no WAN volume at all.

    Raises:
        ValueError: a FlowGroup's pair is missing from `paths`, or a volume is
            not a finite number.
    """
    groups: list[tuple[Pair, float, tuple[Path, ...]]] = []
    # the links with capacity among those the FlowGroups' paths cross (absent ones have none);
    # a subset test per path (only these links are looked up, not the whole WAN's)
    good: set[Link] = set()
    bad: set[Link] = set()
    for pair, volume in volumes.items():
        if not isinstance(volume, int | float) or math.isnan(volume) or math.isinf(volume):
            raise ValueError(f"FlowGroup {pair}: volume must be a finite number, got {volume!r}")
        if volume <= 0 or pair[0] == pair[1]:
            continue
        if pair not in paths:
            raise ValueError(f"FlowGroup {pair[0]}->{pair[1]}: no path set for this DC pair")
        distinct, crossed = _distinct_paths(tuple(paths[pair]))
        if not (good.issuperset(crossed) or bad.issuperset(crossed)):
            for link in crossed:
                (good if capacity.get(link, 0.0) > _MIN_CAPACITY else bad).add(link)
        if good.issuperset(crossed):  # (most pairs: every path usable)
            usable = distinct
        else:
            usable = tuple(p for p in distinct if good.issuperset(links_of(p)))
        if not usable:
            return MinCct(math.inf)
        groups.append((pair, float(volume), usable))
    if not groups:
        return MinCct(0.0)
    if use_shortcuts:
        if all(len(g[2]) == 1 for g in groups):
            return _stretched(_single_paths(groups, capacity), finish_s)
        if len(groups) == 1 and _link_disjoint(groups[0][2]) and finish_s is None:
            return _disjoint_paths(groups[0], capacity)
    return _solve_lp(groups, capacity, fewest_link_bytes, finish_s)


def _stretched(res: MinCct, finish_s: float | None) -> MinCct:
    """`res` with every rate scaled by Γ / finish_s when Γ < finish_s (one path per
    FlowGroup: no split to choose)."""
    if finish_s is None or not res.gamma_s < finish_s:
        return res
    f = res.gamma_s / finish_s
    rates = {pair: [(p, x * f) for p, x in lst] for pair, lst in res.rates.items()}
    return replace(res, rates=rates)


@lru_cache(maxsize=65536)
def links_of(path: Path) -> tuple[Link, ...]:
    """Return the directed links of `path` (cached `topologies.path_links`)."""
    return tuple(path_links(path))


_LINKS: dict[int, Link] = {}  # every link seen by `_link_ids`, by its process-wide id
_LINK_ID: dict[Link, int] = {}
_NEXT_LINK_ID = count()


@lru_cache(maxsize=65536)
def _distinct_paths(paths: tuple[Path, ...]) -> tuple[tuple[Path, ...], frozenset[Link]]:
    """(`paths` without repeats, in order; every link they cross)."""
    distinct = tuple(dict.fromkeys(paths))
    return distinct, frozenset(link for p in distinct for link in links_of(p))


@lru_cache(maxsize=65536)
def path_link_ids(paths: tuple[Path, ...]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(the process-wide link ids of `paths` one path after the other, the number of links
    of each); `first_use_rows` turns such ids into LP link rows."""
    ids = [_link_ids(p) for p in paths]
    return tuple(i for one in ids for i in one), tuple(len(one) for one in ids)


@lru_cache(maxsize=65536)
def _link_ids(path: Path) -> tuple[int, ...]:
    """Process-wide integer ids of the links of `path`, in order (new links get new ids).

    Threads may solve at once (the controller's round beside a reservation's admission)
    without a lock: `dict.setdefault` is one step, so a link keeps the first id given to it
    whichever thread asks, and every caller records the id's link before it returns it
    (another thread may have given the id and not recorded it yet).
    """
    ids = []
    for link in links_of(path):
        i = _LINK_ID.get(link)
        if i is None:
            i = _LINK_ID.setdefault(link, next(_NEXT_LINK_ID))
        _LINKS.setdefault(i, link)
        ids.append(i)
    return tuple(ids)


def first_use_rows(seq: IntArray) -> tuple[NDArray[np.int32], dict[Link, int]]:
    """LP link rows for a sequence of process-wide link ids (`path_link_ids`), numbered in
    order of first use: (the row of each entry of `seq`, {link: row} in row order)."""
    uniq, first, inverse = np.unique(seq, return_index=True, return_inverse=True)
    by_first = np.argsort(first)
    row_of = np.empty(len(uniq), dtype=np.int32)
    row_of[by_first] = np.arange(len(uniq), dtype=np.int32)
    link_row = {_LINKS[g]: row for row, g in enumerate(uniq[by_first].tolist())}
    return row_of[inverse.reshape(-1)], link_row


def _single_paths(
    groups: list[tuple[Pair, float, tuple[Path, ...]]], capacity: dict[Link, float]
) -> MinCct:
    """Every FlowGroup has one path: x_k = λ d_k, so λ* = min_e r_e / Σ_{k: e ∈ p_k} d_k."""
    load: dict[Link, float] = {}
    for _, volume, (path,) in groups:
        for link in links_of(path):
            load[link] = load.get(link, 0.0) + volume
    bottleneck = min(load, key=lambda link: capacity[link] / load[link])
    lam = capacity[bottleneck] / load[bottleneck]
    rates = {pair: [(p[0], volume * lam)] for pair, volume, p in groups}
    return MinCct(1.0 / lam, rates, prices={bottleneck: 1.0})


def _link_disjoint(paths: tuple[Path, ...]) -> bool:
    seen: set[Link] = set()
    for path in paths:
        for link in links_of(path):
            if link in seen:
                return False
            seen.add(link)
    return True


def _disjoint_paths(
    group: tuple[Pair, float, tuple[Path, ...]], capacity: dict[Link, float]
) -> MinCct:
    """One FlowGroup over link-disjoint paths: each path carries its bottleneck capacity."""
    pair, volume, paths = group
    rates, prices = [], {}
    for p in paths:
        bottleneck = min(links_of(p), key=capacity.__getitem__)
        rates.append((p, capacity[bottleneck]))
        prices[bottleneck] = 1.0
    return MinCct(volume / sum(r for _, r in rates), {pair: rates}, prices=prices)


def _highs() -> highspy.Highs:
    h: highspy.Highs | None = getattr(_local, "highs", None)
    if h is None:
        h = _local.highs = new_highs(primal=True)
    return h


def _solve_lp(
    groups: list[tuple[Pair, float, tuple[Path, ...]]],
    capacity: dict[Link, float],
    fewest_link_bytes: bool = True,
    finish_s: float | None = None,
) -> MinCct:
    """Build and solve the scaled LP: columns x'_{k,p} then λ'; rows links then FlowGroups
    (`finish_s`: min_cct's).

    Scaling: x = C·x', λ = λ'·C/D with C = max capacity used, D = max volume, so
    the FlowGroup rows read Σ_p x'_{k,p} − λ'·d_k/D = 0 and the link rows r_e/C.
    """
    m = _lp_matrix(groups)
    n_links, n_groups = len(m.link_row), len(groups)
    caps = np.fromiter(map(capacity.__getitem__, m.link_row), float, n_links)  # (row order)
    big_c = caps.max()
    big_d = max(g[1] for g in groups)
    n_x = len(m.index)
    value = np.ones(n_x + n_groups)
    value[n_x:] = [-volume / big_d for _, volume, _ in groups]
    row_upper = np.concatenate([caps / big_c, np.zeros(n_groups)])
    a = m.lp
    h = _highs()
    pass_lp(
        h, True, a.cost, a.col_lower, a.col_upper, a.row_lower, row_upper, a.starts, a.index,
        value,
    )  # fmt: skip
    if not solve(h):
        status = h.modelStatusToString(h.getModelStatus())
        raise RuntimeError(f"HiGHS failed on Optimization (1): {status}")
    sol = h.getSolution()
    x = np.asarray(sol.col_value)
    duals = list(sol.row_dual)
    lam = x[-1] * big_c / big_d
    if lam <= 0:
        return MinCct(math.inf, lp_solved=True)
    lam = float(lam)  # (the same float64; Python arithmetic below is faster)
    rates: PairRates = {}
    target = lam if finish_s is None or not 1.0 / finish_s < lam else 1.0 / finish_s
    if fewest_link_bytes:
        held = x[-1] * (1 - _SECOND_STAGE_SLACK)  # (λ' at its optimum, or at the target)
        if target != lam:
            held *= target / lam
        rates = _split_rates(groups, m, x, _fewest_link_bytes(h, m.lens, x, held), target)
    prices = {link: abs(duals[row]) for link, row in m.link_row.items() if duals[row] != 0}
    return MinCct(1.0 / lam, rates, lp_solved=True, prices=prices)


class _LpArrays(NamedTuple):
    """The arrays of `_solve_lp`'s LP that depend only on its columns (the λ column
    included): costs (1 on λ'), column bounds [0, inf), link rows' lower bounds (-inf;
    FlowGroup rows 0), CSC starts and row indices. Capacities and volumes are per LP."""

    cost: np.ndarray
    col_lower: np.ndarray
    col_upper: np.ndarray
    row_lower: np.ndarray
    starts: np.ndarray
    index: np.ndarray  # type: ignore[assignment]  # (a field named as tuple.index, read by name)


class _LpMatrix(NamedTuple):
    """The x columns of `_solve_lp`'s LP in CSC form, before the λ column.

    cols: x column j's path; group_of: int32[j], its FlowGroup; lens: int32[j], its links;
    link_row: {link: row}, link rows in order of first appearance in the columns (the order
    HiGHS has always seen); starts: int32[j + 1] column starts; index: int32 row of every
    entry (a column's links, then its FlowGroup row n_links + k, coefficient 1); lp: the
    whole LP's fixed arrays (_LpArrays)."""

    cols: list[Path]
    group_of: np.ndarray
    lens: np.ndarray
    link_row: dict[Link, int]
    starts: np.ndarray
    index: np.ndarray  # type: ignore[assignment]  # (a field named as tuple.index, read by name)
    lp: _LpArrays


def _lp_arrays(starts: np.ndarray, index: np.ndarray, n_links: int, n_groups: int) -> _LpArrays:
    """`_LpArrays` of the LP whose x columns are `starts`/`index` (CSC), λ' last."""
    lp_index = np.concatenate([index, np.arange(n_links, n_links + n_groups, dtype=np.int32)])
    lp_starts = np.append(starts, len(lp_index)).astype(np.int32)
    n_cols = len(starts)  # (the x columns and λ')
    cost = np.zeros(n_cols)
    cost[-1] = 1.0
    row_lower = np.concatenate([np.full(n_links, -INF), np.zeros(n_groups)])
    out = _LpArrays(cost, np.zeros(n_cols), np.full(n_cols, INF), row_lower, lp_starts, lp_index)
    for shared in out:
        shared.flags.writeable = False
    return out


def _lp_matrix(groups: list[tuple[Pair, float, tuple[Path, ...]]]) -> _LpMatrix:
    """The x columns of the LP over `groups` ((pair, bytes, paths) per FlowGroup).

    They depend only on the FlowGroups' paths, so they are kept per tuple of path tuples
    (a coflow's ordering LP and its turn's LP, and the next rounds', mostly have the same
    usable paths). The arrays are shared: callers must not write into them."""
    return _lp_matrix_of(tuple(paths for _, _, paths in groups))


@lru_cache(maxsize=8192)
def _lp_matrix_of(group_paths: tuple[tuple[Path, ...], ...]) -> _LpMatrix:
    """`_lp_matrix` of FlowGroups with these paths (usable, distinct, in order)."""
    seq: list[int] = []  # the links of every x column, in column order (global ids)
    lens: list[int] = []  # links per x column
    per_group: list[int] = []  # x columns per FlowGroup
    for paths in group_paths:
        ids, hops = path_link_ids(paths)
        seq.extend(ids)
        lens.extend(hops)
        per_group.append(len(hops))
    group_of = np.repeat(np.arange(len(group_paths), dtype=np.int32), per_group)
    cols = [path for paths in group_paths for path in paths]  # x column j's path
    entry_row, link_row = first_use_rows(np.asarray(seq))
    lens_arr = np.asarray(lens, dtype=np.int32)
    starts = np.zeros(len(cols) + 1, dtype=np.int32)
    np.cumsum(lens_arr + 1, out=starts[1:])
    group_pos = starts[1:] - 1  # the last entry of every x column is its FlowGroup row
    index = np.empty(starts[-1], dtype=np.int32)
    at_link = np.ones(len(index), dtype=bool)
    at_link[group_pos] = False
    index[at_link] = entry_row
    index[group_pos] = group_of + len(link_row)
    for shared in (group_of, lens_arr, starts, index):
        shared.flags.writeable = False
    lp = _lp_arrays(starts, index, len(link_row), len(group_paths))
    return _LpMatrix(cols, group_of, lens_arr, link_row, starts, index, lp)


def _split_rates(
    groups: list[tuple[Pair, float, tuple[Path, ...]]],
    m: _LpMatrix,
    x: FloatArray,
    x2: FloatArray,
    lam: float,
) -> PairRates:
    """FlowGroup k's rates d_k·λ (bytes/s) split over its paths as the second stage's
    solution `x2` does, else the first stage's `x`, else all on its shortest path."""
    n_groups = len(groups)
    per_group_2 = _group_columns(m.cols, m.group_of, x2, n_groups)
    per_group_1 = None
    rates: PairRates = {}
    for k, (pair, volume, paths) in enumerate(groups):
        # The second stage may zero a FlowGroup whose volume is below the solver's
        # tolerance (d_k/D < 1e-7): then keep stage 1's split, or its shortest path.
        split = per_group_2[k]
        if not split:
            if per_group_1 is None:
                per_group_1 = _group_columns(m.cols, m.group_of, x, n_groups)
            split = per_group_1[k] or [(paths[0], 1.0)]
        total = sum(v for _, v in split)
        # renormalize so FlowGroup k gets exactly d_k·λ (removes solver round-off)
        rates[pair] = [(path, volume * lam * v / total) for path, v in split]
    return rates


def _group_columns(
    cols: list[Path], group_of: np.ndarray, x: FloatArray, n_groups: int
) -> list[list[tuple[Path, float]]]:
    """[(path, x > 0)] per FlowGroup from the LP's x columns (cols: the columns' paths,
    group_of: their FlowGroups, x: the column values with λ' last)."""
    out: list[list[tuple[Path, float]]] = [[] for _ in range(n_groups)]
    values = x[:-1]
    nonzero = np.flatnonzero(values > 0)
    picked = (nonzero.tolist(), group_of[nonzero].tolist(), values[nonzero].tolist())
    for j, k, v in zip(*picked, strict=True):
        out[k].append((cols[j], v))
    return out


def _fewest_link_bytes(
    h: highspy.Highs, hops: np.ndarray, x: FloatArray, held: float
) -> FloatArray:
    """Second stage: among the allocations that reach the optimal λ, the one that uses the
    least link capacity (minimum Σ_{k,p} x_{k,p}·hops(p)).

    Optimization (1) says nothing about FlowGroups off the bottleneck, so its optimal
    vertex may route them over long paths for no gain; this keeps the rest of the WAN
    free for the coflows after this one (docs/design.md 4.1: "nothing more is taken").
    Solved warm in the same HiGHS instance: λ' is held at `held` or more (its optimum
    less 1e-9 relative, or a deadline's lower target) and the objective is changed.
    Falls back to `x` if HiGHS fails.

    Args:
        h: the HiGHS instance holding stage 1's model and solution.
        hops: links per x column (int array), in column order.
        x: stage 1's column values (x columns then λ').
        held: the least λ' (scaled) of the second stage.
    """
    n = len(hops)
    lam_col = n
    h.changeColBounds(lam_col, held, INF)
    costs = np.append(-hops.astype(np.float64), 0.0)
    h.changeColsCost(n + 1, np.arange(n + 1, dtype=np.int32), costs)
    if not solve(h):
        return x
    return np.asarray(h.getSolution().col_value)
