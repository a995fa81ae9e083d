"""The five baselines of docs/design.md section 4.4 as Policy classes (policy.py).

| class            | routing                                  | rates                              |
|------------------|------------------------------------------|------------------------------------|
| PerFlowPolicy    | one shortest path per flow               | max-min fair per flow (ideal TCP)  |
| MultipathPolicy  | every flow over all its K paths          | max-min fair per subflow (MPTCP)   |
| SwanMcfPolicy    | K paths per DC pair                      | max-min MCF over DC-pair demands   |
| VarysPolicy      | one shortest path per flow               | SEBF order, MADD, max-min backfill |
| RapierPolicy     | per flow one of K paths, min coflow CCT  | order by that CCT, MADD, backfill  |

All are work-conserving: per-flow, multipath and swan-mcf by max-min fairness
itself; varys and rapier hand whatever MADD leaves to a max-min fair backfill
over all active flows, as in their papers. None of them does deadline
admission: every coflow is accepted (deadlines are only measured).

Flows may be FlowBundles (flow_bundles.py); every per-flow fairness below is
weighted by the bundle's member count, which gives the rates the separate
flows would get. Paths are the K shortest over links that are up
(topologies.all_pairs_paths), recomputed on every WAN change: per-flow,
multipath and varys then follow the new shortest paths (as IP routing would);
a flow with no path up gets rate 0 until one comes back.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import numpy as np
from numba import njit

from terra_core.flow_bundles import flow_count
from terra_core.maxmin import (
    add_held,
    columns_by_row,
    csr_ranges,
    flush_held,
    link_index,
    maxmin_levels_entries,
    maxmin_levels_scaled,
    path_entries,
)
from terra_core.mcf import McfWarmStart, maxmin_mcf
from terra_core.policy import Allocation, PathSource, Remaining
from terra_model import Coflow, Flow
from topologies import Link, Path, Topology, all_pairs_paths, path_links

Route = list[tuple[Path, int]]  # [(path, members of the flow on that path)]


class CoflowRoutes(NamedTuple):
    """A coflow's routes in the order its flows were added (one entry per flow).

    Attributes:
        fids: flow ids.  routes: each flow's Route ([] = no path).
        rows, cols, vals: the links x flows incidence as its nonzero entries
            (maxmin.path_entries): link row, flow index, members of the flow crossing
            the link on one path; int, int and float arrays (nnz,).
        members: float array of each flow's member count (flow_bundles.flow_count).
        routed: bool array, True where the flow has a route.
        shape: int array, each flow's route shape (`_MaddPolicy._shape_of`; -1 unrouted).
        weight: float array, each flow's weight in its shape's backfill entity.
        nnz: int array, each flow's number of entries (they are flow by flow, so flow j's
            are entries sum(nnz[:j]) .. sum(nnz[:j + 1]) - 1).
    """

    fids: list[str]
    routes: list[Route]
    rows: np.ndarray
    cols: np.ndarray
    vals: np.ndarray
    members: np.ndarray
    routed: np.ndarray
    shape: np.ndarray
    weight: np.ndarray
    nnz: np.ndarray


class BaselinePolicy:
    """Common bookkeeping of the baselines: coflows, flows, K paths, routes.

    Args:
        topology: the shared WAN view (mutated by the caller, who then calls wan_changed).
        k: paths per DC pair (>= 1).
        path_source: where the paths come from (policy.PathSource); default the K
            shortest paths over the links that are up (topologies.all_pairs_paths).

    Raises:
        ValueError: k < 1.
    """

    name = "baseline"

    def __init__(
        self, topology: Topology, k: int = 4, path_source: PathSource | None = None
    ) -> None:
        if not isinstance(k, int) or k < 1:
            raise ValueError(f"k must be a positive integer, got {k!r}")
        self.topology = topology
        self.k = k
        self.path_source: PathSource = path_source or all_pairs_paths
        self.flows: dict[str, dict[str, Flow]] = {}
        self.routes: dict[str, dict[str, Route]] = {}
        self._paths = self.path_source(topology, k)
        self._rows = link_index(topology.links)
        every_up = self.path_source(_all_up(topology), 1)
        self._reachable = {pair for pair, ps in every_up.items() if ps}
        self._incidence: dict[str, CoflowRoutes] = {}
        self._cap_vec: np.ndarray | None = None  # see _capacity
        self._path_rows: dict[Path, list[int]] = {}  # rows of a path's links (never stale)
        self._shapes: dict = {}  # route shapes, see _shape_of
        self._shape_ptr, self._shape_rows, self._shape_vals = [0], [], []
        self._shape_cache: tuple | None = None  # see _shape_arrays
        self._version = 0  # bumped whenever a coflow's routes change or a coflow leaves

    # ---- Policy interface ------------------------------------------------------------------

    def add_coflow(self, coflow: Coflow, now: float) -> bool:
        """Register a coflow; baselines accept every coflow (returns True).

        Raises:
            ValueError: duplicate coflow id, duplicate flow ids, or a flow between
                DCs that no path joins even with every link up.
        """
        if coflow.id in self.flows:
            raise ValueError(f"duplicate coflow id {coflow.id!r}")
        self.flows[coflow.id] = {}
        self.routes[coflow.id] = {}
        try:
            self.add_flows(coflow.id, coflow.flows, now)
        except ValueError:
            self.remove_coflow(coflow.id, now)
            raise
        return True

    def add_flows(self, coflow_id: str, flows: list[Flow], now: float) -> None:
        """Add WAN flows to an active coflow and route them.

        Raises:
            KeyError: unknown coflow.  ValueError: duplicate flow id, or no path.
        """
        known = self.flows[coflow_id]
        for f in flows:
            if f.id in known:
                raise ValueError(f"coflow {coflow_id!r}: duplicate flow id {f.id!r}")
            if not f.intra_dc and (f.src, f.dst) not in self._reachable:
                raise ValueError(f"coflow {coflow_id!r} flow {f.id!r}: no path {f.src}->{f.dst}")
        new = {f.id: f for f in flows if not f.intra_dc}
        known.update(new)
        self._set_routes(coflow_id, self._route(coflow_id, list(new.values())))

    def remove_coflow(self, coflow_id: str, now: float) -> None:
        """Forget a coflow (unknown ids are ignored)."""
        self.flows.pop(coflow_id, None)
        self.routes.pop(coflow_id, None)
        self._incidence.pop(coflow_id, None)
        self._version += 1

    def wan_changed(self, now: float) -> bool:
        """Recompute the K paths over the links that are up and re-route; returns True."""
        self._cap_vec = None
        self._paths = self.path_source(self.topology, self.k)
        for cid, flows in self.flows.items():
            self._set_routes(cid, self._route(cid, list(flows.values())))
        return True

    def allocate(self, now: float, remaining: Remaining) -> Allocation:
        """Rates for every flow in `remaining` (see the subclass)."""
        raise NotImplementedError

    # ---- helpers ---------------------------------------------------------------------------

    def _set_routes(self, coflow_id: str, routes: dict[str, Route]) -> None:
        """Store new routes for some flows of a coflow and drop its cached incidence."""
        self.routes[coflow_id].update(routes)
        self._incidence.pop(coflow_id, None)
        self._version += 1

    def _coflow_incidence(self, coflow_id: str) -> CoflowRoutes:
        """The coflow's routes as arrays (see CoflowRoutes), cached until they change."""
        cached = self._incidence.get(coflow_id)
        if cached is None:
            routes, known = self.routes[coflow_id], self.flows[coflow_id]
            fids = list(routes)
            route_list = [routes[fid] for fid in fids]
            shapes = [self._shape_of(route) for route in route_list]
            rows, cols, vals = path_entries(route_list, self._rows, self._path_rows)
            cached = CoflowRoutes(
                fids,
                route_list,
                rows,
                cols,
                vals,
                np.array([flow_count(known[fid]) for fid in fids], dtype=float),
                np.array([bool(r) for r in route_list], dtype=bool),
                np.array([shape for shape, _ in shapes], dtype=np.intp),
                np.array([weight for _, weight in shapes], dtype=float),
                np.bincount(cols, minlength=len(fids)).astype(np.intp),
            )
            self._incidence[coflow_id] = cached
        return cached

    def _shape_of(self, route: Route) -> tuple[int, float]:
        """(number of the route's shape, the flow's weight in it); (-1, 0.0) for no route.
        Flows of one shape are symmetric under max-min per member: a one-path route's
        shape is its path (weight: its members), any other route's shape is the route
        itself (weight 1). Shape s crosses link row shape_rows[k] with shape_vals[k] members
        per unit weight for k in shape_ptr[s] .. shape_ptr[s + 1] - 1 (lists; never stale:
        link rows do not depend on the WAN state)."""
        if not route:
            return -1, 0.0
        if len(route) == 1:
            key, weight = route[0][0], float(route[0][1])
            entities = [[(key, 1)]]
        else:
            key, weight = tuple(route), 1.0
            entities = [route]
        number = self._shapes.get(key)
        if number is None:
            rows, _, vals = path_entries(entities, self._rows, self._path_rows)
            self._shape_rows.extend(rows.tolist())
            self._shape_vals.extend(vals.tolist())
            self._shape_ptr.append(len(self._shape_rows))
            number = self._shapes[key] = len(self._shapes)
        return number, weight

    def _shape_arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, tuple]:
        """The shapes' (ptr, link rows, members per unit weight) lists (`_shape_of`) as
        int, int and float arrays, and their transpose by link row with the backfill's
        memo (maxmin.columns_by_row), made again only when a shape was added."""
        if self._shape_cache is None or len(self._shape_cache[0]) != len(self._shape_ptr):
            ptr = np.array(self._shape_ptr, dtype=np.intp)
            rows = np.array(self._shape_rows, dtype=np.intp)
            vals = np.array(self._shape_vals, dtype=float)
            self._shape_cache = (ptr, rows, vals, columns_by_row(ptr, rows, vals, len(self._rows)))
        return self._shape_cache

    def _route(self, coflow_id: str, flows: list[Flow]) -> dict[str, Route]:
        """Default routing: every member of a flow on its pair's shortest path."""
        routes = {}
        for f in flows:
            paths = self._paths.get((f.src, f.dst), [])
            routes[f.id] = [(paths[0], flow_count(f))] if paths else []
        return routes

    def _capacity(self) -> np.ndarray:
        """Available capacity per link (bytes/s, 0 when down), in self._rows order; read-only,
        cached until the next wan_changed."""
        if self._cap_vec is None:
            self._cap_vec = np.array([self.topology.available(e) for e in self._rows], dtype=float)
            self._cap_vec.flags.writeable = False
        return self._cap_vec


