"""What the five baselines of docs/design.md section 4.4 share: coflows, flows, K paths, routes.

Each baseline is a Policy class (policy.py) in its own module:

| class            | routing                                  | rates                              |
|------------------|------------------------------------------|------------------------------------|
| PerFlowPolicy    | one shortest path per flow               | max-min fair per flow (ideal TCP)  |
| MultipathPolicy  | every flow over all its K paths          | max-min fair per subflow (MPTCP)   |
| SwanMcfPolicy    | K paths per DC pair                      | max-min MCF over DC-pair demands   |
| VarysPolicy      | one shortest path per flow               | SEBF order, MADD, max-min backfill |
| RapierPolicy     | per flow one of K paths, min coflow CCT  | order by that CCT, MADD, backfill  |

(modules per_flow.py, multipath.py, swan_mcf.py, varys.py, rapier.py; per-flow, multipath
and swan-mcf answer per DC pair (pair_policy.py), per-flow and multipath share
fixed_route_fair.py, varys and rapier share madd.py and its compiled passes madd_kernels.py).

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

from typing import NamedTuple

import numpy as np

from terra_core.array_types import FloatArray, IntArray
from terra_core.flow_bundles import flow_count
from terra_core.maxmin import ColumnsByRow, columns_by_row
from terra_core.policy import Allocation, PathSource, Remaining
from terra_core.sparse_index import link_index, path_entries
from terra_model import Coflow, Flow
from topologies import Path, Topology, all_pairs_paths

Route = list[tuple[Path, int]]  # [(path, members of the flow on that path)]
ShapeKey = Path | tuple[tuple[Path, int], ...]  # a one-path route's path, else the route

# the route shapes' (ptr, link rows, members per unit weight) arrays and their transpose
ShapeArrays = tuple[IntArray, IntArray, FloatArray, ColumnsByRow]


class CoflowRoutes(NamedTuple):
    """A coflow's routes in the order its flows were added (one entry per flow).

    Attributes:
        fids: flow ids.  routes: each flow's Route ([] = no path).
        rows, cols, vals: the links x flows incidence as its nonzero entries
            (sparse_index.path_entries): link row, flow index, members of the flow crossing
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
        self._shapes: dict[ShapeKey, int] = {}  # route shapes, see _shape_of
        self._shape_ptr: list[int] = [0]
        self._shape_rows: list[int] = []
        self._shape_vals: list[float] = []
        self._shape_cache: ShapeArrays | None = None  # see _shape_arrays
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
        key: ShapeKey
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

    def _shape_arrays(self) -> ShapeArrays:
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
