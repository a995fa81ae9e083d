"""The coflow API server: msgpack request/response over TCP (DESIGN.md section 6).

Wire format (both directions):

    message = u32 big-endian length | msgpack map (at most MAX_MESSAGE_BYTES)

Every request map has ``"v": API_VERSION``, ``"op"`` and, when the controller
was started with a token, ``"token"``; it may carry ``"req"`` (any value,
echoed back). A submit or update may carry ``"ref"`` (a string of 1..64
characters, unique per request): a repeated ref gets the first reply again
instead of a second execution, so a client may safely resend after a broken
connection. Every reply has ``"v"``, ``"ok"``, ``"instance"`` (a random id
of this controller run: a client that sees it change knows the controller
restarted) and, on failure, ``"error"`` (message) and ``"code"``.

Operations (request fields -> reply fields):

    hello                                          -> instance, version
    submit  flows, deadline?, coflow?              -> coflow (id, or -1: deadline cannot be met)
    status  coflow                                 -> status (see CoflowState.status)
    update  coflow, flows                          -> (nothing more)
    list                                           -> coflows: [{id, state, bytes_total,
                                                      bytes_delivered, cct_s}]
    link_state  a, b, up                           -> changed (operator command: link a-b)
    capacity    a, b, bytes_per_s                  -> changed

Every bad request gets an error reply and changes nothing; a broken message
closes only that connection. The server runs one thread per connection on
os-ken's hub (`os_ken.lib.hub.StreamServer`).
"""

from __future__ import annotations

import hmac
import logging
import secrets
import socket
import struct
import threading
from collections import OrderedDict

import msgpack

from terra_controller.coflow_registry import RegistryError
from terra_controller.controller import Controller

LOG = logging.getLogger("terra.api")

API_VERSION = 1
MAX_MESSAGE_BYTES = 64 * 1024 * 1024
FRAME_TIMEOUT_S = 30.0
MAX_CONNECTIONS = 512  # per server (API or agent channel)
MAX_REFS = 100_000  # remembered replies of submit/update requests carrying "ref"
_LEN = struct.Struct(">I")


class WireError(Exception):
    """A message on the coflow API connection is malformed (the connection is closed)."""


# ---- framing (shared with the client) -------------------------------------------------------


def pack_message(message: dict) -> bytes:
    """Encode a message map as ``u32 length | msgpack``.

    Raises:
        WireError: the encoded message exceeds MAX_MESSAGE_BYTES.
    """
    body = msgpack.packb(message, use_bin_type=True)
    if len(body) > MAX_MESSAGE_BYTES:
        raise WireError(f"message of {len(body)} bytes exceeds {MAX_MESSAGE_BYTES}")
    return _LEN.pack(len(body)) + body


def recv_exact(sock: socket.socket, n: int) -> bytes:
    """Read exactly n bytes from a blocking socket.

    Raises:
        EOFError: the peer closed before n bytes arrived (ConnectionError on resets).
    """
    buf = bytearray()
    while len(buf) < n:
        part = sock.recv(min(n - len(buf), 1 << 20))
        if not part:
            raise EOFError(f"connection closed after {len(buf)} of {n} bytes")
        buf += part
    return bytes(buf)


def read_message(sock: socket.socket, frame_timeout: float | None = FRAME_TIMEOUT_S) -> dict | None:
    """Read one message map; None on a clean EOF between messages.

    The first length byte may take forever; once it arrived the rest of the
    message must arrive within `frame_timeout` seconds.

    Raises:
        WireError: oversized length, bad msgpack, not a map, or EOF inside a message.
        TimeoutError: the rest of a started message did not arrive in time.
    """
    old = sock.gettimeout()
    first = sock.recv(1)
    if not first:
        return None
    sock.settimeout(frame_timeout if old is None else min(old, frame_timeout or old))
    try:
        try:
            raw_len = first + recv_exact(sock, 3)
            (length,) = _LEN.unpack(raw_len)
            if length > MAX_MESSAGE_BYTES:
                raise WireError(f"message length {length} exceeds {MAX_MESSAGE_BYTES}")
            body = recv_exact(sock, length)
        except EOFError as exc:
            raise WireError(f"truncated message: {exc}") from exc
    finally:
        sock.settimeout(old)
    try:
        message = msgpack.unpackb(body, raw=False)
    except Exception as exc:  # msgpack raises several unrelated types on garbage
        raise WireError(f"malformed msgpack: {exc}") from exc
    if not isinstance(message, dict):
        raise WireError("message must be a msgpack map")
    return message