def _all_up(topology: Topology) -> Topology:
    up = topology.copy()
    up.down.clear()
    return up


class PairLevels(NamedTuple):
    """Per-member rates per path of some DC pairs (answer of `_PairPolicy.pair_levels`).

    Attributes:
        paths: the paths with a rate, grouped by pair in the order of the pairs asked.
        pair: int array, for each path the index of its pair in the pairs asked.
        level: float array, for each path the rate of one flow member on it (bytes/s).
    """

    paths: list[Path]
    pair: np.ndarray
    level: np.ndarray


class PairTable(NamedTuple):
    """The paths of a fixed list of DC pairs, numbered (`_FairPolicy.pair_table`): what
    `table_levels` answers refer to, valid until the next WAN change.

    Attributes:
        pairs: the (src DC, dst DC) pairs, the caller's sequence as given.
        paths: every pair's paths (as routed), pair after pair.
        ptr: int array (len(pairs) + 1,): pair i's paths are paths[ptr[i]:ptr[i + 1]]
            (none when no path is up).
        path_ptr, rows: int arrays: path j crosses the links of rows
            rows[path_ptr[j]:path_ptr[j + 1]] (BaselinePolicy._rows order).
    """

    pairs: object
    paths: list[Path]
    ptr: np.ndarray
    path_ptr: np.ndarray
    rows: np.ndarray


class _PairEntries(NamedTuple):
    """A set of DC pairs' paths and their sparse link incidence (`_FairPolicy`).

    Attributes:
        paths: the pairs' paths, pair after pair, in the order of the pairs.
        pair: int array (len(paths),), index of each path's pair in the pairs.
        rows, cols: int arrays (nnz,), one entry per (path, link of it): link row
            (BaselinePolicy._rows order) and index of the path in `paths`.
        entry_pair: int array (nnz,), index of the entry's pair in the pairs.
    """

    paths: list[Path]
    pair: np.ndarray
    rows: np.ndarray
    cols: np.ndarray
    entry_pair: np.ndarray


