"""The controller's coflow state: ids, flows, agents, progress, states and CCTs.

The registry is the controller's truth about what job masters submitted
(DESIGN.md sections 4.3 and 6): coflow ids, flows with their agent endpoints
mapped to DCs, per-flow bytes total and delivered, coflow states (queued,
running, preempted, done, rejected) and CCTs. Every request is validated in
full before anything changes: a bad request raises `RegistryError` and leaves
the registry exactly as it was.

Times are seconds on the controller's clock (whatever `now` the caller passes).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from workloads import Coflow, Flow

STATES = ("queued", "running", "preempted", "done", "rejected")
MAX_FLOW_BYTES = 1 << 50  # 1 PiB: far above any real flow, below float rounding trouble
MAX_FLOWS_PER_REQUEST = 1_000_000
MAX_ID_CHARS = 256
MAX_PATH_CHARS = 4096  # src_path / dst_path


class RegistryError(ValueError):
    """A request is invalid (unknown coflow or agent, duplicate flow id, bad size, bad shape).

    Attributes:
        code: short machine-readable reason ("unknown_coflow", "unknown_agent",
            "duplicate_flow", "bad_size", "bad_request", "coflow_done").
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
        done: completion reported (or intra-DC flow of a finished coflow).
        digest: the receiver's digest (hex) once done.
        src_path, dst_path: optional file paths at the sender / receiver agent.
    """

    id: str
    src_agent: str
    dst_agent: str
    src_dc: str
    dst_dc: str
    bytes: int
    delivered: int = 0
    done: bool = False
    digest: str | None = None
    src_path: str | None = None
    dst_path: str | None = None

    @property
    def intra_dc(self) -> bool:
        """True when both endpoints are in the same DC (the flow does not use the WAN)."""
        return self.src_dc == self.dst_dc

    @property
    def remaining(self) -> int:
        """Bytes not yet acknowledged (0 once done)."""
        return 0 if self.done else max(0, self.bytes - self.delivered)

    def to_dict(self) -> dict:
        """Return the flow's progress as a plain dict (for status replies and REST)."""
        return {
            "id": self.id,
            "src": self.src_agent,
            "dst": self.dst_agent,
            "src_dc": self.src_dc,
            "dst_dc": self.dst_dc,
            "bytes": self.bytes,
            "delivered": self.bytes if self.done else self.delivered,
            "done": self.done,
            "digest": self.digest,
        }


@dataclass
class CoflowState:
    """One coflow as the controller tracks it.

    Attributes:
        id: integer coflow id (>= 0). submitted_s: submission time (s, controller clock).
        deadline_s: deadline relative to submission (s) or None.
        flows: flow id -> FlowState, in submission order.
        state: one of STATES. finished_s: time the last WAN byte was delivered.
    """

    id: int
    submitted_s: float
    deadline_s: float | None = None
    flows: dict[str, FlowState] = field(default_factory=dict)
    state: str = "queued"
    finished_s: float | None = None

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
        """True when every WAN flow is done (intra-DC flows do not count, DESIGN.md 4.1)."""
        return all(f.done for f in self.flows.values() if not f.intra_dc)

    def status(self) -> dict:
        """Return the status map checkStatus answers (DESIGN.md section 6).

        Shape: {"id", "state", "bytes_total", "bytes_delivered", "cct_s" (None until done),
        "deadline_s", "flows": [{"id","src","dst","src_dc","dst_dc","bytes","delivered",
        "done","digest"}]}.
        """
        return {
            "id": self.id,
            "state": self.state,
            "bytes_total": self.bytes_total,
            "bytes_delivered": self.bytes_delivered,
            "cct_s": self.cct_s,
            "deadline_s": self.deadline_s,
            "flows": [f.to_dict() for f in self.flows.values()],
        }

    def to_policy_coflow(self, flows: list[FlowState] | None = None) -> Coflow:
        """Return the scheduler's view: a `Coflow` with DC endpoints (id = str(self.id))."""
        chosen = list(self.flows.values()) if flows is None else flows
        return Coflow(
            str(self.id),
            self.submitted_s,
            [to_policy_flow(f) for f in chosen],
            self.deadline_s,
        )


def to_policy_flow(flow: FlowState) -> Flow:
    """Return the scheduler's `Flow` (DC endpoints, bytes) for a tracked flow."""
    return Flow(flow.id, flow.src_dc, flow.dst_dc, float(flow.bytes))


