"""Max-min fair multi-commodity flow over K paths (SWAN-style MCF).

Used by Terra's α share and work conservation (docs/design.md section 4.2 steps 5
and 6) and by the `swan-mcf` baseline (docs/design.md section 4.4).

Algorithm: progressive filling with LPs (the exact form of the iterative LPs of
Hong et al., "Achieving high utilization with software-driven WAN", SIGCOMM
2013, section 4.3, which approximates the same thing with geometric steps).
Every round solves

    maximize    t
    subject to  t ≤ Σ_p x_{k,p} ≤ cap_k     for every active commodity k
                Σ_p x_{k,p} = f_k           for every frozen commodity k
                Σ_{(k,p) : e ∈ p} x_{k,p} ≤ c_e   for every link e
                x ≥ 0

and freezes at level f_k = t* the commodities that cannot go beyond t*: by LP
duality, a commodity whose row has a non-zero dual is pinned to exactly t* in
every solution where all active commodities get at least t*, so freezing it is
exact (a commodity held back by its cap has a non-zero dual too). Each round
freezes at least one commodity; the LP is kept in one HiGHS instance and
re-solved warm (primal simplex) after changing bounds only. After `max_rounds` rounds the remaining
commodities are frozen at the current level and one last LP maximizes the total
rate with every commodity at least at its level, so no capacity that some
commodity could use is left idle.

Priority classes: commodities with a smaller priority are filled first (max-min
among themselves); a class sees only what the earlier classes left.

Two forms of the same LPs (same optima, so the same per-commodity totals, which are
unique for max-min fairness): `_McfLp` (the default; two rows per commodity, bounds
changes only) and `_CompactMcfLp` (`compact=True`: one row per commodity and one new
level column per round, about 0.7x the CPU time on ATT), optionally started from the
previous call's first basis (`McfWarmStart`). Their splits over paths may differ (the
LPs have many optimal splits), which is why Terra's round keeps the default and the
swan-mcf baseline, whose CCTs depend on the totals only, uses the compact form.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from typing import Generic, TypeVar

import highspy
import numpy as np
from numpy.typing import NDArray

from terra_core.lp import (
    INF,
    basic_variables,
    change_rows_bounds,
    new_highs,
    pass_lp,
    solve,
)
from terra_core.min_cct import first_use_rows, links_of, path_link_ids
from topologies import Link, Path

K = TypeVar("K", bound=Hashable)  # a commodity key (e.g. a (src DC, dst DC) pair)
Demand = tuple[list[Path], float | None]
Rates = dict[K, list[tuple[Path, float]]]  # {key: [(path, bytes/s), ...]}

_DUAL_TOL = 1e-9
_REL_TOL = 1e-7
# HiGHS's primal simplex perturbs the bounds of degenerate LPs (multiplier 1 by default)
# and removes the perturbation after, with cleanup iterations. The compact LP's rounds
# are highly degenerate (many commodities frozen at one level): on the 40-DC synthetic
# WAN (1,500 DC pairs, 140 links) without it a maxmin_mcf call takes ~0.65x the simplex
# iterations and ~0.55x the CPU time. Only the path taken changes, not the
# LP, so the same optimum and the same totals.
_NO_PERTURBATION = 0.0


def maxmin_mcf(
    demands: Mapping[K, Demand],
    capacity: dict[Link, float],
    priority: Mapping[K, int] | None = None,
    max_rounds: int = 64,
    weights: Mapping[K, float] | None = None,
    stats: dict[str, int] | None = None,
    compact: bool = False,
    warm: McfWarmStart | None = None,
) -> Rates[K]:
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
        compact: solve the LPs with one row per commodity (`_CompactMcfLp`, about
            0.7x the CPU time on large instances; without HiGHS's primal bound
            perturbation, 0.6x again on a 40-DC WAN). Every commodity gets the same total
            rate (max-min fair totals are unique; equal to ~1e-11 relative), but its
            split over paths may differ, since the LP has many optimal splits and
            another formulation lands on another one. Terra's round keeps the default
            (its step 6 fills what step 5's split left, so the split shows in CCTs).
        warm: with compact, an McfWarmStart kept across calls: the first LP starts
            from the previous call's first optimal basis (same totals, fewer simplex
            iterations when consecutive calls are alike).

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
    result: Rates[K] = {key: [] for key in demands}
    lp: _McfLp[K] | _CompactMcfLp[K]
    if compact:
        lp = _CompactMcfLp(demands, capacity, weights or {}, warm)
    else:
        lp = _McfLp(demands, capacity, weights or {})
    if not lp.cols:
        return result
    classes = sorted({(priority or {}).get(k, 0) for k in lp.keys})
    for cls in classes:
        members = [i for i, k in enumerate(lp.keys) if (priority or {}).get(k, 0) == cls]
        lp.fill(members, max_rounds)
    if lp.taken_failed:  # a solve after rounds taken from the last
        lp = _CompactMcfLp(demands, capacity, weights or {}, warm)  # call failed: solve
        lp.fill(list(range(len(lp.keys))), max_rounds)  # afresh (warm.record is cleared)
    rates = lp.rates()
    if stats is not None:
        stats["lps"] = stats.get("lps", 0) + lp.solves
    for (i, path), rate in zip(lp.cols, rates, strict=True):
        if rate > _REL_TOL * lp.scale:
            result[lp.keys[i]].append((path, rate))
    return result


class _FillLp(Generic[K]):
    """What both progressive-filling LPs share: the columns x_{k,p} (one per commodity and
    usable path, commodities with cap 0 or no usable path left out), the link rows, and
    the final rates with tolerance overloads scaled away. Subclasses load the LP into
    `self.h` (`_load`) and implement `fill` and `rates`."""

    taken_failed = False  # a solve after rounds taken from the last call failed (compact)

    def __init__(
        self,
        demands: Mapping[K, Demand],
        capacity: dict[Link, float],
        weights: Mapping[K, float],
        columns: _ColumnCache | None = None,
    ) -> None:
        self.keys: list[K] = []
        self.caps: list[float] = []
        self.weights: list[float] = []
        self.solves = 0
        self.cols: list[tuple[int, Path]] = []
        open_links = {link for link, cap in capacity.items() if cap > 0}
        if columns is None:
            columns = _ColumnCache()
        columns.keep_for(open_links)
        seq: list[int] = []  # the links of every column, column after column (link ids)
        hops: list[int] = []  # links per column
        key_paths: dict[Hashable, tuple[Path, ...]] = {}
        for key, (paths, cap) in demands.items():
            cap = _check_cap(key, cap)
            usable, ids, lens = columns.of(key, paths, open_links)
            if cap == 0 or not usable:
                continue
            idx = len(self.keys)
            self.keys.append(key)
            self.caps.append(cap)
            self.weights.append(_check_weight(key, weights.get(key, 1.0)))
            self.cols.extend([(idx, path) for path in usable])
            key_paths[key] = usable
            seq.extend(ids)
            hops.extend(lens)
        self.key_paths = key_paths  # {key: its usable paths in column order}
        if not self.cols:
            return
        # link rows numbered in order of first use; the link rows of every column's path,
        # column after column (entry_row), from entry_start[j] on for column j
        entry_row, self.link_rows = first_use_rows(np.asarray(seq, np.intp))
        self.entry_row = entry_row.astype(np.intp)
        self.link_count = np.asarray(hops, np.intp)
        self.entry_col = np.repeat(np.arange(len(hops)), self.link_count)
        self.owner = np.fromiter((i for i, _ in self.cols), np.intp, len(self.cols))
        self.entry_start = np.zeros(len(hops), np.intp)
        np.cumsum(self.link_count[:-1], out=self.entry_start[1:])
        self.capacity = {link: capacity[link] for link in self.link_rows}
        self.scale = max(self.capacity.values())
        self.h = new_highs(primal=True)
        self._load()

    def _load(self) -> None:
        """Pass the LP to self.h."""
        raise NotImplementedError

    def _x_entries(self, *extra: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """CSC column starts (len n + 1) and row indices (int32) of the n x columns: column
        j has its path's link rows, then extra[0][j], extra[1][j], ... (rows; −1 = none)."""
        count = self.link_count.copy()
        for rows in extra:
            count += rows >= 0
        starts = np.zeros(len(count) + 1, np.int32)
        np.cumsum(count, out=starts[1:])
        index = np.empty(starts[-1], np.int32)
        col = self.entry_col
        index[starts[col] + np.arange(len(col)) - self.entry_start[col]] = self.entry_row
        at = starts[:-1] + self.link_count
        for rows in extra:
            has = rows >= 0
            index[at[has]] = rows[has]
            at += has
        return starts, index

    def _solve(self) -> bool:
        self.solves += 1
        return solve(self.h)

    def _scaled(self, value: list[float]) -> list[float]:
        """Per-column rates in bytes/s from the x values of a solve (scaled units),
        scaled down where solver tolerance left a link a hair over its capacity.

        The loads are summed with np.bincount over the columns' links in column order
        (the order of a per-link running sum), so the same loads and factors as a loop."""
        n = len(self.cols)
        rates = np.array([max(0.0, value[c]) * self.scale for c in range(n)])
        load = np.bincount(
            self.entry_row, weights=rates[self.entry_col], minlength=len(self.link_rows)
        )
        cap = np.fromiter(self.capacity.values(), float, len(self.capacity))  # row order
        over = load > cap
        if over.any():
            ratio = np.ones(len(cap))
            ratio[over] = cap[over] / load[over]
            rates *= np.minimum.reduceat(ratio[self.entry_row], self.entry_start)
        scaled: list[float] = rates.tolist()
        return scaled