class _PairPolicy(BaselinePolicy):
    """Baselines under which every member of a flow gets, on each path, a rate that depends
    only on the flow's DC pair and on how many flow members of each pair are active
    (per-flow, multipath, swan-mcf). They implement `pair_levels`; `allocate` expands it
    per flow, and the simulator calls `pair_levels` directly (simulator.py), which spares
    it a dict entry per active flow per event."""

    def pair_levels(
        self, now: float, pairs: tuple[tuple[str, str], ...], members: np.ndarray
    ) -> PairLevels:
        """Per-member rates per path for each DC pair.

        Args:
            now: seconds.
            pairs: the (src DC, dst DC) pairs with active flows, in order of first
                appearance over the active coflows (coflows in admission order, their
                flows in order).
            members: float array, active flow members of each pair (> 0; bundles count
                their members).

        Returns:
            PairLevels; a pair without paths (none up) simply has none (rate 0). Its
            `paths` list is the same object whenever `pairs` and the WAN are the same.
        """
        raise NotImplementedError

    def allocate(self, now: float, remaining: Remaining) -> Allocation:
        """Rates for every flow in `remaining` from `pair_levels`.

        Args:
            now: seconds.
            remaining: {coflow id: {flow id: remaining bytes}}.

        Returns:
            {coflow id: {flow id: [(path, bytes/s)]}}: a flow of n members gets n times
            its pair's per-member rate on each path.
        """
        count: dict[tuple[str, str], float] = {}
        for cid, flows in remaining.items():
            known = self.flows[cid]
            for fid in flows:
                f = known[fid]
                count[(f.src, f.dst)] = count.get((f.src, f.dst), 0.0) + flow_count(f)
        pairs = tuple(count)
        answer = self.pair_levels(now, pairs, np.array([count[p] for p in pairs], dtype=float))
        rates: dict[tuple[str, str], list[tuple[Path, float]]] = {p: [] for p in pairs}
        for path, i, r in zip(
            answer.paths, answer.pair.tolist(), answer.level.tolist(), strict=True
        ):
            rates[pairs[i]].append((path, r))
        out: Allocation = {}
        for cid, flows in remaining.items():
            known = self.flows[cid]
            out[cid] = {}
            for fid in flows:
                f = known[fid]
                n = flow_count(f)
                out[cid][fid] = [(p, n * r) for p, r in rates[(f.src, f.dst)]]
        return out

    def wan_changed(self, now: float) -> bool:
        """Recompute the K paths (dropping cached answers) and re-route; returns True."""
        self._clear_caches()
        return super().wan_changed(now)

    def _clear_caches(self) -> None:
        """Drop what subclasses cached for the current paths and capacities."""


class _FairPolicy(_PairPolicy):
    """Max-min fair per (sub)flow on fixed routes; members on one path are symmetric, so the
    water-filling runs over paths weighted by their member count (maxmin.py). Every flow
    of a DC pair has the same route (`_pair_paths`), so a path's weight is its pair's
    active member count. The links x paths incidence is kept sparse (a path crosses a few
    of many links: 2 of 300 on bigswitch): each pair's paths are numbered once, with the
    link rows of each path, and a set of pairs is water-filled by
    maxmin.maxmin_levels_entries (dense on small WANs, sparse on large ones). The
    simulator numbers its pairs once per WAN state (`pair_table`) and asks by index
    (`table_levels`): no tuple of pairs or list of paths per event."""

    def __init__(
        self, topology: Topology, k: int = 4, path_source: PathSource | None = None
    ) -> None:
        super().__init__(topology, k, path_source)
        self._by_pairs: dict[tuple, _PairEntries] = {}
        self._clear_caches()

    def pair_levels(
        self, now: float, pairs: tuple[tuple[str, str], ...], members: np.ndarray
    ) -> PairLevels:
        """Max-min fair per-member rates on each pair's path(s) (see `_PairPolicy`)."""
        found = self._pair_entries(pairs)
        vals = np.asarray(members, dtype=float)[found.entry_pair]
        levels = maxmin_levels_entries(
            found.rows, found.cols, vals, self._capacity(), len(found.paths)
        )
        return PairLevels(found.paths, found.pair, levels)

    def pair_table(self, pairs) -> PairTable:
        """Number the paths of `pairs` for `table_levels` (index-based `pair_levels`).

        Args:
            pairs: sequence of (src DC, dst DC) pairs, e.g. every pair of a workload;
                held by the table, so it must not change while the table is used.

        Returns:
            The PairTable; the same object for the same `pairs` object until the next
            wan_changed, which makes it stale.
        """
        if self._table is not None and self._table.pairs is pairs:
            return self._table
        ids = self._pair_ids(pairs)
        path_ids = csr_ranges(self._pair_ptr, ids)
        per_pair = self._pair_ptr[ids + 1] - self._pair_ptr[ids]
        hops = self._path_ptr[path_ids + 1] - self._path_ptr[path_ids]
        self._table = PairTable(
            pairs,
            self._path_objects[path_ids].tolist(),
            np.concatenate(([0], np.cumsum(per_pair))).astype(np.intp),
            np.concatenate(([0], np.cumsum(hops))).astype(np.intp),
            self._link_rows[csr_ranges(self._path_ptr, path_ids)],
        )
        return self._table

    def table_levels(
        self, now: float, table: PairTable, active: np.ndarray, members: np.ndarray
    ) -> np.ndarray:
        """Max-min fair per-member rates on the paths of some pairs of `table`: the answer of
        `pair_levels` for those pairs, by index (no pair or path object is touched).

        Args:
            now: seconds.
            table: this policy's current `pair_table`.
            active: int array of distinct indices into table.pairs, the pairs with active
                flows (any order).
            members: float array (len(active),), active flow members of each (> 0).

        Returns:
            float array of per-member rates (bytes/s), one per path of the active pairs, in
            the order csr_ranges(table.ptr, active) numbers them in table.paths.

        Raises:
            ValueError: `table` is not the current one (the WAN changed since), or
                mismatched lengths.
        """
        if table is not self._table:
            raise ValueError("stale pair table: ask pair_table again after a WAN change")
        active = np.asarray(active, dtype=np.intp)
        members = np.asarray(members, dtype=float)
        if members.shape != active.shape:
            raise ValueError(f"{members.shape} member counts for {active.shape} pairs")
        path_ids = csr_ranges(table.ptr, active)
        path_pair = np.repeat(members, table.ptr[active + 1] - table.ptr[active])
        hops = table.path_ptr[path_ids + 1] - table.path_ptr[path_ids]
        cols = np.repeat(np.arange(len(path_ids), dtype=np.intp), hops)
        rows = table.rows[csr_ranges(table.path_ptr, path_ids)]
        return maxmin_levels_entries(rows, cols, path_pair[cols], self._capacity(), len(path_ids))

    def _pair_ids(self, pairs) -> np.ndarray:
        """The numbers of `pairs` (int array), numbering new ones, with the CSR arrays
        (_pair_ptr, _path_ptr, _link_rows, _path_objects) brought up to date."""
        found = list(map(self._pair_number.get, pairs))
        if None in found:
            for i, pr in enumerate(pairs):
                if found[i] is None:
                    found[i] = self._number_pair(pr)
        if self._dirty:
            self._pair_ptr = np.array(self._pair_ptr_list, dtype=np.intp)
            self._path_ptr = np.array(self._path_ptr_list, dtype=np.intp)
            self._link_rows = np.array(self._link_rows_list, dtype=np.intp)
            self._path_objects = np.empty(len(self._all_paths), dtype=object)
            for j, path in enumerate(self._all_paths):  # elementwise: paths are tuples
                self._path_objects[j] = path
            self._dirty = False
        return np.array(found, dtype=np.intp)

    def _pair_entries(self, pairs: tuple[tuple[str, str], ...]) -> _PairEntries:
        """The paths of `pairs` in order and their sparse link incidence (_PairEntries),
        cached per tuple of pairs until the next WAN change."""
        cached = self._by_pairs.get(pairs)
        if cached is None:
            if len(self._by_pairs) >= _PAIR_CACHE_SIZE:
                self._by_pairs.clear()
            ids = self._pair_ids(pairs)
            path_ids = csr_ranges(self._pair_ptr, ids)
            per_pair = self._pair_ptr[ids + 1] - self._pair_ptr[ids]
            pair = np.repeat(np.arange(len(pairs), dtype=np.intp), per_pair)
            entries = csr_ranges(self._path_ptr, path_ids)
            hops = self._path_ptr[path_ids + 1] - self._path_ptr[path_ids]
            cols = np.repeat(np.arange(len(path_ids), dtype=np.intp), hops)
            cached = _PairEntries(
                self._path_objects[path_ids].tolist(),
                pair,
                self._link_rows[entries],
                cols,
                pair[cols],
            )
            self._by_pairs[pairs] = cached
        return cached

    def _number_pair(self, pair: tuple[str, str]) -> int:
        """Number `pair` and its current routes (`_pair_paths`), with their link rows."""
        routes = self._pair_paths(pair)
        for path in routes:
            hit = self._path_rows.get(path)
            if hit is None:
                hit = self._path_rows[path] = [self._rows[link] for link in path_links(path)]
            self._link_rows_list.extend(hit)
            self._path_ptr_list.append(len(self._link_rows_list))
        self._all_paths.extend(routes)
        self._pair_ptr_list.append(len(self._all_paths))
        self._dirty = True
        number = self._pair_number[pair] = len(self._pair_number)
        return number

    def _clear_caches(self) -> None:
        self._by_pairs.clear()
        self._table: PairTable | None = None  # see pair_table
        self._pair_number: dict[tuple[str, str], int] = {}  # pair -> its number (CSR row)
        self._all_paths: list[Path] = []  # the numbered pairs' paths, pair after pair
        self._pair_ptr_list = [0]  # pair i's paths: _all_paths[ptr[i]:ptr[i + 1]]
        self._path_ptr_list = [0]  # path j's links: _link_rows_list[ptr[j]:ptr[j + 1]]
        self._link_rows_list: list[int] = []
        self._dirty = True  # the lists changed since their arrays were made

    def _pair_paths(self, pair: tuple[str, str]) -> list[Path]:
        """The paths every flow of `pair` uses (as `_route` assigns them)."""
        return self._paths.get(pair, [])[:1]


