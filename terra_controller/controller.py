"""The controller's core glue: WAN view, scheduling policy and coflow registry.

`Controller` owns the `Topology`, the policy (normally `TerraPolicy`) and the
`CoflowRegistry`. The API server, the agent channel, the REST server and the
OpenFlow app call its methods from their own threads; one lock serialises them.
Every event of DESIGN.md section 4.3 (coflow arrival, updateCoflow, FlowGroup
finish, coflow finish, link down/up, capacity change beyond δ) asks for a
scheduling round; `RoundRunner` runs asked-for rounds at once, coalescing
bursts, and hands the new per-flow rates to whoever listens (the agent channel).

Units: bytes, bytes/s, seconds on the controller clock (monotonic, from start).
"""

from __future__ import annotations

import gc
import logging
import threading
import time
from collections.abc import Callable

from terra_controller.coflow_registry import (
    CoflowRegistry,
    CoflowState,
    FlowState,
    RegistryError,
    check_deadline,
    to_policy_flow,
)
from terra_controller.policy import Allocation, Policy
from topologies import Path, Topology, TopologyError

LOG = logging.getLogger("terra.controller")

# {coflow id (int): {flow id: [(path, bytes/s), ...]}} after the split among agent pairs.
FlowRates = dict[int, dict[str, list[tuple[Path, float]]]]