class _McfLp(_FillLp[K]):
    """The progressive-filling LP, kept in one HiGHS instance and changed by bounds only
    (so every re-solve starts warm from the previous basis).

    Columns: x_{k,p} (one per commodity path), z_k (one per commodity), t.
    Rows: one per link (Σ x ≤ c_e), A_k: Σ_p x_{k,p} − z_k = 0, B_k: z_k − t ≥ 0.
    Active commodity: z_k ∈ [0, cap_k], B_k on. Frozen at f: z_k ∈ [f, f], B_k free.
    Not yet in play (a later priority class): z_k ∈ [0, 0], B_k free.
    """

    def _load(self) -> None:
        n_links, m, nx = len(self.link_rows), len(self.keys), len(self.cols)
        self.a_row, self.b_row = n_links, n_links + m  # first A_k row, first B_k row
        self.z_col, self.t_col = nx, nx + m
        x_starts, x_index = self._x_entries(self.a_row + self.owner)
        nnz = len(x_index)
        starts = np.concatenate([x_starts, nnz + 2 * np.arange(1, m + 1), [nnz + 3 * m]])
        z_index = np.stack([self.a_row + np.arange(m), self.b_row + np.arange(m)], axis=1)
        index = np.concatenate([x_index, z_index.ravel(), self.b_row + np.arange(m)])
        # x: +1 in its link rows and A_k; z_k: −1 in A_k, +1 in B_k; t: −w_k in every B_k
        value = np.concatenate([np.ones(nnz), np.tile([-1.0, 1.0], m), -np.array(self.weights)])
        n_rows, n_cols = n_links + 2 * m, nx + m + 1
        row_lower = np.full(n_rows, -INF)
        row_upper = np.full(n_rows, INF)
        row_upper[:n_links] = np.fromiter(self.capacity.values(), float, n_links) / self.scale
        row_lower[self.a_row : self.b_row] = 0.0
        row_upper[self.a_row : self.b_row] = 0.0
        col_upper = np.full(n_cols, INF)
        col_upper[self.z_col : self.t_col] = 0.0
        cost = np.zeros(n_cols)
        cost[self.t_col] = 1.0
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
        """Per-column rates in bytes/s from a final solve (see `_FillLp._scaled`)."""
        self.h.changeColBounds(self.t_col, 0.0, 0.0)  # every commodity is frozen by now
        if not self._solve():
            return [0.0] * len(self.cols)
        return self._scaled(self.h.getSolution().col_value)


