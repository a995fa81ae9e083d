"""maxmin_mcf as of 7409806, before its loops went to numpy and cached
path links: the reference tests/unit/test_sim_fast_paths.py compares mcf.py with, bit for bit."""

from __future__ import annotations

from collections.abc import Hashable

import numpy as np

from terra_core.lp import INF, new_highs, pass_lp, solve
from topologies import Link, Path, path_links

Demand = tuple[list[Path], float | None]
Rates = dict[Hashable, list[tuple[Path, float]]]

_DUAL_TOL = 1e-9
_REL_TOL = 1e-7


def maxmin_mcf(
    demands: dict[Hashable, Demand],
    capacity: dict[Link, float],
    priority: dict[Hashable, int] | None = None,
    max_rounds: int = 64,
    weights: dict[Hashable, float] | None = None,
    stats: dict | None = None,
) -> Rates:
    """Max-min fair rates for commodities that may each split over several paths.

    Args:
        demands: {key: (paths, cap)}: the candidate paths of the commodity (tuples
            of DC names) and an optional demand rate cap in bytes/s (None =
            unbounded; a commodity never gets more than its cap).
        capacity: {(u, v): bytes/s} for directed links; links missing from it
            or at 0 carry nothing (paths crossing them are unusable).
        priority: optional {key: class}; lower classes are served first
            (default: every commodity in class 0).
        max_rounds: bound on the progressive-filling LPs per class (>= 1).
        weights: optional {key: weight > 0} for weighted max-min (commodity k is
            raised as weight_k · t; default 1). A commodity standing for n
            identical ones (same paths, no cap) with weight n gets what the n
            would get together.
        stats: optional dict; its "lps" entry is increased by the LPs solved.

    Returns:
        {key: [(path, bytes/s), ...]} for every key of `demands`, listing only
        paths with a positive rate (empty list = rate 0). Link loads never
        exceed capacity beyond solver tolerance (1e-7 relative).

    Raises:
        ValueError: a negative or non-numeric capacity or cap, a path with
            fewer than two DCs, a non-positive weight, or max_rounds < 1.
    """
    if max_rounds < 1:
        raise ValueError(f"max_rounds must be >= 1, got {max_rounds!r}")
    for link, cap in capacity.items():
        if not isinstance(cap, int | float) or not cap >= 0:
            raise ValueError(f"link {link}: capacity must be a number >= 0, got {cap!r}")
    result: Rates = {key: [] for key in demands}
    lp = _McfLp(demands, capacity, weights or {})
    if not lp.cols:
        return result
    classes = sorted({(priority or {}).get(k, 0) for k in lp.keys})
    for cls in classes:
        members = [i for i, k in enumerate(lp.keys) if (priority or {}).get(k, 0) == cls]
        lp.fill(members, max_rounds)
    rates = lp.rates()
    if stats is not None:
        stats["lps"] = stats.get("lps", 0) + lp.solves
    for (i, path), rate in zip(lp.cols, rates, strict=True):
        if rate > _REL_TOL * lp.scale:
            result[lp.keys[i]].append((path, rate))
    return result


