"""The controller's coflow state: ids, flows, agents, progress, states and CCTs.

The registry is the controller's truth about what job masters submitted
(docs/design.md sections 4.3 and 6): coflow ids, flows with their agent endpoints
mapped to DCs, per-flow bytes total and delivered, coflow states
(`CoflowStatus`: queued, running, preempted, done, rejected, failed, cancelled),
flow states (`FlowStatus`) and CCTs. Every request is validated in full before
anything changes: a bad request raises `RegistryError` and leaves the registry
exactly as it was.

Finished coflows (done, failed, cancelled) are kept for status requests until
`prune_finished` drops the oldest beyond a count or an age; a status request
for a dropped coflow then answers "unknown_coflow".

Times are seconds on the controller's clock (whatever `now` the caller passes).
"""

from __future__ import annotations

import hashlib
import hmac
import math
import posixpath
import secrets
import struct
from collections import OrderedDict
from dataclasses import dataclass, field

from terra_model import Coflow, Flow
from terra_model.states import FINAL_STATES, MAX_COFLOW_ID, CoflowStatus, FlowStatus
from terra_wire.api_session import label_error
from terra_wire.control import report_tag

SECRET_BYTES = 16  # a coflow's secret, from which its flows' per-attempt keys are derived
MAX_REASON_CHARS = 1024  # failure reasons kept (longer ones are cut)
MAX_FLOW_BYTES = 1 << 50  # 1 PiB: far above any real flow, below float rounding trouble
MAX_FLOWS_PER_REQUEST = 100_000
MAX_OPEN_FLOWS = 1_000_000  # flows of unfinished coflows per job client
MAX_ID_CHARS = 256
MAX_PATH_CHARS = 1024  # src_path / dst_path (relative to the agent's --data-root)


class RegistryError(ValueError):
    """A request is invalid (unknown coflow or agent, duplicate flow id, bad size, bad shape).

    Attributes:
        code: short machine-readable reason ("unknown_coflow", "unknown_agent",
            "duplicate_flow", "bad_size", "bad_request", "coflow_done" (the coflow is
            already done, failed, cancelled or rejected), "path_busy" (a flow's dst_path is
            the sink of another unfinished flow at that agent), "too_many_flows" (the job
            client has MAX_OPEN_FLOWS flows in unfinished coflows), "stale_attempt" (an
            agent's report does not carry the tag of the flow's current attempt)).
    """

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


@dataclass
class AgentInfo:
    """A registered agent: id, DC and data address ("host:port")."""

    id: str
    dc: str
    data_addr: str = ""


@dataclass
class FlowState:
    """One flow of a coflow as the controller tracks it.

    Attributes:
        id: flow id (unique within the coflow).
        src_agent, dst_agent: agent ids; src_dc, dst_dc: their DCs.
        bytes: size in bytes (> 0). delivered: bytes acknowledged by the receiver.
        state: FlowStatus; `done` is state == done (completion reported, or an intra-DC
            flow of a finished coflow).
        digest: the receiver's digest (hex) once done.
        reason: why the flow failed / was cancelled (None otherwise).
        restarts: times the flow was restarted from byte 0 after a digest mismatch (the
            flow descriptors' "attempt").
        src_path, dst_path: optional file paths at the sender / receiver agent, relative to
            that agent's data root (terra-agent --data-root); see check_path.
        sha256: hex SHA-256 of a file flow's bytes as its receiver got them (or, skipped,
            of the file already there), else None. skipped: a sync coflow's flow whose
            destination already held the same bytes: done without being sent.
        digest_key: the current attempt's flow key (64 hex chars, terra_security/integrity.py): sent
            to the flow's two agents only; a new one on every restart (derived from its
            coflow's secret, the attempt and the flow id: see `flow_key`).
    """

    id: str
    src_agent: str
    dst_agent: str
    src_dc: str
    dst_dc: str
    bytes: int
    delivered: int = 0
    state: FlowStatus = FlowStatus.QUEUED
    digest: str | None = None
    src_path: str | None = None
    dst_path: str | None = None
    reason: str | None = None
    restarts: int = 0
    sha256: str | None = None
    skipped: bool = False
    digest_key: str = field(default="", repr=False)  # set by the registry (`assign_keys`)

    @property
    def done(self) -> bool:
        """True once the flow is done (all bytes delivered, digest matched)."""
        return self.state is FlowStatus.DONE

    @property
    def ended(self) -> bool:
        """True once the flow is done, failed or cancelled."""
        return self.state not in (FlowStatus.QUEUED, FlowStatus.RUNNING)

    def check_tag(self, tag: object) -> None:
        """Accept an agent's report only with the current attempt's tag (terra_wire/control.py
        report_tag of `digest_key`).

        Raises:
            RegistryError("stale_attempt"): `tag` is missing or belongs to another attempt
                (an earlier one, or a flow with the same ids before a controller restart).
        """
        want = report_tag(self.digest_key)
        if not isinstance(tag, str) or not hmac.compare_digest(tag.encode(), want.encode()):
            raise RegistryError(
                "stale_attempt", f"flow {self.id}: report not about its current attempt"
            )

    @property
    def intra_dc(self) -> bool:
        """True when both endpoints are in the same DC (the flow does not use the WAN)."""
        return self.src_dc == self.dst_dc

    @property
    def remaining(self) -> int:
        """Bytes not yet acknowledged (0 once done)."""
        return 0 if self.done else max(0, self.bytes - self.delivered)

    def to_dict(self) -> dict:
        """Return the flow's progress as a plain dict (for status replies and REST).

        Shape: {"id", "src", "dst", "src_dc", "dst_dc", "bytes", "bytes_delivered", "done",
        "digest", "state" (FlowStatus value), "reason" (str or None), "restarts", "sha256"
        (hex or None), "skipped" (bool)}.
        """
        return {
            "id": self.id,
            "src": self.src_agent,
            "dst": self.dst_agent,
            "src_dc": self.src_dc,
            "dst_dc": self.dst_dc,
            "bytes": self.bytes,
            "bytes_delivered": self.bytes if self.done else self.delivered,
            "done": self.done,
            "digest": self.digest,
            "state": self.state.value,
            "reason": self.reason,
            "restarts": self.restarts,
            "sha256": self.sha256,
            "skipped": self.skipped,
        }


