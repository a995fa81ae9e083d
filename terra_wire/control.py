"""Control-channel and data-connection messages (agent <-> controller, agent <-> agent).

Pure encode/validate functions and dataclasses, no event loop: usable from trio (agents) and from
eventlet (the os-ken controller app). Every message travels as one frame of overlay/framing.py with
an empty payload; the fields below are the frame header ("v" and "n" are added by framing).
Source: docs/design.md section 6 ("Control channel"), section 5 (chunks, acks).

Control channel, agent -> controller:
    register  {dc, agent, data_addr: "host:port" (an IP address of the agent's control
               connection or in a --data-prefix of the controller; 0.0.0.0 / :: = that one),
               inflight?: [{coflow, flow, role: "send"|"recv", offset: int bytes, k}]}
    progress  {flows: [{coflow, flow, acked: int bytes, k}]}
    complete  {coflow, flow, digest: flow digest hex str (terra_security/integrity.py),
               size: int bytes, sha256?: hex str (SHA-256 of the bytes as they reached a
               file sink, computed while they passed),
               k}
    heartbeat {}
    error     {message: str, coflow?: str, flow?: str}
    failed    {coflow, flow, reason: str, cause: "source" | "sink" | "digest", attempt?: int, k}
              a flow cannot run at this agent: its source cannot be read (sender), its sink
              cannot be opened or written (receiver), or its bytes arrived with a digest that
              does not match the sender's (receiver; the controller may send it again from 0);
              attempt: the flow's attempt it is about (default 0; reports of an earlier attempt
              are ignored)
    ack       {id}                    (answers a controller message that carried "id")
    listing   {id, files: [[path, size: int bytes, sha256: hex str | null]], more?: bool,
               error?: str}  answers a "list" or "check" (terra_wire/file_messages.py): one
               or more messages with the request's id, the last with more false; error: why
               the request failed (one line; the files of that reply are then empty)
    k: the report's attempt tag, report_tag(the flow attempt's digest_key): the controller
       accepts a progress row, "complete", "failed" or "inflight" row only when it matches the
       flow's current attempt (a report about an earlier attempt, or about a flow of the same
       ids before a controller restart, is refused). Report fields are capped: coflow and flow
       ids MAX_NAME_CHARS, reasons MAX_REASON_CHARS, digests MAX_DIGEST_CHARS hex digits; a
       longer one makes the whole message invalid.

Control channel, controller -> agent (any of them may carry "id": the agent acks it once applied):
    registered {agent, generation?: int (the etcd generation of the leader, 0 or absent
               alone)}                (registration accepted)
    tunnels   {tunnels: [{tunnel, peer_agent, peer_addr: "host:port" (the peer's data address),
                          path: [dc, ...], port: int (this tunnel's destination port at the peer)}],
               listen: [int]          (ports on which THIS agent accepts incoming tunnels),
               keys?: {agent: 64 hex digits}  (mutual TLS only: the pair key of this agent
                                      and each other connected agent, terra_controller/
                                      data_keys.py; authenticates data connections)}
    flows     {flows: [{coflow, flow, src_agent, dst_agent, dst_dc, size: int bytes,
                        offset: int bytes (acknowledged so far, where a sender resumes),
                        source: "synthetic" | "file:PATH", sink: "digest" | "file:PATH",
                        attempt?: int >= 0 (default 0; grows each time the controller
                        restarts the flow from byte 0 after a digest mismatch),
                        digest_alg: the leaf-MAC construction, "gmac-aes256-v1" or
                        "blake3-keyed-v1" (terra_security/integrity.py ALGORITHMS; absent:
                        "blake3-keyed-v1"),
                        digest_key: 64 hex chars (the flow attempt's 32-byte key, made by the
                        controller; keys the chunk MACs and the flow digest)}]}
    drop      {coflow, flows: [flow id]}  forget these flows (sender and receiver state): their
              coflow failed or was cancelled, or (followed by "flows") a flow restarts from 0
    rates     {rates: [{coflow, dst_dc, paths: [{tunnel, rate: bytes/s >= 0}]}]}
              One entry per FlowGroup of the receiving (sending-side) agent: the FlowGroup is
              (coflow, this agent's DC, dst_dc). An entry replaces that FlowGroup's rates; paths it
              does not list get rate 0 (paused). FlowGroups not listed keep their rates.
    list      {id, path: str, sha256?: bool}  the regular files at `path` under the agent's
              data root (a file, a directory walked recursively, or a glob), answered by
              "listing" rows [path, size, sha256 when asked else null]
    check     {id, files: [[path, size, sha256]]}  which of these files exist with this size
              and SHA-256 under the data root, answered by "listing" with those that do
    heartbeat {}, error {message, fatal?: bool}, ack {id}
              fatal: true: the controller refused the agent's "register" for good (unknown DC,
              wrong identity, a data_addr not its own) and closes; the agent exits with it

Data connections (sender agent -> receiver agent, one TCP connection per (peer agent, tunnel)):
    hello     {agent, tunnel}         first frame from the connecting (sending) agent
    chunk     frames.chunk_header fields + payload ("m": the chunk's keyed MAC, checked by the
              receiver before the bytes go anywhere); the chunk ending at the flow's size also
              carries "d": the sender's keyed flow digest (hex) of the whole flow
    ack       {c: coflow, f: flow, o: delivered offset, e: receiver epoch int}  (receiver ->
              sender, on the same connection; "e" changes when the receiver restarts)
    A chunk and an ack of a flow whose attempt is > 0 also carry "a": the attempt; a receiver
    drops chunks of another attempt, a sender ignores acks of another attempt.

Rules the controller follows (what terra_agent expects):
    - send a flow's descriptor to its receiver (and wait for the "ack" {id}) before its sender:
      a chunk for a flow the receiver does not know closes that data connection;
    - on every (re-)registration, re-send the agent's tunnels, its unfinished flows with
      offset = the latest "progress" acked, and its rates (a restarted agent knows nothing);
    - expect "complete" again after a (re-)registration: an agent re-sends it for every flow
      it received in full (a restarted controller knows of them only this way); it is idempotent;
    - keep headers under frames.MAX_HEADER_BYTES (64 KiB): batch long "flows" lists (about 200
      descriptors per message is safe); agents send at most 500 rows per progress/register.
    - to restart a flow from byte 0, send "drop" and its descriptor with attempt + 1 to the
      receiver, and to the sender only once the receiver acked them; agents ignore chunks and
      acks of dropped flows and of other attempts, so late ones close no connection.

All validators raise ProtocolError (a ValueError) with a message naming the field at fault.
"""

