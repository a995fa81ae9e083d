"""Rates per DC pair (the pair-symmetric baselines' fast paths, terra_core/policy.py):
a flow of n members gets n times its pair's per-member rate on each path.
"""

from __future__ import annotations

import numpy as np

from terra_core.policy import Policy
from terra_core.sparse_index import csr_ranges
from terra_sim.allocation import Allocator
from terra_sim.errors import SimulationError
from terra_sim.flow_table import FlowTable, LinkTable
from terra_sim.kernels import set_rates


class TableAllocator(Allocator):
    """Rates through ``pair_table`` / ``table_levels`` (per-flow, multipath): the pairs
    with active flows by index, in index order, with their active members (kept as flows
    come and go: whole numbers, so the sums are exact); a flow of n members gets n times
    its pair's per-member rate on each path (the sum of its pair's path levels, in path
    order). Checks: finite rates >= 0, the table's paths joining their pair's DCs over
    known links (once per table), link loads."""

    zeroes_live = False

    def __init__(self, policy: Policy, flows: FlowTable, links: LinkTable) -> None:
        super().__init__(policy, flows, links)
        self._members = np.zeros(len(flows.pairs.pairs))  # live members per pair
        self._table: tuple | None = None  # the policy's PairTable and its entries

    def admitted(self, pos: np.ndarray) -> None:
        """See Allocator.admitted."""
        np.add.at(self._members, self.flows.pair_of[pos], self.flows.members[pos])

    def finished(self, positions: np.ndarray) -> None:
        """See Allocator.finished."""
        f = self.flows
        np.subtract.at(self._members, f.pair_of[positions], f.members[positions])

    def wan_changed(self) -> None:
        """See Allocator.wan_changed: the policy's PairTable goes stale."""
        self._table = None

    def allocate(self, now: float, active: dict) -> float:
        """See Allocator.allocate."""
        f, count = self.flows, self._members
        active_pairs = np.flatnonzero(count)
        members = count[active_pairs]
        table, ptr, path_ptr, rows = self._pair_table()
        level = self.timed(self.policy.table_levels, now, table, active_pairs, members)
        level = np.asarray(level, dtype=float)
        path_ids = csr_ranges(ptr, active_pairs)
        if level.shape != path_ids.shape:
            raise SimulationError(f"{level.shape} per-path rates for {len(path_ids)} paths")
        bad = ~((level >= 0) & (level < float("inf")))
        if bad.any():
            path = table.paths[path_ids[bad.argmax()]]
            raise SimulationError(f"rate {float(level[bad][0])!r} per member on {path}")
        n = len(active_pairs)
        pair_pos = np.repeat(np.arange(n), ptr[active_pairs + 1] - ptr[active_pairs])
        per_member = np.zeros(len(f.pairs.pairs))
        per_member[active_pairs] = np.bincount(pair_pos, weights=level, minlength=n)
        self.next_finish = set_rates(f.live, f.pair_of, f.members, per_member, f.rate, f.rem)
        path_rate = members[pair_pos] * level
        hops = path_ptr[path_ids + 1] - path_ptr[path_ids]
        load = np.bincount(
            rows[csr_ranges(path_ptr, path_ids)],
            weights=np.repeat(path_rate, hops),
            minlength=len(self.links.row),
        )
        self.links.check_loads(load, now)
        return float(load.sum())

    def _pair_table(self) -> tuple:
        """(the policy's PairTable of the run's pairs, its pair -> paths pointers, and the
        simulator's own path -> link rows CSR: pointers and rows), asked for and checked
        once per WAN state: every path must join its pair's DCs over known links."""
        if self._table is None:
            pairs = self.flows.pairs.pairs
            table = self.policy.pair_table(pairs)
            ptr = np.asarray(table.ptr, dtype=np.intp)
            if ptr.shape != (len(pairs) + 1,) or ptr[-1] != len(table.paths):
                raise SimulationError(f"pair table of {ptr.shape} pointers for {len(pairs)} pairs")
            path_ptr, rows = [0], []
            pair_of_path = np.repeat(np.arange(len(pairs)), np.diff(ptr)).tolist()
            for path, i in zip(table.paths, pair_of_path, strict=True):
                rows.extend(self.links.rows_of(path))
                pair = pairs[i]
                if path[0] != pair[0] or path[-1] != pair[1]:
                    raise SimulationError(f"pair {pair}: path {path} does not join it")
                path_ptr.append(len(rows))
            self._table = (
                table,
                ptr,
                np.array(path_ptr, dtype=np.intp),
                np.array(rows, dtype=np.intp),
            )
        return self._table