class PerFlowPolicy(_FairPolicy):
    """One fixed shortest path per flow, max-min fair per flow: ideal TCP over IP routing
    (the "per-flow" baseline of docs/design.md section 4.4; Terra paper section 6.1).

    Args:
        topology: the shared WAN view.  k: paths per DC pair (only the first is used).
    """

    name = "per-flow"


class MultipathPolicy(_FairPolicy):
    """Every flow split over all its K paths, one subflow per path, max-min fair per subflow:
    ideal uncoupled MPTCP (the "multipath" baseline of docs/design.md section 4.4).

    Args:
        topology: the shared WAN view.  k: paths per DC pair.
    """

    name = "multipath"

    def _route(self, coflow_id: str, flows: list[Flow]) -> dict[str, Route]:
        return {
            f.id: [(p, flow_count(f)) for p in self._paths.get((f.src, f.dst), [])] for f in flows
        }

    def _pair_paths(self, pair: tuple[str, str]) -> list[Path]:
        return self._paths.get(pair, [])


class SwanMcfPolicy(_PairPolicy):
    """Application-agnostic SWAN: max-min fair multi-commodity flow over DC-pair demands on
    K paths (Hong et al., "Achieving high utilization with software-driven WAN", SIGCOMM
    2013; the "swan-mcf" baseline of docs/design.md section 4.4), via mcf.maxmin_mcf. Demands
    are unbounded (flows are backlogged); a DC pair's rate on each path is shared by its
    flows in proportion to their member counts (flows in one tunnel share it fairly).

    Args:
        topology: the shared WAN view.  k: paths per DC pair.
    """

    name = "swan-mcf"

    def __init__(
        self, topology: Topology, k: int = 4, path_source: PathSource | None = None
    ) -> None:
        super().__init__(topology, k, path_source)
        self._mcf_cache: dict[tuple, tuple[list[Path], np.ndarray, np.ndarray]] = {}
        self._mcf_rates: dict[tuple, dict] = {}  # maxmin_mcf answers by set of pairs
        self._warm = McfWarmStart()  # the last MCF's first basis, to start the next from

    def pair_levels(
        self, now: float, pairs: tuple[tuple[str, str], ...], members: np.ndarray
    ) -> PairLevels:
        """Per-member rates: each pair's max-min MCF rate on a path over its members.

        The MCF depends only on the set of active pairs and the link capacities, so its
        answer is cached under those (events that change neither, such as most flow
        completions, or only the pairs' order, reuse it) and laid out in the pairs' order
        (cached too, under the order). It is solved in its compact form, its first LP
        started from the previous solve's basis (mcf.maxmin_mcf `compact`, `warm`): the
        pairs' total rates are the unique max-min fair ones whatever the order or form;
        only their split over paths may differ, which no flow's rate depends on.
        """
        capacity = tuple(self._capacity().tolist())
        cached = self._mcf_cache.get((pairs, capacity))
        if cached is None:
            if len(self._mcf_cache) >= _MCF_CACHE_SIZE:
                self._mcf_cache.clear()
            rates = self._mcf(pairs, capacity)
            found = [(p, i, r) for i, pair in enumerate(pairs) for p, r in rates[pair]]
            cached = (
                [p for p, _, _ in found],
                np.array([i for _, i, _ in found], dtype=np.intp),
                np.array([r for _, _, r in found], dtype=float),
            )
            self._mcf_cache[(pairs, capacity)] = cached
        paths, pair, total = cached
        return PairLevels(paths, pair, total / members[pair])

    def _mcf(self, pairs: tuple[tuple[str, str], ...], capacity: tuple[float, ...]) -> dict:
        """maxmin_mcf's {pair: [(path, bytes/s), ...]} for the set of `pairs` on the link
        capacities `capacity` (in self._rows order), from the cache when it has the set."""
        key = (frozenset(pairs), capacity)
        rates = self._mcf_rates.get(key)
        if rates is None:
            if len(self._mcf_rates) >= _MCF_CACHE_SIZE:
                self._mcf_rates.clear()
            demands = {pair: (self._paths.get(pair, []), None) for pair in pairs}
            capacities = dict(zip(self._rows, capacity, strict=True))
            rates = maxmin_mcf(demands, capacities, compact=True, warm=self._warm)
            self._mcf_rates[key] = rates
        return rates

    def _clear_caches(self) -> None:
        self._mcf_cache.clear()
        self._mcf_rates.clear()


