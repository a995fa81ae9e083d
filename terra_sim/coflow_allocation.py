"""Rates per coflow (Varys' and Rapier's `live_coflow_rates` fast path,
terra_core/policy.py): the live flows as one array of remaining bytes, per-member rates
back as one array and the routes as one list per coflow, kept as sparse link entries.
"""

from __future__ import annotations

import numpy as np

from terra_core.policy import Policy
from terra_sim.allocation import Allocator
from terra_sim.errors import SimulationError
from terra_sim.flow_table import FlowTable, LinkTable
from terra_sim.kernels import advance_live, store_rates


class RoutePool:
    """The route lists kept so far as sparse incidence entries: for the flow at position p,
    entry_count[p] entries from entry_start[p] in `rows` (link row, int32: fewer bytes
    read per event) and `vals` (members crossing), one per (path, link of the path);
    routed_members[p] = its members routed. Entries are appended (a run's pool grows with
    its route lists, about one entry per flow and hop).

    Attributes:
        some_unrouted: some route list kept leaves a flow unrouted.
        hops: entries of every flow kept so far if all equal, else 0 (None: none yet).
        single: every route kept so far is one path with all the flow's members.
    """

    def __init__(self, n_flows: int) -> None:
        self.entry_start = np.zeros(n_flows, dtype=np.intp)
        self.entry_count = np.zeros(n_flows, dtype=np.intp)
        self.routed_members = np.zeros(n_flows)
        self.rows = np.zeros(0, dtype=np.int32)
        self.vals = np.zeros(0)
        self.used = 0
        self.some_unrouted = False
        self.hops: int | None = None
        self.single = True

    def keep(self, a: int, rows: list, vals: list, count: np.ndarray, members: np.ndarray):
        """Append the entries `rows`, `vals` of the flows at positions a .. a + len(count) - 1
        (count: int array of each flow's entries; members: float array of its routed
        members)."""
        used = self.used
        if used + len(rows) > len(self.rows):
            size = max(2 * len(self.rows), used + len(rows))
            zeros = np.zeros(size - used, np.int32)
            self.rows = np.concatenate((self.rows[:used], zeros))
            self.vals = np.concatenate((self.vals[:used], np.zeros(size - used)))
        self.rows[used : used + len(rows)] = rows
        self.vals[used : used + len(rows)] = vals
        self.used = used + len(rows)
        b = a + len(count)
        self.entry_start[a:b] = used + np.cumsum(count) - count
        self.entry_count[a:b] = count
        self.routed_members[a:b] = members
        self.some_unrouted = self.some_unrouted or bool((members == 0).any())
        if self.hops is None:
            self.hops = int(count[0]) if len(count) else None
        if self.hops and (count != self.hops).any():
            self.hops = 0  # from now on, every flow by its own entry count


