"""The coflow API's client side without I/O: requests, replies, refs, errors and the coflows
to resubmit after a controller restart (docs/design.md section 6, api_server.py).

`TerraClient` (blocking sockets) and `AsyncTerraClient` (asyncio streams) both drive one
`ClientSession`; they only move bytes. Each API operation is a method returning a `Call`:
the request map to send and how to turn its reply into the result. The I/O layer sends
`frame(call.request)`, reads the reply (`reply_length` of the 4-byte header, then
`decode_reply` of the body) and hands it to `ClientSession.finish`, which raises `TerraError`
for an error reply and keeps the bookkeeping:

- a submit or update carries a fresh random "ref"; resending the same request (after a
  broken connection) reuses it, so the controller executes it once (api_server.py MAX_REFS);
- `open`: the coflows this client submitted and has not yet seen final, with their flows,
  deadline, name and tags, resubmitted under the same ids when a new controller instance
  answers `hello` (`restarted`, `resubmit_request`, `resubmitted`).

Coflow names and tags are checked here with the controller's bounds (`check_label`), so a
client learns of a bad one before anything is sent.
"""

from __future__ import annotations

import secrets
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import msgpack

from terra_model.states import FINAL_STATES, MAX_COFLOW_ID
from terra_wire.api import API_VERSION, MAX_MESSAGE_BYTES, Message, WireError, pack_message

FINAL = frozenset(s.value for s in FINAL_STATES)  # the states `wait` returns on
MAX_OPEN = 10_000  # coflows remembered for resubmission (the oldest are forgotten first)
GONE = frozenset({"coflow_done", "unknown_coflow"})  # errors saying a coflow is not open
MAX_NAME_CHARS = 128  # a coflow's name
MAX_TAGS = 16  # tags per coflow
MAX_TAG_CHARS = 64  # characters per tag
_LEN = struct.Struct(">I")
T = TypeVar("T")


class TerraError(Exception):
    """The controller refused a request.

    Attributes:
        code: the reply's code ("unknown_coflow", "unknown_agent", "duplicate_flow",
            "bad_size", "bad_request", "bad_token", "coflow_done", "no_path", "path_busy"
            (a flow's dst_path is being written by another flow), "too_many_flows",
            "not_leader" (a standby controller answered; its reply's "leader" names the
            leader's HOST:PORT, or is None: terra_wire/failover.py, which the clients use to
            go there), ...).
    """

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code


@dataclass
class Call(Generic[T]):
    """One API request and how its (successful) reply becomes the caller's result.

    Attributes:
        request: the request map (without "v"; `frame` adds it).
        result: reply map -> result (run by ClientSession.finish after the ok check).
        about: the coflow id the request is about (an error saying it is not open
            forgets it), or None.
    """

    request: Message
    result: Callable[[Message], T]
    about: int | None = None


def frame(request: Message, req: object = None) -> bytes:
    """The request on the wire: ``u32 length | msgpack map`` with "v" (and "req" if given:
    the controller echoes it, so replies of pipelined requests can be matched).

    Raises:
        WireError: larger than MAX_MESSAGE_BYTES.
    """
    message = dict(request, v=API_VERSION)
    if req is not None:
        message["req"] = req
    return pack_message(message)


def reply_length(header: bytes) -> int:
    """The body length announced by a reply's 4-byte header.

    Raises:
        WireError: beyond MAX_MESSAGE_BYTES.
    """
    (length,) = _LEN.unpack(header)
    if length > MAX_MESSAGE_BYTES:
        raise WireError(f"reply of {length} bytes exceeds {MAX_MESSAGE_BYTES}")
    return int(length)


def decode_reply(body: bytes) -> Message:
    """A reply body as a map.

    Raises:
        WireError: not msgpack, or not a map.
    """
    try:
        reply = msgpack.unpackb(body, raw=False)
    except (ValueError, msgpack.ExtraData, msgpack.FormatError, msgpack.StackError) as exc:
        raise WireError(f"malformed reply: {exc}") from exc
    if not isinstance(reply, dict):
        raise WireError("a reply must be a msgpack map")
    return reply