class _PathColumns:
    """The paths a PairAllocator has seen, numbered: path j crosses the link rows
    rows[ptr[j]:ptr[j + 1]] and joins the ends of pair number pair[j] (-1: none)."""

    def __init__(self, links: LinkTable, pair_index: dict) -> None:
        self._links = links
        self._pair_index = pair_index
        self.col: dict[tuple[str, ...], int] = {}
        self._ptr = [0]
        self._rows: list[int] = []
        self._pair: list[int] = []
        self._arrays: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None

    def number(self, path: tuple[str, ...]) -> int:
        """Number of `path`, with its link rows and pair recorded on first use;
        SimulationError for an unknown link."""
        col = self.col.get(path)
        if col is None:
            rows = self._links.rows_of(path)
            col = self.col[path] = len(self.col)
            self._rows.extend(rows)
            self._ptr.append(len(self._rows))
            self._pair.append(self._pair_index.get((path[0], path[-1]), -1))
            self._arrays = None
        return col

    def arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(ptr, link rows, pair) as int arrays."""
        if self._arrays is None:
            self._arrays = (
                np.array(self._ptr, dtype=np.intp),
                np.array(self._rows, dtype=np.intp),
                np.array(self._pair, dtype=np.intp),
            )
        return self._arrays


class PairAllocator(Allocator):
    """Rates through ``pair_levels(now, pairs, members)`` (terra_core/pair_policy.py
    `PairPolicy`): one call per event with the active members per DC pair; a flow of
    n members gets n times its pair's per-member rate on each path. Checks: finite
    rates >= 0, paths joining their pair's DCs over known links, link loads."""

    def __init__(self, policy: Policy, flows: FlowTable, links: LinkTable) -> None:
        super().__init__(policy, flows, links)
        self._cache: dict[int, tuple] = {}  # see _entries
        self._paths = _PathColumns(links, flows.pairs.index)

    def allocate(self, now: float, active: dict) -> float:
        """See Allocator.allocate."""
        f = self.flows
        alive = f.live
        pair_of = f.pair_of[alive]
        count = np.bincount(pair_of, weights=f.members[alive], minlength=len(f.pairs.pairs))
        present, first = np.unique(pair_of, return_index=True)
        order = present[np.argsort(first, kind="stable")]  # first appearance
        pairs = tuple(f.pairs.objects[order].tolist())
        members = count[order]
        paths, pair, level = self.timed(self.policy.pair_levels, now, pairs, members)
        pair, level = np.asarray(pair, dtype=np.intp), np.asarray(level, dtype=float)
        rows, cols = self._entries(paths, pair, pairs, order)
        if level.shape != (len(paths),):
            raise SimulationError(f"{level.shape} per-path rates for {len(paths)} paths")
        bad = ~((level >= 0) & (level < float("inf")))
        if bad.any():
            raise SimulationError(
                f"rate {float(level[bad][0])!r} per member on {paths[bad.argmax()]}"
            )
        per_member = np.zeros(len(f.pairs.pairs))
        per_member[order] = np.bincount(pair, weights=level, minlength=len(pairs))
        f.rate[alive] = f.members[alive] * per_member[pair_of]
        path_rate = members[pair] * level
        load = np.bincount(rows, weights=path_rate[cols], minlength=len(self.links.row))
        self.links.check_loads(load, now)
        return float(load.sum())

    def _entries(
        self, paths: list, pair: np.ndarray, pairs: tuple, order: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """The links x `paths` incidence as (link rows, path indices), int arrays with one
        entry per (path, link of it), after checking every path joins its pair's DCs
        (``pairs[pair[j]]``, whose index in the run's pairs is ``order[pair[j]]``) over
        known links; cached (64 lists) while the policy hands back the same list for the
        same pairs."""
        cached = self._cache.get(id(paths))
        if cached is not None and cached[0] is paths and cached[1] == pairs:
            return cached[2], cached[3]
        if pair.shape != (len(paths),) or (
            len(paths) and not 0 <= pair.min() <= pair.max() < len(pairs)
        ):
            raise SimulationError(f"pair indices {pair!r} do not fit {len(paths)} paths")
        cols = list(map(self._paths.col.get, paths))
        if None in cols:
            for j, col in enumerate(cols):
                if col is None:
                    cols[j] = self._paths.number(paths[j])
        ptr, link_rows, path_pair = self._paths.arrays()
        cols = np.array(cols, dtype=np.intp)
        wrong = np.flatnonzero(path_pair[cols] != order[pair]) if len(paths) else []
        if len(wrong):
            j = int(wrong[0])
            raise SimulationError(f"pair {pairs[pair[j]]}: path {paths[j]} does not join it")
        entries = csr_ranges(ptr, cols)
        index = np.repeat(np.arange(len(paths), dtype=np.intp), ptr[cols + 1] - ptr[cols])
        if len(self._cache) >= 64:
            self._cache.clear()
        rows = link_rows[entries]
        self._cache[id(paths)] = (paths, pairs, rows, index)  # holds paths: id unique
        return rows, index