@dataclass
class CoflowState:
    """One coflow as the controller tracks it.

    Attributes:
        id: integer coflow id (0..MAX_COFLOW_ID). submitted_s: arrival time (s, controller
            clock; a resubmission after a controller restart keeps its first submission's,
            so it may be negative).
        deadline_s: deadline relative to submitted_s (s) or None.
        flows: flow id -> FlowState, in submission order.
        state: a CoflowStatus. finished_s: time the last WAN byte was delivered (done only).
        reason: why the coflow failed or was cancelled (None otherwise).
        ended_s: time it reached a final state (done, failed, cancelled), else None.
        owner: name of the job client that submitted it (None: submitted in-process).
        secret: SECRET_BYTES random bytes; its flows' attempt keys derive from them
            (`flow_key`); a resubmission after a controller restart gets the same back
            from the controller's journal, so reports of the agents' attempts still match.
        name, tags: the submitter's label (None) and tags (()) for people and tools
            (check_labels); kept in the journal with the owner.
    """

    id: int
    submitted_s: float
    deadline_s: float | None = None
    flows: dict[str, FlowState] = field(default_factory=dict)
    state: CoflowStatus = CoflowStatus.QUEUED
    finished_s: float | None = None
    reason: str | None = None
    ended_s: float | None = None
    owner: str | None = None
    secret: bytes = field(default_factory=lambda: new_secret(), repr=False)
    name: str | None = None
    tags: tuple[str, ...] = ()

    @property
    def cct_s(self) -> float | None:
        """Coflow completion time in seconds (None until done)."""
        return None if self.finished_s is None else self.finished_s - self.submitted_s

    @property
    def bytes_total(self) -> int:
        """Sum of all flow sizes in bytes."""
        return sum(f.bytes for f in self.flows.values())

    @property
    def bytes_delivered(self) -> int:
        """Sum of delivered bytes over all flows."""
        return sum(f.bytes if f.done else f.delivered for f in self.flows.values())

    @property
    def wan_done(self) -> bool:
        """True when every WAN flow is done (intra-DC flows do not count, docs/design.md 4.1)."""
        return all(f.done for f in self.flows.values() if not f.intra_dc)

    def status(self) -> dict:
        """Return the status map checkStatus answers (docs/design.md section 6).

        Shape: {"id", "state" (CoflowStatus value), "reason" (why it failed / was cancelled,
        else None), "bytes_total", "bytes_delivered", "cct_s" (None until done), "deadline_s",
        "name" (None if unnamed), "tags" (list), "flows": [FlowState.to_dict()]}.
        """
        return self.summary() | {"flows": [f.to_dict() for f in self.flows.values()]}

    def summary(self) -> dict:
        """The status map without "flows" (listings, REST /coflows, snapshots)."""
        return {
            "id": self.id,
            "state": self.state.value,
            "reason": self.reason,
            "bytes_total": self.bytes_total,
            "bytes_delivered": self.bytes_delivered,
            "cct_s": self.cct_s,
            "deadline_s": self.deadline_s,
            "name": self.name,
            "tags": list(self.tags),
        }

    def to_policy_coflow(self, flows: list[FlowState] | None = None) -> Coflow:
        """Return the scheduler's view: a `Coflow` with DC endpoints (id = coflow_key(id))."""
        chosen = list(self.flows.values()) if flows is None else flows
        return Coflow(
            coflow_key(self.id),
            self.submitted_s,
            [to_policy_flow(f) for f in chosen],
            self.deadline_s,
        )