class Controller:
    """Coflow API semantics, progress bookkeeping and scheduling rounds.

    Args:
        topology: the WAN view (mutated on link events).
        policy: a Policy over the same `topology` object.
        clock: returns seconds (monotonic); defaults to time.monotonic.

    Attributes:
        registry: the CoflowRegistry. rates: FlowRates of the last round.
        stats: {"rounds": int, "round_ms": [wall ms of the last 1000 rounds: allocate,
            split among agent pairs, states], "allocate_ms": [the policy.allocate part],
            "last_round_ms": float, "rejected": int}.
        wan_event_at: time.monotonic() of the WAN event the next round answers (or None).
        on_rates: callbacks called with (FlowRates, changed_wan: bool) after each round,
            outside the lock.
        on_flows: callbacks called with (coflow, new flows) on submit and update, inside
            the lock (they must only queue work).
    """

    def __init__(
        self, topology: Topology, policy: Policy, clock: Callable[[], float] | None = None
    ):
        self.topology = topology
        self.policy = policy
        self.registry = CoflowRegistry(topology.dcs)
        self.clock = clock or time.monotonic
        self.t0 = self.clock()
        self.lock = threading.RLock()
        self.rates: FlowRates = {}
        self.allocation: Allocation = {}
        self.stats = {
            "rounds": 0,
            "round_ms": [],
            "allocate_ms": [],
            "last_round_ms": 0.0,
            "rejected": 0,
        }
        self.wan_event_at: float | None = None
        self.on_rates: list[Callable[[FlowRates, bool], None]] = []
        self.on_flows: list[Callable[[CoflowState, list[FlowState]], None]] = []
        self.round_wanted = threading.Event()
        self.wan_dirty = False
        self.started_wall = time.time()

    def now(self) -> float:
        """Seconds since the controller started."""
        return self.clock() - self.t0

    def want_round(self, wan: bool = False) -> None:
        """Ask for a scheduling round (run by RoundRunner, or by `run_round` directly)."""
        if wan:
            if not self.wan_dirty:
                self.wan_event_at = time.monotonic()
            self.wan_dirty = True
        self.round_wanted.set()

    # ---- coflow API ---------------------------------------------------------------------

    def submit(self, flows: object, deadline: object = None, coflow_id: object = None) -> int:
        """submitCoflow: validate, admit and store a coflow; ask for a round.

        Args:
            flows: [{"id", "src", "dst", "bytes", "src_path"?, "dst_path"?}] with agent ids.
            deadline: seconds from now (> 0) or None.
            coflow_id: requested id (a client resubmitting after a controller restart).

        Returns:
            the coflow id (>= 0), or -1 when the deadline cannot be met (DESIGN.md 4.3).

        Raises:
            RegistryError: invalid request; nothing changed.
        """
        with self.lock:
            reg = self.registry
            parsed = reg.parse_flows(flows)
            deadline_s = check_deadline(deadline)
            if coflow_id is not None:
                if isinstance(coflow_id, bool) or not isinstance(coflow_id, int) or coflow_id < 0:
                    raise RegistryError("bad_request", f"bad coflow id {coflow_id!r}")
                if coflow_id in reg.coflows:
                    return self._resubmitted(reg.coflows[coflow_id], parsed)
            cid = reg.next_id if coflow_id is None else coflow_id
            now = self.now()
            probe = CoflowState(cid, now, deadline_s, {f.id: f for f in parsed})
            if not probe.wan_done:  # it has WAN flows: the policy decides
                try:
                    admitted = self.policy.add_coflow(probe.to_policy_coflow(), now)
                except ValueError as exc:
                    raise RegistryError("no_path", f"coflow cannot be routed: {exc}") from exc
                if not admitted:  # burn the id: the policy may remember the rejected coflow
                    if coflow_id is None:
                        reg.next_id += 1
                    self.stats["rejected"] += 1
                    return -1
            coflow = reg.submit(parsed, deadline_s, now, cid)
            if reg.finish_if_done(coflow, now):
                return cid
            self._announce(coflow, parsed)
            self.want_round()
            return cid

    def _announce(self, coflow: CoflowState, flows: list[FlowState]) -> None:
        for listener in list(self.on_flows):
            try:
                listener(coflow, flows)
            except Exception:
                LOG.exception("flow listener failed")

    def _resubmitted(self, coflow: CoflowState, parsed: list[FlowState]) -> int:
        same = sorted((f.id, f.src_agent, f.dst_agent, f.bytes) for f in parsed) == sorted(
            (f.id, f.src_agent, f.dst_agent, f.bytes) for f in coflow.flows.values()
        )
        if not same:
            raise RegistryError("bad_request", f"coflow id {coflow.id} is in use")
        return coflow.id

    def update(self, coflow_id: object, flows: object) -> None:
        """updateCoflow: add flows to an unfinished coflow; ask for a round.

        Raises:
            RegistryError: unknown coflow, finished coflow, invalid flows; nothing changed.
        """
        with self.lock:
            coflow = self.registry.get(coflow_id)
            if coflow.state in ("done", "rejected"):
                raise RegistryError("coflow_done", f"coflow {coflow.id} already finished")
            parsed = self.registry.parse_flows(flows, existing=coflow.flows)
            wan = [to_policy_flow(f) for f in parsed if not f.intra_dc]
            if wan:
                try:
                    if coflow.wan_done:  # its WAN part was empty so far: enter the policy now
                        self.policy.add_coflow(coflow.to_policy_coflow(parsed), self.now())
                    else:
                        self.policy.add_flows(str(coflow.id), wan, self.now())
                except (KeyError, ValueError) as exc:
                    raise RegistryError("no_path", f"flows cannot be routed: {exc}") from exc
            self.registry.add_flows(coflow, parsed)
            self._announce(coflow, parsed)
            self.want_round()

    def status(self, coflow_id: object) -> dict:
        """checkStatus: the coflow's status map plus its flows' current rates (bytes/s).

        Raises:
            RegistryError("unknown_coflow").
        """
        with self.lock:
            coflow = self.registry.get(coflow_id)
            out = coflow.status()
            rates = self.rates.get(coflow.id, {})
            for f in out["flows"]:
                f["rate"] = sum(r for _, r in rates.get(f["id"], []))
            return out

    # ---- WAN events ---------------------------------------------------------------------

    def set_link_state(self, a: object, b: object, up: object) -> bool:
        """Set the undirected link a-b up or down (both directions).

        Returns:
            True when the state changed (a round is then asked for).

        Raises:
            RegistryError("bad_request"): unknown link or bad arguments.
        """
        if not isinstance(up, bool):
            raise RegistryError("bad_request", "up must be true or false")
        with self.lock:
            try:
                was_up = (a, b) not in self.topology.down
                if was_up == up and ((b, a) not in self.topology.down) == up:
                    self.topology.available((a, b))  # still raises for an unknown link
                    return False
                self.topology.set_link_state(a, b, up)
            except (TopologyError, TypeError) as exc:
                raise RegistryError("bad_request", str(exc)) from exc
            if self.policy.wan_changed(self.now()):
                self.want_round(wan=True)
            LOG.info("link %s-%s %s", a, b, "up" if up else "down")
            return True

    def set_capacity(self, a: object, b: object, bytes_per_s: object) -> bool:
        """Set the capacity of the undirected link a-b (bytes/s).

        Returns:
            True when the policy judged the change large enough (δ) for a new round.

        Raises:
            RegistryError("bad_request"): unknown link or bad capacity.
        """
        with self.lock:
            try:
                self.topology.set_capacity(a, b, bytes_per_s)
            except (TopologyError, TypeError) as exc:
                raise RegistryError("bad_request", str(exc)) from exc
            changed = self.policy.wan_changed(self.now())
            if changed:
                self.want_round(wan=True)
            return changed

    # ---- agent reports ------------------------------------------------------------------

    def progress(self, coflow_id: object, flow_id: object, acked: object) -> None:
        """A receiver acknowledged `acked` bytes of a flow (feeds remaining volumes).

        Raises:
            RegistryError: unknown coflow/flow or bad offset.
        """
        with self.lock:
            self.registry.record_progress(coflow_id, flow_id, acked)

    def complete(self, coflow_id: object, flow_id: object, digest: object) -> bool:
        """A flow finished (all bytes in order, digest matched at the receiver).

        Asks for a round when this finishes a FlowGroup or the coflow (DESIGN.md 4.3).

        Returns:
            True when the coflow is now done.

        Raises:
            RegistryError: unknown coflow/flow.
        """
        with self.lock:
            flow = self.registry.flow(coflow_id, flow_id)
            if flow.done:
                return self.registry.get(coflow_id).state == "done"
            coflow = self.registry.record_complete(coflow_id, flow_id, digest, self.now())
            if coflow.state == "done":
                self.policy.remove_coflow(str(coflow.id), self.now())
                self.rates.pop(coflow.id, None)
                self.want_round()
                LOG.info("coflow %s done, CCT %.3f s", coflow.id, coflow.cct_s)
                return True
            group = [
                f
                for f in coflow.flows.values()
                if (f.src_dc, f.dst_dc) == (flow.src_dc, flow.dst_dc)
            ]
            if all(f.done for f in group):
                self.want_round()
            return False

    # ---- scheduling ---------------------------------------------------------------------

    def run_round(self) -> tuple[FlowRates, bool]:
        """Run one scheduling round now (DESIGN.md 4.2 via policy.allocate).

        The cyclic garbage collector is paused during the round: a round allocates
        many short-lived objects and, with the registry's flows alive, collections
        cost about as much as the round itself (measured: 290 -> 140 ms on 56 FB
        coflows / 34k flows on SWAN). Reference counting still frees everything.

        Returns:
            (FlowRates for every active WAN flow, whether the WAN changed since the last
            round). Coflow states are updated from the policy.
        """
        with self.lock:
            self.round_wanted.clear()
            wan, self.wan_dirty = self.wan_dirty, False
            collecting = gc.isenabled()
            gc.disable()
            try:
                start = time.perf_counter()
                remaining = self.registry.remaining(self._connectivity())
                begin_allocate = time.perf_counter()
                allocation = self.policy.allocate(self.now(), remaining) if remaining else {}
                allocated = time.perf_counter()
                self.allocation = allocation
                self.rates = flow_rates(allocation, self.registry)
                self._update_states()
                elapsed_ms = (time.perf_counter() - start) * 1e3
            finally:
                if collecting:
                    gc.enable()
            self.stats["rounds"] += 1
            self.stats["last_round_ms"] = elapsed_ms
            for key, value in (
                ("round_ms", elapsed_ms),
                ("allocate_ms", (allocated - begin_allocate) * 1e3),
            ):
                self.stats[key].append(value)
                del self.stats[key][:-1000]
            return self.rates, wan

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

    def _update_states(self) -> None:
        state_of = getattr(self.policy, "state", None)
        for coflow in self.registry.active():
            state = None
            if state_of is not None:
                try:
                    state = state_of(str(coflow.id))
                except (KeyError, ValueError):
                    state = None
            if state not in ("queued", "running", "preempted"):
                rates = self.rates.get(coflow.id, {})
                running = any(r > 0 for paths in rates.values() for _, r in paths)
                state = "running" if running else "preempted"
            coflow.state = state

    def round_and_push(self) -> FlowRates:
        """Run a round and call every `on_rates` listener with the result (outside the lock)."""
        rates, wan = self.run_round()
        for listener in list(self.on_rates):
            try:
                listener(rates, wan)
            except Exception:  # a listener's failure must not stop the scheduler
                LOG.exception("rate listener failed")
        return rates

    # ---- views --------------------------------------------------------------------------

    def link_rates(self) -> dict[tuple[str, str], float]:
        """Allocated bytes/s per directed link in the current allocation."""
        with self.lock:
            load: dict[tuple[str, str], float] = {}
            for flows in self.rates.values():
                for paths in flows.values():
                    for path, rate in paths:
                        for link in zip(path[:-1], path[1:], strict=False):
                            load[link] = load.get(link, 0.0) + rate
            return load

    def flowgroup_rates(self, coflow_id: int) -> list[dict]:
        """The coflow's FlowGroups with their per-path rates.

        Returns:
            [{"src_dc", "dst_dc", "remaining", "paths": [{"path": [dc...], "rate": bytes/s}]}].
        """
        with self.lock:
            coflow = self.registry.get(coflow_id)
            groups: dict[tuple[str, str], dict] = {}
            rates = self.rates.get(coflow.id, {})
            for f in coflow.flows.values():
                if f.intra_dc:
                    continue
                g = groups.setdefault(
                    (f.src_dc, f.dst_dc),
                    {"src_dc": f.src_dc, "dst_dc": f.dst_dc, "remaining": 0, "paths": {}},
                )
                g["remaining"] += f.remaining
                for path, rate in rates.get(f.id, []):
                    g["paths"][path] = g["paths"].get(path, 0.0) + rate
            for g in groups.values():
                g["paths"] = [{"path": list(p), "rate": r} for p, r in g["paths"].items()]
            return list(groups.values())


