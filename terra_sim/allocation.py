"""How the engine asks a policy for rates (docs/design.md 4.4): the Allocator interface,
and its general form through Policy.allocate (one dict entry per active flow per event).

The policies' fast paths (terra_core/policy.py) have their own Allocators
(pair_allocation.py, coflow_allocation.py, group_allocation.py): the same rates as
`allocate` would give, with the same checks, as arrays.
"""

from __future__ import annotations

import time

import numpy as np

from terra_core.policy import Allocation, Policy, Remaining
from terra_sim.errors import SimulationError
from terra_sim.flow_table import CAPACITY_REL, FlowTable, LinkTable
from terra_sim.kernels import advance_flows, next_finish
from topologies import path_links


class Allocator:
    """Asks a policy for the rates of the live flows, checks them and stores them in
    `flows.rate` (bytes/s by position).

    Args:
        policy: the policy.  flows: the run's FlowTable.  links: the run's LinkTable.

    Attributes:
        zeroes_live: the engine sets the live flows' rates to 0 before each allocation
            (the policy may leave flows out); False when `allocate` sets every one.
        round_ms: wall milliseconds of each call to the policy.
        next_finish: seconds to the first finish under the rates just set, when the
            allocation computed it (else None: `take_next_finish` computes it).
    """

    zeroes_live = True

    def __init__(self, policy: Policy, flows: FlowTable, links: LinkTable) -> None:
        self.policy = policy
        self.flows = flows
        self.links = links
        self.round_ms: list[float] = []
        self.next_finish: float | None = None

    def allocate(self, now: float, active: dict) -> float:
        """Set the rates of the live flows of the `active` coflows ({coflow id: object with
        `pos`, the int array of its unfinished flows' positions}) at `now` (seconds).

        Returns:
            The WAN byte-hop rate (bytes x hops per second) of the allocation.

        Raises:
            SimulationError: an infeasible or malformed allocation.
        """
        raise NotImplementedError

    def admitted(self, pos: np.ndarray) -> None:
        """The flows at `pos` (int array, ascending, after every live one) became live."""

    def finished(self, positions: np.ndarray) -> None:
        """The flows at `positions` (int array) finished and left the live set."""

    def coflow_done(self, cid: str) -> None:
        """Coflow `cid` finished."""

    def wan_changed(self) -> None:
        """The WAN changed (what depended on its paths is stale)."""

    def sync_rem(self) -> None:
        """Bring flows.rem of the live flows up to date (when kept elsewhere)."""

    def take_next_finish(self) -> float:
        """Seconds to the first live flow's finish at the current rates (inf when none
        moves); clears `next_finish`."""
        step = self.next_finish
        if step is None:
            step = next_finish(self.flows.live, self.flows.rem, self.flows.rate)
        self.next_finish = None
        return step

    def advance(self, step: float, limit: float, finish_bytes: float) -> tuple:
        """Move the live flows `step` seconds on (kernels.advance_flows' finish rule with
        `limit` seconds and `finish_bytes`); returns (bytes moved per moving flow,
        positions finished, live positions kept), arrays."""
        f = self.flows
        return advance_flows(f.live, f.rem, f.rate, step, limit, finish_bytes)

    def timed(self, ask, *args):
        """`ask(*args)`, its wall time appended to round_ms."""
        t0 = time.perf_counter()
        answer = ask(*args)
        self.round_ms.append((time.perf_counter() - t0) * 1000.0)
        return answer


class DictAllocator(Allocator):
    """Rates through Policy.allocate: {coflow id: {flow id: remaining bytes}} in,
    {coflow id: {flow id: [(path, bytes/s)]}} out. Checks: unknown or finished flows,
    negative or infinite rates, paths that do not join the flow's DCs, unknown links,
    link loads above capacity."""

    def __init__(self, policy: Policy, flows: FlowTable, links: LinkTable) -> None:
        super().__init__(policy, flows, links)
        self._path_links: dict[tuple[str, ...], list[tuple[str, str]]] = {}

    def allocate(self, now: float, active: dict) -> float:
        """See Allocator.allocate."""
        alloc = self.timed(self.policy.allocate, now, self._remaining(active))
        path_rate = self._take_rates(alloc, active)
        self._check_links(path_rate, now)
        return sum(r * (len(p) - 1) for p, r in path_rate.items())

    def _remaining(self, active: dict) -> Remaining:
        rem, ids = self.flows.rem, self.flows.owner_ids
        return {
            cid: {ids[p]: r for p, r in zip(a.pos.tolist(), rem[a.pos].tolist(), strict=True)}
            for cid, a in active.items()
        }

    def _take_rates(self, alloc: Allocation, active: dict) -> dict[tuple[str, ...], float]:
        """Store each flow's total rate in flows.rate; return {path: bytes/s} summed."""
        path_rate: dict[tuple[str, ...], float] = {}
        positions: list[int] = []
        totals: list[float] = []
        for cid, flows in alloc.items():
            mine = active.get(cid)
            if mine is None:
                if flows:
                    raise SimulationError(f"allocation names coflow {cid!r}, which is not active")
                continue
            pos_of = {self.flows.owner_ids[p]: p for p in mine.pos.tolist()}
            for fid, path_rates in flows.items():
                pos = pos_of.get(fid)
                if pos is None:
                    if any(r for _, r in path_rates):
                        raise SimulationError(
                            f"coflow {cid!r}: rate for unknown or done flow {fid!r}"
                        )
                    continue
                positions.append(pos)
                totals.append(self._flow_total(cid, fid, pos, path_rates, path_rate))
        self.flows.rate[positions] = totals
        return path_rate

    def _flow_total(self, cid: str, fid: str, pos: int, path_rates, path_rate: dict) -> float:
        """One flow's total rate (bytes/s), its path rates added to `path_rate`, checked."""
        src, dst = self.flows.src, self.flows.dst
        total = 0.0
        for path, r in path_rates:
            if r > 0:
                if path[0] != src[pos] or path[-1] != dst[pos]:
                    raise SimulationError(
                        f"coflow {cid!r} flow {fid!r}: path {path} does not join "
                        f"{src[pos]} and {dst[pos]}"
                    )
                path_rate[path] = path_rate.get(path, 0.0) + r
                total += r
            elif r != 0:
                raise SimulationError(f"coflow {cid!r} flow {fid!r}: rate {r!r}")
        if not total < float("inf"):
            raise SimulationError(f"coflow {cid!r} flow {fid!r}: rate {total!r}")
        return total

    def _check_links(self, path_rate: dict[tuple[str, ...], float], now: float) -> None:
        load: dict[tuple[str, str], float] = {}
        cache = self._path_links
        for path, r in path_rate.items():
            links = cache.get(path)
            if links is None:
                links = cache[path] = path_links(path)
            for link in links:
                load[link] = load.get(link, 0.0) + r
        topology = self.links.topology
        for link, used in load.items():
            if link not in topology.capacity:
                raise SimulationError(f"t={now:.6f}s: allocation uses unknown link {link}")
            avail = topology.available(link)
            if used > avail * (1 + CAPACITY_REL):
                raise SimulationError(
                    f"t={now:.6f}s: link {link[0]}-{link[1]} loaded {used:.6g} B/s, "
                    f"available {avail:.6g} B/s (policy {self.links.policy_name})"
                )