def label_error(name: object, tags: object) -> str | None:
    """What is wrong with a coflow's name and tags, or None when both are valid: the name is
    None or 1..MAX_NAME_CHARS printable characters; the tags None or a list of at most
    MAX_TAGS distinct strings of 1..MAX_TAG_CHARS printable characters each. The client
    checks before sending, the controller (request_checks.check_labels) on arrival."""
    if name is not None and not _printable(name, MAX_NAME_CHARS):
        return f"name: 1..{MAX_NAME_CHARS} printable characters, got {str(name)[:40]!r}"
    if tags is None:
        return None
    if not isinstance(tags, list | tuple) or len(tags) > MAX_TAGS:
        return f"tags: a list of at most {MAX_TAGS} strings"
    if not all(_printable(t, MAX_TAG_CHARS) for t in tags) or len(set(tags)) != len(tags):
        return f"tags: distinct strings of 1..{MAX_TAG_CHARS} printable characters"
    return None


def check_label(name: object, tags: object) -> None:
    """Check a coflow's name and tags (label_error) on the client's side.

    Raises:
        TerraError("bad_request"): which bound is broken.
    """
    error = label_error(name, tags)
    if error is not None:
        raise TerraError("bad_request", error)


def _printable(text: object, limit: int) -> bool:
    return isinstance(text, str) and 0 < len(text) <= limit and text.isprintable()