def named_agents(flows: object) -> set[str]:
    """The agent ids a submit's `flows` ([{"src", "dst", ...}]) name, as far as they are
    strings in maps of a list of at most MAX_FLOWS_PER_REQUEST items; anything else names
    none (parse_flows refuses it later)."""
    if not isinstance(flows, list) or len(flows) > MAX_FLOWS_PER_REQUEST:
        return set()
    return {
        item[key]
        for item in flows
        if isinstance(item, dict)
        for key in ("src", "dst")
        if isinstance(item.get(key), str)
    }


def new_secret() -> bytes:
    """A new coflow secret: SECRET_BYTES bytes from the OS CSPRNG."""
    return secrets.token_bytes(SECRET_BYTES)


def flow_key(secret: bytes, flow_id: str, attempt: int) -> str:
    """A flow attempt's key (64 hex chars): HMAC-SHA256(the coflow's secret, u64be(attempt) |
    flow id), unpredictable without the secret and different for every attempt."""
    message = struct.pack(">Q", attempt) + flow_id.encode()
    return hmac.digest(secret, message, hashlib.sha256).hex()


def assign_keys(secret: bytes, flows: list[FlowState]) -> None:
    """Set every flow's digest_key for its current attempt from its coflow's secret."""
    pack, digest, sha256 = struct.Struct(">Q").pack, hmac.digest, hashlib.sha256
    for f in flows:
        f.digest_key = digest(secret, pack(f.restarts) + f.id.encode(), sha256).hex()


def sink_key(flow: FlowState) -> tuple[str, str] | None:
    """(dst agent, normalized dst_path) of a flow writing a file, else None."""
    if flow.dst_path is None:
        return None
    return (flow.dst_agent, posixpath.normpath(flow.dst_path))


def to_policy_flow(flow: FlowState) -> Flow:
    """Return the scheduler's `Flow` (DC endpoints, bytes) for a tracked flow."""
    return Flow(flow.id, flow.src_dc, flow.dst_dc, float(flow.bytes))