class CoflowAllocator(Allocator):
    """Rates through ``live_coflow_rates`` (terra_core/madd.py `MaddPolicy`): the live
    flows (coflows in admission order, each one's flows in workload order) with each
    flow's index in its coflow; the route lists turned into pool entries once per list
    (`_store_routes`). The live flows' index in their coflow, remaining bytes and rate
    are kept in live order (`live_local`, `live_rem`, `live_rate`, brought up to date in
    place by kernels.advance_live, so no gather or scatter per event); flows.rem[p] is
    only brought up to date when the flow finishes or by `sync_rem`, and flows.rate is not
    used. Checks: finite rates >= 0, none for unrouted flows, paths joining the flow's DCs
    over known links, link loads within capacity."""

    zeroes_live = False

    def __init__(self, policy: Policy, flows: FlowTable, links: LinkTable) -> None:
        super().__init__(policy, flows, links)
        self.live_local = np.zeros(0, dtype=np.intp)
        self.live_rem = np.zeros(0)
        self.live_rate = np.zeros(0)
        self._routes: dict[str, list] = {}  # the route list kept per coflow
        self._pool = RoutePool(len(flows.size))

    def admitted(self, pos: np.ndarray) -> None:
        """See Allocator.admitted."""
        self.live_local = np.concatenate((self.live_local, self.flows.local[pos]))
        self.live_rem = np.concatenate((self.live_rem, self.flows.rem[pos]))

    def coflow_done(self, cid: str) -> None:
        """See Allocator.coflow_done."""
        self._routes.pop(cid, None)

    def sync_rem(self) -> None:
        """See Allocator.sync_rem."""
        self.flows.rem[self.flows.live] = self.live_rem

    def advance(self, step: float, limit: float, finish_bytes: float) -> tuple:
        """See Allocator.advance (kernels.advance_live on the arrays in live order)."""
        f = self.flows
        moved, done, n_kept = advance_live(
            f.live, self.live_local, self.live_rem, self.live_rate, f.rem, step, limit,
            finish_bytes,
        )  # fmt: skip
        kept = f.live[:n_kept]
        self.live_local, self.live_rem = self.live_local[:n_kept], self.live_rem[:n_kept]
        return moved, done, kept

    def allocate(self, now: float, active: dict) -> float:
        """See Allocator.allocate; the seconds to the first finish go to next_finish."""
        live = self.flows.live  # ascending positions: coflow after coflow, in admission order
        cids = list(active)
        counts = [len(a.pos) for a in active.values()]
        rate, routes = self.timed(
            self.policy.live_coflow_rates, now, cids, counts, self.live_local, self.live_rem
        )
        rate = np.asarray(rate, dtype=float)
        if rate.shape != live.shape:
            raise SimulationError(f"{rate.shape} rates for {len(live)} flows")
        if len(routes) != len(cids):
            raise SimulationError(f"{len(routes)} route lists for {len(cids)} coflows")
        for cid, route_list in zip(cids, routes, strict=True):
            if self._routes.get(cid) is not route_list:
                self._store_routes(cid, route_list)
        self.live_rate = np.empty(len(live))
        pool = self._pool
        bad, load, self.next_finish = store_rates(
            live, rate, pool.routed_members, self.live_rate, pool.entry_start,
            pool.entry_count, pool.rows, pool.vals, pool.hops or 0, pool.single,
            len(self.links.row), pool.some_unrouted, self.live_rem,
        )  # fmt: skip
        if bad >= 0:
            self._rate_fault(live, rate, bad)
        self.links.check_loads(load, now)
        return float(load.sum())

    def _rate_fault(self, live: np.ndarray, rate: np.ndarray, k: int) -> None:
        """Raise SimulationError for the live flow at index k, whose per-member rate is
        not finite and >= 0 or is positive with no member routed."""
        cid = self.flows.owner[int(live[k])]
        if not (rate[k] >= 0 and rate[k] < float("inf")):
            raise SimulationError(f"coflow {cid!r}: rate {float(rate[k])!r}")
        raise SimulationError(f"coflow {cid!r}: rate for an unrouted flow")

    def _store_routes(self, cid: str, routes: list) -> None:
        """Check a coflow's route list (one Route per flow, in workload order: every path
        joins the flow's DCs over known links) and keep it in the pool (RoutePool.keep),
        noting whether every route is one path with all its members (`single`)."""
        f = self.flows
        a = f.start[cid]
        b = a + f.n_flows[cid]
        if len(routes) != b - a:
            raise SimulationError(f"coflow {cid!r}: {len(routes)} routes for {b - a} flows")
        rows: list[int] = []
        vals: list[float] = []
        count = np.zeros(b - a, dtype=np.intp)
        members = np.zeros(b - a)
        for j, route in enumerate(routes):
            pos = a + j
            for path, n in route:
                if path[0] != f.src[pos] or path[-1] != f.dst[pos]:
                    raise SimulationError(
                        f"coflow {cid!r} flow {f.owner_ids[pos]!r}: path {path} does not "
                        f"join {f.src[pos]} and {f.dst[pos]}"
                    )
                hit = self.links.rows_of(path)
                rows.extend(hit)
                vals.extend([n] * len(hit))
                count[j] += len(hit)
                members[j] += n
        self._pool.keep(a, rows, vals, count, members)
        self._pool.single = self._pool.single and all(len(route) == 1 for route in routes)
        self._routes[cid] = routes
