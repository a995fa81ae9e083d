"""The controller's records of one coflow and its flows, and the keys of their attempts.

`FlowState` and `CoflowState` hold what the registry (terra_controller/coflow_registry.py)
knows of a submitted coflow: endpoints mapped to DCs, bytes total and delivered, states
(`CoflowStatus`, `FlowStatus`), times and CCT. Each coflow has a secret from which every
flow attempt's digest key is derived (`flow_key`), so an agent's report must carry the tag
of the flow's current attempt. `RegistryError` is the one error a bad request raises.

Times are seconds on the controller's clock.
"""

from __future__ import annotations

import hashlib
import hmac
import posixpath
import secrets
import struct
from dataclasses import dataclass, field

from terra_model import Coflow, Flow
from terra_model.states import MAX_COFLOW_ID, CoflowStatus, FlowStatus
from terra_wire.control import report_tag

SECRET_BYTES = 16  # a coflow's secret, from which its flows' per-attempt keys are derived


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