_MCF_CACHE_SIZE = 256  # cached swan-mcf answers kept before the cache is emptied
_PAIR_CACHE_SIZE = 64  # cached per-pair-set incidences kept before the cache is emptied


class _MaddLayout(NamedTuple):
    """The per-flow arrays of a list of coflows side by side (`_MaddPolicy._layout`).

    Attributes:
        key: (tuple of the coflow ids, `BaselinePolicy._version`) it was built for.
        base, size: int arrays (coflows,): index of each coflow's first flow, its flows.
        members, routed, shape, weight: per flow, coflow after coflow (CoflowRoutes).
        all_routed: every flow has a route.
        hops: the number of entries of every flow when they all have as many, else 0.
        single: every flow is routed on one path with all its members (with `hops`
            entries): each of its entries' values and its weight equal its member count.
        ptr: int array (flows + 1,): flow i's entries are ptr[i] .. ptr[i + 1] - 1.
        rows, vals: int and float arrays (entries,): the entries' link rows and members.
        routes: list (coflows,) of each coflow's Route list (CoflowRoutes.routes).
    """

    key: tuple
    base: np.ndarray
    size: np.ndarray
    members: np.ndarray
    routed: np.ndarray
    all_routed: bool
    hops: int
    single: bool
    shape: np.ndarray
    weight: np.ndarray
    ptr: np.ndarray
    rows: np.ndarray
    vals: np.ndarray
    routes: list