from __future__ import annotations

import hashlib
import hmac
import math
import re
from dataclasses import asdict, dataclass, field
from typing import Annotated, Literal

import msgspec
from msgspec import Meta

from terra_security.integrity import ALGORITHM, default_algorithm, new_flow_key
from terra_wire.frames import Header

MessageId = str | int  # the "id" a controller message may carry, acked by the agent

PROTOCOL_TYPES_FROM_AGENT = (
    "register",
    "progress",
    "complete",
    "heartbeat",
    "error",
    "failed",
    "ack",
    "listing",
)
PROTOCOL_TYPES_TO_AGENT = (
    "registered",
    "tunnels",
    "flows",
    "rates",
    "drop",
    "heartbeat",
    "error",
    "ack",
    "list",
    "check",
)
FAILURE_CAUSES = ("source", "sink", "digest")
MAX_REASON_CHARS = 1024  # "failed" reasons are cut to this length by failed_message
MAX_NAME_CHARS = 256  # coflow and flow ids in reports (the registry's MAX_ID_CHARS)
MAX_DIGEST_CHARS = 128  # hex digits of a reported flow digest
TAG_CHARS = 32  # hex digits of a report's attempt tag ("k")
TAG_LABEL = b"terra-report"
DROP_BATCH = 100  # flow ids per "drop" message (ids are <= 256 chars: headers stay < 64 KiB)
DATA_TYPES = ("hello", "chunk", "ack")
MAX_PORT = 65535
MAX_FILE_PATH_CHARS = 4096  # a path in "list" / "check" / "listing"


class ProtocolError(ValueError):
    """A control or data message is malformed; the message names the type and field at fault."""