def flow_rates(allocation: Allocation, registry: CoflowRegistry) -> FlowRates:
    """Key the policy's allocation by integer coflow id, dropping unknown coflows.

    The policy already splits every FlowGroup's per-path rates among its flows in
    proportion to the remaining bytes the controller passed it
    (`policy.split_by_remaining`, DESIGN.md 4.1), so each flow's share is its
    (sender agent, receiver agent) pair's share and all of them finish together;
    the agent channel sums the shares per sending agent.

    Args:
        allocation: {str(coflow id): {flow id: [(path, bytes/s)]}}.

    Returns:
        {coflow id: {flow id: [(path, bytes/s)]}}.
    """
    out: FlowRates = {}
    for key, flows in allocation.items():
        cid = int(key)
        if cid in registry.coflows:
            out[cid] = flows
    return out


class RoundRunner:
    """Runs asked-for scheduling rounds at once, one at a time, in its own thread.

    Requests that arrive while a round runs are coalesced into the next round.

    Args:
        controller: the Controller whose `round_wanted` event it watches.
    """

    def __init__(self, controller: Controller) -> None:
        self.controller = controller
        self.stopped = False
        self.thread = threading.Thread(target=self._loop, name="terra-rounds", daemon=True)

    def start(self) -> RoundRunner:
        """Start the thread; returns self."""
        self.thread.start()
        return self

    def stop(self) -> None:
        """Stop after the current round."""
        self.stopped = True
        self.controller.round_wanted.set()

    def _loop(self) -> None:
        while not self.stopped:
            self.controller.round_wanted.wait()
            if self.stopped:
                return
            try:
                self.controller.round_and_push()
            except Exception:
                LOG.exception("scheduling round failed")
                time.sleep(0.1)