# ---- request handling -----------------------------------------------------------------------


class ApiHandler:
    """Answers coflow API requests against a Controller.

    Args:
        controller: the Controller.
        token: required value of every request's "token" (None: no check).

    Attributes:
        instance: random hex id of this controller run (in every reply).
        counts: {op: requests answered}.
    """

    def __init__(self, controller: Controller, token: str | None = None) -> None:
        self.controller = controller
        self.token = token
        self.instance = secrets.token_hex(8)
        self.counts: dict[str, int] = {}
        self.done_refs: OrderedDict[str, dict] = OrderedDict()  # ref -> reply (submit/update)
        self.refs_lock = threading.Lock()

    def handle(self, request: object) -> dict:
        """Answer one decoded request map; never raises (errors become error replies)."""
        req = request.get("req") if isinstance(request, dict) else None
        ref = _ref_of(request)
        if ref is not None:
            with self.refs_lock:
                done = self.done_refs.get(ref)
            if done is not None:  # a client retried a request that did succeed
                return dict(done, req=req) if req is not None else dict(done)
        try:
            reply = self._dispatch(request)
            reply.update(ok=True)
            if ref is not None:
                with self.refs_lock:
                    self.done_refs[ref] = dict(reply, v=API_VERSION, instance=self.instance)
                    while len(self.done_refs) > MAX_REFS:
                        self.done_refs.popitem(last=False)
        except RegistryError as exc:
            reply = {"ok": False, "code": exc.code, "error": str(exc)}
        except Exception as exc:  # a bug must answer, not kill the connection or the process
            LOG.exception("API request failed")
            reply = {"ok": False, "code": "internal", "error": f"internal error: {exc!r}"}
        reply.update(v=API_VERSION, instance=self.instance)
        if req is not None:
            reply["req"] = req
        return reply

    def _dispatch(self, request: object) -> dict:
        if not isinstance(request, dict):
            raise RegistryError("bad_request", "request must be a map")
        if request.get("v") != API_VERSION:
            raise RegistryError("bad_version", f"unsupported version {request.get('v')!r}")
        if self.token is not None:
            given = request.get("token")
            if not isinstance(given, str) or not hmac.compare_digest(given, self.token):
                raise RegistryError("bad_token", "missing or wrong token")
        op = request.get("op")
        handler = _OPS.get(op) if isinstance(op, str) else None
        if handler is None:
            raise RegistryError("bad_request", f"unknown op {op!r}")
        reply = handler(self, request)
        self.counts[op] = self.counts.get(op, 0) + 1
        return reply

    def _hello(self, request: dict) -> dict:
        return {"version": API_VERSION}

    def _submit(self, request: dict) -> dict:
        _only(request, {"flows", "deadline", "coflow"})
        cid = self.controller.submit(
            request.get("flows"), request.get("deadline"), request.get("coflow")
        )
        return {"coflow": cid}

    def _status(self, request: dict) -> dict:
        _only(request, {"coflow"})
        return {"status": self.controller.status(request.get("coflow"))}

    def _update(self, request: dict) -> dict:
        _only(request, {"coflow", "flows"})
        self.controller.update(request.get("coflow"), request.get("flows"))
        return {}

    def _list(self, request: dict) -> dict:
        with self.controller.lock:
            coflows = [
                {k: s[k] for k in ("id", "state", "bytes_total", "bytes_delivered", "cct_s")}
                for s in (c.status() for c in self.controller.registry.coflows.values())
            ]
        return {"coflows": coflows}

    def _link_state(self, request: dict) -> dict:
        _only(request, {"a", "b", "up"})
        changed = self.controller.set_link_state(
            request.get("a"), request.get("b"), request.get("up")
        )
        return {"changed": changed}

    def _capacity(self, request: dict) -> dict:
        _only(request, {"a", "b", "bytes_per_s"})
        changed = self.controller.set_capacity(
            request.get("a"), request.get("b"), request.get("bytes_per_s")
        )
        return {"changed": changed}