@dataclass(frozen=True)
class TunnelSpec:
    """One outgoing tunnel of an agent: connect to (host of peer_addr, port) to use `path`.

    tunnel: tunnel id (str); peer_agent: agent id at the far end; peer_addr: its data address
    "host:port"; path: DC names from this DC to the peer's DC; port: destination TCP port that
    identifies the tunnel (switches pin it to the path, docs/design.md section 5).
    """

    tunnel: str
    peer_agent: str
    peer_addr: str
    path: tuple[str, ...]
    port: int

    @property
    def peer_host(self) -> str:
        """Host part of peer_addr (str)."""
        return parse_addr(self.peer_addr, "peer_addr")[0]

    def to_dict(self) -> Header:
        """The wire form ({"tunnel", "peer_agent", "peer_addr", "path": [...], "port"})."""
        d = asdict(self)
        d["path"] = list(self.path)
        return d


@dataclass(frozen=True)
class FlowSpec:
    """A flow descriptor: `size` bytes from src_agent to dst_agent (dst_agent sits in dst_dc).

    offset: bytes acknowledged so far (a restarted sender resumes there; the receiver's own
    delivered offset wins when it knows better). source: "synthetic" or "file:PATH" (read on the
    sending host); sink: "digest" (hash only) or "file:PATH" (written on the receiving host).
    attempt: how many times the controller restarted the flow from byte 0 (digest mismatches);
    chunks and acks of another attempt are ignored. digest_key: the flow attempt's 32-byte key
    as 64 hex chars (default: a fresh random one; the controller makes one per attempt and sends
    the same to both ends); digest_alg: the leaf-MAC construction (terra_security/integrity.py
    ALGORITHMS; default: integrity.default_algorithm(), the fastest on this host's CPU).
    """

    coflow: str
    flow: str
    src_agent: str
    dst_agent: str
    dst_dc: str
    size: int
    offset: int = 0
    source: str = "synthetic"
    sink: str = "digest"
    attempt: int = 0
    digest_key: str = field(default_factory=new_flow_key, repr=False)
    digest_alg: str = field(default_factory=default_algorithm)

    @property
    def key(self) -> tuple[str, str]:
        """(coflow, flow): the flow's identity."""
        return (self.coflow, self.flow)

    def to_dict(self) -> Header:
        """The wire form (all fields; "attempt" only when > 0)."""
        d: Header = {
            "coflow": self.coflow, "flow": self.flow, "src_agent": self.src_agent,
            "dst_agent": self.dst_agent, "dst_dc": self.dst_dc, "size": self.size,
            "offset": self.offset, "source": self.source, "sink": self.sink,
            "digest_key": self.digest_key, "digest_alg": self.digest_alg,
        }  # fmt: skip
        if self.attempt:
            d["attempt"] = self.attempt
        return d


@dataclass(frozen=True)
class GroupRates:
    """Per-path rates of one FlowGroup (coflow, sender's DC, dst_dc): {tunnel id: bytes/s}."""

    coflow: str
    dst_dc: str
    paths: dict[str, float]

    @property
    def key(self) -> tuple[str, str]:
        """(coflow, dst_dc): the FlowGroup as seen by its sending agent."""
        return (self.coflow, self.dst_dc)

    def to_dict(self) -> Header:
        """The wire form {"coflow", "dst_dc", "paths": [{"tunnel", "rate"}]}."""
        return {
            "coflow": self.coflow,
            "dst_dc": self.dst_dc,
            "paths": [{"tunnel": t, "rate": float(r)} for t, r in self.paths.items()],
        }


def report_tag(digest_key: str) -> str:
    """The attempt tag ("k") of reports about a flow attempt: the first TAG_CHARS hex digits
    of HMAC-SHA256(key bytes, TAG_LABEL), where `digest_key` is the attempt's flow key (64 hex
    digits, FlowSpec.digest_key). Only the flow's two agents and the controller know the key.

    Raises:
        ValueError: `digest_key` is not hex.
    """
    mac = hmac.new(bytes.fromhex(digest_key), TAG_LABEL, hashlib.sha256)
    return mac.hexdigest()[:TAG_CHARS]


