"""Scheduling rounds of the controller (docs/design.md 4.2 and 4.3).

`ControllerRounds` is the part of `Controller` (terra_controller/controller.py) that runs a
round: holding the policy, the remaining bytes are copied on the controller's loop
(owner_loop.py), `policy.allocate` runs in a worker thread, and the rates are applied on
the loop again; coflow states follow the policy's. `RoundRunner` runs asked-for rounds as
a task of the loop, coalescing bursts, and the timeout checks between them. `flow_rates`
keys the policy's allocation by coflow id.

Units: bytes, bytes/s, seconds on the controller clock.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import trio
import trio.testing

from terra_controller.coflow_registry import CoflowRegistry
from terra_controller.coflow_state import coflow_key, parse_coflow_key
from terra_controller.core_effects import Effect, PushRates, logged, perform
from terra_controller.core_log import rates_digest
from terra_core.policy import Allocation, Policy
from terra_model.states import CoflowStatus
from topologies import Path

LOG = logging.getLogger("terra.controller")

# {coflow id (int): {flow id: [(path, bytes/s), ...]}} after the split among agent pairs.
FlowRates = dict[int, dict[str, list[tuple[Path, float]]]]

STATS_KEPT = 1000  # entries of stats["round_ms"] / stats["allocate_ms"]
SETTLE_MAX_S = 0.02  # longest a round waits for the loop's runnable tasks (`settle`)


class ControllerRounds:
    """The scheduling round of `Controller` (its attributes: owner, policy,
    registry, topology, rates, allocation, stats, metrics, on_rates)."""

    def run_round(self) -> tuple[FlowRates, bool]:
        """Run one scheduling round now (docs/design.md 4.2 via policy.allocate), from a
        thread other than the loop's; see `round_now`."""
        return self.owner.run_async(self.round_now)

    async def round_now(self) -> tuple[FlowRates, bool]:
        """One scheduling round, on the loop: snapshot -> allocate -> apply.

        The round holds the policy throughout (admissions and link events wait); the
        remaining bytes are copied on the loop, `policy.allocate` runs in a worker thread
        while the loop serves status requests, agent reports and REST, and the rates are
        applied on the loop again; a coflow that finished, failed or was cancelled during
        the allocation gets no rates.

        The applied rates go out as the round's effect (core_effects.PushRates: every
        `on_rates` listener gets them, the agent channel sends each agent its changed
        FlowGroup rates), performed once they are applied and the policy is free.

        Returns:
            (FlowRates for every active WAN flow, whether the WAN changed since the last
            round). Coflow states are updated from the policy.
        """
        rates, wan, effects = await self.owner.holding_policy(self._round)
        perform(self, effects)  # (once the policy is free: admissions need not wait)
        return rates, wan

    async def _round(self) -> tuple[FlowRates, bool, list[Effect]]:
        self.round_asked = trio.Event()
        start = time.perf_counter()
        now, remaining, wan = self._round_begin(self.now())
        begin_allocate = time.perf_counter()
        allocation = await self.owner.in_worker(self._allocate, now, remaining)
        allocated = time.perf_counter()
        effects = self._round_end(self.now(), allocation, remaining, wan)
        elapsed_ms = (time.perf_counter() - start) * 1e3
        self.stats["rounds"] += 1
        self.stats["last_round_ms"] = elapsed_ms
        for key, value in (
            ("round_ms", elapsed_ms),
            ("allocate_ms", (allocated - begin_allocate) * 1e3),
        ):
            self.stats[key].append(value)
            del self.stats[key][:-STATS_KEPT]
        self.metrics.round_duration.observe(elapsed_ms / 1e3)
        self.metrics.allocate_duration.observe(allocated - begin_allocate)
        return self.rates, wan, effects

    def _round_begin(self, at: float) -> tuple[float, dict, bool]:
        """The round's snapshot (core event "round", at `at` controller seconds): the
        request is cleared, the coflows that left go from the policy, the remaining bytes
        are copied, and a policy with a `begin_round()` takes what changed outside it
        (tenants.LiveTenantPolicy: the tenant book's changes); its `end_round(remaining)`,
        if any, runs in `_round_end`. Returns (`at`, {coflow key: {flow id: remaining
        bytes}}, whether the WAN changed since the last round)."""
        self.round_wanted = False
        wan, self.wan_dirty = self.wan_dirty, False
        self.event_at = at
        try:
            self._drain_leaving()
            remaining = self.registry.remaining(self._connectivity())
            begin = getattr(self.policy, "begin_round", None)
            if begin is not None:  # (tenants.LiveTenantPolicy: the book's changes)
                begin()
        except BaseException:  # (no round: the WAN change waits for the next one)
            self.wan_dirty = self.wan_dirty or wan
            raise
        finally:
            self.event_at = None
        if self.recorder is not None:
            self.recorder.write(at, "round", [], None)
        return at, remaining, wan

    def _round_end(
        self, at: float, allocation: Allocation, remaining: dict, wan: bool
    ) -> list[Effect]:
        """Apply the policy's `allocation` (core event "round_applied", at `at`): rates and
        coflow states; recorded with the rates' digest. Returns its effects: the rates to
        push (PushRates, with `wan`), for the caller to perform."""
        states = self._policy_states(remaining)
        end = getattr(self.policy, "end_round", None)
        if end is not None:  # (tenants.LiveTenantPolicy: the round noted in the book)
            end(remaining)
        _trim_policy_stats(self.policy)
        self.allocation = allocation
        self.rates = flow_rates(allocation, self.registry)
        self._update_states(states)
        effects: list[Effect] = [PushRates(self.rates, wan)]
        if self.recorder is not None:
            digest = rates_digest(allocation)
            self.recorder.write(at, "round_applied", [], digest, logged(effects))
        return effects

    def replay_round_begin(self, at: float) -> tuple:
        """Replay (core_log.replay): a recorded "round" at `at`: the snapshot, and the
        policy's allocation solved at once. Returns what `replay_round_end` applies."""
        now, remaining, wan = self._round_begin(at)
        return self._allocate(now, remaining), remaining, wan

    def replay_round_end(self, at: float, pending: tuple) -> tuple[str, list]:
        """Replay: a recorded "round_applied" at `at`; returns the rates' digest and the
        effects as logged (none is performed)."""
        allocation, remaining, wan = pending
        effects = self._round_end(at, allocation, remaining, wan)
        return rates_digest(allocation), logged(effects)

    def _allocate(self, now: float, remaining: dict) -> Allocation:
        """policy.allocate in the round's worker thread (the round holds the policy)."""
        if not remaining:
            return {}
        with observe_solves_lazily(self.metrics.lp_solve.observe):
            return self.policy.allocate(now, remaining)

    def _drain_leaving(self) -> None:
        """Remove the coflows that left the schedule from the policy (on the loop, holding
        the policy)."""
        if self._leaving:
            now = self.now()
            leaving, self._leaving = self._leaving, []
            for cid in leaving:
                self.policy.remove_coflow(coflow_key(cid), now)

    def _policy_states(self, remaining: dict) -> dict[str, object]:
        """{str(coflow id): the policy's state for it} for the coflows of this round
        (on the loop, holding the policy); empty when the policy does not report states."""
        state_of = getattr(self.policy, "state", None)
        if state_of is None:
            return {}
        out = {}
        for key in remaining:
            try:
                out[key] = state_of(key)
            except (KeyError, ValueError):
                pass
        return out

    def _connectivity(self):
        """None when every link is up; else a predicate (src DC, dst DC) -> reachable.

        A flow whose DCs a failure cut apart waits (rate 0) until a link comes
        back, instead of failing the whole round.
        """
        if not self.topology.down:
            return None
        neighbours: dict[str, list[str]] = {}
        for u, v in self.topology.up_links():
            neighbours.setdefault(u, []).append(v)
        reach: dict[str, set[str]] = {}

        def connected(src: str, dst: str) -> bool:
            if src not in reach:
                seen, todo = {src}, [src]
                while todo:
                    for nxt in neighbours.get(todo.pop(), []):
                        if nxt not in seen:
                            seen.add(nxt)
                            todo.append(nxt)
                reach[src] = seen
            return dst in reach[src]

        return connected

    def _update_states(self, states: dict[str, object]) -> None:
        """Set every active coflow's state (on the loop): the policy's (`states`) when it
        is an active one, else running / preempted by whether it has rates."""
        for coflow in self.registry.active():
            state = states.get(coflow_key(coflow.id))
            if state not in _ACTIVE_STATES:
                rates = self.rates.get(coflow.id, {})
                running = any(r > 0 for paths in rates.values() for _, r in paths)
                state = CoflowStatus.RUNNING if running else CoflowStatus.PREEMPTED
            coflow.state = CoflowStatus(state)