class CoflowRegistry:
    """All coflows and agents the controller knows about.

    Args:
        dcs: DC names of the topology (agents must register in one of them).

    Coflow ids are integers assigned in submission order from `next_id` (0, or where the
    controller's journal says the last run stopped), never reused; a resubmission after a
    controller restart may ask for its old id; clients may ask for ids up to MAX_CLIENT_ID.

    A file path at an agent is the sink of one unfinished flow at a time (`sinks`).

    Attributes:
        agents: {agent id: AgentInfo}. coflows: {coflow id: CoflowState}, active and
            finished ones still kept. finished: ids of finished coflows, oldest end first.
        dropped: {final state value: finished coflows dropped by prune_finished}.
        kept: {final state value: finished coflows still in memory} (state counts without
            walking `coflows`).
        sinks: {(dst agent, normalized dst_path): (coflow id, flow id)} of unfinished flows.
        open_flows: {owner: flows of its unfinished coflows} (owner None: in-process).
    """

    def __init__(self, dcs: list[str]) -> None:
        self.dcs = list(dcs)
        self.agents: dict[str, AgentInfo] = {}
        self.coflows: dict[int, CoflowState] = {}
        self.next_id = 0
        # {coflow id: {flow id: bytes left}} of unfinished WAN flows with bytes left,
        # kept up to date by every change so that `remaining` is a cheap copy.
        self._left: dict[int, dict[str, float]] = {}
        self._open: dict[int, CoflowState] = {}  # coflows not in a final state
        self.finished: OrderedDict[int, None] = OrderedDict()
        self.dropped: dict[str, int] = {s.value: 0 for s in FINAL_STATES}
        self.kept: dict[str, int] = {s.value: 0 for s in FINAL_STATES}
        self.sinks: dict[tuple[str, str], tuple[int, str]] = {}
        self.open_flows: dict[str | None, int] = {}
        # {coflow id: {(src DC, dst DC): WAN flows not done}}: FlowGroup and coflow completion
        # without walking every flow of a many-flow coflow at each completion
        self.undone: dict[int, dict[tuple[str, str], int]] = {}

    # ---- agents -------------------------------------------------------------------------

    def register_agent(self, agent_id: object, dc: object, data_addr: object = "") -> AgentInfo:
        """Record (or re-record) an agent in a DC.

        Raises:
            RegistryError("bad_request"): empty/non-string id or address, an id or address
                longer than MAX_ID_CHARS, or unknown DC.
        """
        agent_id = check_id(agent_id, "agent")
        if not isinstance(dc, str) or dc not in self.dcs:
            raise RegistryError("bad_request", f"agent {agent_id}: unknown DC {dc!r}")
        if not isinstance(data_addr, str) or len(data_addr) > MAX_ID_CHARS:
            raise RegistryError(
                "bad_request", f"agent {agent_id}: data_addr must be a string of <= 256 chars"
            )
        info = AgentInfo(agent_id, dc, data_addr)
        self.agents[agent_id] = info
        return info

    # ---- requests -----------------------------------------------------------------------

    def parse_flows(
        self,
        flows: object,
        existing: dict[str, FlowState] | None = None,
        agents: dict[str, AgentInfo] | None = None,
    ) -> list:
        """Validate a request's flows and return them as new FlowStates (nothing is stored).

        Args:
            flows: list of {"id": str|int, "src": agent id, "dst": agent id, "bytes": int > 0,
                "src_path"?: str, "dst_path"?: str} (paths relative to the agents' data
                roots, checked by check_path); at most MAX_FLOWS_PER_REQUEST.
            existing: flows already in the coflow (ids must not repeat them).
            agents: the agents to check endpoints against (default `self.agents`; a copy
                lets a caller parse without holding the controller's lock).

        Raises:
            RegistryError: "bad_request" (not a list, empty, too many, not a map, bad field
                types, a bad src_path / dst_path, a file flow within one DC),
                "duplicate_flow", "unknown_agent", "bad_size", "path_busy" (two flows of the
                request write the same file).
        """
        if not isinstance(flows, list) or not flows:
            raise RegistryError("bad_request", "flows must be a non-empty list")
        if len(flows) > MAX_FLOWS_PER_REQUEST:
            raise RegistryError("bad_request", f"more than {MAX_FLOWS_PER_REQUEST} flows")
        agents = self.agents if agents is None else agents
        seen = set(existing or ())
        sinks: set[tuple[str, str]] = set()
        parsed = []
        for i, item in enumerate(flows):
            flow = self._parse_flow(item, f"flows[{i}]", agents)
            if flow.id in seen:
                raise RegistryError("duplicate_flow", f"flows[{i}]: duplicate flow id {flow.id!r}")
            seen.add(flow.id)
            sink = sink_key(flow)
            if sink is not None:
                if sink in sinks:
                    raise RegistryError(
                        "path_busy", f"flows[{i}]: another flow of the request writes {sink[1]!r}"
                    )
                sinks.add(sink)
            parsed.append(flow)
        return parsed

    def check_sinks(self, flows: list[FlowState]) -> None:
        """Refuse flows whose file is the sink of an unfinished flow already (nothing changes).

        Raises:
            RegistryError("path_busy"): names the path, its agent and the flow writing it.
        """
        for f in flows:
            sink = sink_key(f)
            holder = self.sinks.get(sink) if sink is not None else None
            if holder is not None:
                raise RegistryError(
                    "path_busy",
                    f"flow {f.id}: {sink[1]!r} at agent {sink[0]} is being written by flow "
                    f"{holder[0]}/{holder[1]}",
                )

    def check_open_flows(self, owner: str | None, adding: int) -> None:
        """Refuse `adding` more flows to a job client's unfinished coflows beyond MAX_OPEN_FLOWS.

        Raises:
            RegistryError("too_many_flows").
        """
        have = self.open_flows.get(owner, 0)
        if have + adding > MAX_OPEN_FLOWS:
            raise RegistryError(
                "too_many_flows",
                f"{have} flows of unfinished coflows plus {adding} is over {MAX_OPEN_FLOWS}",
            )

    def _parse_flow(self, item: object, where: str, agents: dict[str, AgentInfo]) -> FlowState:
        if not isinstance(item, dict):
            raise RegistryError("bad_request", f"{where}: must be a map")
        unknown = set(item) - {"id", "src", "dst", "bytes", "src_path", "dst_path"}
        if unknown:
            raise RegistryError("bad_request", f"{where}: unknown fields {sorted(unknown)}")
        fid = check_id(item.get("id"), f"{where}.id")
        ends = []
        for key in ("src", "dst"):
            agent = item.get(key)
            if not isinstance(agent, str) or agent not in agents:
                raise RegistryError("unknown_agent", f"{where}.{key}: unknown agent {agent!r}")
            ends.append(agents[agent])
        size = item.get("bytes")
        if isinstance(size, bool) or not isinstance(size, int):
            raise RegistryError("bad_size", f"{where}.bytes: must be an integer, got {size!r}")
        if not 0 < size <= MAX_FLOW_BYTES:
            raise RegistryError("bad_size", f"{where}.bytes: must be in 1..2**50, got {size}")
        paths = {
            key: check_path(item.get(key), f"{where}.{key}") for key in ("src_path", "dst_path")
        }
        src, dst = ends
        if src.dc == dst.dc and (paths["src_path"] or paths["dst_path"]):
            raise RegistryError(
                "bad_request",
                f"{where}: a file flow must cross DCs ({src.id} and {dst.id} are both in "
                f"{src.dc}): Terra moves file bytes between DCs only",
            )
        return FlowState(fid, src.id, dst.id, src.dc, dst.dc, size, **paths)

    def submit(
        self,
        flows: list[FlowState],
        deadline_s: float | None,
        now: float,
        coflow_id=None,
        owner: str | None = None,
        secret: bytes | None = None,
        keyed: bool = False,
        labels: tuple[str | None, tuple[str, ...]] = (None, ()),
    ) -> CoflowState:
        """Store a new coflow built from already parsed flows (see `parse_flows`).

        Args:
            deadline_s: seconds relative to `now`, > 0, or None.
            now: the coflow's arrival time (s, controller clock; earlier than the current
                time for a resubmission that keeps its first submission's arrival).
            coflow_id: ask for a specific id (resubmission after a controller restart).
            owner: the submitting job client's name (None: in-process).
            secret: the coflow's secret (a resubmission: the first submission's; None: new).
            keyed: the flows' keys are already derived from `secret` (assign_keys, done by
                the caller outside its locks).
            labels: (name, tags) as check_labels returns them.

        Returns:
            the new CoflowState (state "queued"); its flows get their attempt keys and
            their files (dst_path) become busy until they end.

        Raises:
            RegistryError("bad_request"): bad deadline, or the requested id is in use / not
                an integer in 0..MAX_COFLOW_ID, or no id is left.
            RegistryError("path_busy"): see check_sinks.
        """
        deadline_s = check_deadline(deadline_s)
        if coflow_id is None:
            coflow_id = self.new_id()
        check_coflow_id(coflow_id)
        if coflow_id in self.coflows:
            raise RegistryError("bad_request", f"coflow id {coflow_id} is in use")
        self.check_sinks(flows)
        coflow = CoflowState(coflow_id, now, deadline_s, {f.id: f for f in flows}, owner=owner,
                             name=labels[0], tags=labels[1])  # fmt: skip
        if secret is not None:
            coflow.secret = secret
        if not keyed:
            assign_keys(coflow.secret, flows)
        self.coflows[coflow_id] = coflow
        self._open[coflow_id] = coflow
        self._adopt(coflow, flows)
        self.next_id = max(self.next_id, coflow_id + 1)
        return coflow

    def new_id(self) -> int:
        """The id a new coflow gets: `next_id` (ids are never reused).

        Raises:
            RegistryError("bad_request"): every id was used (2**63 of them).
        """
        if self.next_id > MAX_COFLOW_ID:
            raise RegistryError("bad_request", "no coflow id left")
        return self.next_id

    def get(self, coflow_id: object) -> CoflowState:
        """Return a coflow by id.

        Raises:
            RegistryError("unknown_coflow"): no such coflow (or not an integer id).
        """
        if isinstance(coflow_id, bool) or not isinstance(coflow_id, int):
            raise RegistryError("unknown_coflow", f"unknown coflow {coflow_id!r}")
        coflow = self.coflows.get(coflow_id)
        if coflow is None:
            raise RegistryError("unknown_coflow", f"unknown coflow {coflow_id!r}")
        return coflow

    def add_flows(self, coflow: CoflowState, flows: list[FlowState]) -> None:
        """Append parsed flows to an unfinished coflow (updateCoflow).

        Raises:
            RegistryError("coflow_done"): the coflow already finished (done, failed, ...).
            RegistryError("duplicate_flow"): a flow id already in the coflow.
        """
        if coflow.state.final:
            raise RegistryError("coflow_done", f"coflow {coflow.id} already finished")
        for f in flows:
            if f.id in coflow.flows:
                raise RegistryError("duplicate_flow", f"duplicate flow id {f.id!r}")
        self.check_sinks(flows)
        assign_keys(coflow.secret, flows)
        for f in flows:
            coflow.flows[f.id] = f
        self._adopt(coflow, flows)

    def _adopt(self, coflow: CoflowState, flows: list[FlowState]) -> None:
        """Give new flows of `coflow` their busy sinks and bytes to schedule."""
        cid, sinks = coflow.id, self.sinks
        undone = self.undone.setdefault(cid, {})
        for f in flows:
            if not f.intra_dc and not f.done:
                pair = (f.src_dc, f.dst_dc)
                undone[pair] = undone.get(pair, 0) + 1
                if f.dst_path is not None:
                    sinks[sink_key(f)] = (cid, f.id)
        self.open_flows[coflow.owner] = self.open_flows.get(coflow.owner, 0) + len(flows)
        self._track(coflow, flows)

    def _release(self, coflow_id: int, flow: FlowState) -> None:
        """The flow ended: its file (dst_path) is free for another flow."""
        if flow.dst_path is not None:
            key = sink_key(flow)
            if self.sinks.get(key) == (coflow_id, flow.id):
                del self.sinks[key]

    def _track(self, coflow: CoflowState, flows: list[FlowState]) -> None:
        left = {
            f.id: float(f.bytes - f.delivered)
            for f in flows
            if f.src_dc != f.dst_dc and f.state is not FlowStatus.DONE and f.bytes > f.delivered
        }
        if left:
            self._left.setdefault(coflow.id, {}).update(left)

    def _untrack(self, coflow_id: int, flow: FlowState) -> None:
        left = self._left.get(coflow_id)
        if left is None:
            return
        if flow.remaining > 0:
            if flow.id in left:
                left[flow.id] = float(flow.remaining)
            return
        left.pop(flow.id, None)
        if not left:
            del self._left[coflow_id]

    # ---- progress -----------------------------------------------------------------------

    def flow(self, coflow_id: object, flow_id: object) -> FlowState:
        """Return one flow.

        Raises:
            RegistryError("unknown_coflow" / "unknown_flow").
        """
        coflow = self.get(coflow_id)
        flow = coflow.flows.get(str(flow_id)) if isinstance(flow_id, str | int) else None
        if flow is None:
            raise RegistryError("unknown_flow", f"coflow {coflow.id}: unknown flow {flow_id!r}")
        return flow

    def record_progress(self, coflow_id: object, flow_id: object, acked: object) -> FlowState:
        """Record that the receiver acknowledged `acked` bytes of a flow (never goes back).

        Raises:
            RegistryError: unknown coflow/flow, or `acked` not an integer in 0..size.
        """
        flow = self.flow(coflow_id, flow_id)
        if isinstance(acked, bool) or not isinstance(acked, int) or not 0 <= acked <= flow.bytes:
            raise RegistryError("bad_request", f"flow {flow.id}: bad acked offset {acked!r}")
        if flow.state is not FlowStatus.QUEUED and flow.state is not FlowStatus.RUNNING:
            return flow  # done, failed or cancelled: a late report changes nothing
        flow.delivered = max(flow.delivered, acked)
        if flow.delivered > 0:
            flow.state = FlowStatus.RUNNING
        self._untrack(int(coflow_id), flow)
        return flow

    def record_complete(
        self, coflow_id: object, flow_id: object, digest: object, now: float
    ) -> CoflowState:
        """Mark a flow done; mark its coflow done (with `finished_s = now`) when its WAN part is.

        Returns:
            the flow's coflow (check `.state is CoflowStatus.DONE`).

        Raises:
            RegistryError: unknown coflow/flow.
        """
        flow = self.flow(coflow_id, flow_id)
        coflow = self.get(coflow_id)
        if coflow.state.final:
            return coflow  # failed / cancelled meanwhile: a late completion changes nothing
        undone = self.undone.get(coflow.id, {})
        pair = (flow.src_dc, flow.dst_dc)
        if not flow.done and pair in undone and not flow.intra_dc:
            undone[pair] -= 1
        flow.state = FlowStatus.DONE
        flow.delivered = flow.bytes
        flow.digest = digest if isinstance(digest, str) else None
        self._untrack(int(coflow_id), flow)
        self._release(coflow.id, flow)
        self.finish_if_done(coflow, now)
        return coflow

    def finish_if_done(self, coflow: CoflowState, now: float) -> bool:
        """Mark `coflow` done at `now` if every WAN flow is done; intra-DC flows count as done.

        Returns:
            True when the coflow became done by this call.
        """
        if coflow.state.final or any(self.undone.get(coflow.id, {}).values()):
            return False
        for f in coflow.flows.values():
            if f.intra_dc:
                f.state = FlowStatus.DONE
                f.delivered = f.bytes
        coflow.state = CoflowStatus.DONE
        self._left.pop(coflow.id, None)
        coflow.finished_s = now
        self._ended(coflow, now)
        return True

    def end(
        self,
        coflow: CoflowState,
        state: CoflowStatus,
        reason: str,
        now: float,
        culprit: FlowState | None = None,
    ) -> list[FlowState]:
        """Put an unfinished coflow in a final state other than done (failed or cancelled).

        Every flow not done becomes failed (`culprit`, the flow that could not run, with
        `reason`) or cancelled (the others, and all of them for a cancelled coflow); the
        coflow no longer appears in `remaining`.

        Args:
            state: CoflowStatus.FAILED or CoflowStatus.CANCELLED.
            reason: why (kept, cut to MAX_REASON_CHARS characters).
            now: seconds, controller clock (ended_s).

        Returns:
            the WAN flows that were not done (their agents are told to drop them).

        Raises:
            ValueError: `state` is not failed/cancelled, or the coflow is already final.
        """
        if state not in (CoflowStatus.FAILED, CoflowStatus.CANCELLED) or coflow.state.final:
            raise ValueError(f"coflow {coflow.id}: cannot go from {coflow.state} to {state}")
        reason = reason[:MAX_REASON_CHARS]
        unfinished = []
        for f in coflow.flows.values():
            if f.done:
                continue
            if not f.intra_dc:
                unfinished.append(f)
            if f is culprit:
                f.state, f.reason = FlowStatus.FAILED, reason
            else:
                f.state = FlowStatus.CANCELLED
                f.reason = f.reason or f"coflow {state.value}: {reason}"
        coflow.state, coflow.reason = state, reason
        self._left.pop(coflow.id, None)
        self._ended(coflow, now)
        return unfinished

    def restart_flow(self, coflow: CoflowState, flow: FlowState) -> None:
        """Start an unfinished flow again from byte 0 (after a digest mismatch): delivered
        goes back to 0, restarts grows by one and the flow's bytes are scheduled again.

        Raises:
            ValueError: the flow is done, failed or cancelled, or its coflow is final.
        """
        if coflow.state.final or flow.state not in (FlowStatus.QUEUED, FlowStatus.RUNNING):
            raise ValueError(f"flow {coflow.id}/{flow.id} cannot restart ({flow.state})")
        flow.delivered = 0
        flow.state = FlowStatus.QUEUED
        flow.restarts += 1
        # the old attempt's chunks, digest and reports match nothing
        flow.digest_key = flow_key(coflow.secret, flow.id, flow.restarts)
        self._track(coflow, [flow])

    def _ended(self, coflow: CoflowState, now: float) -> None:
        coflow.ended_s = now
        self.undone.pop(coflow.id, None)
        self._open.pop(coflow.id, None)
        for f in coflow.flows.values():
            self._release(coflow.id, f)
        left = self.open_flows.get(coflow.owner, 0) - len(coflow.flows)
        if left > 0:
            self.open_flows[coflow.owner] = left
        else:
            self.open_flows.pop(coflow.owner, None)
        self.finished[coflow.id] = None
        self.kept[coflow.state.value] = self.kept.get(coflow.state.value, 0) + 1

    def prune_finished(
        self, now: float, keep: int | None, keep_s: float | None = None
    ) -> list[CoflowState]:
        """Forget the oldest finished coflows beyond `keep` of them or older than `keep_s`.

        Args:
            now: seconds, controller clock.
            keep: finished coflows kept at most (None: no count bound).
            keep_s: seconds a finished coflow is kept after it ended (None: no age bound).

        Returns:
            the dropped coflows (counted in `dropped` per final state); status requests
            for them answer "unknown_coflow" from now on.
        """
        out = []
        while self.finished:
            cid = next(iter(self.finished))
            coflow = self.coflows.get(cid)
            too_many = keep is not None and len(self.finished) > keep
            too_old = (
                keep_s is not None
                and coflow is not None
                and coflow.ended_s is not None
                and now - coflow.ended_s > keep_s
            )
            if coflow is not None and not too_many and not too_old:
                break
            del self.finished[cid]
            if coflow is None:
                continue
            del self.coflows[cid]
            self._left.pop(cid, None)
            self.dropped[coflow.state.value] = self.dropped.get(coflow.state.value, 0) + 1
            self.kept[coflow.state.value] -= 1
            out.append(coflow)
        return out

    def state_counts(self) -> dict[str, int]:
        """{state value: coflows in memory in that state} (states with none left out);
        O(active coflows)."""
        out = {k: n for k, n in self.kept.items() if n}
        for coflow in self._open.values():
            out[coflow.state.value] = out.get(coflow.state.value, 0) + 1
        return out

    def active(self) -> list[CoflowState]:
        """Coflows not in a final state (in submission order)."""
        return list(self._open.values())

    def remaining(self, connected=None) -> dict[str, dict[str, float]]:
        """Return the policy's Remaining map: {str(coflow id): {flow id: bytes}}, WAN flows only.

        Args:
            connected: optional predicate (src DC, dst DC) -> bool; flows between DCs
                it rejects (cut off by link failures) are left out for now.

        Only unfinished flows with bytes left appear; coflows without any are left out.
        The maps are fresh copies (the caller may keep them).
        """
        if connected is None:
            return {coflow_key(cid): dict(left) for cid, left in self._left.items()}
        out = {}
        for cid, left in self._left.items():
            flows = self.coflows[cid].flows
            kept = {
                fid: b for fid, b in left.items() if connected(flows[fid].src_dc, flows[fid].dst_dc)
            }
            if kept:
                out[coflow_key(cid)] = kept
        return out