# ---------------------------------------------------------------- constructors


def register_message(
    dc: str,
    agent: str,
    data_addr: str,
    inflight: list[Header] | None = None,
) -> Header:
    """Header of a "register" message (agent -> controller); see the module docstring."""
    msg: Header = {"t": "register", "dc": dc, "agent": agent, "data_addr": data_addr}
    if inflight:
        msg["inflight"] = inflight
    return validate_control(msg)


def tunnels_message(
    tunnels: list[TunnelSpec],
    listen: list[int],
    msg_id: MessageId | None = None,
    keys: dict[str, str] | None = None,
) -> Header:
    """Header of a "tunnels" message (controller -> agent): outgoing tunnels, ports to listen on,
    and (when given, non-empty) the pair keys {peer agent: 64 hex digits} of data connections."""
    msg: Header = {
        "t": "tunnels",
        "tunnels": [t.to_dict() for t in tunnels],
        "listen": list(listen),
    }
    if keys:
        msg["keys"] = dict(keys)
    return _with_id(msg, msg_id)


def flows_message(flows: list[FlowSpec], msg_id: MessageId | None = None) -> Header:
    """Header of a "flows" message (controller -> agent) announcing flow descriptors."""
    return _with_id({"t": "flows", "flows": [f.to_dict() for f in flows]}, msg_id)


def rates_message(groups: list[GroupRates], msg_id: MessageId | None = None) -> Header:
    """Header of a "rates" message (controller -> agent): per-FlowGroup per-path rates, bytes/s."""
    return _with_id({"t": "rates", "rates": [g.to_dict() for g in groups]}, msg_id)


def progress_message(flows: list[tuple[str, str, int, str]]) -> Header:
    """Header of a "progress" message from [(coflow, flow, acked bytes, tag)], tag =
    report_tag(the attempt's digest_key)."""
    return {
        "t": "progress",
        "flows": [{"coflow": c, "flow": f, "acked": a, "k": k} for c, f, a, k in flows],
    }


def complete_message(
    coflow: str, flow: str, digest: str, size: int, tag: str, sha256: str | None = None
) -> Header:
    """Header of a "complete" message: the receiver got all `size` bytes and the digest matched;
    `tag` = report_tag(the attempt's digest_key); `sha256`: hex SHA-256 of a file sink's
    bytes (left out when None)."""
    msg = {"t": "complete", "coflow": coflow, "flow": flow, "digest": digest, "size": size,
           "k": tag}  # fmt: skip
    if sha256 is not None:
        msg["sha256"] = sha256
    return msg


def error_message(message: str, **fields: object) -> Header:
    """Header of an "error" message; extra fields (e.g. coflow, flow: str; fatal: bool) are
    kept."""
    return {"t": "error", "message": message, **fields}


def failed_message(
    coflow: str, flow: str, reason: str, cause: str, attempt: int = 0, tag: str | None = None
) -> Header:
    """Header of a "failed" message (agent -> controller): flow coflow/flow cannot run here.

    Args:
        reason: human-readable cause (cut to MAX_REASON_CHARS characters).
        cause: one of FAILURE_CAUSES ("source", "sink", "digest").
        attempt: the flow's attempt (FlowSpec.attempt) that failed; sent when > 0.
        tag: report_tag(the attempt's digest_key) (the controller refuses a report without).

    Raises:
        ProtocolError: empty or too long ids, an unknown cause or a negative attempt.
    """
    text = str(reason)[:MAX_REASON_CHARS] or "unknown"
    msg: Header = {"t": "failed", "coflow": coflow, "flow": flow, "reason": text, "cause": cause}
    if tag is not None:
        msg["k"] = tag
    if attempt:
        msg["attempt"] = attempt
    return validate_control(msg)


def drop_messages(coflow: str, flows: list[str], msg_id: MessageId | None = None) -> list[Header]:
    """Headers of "drop" messages (controller -> agent) for a coflow's flows, DROP_BATCH ids
    each; `msg_id`, when given, goes on the last one (the agent acks it once all are applied).

    Raises:
        ProtocolError: empty ids.
    """
    out: list[Header] = []
    for i in range(0, len(flows), DROP_BATCH):
        out.append({"t": "drop", "coflow": coflow, "flows": list(flows[i : i + DROP_BATCH])})
    if out and msg_id is not None:
        out[-1]["id"] = msg_id
    return [validate_control(m) for m in out]