class _CompactMcfLp(_FillLp[K]):
    """The same progressive filling with one row per commodity instead of two, kept in
    one HiGHS instance: every re-solve starts warm from the previous basis (bounds, costs
    and new columns only, no coefficient changes).

    Columns: x_{k,p} (one per commodity path), then one level step Δ_r per round r.
    Rows: one per link (Σ x ≤ c_e); one per commodity, C_k: Σ_p x_{k,p} − w_k Σ Δ_r over
    the rounds r where k was active; and D_k: Σ_p x_{k,p} ≤ cap_k for a finite cap only.
    Round r adds Δ_r (cost 1, ≥ 0) with −w_k in the row of every active k; after the
    solve Δ_r is fixed at its value (cost 0), so the class level t is the sum of its Δs.
    Active commodity: C_k ≥ 0. Frozen: C_k = 0, so Σ_p x_{k,p} = w_k · level (after the
    round limit: C_k fixed at its value in the last solve). Not yet in play (a later
    priority class): C_k = 0 with no Δ in it, so Σ_p x = 0. The basis has about half
    the rows of `_McfLp`'s; on ATT's DC pairs a maxmin_mcf call takes about 0.7x the
    CPU time.
    """

    def __init__(
        self,
        demands: Mapping[K, Demand],
        capacity: dict[Link, float],
        weights: Mapping[K, float],
        warm: McfWarmStart | None = None,
    ) -> None:
        self.warm = warm
        super().__init__(demands, capacity, weights, warm.columns if warm else None)

    def _load(self) -> None:
        """Pass the x columns and the link, C_k and D_k rows (every C_k at 0), and turn off
        the primal simplex's bound perturbation (see `_NO_PERTURBATION`)."""
        self.h.setOptionValue("primal_simplex_bound_perturbation_multiplier", _NO_PERTURBATION)
        n_links, m = len(self.link_rows), len(self.keys)
        self.c_row = n_links  # first C_k row
        self.step_col = -1  # the Δ column of the current round (none yet)
        self.x: list[float] = [0.0] * len(self.cols)  # x of the last solve (scaled units)
        self.weight_array = np.array(self.weights)
        self.stale = False  # bounds changed without a solve since (`rates` re-solves)
        capped = np.array(self.caps) < INF
        d_row = np.full(m, -1)
        d_row[capped] = n_links + m + np.arange(np.count_nonzero(capped))
        starts, index = self._x_entries(self.c_row + self.owner, d_row[self.owner])
        n_rows = n_links + m + np.count_nonzero(capped)
        row_lower = np.full(n_rows, -INF)
        row_upper = np.full(n_rows, INF)
        row_upper[:n_links] = np.fromiter(self.capacity.values(), float, n_links) / self.scale
        row_lower[n_links : n_links + m] = 0.0
        row_upper[n_links : n_links + m] = 0.0
        row_upper[d_row[capped]] = np.array(self.caps)[capped] / self.scale
        n_cols = len(self.cols)
        pass_lp(
            self.h,
            True,
            np.zeros(n_cols),
            np.zeros(n_cols),
            np.full(n_cols, INF),
            row_lower,
            row_upper,
            np.asarray(starts, dtype=np.int32),
            np.asarray(index, dtype=np.int32),
            np.ones(len(index)),
        )

    def fill(self, members: list[int], max_rounds: int) -> None:
        """Progressive filling of the commodities `members` (indices into self.keys).

        With an McfWarmStart whose last call had every commodity of this one and more
        (`_resume_rounds`), the rounds before the first one where a dropped commodity
        froze (at most `max_rounds` of them) are taken from that call instead of solved
        again (same steps, same commodities frozen), and the first round solved starts
        from that call's basis there. Why that is exact: a commodity that was still
        active after round r had a zero dual in round r's LP, so that LP's optimal dual
        solution, without the commodity's row and columns, is dual feasible for the LP
        without it and has the same objective; the old primal solution without the
        commodity's flows is feasible too, so both LPs have the same optimal level, and
        the rows with a non-zero dual are pinned in every optimal solution of the new LP
        as of the old one (docs/design.md 4.4). Every call then records its rounds in
        the McfWarmStart for the next. If a solve after rounds taken fails, the fill
        stops with `taken_failed` set and maxmin_mcf solves the call afresh (the record
        is dropped by then).
        """
        h = self.h
        active = np.array(sorted(members), dtype=np.int32)
        rows = self.c_row + active
        change_rows_bounds(h, rows, np.zeros(len(rows)), np.full(len(rows), INF))
        resumable = self._resumable(members)
        done_rounds = self._resume_rounds()[:max_rounds] if resumable else []
        active, level = self._replay(active, done_rounds)
        rounds = list(done_rounds)
        if rounds and not len(active):  # every commodity froze in the rounds taken: solve
            if self._solve_round(rounds):  # once, for x
                self.x = h.getSolution().col_value[: len(self.cols)]
            else:
                self.taken_failed = True
                return
        for _ in range(max_rounds - len(rounds)):
            if not len(active):
                break
            self._add_step(active)
            if not self._solve_round(rounds):
                if done_rounds:
                    self.taken_failed = True
                    return
                self._fail(active, level)
                resumable = False
                break
            step = h.getObjectiveValue()  # Δ is the only column with a cost
            level += step
            duals = np.asarray(h.getSolution().row_dual)[self.c_row + active]
            done = np.abs(duals) > _DUAL_TOL
            if done.all() or not done.any():  # the class's last round: keep its x
                done[:] = True
                self.x = h.getSolution().col_value[: len(self.cols)]
            h.changeColBounds(self.step_col, step, step)
            h.changeColCost(self.step_col, 0.0)
            self._freeze(active[done])
            if resumable:
                basis = _Basis(self, basic_variables(h))
                frozen = frozenset(self.keys[i] for i in active[done].tolist())
                rounds.append(_Round(step, frozen, basis))
            active = active[~done]
        if len(active):
            self._finish(active)
            resumable = False
        if resumable:
            assert self.warm is not None  # (_resumable)
            self.warm.record = _CallRecord(self, rounds)

    def _resumable(self, members: list[int]) -> bool:
        """Whether this fill may take rounds from, and leave its rounds in, self.warm: one
        priority class (`members` is every commodity), no caps and every weight 1."""
        return (
            self.warm is not None
            and len(members) == len(self.keys)
            and all(cap == INF for cap in self.caps)
            and all(w == 1.0 for w in self.weights)
        )

    def _resume_rounds(self) -> list[_Round]:
        """The rounds of self.warm's last call that hold for this one (see `fill`): those
        before the first round where a commodity of that call missing here froze, when
        this call has no commodity that one lacked and the same links, capacities, scale
        and paths for every commodity; else none."""
        assert self.warm is not None  # (called when _resumable)
        record, self.warm.record = self.warm.record, None
        if record is None or self.scale != record.scale:
            return []
        if len(self.keys) >= len(record.froze_at):
            return []
        froze_at = record.froze_at
        if not all(key in froze_at for key in self.keys):
            return []  # a commodity the last call did not have
        kept = set(self.keys)
        first = min(r for key, r in froze_at.items() if key not in kept)
        if first == 0:
            return []
        if any(record.capacity.get(link) != cap for link, cap in self.capacity.items()):
            return []
        paths = self.key_paths
        if any(record.paths[key] != key_paths for key, key_paths in paths.items()):
            return []
        return record.rounds[:first]

    def _replay(self, active: np.ndarray, rounds: list[_Round]) -> tuple[np.ndarray, float]:
        """Apply `rounds` (taken from the last call) without solving: each adds its Δ fixed
        at its step and freezes its commodities. Returns (the still active commodities,
        the class level in scaled units: the steps summed in order, as `fill` does)."""
        level = 0.0
        for done_round in rounds:
            self._add_step(active)
            self.h.changeColBounds(self.step_col, done_round.step, done_round.step)
            self.h.changeColCost(self.step_col, 0.0)
            level += done_round.step
            keys = self.keys
            done = np.fromiter(
                (keys[i] in done_round.frozen for i in active.tolist()), bool, len(active)
            )
            self._freeze(active[done])
            active = active[~done]
        return active, level

    def _add_step(self, active: np.ndarray) -> None:
        """Add this round's level step Δ (cost 1, ≥ 0): −w_k in the row of each active k."""
        rows = (self.c_row + active).astype(np.int32)
        self.step_col = self.h.getNumCol()
        self.h.addCol(1.0, 0.0, INF, len(rows), rows, -self.weight_array[active])

    def _solve_round(self, rounds: list[_Round]) -> bool:
        """Solve a round's LP. The first LP of a call starts from the basis of the last
        round in `rounds` (those taken from the previous call), else from `self.warm`'s
        first basis (if any), and a first round leaves its optimal basis there for the
        next call."""
        first = self.solves == 0 and self.warm is not None
        if first and rounds:
            rounds[-1].basis.apply(self)
            return self._solve()
        if first:
            assert self.warm is not None
            self.warm.apply(self)
        ok = self._solve()
        if first and ok:
            assert self.warm is not None
            self.warm.save(self)
        return ok

    def _solve(self) -> bool:
        ok = super()._solve()
        self.stale = not ok
        return ok

    def _freeze(self, members: np.ndarray, value: np.ndarray | None = None) -> None:
        """Fix the rows C_k of `members` at `value` (default 0: Σ_p x_{k,p} = w_k · level,
        where the last solve has a commodity whose row has a non-zero dual)."""
        rows = (self.c_row + members).astype(np.int32)
        value = np.zeros(len(rows)) if value is None else value
        change_rows_bounds(self.h, rows, value, value)

    def _fail(self, active: np.ndarray, level: float) -> None:
        """The solver gave up: the active commodities get rate 0 (C_k = −w_k · level)."""
        self.h.changeColBounds(self.step_col, 0.0, 0.0)
        rows = (self.c_row + active).astype(np.int32)
        value = -self.weight_array[active] * level
        change_rows_bounds(self.h, rows, value, value)
        self.stale = True

    def _finish(self, active: np.ndarray) -> None:
        """Round limit hit: keep every active commodity at least at the current level and
        maximize their total rate (up to their caps), then freeze them there."""
        h = self.h
        cols = np.flatnonzero(np.isin(self.owner, active)).astype(np.int32)
        h.changeColsCost(len(cols), cols, np.ones(len(cols)))
        if self._solve():
            solution = h.getSolution()
            self.x = solution.col_value[: len(self.cols)]
            self._freeze(active, np.asarray(solution.row_value)[self.c_row + active])
        h.changeColsCost(len(cols), cols, np.zeros(len(cols)))

    def rates(self) -> list[float]:
        """Per-column rates in bytes/s from the last solve, re-solved first if a failure
        changed bounds since (see `_FillLp._scaled`)."""
        if self.stale:
            if not self._solve():
                return [0.0] * len(self.cols)
            self.x = self.h.getSolution().col_value[: len(self.cols)]
        return self._scaled(self.x)


