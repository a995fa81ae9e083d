"""The controller's core glue: WAN view, scheduling policy and coflow registry.

`Controller` owns the `Topology`, the policy (normally `TerraPolicy`) and the
`CoflowRegistry`, and its state has one owner: the trio loop `owner` (owner_loop.py,
docs/runtime.md "One owner and the round"). The coflow API's, the agent channel's and
REST's connections are tasks of that loop; the OpenFlow app and worker threads call the
public methods from their own threads, which hand the work to the loop and wait for it.
What needs the policy (the admission of a submit or an update, link events) waits until
no round holds it; a round copies the remaining bytes on the loop, allocates in the
loop's worker thread while the loop serves everything else, then applies the rates on
the loop. Coflows that leave the schedule (done, failed, cancelled) are removed from the
policy at the start of the next round (or of the next admission).
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

The core's handlers (marked `core_log.core_event`) change this state and emit what they
ask of others as values (core_effects.py: flows to drop, a round wanted, the timer's
tick); the wrapper around each handler records them and then performs them.

`Controller` is assembled from parts in modules of their own: the scheduling round and
`RoundRunner` (controller_round.py), the read-only views (controller_views.py) and the
ways a coflow ends unfinished (coflow_endings.py); this module holds the coflow API,
agent reports, WAN events and resumption.

Units: bytes, bytes/s, seconds on the controller clock (monotonic, from start).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import trio

from terra_controller.coflow_endings import CoflowEndings
from terra_controller.coflow_registry import CoflowRegistry
from terra_controller.coflow_state import (
    AgentInfo,
    CoflowState,
    FlowState,
    RegistryError,
    assign_keys,
    coflow_key,
    flow_key,
    new_secret,
    to_policy_flow,
)
from terra_controller.controller_resume import ControllerResumption
from terra_controller.controller_round import ControllerRounds, FlowRates, observe_solves_lazily
from terra_controller.controller_views import ControllerViews
from terra_controller.core_effects import AskRound, Effect, emit
from terra_controller.core_log import CoreRecorder, core_event
from terra_controller.events import EventLog
from terra_controller.file_requests import FileInfo, FileRequests
from terra_controller.journal import CoflowJournal
from terra_controller.metrics import ControllerMetrics
from terra_controller.operator_links import (
    ControllerLinkEvents,
    LinkStates,
    restore_before_first_round,
)
from terra_controller.owner_loop import OwnerLoop
from terra_controller.request_checks import (
    check_age,
    check_coflow_id,
    check_deadline,
    check_labels,
)
from terra_controller.resume import (
    ended_summary,
    flow_rows,
    journal_status,
    missing_agents,
)
from terra_controller.submission import Submission, recorded_submit
from terra_controller.tenants import tenant_admission
from terra_core.policy import Allocation, Policy
from terra_model import Coflow
from terra_model.states import MAX_CLIENT_ID, CoflowStatus, FlowStatus
from terra_security.tokens import new_key
from topologies import Topology

LOG = logging.getLogger("terra.controller")

AGENT_TIMEOUT_S = 60.0  # an endpoint agent disconnected this long fails its unfinished coflows
KEEP_FINISHED = 10_000  # finished coflows kept for status requests (the oldest are dropped)
AGENT_RETURN_S = 5.0  # after a start or a takeover, a submit waits this long for its agents
MAX_RESTARTS = 3  # re-transfers of a flow from byte 0 after digest mismatches before it fails


class Controller(
    ControllerRounds, ControllerViews, CoflowEndings, ControllerLinkEvents, ControllerResumption
):
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
        owner: the OwnerLoop (owner_loop.py) that alone reads and changes this state.
        round_wanted: a round was asked for (on the loop); round_asked: the trio Event the
            round task waits on.
        on_rates: callbacks called with (FlowRates, changed_wan: bool) after each round (its
            PushRates effect, core_effects.py), on the loop.
        on_flows: callbacks called with (coflow, new flows) once they are stored (submit,
            update), after the admission (a flow may have ended or restarted meanwhile).
        on_drop: callbacks called with (coflow, flows, restart: bool) on the loop when
            agents must forget those flows (a core_effects.DropFlows, performed after the
            event that emitted it): the coflow failed or was cancelled (restart False), or
            one flow restarts from byte 0 (restart True: the listener also sends the
            flow's descriptor again, attempt = flow.restarts, receiver first).
        on_tick: callbacks called with no arguments after every `check_timeouts` event,
            on the loop (core_effects.TimerTick; the agent channel's deferred sends).
        effects: the effects emitted by the core event being handled (None between events);
            last_effects: those of the last event handled.
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
        journal: the CoflowJournal (on the loop).
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
        self.event_at: float | None = None  # the time of the core event being handled
        self.wall_offset = time.time() - self.now()  # UNIX time of controller time 0 (s)
        self.recorder: CoreRecorder | None = None  # core_log.py: the events, when recorded
        self.replaying = False  # core_log.replay is feeding recorded events
        self.effects: list[Effect] | None = None  # emitted by the event being handled
        self.last_effects: list[Effect] | None = None  # those of the last event handled
        self.owner = OwnerLoop()  # the one owner of this state (owner_loop.py)
        self.agents_back = trio.Event()  # set (and replaced) on every registration
        self.started_mono = time.monotonic()
        # a controller with a past (a restart, a new leader) waits for its agents to return
        self.agent_return_s = AGENT_RETURN_S if self.journal.live else 0.0
        self._leaving: list[int] = []  # coflows to remove from the policy (on the loop)
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
        self.round_wanted = False  # a round was asked for (on the loop)
        self.round_asked = trio.Event()  # set when it was (a new one once a round starts)
        self.wan_dirty = False
        self.started_wall = time.time()
        self.metrics = ControllerMetrics()
        self.events = EventLog()  # link, capacity, coflow and agent events (REST /events)
        self.token_key = new_key()  # signs REST tokens (terra_security/tokens.py)
        self.link_bytes: dict[tuple[str, str], float] = {}
        self.role = "single"  # "leader" when elected among controllers on etcd
        self.leader_addr: str | None = None  # the leader's API address (HOST:PORT) then
        self.generation = 0  # the etcd generation it leads with (0: no etcd)
        self._switch_links = None  # the loop's channel of switch link changes (operator_links)
        self.links = LinkStates(self.journal)  # the operator's (journaled) and the switches'
        restore_before_first_round(self)
        self.resuming = {cid: e for cid, e in self.journal.live.items() if e.resumable}
        if self.resuming:
            LOG.info("%d coflows of the journal resume once their agents register",
                     len(self.resuming))  # fmt: skip

    def now(self) -> float:
        """Seconds since the controller started; while a core event is handled, the event's
        time (core_log.py: a handler reads the time once)."""
        if self.event_at is not None:
            return self.event_at
        return self.clock() - self.t0

    def want_round(self, wan: bool = False) -> None:
        """Ask for a scheduling round (run by RoundRunner, or by `run_round` directly)."""
        self.owner.run(self._want_round, wan)

    def _want_round(self, wan: bool) -> None:
        if wan:
            if not self.wan_dirty:
                self.wan_event_at = time.monotonic()
            self.wan_dirty = True
        self.round_wanted = True
        emit(self, AskRound(wan))

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
        agents = self.owner.run(lambda: dict(self.registry.agents))
        sub = Submission(files.apply(self.registry.parse_flows(flows, agents=agents)),
                          check_deadline(deadline), 0.0 if age_s is None else check_age(age_s),
                          check_labels(name, tags), new_secret())  # fmt: skip
        if coflow_id is not None:
            check_coflow_id(coflow_id, MAX_CLIENT_ID)
        cid, coflow = self.owner.run_with_policy(
            self._submit_on_loop, flows, files, agents, sub, coflow_id, owner, ref
        )
        if coflow is not None:
            self._durable(cid)
            self._announce(coflow, sub.parsed)  # off the loop: descriptors of many flows
        return cid

    @core_event("submit", encode=recorded_submit, outcome=lambda r: r[0])
    def _submit_on_loop(self, flows, files: FileInfo, agents: dict, sub: Submission,
                        coflow_id: int | None, owner: str | None,
                        ref: str | None) -> tuple[int, CoflowState | None]:  # fmt: skip
        """The part of `submit` on the loop, holding the policy: the checks against the
        registry, the admission and the insert. Returns (the id to answer, the coflow when
        it was stored with flows to announce, else None)."""
        with observe_solves_lazily(self.metrics.lp_solve.observe):
            self._drain_leaving()
            reg = self.registry
            if reg.agents != agents:  # an agent (re-)registered meanwhile: check again
                sub.parsed = files.apply(reg.parse_flows(flows))
            if coflow_id is not None:
                known = self._known_resubmission(coflow_id, sub, owner)
                if known is not None:
                    return known, None
            assign_keys(sub.secret, sub.parsed)
            reg.check_sinks(sub.parsed)
            reg.check_open_flows(owner, len(sub.parsed))
            cid = reg.new_id() if coflow_id is None else coflow_id
            now = self.now()
            if sub.age and sub.deadline_s is not None:
                sub.deadline_s += sub.age  # relative to the arrival: still `deadline` s from now
            if not self._admitted(cid, coflow_id is None, sub, owner, now):
                return -1, None
            coflow = self._store(cid, sub, owner, ref, now)
            if coflow is None:  # intra-DC flows only: done at once
                return cid, None
            self.want_round()
            return cid, coflow

    def _known_resubmission(self, coflow_id: int, sub: Submission, owner: str | None):
        """A submit naming `coflow_id` (on the loop, holding the policy): the id to answer
        when the coflow is
        known already (in memory, or ended before a restart), else None; a coflow of the
        journal waiting to be resumed gets its keys, flow attempts and labels back in `sub`.

        Raises:
            RegistryError("bad_request"): another client's coflow id.
        """
        reg = self.registry
        if coflow_id in reg.coflows:
            assign_keys(sub.secret, sub.parsed)
            return self._resubmitted(reg.coflows[coflow_id], sub.parsed, owner)
        entry = self.journal.live.get(coflow_id)
        if entry is None:
            return None
        if entry.owner != owner:
            raise RegistryError("bad_request", f"coflow id {coflow_id} is in use")
        if entry.ended is not None:
            return coflow_id  # it ended before a restart: its status says how
        sub.secret, sub.attempts = entry.secret, dict(entry.attempts)  # the same keys again
        if sub.labels == (None, ()):
            sub.labels = (entry.name, entry.tags)
        return None

    def _admitted(self, cid: int, new_id: bool, sub: Submission, owner: str | None,
                  now: float) -> bool:  # fmt: skip
        """The policy's admission of a coflow with WAN flows (on the loop, holding the
        policy; always True
        without): tenant limits, then `policy.add_coflow` (docs/design.md 4.3). A rejected
        coflow's id is burned (the policy may remember it) and counted.

        Raises:
            RegistryError("no_path"): the flows cannot be routed; tenants.py's errors.
        """
        if all(f.intra_dc or f.done for f in sub.parsed):
            return True
        policy_flows = [to_policy_flow(f) for f in sub.parsed if not f.done]
        probe = Coflow(coflow_key(cid), now - sub.age, policy_flows, sub.deadline_s)
        tenant_admission(self, probe, owner)  # tenants.py: its limits (tenant_limit)
        try:
            admitted = self.policy.add_coflow(probe, now)
        except ValueError as exc:
            raise RegistryError("no_path", f"coflow cannot be routed: {exc}") from exc
        if not admitted:
            if new_id and self.registry.next_id <= cid:
                self.registry.next_id = cid + 1
            self.journal.burned(cid)
            self.stats["rejected"] += 1
            self.metrics.rejected.inc()
            self.events.add("rejected", coflow=cid, reason="deadline cannot be met")
        return admitted

    def _store(self, cid: int, sub: Submission, owner: str | None, ref: str | None,
               now: float) -> CoflowState | None:  # fmt: skip
        """Record an admitted coflow (on the loop, holding the policy): registry, journal,
        metrics, events.
        Returns it, or None when it is done at once (intra-DC flows only)."""
        coflow = self.registry.submit(sub.parsed, sub.deadline_s, now - sub.age, cid, owner,
                                      sub.secret, keyed=True, labels=sub.labels)  # fmt: skip
        for fid, attempt in sub.attempts.items():  # flows restarted before a restart
            if fid in coflow.flows:
                coflow.flows[fid].restarts = attempt
                coflow.flows[fid].digest_key = flow_key(sub.secret, fid, attempt)
        self.journal.admitted(cid, owner, coflow.secret, sub.labels, flow_rows(sub.parsed),
                              sub.deadline_s, time.time() - sub.age, ref)  # fmt: skip
        self.resuming.pop(cid, None)
        self.metrics.admitted.inc()
        self.events.add("admitted", coflow=cid, flows=len(sub.parsed), owner=owner)
        if not self.registry.finish_if_done(coflow, now):
            return coflow
        self.journal.ended(cid, ended_summary(coflow))
        self.metrics.finished.labels(CoflowStatus.DONE.value).inc()
        self.events.add("done", coflow=cid, cct_s=coflow.cct_s)
        self.metrics.bytes_delivered.inc(coflow.bytes_total)
        self._prune(now)
        return None

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
        return self.owner.run(self.journal.by_ref, owner, ref)

    def coflows_of(self, owner: str | None) -> set[int]:
        """Ids of the coflows in memory that `owner` submitted."""
        return self.owner.run(
            lambda: {cid for cid, c in self.registry.coflows.items() if c.owner == owner}
        )

    def close(self) -> None:
        """Close the coflow journal's file and stop the loop (the controller is stopping)."""
        if self.owner.running:
            self.owner.run(self.journal.close)
        self.owner.stop()

    def owner_of(self, coflow_id: object) -> tuple[bool, str | None]:
        """(known, owner name) of a coflow id: known when the coflow is in memory or in the
        journal (not yet forgotten); owner None for in-process submits."""
        if isinstance(coflow_id, bool) or not isinstance(coflow_id, int):
            return (False, None)

        def known() -> tuple[bool, str | None]:
            coflow = self.registry.coflows.get(coflow_id)
            if coflow is not None:
                return (True, coflow.owner)
            return self.journal.owner(coflow_id)

        return self.owner.run(known)

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

        def agents_now() -> dict:
            self.registry.get(coflow_id)  # an unknown coflow is the first thing to say
            return dict(self.registry.agents)

        agents = self.owner.run(agents_now)
        flows, _ = self._resolve_files(flows, False)  # sizes, directories and globs
        parsed = self.registry.parse_flows(flows, agents=agents)
        coflow, parsed = self.owner.run_with_policy(
            self._update_on_loop, coflow_id, flows, agents, parsed
        )
        self._durable(coflow.id)
        self._announce(coflow, parsed)

    @core_event("update", encode=lambda c, cid, flows, *_: [cid, flows], outcome=lambda r: None)
    def _update_on_loop(
        self, coflow_id: object, flows: object, agents: dict, parsed: list[FlowState]
    ) -> tuple[CoflowState, list[FlowState]]:
        """The part of `update` on the loop, holding the policy: the checks, the policy's
        new flows and the registry's. Returns (the coflow, its new flows)."""
        with observe_solves_lazily(self.metrics.lp_solve.observe):
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
            return coflow, parsed

    def _delivered(self, coflow_id: int, flow: FlowState, nbytes: int) -> None:
        """Count `nbytes` newly acknowledged bytes of `flow` (on the loop): the bytes counter
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

    def status(self, coflow_id: object) -> dict:
        """checkStatus: the coflow's status map plus each flow's current "rate_bytes_per_s".

        Raises:
            RegistryError("unknown_coflow").
        """
        return self.owner.run(self._status_on_loop, coflow_id)

    def _status_on_loop(self, coflow_id: object) -> dict:
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
        restart, or waiting to be resumed), else None (on the loop)."""
        if isinstance(coflow_id, bool) or not isinstance(coflow_id, int):
            return None
        if coflow_id in self.registry.coflows:
            return None
        return self.journal.live.get(coflow_id)

    def journal_only_statuses(self, owner: str | None = None, every: bool = False) -> list[dict]:
        """Status maps (journal_status) of the coflows known only from the journal: ended
        before this controller's start (a restart or a failover) or waiting to be resumed,
        by id; only `owner`'s unless `every`."""
        return self.owner.run(
            lambda: [
                self._journal_status(cid)
                for cid, entry in sorted(self.journal.live.items())
                if cid not in self.registry.coflows and (every or entry.owner == owner)
            ]
        )

    def _journal_status(self, coflow_id: int) -> dict:
        """journal_status of a coflow known only from the journal (on the loop)."""
        entry = self.journal.live[coflow_id]
        waiting = None
        if entry.ended is None:
            missing = missing_agents(entry, self.registry.agents)
            waiting = "resuming after a controller restart" + (
                f": waiting for agents {', '.join(missing)}" if missing else ""
            )
        return journal_status(coflow_id, entry, waiting)

    def register_agent(self, agent_id: object, dc: object, data_addr: object) -> AgentInfo:
        """Record (or re-record) an agent (CoflowRegistry.register_agent, on the loop).

        Raises:
            RegistryError("bad_request"): a bad id or address, or an unknown DC.
        """
        return self.owner.run(self._register_agent_on_loop, agent_id, dc, data_addr)

    @core_event("agent", outcome=lambda info: None)
    def _register_agent_on_loop(self, agent_id: object, dc: object, data_addr: object):
        return self.registry.register_agent(agent_id, dc, data_addr)

    def tenant_change(self, op: str, args: list) -> object:
        """A tenant change (`ctl tenant set|remove|reserve|unreserve`:
        tenant_api.apply_tenant_change) as a core event on the loop, then a wait for the
        shared store. Returns what the change returns.

        Raises:
            RegistryError: the change was refused (nothing changed).
        """
        result = self.owner.run(self._tenant_on_loop, op, args)
        if not self.journal.wait_durable():
            LOG.warning("tenants: not yet in the shared state")
        return result

    @core_event("tenant", outcome=lambda row: None)
    def _tenant_on_loop(self, op: str, args: list) -> object:
        from terra_controller.tenant_api import apply_tenant_change

        return apply_tenant_change(self, op, args)

    # ---- agent reports ------------------------------------------------------------------

    def check_report(self, flow: FlowState, tag: object) -> None:
        """Accept an agent's report about `flow` only with its current attempt's tag (on the
        loop); tag None: an in-process caller, not checked.

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
        return self.owner.run(self._progress_on_loop, coflow_id, flow_id, acked, tag)

    @core_event("progress")
    def _progress_on_loop(
        self, coflow_id: object, flow_id: object, acked: object, tag: object
    ) -> bool:
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
        return self.owner.run(self._complete_on_loop, coflow_id, flow_id, digest, tag, sha256)

    @core_event("complete")
    def _complete_on_loop(self, coflow_id: object, flow_id: object, digest: object, tag: object,
                          sha256: object) -> bool:  # fmt: skip
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