class _MaddPolicy(BaselinePolicy):
    """Coflow-aware scheduling shared by Varys and Rapier: order coflows by their CCT alone
    on the current capacities, give each in turn MADD rates on what is left (every flow at
    remaining / Γ, so the coflow's flows finish together), then backfill the leftover
    max-min fairly over all flows (work conservation). Members of a bundle always get the
    same per-member rate, so the bundle stays exact even when its members use several paths.
    """

    def __init__(
        self, topology: Topology, k: int = 4, path_source: PathSource | None = None
    ) -> None:
        super().__init__(topology, k, path_source)
        self._lay: _MaddLayout | None = None  # see _layout

    def allocate(self, now: float, remaining: Remaining) -> Allocation:
        """Return {coflow id: {flow id: [(path, bytes/s)]}} (see the class docstring).

        Computed by `coflow_rates` on each coflow's remaining bytes in flow order.
        """
        vectors = {}
        for cid, flows in remaining.items():
            fids = self._coflow_incidence(cid).fids
            vectors[cid] = np.array([flows.get(fid, 0.0) for fid in fids], dtype=float)
        out: Allocation = {}
        for cid, (rate, routes) in self.coflow_rates(now, vectors).items():
            fids = self._coflow_incidence(cid).fids
            out[cid] = {
                fid: [(p, members * r) for p, members in route]
                for fid, route, r in zip(fids, routes, rate.tolist(), strict=True)
                if fid in remaining[cid]
            }
        return out

    def coflow_rates(
        self, now: float, remaining: dict[str, np.ndarray]
    ) -> dict[str, tuple[np.ndarray, list[Route]]]:
        """Per-member rates of every flow of every active coflow, as arrays (computed by
        `live_coflow_rates` on the flows with bytes left).

        Args:
            now: seconds.
            remaining: {coflow id: float array of each flow's remaining bytes, in the order
                the coflow's flows were added (0 = finished)}; read, never modified.

        Returns:
            {coflow id: (float array of per-member rates in bytes/s, same order, 0 for
            finished or unrouted flows; the Route of each flow, same order)}. A flow's rate
            on a path is its rate per member times its members on that path. The route
            list is the same object until the coflow's routes change.

        Raises:
            ValueError: an array whose length is not the coflow's number of flows.
            KeyError: an unknown coflow.
        """
        cids = list(remaining)
        rems = [np.asarray(remaining[cid], dtype=float) for cid in cids]
        for cid, rem in zip(cids, rems, strict=True):
            flows = len(self.routes[cid])
            if rem.shape != (flows,):
                raise ValueError(f"coflow {cid!r}: {rem.shape} remaining bytes for {flows} flows")
        live = [np.flatnonzero(rem > 0) for rem in rems]
        rate, routes = self.live_coflow_rates(
            now,
            cids,
            [len(idx) for idx in live],
            np.concatenate(live) if live else np.zeros(0, dtype=np.intp),
            np.concatenate([rem[idx] for rem, idx in zip(rems, live, strict=True)])
            if live
            else np.zeros(0),
        )
        out, at = {}, 0
        for cid, rem, idx, route_list in zip(cids, rems, live, routes, strict=True):
            full = np.zeros(len(rem))
            full[idx] = rate[at : at + len(idx)]
            at += len(idx)
            out[cid] = (full, route_list)
        return out

    def live_coflow_rates(
        self,
        now: float,
        cids: Sequence[str],
        counts: Sequence[int],
        local: np.ndarray,
        remaining: np.ndarray,
    ) -> tuple[np.ndarray, list[list[Route]]]:
        """Per-member rates of the unfinished flows of the active coflows, as one array.

        Varys' SEBF order and MADD (Chowdhury, Zhong, Stoica, SIGCOMM 2014; docs/design.md
        4.4): each coflow's Γ is the max over links of its remaining bytes / capacity (inf
        when one of its unfinished flows has no route or a link it needs has no capacity);
        in the order of (Γ, place in `cids`), each coflow gets remaining / g per member,
        g being its Γ on the capacity the earlier ones left (skipped when g is inf), and
        the leftover is backfilled max-min over all given routed flows (`_backfill`).
        Volumes and Γ of all coflows come from one bincount over (coflow, link); only the
        sequential MADD pass runs per coflow, over the links the coflow uses.

        Args:
            now: seconds.
            cids: ids of active coflows (each once; any that `add_coflow` accepted).
            counts: int sequence (coflows,): how many of each coflow's flows are given.
            local: int array (sum(counts),): the given flows' indices in their coflow's flow
                order (the order they were added), coflow after coflow in `cids` order.
                Ascending within a coflow gives `coflow_rates`' floating-point sums exactly.
            remaining: float array (sum(counts),): the given flows' remaining bytes, each
                > 0. Flows not given count as finished.

        Returns:
            (float array (sum(counts),): per-member rate of each given flow in bytes/s, 0 if
            it has no route; list (coflows,): each coflow's Route list, in its flow order,
            the same object until the coflow's routes change). A flow's rate on a path is
            its per-member rate times its members on that path.

        Raises:
            ValueError: lengths that do not agree, a negative count, an index outside its
                coflow, or remaining bytes not > 0.
            KeyError: an unknown coflow.
        """
        counts = np.asarray(counts, dtype=np.intp)
        local = np.asarray(local, dtype=np.intp)
        remaining = np.asarray(remaining, dtype=float)
        n = len(local)
        if counts.shape != (len(cids),) or remaining.shape != (n,) or int(counts.sum()) != n:
            raise ValueError(
                f"{len(cids)} coflows, {counts.shape} counts summing to {int(counts.sum())}, "
                f"{n} flow indices and {remaining.shape} remaining bytes do not agree"
            )
        if (counts < 0).any():  # (the compiled pass trusts the counts to stay within n)
            raise ValueError("counts must be >= 0")
        if n and not remaining.min() > 0:  # (NaN fails too)
            raise ValueError("remaining bytes must be > 0 (finished flows are left out)")
        hooked = self._hooked()
        if hooked:
            self._run_hooks(hooked, cids, counts, local, remaining)
        if not cids:
            return np.zeros(0), []
        lay = self._layout(cids)
        n_coflows = len(cids)
        capacity = self._capacity()
        if lay.hops and lay.all_routed:
            return self._hop_rates(lay, counts, local, remaining, capacity), lay.routes
        if n:
            some = np.flatnonzero(counts)
            top = np.maximum.reduceat(local, (np.cumsum(counts) - counts)[some])
            if local.min() < 0 or (top >= lay.size[some]).any():
                raise ValueError("a flow index outside its coflow's flows")
        flow = local + np.repeat(lay.base, counts)
        per_member = remaining / lay.members[flow]
        n_links = len(capacity)
        coflow = np.repeat(np.arange(n_coflows), counts)
        entry = csr_ranges(lay.ptr, flow)
        owner = np.repeat(np.arange(n), lay.ptr[flow + 1] - lay.ptr[flow])
        rows = coflow[owner] * n_links + lay.rows[entry]
        weights = lay.vals[entry] * per_member[owner]
        volume = _volumes(rows, weights, n_coflows, n_links)
        gamma = _gammas(volume, capacity)
        routed = lay.routed[flow]
        gamma[np.bincount(coflow, weights=~routed, minlength=n_coflows) > 0] = np.inf
        g, left = _madd_pass(volume, gamma, capacity)
        rate = per_member / g[coflow] * routed
        take = np.flatnonzero(routed)
        shape = lay.shape[flow[take]]
        extra = self._backfill(shape, lay.weight[flow[take]], left)
        rate[take] += extra[shape]
        return rate, lay.routes

    def _hop_rates(
        self,
        lay: _MaddLayout,
        counts: np.ndarray,
        local: np.ndarray,
        remaining: np.ndarray,
        capacity: np.ndarray,
    ) -> np.ndarray:
        """`live_coflow_rates`' per-member rates in the common case (every flow routed,
        with `lay.hops` entries each): the passes over the flows are compiled
        (`_hop_volumes`, `_hop_rates_out`) with the numpy version's float operations in
        its order, so the same rates to the bit; only the MADD pass over coflows and the
        backfill over route shapes run between them.

        Raises:
            ValueError: a flow index outside its coflow's flows.
        """
        n_links = len(capacity)
        shape_of, per_member, volume, total, bad = _hop_volumes(
            counts,
            local,
            remaining,
            lay.base,
            lay.size,
            lay.members,
            lay.rows,
            lay.vals,
            lay.shape,
            lay.weight,
            lay.hops,
            lay.single,
            n_links,
            len(self._shapes),
        )
        if bad:
            raise ValueError("a flow index outside its coflow's flows")
        volume = volume.reshape(len(counts), n_links)
        g, left = _madd_pass(volume, _gammas(volume, capacity), capacity)
        extra = self._shape_levels(total, left)
        return _hop_rates_out(counts, per_member, g, shape_of, extra)

    def _layout(self, cids: Sequence[str]) -> _MaddLayout:
        """The per-flow arrays of the coflows `cids` side by side (`_MaddLayout`), built
        again only when the list of coflows or any coflow's routes changed."""
        key = (tuple(cids), self._version)
        lay = self._lay
        if lay is not None and lay.key == key:
            return lay
        infos = [self._coflow_incidence(cid) for cid in cids]
        size = np.array([len(info.fids) for info in infos], dtype=np.intp)
        nnz = np.concatenate([info.nnz for info in infos])
        routed = np.concatenate([info.routed for info in infos])
        hops = int(nnz[0]) if len(nnz) and (nnz == nnz[0]).all() else 0
        members = np.concatenate([info.members for info in infos])
        weight = np.concatenate([info.weight for info in infos])
        vals = np.concatenate([info.vals for info in infos])
        single = bool(
            hops
            and routed.all()
            and np.array_equal(weight, members)
            and np.array_equal(vals, np.repeat(members, hops))
        )
        lay = self._lay = _MaddLayout(
            key,
            np.cumsum(size) - size,
            size,
            members,
            routed,
            bool(routed.all()),
            hops,
            single,
            np.concatenate([info.shape for info in infos]),
            weight,
            np.concatenate(([0], np.cumsum(nnz))).astype(np.intp),
            np.concatenate([info.rows for info in infos]),
            vals,
            [info.routes for info in infos],
        )
        return lay

    def _hooked(self) -> set[str]:
        """Coflows whose `_before_allocate` must run before the next rates (none here)."""
        return set()

    def _run_hooks(
        self,
        hooked: set[str],
        cids: Sequence[str],
        counts: np.ndarray,
        local: np.ndarray,
        remaining: np.ndarray,
    ) -> None:
        """Run `_before_allocate` for the coflows of `cids` in `hooked`, each given its
        remaining bytes in flow order (0 for the flows not given)."""
        ends = np.cumsum(counts)
        for i, cid in enumerate(cids):
            if cid in hooked:
                full = np.zeros(len(self.routes[cid]))
                seg = slice(int(ends[i] - counts[i]), int(ends[i]))
                full[local[seg]] = remaining[seg]
                self._before_allocate(cid, full)

    def _backfill(self, shape: np.ndarray, weight: np.ndarray, left: np.ndarray) -> np.ndarray:
        """Max-min fair per-member levels on the capacity `left` for the flows of the given
        route shapes (`_shape_of`), water-filled as one entity per shape: flows of one shape
        are symmetric (they cross the same links with proportional members), so they rise
        and freeze together, and the shape's entity, whose entries are its members per unit
        weight times the flows' total weight, reaches the level each of them would reach
        alone (Bertsekas & Gallager section 6.5.2 progressive filling; maxmin.py). With
        member counts (whole numbers) every load sum is exact, so the levels are those of
        one entity per flow.

        Args:
            shape: int array, the shape of each alive routed flow (>= 0).
            weight: float array (same length), each flow's weight in its shape (> 0).
            left: float array (links,), bytes/s left after MADD.

        Returns:
            float array (shapes numbered so far,): the level of each shape (0 for shapes
            with no flow here).
        """
        total = np.bincount(shape, weights=weight, minlength=len(self._shapes))
        return self._shape_levels(total.astype(float, copy=False), left)

    def _shape_levels(self, total: np.ndarray, left: np.ndarray) -> np.ndarray:
        """`_backfill`'s levels from each shape's total weight (float array (shapes
        numbered so far,), 0 for shapes with no flow) on the capacity `left` (float array
        (links,), bytes/s): float array (shapes,) of per-member levels in bytes/s. The
        shapes' entries never change, only their weights: maxmin.maxmin_levels_scaled fills
        on the fixed structure (with member counts, whole numbers, the levels of freshly
        built entries to the bit)."""
        ptr, rows, vals, by_row = self._shape_arrays()
        return maxmin_levels_scaled(ptr, rows, vals, total, left, by_row)

    def _before_allocate(self, coflow_id: str, remaining: np.ndarray) -> None:
        """Hook run for every coflow before its rates are computed (Rapier re-routes here);
        `remaining` is as in `coflow_rates`."""