def flow_rates(allocation: Allocation, registry: CoflowRegistry) -> FlowRates:
    """Key the policy's allocation by integer coflow id, dropping unknown coflows.

    The policy already splits every FlowGroup's per-path rates among its flows in
    proportion to the remaining bytes the controller passed it
    (`policy.split_by_remaining`, docs/design.md 4.1), so each flow's share is its
    (sender agent, receiver agent) pair's share and all of them finish together;
    the agent channel sums the shares per sending agent.

    Args:
        allocation: {str(coflow id): {flow id: [(path, bytes/s)]}}.

    Returns:
        {coflow id: {flow id: [(path, bytes/s)]}}.
    """
    out: FlowRates = {}
    for key, flows in allocation.items():
        cid = parse_coflow_key(key)
        coflow = registry.coflows.get(cid)
        if coflow is not None and not coflow.state.final:
            out[cid] = flows
    return out


def observe_solves_lazily(observe: Callable[[float], None]):
    """terra_core.lp.observe_solves(observe), imported on first use: the LP solver (HiGHS,
    numpy) loads with the policy, after the controller listens (deferred.py)."""
    from terra_core.lp import observe_solves

    return observe_solves(observe)


def _trim_policy_stats(policy: Policy) -> None:
    """Keep the last STATS_KEPT entries of the policy's per-round lists (a long-running
    controller; the simulator keeps them all for its figures)."""
    stats = getattr(policy, "stats", None)
    if isinstance(stats, dict):
        for value in stats.values():
            if isinstance(value, list) and len(value) > STATS_KEPT:
                del value[:-STATS_KEPT]


