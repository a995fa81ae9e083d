"""Coflow-aware scheduling shared by Varys and Rapier: smallest CCT first, MADD rates,
max-min backfill (docs/design.md section 4.4; Chowdhury, Zhong, Stoica, SIGCOMM 2014).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

from terra_core.array_types import BoolArray, FloatArray, IntArray
from terra_core.baseline_policy import BaselinePolicy, Route
from terra_core.madd_kernels import (
    coflow_gammas,
    flow_rates,
    flow_volumes,
    madd_pass,
)
from terra_core.maxmin import maxmin_levels_scaled
from terra_core.policy import Allocation, PathSource, Remaining
from topologies import Topology


def checked_live(
    cids: Sequence[str],
    counts: Sequence[int] | np.ndarray,
    local: np.ndarray,
    remaining: np.ndarray,
) -> tuple[IntArray, IntArray, FloatArray]:
    """The arguments of `MaddPolicy.live_coflow_rates` as (counts, local, remaining) int,
    int and float arrays, checked.

    Raises:
        ValueError: lengths that do not agree, a negative count, or remaining bytes not
            finite and > 0.
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
    if n and not (remaining.min() > 0 and remaining.max() < np.inf):  # (NaN fails too)
        raise ValueError("remaining bytes must be finite and > 0 (finished flows are left out)")
    return counts, local, remaining


def flow_positions(lay: MaddLayout, counts: IntArray, local: IntArray) -> IntArray:
    """Each given flow's index in the layout `lay` (int array), from its coflow's `counts`
    and its index `local` in the coflow (as `MaddPolicy.live_coflow_rates` takes them).

    Raises:
        ValueError: a flow index outside its coflow's flows.
    """
    if len(local):
        some = np.flatnonzero(counts)
        top = np.maximum.reduceat(local, (np.cumsum(counts) - counts)[some])
        if local.min() < 0 or (top >= lay.size[some]).any():
            raise ValueError("a flow index outside its coflow's flows")
    return local + np.repeat(lay.base, counts)


class MaddLayout(NamedTuple):
    """The per-flow arrays of a list of coflows side by side (`MaddPolicy._layout`).

    Attributes:
        key: (tuple of the coflow ids, `BaselinePolicy._version`) it was built for.
        base, size: int arrays (coflows,): index of each coflow's first flow, its flows.
        members, routed, shape, weight: per flow, coflow after coflow (CoflowRoutes).
        hops: the number of entries of every flow when they all have as many, else 0.
        single: every flow is routed on one path with all its members (with `hops`
            entries): each of its entries' values and its weight equal its member count.
        ptr: int array (flows + 1,): flow i's entries are ptr[i] .. ptr[i + 1] - 1.
        rows, vals: int and float arrays (entries,): the entries' link rows and members.
        routes: list (coflows,) of each coflow's Route list (CoflowRoutes.routes).
    """

    key: tuple[tuple[str, ...], int]
    base: IntArray
    size: IntArray
    members: FloatArray
    routed: BoolArray
    hops: int
    single: bool
    shape: IntArray
    weight: FloatArray
    ptr: IntArray
    rows: IntArray
    vals: FloatArray
    routes: list[list[Route]]


class MaddPolicy(BaselinePolicy):
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
        self._lay: MaddLayout | None = None  # see _layout

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
        counts: Sequence[int] | np.ndarray,
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
        Volumes and Γ of all coflows come from one compiled pass over the flows' route
        entries (per coflow and link); only the sequential MADD pass runs per coflow, over
        the links the coflow uses.

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
                coflow, or remaining bytes not finite and > 0.
            KeyError: an unknown coflow.
        """
        counts, local, remaining = checked_live(cids, counts, local, remaining)
        hooked = self._hooked()
        if hooked:
            self._run_hooks(hooked, cids, counts, local, remaining)
        if not cids:
            return np.zeros(0), []
        lay = self._layout(cids)
        return self._flow_rates(lay, counts, local, remaining, self._capacity()), lay.routes

    def _flow_rates(
        self,
        lay: MaddLayout,
        counts: np.ndarray,
        local: np.ndarray,
        remaining: np.ndarray,
        capacity: np.ndarray,
    ) -> np.ndarray:
        """`live_coflow_rates`' per-member rates: the passes over the flows are compiled
        (`flow_volumes`, `flow_rates`) with the float operations of the numpy expressions
        they replaced, in their order, so the same rates to the bit; only the MADD pass
        over coflows and the backfill over route shapes run between them. A coflow with a
        given flow not routed has Γ inf (MADD skips it).

        Raises:
            ValueError: a flow index outside its coflow's flows.
        """
        n_links = len(capacity)
        shape_of, per_member, volume, total, unrouted, bad = flow_volumes(
            counts,
            local,
            remaining,
            lay.base,
            lay.size,
            lay.members,
            lay.ptr,
            lay.rows,
            lay.vals,
            lay.shape,
            lay.weight,
            lay.routed,
            lay.hops,
            lay.single,
            n_links,
            len(self._shapes),
        )
        if bad:
            raise ValueError("a flow index outside its coflow's flows")
        volume = volume.reshape(len(counts), n_links)
        gamma = coflow_gammas(volume, capacity)
        gamma[unrouted] = np.inf
        g, left = madd_pass(volume, gamma, capacity)
        extra = self._shape_levels(total, left)
        return flow_rates(counts, per_member, g, shape_of, extra)

    def _layout(self, cids: Sequence[str]) -> MaddLayout:
        """The per-flow arrays of the coflows `cids` side by side (`MaddLayout`), built
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
        lay = self._lay = MaddLayout(
            key,
            np.cumsum(size) - size,
            size,
            members,
            routed,
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
