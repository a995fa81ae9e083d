"""The controller's core glue: WAN view, scheduling policy and coflow registry.

`Controller` owns the `Topology`, the policy (normally `TerraPolicy`) and the
`CoflowRegistry`. The API server, the agent channel, the REST server and the
OpenFlow app call its methods from their own threads. Two locks (docs/runtime.md):
`lock` guards the registry, the rates and the stats and is only ever held
briefly; `policy_lock` guards the policy and is held for a round's
`policy.allocate`. A round takes a snapshot of the remaining bytes under `lock`,
allocates under `policy_lock` alone, then applies the rates under `lock` again,
so status requests, agent reports and REST never wait for a round; only what
needs the policy (admission of a submit or update, link events) does. Coflows
that leave the schedule (done, failed, cancelled) are removed from the policy at
the start of the next round (or of the next admission), not by the thread that
finished them.
Every event of docs/design.md section 4.3 (coflow arrival, updateCoflow, FlowGroup
finish, coflow finish, link down/up, capacity change beyond δ) asks for a
scheduling round; `RoundRunner` runs asked-for rounds at once, coalescing
bursts, and hands the new per-flow rates to whoever listens (the agent channel).

A coflow that cannot finish leaves the schedule at once: a flow its agents cannot
run (`fail_flow`: source or sink error, digest mismatch after `max_restarts`
re-transfers), an endpoint agent disconnected longer than `agent_timeout_s`, or
a deadline passed unfinished (both found by `check_timeouts`, which RoundRunner
runs every `tick_s`) make it failed; `cancel` makes it cancelled. Either way the
policy forgets it, its rates are dropped, a round is asked for (its capacity goes
to the others in that round) and the `on_drop` listeners (the agent channel:
"drop" to both endpoints) learn which flows to forget.

Units: bytes, bytes/s, seconds on the controller clock (monotonic, from start).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from terra_controller.coflow_registry import CoflowRegistry
from terra_controller.coflow_state import (
    CoflowState,
    FlowState,
    RegistryError,
    assign_keys,
    coflow_key,
    flow_key,
    new_secret,
    parse_coflow_key,
    to_policy_flow,
)
from terra_controller.events import EventLog
from terra_controller.file_requests import FileInfo, FileRequests
from terra_controller.journal import CoflowJournal
from terra_controller.metrics import ControllerMetrics
from terra_controller.operator_links import OPERATOR, LinkStates, restore_before_first_round
from terra_controller.request_checks import (
    check_age,
    check_coflow_id,
    check_deadline,
    check_labels,
    named_agents,
)
from terra_controller.resume import (
    ended_summary,
    failed_summary,
    flow_rows,
    journal_status,
    missing_agents,
    resume_request,
)
from terra_controller.tenants import tenant_admission
from terra_core.policy import Allocation, Policy
from terra_model import Coflow
from terra_model.states import MAX_CLIENT_ID, CoflowStatus, FlowStatus
from terra_security.tokens import new_key
from topologies import Path, Topology, TopologyError

LOG = logging.getLogger("terra.controller")

# {coflow id (int): {flow id: [(path, bytes/s), ...]}} after the split among agent pairs.
FlowRates = dict[int, dict[str, list[tuple[Path, float]]]]

AGENT_TIMEOUT_S = 60.0  # an endpoint agent disconnected this long fails its unfinished coflows
KEEP_FINISHED = 10_000  # finished coflows kept for status requests (the oldest are dropped)
AGENT_RETURN_S = 5.0  # after a start or a takeover, a submit waits this long for its agents
MAX_RESTARTS = 3  # re-transfers of a flow from byte 0 after digest mismatches before it fails
STATS_KEPT = 1000  # entries of stats["round_ms"] / stats["allocate_ms"]


@dataclass(frozen=True)
class Snapshot:
    """A consistent copy of the controller's state for REST, metrics and listings
    (`Controller.snapshot`); nothing in it changes afterwards.

    Attributes:
        topology: topology name. dcs: DC names in order.
        links: ((src DC, dst DC, capacity bytes/s, "up"|"down", allocated bytes/s), ...)
            per directed link.
        agents: ((agent id, DC, data address), ...).
        coflows: (CoflowState.summary() map, ...) of every coflow in memory (submission
            order).
        stats: a copy of Controller.stats (lists copied).
        active: coflows not in a final state.
        bytes_delivered: bytes acknowledged by receivers, all coflows ever (dropped ones
            included).
    """

    topology: str
    dcs: tuple[str, ...]
    links: tuple[tuple[str, str, float, str, float], ...]
    agents: tuple[tuple[str, str, str], ...]
    coflows: tuple[dict, ...]
    stats: dict
    active: int
    bytes_delivered: int


class Controller:
    """Coflow API semantics, progress bookkeeping and scheduling rounds.

    Args:
        topology: the WAN view (mutated on link events).
        policy: a Policy over the same `topology` object.
        clock: returns seconds (monotonic); defaults to time.monotonic.
        agent_timeout_s: seconds an endpoint agent may stay disconnected before the
            coflows with unfinished flows it is an endpoint of fail (> 0).
        keep_finished: finished (done, failed, cancelled) coflows kept in memory for status
            requests; beyond it the oldest are dropped (None: no count bound).
        keep_finished_s: seconds a finished coflow is kept (None: no age bound).
        max_restarts: re-transfers from byte 0 a flow gets after digest mismatches before
            it fails (>= 0).
        state_dir: directory of the coflow journal (terra_controller/journal.py: ids never
            reused across restarts, every unfinished coflow resumed after one); None: memory
            only.
        store: the shared state (an EtcdState, terra_controller/etcd_state.py) the journal
            keeps its entries in instead of state_dir (controllers of one etcd cluster).

    Raises (constructor):
        JournalError: the state directory cannot be used.
        StateStoreError: the shared state cannot be read.

    Attributes:
        registry: the CoflowRegistry. rates: FlowRates of the last round.
        stats: {"rounds": int, "round_ms": [wall ms of the last STATS_KEPT rounds: allocate,
            split among agent pairs, states], "allocate_ms": [the policy.allocate part],
            "last_round_ms": float, "rejected": int, "failed": int, "cancelled": int,
            "restarts": int (flows restarted after a digest mismatch), "refused_reports": int
            (agent reports without the tag of the flow's current attempt),
            "dropped_finished": {final state: finished coflows dropped from memory},
            "dropped_bytes_delivered": int (bytes delivered of the dropped coflows)}.
        wan_event_at: time.monotonic() of the WAN event the next round answers (or None).
        on_rates: callbacks called with (FlowRates, changed_wan: bool) after each round,
            outside the lock.
        on_flows: callbacks called with (coflow, new flows) once they are stored (submit,
            update), outside the locks (a flow may have ended or restarted meanwhile).
        on_drop: callbacks called with (coflow, flows, restart: bool) inside the lock when
            agents must forget those flows: the coflow failed or was cancelled (restart
            False), or one flow restarts from byte 0 (restart True: the listener also sends
            the flow's descriptor again, attempt = flow.restarts, receiver first).
        on_tick: callbacks called with no arguments at the end of every `check_timeouts`,
            outside the lock (the agent channel's deferred sends).
        connected_agents: None, or a callable returning the ids of the agents connected now
            (set by the agent channel); without it agents are never timed out.
        files: None, or the FileRequests that ask agents about files (set by the agent
            channel); without it flows are taken as submitted (no sizes filled in, no
            directories expanded, no sync).
        agent_gone_since: {agent id: controller time it was first seen disconnected}.
        link_bytes: {directed link: bytes acknowledged that crossed it}: each acknowledged
            byte is attributed to the links of its flow's current paths in proportion to
            their rates (the measured load operators compare with the allocated rate).
        metrics: the ControllerMetrics (its own CollectorRegistry; counters and histograms
            updated at the event, the rest read by `metrics_view` at scrape time).
        journal: the CoflowJournal (under `lock`).
        events: the EventLog (terra_controller/events.py) operators read at REST /events.
        token_key: the HMAC key of the REST tokens `ctl login` gets (this process only).
    """

    def __init__(
        self,
        topology: Topology,
        policy: Policy,
        clock: Callable[[], float] | None = None,
        agent_timeout_s: float = AGENT_TIMEOUT_S,
        keep_finished: int | None = KEEP_FINISHED,
        keep_finished_s: float | None = None,
        max_restarts: int = MAX_RESTARTS,
        state_dir=None,
        store=None,
    ):
        self.topology = topology
        self.policy = policy
        self.registry = CoflowRegistry(topology.dcs)
        self.journal = CoflowJournal(state_dir, store)
        self.registry.next_id = self.journal.next_id
        self.clock = clock or time.monotonic
        self.t0 = self.clock()
        self.lock = threading.RLock()
        self.policy_lock = threading.RLock()  # taken before `lock`, never while holding it
        self.agents_back = threading.Condition(self.lock)  # notified on every registration
        self.started_mono = time.monotonic()
        # a controller with a past (a restart, a new leader) waits for its agents to return
        self.agent_return_s = AGENT_RETURN_S if self.journal.live else 0.0
        self._leaving: list[int] = []  # coflows to remove from the policy (under `lock`)
        self.rates: FlowRates = {}
        self.allocation: Allocation = {}
        self.agent_timeout_s = agent_timeout_s
        self.keep_finished = keep_finished
        self.keep_finished_s = keep_finished_s
        self.max_restarts = max_restarts
        self.stats = {
            "rounds": 0,
            "round_ms": [],
            "allocate_ms": [],
            "last_round_ms": 0.0,
            "rejected": 0,
            "failed": 0,
            "cancelled": 0,
            "restarts": 0,
            "refused_reports": 0,
            "dropped_finished": self.registry.dropped,
            "dropped_bytes_delivered": 0,
        }
        self.wan_event_at: float | None = None
        self.on_rates: list[Callable[[FlowRates, bool], None]] = []
        self.on_flows: list[Callable[[CoflowState, list[FlowState]], None]] = []
        self.on_drop: list[Callable[[CoflowState, list[FlowState], bool], None]] = []
        self.on_tick: list[Callable[[], None]] = []
        self.connected_agents: Callable[[], object] | None = None
        self.files: FileRequests | None = None
        self.agent_gone_since: dict[str, float] = {}
        self.round_wanted = threading.Event()
        self.wan_dirty = False
        self.started_wall = time.time()
        self.metrics = ControllerMetrics()
        self.events = EventLog()  # link, capacity, coflow and agent events (REST /events)
        self.token_key = new_key()  # signs REST tokens (terra_security/tokens.py)
        self.link_bytes: dict[tuple[str, str], float] = {}
        self.role = "single"  # "leader" when elected among controllers on etcd
        self.leader_addr: str | None = None  # the leader's API address (HOST:PORT) then
        self.generation = 0  # the etcd generation it leads with (0: no etcd)
        self.links = LinkStates(self.journal)  # the operator's (journaled) and the switches'
        restore_before_first_round(self)
        self.resuming = {cid: e for cid, e in self.journal.live.items() if e.resumable}
        if self.resuming:
            LOG.info("%d coflows of the journal resume once their agents register",
                     len(self.resuming))  # fmt: skip

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

    def submit(
        self,
        flows: object,
        deadline: object = None,
        coflow_id: object = None,
        age_s: object = None,
        owner: str | None = None,
        name: object = None,
        tags: object = None,
        ref: str | None = None,
        sync: object = False,
    ) -> int:
        """submitCoflow: validate, admit and store a coflow; ask for a round.

        The request is parsed and checked before any lock is taken (against a copy of the
        agents), so a large submit does not stop status requests, agent reports or other
        submits' parsing meanwhile.

        Args:
            flows: [{"id", "src", "dst", "bytes", "src_path"?, "dst_path"?}] with agent ids.
            deadline: seconds from now (> 0) or None.
            coflow_id: requested id (a client resubmitting after a controller restart),
                an integer in 0..MAX_CLIENT_ID.
            age_s: seconds since the coflow was first submitted (a resubmission after a
                controller restart): its arrival time, hence its CCT, counts from then
                (arrival = now - age_s) and its deadline stays `deadline` s from now.
            owner: the submitting job client's name (None: in-process); a coflow id is
                resubmitted only by its owner (also after a controller restart, from the
                journal).
            name, tags: the coflow's label and tags (check_labels); kept in the journal, so
                a resubmission after a restart without them gets them back.
            ref: the client's retry reference (kept in the journal: `submitted_ref`).
            sync: True: file flows whose destination already holds the same bytes (size and
                SHA-256, checked by the receiving agent) are done at once, not sent
                (terra_controller/file_requests.py; file flows: file_flows.py).

        Returns:
            the coflow id (>= 0), or -1 when the deadline cannot be met (docs/design.md 4.3).

        Raises:
            RegistryError: invalid request ("bad_request": bad id or an id another client
                owns, age_s not a finite number >= 0, bad deadline; "path_busy",
                "too_many_flows"; see parse_flows for the rest); "unavailable": the
                shared state cannot be written now; nothing changed.
        """
        self._check_state_writable()
        flows, files = self._resolve_files(flows, sync)
        with self.lock:
            agents = dict(self.registry.agents)
        parsed = files.apply(self.registry.parse_flows(flows, agents=agents))
        deadline_s = check_deadline(deadline)
        age = 0.0 if age_s is None else check_age(age_s)
        labels = check_labels(name, tags)
        if coflow_id is not None:
            check_coflow_id(coflow_id, MAX_CLIENT_ID)
        secret = new_secret()
        assign_keys(secret, parsed)
        policy_flows = [to_policy_flow(f) for f in parsed if not f.done]
        with self.policy_lock, self.lock, _observe_solves(self.metrics.lp_solve.observe):
            self._drain_leaving()
            reg = self.registry
            if reg.agents != agents:  # an agent (re-)registered meanwhile: check again
                parsed = files.apply(reg.parse_flows(flows))
                assign_keys(secret, parsed)
                policy_flows = [to_policy_flow(f) for f in parsed if not f.done]
            attempts: dict[str, int] = {}
            if coflow_id is not None:
                if coflow_id in reg.coflows:
                    return self._resubmitted(reg.coflows[coflow_id], parsed, owner)
                entry = self.journal.live.get(coflow_id)
                if entry is not None and entry.owner != owner:
                    raise RegistryError("bad_request", f"coflow id {coflow_id} is in use")
                if entry is not None and entry.ended is not None:
                    return coflow_id  # it ended before a restart: its status says how
                if entry is not None:  # resubmitted after a restart: the same keys again
                    secret, attempts = entry.secret, dict(entry.attempts)
                    assign_keys(secret, parsed)
                    if labels == (None, ()):
                        labels = (entry.name, entry.tags)
            reg.check_sinks(parsed)
            reg.check_open_flows(owner, len(parsed))
            cid = reg.new_id() if coflow_id is None else coflow_id
            now = self.now()
            arrival = now - age
            if deadline_s is not None:
                deadline_s += age  # relative to the arrival: still `deadline` s from now
            if not all(f.intra_dc or f.done for f in parsed):  # WAN flows: the policy decides
                probe = Coflow(coflow_key(cid), arrival, policy_flows, deadline_s)
                tenant_admission(self, probe, owner)  # tenants.py: its limits (tenant_limit)
                try:
                    admitted = self.policy.add_coflow(probe, now)
                except ValueError as exc:
                    raise RegistryError("no_path", f"coflow cannot be routed: {exc}") from exc
                if not admitted:  # burn the id: the policy may remember the rejected coflow
                    if coflow_id is None and reg.next_id <= cid:
                        reg.next_id = cid + 1
                    self.journal.burned(cid)
                    self.stats["rejected"] += 1
                    self.metrics.rejected.inc()
                    self.events.add("rejected", coflow=cid, reason="deadline cannot be met")
                    return -1
            coflow = reg.submit(parsed, deadline_s, arrival, cid, owner, secret, keyed=True,
                                labels=labels)  # fmt: skip
            for fid, attempt in attempts.items():  # flows restarted before a restart
                if fid in coflow.flows:
                    coflow.flows[fid].restarts = attempt
                    coflow.flows[fid].digest_key = flow_key(secret, fid, attempt)
            self.journal.admitted(cid, owner, coflow.secret, labels, flow_rows(parsed),
                                  deadline_s, time.time() - age, ref)  # fmt: skip
            self.resuming.pop(cid, None)
            self.metrics.admitted.inc()
            self.events.add("admitted", coflow=cid, flows=len(parsed), owner=owner)
            if reg.finish_if_done(coflow, now):  # intra-DC flows only: done at once
                self.journal.ended(cid, ended_summary(coflow))
                self.metrics.finished.labels(CoflowStatus.DONE.value).inc()
                self.events.add("done", coflow=cid, cct_s=coflow.cct_s)
                self.metrics.bytes_delivered.inc(coflow.bytes_total)
                self._prune(now)
                return cid
            self.want_round()
        self._durable(cid)
        self._announce(coflow, parsed)  # outside the locks: descriptors of many flows
        return cid

    def _resolve_files(self, flows: object, sync: object) -> tuple[object, FileInfo]:
        """Ask the agents about a submit's files (FileRequests.resolve), outside the locks.

        Raises:
            RegistryError("bad_request"): sync not a bool; see FileRequests.resolve.
        """
        if not isinstance(sync, bool):
            raise RegistryError("bad_request", f"sync must be true or false, got {sync!r:.40}")
        if self.files is None:
            return flows, FileInfo()
        return self.files.resolve(flows, sync)

    def _check_state_writable(self) -> None:
        """Refuse a change while the shared state does not take writes.

        Raises:
            RegistryError("unavailable"): the store still fails after one more try.
        """
        if self.journal.failing is None or self.journal.flush():
            return
        why = self.journal.failing
        raise RegistryError("unavailable", f"the shared state cannot be written ({why}); retry")

    def health(self) -> dict:
        """What REST /healthz answers: {"role": "single" | "leader", "leader": the leader's
        API address or None, "state_version": changes recorded in the journal (with etcd:
        its revision after this controller's last write)}."""
        return {"role": self.role, "leader": self.leader_addr,
                "state_version": self.journal.version}  # fmt: skip

    def _durable(self, what: object) -> None:
        """Wait (outside the locks) until the shared state holds the change just made to
        `what` (a coflow id, or a link's name), so a reply means it survives a failover;
        after STORE_WAIT_S the change stays queued and the reply goes anyway (a client
        resubmits its open coflows to a new leader)."""
        if not self.journal.wait_durable():
            name = f"coflow {what}" if isinstance(what, int) else what
            LOG.warning("%s: not yet in the shared state (%s)", name,
                        self.journal.failing or "slow")  # fmt: skip

    def submitted_ref(self, owner: str | None, ref: str) -> int | None:
        """The id of the coflow `owner` submitted with retry reference `ref` (remembered in
        the journal, so across restarts and failovers), else None."""
        with self.lock:
            return self.journal.by_ref(owner, ref)

    def coflows_of(self, owner: str | None) -> set[int]:
        """Ids of the coflows in memory that `owner` submitted."""
        with self.lock:
            return {cid for cid, c in self.registry.coflows.items() if c.owner == owner}

    def agents_view(self) -> dict:
        """What a job may know of the agents: {"dcs": [DC names of the topology], "agents":
        [{"id", "dc", "connected": bool (an open control connection now; False for every
        agent when no agent channel is attached)}]}, sorted by agent id. No addresses."""
        connected: set = set()
        if self.connected_agents is not None:
            connected = set(self.connected_agents())
        with self.lock:
            agents = sorted(self.registry.agents.values(), key=lambda a: a.id)
            return {
                "dcs": list(self.topology.dcs),
                "agents": [
                    {"id": a.id, "dc": a.dc, "connected": a.id in connected} for a in agents
                ],  # fmt: skip
            }

    def close(self) -> None:
        """Close the coflow journal's file (the controller is stopping)."""
        with self.lock:
            self.journal.close()

    def owner_of(self, coflow_id: object) -> tuple[bool, str | None]:
        """(known, owner name) of a coflow id: known when the coflow is in memory or in the
        journal (not yet forgotten); owner None for in-process submits."""
        with self.lock:
            if isinstance(coflow_id, bool) or not isinstance(coflow_id, int):
                return (False, None)
            coflow = self.registry.coflows.get(coflow_id)
            if coflow is not None:
                return (True, coflow.owner)
            return self.journal.owner(coflow_id)

    def _announce(self, coflow: CoflowState, flows: list[FlowState]) -> None:
        for listener in list(self.on_flows):
            try:
                listener(coflow, flows)
            except Exception:
                LOG.exception("flow listener failed")

    def _resubmitted(self, coflow: CoflowState, parsed: list[FlowState], owner: str | None) -> int:
        if coflow.owner != owner:
            raise RegistryError("bad_request", f"coflow id {coflow.id} is in use")
        same = sorted((f.id, f.src_agent, f.dst_agent, f.bytes) for f in parsed) == sorted(
            (f.id, f.src_agent, f.dst_agent, f.bytes) for f in coflow.flows.values()
        )
        if not same:
            raise RegistryError("bad_request", f"coflow id {coflow.id} is in use")
        return coflow.id

    def update(self, coflow_id: object, flows: object) -> None:
        """updateCoflow: add flows to an unfinished coflow; ask for a round (file flows as
        for a submit: sizes from the sender, directories and globs expanded).

        The flows are parsed before the locks are taken (as for a submit) and their
        descriptors sent after they are released.

        Raises:
            RegistryError: unknown coflow, finished coflow, invalid flows; nothing changed.
        """
        self._check_state_writable()
        with self.lock:
            self.registry.get(coflow_id)  # an unknown coflow is the first thing to say
            agents = dict(self.registry.agents)
        flows, _ = self._resolve_files(flows, False)  # sizes, directories and globs
        parsed = self.registry.parse_flows(flows, agents=agents)
        with self.policy_lock, self.lock, _observe_solves(self.metrics.lp_solve.observe):
            self._drain_leaving()
            coflow = self.registry.get(coflow_id)
            if coflow.state.final:
                raise RegistryError("coflow_done", f"coflow {coflow.id} already {coflow.state}")
            if self.registry.agents != agents:  # an agent (re-)registered meanwhile
                parsed = self.registry.parse_flows(flows)
            for f in parsed:
                if f.id in coflow.flows:
                    raise RegistryError("duplicate_flow", f"duplicate flow id {f.id!r}")
            self.registry.check_sinks(parsed)
            self.registry.check_open_flows(coflow.owner, len(parsed))
            wan = [to_policy_flow(f) for f in parsed if not f.intra_dc]
            if wan:
                try:
                    if coflow.wan_done:  # its WAN part was empty so far: enter the policy now
                        self.policy.add_coflow(coflow.to_policy_coflow(parsed), self.now())
                    else:
                        self.policy.add_flows(coflow_key(coflow.id), wan, self.now())
                except (KeyError, ValueError) as exc:
                    raise RegistryError("no_path", f"flows cannot be routed: {exc}") from exc
            self.registry.add_flows(coflow, parsed)
            self.journal.added(coflow.id, flow_rows(parsed))
            self.want_round()
        self._durable(coflow.id)
        self._announce(coflow, parsed)

    def cancel(self, coflow_id: object) -> dict:
        """cancelCoflow: stop an unfinished coflow for good (state "cancelled").

        The policy forgets it, its rates are dropped and a round is asked for (its capacity
        goes to the other coflows in that round); its agents are told to drop its flows.
        Cancelling a cancelled coflow again changes nothing.

        Returns:
            the coflow's status map (see `status`).

        Raises:
            RegistryError("unknown_coflow"): no such coflow (or dropped from memory).
            RegistryError("coflow_done"): it is already done, failed or rejected.
        """
        with self.lock:
            entry = self._journal_only(coflow_id)
            if entry is not None and entry.ended is not None:
                raise RegistryError(
                    "coflow_done", f"coflow {coflow_id} already {entry.ended['state']}"
                )
            if entry is not None:  # waiting to be resumed: it ends here
                self._abandon(coflow_id, "cancelled by the job master", CoflowStatus.CANCELLED)
                return self._journal_status(coflow_id)
            coflow = self.registry.get(coflow_id)
            if coflow.state is not CoflowStatus.CANCELLED:
                if coflow.state.final:
                    raise RegistryError(
                        "coflow_done", f"coflow {coflow.id} already {coflow.state.value}"
                    )
                self._end(coflow, CoflowStatus.CANCELLED, "cancelled by the job master")
            out = coflow.status()  # (it may be dropped from memory already: keep_finished)
            for f in out["flows"]:
                f["rate_bytes_per_s"] = 0.0
            return out

    def _delivered(self, coflow_id: int, flow: FlowState, nbytes: int) -> None:
        """Count `nbytes` newly acknowledged bytes of `flow` (lock held): the bytes counter
        and `link_bytes` (split over the flow's current paths by rate; a flow without rates
        right now counts in the counter only)."""
        self.metrics.bytes_delivered.inc(nbytes)
        paths = self.rates.get(coflow_id, {}).get(flow.id, ())
        total = sum(rate for _, rate in paths)
        if total <= 0:
            return
        link_bytes = self.link_bytes
        for path, rate in paths:
            share = nbytes * rate / total
            for link in zip(path[:-1], path[1:], strict=False):
                link_bytes[link] = link_bytes.get(link, 0.0) + share

    def fail_flow(
        self,
        coflow_id: object,
        flow_id: object,
        reason: str,
        retry: bool = False,
        attempt: int | None = None,
        tag: object = None,
    ) -> str:
        """A flow cannot run (an agent's report): fail it and its coflow, or restart it.

        Args:
            reason: what the agent said (kept as the flow's and the coflow's reason).
            retry: the flow may be transferred again from byte 0 (a digest mismatch at the
                receiver): it is, up to `max_restarts` times; after that it fails.
            attempt: the flow's attempt the report is about (None: the current one); a
                report about an earlier attempt is ignored.
            tag: an agent's report tag (see `check_report`); None: an in-process caller.

        Returns:
            "restarted" (agents get "drop" then the flow's descriptor again, attempt + 1),
            "failed" (the flow and its coflow are failed now), or "ignored" (the flow is
            done or its coflow already final: a late or repeated report).

        Raises:
            RegistryError: unknown coflow or flow.
        """
        with self.lock:
            flow = self.registry.flow(coflow_id, flow_id)
            coflow = self.registry.get(coflow_id)
            if coflow.state.final or flow.state not in (FlowStatus.QUEUED, FlowStatus.RUNNING):
                return "ignored"
            if attempt is not None and attempt != flow.restarts:
                return "ignored"  # about an attempt before the flow's last restart
            self.check_report(flow, tag)
            text = str(reason)
            if retry:
                if flow.restarts < self.max_restarts:
                    self.registry.restart_flow(coflow, flow)
                    self.journal.attempt(coflow.id, flow.id, flow.restarts)
                    self.stats["restarts"] += 1
                    self.metrics.restarts.inc()
                    LOG.warning(
                        "coflow %s flow %s: %s; transferring it again (attempt %d of %d)",
                        coflow.id, flow.id, text, flow.restarts, self.max_restarts,
                    )  # fmt: skip
                    self._notify_drop(coflow, [flow], True)
                    self.want_round()
                    return "restarted"
                text = f"{text} (after {flow.restarts} re-transfers)"
            self._end(coflow, CoflowStatus.FAILED, f"flow {flow.id}: {text}", flow)
            return "failed"

    def _end(
        self,
        coflow: CoflowState,
        state: CoflowStatus,
        reason: str,
        culprit: FlowState | None = None,
    ) -> None:
        """Fail or cancel `coflow` (lock held): release its capacity, tell its agents."""
        now = self.now()
        dropped = self.registry.end(coflow, state, reason, now, culprit)
        self.journal.ended(coflow.id, ended_summary(coflow))
        self._leaving.append(coflow.id)
        self.rates.pop(coflow.id, None)
        self.allocation.pop(coflow_key(coflow.id), None)
        self.stats[state.value] += 1
        self.metrics.finished.labels(state.value).inc()
        level = logging.WARNING if state is CoflowStatus.FAILED else logging.INFO
        LOG.log(level, "coflow %s %s: %s", coflow.id, state.value, coflow.reason)
        self.events.add(state.value, coflow=coflow.id, reason=coflow.reason)
        if dropped:
            self._notify_drop(coflow, dropped, False)
        self.want_round()
        self._prune(now)

    def _notify_drop(self, coflow: CoflowState, flows: list[FlowState], restart: bool) -> None:
        for listener in list(self.on_drop):
            try:
                listener(coflow, flows, restart)
            except Exception:
                LOG.exception("drop listener failed")

    def _prune(self, now: float) -> None:
        """Drop the oldest finished coflows beyond keep_finished / keep_finished_s."""
        if self.keep_finished is None and self.keep_finished_s is None:
            return
        for coflow in self.registry.prune_finished(now, self.keep_finished, self.keep_finished_s):
            self.journal.forgotten(coflow.id)
            self.rates.pop(coflow.id, None)
            self.stats["dropped_bytes_delivered"] += coflow.bytes_delivered

    def check_timeouts(self) -> list[int]:
        """Fail coflows that cannot finish any more; drop finished coflows past keep_finished_s.

        A coflow whose deadline passed unfinished fails ("deadline missed"); one with an
        unfinished WAN flow whose sender or receiver agent has been disconnected for
        `agent_timeout_s` or longer fails ("agent X gone ..."). Agents count as
        disconnected from the first call that finds them missing from `connected_agents()`
        (no check without it). RoundRunner calls this every `tick_s` seconds.

        Returns:
            ids of the coflows failed by this call.
        """
        if self.resuming:
            self.resume()
        connected = None
        if self.connected_agents is not None:
            try:
                connected = set(self.connected_agents())
            except Exception:
                LOG.exception("connected_agents failed")
        failed = []
        with self.lock:
            now = self.now()
            gone: dict[str, float] = {}
            if connected is not None:
                for agent in self.registry.agents:
                    if agent in connected:
                        self.agent_gone_since.pop(agent, None)
                    else:
                        since = self.agent_gone_since.setdefault(agent, now)
                        if now - since >= self.agent_timeout_s:
                            gone[agent] = now - since
            for coflow in self.registry.active():
                reason = None
                if coflow.deadline_s is not None and now > coflow.submitted_s + coflow.deadline_s:
                    reason = f"deadline missed ({coflow.deadline_s:g} s after arrival)"
                elif gone:
                    for f in coflow.flows.values():
                        if f.intra_dc or f.done:
                            continue
                        agent = f.src_agent if f.src_agent in gone else f.dst_agent
                        if agent in gone:
                            reason = f"agent {agent} gone for {gone[agent]:.0f} s"
                            break
                if reason is not None:
                    self._end(coflow, CoflowStatus.FAILED, reason)
                    failed.append(coflow.id)
            self._prune(now)
        for listener in list(self.on_tick):
            try:
                listener()
            except Exception:
                LOG.exception("tick listener failed")
        return failed

    def status(self, coflow_id: object) -> dict:
        """checkStatus: the coflow's status map plus each flow's current "rate_bytes_per_s".

        Raises:
            RegistryError("unknown_coflow").
        """
        with self.lock:
            if self._journal_only(coflow_id) is not None:
                return self._journal_status(coflow_id)
            coflow = self.registry.get(coflow_id)
            out = coflow.status()
            rates = self.rates.get(coflow.id, {})
            for f in out["flows"]:
                f["rate_bytes_per_s"] = sum(r for _, r in rates.get(f["id"], []))
            return out

    def _journal_only(self, coflow_id: object):
        """The journal entry of a coflow known only from the journal (ended before a
        restart, or waiting to be resumed), else None (lock held)."""
        if isinstance(coflow_id, bool) or not isinstance(coflow_id, int):
            return None
        if coflow_id in self.registry.coflows:
            return None
        return self.journal.live.get(coflow_id)

    def journal_only_statuses(self, owner: str | None = None, every: bool = False) -> list[dict]:
        """Status maps (journal_status) of the coflows known only from the journal: ended
        before this controller's start (a restart or a failover) or waiting to be resumed,
        by id; only `owner`'s unless `every`."""
        with self.lock:
            return [
                self._journal_status(cid)
                for cid, entry in sorted(self.journal.live.items())
                if cid not in self.registry.coflows and (every or entry.owner == owner)
            ]

    def _journal_status(self, coflow_id: int) -> dict:
        """journal_status of a coflow known only from the journal (lock held)."""
        entry = self.journal.live[coflow_id]
        waiting = None
        if entry.ended is None:
            missing = missing_agents(entry, self.registry.agents)
            waiting = "resuming after a controller restart" + (
                f": waiting for agents {', '.join(missing)}" if missing else ""
            )
        return journal_status(coflow_id, entry, waiting)

    def await_agents(self, flows: object, window_s: float | None = None) -> None:
        """Wait until every agent that `flows` names as "src" or "dst" is registered, for at
        most what is left of the controller's first `window_s` seconds (monotonic; None:
        `agent_return_s`, AGENT_RETURN_S when the controller started with a journal that
        holds coflows, else 0: a controller without a past expects no agent back).

        A restarted controller, or a new leader after a failover, has no agents until they
        connect again (within a second of its listening); a submit arriving meanwhile waits
        for them instead of being refused "unknown_agent". After the window (or for names
        that are not strings) it returns at once and the submit's own checks decide.
        """
        names = named_agents(flows)
        end = self.started_mono + (self.agent_return_s if window_s is None else window_s)
        with self.agents_back:
            while names - self.registry.agents.keys():
                left = end - time.monotonic()
                if left <= 0:
                    return
                self.agents_back.wait(left)

    def agent_registered(self) -> list[int]:
        """An agent registered: wake submits waiting for it (`await_agents`), then resume the
        journal's coflows whose agents are all back (`resume`)."""
        with self.agents_back:
            self.agents_back.notify_all()
        return self.resume()

    def resume(self) -> list[int]:
        """Admit again the journal's coflows that had not ended (terra_controller/resume.py)
        once every agent their flows name is registered; fail those whose agents are not
        all back `agent_timeout_s` after the controller's start, whose deadline passed, or
        that cannot be admitted again. The agent channel calls this after each
        registration, `check_timeouts` on every tick.

        Returns:
            ids of the coflows admitted again by this call.
        """
        resumed = []
        for cid in list(self.resuming):
            with self.lock:
                entry = self.resuming.get(cid)
                if entry is None or cid in self.registry.coflows:
                    self.resuming.pop(cid, None)
                    continue
                missing = missing_agents(entry, self.registry.agents)
                if missing and self.now() >= self.agent_timeout_s:
                    why = f"agents {', '.join(missing)} did not register within "
                    why += f"{self.agent_timeout_s:g} s"
                    self._abandon(cid, why + " of the controller's start")
            if missing:
                continue
            request = resume_request(entry, time.time())
            if isinstance(request, str):
                with self.lock:
                    self._abandon(cid, request)
                continue
            try:
                got = self.submit(coflow_id=cid, **request)
            except RegistryError as exc:
                got, why = -1, f"cannot be admitted again after a controller restart: {exc}"
            else:
                why = "its deadline cannot be met any more after a controller restart"
            if got < 0:
                with self.lock:
                    self._abandon(cid, why)
            else:
                LOG.info("coflow %s resumed after the controller's restart", cid)
                resumed.append(cid)
        return resumed

    def _abandon(
        self, coflow_id: int, reason: str, state: CoflowStatus = CoflowStatus.FAILED
    ) -> None:
        """A journaled coflow will not be resumed: it ends in `state` (lock held)."""
        entry = self.resuming.pop(coflow_id, None)
        if entry is None:
            return
        self.journal.ended(coflow_id, failed_summary(entry, reason) | {"state": state.value})
        self.stats[state.value] += 1
        self.metrics.finished.labels(state.value).inc()
        LOG.warning("coflow %s %s: %s", coflow_id, state.value, reason)
        self.events.add(state.value, coflow=coflow_id, reason=reason)

    # ---- WAN events ---------------------------------------------------------------------

    def set_link_state(self, a: object, b: object, up: object, source: str = OPERATOR) -> bool:
        """Set the undirected link a-b up or down (both directions), as the operator says
        (journaled: it survives restarts and failovers) or a switch (source "switch"); the
        link is up only while neither says down (terra_controller/operator_links.py).

        Returns:
            True when the link's state changed (a round is then asked for).

        Raises:
            RegistryError("bad_request"): unknown link or bad arguments; "unavailable": the
            shared state cannot be written now (an operator's change; nothing changed).
        """
        if not isinstance(up, bool):
            raise RegistryError("bad_request", "up must be true or false")
        if source == OPERATOR:
            self._check_state_writable()
        with self.policy_lock, self.lock:
            try:
                self.topology.available((a, b))  # raises for an unknown link
                self.topology.available((b, a))
                up = self.links.record(a, b, up, source)
                was_up = (a, b) not in self.topology.down
                if was_up == up and ((b, a) not in self.topology.down) == up:
                    changed = False
                else:
                    self.topology.set_link_state(a, b, up)
                    changed = True
            except (TopologyError, TypeError) as exc:
                raise RegistryError("bad_request", str(exc)) from exc
            if changed and self.policy.wan_changed(self.now()):
                self.want_round(wan=True)
            if changed:
                LOG.info("link %s-%s %s (%s)", a, b, "up" if up else "down", source)
                self.events.add("link_up" if up else "link_down", a=a, b=b, source=source)
        if source == OPERATOR:
            self._durable(f"link {a}-{b}")
        return changed

    def set_capacity(self, a: object, b: object, bytes_per_s: object) -> bool:
        """Set the capacity of the undirected link a-b (bytes/s).

        The capacity is journaled (it survives restarts and failovers).

        Returns:
            True when the policy judged the change large enough (δ) for a new round.

        Raises:
            RegistryError("bad_request"): unknown link or bad capacity; "unavailable": the
            shared state cannot be written now (nothing changed).
        """
        self._check_state_writable()
        with self.policy_lock, self.lock:
            try:
                self.topology.set_capacity(a, b, bytes_per_s)
            except (TopologyError, TypeError) as exc:
                raise RegistryError("bad_request", str(exc)) from exc
            self.journal.link_set(a, b, cap=bytes_per_s)
            changed = self.policy.wan_changed(self.now())
            if changed:
                self.want_round(wan=True)
            self.events.add("capacity", a=a, b=b, bytes_per_s=self.topology.capacity[(a, b)])
        self._durable(f"link {a}-{b}")
        return changed

    # ---- agent reports ------------------------------------------------------------------

    def check_report(self, flow: FlowState, tag: object) -> None:
        """Accept an agent's report about `flow` only with its current attempt's tag (lock
        held); tag None: an in-process caller, not checked.

        Raises:
            RegistryError("stale_attempt"): counted in stats["refused_reports"].
        """
        if tag is None:
            return
        try:
            flow.check_tag(tag)
        except RegistryError:
            self.stats["refused_reports"] += 1
            raise

    def progress(
        self, coflow_id: object, flow_id: object, acked: object, tag: object = None
    ) -> bool:
        """A receiver acknowledged `acked` bytes of a flow (feeds remaining volumes).

        Args:
            tag: the agent's report tag (see `check_report`); None: an in-process caller.

        Returns:
            False when the report is about a flow its agents should drop (its coflow failed
            or was cancelled); True otherwise.

        Raises:
            RegistryError: unknown coflow/flow, bad offset, "stale_attempt".
        """
        with self.lock:
            flow = self.registry.flow(coflow_id, flow_id)
            if not flow.ended:
                self.check_report(flow, tag)
            before = flow.delivered
            flow = self.registry.record_progress(coflow_id, flow_id, acked)
            if flow.delivered > before:
                self._delivered(int(coflow_id), flow, flow.delivered - before)
            return flow.state not in (FlowStatus.FAILED, FlowStatus.CANCELLED)

    def complete(
        self,
        coflow_id: object,
        flow_id: object,
        digest: object,
        tag: object = None,
        sha256: object = None,
    ) -> bool:
        """A flow finished (all bytes in order, digest matched at the receiver).

        Asks for a round when this finishes a FlowGroup or the coflow (docs/design.md 4.3).

        Args:
            tag: the agent's report tag (see `check_report`); None: an in-process caller.
            sha256: the receiver's hex SHA-256 of a file sink's bytes, or None.

        Returns:
            True when the coflow is now done.

        Raises:
            RegistryError: unknown coflow/flow, "stale_attempt" (nothing changes).
        """
        with self.lock:
            flow = self.registry.flow(coflow_id, flow_id)
            coflow = self.registry.get(coflow_id)
            if flow.done or coflow.state.final:
                return coflow.state is CoflowStatus.DONE
            self.check_report(flow, tag)
            if isinstance(sha256, str):
                flow.sha256 = sha256
            before = flow.delivered
            coflow = self.registry.record_complete(coflow_id, flow_id, digest, self.now())
            self._delivered(coflow.id, flow, max(0, flow.bytes - before))
            if coflow.state is CoflowStatus.DONE:
                self.journal.ended(coflow.id, ended_summary(coflow))
                self.metrics.finished.labels(CoflowStatus.DONE.value).inc()
                intra = sum(f.bytes for f in coflow.flows.values() if f.intra_dc)
                if intra:  # intra-DC flows count as delivered when the coflow is done
                    self.metrics.bytes_delivered.inc(intra)
                self._leaving.append(coflow.id)
                self.rates.pop(coflow.id, None)
                self.want_round()
                LOG.info("coflow %s done, CCT %.3f s", coflow.id, coflow.cct_s)
                self.events.add("done", coflow=coflow.id, cct_s=coflow.cct_s)
                self._prune(self.now())
                return True
            if not self.registry.undone.get(coflow.id, {}).get((flow.src_dc, flow.dst_dc)):
                self.want_round()  # its FlowGroup is done
            return False

    # ---- scheduling ---------------------------------------------------------------------

    def run_round(self) -> tuple[FlowRates, bool]:
        """Run one scheduling round now (docs/design.md 4.2 via policy.allocate).

        snapshot -> allocate -> apply: the remaining bytes are copied under `lock`, the
        policy allocates holding `policy_lock` only (API status calls, agent reports and
        REST go on meanwhile), and the rates are applied under `lock`; a coflow that
        finished, failed or was cancelled during the allocation gets no rates.

        Returns:
            (FlowRates for every active WAN flow, whether the WAN changed since the last
            round). Coflow states are updated from the policy.
        """
        with self.policy_lock:
            with self.lock:
                self.round_wanted.clear()
                wan, self.wan_dirty = self.wan_dirty, False
                start = time.perf_counter()
                self._drain_leaving()
                remaining = self.registry.remaining(self._connectivity())
                now = self.now()
            begin_allocate = time.perf_counter()
            with _observe_solves(self.metrics.lp_solve.observe):
                allocation = self.policy.allocate(now, remaining) if remaining else {}
            allocated = time.perf_counter()
            states = self._policy_states(remaining)
            _trim_policy_stats(self.policy)
            with self.lock:
                self.allocation = allocation
                self.rates = flow_rates(allocation, self.registry)
                self._update_states(states)
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
            return self.rates, wan

    def _drain_leaving(self) -> None:
        """Remove the coflows that left the schedule from the policy (both locks held)."""
        if self._leaving:
            now = self.now()
            leaving, self._leaving = self._leaving, []
            for cid in leaving:
                self.policy.remove_coflow(coflow_key(cid), now)

    def _policy_states(self, remaining: dict) -> dict[str, object]:
        """{str(coflow id): the policy's state for it} for the coflows of this round
        (policy_lock held); empty when the policy does not report states."""
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
        """Set every active coflow's state (lock held): the policy's (`states`) when it
        is an active one, else running / preempted by whether it has rates."""
        for coflow in self.registry.active():
            state = states.get(coflow_key(coflow.id))
            if state not in _ACTIVE_STATES:
                rates = self.rates.get(coflow.id, {})
                running = any(r > 0 for paths in rates.values() for _, r in paths)
                state = CoflowStatus.RUNNING if running else CoflowStatus.PREEMPTED
            coflow.state = CoflowStatus(state)

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

    def snapshot(self, coflows: bool = True) -> Snapshot:
        """A Snapshot of the registry, the WAN and the stats, copied under `lock` (brief:
        O(coflows in memory); never waits for a round).

        Args:
            coflows: copy the coflows' summaries; False leaves `coflows` empty and
                `bytes_delivered` 0 and costs O(links + agents) only (REST /status and
                /topology, polled every second by the operator page).
        """
        load = self.link_rates()
        with self.lock:
            topo, reg = self.topology, self.registry
            links = tuple(
                (u, v, topo.capacity[(u, v)], "down" if (u, v) in topo.down else "up",
                 load.get((u, v), 0.0))
                for u, v in topo.links
            )  # fmt: skip
            with_coflows = coflows
            coflows = tuple(c.summary() for c in reg.coflows.values()) if with_coflows else ()
            stats = {k: (list(v) if isinstance(v, list) else v) for k, v in self.stats.items()}
            stats["dropped_finished"] = dict(stats["dropped_finished"])
            return Snapshot(
                topology=topo.name,
                dcs=tuple(topo.dcs),
                links=links,
                agents=tuple((a.id, a.dc, a.data_addr) for a in reg.agents.values()),
                coflows=coflows,
                stats=stats,
                active=len(reg.active()),
                bytes_delivered=(
                    sum(c["bytes_delivered"] for c in coflows)
                    + self.stats["dropped_bytes_delivered"]
                    if with_coflows
                    else 0
                ),
            )

    def metrics_view(self) -> dict:
        """What /metrics reads from the controller at scrape time, copied under `lock`.

        Cost O(links + active coflows + their flows' rates): it never walks the finished
        coflows, however many are kept (docs/runtime.md "Metrics").

        Returns:
            {"links": [(a, b, capacity bytes/s, up: bool, allocated bytes/s, bytes
            acknowledged across it (link_bytes))] per directed link, "active": {state:
            coflows} of the active states, "in_memory": coflows kept, "agents": registered
            agents, "lps": LPs the policy solved (int), "dropped": {final state: finished
            coflows dropped from memory}}.
        """
        load = self.link_rates()
        with self.lock:
            topo, reg = self.topology, self.registry
            delivered = self.link_bytes
            links = [
                (u, v, cap, (u, v) not in topo.down, load.get((u, v), 0.0),
                 delivered.get((u, v), 0.0))
                for (u, v), cap in sorted(topo.capacity.items())
            ]  # fmt: skip
            active: dict[str, int] = {}
            for coflow in reg.active():
                active[coflow.state.value] = active.get(coflow.state.value, 0) + 1
            stats = getattr(self.policy, "stats", None)
            lps = int(stats.get("lps", 0)) if isinstance(stats, dict) else 0
            return {
                "links": links,
                "active": active,
                "in_memory": len(reg.coflows),
                "agents": len(reg.agents),
                "lps": lps,
                "dropped": dict(reg.dropped),
            }

    def state_counts(self) -> dict[str, int]:
        """{state: coflows in memory in that state}, O(active coflows)."""
        with self.lock:
            return self.registry.state_counts()

    def recent_coflows(self, finished: int) -> list[dict]:
        """Summaries (CoflowState.summary()) of every active coflow and of the `finished`
        coflows that ended last, newest id first; O(active + finished), whatever the
        history (the operator page polls it every second)."""
        with self.lock:
            reg = self.registry
            chosen = list(reg.active())
            for cid in reversed(reg.finished):
                if finished <= 0:
                    break
                coflow = reg.coflows.get(cid)
                if coflow is not None:
                    chosen.append(coflow)
                    finished -= 1
            return [c.summary() for c in sorted(chosen, key=lambda c: c.id, reverse=True)]

    def link_delivered(self) -> dict[tuple[str, str], float]:
        """A copy of `link_bytes`: {directed link: bytes acknowledged across it}."""
        with self.lock:
            return dict(self.link_bytes)

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
            [{"src_dc", "dst_dc", "bytes_remaining", "paths": [{"path": [dc...],
            "rate_bytes_per_s"}]}] (docs/operations.md, REST).
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
                    {"src_dc": f.src_dc, "dst_dc": f.dst_dc, "bytes_remaining": 0, "paths": {}},
                )
                g["bytes_remaining"] += f.remaining
                for path, rate in rates.get(f.id, []):
                    g["paths"][path] = g["paths"].get(path, 0.0) + rate
            for g in groups.values():
                g["paths"] = [
                    {"path": list(p), "rate_bytes_per_s": r} for p, r in g["paths"].items()
                ]
            return list(groups.values())


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


def _observe_solves(observe: Callable[[float], None]):
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


class RoundRunner:
    """Runs asked-for scheduling rounds at once, one at a time, in its own thread.

    Requests that arrive while a round runs are coalesced into the next round. Every
    `tick_s` seconds it also runs `controller.check_timeouts()` (agents gone, deadlines
    missed, finished coflows past their keep time), between rounds.

    Args:
        controller: the Controller whose `round_wanted` event it watches.
        tick_s: seconds between timeout checks (> 0).
    """

    def __init__(self, controller: Controller, tick_s: float = 1.0) -> None:
        self.controller = controller
        self.tick_s = tick_s
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
        next_tick = time.monotonic() + self.tick_s
        while not self.stopped:
            wanted = self.controller.round_wanted.wait(max(0.0, next_tick - time.monotonic()))
            if self.stopped:
                return
            if time.monotonic() >= next_tick:
                next_tick = time.monotonic() + self.tick_s
                try:
                    self.controller.check_timeouts()
                except Exception:
                    LOG.exception("timeout check failed")
                wanted = self.controller.round_wanted.is_set()
            if not wanted:
                continue
            try:
                self.controller.round_and_push()
            except Exception:
                LOG.exception("scheduling round failed")
                time.sleep(0.1)