class McfWarmStart:
    """The optimal basis of the first LP of the last `maxmin_mcf(compact=True)` call, by
    name, to start the next call's first LP from: in the simulator consecutive calls
    differ by a few DC pairs or capacities, and the first LP of a call from the slack
    basis is its most expensive one (hundreds to tens of thousands of simplex
    iterations; from the last basis, a few on ATT). Kept: the paths whose x was basic,
    and whether each link row and commodity row was (a non-basic x is at 0, a non-basic
    link row at its capacity, a non-basic commodity row at its lower bound). Paths, links
    and commodities the last call did not have start non-basic (x) or basic (rows);
    HiGHS completes the basis ("alien" basis) when the count of basic variables is off.
    Only the starting point changes, not the LP: the same optimum, so the same totals
    (the split over paths may differ). Keep one per caller (e.g. one per policy).

    It also keeps the rounds of the last call with one priority class, no caps and unit
    weights (`record`): a later call on the same WAN whose commodities are a subset of
    that call's takes the rounds before the first one where a dropped commodity froze
    from it (`_CompactMcfLp.fill`); in the simulator most new sets of DC pairs are the
    last set less a pair whose last flow ended. And each commodity's usable paths and
    their links (`_ColumnCache`), which a call looks up instead of building again.
    """

    def __init__(self) -> None:
        self.paths: set[Path] = set()  # paths with x basic
        self.links: dict[Link, bool] = {}  # link -> its row was basic
        self.keys: dict[Hashable, bool] = {}  # commodity key -> its row C_k was basic
        self.record: _CallRecord | None = None  # the last resumable call's rounds
        self.columns = _ColumnCache()  # each commodity's usable paths and link ids

    def apply(self, lp: _CompactMcfLp[K]) -> None:
        """Give `lp`'s loaded first LP (x columns, one step column) the saved basis."""
        if not self.keys:
            return
        status = highspy.HighsBasisStatus
        lower, upper, basic = status.kLower, status.kUpper, status.kBasic
        paths, links, keys = self.paths, self.links.get, self.keys.get
        basis = highspy.HighsBasis()
        basis.col_status = [basic if p in paths else lower for _, p in lp.cols] + [basic]
        rows = [basic if links(link, True) else upper for link in lp.link_rows]
        rows += [basic if keys(key, True) else lower for key in lp.keys]
        basis.row_status = rows + [basic] * (lp.h.getNumRow() - len(rows))  # D_k rows
        basis.valid = True
        basis.alien = True
        lp.h.setBasis(basis)

    def save(self, lp: _CompactMcfLp[K]) -> None:
        """Keep the optimal basis of `lp`'s first LP (just solved)."""
        basic = basic_variables(lp.h)
        cols = basic[(basic >= 0) & (basic < len(lp.cols))]
        self.paths = {lp.cols[j][1] for j in cols.tolist()}
        is_basic = np.zeros(lp.h.getNumRow(), bool)
        is_basic[-1 - basic[basic < 0]] = True
        n_links = len(lp.link_rows)
        self.links = dict(zip(lp.link_rows, is_basic[:n_links].tolist(), strict=True))
        c_basic = is_basic[n_links : n_links + len(lp.keys)].tolist()
        self.keys = dict(zip(lp.keys, c_basic, strict=True))