def _volumes(rows: np.ndarray, weights: np.ndarray, n_coflows: int, n_links: int) -> np.ndarray:
    """Volume per coflow and link (float array (n_coflows, n_links), bytes): the sums of
    `weights` (float array, bytes) by bin coflow x n_links + link row (`rows`, int array of
    the same length), each in the order given."""
    return (
        np.bincount(rows, weights=weights, minlength=n_coflows * n_links)
        .astype(float, copy=False)  # (bincount gives ints when there is no entry)
        .reshape(n_coflows, n_links)
    )


@njit(cache=True, error_model="numpy")
def _gammas(volume, capacity):  # pragma: no cover - compiled
    """`_gamma` of every row of `volume` (float array (coflows, links), bytes) on
    `capacity` (float array (links,), bytes/s): float array (coflows,) in seconds, the
    same values (a max is exact whatever the order); compiled (numba), the values of the
    numpy expressions of old (max of the used links' volume / capacity and 0, NaN if one
    is NaN; inf when a used link has no capacity)."""
    n_coflows, n_links = volume.shape
    gamma = np.zeros(n_coflows)
    for c in range(n_coflows):
        high = 0.0
        blocked = False
        for e in range(n_links):
            v = volume[c, e]
            if v > 0:
                if capacity[e] > 0:
                    r = v / capacity[e]
                    if r > high or np.isnan(r):
                        if not np.isnan(high):
                            high = r
                elif capacity[e] <= 0:
                    blocked = True
        gamma[c] = np.inf if blocked else high
    return gamma


@njit(cache=True, error_model="numpy")
def _madd_pass(volume, gamma, capacity):  # pragma: no cover - compiled
    """The sequential MADD pass of Varys (Chowdhury et al., SIGCOMM 2014): coflows in the
    order of (Γ, row), each with finite Γ and some volume takes volume / g from what the
    earlier ones left, g = max over its links of volume / left, unless g is inf. Only the links a
    coflow uses are touched: on the others volume / g is 0 and left stays (the same floats
    as the whole-vector arithmetic). Compiled (numba): the float operations of the numpy
    version of old (a stable argsort; max with NaN propagating; np.maximum(x, 0.0)).

    Args:
        volume: float array (coflows, links), remaining bytes per coflow and link (>= 0).
        gamma: float array (coflows,), each coflow's Γ on `capacity` (inf: never served).
        capacity: float array (links,), bytes/s.

    Returns:
        (float array (coflows,): each coflow's g in seconds, inf where it got no MADD
        rates; float array (links,): the capacity left, bytes/s).
    """
    n_coflows, n_links = volume.shape
    g = np.full(n_coflows, np.inf)
    left = capacity.copy()
    for c in np.argsort(gamma, kind="mergesort"):
        if gamma[c] == np.inf:
            break  # the rest are inf too
        used = False
        blocked = False
        for e in range(n_links):
            if volume[c, e] != 0:
                used = True
                if left[e] <= 0:
                    blocked = True
        if not used or blocked:
            continue
        gc = -np.inf
        for e in range(n_links):
            if volume[c, e] != 0:
                r = volume[c, e] / left[e]
                if r > gc or np.isnan(r):
                    if not np.isnan(gc):
                        gc = r
        g[c] = gc
        for e in range(n_links):
            if volume[c, e] != 0:
                x = left[e] - volume[c, e] / gc
                left[e] = x if x > 0.0 or np.isnan(x) else 0.0
    return g, left


# ---- compiled passes over the flows of live_coflow_rates' common case (numba) ------------
# Each does the float operations of the numpy expressions it replaced, in their order
# (np.bincount adds its weights one by one in index order), so the same values to the bit.


@njit(cache=True, error_model="numpy")
def _hop_volumes(
    counts,
    local,
    remaining,
    base,
    size,
    members,
    rows,
    vals,
    shape,
    weight,
    hops,
    single,
    n_links,
    n_shapes,
):  # pragma: no cover - compiled
    """The per-flow pass before MADD when every flow has `hops` entries.

    Args:
        counts: int array (coflows,); local, remaining: int and float arrays (flows,), as
            in `live_coflow_rates`; base, size: int arrays (coflows,) of `_MaddLayout`;
            members, shape, weight: per layout flow; rows, vals: (layout flows * hops,)
            link rows and members; single: `_MaddLayout.single` (then the member count
            is used for the equal values and weight, which are not read: the same
            floats, fewer bytes per flow); n_links, n_shapes: ints.

    Returns:
        (shape_of: int array (flows,), each given flow's route shape; per_member: float
        array (flows,), remaining bytes per member; volume: float array (coflows *
        n_links,), bytes per coflow and link row; total: float array (n_shapes,), the
        weight of the given flows per shape; bad: True when an index is outside its
        coflow, the other results then incomplete).
    """
    n = len(local)
    shape_of = np.empty(n, dtype=np.intp)
    per_member = np.empty(n)
    volume = np.zeros(len(counts) * n_links)
    total = np.zeros(n_shapes)
    h0, a0, h1, a1 = -1, 0.0, -1, 0.0  # bins summed in registers (maxmin.add_held)
    i = 0
    for c in range(len(counts)):
        offset = c * n_links
        for _ in range(counts[c]):
            j = local[i]
            if j < 0 or j >= size[c]:
                return shape_of, per_member, volume, total, True
            f = base[c] + j
            s = shape[f]
            shape_of[i] = s
            m = members[f]
            pm = remaining[i] / m
            per_member[i] = pm
            start = f * hops
            if single and hops == 2:  # (bigswitch's routes; the loops below, unrolled)
                # (a coflow's flows to one DC follow each other: each hop's bins are
                # summed in a register, the same floats)
                x = m * pm
                h0, a0, h1, a1 = add_held(volume, offset + rows[start], x, 0, h0, a0, h1, a1)
                h0, a0, h1, a1 = add_held(volume, offset + rows[start + 1], x, 1, h0, a0, h1, a1)
                total[s] += m
            elif single:
                for h in range(start, start + hops):
                    volume[offset + rows[h]] += m * pm
                total[s] += m
            else:
                for h in range(start, start + hops):
                    volume[offset + rows[h]] += vals[h] * pm
                total[s] += weight[f]
            i += 1
    flush_held(volume, h0, a0, h1, a1)
    return shape_of, per_member, volume, total, False