def _with_id(msg: Header, msg_id: MessageId | None) -> Header:
    if msg_id is not None:
        msg["id"] = msg_id
    return validate_control(msg)


# ---------------------------------------------------------------- validation (msgspec)
#
# Every message type is a msgspec Struct tagged by its "t" field; msgspec checks the types,
# ranges and required fields (unknown fields, e.g. the frame's "v" and "n", are ignored);
# __post_init__ adds the checks that span fields. Validation converts a decoded header map
# with msgspec.convert and returns the map itself, so callers keep working with plain maps.

Name = Annotated[str, Meta(min_length=1)]
ReportName = Annotated[str, Meta(min_length=1, max_length=MAX_NAME_CHARS)]
Tag = Annotated[str, Meta(max_length=TAG_CHARS)]  # wrong tags are refused by the controller
Digest = Annotated[str, Meta(pattern=f"^[0-9a-f]{{1,{MAX_DIGEST_CHARS}}}$")]
Reason = Annotated[str, Meta(min_length=1, max_length=MAX_REASON_CHARS)]
Sha256 = Annotated[str, Meta(pattern="^[0-9a-f]{64}$")]
FilePath = Annotated[str, Meta(min_length=1, max_length=MAX_FILE_PATH_CHARS)]
FileRow = tuple[FilePath, Annotated[int, Meta(ge=0)], Sha256 | None]
Bytes = Annotated[int, Meta(ge=0)]
Port = Annotated[int, Meta(ge=1, le=MAX_PORT)]
PairKey = Annotated[str, Meta(pattern="^[0-9a-f]{64}$")]  # 32 bytes, lower-case hex


class _Control(msgspec.Struct, tag_field="t", frozen=True, kw_only=True):
    id: str | int | None = None


class _Register(_Control, tag="register", frozen=True):
    dc: Name
    agent: Name
    data_addr: str
    inflight: list[_Inflight] = []

    def __post_init__(self) -> None:
        parse_addr(self.data_addr, "data_addr")


class _Inflight(msgspec.Struct, frozen=True):
    coflow: ReportName
    flow: ReportName
    offset: Bytes
    role: Literal["send", "recv"]
    digest: Digest | None = None
    k: Tag = ""


class _Registered(_Control, tag="registered", frozen=True):
    agent: Name
    generation: Annotated[int, Meta(ge=0)] = 0


class _Tunnel(msgspec.Struct, frozen=True):
    tunnel: Name
    peer_agent: Name
    peer_addr: str
    port: Port
    path: Annotated[list[Name], Meta(min_length=2)]

    def __post_init__(self) -> None:
        parse_addr(self.peer_addr, "peer_addr")


class _Tunnels(_Control, tag="tunnels", frozen=True):
    tunnels: list[_Tunnel]
    listen: list[Port] = []
    keys: dict[Name, PairKey] = {}

    def __post_init__(self) -> None:
        seen = set()
        for t in self.tunnels:
            if (t.peer_agent, t.tunnel) in seen:
                raise ValueError(f"duplicate tunnel {t.tunnel!r} to {t.peer_agent!r}")
            seen.add((t.peer_agent, t.tunnel))


class _Flow(msgspec.Struct, frozen=True):
    coflow: Name
    flow: Name
    src_agent: Name
    dst_agent: Name
    dst_dc: Name
    size: Annotated[int, Meta(ge=1)]
    offset: Bytes = 0
    attempt: Bytes = 0
    source: str = "synthetic"
    sink: str = "digest"
    digest_alg: Literal["gmac-aes256-v1", "blake3-keyed-v1"] = ALGORITHM
    digest_key: Annotated[str, Meta(pattern="^[0-9a-f]{64}$")] = ""

    def __post_init__(self) -> None:
        if not self.digest_key:
            raise ValueError("digest_key is required (64 lowercase hex chars)")
        if self.offset > self.size:
            raise ValueError(f"offset {self.offset} > size {self.size}")
        _endpoint(self.source, "synthetic", "source")
        _endpoint(self.sink, "digest", "sink")