class _Basis:
    """The basic variables after one round's solve of a `_CompactMcfLp`, kept as HiGHS's
    basic index array (cheap to take every round) with the LP's names, and turned into
    a basis by name only when a later call starts from it (`apply`)."""

    def __init__(self, lp: _CompactMcfLp[K], basic: NDArray[np.int32]) -> None:
        self.cols = lp.cols
        self.link_rows = lp.link_rows
        self.keys: list[Hashable] = list(lp.keys)
        self.basic = np.array(basic)  # >= 0: column index; < 0: row -1 - index

    def apply(self, lp: _CompactMcfLp[K]) -> None:
        """Give `lp` (loaded, its earlier rounds replayed, this round's Δ added) this
        basis by name: x of the same paths, Δ of the same rounds, the same link and
        commodity rows basic; the rest non-basic at the bound they rest on (x and Δ at
        0, link rows at capacity, commodity rows at their lower bound). The dropped
        commodities' rows and columns are gone, so the count may be off: HiGHS completes
        the basis ("alien")."""
        n_cols, n_links = len(self.cols), len(self.link_rows)
        cols = self.basic[self.basic >= 0]
        paths = {self.cols[j][1] for j in cols[cols < n_cols].tolist()}
        steps = set((cols[cols >= n_cols] - n_cols).tolist())
        rows = -1 - self.basic[self.basic < 0]
        links = list(self.link_rows)
        basic_links = {links[r] for r in rows[rows < n_links].tolist()}
        in_keys = (rows >= n_links) & (rows < n_links + len(self.keys))
        basic_keys = {self.keys[r - n_links] for r in rows[in_keys].tolist()}
        status = highspy.HighsBasisStatus
        lower, upper, basic = status.kLower, status.kUpper, status.kBasic
        basis = highspy.HighsBasis()
        col_status = [basic if p in paths else lower for _, p in lp.cols]
        n_steps = lp.h.getNumCol() - len(lp.cols)
        basis.col_status = col_status + [basic if r in steps else lower for r in range(n_steps)]
        row_status = [basic if link in basic_links else upper for link in lp.link_rows]
        row_status += [basic if key in basic_keys else lower for key in lp.keys]
        basis.row_status = row_status + [basic] * (lp.h.getNumRow() - len(row_status))
        basis.valid = True
        basis.alien = True
        lp.h.setBasis(basis)