@njit(cache=True, error_model="numpy")
def _hop_rates_out(counts, per_member, g, shape_of, extra):  # pragma: no cover - compiled
    """Per-member rates: MADD's remaining / g of the flow's coflow plus the backfill
    level of its shape (float array (flows,), bytes/s); arguments as `_hop_volumes`'
    results, g: float array (coflows,) in seconds, extra: float array (shapes,). A coflow
    MADD skipped (g inf) adds 0.0, which is what remaining / inf gives for finite
    remaining bytes per member (> 0, checked by the caller), without the division."""
    rate = np.empty(len(per_member))
    i = 0
    for c in range(len(counts)):
        gc = g[c]
        skipped = gc == np.inf
        for _ in range(counts[c]):
            pm = per_member[i]
            madd = 0.0 if skipped and pm < np.inf else pm / gc
            rate[i] = madd + extra[shape_of[i]]
            i += 1
    return rate


class VarysPolicy(_MaddPolicy):
    """Varys (Chowdhury, Zhong, Stoica, "Efficient coflow scheduling with Varys", SIGCOMM
    2014) on a WAN: flows on fixed shortest paths, coflows ordered Smallest Effective
    Bottleneck First (Γ = max over links of the coflow's remaining bytes / capacity), MADD
    rates on the capacity the earlier coflows left, leftover backfilled max-min per flow.
    Varys' deadline admission is not modelled (all coflows are accepted).

    Args:
        topology: the shared WAN view.  k: paths per DC pair (only the first is used).
    """

    name = "varys"


class RapierPolicy(_MaddPolicy):
    """Rapier (Zhao et al., "Rapier: Integrating routing and scheduling for coflow-aware
    data center networks", INFOCOM 2015) on a WAN: when a coflow arrives, each of its flows
    gets one of its K paths, chosen greedily (largest flow first) to minimize the coflow's
    own CCT (max over links of its bytes / capacity); coflows are then ordered by that CCT,
    given MADD per-flow rates, and the leftover is backfilled max-min per flow. No
    FlowGroup aggregation: each flow has exactly one path (a bundle's members may take
    different paths). After a WAN change, coflows with a flow on a broken path (or none)
    are re-routed on their remaining bytes at the next allocation.

    Args:
        topology: the shared WAN view.  k: paths per DC pair.
    """

    name = "rapier"

    def __init__(
        self, topology: Topology, k: int = 4, path_source: PathSource | None = None
    ) -> None:
        self._stale: set[str] = set()
        super().__init__(topology, k, path_source)

    def wan_changed(self, now: float) -> bool:
        """Recompute the K paths; mark coflows whose routes broke for re-routing. Returns True."""
        self._cap_vec = None
        self._paths = self.path_source(self.topology, self.k)
        down = self.topology.down
        for cid, routes in self.routes.items():
            for route in routes.values():
                if not route or any(link in down for p, _ in route for link in path_links(p)):
                    self._stale.add(cid)
                    break
        return True

    def remove_coflow(self, coflow_id: str, now: float) -> None:
        """Forget a coflow (unknown ids are ignored)."""
        super().remove_coflow(coflow_id, now)
        self._stale.discard(coflow_id)

    def _hooked(self) -> set[str]:
        """Coflows to re-route before the next rates (their routes broke)."""
        return self._stale

    def _before_allocate(self, coflow_id: str, remaining: np.ndarray) -> None:
        if coflow_id in self._stale:
            self._stale.discard(coflow_id)
            known = self.flows[coflow_id]
            fids = self._coflow_incidence(coflow_id).fids
            pairs = zip(fids, remaining.tolist(), strict=True)
            alive = [(fid, left) for fid, left in pairs if left > 0]
            sizes = {fid: left / flow_count(known[fid]) for fid, left in alive}
            self._set_routes(coflow_id, self._greedy([known[fid] for fid, _ in alive], sizes))

    def _route(self, coflow_id: str, flows: list[Flow]) -> dict[str, Route]:
        return self._greedy(flows, {f.id: f.bytes / flow_count(f) for f in flows})

    def _greedy(self, flows: list[Flow], member_bytes: dict[str, float]) -> dict[str, Route]:
        """Assign each member of each flow (largest first) the path that least raises the
        coflow's bottleneck max_e volume_e / c_e; ties go to fewer hops, then path order."""
        capacity = {link: self.topology.available(link) for link in self._rows}
        volume: dict[Link, float] = {}
        counts: dict[str, dict[Path, int]] = {f.id: {} for f in flows}
        for f in sorted(flows, key=lambda f: -member_bytes[f.id]):
            size = member_bytes[f.id]
            paths = self._paths.get((f.src, f.dst), [])
            if not paths:
                continue
            links = [path_links(p) for p in paths]
            for _ in range(flow_count(f)):
                best = min(
                    range(len(paths)),
                    key=lambda i: (
                        max((volume.get(e, 0.0) + size) / capacity[e] for e in links[i]),
                        len(links[i]),
                        i,
                    ),
                )
                for e in links[best]:
                    volume[e] = volume.get(e, 0.0) + size
                counts[f.id][paths[best]] = counts[f.id].get(paths[best], 0) + 1
        return {fid: list(c.items()) for fid, c in counts.items()}


BASELINES: dict[str, type[BaselinePolicy]] = {
    "per-flow": PerFlowPolicy,
    "multipath": MultipathPolicy,
    "swan-mcf": SwanMcfPolicy,
    "varys": VarysPolicy,
    "rapier": RapierPolicy,
}