def check_id(value: object, where: str) -> str:
    """Return an id (non-empty str, or int) as a string.

    Raises:
        RegistryError("bad_request"): any other type, empty, or longer than MAX_ID_CHARS.
    """
    if isinstance(value, bool) or not isinstance(value, str | int):
        raise RegistryError("bad_request", f"{where}: id must be a string or integer")
    text = str(value)
    if not text or len(text) > MAX_ID_CHARS:
        raise RegistryError("bad_request", f"{where}: id must have 1..{MAX_ID_CHARS} characters")
    return text


def check_labels(name: object, tags: object) -> tuple[str | None, tuple[str, ...]]:
    """A submit's "name" and "tags" (terra_wire.api_session.label_error: a name of 1..128
    printable characters, at most 16 distinct tags of 1..64), as (name or None, tags).

    Raises:
        RegistryError("bad_request"): which bound is broken.
    """
    error = label_error(name, tags)
    if error is not None:
        raise RegistryError("bad_request", error)
    return (name if isinstance(name, str) else None), tuple(str(t) for t in tags or ())


def check_path(value: object, where: str) -> str | None:
    """Return a flow's src_path / dst_path (None when absent) after checking its shape.

    A path names a file relative to an agent's data root (terra-agent --data-root), which the
    agent resolves and keeps inside the root; here only its shape is checked.

    Raises:
        RegistryError("bad_request"): not a string, empty, longer than MAX_PATH_CHARS
            characters, a NUL byte, absolute (leading "/"), or a ".." component.
    """
    if value is None:
        return None
    if not isinstance(value, str) or not 0 < len(value) <= MAX_PATH_CHARS:
        raise RegistryError(
            "bad_request", f"{where}: must be a string of 1..{MAX_PATH_CHARS} chars"
        )
    if "\0" in value:
        raise RegistryError("bad_request", f"{where}: must not contain a NUL byte")
    if value.startswith("/"):
        raise RegistryError(
            "bad_request", f"{where}: must be relative to the agent's data root, got {value!r}"
        )
    if ".." in value.split("/"):
        raise RegistryError("bad_request", f"{where}: must not have a '..' component")
    return value