class _Round:
    """One progressive-filling round of a `_CompactMcfLp` call: its level step Δ (scaled
    units), the commodity keys it froze, and the basis after its solve (`_Basis`)."""

    def __init__(self, step: float, frozen: frozenset[Hashable], basis: _Basis) -> None:
        self.step = step
        self.frozen = frozen
        self.basis = basis


class _ColumnCache:
    """Each commodity's usable paths (in order, without repeats) and the process-wide ids
    of their links (`min_cct.path_link_ids`), for one set of open links. An McfWarmStart
    keeps one across calls: a caller's commodities keep their paths, so a call looks its
    commodities up instead of checking every path's links again. A commodity whose paths
    differ from the kept ones, or a new set of open links, is computed afresh."""

    def __init__(self) -> None:
        self.open_links: set[Link] = set()
        self.by_key: dict[
            Hashable, tuple[tuple[Path, ...], tuple[Path, ...], tuple[int, ...], tuple[int, ...]]
        ] = {}

    def keep_for(self, open_links: set[Link]) -> None:
        """Forget every commodity unless `open_links` are the links of the kept ones."""
        if open_links != self.open_links:
            self.by_key.clear()
            self.open_links = set(open_links)

    def of(
        self, key: Hashable, paths: list[Path], open_links: set[Link]
    ) -> tuple[tuple[Path, ...], tuple[int, ...], tuple[int, ...]]:
        """(`key`'s usable paths, their link ids one path after the other, the links of
        each path) on `open_links` (those of `keep_for`).

        Raises:
            ValueError: a path with fewer than two DCs.
        """
        given = tuple(paths)
        found = self.by_key.get(key)
        if found is None or found[0] != given:
            usable = tuple(dict.fromkeys(_usable_paths(key, paths, open_links)))
            found = (given, usable, *path_link_ids(usable))
            self.by_key[key] = found
        return found[1], found[2], found[3]


class _CallRecord:
    """What a later call needs to take rounds from a finished `_CompactMcfLp` call: its
    rounds (`_Round` list, in order), the round each commodity froze in, the scale, link
    capacities (bytes/s) and each commodity's paths (see `_CompactMcfLp._resume_rounds`)."""

    def __init__(self, lp: _CompactMcfLp[K], rounds: list[_Round]) -> None:
        self.rounds = rounds
        self.froze_at = {key: r for r, done in enumerate(rounds) for key in done.frozen}
        self.scale = lp.scale
        self.capacity = lp.capacity
        self.paths = lp.key_paths


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


def _usable_paths(key: Hashable, paths: list[Path], open_links: set[Link]) -> list[Path]:
    """The paths (in order) all of whose links are in `open_links` (capacity > 0).

    Raises:
        ValueError: a path with fewer than two DCs.
    """
    superset = open_links.issuperset
    usable = [path for path in paths if len(path) > 1 and superset(links_of(path))]
    if len(usable) < len(paths):
        for path in paths:
            if len(path) < 2:
                raise ValueError(f"commodity {key!r}: path {path!r} needs at least two DCs")
    return usable