class _Flows(_Control, tag="flows", frozen=True):
    flows: list[_Flow]


class _PathRate(msgspec.Struct, frozen=True):
    tunnel: Name
    rate: Annotated[float, Meta(ge=0)]

    def __post_init__(self) -> None:
        if not math.isfinite(self.rate):
            raise ValueError(f"rate must be a finite number >= 0, got {self.rate!r}")


class _Group(msgspec.Struct, frozen=True):
    coflow: Name
    dst_dc: Name
    paths: list[_PathRate]


class _Rates(_Control, tag="rates", frozen=True):
    rates: list[_Group]


class _Acked(msgspec.Struct, frozen=True):
    coflow: ReportName
    flow: ReportName
    acked: Bytes
    k: Tag = ""


class _Progress(_Control, tag="progress", frozen=True):
    flows: list[_Acked]


class _Complete(_Control, tag="complete", frozen=True):
    coflow: ReportName
    flow: ReportName
    digest: Digest
    size: Annotated[int, Meta(ge=1)]
    k: Tag = ""
    sha256: Sha256 | None = None


class _Failed(_Control, tag="failed", frozen=True):
    coflow: ReportName
    flow: ReportName
    reason: Reason
    cause: Literal["source", "sink", "digest"]
    attempt: Bytes = 0
    k: Tag = ""


class _Drop(_Control, tag="drop", frozen=True):
    coflow: Name
    flows: list[Name]


class _Error(_Control, tag="error", frozen=True):
    message: str
    fatal: bool = False


class _Ack(_Control, tag="ack", frozen=True):
    id: str | int  # required here

    def __post_init__(self) -> None:
        if isinstance(self.id, bool):
            raise ValueError("id must be a str or int")


class _Heartbeat(_Control, tag="heartbeat", frozen=True):
    pass


class _List(_Control, tag="list", frozen=True):
    path: FilePath
    sha256: bool = False


class _Check(_Control, tag="check", frozen=True):
    files: list[FileRow]


class _Listing(_Control, tag="listing", frozen=True):
    id: str | int  # required here: the request answered
    files: list[FileRow] = []
    more: bool = False
    error: Reason | None = None


_CONTROL = (
    _Register | _Registered | _Tunnels | _Flows | _Rates | _Progress | _Complete | _Failed
    | _Drop | _Error | _Ack | _Heartbeat | _List | _Check | _Listing
)  # fmt: skip


class _Hello(msgspec.Struct, tag_field="t", tag="hello", frozen=True):
    agent: Name
    tunnel: Name


class _Chunk(msgspec.Struct, tag_field="t", tag="chunk", frozen=True):
    c: Name
    f: Name
    o: Bytes
    d: Name | None = None
    a: Bytes = 0


class _DataAck(msgspec.Struct, tag_field="t", tag="ack", frozen=True):
    c: Name
    f: Name
    o: Bytes
    e: Bytes
    a: Bytes = 0


_DATA = _Hello | _Chunk | _DataAck


def _endpoint(value: str, default: str, what: str) -> None:
    """A flow's data source/sink: `default` or ``file:PATH`` (raises ValueError)."""
    if not (value == default or (value.startswith("file:") and len(value) > 5)):
        raise ValueError(f"{what} must be '{default}' or 'file:PATH', got {value!r}")


def _convert(msg: object, union: object, what: str) -> None:
    if not isinstance(msg, dict):
        raise ProtocolError(f"message must be a map, got {type(msg).__name__}")
    kind = msg.get("t")
    try:
        msgspec.convert(msg, union, strict=True)
    except msgspec.ValidationError as exc:
        text = str(exc)
        if isinstance(kind, str) and f"Invalid value {kind!r} - at `$.t`" in text:
            raise ProtocolError(f"unknown {what} message type {kind!r}") from None
        problem, _, where = text.rpartition(" - at `$")
        if not problem:  # no path: the message itself
            problem, where = text, "`"
        path = where.rstrip("`")
        missing = re.search(r"missing required field `([^`]*)`", problem)
        if missing:
            field, path = missing.group(1), f"{path}.{missing.group(1)}"
        else:
            field = re.split(r"[.\[\]]", path.rstrip("]"))[-1] or path
        raise ProtocolError(f"{kind!r} message: field {field!r} at {path}: {problem}") from None
    except ProtocolError as exc:  # parse_addr in __post_init__
        raise ProtocolError(f"{kind!r} message: {exc}") from None