class _McfLp:
    """The progressive-filling LP, kept in one HiGHS instance and changed by bounds only
    (so every re-solve starts warm from the previous basis).

    Columns: x_{k,p} (one per commodity path), z_k (one per commodity), t.
    Rows: one per link (Σ x ≤ c_e), A_k: Σ_p x_{k,p} − z_k = 0, B_k: z_k − t ≥ 0.
    Active commodity: z_k ∈ [0, cap_k], B_k on. Frozen at f: z_k ∈ [f, f], B_k free.
    Not yet in play (a later priority class): z_k ∈ [0, 0], B_k free.
    """

    def __init__(
        self,
        demands: dict[Hashable, Demand],
        capacity: dict[Link, float],
        weights: dict[Hashable, float],
    ) -> None:
        self.keys: list[Hashable] = []
        self.caps: list[float] = []
        self.weights: list[float] = []
        self.solves = 0
        self.cols: list[tuple[int, Path]] = []
        self.link_rows: dict[Link, int] = {}
        col_rows: list[list[int]] = []
        for key, (paths, cap) in demands.items():
            cap = _check_cap(key, cap)
            usable = [p for p in paths if _usable(key, p, capacity)]
            if cap == 0 or not usable:
                continue
            idx = len(self.keys)
            self.keys.append(key)
            self.caps.append(cap)
            self.weights.append(_check_weight(key, weights.get(key, 1.0)))
            for path in dict.fromkeys(usable):
                links = path_links(path)
                rows = [self.link_rows.setdefault(link, len(self.link_rows)) for link in links]
                self.cols.append((idx, path))
                col_rows.append(rows)
        if not self.cols:
            return
        self.capacity = {link: capacity[link] for link in self.link_rows}
        self.scale = max(self.capacity.values())
        n_links, m, nx = len(self.link_rows), len(self.keys), len(self.cols)
        self.a_row, self.b_row = n_links, n_links + m  # first A_k row, first B_k row
        self.z_col, self.t_col = nx, nx + m
        starts, index, value = [0], [], []
        for (i, _), rows in zip(self.cols, col_rows, strict=True):
            index.extend(rows)
            index.append(self.a_row + i)
            value.extend([1.0] * (len(rows) + 1))
            starts.append(len(index))
        for i in range(m):  # z_k: −1 in A_k, +1 in B_k
            index.extend([self.a_row + i, self.b_row + i])
            value.extend([-1.0, 1.0])
            starts.append(len(index))
        index.extend(range(self.b_row, self.b_row + m))  # t: −w_k in every B_k
        value.extend(-w for w in self.weights)
        starts.append(len(index))
        n_rows, n_cols = n_links + 2 * m, nx + m + 1
        row_lower = np.full(n_rows, -INF)
        row_upper = np.full(n_rows, INF)
        for link, row in self.link_rows.items():
            row_upper[row] = self.capacity[link] / self.scale
        row_lower[self.a_row : self.b_row] = 0.0
        row_upper[self.a_row : self.b_row] = 0.0
        col_upper = np.full(n_cols, INF)
        col_upper[self.z_col : self.t_col] = 0.0
        cost = np.zeros(n_cols)
        cost[self.t_col] = 1.0
        self.h = new_highs(primal=True)
        pass_lp(
            self.h,
            True,
            cost,
            np.zeros(n_cols),
            col_upper,
            row_lower,
            row_upper,
            np.asarray(starts, dtype=np.int32),
            np.asarray(index, dtype=np.int32),
            np.asarray(value),
        )

    def fill(self, members: list[int], max_rounds: int) -> None:
        """Progressive filling of the commodities `members` (indices into self.keys)."""
        h = self.h
        for i in members:
            h.changeColBounds(self.z_col + i, 0.0, self.caps[i] / self.scale)
            h.changeRowBounds(self.b_row + i, 0.0, INF)
        active = set(members)
        for _ in range(max_rounds):
            if not active:
                return
            if not self._solve():
                self._freeze(active, [0.0] * len(self.keys))
                return
            sol = h.getSolution()
            level = sol.col_value[self.t_col]
            duals = sol.row_dual
            done = {i for i in active if abs(duals[self.b_row + i]) > _DUAL_TOL} or set(active)
            self._freeze(done, [level * w for w in self.weights])
            active -= done
        if active:
            self._finish(active)

    def _solve(self) -> bool:
        self.solves += 1
        return solve(self.h)

    def _freeze(self, members: set[int], levels: list[float]) -> None:
        """Pin member i's total rate to levels[i] (scaled units) and take it out of t's rows."""
        for i in members:
            f = min(levels[i], self.caps[i] / self.scale)
            self.h.changeColBounds(self.z_col + i, f, f)
            self.h.changeRowBounds(self.b_row + i, -INF, INF)

    def _finish(self, active: set[int]) -> None:
        """Round limit hit: keep every active commodity at least at the current level and
        maximize their total rate (up to their caps), then freeze them there."""
        h = self.h
        level = h.getSolution().col_value[self.t_col]
        h.changeColCost(self.t_col, 0.0)
        for i in active:
            h.changeColBounds(
                self.z_col + i,
                min(level * self.weights[i], self.caps[i] / self.scale),
                self.caps[i] / self.scale,
            )
            h.changeRowBounds(self.b_row + i, -INF, INF)
            h.changeColCost(self.z_col + i, 1.0)
        self._solve()
        value = h.getSolution().col_value
        levels = [value[self.z_col + i] for i in range(len(self.keys))]
        for i in active:
            h.changeColCost(self.z_col + i, 0.0)
        h.changeColCost(self.t_col, 1.0)
        self._freeze(active, levels)

    def rates(self) -> list[float]:
        """Per-column rates in bytes/s from a final solve, scaled down where solver
        tolerance left a link a hair over its capacity."""
        self.h.changeColBounds(self.t_col, 0.0, 0.0)  # every commodity is frozen by now
        if not self._solve():
            return [0.0] * len(self.cols)
        value = self.h.getSolution().col_value
        rates = [max(0.0, value[c]) * self.scale for c in range(len(self.cols))]
        load = dict.fromkeys(self.link_rows, 0.0)
        for (_, path), rate in zip(self.cols, rates, strict=True):
            for link in path_links(path):
                load[link] += rate
        over = {
            link: self.capacity[link] / x for link, x in load.items() if x > self.capacity[link]
        }
        if over:
            for c, (_, path) in enumerate(self.cols):
                rates[c] *= min([1.0] + [over.get(link, 1.0) for link in path_links(path)])
        return rates


def _check_cap(key: Hashable, cap: object) -> float:
    if cap is None:
        return float("inf")
    if isinstance(cap, bool) or not isinstance(cap, int | float) or not cap >= 0:
        raise ValueError(f"commodity {key!r}: demand cap must be a number >= 0, got {cap!r}")
    return float(cap)


def _check_weight(key: Hashable, weight: object) -> float:
    if isinstance(weight, bool) or not isinstance(weight, int | float) or not weight > 0:
        raise ValueError(f"commodity {key!r}: weight must be a number > 0, got {weight!r}")
    if weight == float("inf"):
        raise ValueError(f"commodity {key!r}: weight must be finite")
    return float(weight)


def _usable(key: Hashable, path: Path, capacity: dict[Link, float]) -> bool:
    if len(path) < 2:
        raise ValueError(f"commodity {key!r}: path {path!r} needs at least two DCs")
    return all(capacity.get(link, 0.0) > 0 for link in path_links(path))
