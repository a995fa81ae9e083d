"""The simulator's event loop (docs/design.md 4.4; the conventions are in simulator.py's
docstring): admit arrivals, apply WAN changes, ask the policy for rates (through the
Allocator that fits it), move every live flow on to the next event, finish flows and
coflows, and account for bytes, byte-hops and capacity.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from terra_core.flow_bundles import bundle_wan_flows, unbundled_wan_flows
from terra_core.policy import (
    CoflowRatesPolicy,
    GroupRatesPolicy,
    PairLevelsPolicy,
    PairTablePolicy,
    Policy,
)
from terra_model import Coflow
from terra_sim.allocation import Allocator, DictAllocator
from terra_sim.coflow_allocation import CoflowAllocator
from terra_sim.errors import SimulationError
from terra_sim.events import Events, WanChange
from terra_sim.flow_table import FlowTable, LinkTable
from terra_sim.group_allocation import GroupAllocator
from terra_sim.pair_allocation import PairAllocator, TableAllocator
from terra_sim.results import CoflowResult, SimResult

FINISH_REL = 1e-9  # a flow whose finish time is within this fraction of the step finishes
FINISH_BYTES = 1e-6  # ... or whose remaining bytes after the step are below this
CONSERVE_REL = 1e-6  # tolerated relative error in bytes conservation


def make_allocator(policy: Policy, flows: FlowTable, links: LinkTable) -> Allocator:
    """The Allocator for `policy`'s fastest path (terra_core/policy.py): pair_table, then
    pair_levels, live_coflow_rates, group_rates, else Policy.allocate."""
    if isinstance(policy, PairTablePolicy):
        return TableAllocator(policy, flows, links)
    if isinstance(policy, PairLevelsPolicy):
        return PairAllocator(policy, flows, links)
    if isinstance(policy, CoflowRatesPolicy):
        return CoflowAllocator(policy, flows, links)
    if isinstance(policy, GroupRatesPolicy):
        return GroupAllocator(policy, flows, links)
    return DictAllocator(policy, flows, links)


@dataclass
class _Active:
    """One running coflow: positions (int array, ascending) of its unfinished flows."""

    pos: np.ndarray


@dataclass
class Tally:
    """A run's running totals: WAN bytes admitted and delivered, bytes x hops carried, and
    available capacity x time (bytes) while some admitted WAN coflow is unfinished."""

    bytes_total: float = 0.0
    delivered: float = 0.0
    byte_hops: float = 0.0
    capacity_time: float = 0.0


GRID_SLACK = 1e-6  # a time within this fraction of a quantum past a grid point is on it


def on_grid(now: float, step: float, quantum: float) -> float:
    """`step` (seconds from `now`) lengthened so that the next event falls on the first
    multiple of `quantum` at or after now + step, and after `now` (a time within
    GRID_SLACK quanta past a multiple counts as on it). CoflowSim's time steps: rates
    hold for whole quanta and a flow that finishes within one leaves at its end."""
    k = math.ceil((now + max(step, 0.0)) / quantum - GRID_SLACK)
    if k * quantum <= now:
        k = math.floor(now / quantum + GRID_SLACK) + 1
    return k * quantum - now


class Engine:
    """One simulation run (arguments as simulator.simulate's).

    Raises:
        ValueError: duplicate coflow ids.
    """

    def __init__(
        self,
        policy: Policy,
        coflows: Sequence[Coflow],
        changes: Sequence[WanChange],
        gammas: dict[str, float],
        bundle: bool,
        progress: object | None,
        quantum_s: float | None = None,
    ) -> None:
        self.policy = policy
        self.quantum_s = quantum_s
        self.topology = policy.topology
        self.progress = progress
        ids = [c.id for c in coflows]
        if len(set(ids)) != len(ids):
            raise ValueError("duplicate coflow ids in the workload")
        self.order = ids
        self.events = Events(coflows, changes)
        self.results = {
            c.id: CoflowResult(
                c.id, c.arrival_s, deadline_s=c.deadline_s, gamma_empty_s=gammas.get(c.id)
            )
            for c in coflows
        }
        make = bundle_wan_flows if bundle else unbundled_wan_flows
        self.wan = {c.id: make(c) for c in coflows}
        self.flows = FlowTable(self.events.arrivals, self.wan)
        self.links = LinkTable(self.topology, policy.name)
        self.rates = make_allocator(policy, self.flows, self.links)
        self.active: dict[str, _Active] = {}
        self.tally = Tally()

    def run(self) -> SimResult:
        """Simulate until every coflow finished or nothing can move; return the SimResult.

        Raises:
            SimulationError: an infeasible allocation, or lost bytes.
        """
        wall = time.perf_counter()
        now = self.events.first_time()
        while True:
            self._apply_changes(now)
            for coflow in self.events.due_arrivals(now):
                self._admit(coflow, now)
            if not self.active and not self.events.arrivals_left():
                break
            if self.rates.zeroes_live:
                self.flows.rate[self.flows.live] = 0.0  # the other flows' rates are 0 already
            byte_hop_rate = self.rates.allocate(now, self.active) if self.active else 0.0
            step = self._step(now)
            if step is None:
                break
            now = self._advance(now, step, byte_hop_rate)
        self._check_conservation()
        return self._result(now, time.perf_counter() - wall)

    def _apply_changes(self, now: float) -> None:
        if self.events.apply_changes(now, self.topology):
            self.links.refresh()
            self.rates.wan_changed()
            self.policy.wan_changed(now)

    def _admit(self, coflow: Coflow, now: float) -> None:
        result = self.results[coflow.id]
        wan = self.wan[coflow.id]
        if not wan.flows:
            result.wan = False
            result.finish_s, result.cct_s = coflow.arrival_s, 0.0
            result.met_deadline = None if coflow.deadline_s is None else True
            self._tick()
            return
        if not self.policy.add_coflow(wan, now):
            result.admitted = False
            result.met_deadline = None if coflow.deadline_s is None else False
            self._tick()
            return
        f = self.flows
        first = f.start[coflow.id]
        pos = np.arange(first, first + len(wan.flows), dtype=np.intp)
        self.active[coflow.id] = _Active(pos)
        self.tally.bytes_total += float(f.size[pos].sum())
        f.alive[pos] = True
        f.live = np.concatenate((f.live, pos))  # arrivals take ever larger positions
        self.rates.admitted(pos)

    def _step(self, now: float) -> float | None:
        """Seconds to the next event, or None when nothing will ever happen again."""
        step = self.rates.take_next_finish()
        self.events.wake = self._wakeup(now)
        step = self.events.bound_step(step, now)
        if step == float("inf"):
            return None
        if self.quantum_s is not None:
            return on_grid(now, step, self.quantum_s)
        return max(step, 0.0)

    def _wakeup(self, now: float) -> float | None:
        """The policy's next_wakeup(now) (seconds, > now) when it has one and a WAN flow
        is active (e.g. TerraPolicy's aged guard: a coflow starts starving), else None."""
        ask = getattr(self.policy, "next_wakeup", None)
        if ask is None or not self.active:
            return None
        wake = ask(now)
        return wake if wake is not None and wake > now else None

    def _advance(self, now: float, step: float, byte_hop_rate: float) -> float:
        """Move every flow `step` seconds on at its rate, finish those that reach 0 bytes
        (see simulator.py's docstring), and return the time of the next event."""
        limit = step * (1 + FINISH_REL)
        moved, done, kept = self.rates.advance(step, limit, FINISH_BYTES)
        self.tally.delivered += float(moved.sum())  # numpy's pairwise sum, as before
        self.tally.byte_hops += byte_hop_rate * step
        if self.active:
            self.tally.capacity_time += self.links.capacity_sum * step
        now = self.events.land(now + step)  # exactly on arrival / change / wakeup times
        self._finish_flows(done, kept, now)
        return now

    def _finish_flows(self, positions: np.ndarray, kept: np.ndarray, now: float) -> None:
        """Retire the flows at `positions` (their bytes all delivered; `kept` = the live
        flows without them, ascending): not alive, rate 0; coflows left without flows
        finish at `now`."""
        if not len(positions):
            return
        f = self.flows
        f.alive[positions] = False
        f.rate[positions] = 0.0
        f.live = kept
        self.rates.finished(positions)
        if f.zero_sized:
            self.rates.sync_rem()
        owners = [f.owner[p] for p in positions.tolist()]
        at = 0
        for cid in dict.fromkeys(owners):  # (positions ascending: a coflow's are together)
            active = self.active[cid]
            ends = at + owners.count(cid)  # (few finish per event)
            if f.zero_sized:  # a flow of no bytes leaves with the next one that finishes
                active.pos = active.pos[f.rem[active.pos] > 0]
            else:  # the flows with no bytes left are exactly those that finished now
                gone = np.searchsorted(active.pos, positions[at:ends])
                active.pos = np.delete(active.pos, gone)
            at = ends
            if not len(active.pos):
                self._finish_coflow(cid, now)

    def _finish_coflow(self, cid: str, now: float) -> None:
        del self.active[cid]
        self.rates.coflow_done(cid)
        result = self.results[cid]
        result.finish_s = now
        result.cct_s = now - result.arrival_s
        if result.deadline_s is not None:
            result.met_deadline = result.cct_s <= result.deadline_s * (1 + FINISH_REL)
        self.policy.remove_coflow(cid, now)
        self._tick()

    def _tick(self) -> None:
        if self.progress is not None:
            self.progress.update(1)

    def _check_conservation(self) -> None:
        self.rates.sync_rem()
        remaining = sum(float(self.flows.rem[a.pos].sum()) for a in self.active.values())
        # rem of active flows plus everything delivered must equal what was admitted
        t = self.tally
        error = abs(t.delivered + remaining - t.bytes_total)
        if error > CONSERVE_REL * max(t.bytes_total, 1.0):
            raise SimulationError(
                f"bytes not conserved: delivered {t.delivered:.6g} + remaining "
                f"{remaining:.6g} != admitted {t.bytes_total:.6g}"
            )

    def _result(self, now: float, wall: float) -> SimResult:
        stats = getattr(self.policy, "stats", None)
        rounds, round_ms, lps = len(self.rates.round_ms), self.rates.round_ms, None
        if isinstance(stats, dict) and "rounds" in stats:
            rounds = int(stats["rounds"])
            round_ms = list(stats.get("round_ms", round_ms))
            if stats.get("lps") is not None and rounds:
                lps = stats["lps"] / rounds
        t = self.tally
        util = t.byte_hops / t.capacity_time if t.capacity_time > 0 else None
        return SimResult(
            scheduler=self.policy.name,
            coflows=[self.results[cid] for cid in self.order],
            wan_utilization=util,
            rounds=rounds,
            round_ms=round_ms,
            lps_per_round=lps,
            bytes_total=t.bytes_total,
            bytes_delivered=t.delivered,
            end_s=now,
            wall_s=wall,
            byte_hops=t.byte_hops,
        )