_OPS = {
    "hello": ApiHandler._hello,
    "submit": ApiHandler._submit,
    "status": ApiHandler._status,
    "update": ApiHandler._update,
    "list": ApiHandler._list,
    "link_state": ApiHandler._link_state,
    "capacity": ApiHandler._capacity,
}
_COMMON_FIELDS = {"v", "op", "token", "req", "ref"}


def _ref_of(request: object) -> str | None:
    """The retry reference of a submit/update request, if it has a usable one."""
    if not isinstance(request, dict) or request.get("op") not in ("submit", "update"):
        return None
    ref = request.get("ref")
    if isinstance(ref, str) and 0 < len(ref) <= 64:
        return ref
    return None


def _only(request: dict, fields: set[str]) -> None:
    unknown = set(request) - fields - _COMMON_FIELDS
    if unknown:
        raise RegistryError("bad_request", f"unknown fields {sorted(map(str, unknown))}")


# ---- server ---------------------------------------------------------------------------------


def serve_connection(handler: ApiHandler, sock: socket.socket, addr) -> None:
    """Answer requests on one connection until EOF or a malformed message (then close it)."""
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    try:
        while True:
            try:
                request = read_message(sock)
            except WireError as exc:
                LOG.warning("API %s: %s; closing", addr, exc)
                _send_quietly(
                    sock,
                    {
                        "v": API_VERSION,
                        "ok": False,
                        "code": "bad_message",
                        "error": str(exc),
                        "instance": handler.instance,
                    },
                )
                return
            if request is None:
                return
            sock.sendall(pack_message(handler.handle(request)))
    except (OSError, EOFError) as exc:
        LOG.debug("API %s: connection ended: %s", addr, exc)
    finally:
        sock.close()


def _send_quietly(sock: socket.socket, message: dict) -> None:
    try:
        sock.sendall(pack_message(message))
    except OSError:
        pass


def accept_loop(
    listener: socket.socket, handle, spawn, max_connections: int = MAX_CONNECTIONS
) -> None:
    """Accept connections until `listener` is closed; run handle(sock, addr) via spawn each.

    At most `max_connections` are served at once (one thread each); a connection
    beyond that is closed at once, so a flood of clients cannot exhaust threads.
    """
    slots = threading.BoundedSemaphore(max_connections)

    def run(sock, addr):
        try:
            handle(sock, addr)
        finally:
            slots.release()

    while True:
        try:
            sock, addr = listener.accept()
        except OSError:
            return
        if not slots.acquire(blocking=False):
            LOG.warning("%s: more than %d connections; refused", addr, max_connections)
            sock.close()
            continue
        spawn(run, sock, addr)


def stop_listener(listener: socket.socket) -> None:
    """Stop an accept loop: shut the listening socket down (wakes accept) and close it."""
    try:
        listener.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    listener.close()


def listen_and_serve(host: str, port: int, handle, spawn=None):
    """Listen on host:port and accept connections in a hub thread (one thread per connection).

    Args:
        handle: called as handle(sock, addr) in its own thread.
        spawn: spawn(func, *args) -> thread; default os_ken.lib.hub.spawn (tests pass a
            daemon-thread starter).

    Returns:
        (listening socket (`stop_listener` stops it), accept thread, bound (host, port)).

    Raises:
        OSError: the address cannot be bound.
    """
    from os_ken.lib import hub

    spawn = spawn or hub.spawn
    listener = hub.listen((host, port))
    return listener, spawn(accept_loop, listener, handle, spawn), listener.getsockname()[:2]


def start_api_server(handler: ApiHandler, host: str, port: int, spawn=None):
    """Serve the coflow API on host:port (see `listen_and_serve` for arguments and result)."""
    result = listen_and_serve(
        host, port, lambda sock, addr: serve_connection(handler, sock, addr), spawn
    )
    LOG.info("coflow API on %s:%d", *result[2])
    return result