CoflowId = int  # the controller's one coflow id type: an int in 0..MAX_COFLOW_ID


def coflow_key(cid: CoflowId) -> str:
    """The id as the scheduling policy and the agents' control messages carry it: its
    decimal string (the policy's ids are strings because the simulator's workloads name
    coflows; the wire keeps ids opaque). The one conversion from CoflowId."""
    return str(cid)


def parse_coflow_key(key: object) -> CoflowId:
    """The CoflowId of a policy key or a coflow field of an agent's message (`coflow_key`'s
    inverse; the one conversion to CoflowId).

    Raises:
        RegistryError("unknown_coflow"): not the decimal string (ASCII digits) of an id in
            0..MAX_COFLOW_ID.
    """
    if isinstance(key, str) and key.isascii() and key.isdigit() and len(key) <= 19:
        cid = int(key)
        if cid <= MAX_COFLOW_ID:
            return cid
    raise RegistryError("unknown_coflow", f"unknown coflow {key!r}")


def check_coflow_id(value: object, top: int = MAX_COFLOW_ID) -> int:
    """Return a coflow id: an integer (not a bool) in 0..top (MAX_CLIENT_ID for ids a
    client asks for, so that ids never wrap).

    Raises:
        RegistryError("bad_request"): anything else.
    """
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= top:
        raise RegistryError(
            "bad_request", f"coflow id must be an integer in 0..{top}, got {value!r:.40}"
        )
    return value


def check_age(value: object) -> float:
    """Return a resubmitted coflow's age: seconds since its first submission (>= 0, finite).

    Raises:
        RegistryError("bad_request"): not a finite number >= 0.
    """
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise RegistryError("bad_request", f"age_s must be seconds (a number), got {value!r}")
    if not (_finite(value) and value >= 0):
        raise RegistryError("bad_request", f"age_s must be finite and >= 0, got {value!r:.40}")
    return float(value)


def _finite(value: int | float) -> bool:
    """True for a finite number that fits a float (a huge int does not)."""
    try:
        return math.isfinite(float(value))
    except OverflowError:
        return False


def check_deadline(value: object) -> float | None:
    """Return a deadline in seconds (> 0, finite) or None.

    Raises:
        RegistryError("bad_request"): not a positive finite number.
    """
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise RegistryError("bad_request", f"deadline must be seconds (a number), got {value!r}")
    if not (value > 0 and _finite(value)):
        raise RegistryError(
            "bad_request", f"deadline must be positive and finite, got {value!r:.40}"
        )
    return float(value)