class CoflowRegistry:
    """All coflows and agents the controller knows about.

    Args:
        dcs: DC names of the topology (agents must register in one of them).

    Coflow ids are integers assigned in submission order from 0 (a resubmission
    after a controller restart may ask for its old id).
    """

    def __init__(self, dcs: list[str]) -> None:
        self.dcs = list(dcs)
        self.agents: dict[str, AgentInfo] = {}
        self.coflows: dict[int, CoflowState] = {}
        self.next_id = 0
        # {coflow id: {flow id: bytes left}} of unfinished WAN flows with bytes left,
        # kept up to date by every change so that `remaining` is a cheap copy.
        self._left: dict[int, dict[str, float]] = {}

    # ---- agents -------------------------------------------------------------------------

    def register_agent(self, agent_id: object, dc: object, data_addr: object = "") -> AgentInfo:
        """Record (or re-record) an agent in a DC.

        Raises:
            RegistryError("bad_request"): empty/non-string id or address, or unknown DC.
        """
        agent_id = check_id(agent_id, "agent")
        if not isinstance(dc, str) or dc not in self.dcs:
            raise RegistryError("bad_request", f"agent {agent_id}: unknown DC {dc!r}")
        if not isinstance(data_addr, str):
            raise RegistryError("bad_request", f"agent {agent_id}: data_addr must be a string")
        info = AgentInfo(agent_id, dc, data_addr)
        self.agents[agent_id] = info
        return info

    # ---- requests -----------------------------------------------------------------------

    def parse_flows(self, flows: object, existing: dict[str, FlowState] | None = None) -> list:
        """Validate a request's flows and return them as new FlowStates (nothing is stored).

        Args:
            flows: list of {"id": str|int, "src": agent id, "dst": agent id, "bytes": int > 0,
                "src_path"?: str, "dst_path"?: str}.
            existing: flows already in the coflow (ids must not repeat them).

        Raises:
            RegistryError: "bad_request" (not a list, empty, not a map, bad field types),
                "duplicate_flow", "unknown_agent", "bad_size".
        """
        if not isinstance(flows, list) or not flows:
            raise RegistryError("bad_request", "flows must be a non-empty list")
        if len(flows) > MAX_FLOWS_PER_REQUEST:
            raise RegistryError("bad_request", f"more than {MAX_FLOWS_PER_REQUEST} flows")
        seen = set(existing or ())
        parsed = []
        for i, item in enumerate(flows):
            flow = self._parse_flow(item, f"flows[{i}]")
            if flow.id in seen:
                raise RegistryError("duplicate_flow", f"flows[{i}]: duplicate flow id {flow.id!r}")
            seen.add(flow.id)
            parsed.append(flow)
        return parsed

    def _parse_flow(self, item: object, where: str) -> FlowState:
        if not isinstance(item, dict):
            raise RegistryError("bad_request", f"{where}: must be a map")
        unknown = set(item) - {"id", "src", "dst", "bytes", "src_path", "dst_path"}
        if unknown:
            raise RegistryError("bad_request", f"{where}: unknown fields {sorted(unknown)}")
        fid = check_id(item.get("id"), f"{where}.id")
        ends = []
        for key in ("src", "dst"):
            agent = item.get(key)
            if not isinstance(agent, str) or agent not in self.agents:
                raise RegistryError("unknown_agent", f"{where}.{key}: unknown agent {agent!r}")
            ends.append(self.agents[agent])
        size = item.get("bytes")
        if isinstance(size, bool) or not isinstance(size, int):
            raise RegistryError("bad_size", f"{where}.bytes: must be an integer, got {size!r}")
        if not 0 < size <= MAX_FLOW_BYTES:
            raise RegistryError("bad_size", f"{where}.bytes: must be in 1..2**50, got {size}")
        paths = {}
        for key in ("src_path", "dst_path"):
            value = item.get(key)
            if value is not None and (
                not isinstance(value, str) or not 0 < len(value) <= MAX_PATH_CHARS
            ):
                raise RegistryError(
                    "bad_request", f"{where}.{key}: must be a string of 1..{MAX_PATH_CHARS} chars"
                )
            paths[key] = value
        src, dst = ends
        return FlowState(fid, src.id, dst.id, src.dc, dst.dc, size, **paths)

    def submit(
        self, flows: list[FlowState], deadline_s: float | None, now: float, coflow_id=None
    ) -> CoflowState:
        """Store a new coflow built from already parsed flows (see `parse_flows`).

        Args:
            deadline_s: seconds relative to `now`, > 0, or None.
            coflow_id: ask for a specific id (resubmission after a controller restart).

        Returns:
            the new CoflowState (state "queued").

        Raises:
            RegistryError("bad_request"): bad deadline, or the requested id is in use / invalid.
        """
        deadline_s = check_deadline(deadline_s)
        if coflow_id is None:
            coflow_id = self.next_id
        elif isinstance(coflow_id, bool) or not isinstance(coflow_id, int) or coflow_id < 0:
            raise RegistryError("bad_request", f"coflow id must be an integer >= 0: {coflow_id!r}")
        elif coflow_id in self.coflows:
            raise RegistryError("bad_request", f"coflow id {coflow_id} is in use")
        coflow = CoflowState(coflow_id, now, deadline_s, {f.id: f for f in flows})
        self.coflows[coflow_id] = coflow
        self._track(coflow, flows)
        self.next_id = max(self.next_id, coflow_id + 1)
        return coflow

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
            RegistryError("coflow_done"): the coflow already finished.
            RegistryError("duplicate_flow"): a flow id already in the coflow.
        """
        if coflow.state == "done":
            raise RegistryError("coflow_done", f"coflow {coflow.id} already finished")
        for f in flows:
            if f.id in coflow.flows:
                raise RegistryError("duplicate_flow", f"duplicate flow id {f.id!r}")
        for f in flows:
            coflow.flows[f.id] = f
        self._track(coflow, flows)

    def _track(self, coflow: CoflowState, flows: list[FlowState]) -> None:
        left = {f.id: float(f.remaining) for f in flows if not f.intra_dc and f.remaining > 0}
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
        flow.delivered = max(flow.delivered, acked)
        self._untrack(int(coflow_id), flow)
        return flow

    def record_complete(
        self, coflow_id: object, flow_id: object, digest: object, now: float
    ) -> CoflowState:
        """Mark a flow done; mark its coflow done (with `finished_s = now`) when its WAN part is.

        Returns:
            the flow's coflow (check `.state == "done"`).

        Raises:
            RegistryError: unknown coflow/flow.
        """
        flow = self.flow(coflow_id, flow_id)
        flow.done = True
        flow.delivered = flow.bytes
        flow.digest = digest if isinstance(digest, str) else None
        self._untrack(int(coflow_id), flow)
        coflow = self.get(coflow_id)
        self.finish_if_done(coflow, now)
        return coflow

    def finish_if_done(self, coflow: CoflowState, now: float) -> bool:
        """Mark `coflow` done at `now` if every WAN flow is done; intra-DC flows count as done.

        Returns:
            True when the coflow became done by this call.
        """
        if coflow.state in ("done", "rejected") or not coflow.wan_done:
            return False
        for f in coflow.flows.values():
            if f.intra_dc:
                f.done = True
                f.delivered = f.bytes
        coflow.state = "done"
        self._left.pop(coflow.id, None)
        coflow.finished_s = now
        return True

    def active(self) -> list[CoflowState]:
        """Coflows that are not done (in id order)."""
        return [c for c in self.coflows.values() if c.state not in ("done", "rejected")]

    def remaining(self, connected=None) -> dict[str, dict[str, float]]:
        """Return the policy's Remaining map: {str(coflow id): {flow id: bytes}}, WAN flows only.

        Args:
            connected: optional predicate (src DC, dst DC) -> bool; flows between DCs
                it rejects (cut off by link failures) are left out for now.

        Only unfinished flows with bytes left appear; coflows without any are left out.
        The maps are fresh copies (the caller may keep them).
        """
        if connected is None:
            return {str(cid): dict(left) for cid, left in self._left.items()}
        out = {}
        for cid, left in self._left.items():
            flows = self.coflows[cid].flows
            kept = {
                fid: b for fid, b in left.items() if connected(flows[fid].src_dc, flows[fid].dst_dc)
            }
            if kept:
                out[str(cid)] = kept
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


def check_deadline(value: object) -> float | None:
    """Return a deadline in seconds (> 0, finite) or None.

    Raises:
        RegistryError("bad_request"): not a positive finite number.
    """
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise RegistryError("bad_request", f"deadline must be seconds (a number), got {value!r}")
    if not 0 < value < float("inf"):
        raise RegistryError("bad_request", f"deadline must be positive and finite, got {value!r}")
    return float(value)