def validate_control(msg: Header) -> Header:
    """Check a control-channel message header (either direction) and return it.

    Args:
        msg: the frame header, {"t": type, ...fields}; "v"/"n" may be present.

    Returns:
        msg itself (unchanged) when valid.

    Raises:
        ProtocolError: not a dict, unknown "t", a missing field or a field of the wrong
            type/range (msgspec's message names the field, e.g. ``$.flows[0].acked``).
    """
    _convert(msg, _CONTROL, "control")
    return msg


def validate_data(msg: Header) -> Header:
    """Check a data-connection frame header ("hello", "chunk" or "ack") and return it.

    Chunk fields proper (c, f, o, n, x) are also checked by framing.FrameReader; this adds
    "d" and "a".

    Raises:
        ProtocolError: unknown type, missing or mistyped fields.
    """
    _convert(msg, _DATA, "data")
    return msg


def parse_addr(addr: object, what: str = "address") -> tuple[str, int]:
    """Split "host:port" into (host, port); the host may be a name, IPv4 or [IPv6].

    Raises:
        ProtocolError: not a str, no port, port not an int in 1..65535.
    """
    if not isinstance(addr, str) or ":" not in addr:
        raise ProtocolError(f"{what} must be 'host:port', got {addr!r}")
    host, _, port_s = addr.rpartition(":")
    host = host.strip("[]")
    try:
        port = int(port_s)
    except ValueError:
        raise ProtocolError(f"{what} {addr!r}: port {port_s!r} is not an integer") from None
    if not host or not 1 <= port <= MAX_PORT:
        raise ProtocolError(f"{what} {addr!r}: need a host and a port in 1..{MAX_PORT}")
    return host, port


def parse_tunnels(msg: Header) -> tuple[list[TunnelSpec], list[int]]:
    """Validated "tunnels" message -> ([TunnelSpec], [listen port])."""
    validate_control(msg)
    specs = [
        TunnelSpec(
            tunnel=t["tunnel"],
            peer_agent=t["peer_agent"],
            peer_addr=t["peer_addr"],
            path=tuple(t["path"]),
            port=t["port"],
        )
        for t in msg["tunnels"]
    ]
    return specs, list(msg.get("listen", []))


def parse_pair_keys(msg: Header) -> dict[str, bytes]:
    """Validated "tunnels" message -> {peer agent: 32-byte pair key} ({} without "keys")."""
    return {peer: bytes.fromhex(key) for peer, key in msg.get("keys", {}).items()}


def parse_flows(msg: Header) -> list[FlowSpec]:
    """Validated "flows" message -> [FlowSpec]."""
    validate_control(msg)
    return [
        FlowSpec(
            coflow=f["coflow"],
            flow=f["flow"],
            src_agent=f["src_agent"],
            dst_agent=f["dst_agent"],
            dst_dc=f["dst_dc"],
            size=f["size"],
            offset=f.get("offset", 0),
            source=f.get("source", "synthetic"),
            sink=f.get("sink", "digest"),
            attempt=f.get("attempt", 0),
            digest_key=f["digest_key"],
            digest_alg=f.get("digest_alg", ALGORITHM),
        )
        for f in msg["flows"]
    ]


def parse_rates(msg: Header) -> list[GroupRates]:
    """Validated "rates" message -> [GroupRates] (duplicate tunnels in one entry: last wins)."""
    validate_control(msg)
    return [
        GroupRates(
            coflow=g["coflow"],
            dst_dc=g["dst_dc"],
            paths={p["tunnel"]: float(p["rate"]) for p in g["paths"]},
        )
        for g in msg["rates"]
    ]