class ClientSession:
    """A client's protocol state (see the module docstring).

    Args:
        max_open: coflows remembered for resubmission.
        clock: monotonic seconds (submission times, deadlines, ages).

    Attributes:
        open: {coflow id: {"flows", "deadline_at" (clock s or None), "submitted_at" (clock
            s of the first submission), "name", "tags"}}, oldest first: the coflows submitted
            and not yet seen final or gone; beyond `max_open` the oldest are forgotten
            (counted in `forgotten`; they are then not resubmitted).
        instance: the controller instance of the last hello (None before the first).
    """

    def __init__(self, max_open: int = MAX_OPEN, clock: Callable[[], float] = time.monotonic):
        self.open: dict[int, dict[str, Any]] = {}
        self.max_open = max_open
        self.forgotten = 0
        self.instance: str | None = None
        self.clock = clock

    # ---- operations ---------------------------------------------------------------------

    def hello(self) -> Call[Message]:
        """The first request on every connection; see `restarted` for its reply."""
        return Call({"op": "hello"}, lambda reply: reply)

    def submit(
        self,
        flows: list[dict[str, Any]],
        deadline: float | None = None,
        name: str | None = None,
        tags: list[str] | None = None,
        sync: bool = False,
    ) -> Call[int]:
        """submitCoflow; the result is the coflow id, or -1 (the deadline cannot be met).

        Raises:
            TerraError("bad_request"): a bad name or tags (check_label), nothing sent.
        """
        check_label(name, tags)
        request: Message = {"op": "submit", "flows": flows, "ref": secrets.token_hex(12)}
        if deadline is not None:
            request["deadline"] = deadline
        if name is not None:
            request["name"] = name
        if tags:
            request["tags"] = list(tags)
        if sync:
            request["sync"] = True
        submitted_at = self.clock()

        def result(reply: Message) -> int:
            cid = int(reply["coflow"])
            if cid >= 0:
                deadline_at = None if deadline is None else submitted_at + deadline
                self._remember(cid, list(flows), deadline_at, submitted_at, name, tags)
            return cid

        return Call(request, result)

    def status(self, coflow_id: int) -> Call[dict[str, Any]]:
        """checkStatus; the result is the status map (a final state forgets the coflow)."""

        def result(reply: Message) -> dict[str, Any]:
            status: dict[str, Any] = reply["status"]
            self.learned(coflow_id, status["state"])
            return status

        return Call({"op": "status", "coflow": coflow_id}, result, about=coflow_id)

    def cancel(self, coflow_id: int) -> Call[None]:
        """cancelCoflow (forgets the coflow)."""

        def result(reply: Message) -> None:
            self.open.pop(coflow_id, None)

        return Call({"op": "cancel", "coflow": coflow_id}, result, about=coflow_id)

    def update(self, coflow_id: int, flows: list[dict[str, Any]]) -> Call[None]:
        """updateCoflow: add flows (remembered for a resubmission)."""

        def result(reply: Message) -> None:
            if coflow_id in self.open:
                self.open[coflow_id]["flows"].extend(flows)

        request = {"op": "update", "coflow": coflow_id, "flows": flows,
                   "ref": secrets.token_hex(12)}  # fmt: skip
        return Call(request, result)

    def coflows(self) -> Call[list[dict[str, Any]]]:
        """The coflows this client may see (forgets the final ones)."""

        def result(reply: Message) -> list[dict[str, Any]]:
            coflows: list[dict[str, Any]] = reply["coflows"]
            for c in coflows:
                self.learned(c["id"], c["state"])
            return coflows

        return Call({"op": "list"}, result)

    def agents(self) -> Call[dict[str, Any]]:
        """{"dcs": [...], "agents": [{"id", "dc", "connected"}]}."""
        return Call({"op": "agents"}, lambda r: {"dcs": r["dcs"], "agents": r["agents"]})

    def link_state(self, a: str, b: str, up: bool) -> Call[bool]:
        """Operator: link a-b up or down; the result says whether it changed."""
        return Call({"op": "link_state", "a": a, "b": b, "up": up}, lambda r: bool(r["changed"]))

    def capacity(self, a: str, b: str, bytes_per_s: float) -> Call[bool]:
        """Operator: the capacity of link a-b in bytes/s; whether it changed."""
        request = {"op": "capacity", "a": a, "b": b, "bytes_per_s": bytes_per_s}
        return Call(request, lambda r: bool(r["changed"]))

    def login(self, ttl_s: float | None = None) -> Call[dict[str, Any]]:
        """A REST token for this client's certificate: {"token", "expires" (UNIX s), "name",
        "role"} (terra_security/tokens.py)."""
        request: dict[str, Any] = {"op": "login"}
        if ttl_s is not None:
            request["ttl_s"] = ttl_s
        keys = ("token", "expires", "name", "role")
        return Call(request, lambda r: {k: r[k] for k in keys})

    def finish(self, call: Call[T], reply: Message) -> T:
        """The result of `call` from its reply.

        Raises:
            TerraError: an error reply (one saying the coflow is gone forgets it).
        """
        if not reply.get("ok"):
            code = str(reply.get("code"))
            if call.about is not None and code in GONE:
                self.open.pop(call.about, None)
            raise TerraError(code, str(reply.get("error")))
        return call.result(reply)

    # ---- controller restarts ------------------------------------------------------------

    def restarted(self, hello_reply: Message) -> bool:
        """Record the instance a hello answered; True when it is a new controller instance
        (then resubmit every coflow of `resubmissions`)."""
        instance = hello_reply.get("instance")
        changed = self.instance is not None and instance != self.instance
        self.instance = instance if isinstance(instance, str) else None
        return changed

    def resubmissions(self) -> list[int]:
        """Ids of the open coflows, lowest first (resubmit them in this order)."""
        return sorted(self.open)

    def resubmit_request(self, coflow_id: int) -> Message:
        """The submit that gives a restarted controller an open coflow again: same id, all
        its flows, "age_s" (seconds since its first submission: its CCT counts from then),
        its remaining deadline, name and tags."""
        info = self.open[coflow_id]
        now = self.clock()
        request: Message = {"op": "submit", "coflow": coflow_id, "flows": info["flows"],
                            "age_s": max(0.0, now - info["submitted_at"])}  # fmt: skip
        if info["deadline_at"] is not None:
            request["deadline"] = max(info["deadline_at"] - now, 1e-3)
        if info["name"] is not None:
            request["name"] = info["name"]
        if info["tags"]:
            request["tags"] = list(info["tags"])
        return request

    def resubmitted(self, coflow_id: int, reply: Message, may_retry: bool) -> bool:
        """Handle a resubmission's reply; True: send it again later ("unknown_agent": the
        agents may not have re-registered yet, while `may_retry`). A coflow refused for
        any other reason, or rejected, is forgotten."""
        if reply.get("code") == "unknown_agent" and may_retry:
            return True
        if not reply.get("ok") or reply.get("coflow", -1) < 0:
            self.open.pop(coflow_id, None)
        return False

    # ---- bookkeeping --------------------------------------------------------------------

    def learned(self, coflow_id: int, state: str) -> None:
        """A reply showed coflow `coflow_id` in `state`: forget it if that is final."""
        if state in FINAL:
            self.open.pop(coflow_id, None)

    def _remember(
        self,
        cid: int,
        flows: list[dict[str, Any]],
        deadline_at: float | None,
        submitted_at: float,
        name: str | None,
        tags: list[str] | None,
    ) -> None:
        if not 0 <= cid <= MAX_COFLOW_ID:
            return
        self.open[cid] = {"flows": flows, "deadline_at": deadline_at,
                          "submitted_at": submitted_at, "name": name, "tags": tags}  # fmt: skip
        while len(self.open) > self.max_open:
            del self.open[next(iter(self.open))]
            self.forgotten += 1