_ACTIVE_STATES = frozenset({CoflowStatus.QUEUED, CoflowStatus.RUNNING, CoflowStatus.PREEMPTED})


async def settle(max_s: float = SETTLE_MAX_S) -> None:
    """Let the loop's runnable tasks run first, for at most `max_s` seconds: requests
    already received (a job's pipelined submits, agents' reports) are admitted before the
    round that follows, so a burst costs one round, not one round each (the round holds the
    policy, so each admission would otherwise wait for a round of its own). A round for a
    WAN change does not wait (RoundRunner)."""
    with trio.move_on_after(max_s):
        await trio.testing.wait_all_tasks_blocked()


class RoundRunner:
    """Runs asked-for scheduling rounds at once, one at a time, as a task of the controller's
    loop.

    Requests that arrive while a round runs are coalesced into the next round. Every
    `tick_s` seconds it also runs `controller.check_timeouts()` (agents gone, deadlines
    missed, finished coflows past their keep time) in a worker thread, between rounds.

    Args:
        controller: the Controller whose rounds it runs.
        tick_s: seconds between timeout checks (> 0).
    """

    def __init__(self, controller: ControllerRounds, tick_s: float = 1.0) -> None:
        self.controller = controller
        self.tick_s = tick_s
        self.stopped = False

    def start(self) -> RoundRunner:
        """Start the task on the controller's loop; returns self."""
        self.controller.owner.start_task(self._loop)
        return self

    def stop(self) -> None:
        """Stop after the current round."""
        self.stopped = True
        self.controller.owner.call_soon(self._wake)

    def _wake(self) -> None:
        self.controller.round_asked.set()

    async def _loop(self) -> None:
        ctl = self.controller
        next_tick = time.monotonic() + self.tick_s
        while not self.stopped:
            with trio.move_on_after(max(0.0, next_tick - time.monotonic())):
                await ctl.round_asked.wait()
            if self.stopped:
                return
            if time.monotonic() >= next_tick:
                next_tick = time.monotonic() + self.tick_s
                try:
                    await ctl.owner.in_worker(ctl.check_timeouts)
                except Exception:
                    LOG.exception("timeout check failed")
            if not ctl.round_wanted:
                continue
            if not ctl.wan_dirty:  # (a WAN change's round starts at once)
                await settle()
            try:
                await ctl.round_now()
            except Exception:
                LOG.exception("scheduling round failed")
                await trio.sleep(0.1)
