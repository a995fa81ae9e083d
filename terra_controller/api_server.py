"""The coflow API server: msgpack request/response over TCP (docs/design.md section 6).

Wire format (both directions):

    message = u32 big-endian length | msgpack map (at most MAX_MESSAGE_BYTES)

The connection is mutual TLS (docs/security.md): the client's certificate
names it and gives its role. Every request map has ``"v": API_VERSION`` and
``"op"``; it may carry ``"req"`` (any value, echoed back). A submit or update
may carry ``"ref"`` (a string of 1..64 characters, unique per request): a
repeated ref from the same client gets the first reply again instead of a
second execution, so a client may safely resend after a broken connection.
Every reply has ``"v"``, ``"ok"``, ``"instance"`` (a random id
of this controller run: a client that sees it change knows the controller
restarted) and, on failure, ``"error"`` (message) and ``"code"``.

Operations (request fields -> reply fields):

    hello                                          -> instance, version
    submit  flows, deadline?, coflow?, age_s?,     -> coflow (id, or -1: deadline cannot be met)
            name?, tags?, sync?                            (coflow + age_s: a resubmission after
                                                      a controller restart, first submitted
                                                      age_s seconds ago; name: 1..128
                                                      printable characters, tags: at most 16
                                                      distinct strings of 1..64)
    status  coflow                                 -> status (see CoflowState.status)
    update  coflow, flows                          -> (nothing more)
    cancel  coflow                                 -> (nothing more; state "cancelled")
    list                                           -> coflows: [{id, state, bytes_total,
                                                      bytes_delivered, cct_s, name, tags}]
                                                      (also those that ended before a
                                                      restart or failover)
    agents                                         -> dcs: [DC], agents: [{id, dc,
                                                      connected}] (the endpoints a job
                                                      may name; no addresses)
    link_state  a, b, up                           -> changed (operator command: link a-b)
    capacity    a, b, bytes_per_s                  -> changed
    login   ttl_s?                                 -> token, expires (UNIX s), name, role: a
                                                      token for the REST server carrying
                                                      the caller's certificate name and role
                                                      (terra_security/tokens.py; default
                                                      900 s)
    tenant, tenants, tenant_set, tenant_remove     -> see tenant_api.py (a job: its own
                                                      tenant's share; operators: all, and
                                                      live changes)

Who may do what: job clients (role "job") submit coflows and see and change
only their own; operators see and change every coflow and alone may send
link_state and capacity; agents and other roles get code "forbidden".

Every bad request gets an error reply and changes nothing; a broken message
closes only that connection. The server runs one thread per connection
(transport.py: caps, handshake and per-message deadlines).
"""

from __future__ import annotations

import logging
import secrets
import socket
import struct
import time
from collections import OrderedDict

import trio

from terra_controller.coflow_state import RegistryError
from terra_controller.controller import Controller
from terra_controller.file_flows import needs_listing
from terra_controller.loop_frames import FrameReader, send_all
from terra_controller.tenant_api import TENANT_OPS, TENANT_ROLES, submit_tenant, with_tenant
from terra_controller.transport import (
    FRAME_TIMEOUT_S,
    ServerSecurity,
    listen_and_serve,
)
from terra_security.pki import INSECURE, Identity, Role
from terra_security.tokens import DEFAULT_TTL_S, TokenError, issue_token
from terra_wire.api import INVALID, WireError, decode_request, pack_message

LOG = logging.getLogger("terra.api")

API_VERSION = 1
MAX_MESSAGE_BYTES = 64 * 1024 * 1024
IDLE_S = 600.0  # a connection without a request for this long is closed (clients reconnect)
MAX_REFS = 20_000  # remembered replies of submit/update requests carrying "ref" ...
REF_KEEP_S = 600.0  # ... for at most this long (a client resends within its timeout)
_LEN = struct.Struct(">I")


# ---- request handling -----------------------------------------------------------------------


class ApiHandler:
    """Answers coflow API requests against a Controller.

    Args:
        controller: the Controller.

    Attributes:
        frame_timeout_s: seconds for the whole of one request once its first byte arrived.
        instance: random hex id of this controller run (in every reply).
        counts: {op: requests answered}.
    """

    def __init__(self, controller: Controller) -> None:
        self.controller = controller
        self.frame_timeout_s = FRAME_TIMEOUT_S  # for the whole of one request
        self.instance = secrets.token_hex(8)
        self.counts: dict[str, int] = {}
        # (client name, ref) -> (monotonic s, reply) of submit/update, oldest first (kept on
        # the controller's loop: `handle` may run in a worker thread)
        self.done_refs: OrderedDict[tuple[str, str], tuple[float, dict]] = OrderedDict()

    def handle(self, request: object, identity: Identity = INSECURE) -> dict:
        """Answer one decoded request map from `identity`; never raises (errors become
        error replies)."""
        req = request.get("req") if isinstance(request, dict) else None
        ref = _ref_of(request, identity)
        owner = self.controller.owner
        if ref is not None:
            done = owner.run(self.done_refs.get, ref)
            if done is not None and done[0] > time.monotonic() - REF_KEEP_S:
                # a client retried a request that did succeed
                return dict(done[1], req=req) if req is not None else dict(done[1])
            if done is None and request.get("op") == "submit":  # type: ignore[union-attr]
                cid = self.controller.submitted_ref(*ref)  # before a restart or failover
                if cid is not None:
                    reply = {"coflow": cid, "ok": True, "v": API_VERSION, "instance": self.instance}
                    return reply if req is None else reply | {"req": req}
        try:
            reply = self._dispatch(request, identity)
            reply.update(ok=True)
            if ref is not None:
                owner.run(self._keep_ref, ref, dict(reply, v=API_VERSION, instance=self.instance))
        except RegistryError as exc:
            reply = {"ok": False, "code": exc.code, "error": str(exc)}
        except Exception:  # a bug must answer, not kill the connection or the process
            LOG.exception("API request failed")
            reply = {"ok": False, "code": "internal", "error": "internal error (logged)"}
        reply.update(v=API_VERSION, instance=self.instance)
        if req is not None:
            reply["req"] = req
        return reply

    def _keep_ref(self, ref: tuple[str, str], reply: dict) -> None:
        """Remember `reply` for the client's retry reference `ref` (on the loop), dropping
        the oldest beyond MAX_REFS or REF_KEEP_S."""
        now = time.monotonic()
        refs = self.done_refs
        refs[ref] = (now, reply)
        while refs and (len(refs) > MAX_REFS or next(iter(refs.values()))[0] < now - REF_KEEP_S):
            refs.popitem(last=False)

    async def handle_on_loop(self, request: object, identity: Identity = INSECURE) -> dict:
        """Answer one request from a task of the controller's loop (serve_connection_on_loop):
        at once on the loop when it cannot block (reads, cancels, and submits, updates and
        link changes of at most LOOP_FLOWS flows that wait for no agent, file listing or
        shared store; those hold the policy, waiting for a running round), else `handle` in a
        worker thread. Never raises."""
        owner = self.controller.owner
        where = _where(self.controller, request)
        if where == "loop":
            return self.handle(request, identity)
        if where == "policy":
            async with owner.policy_for_loop():
                return self.handle(request, identity)
        return await trio.to_thread.run_sync(self.handle, request, identity)

    def _dispatch(self, request: object, identity: Identity) -> dict:
        if not isinstance(request, dict):
            raise RegistryError("bad_request", "request must be a map")
        if INVALID in request:
            raise RegistryError("bad_request", f"malformed request: {request[INVALID]}")
        if request.get("v") != API_VERSION:
            raise RegistryError("bad_version", f"unsupported version {request.get('v')!r}")
        op = request.get("op")
        handler = _OPS.get(op) if isinstance(op, str) else None
        if handler is None:
            raise RegistryError("bad_request", f"unknown op {op!r:.80}")
        allowed = _ROLES[op]
        if not any(identity.may(role) for role in allowed):
            raise RegistryError(
                "forbidden", f"{identity.role.value} {identity.name!r} may not {_DOING.get(op, op)}"
            )
        reply = handler(self, request, identity)
        self.counts[op] = self.counts.get(op, 0) + 1
        return reply

    # -- ownership: a job client sees and changes only the coflows it submitted

    def _owned(self, coflow_id: object, identity: Identity) -> object:
        """Return `coflow_id` when `identity` may see/change that coflow.

        Raises:
            RegistryError("unknown_coflow"): not this client's coflow (the same reply as
                for an id that does not exist, so ids of others are not disclosed).
        """
        if identity.may(Role.OPERATOR):
            return coflow_id
        known, owner = self.controller.owner_of(coflow_id)
        if not known or owner != identity.name:
            raise RegistryError("unknown_coflow", f"unknown coflow {coflow_id!r:.40}")
        return coflow_id

    def _hello(self, request: dict, identity: Identity) -> dict:
        return {"version": API_VERSION, "name": identity.name, "role": identity.role.value}

    def _submit(self, request: dict, identity: Identity) -> dict:
        _only(request, {"flows", "deadline", "coflow", "age_s", "name", "tags", "sync"})
        wanted = request.get("coflow")
        flows, deadline = request.get("flows"), request.get("deadline")
        ref = _ref_of(request, identity)
        submit_tenant(self.controller, identity)  # its certificate's tenant, or unknown_tenant
        self.controller.await_agents(flows)  # agents coming back after a restart/failover
        cid = self.controller.submit(flows, deadline, wanted, request.get("age_s"), identity.name,
                                     request.get("name"), request.get("tags"),
                                     ref[1] if ref else None,
                                     request.get("sync", False))  # fmt: skip
        return {"coflow": cid}

    def _status(self, request: dict, identity: Identity) -> dict:
        _only(request, {"coflow"})
        status = self.controller.status(self._owned(request.get("coflow"), identity))
        return {"status": with_tenant(self.controller, status)}

    def _update(self, request: dict, identity: Identity) -> dict:
        _only(request, {"coflow", "flows"})
        self.controller.update(self._owned(request.get("coflow"), identity), request.get("flows"))
        return {}

    def _cancel(self, request: dict, identity: Identity) -> dict:
        _only(request, {"coflow"})
        self.controller.cancel(self._owned(request.get("coflow"), identity))
        return {}

    def _list(self, request: dict, identity: Identity) -> dict:
        keys = ("id", "state", "bytes_total", "bytes_delivered", "cct_s", "name", "tags")
        coflows = list(self.controller.snapshot().coflows)
        every = identity.may(Role.OPERATOR)
        if not every:
            mine = self.controller.coflows_of(identity.name)
            coflows = [c for c in coflows if c["id"] in mine]
        # and those ended before a restart or failover, or still to be resumed
        coflows += self.controller.journal_only_statuses(identity.name, every)
        return {"coflows": [{k: c[k] for k in keys} for c in coflows]}

    def _agents(self, request: dict, identity: Identity) -> dict:
        _only(request, set())
        return self.controller.agents_view()

    def _login(self, request: dict, identity: Identity) -> dict:
        _only(request, {"ttl_s"})
        try:
            token, expires = issue_token(self.controller.token_key, identity,
                                         request.get("ttl_s", DEFAULT_TTL_S))  # fmt: skip
        except TokenError as exc:
            raise RegistryError("bad_request", str(exc)) from exc
        LOG.info("REST token issued to %s %s until %d", identity.role.value, identity.name,
                 expires)  # fmt: skip
        return {"token": token, "expires": expires, "name": identity.name,
                "role": identity.role.value}  # fmt: skip

    def _link_state(self, request: dict, identity: Identity) -> dict:
        _only(request, {"a", "b", "up"})
        changed = self.controller.set_link_state(
            request.get("a"), request.get("b"), request.get("up")
        )
        return {"changed": changed}

    def _capacity(self, request: dict, identity: Identity) -> dict:
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
    "cancel": ApiHandler._cancel,
    "list": ApiHandler._list,
    "agents": ApiHandler._agents,
    "link_state": ApiHandler._link_state,
    "capacity": ApiHandler._capacity,
    "login": ApiHandler._login,
    **TENANT_OPS,
}
_JOBS = (Role.JOB, Role.OPERATOR)
_ROLES = {  # op -> roles allowed to call it
    "hello": (Role.JOB, Role.OPERATOR, Role.AGENT),
    "submit": _JOBS,
    "status": _JOBS,
    "update": _JOBS,
    "cancel": _JOBS,
    "list": _JOBS,
    "agents": _JOBS,
    "link_state": (Role.OPERATOR,),
    "capacity": (Role.OPERATOR,),
    "login": _JOBS,
    **TENANT_ROLES,
}
_DOING = {  # op -> what it does, for "forbidden: job 'etl' may not list tenants"
    "hello": "say hello",
    "submit": "submit coflows",
    "status": "see a coflow's status",
    "update": "update coflows",
    "cancel": "cancel coflows",
    "list": "list coflows",
    "agents": "list agents",
    "link_state": "change link states",
    "capacity": "change link capacities",
    "login": "log in",
    "tenant": "see a tenant",
    "tenants": "list tenants",
    "tenant_set": "add or change tenants",
    "tenant_remove": "remove tenants",
    "tenant_reserve": "reserve rates for tenants",
    "tenant_unreserve": "drop tenants' reserved rates",
}
_COMMON_FIELDS = {"v", "op", "req", "ref"}


def _hashable(value: object) -> bool:
    return isinstance(value, int | str) and not isinstance(value, bool)


def _ref_of(request: object, identity: Identity) -> tuple[str, str] | None:
    """The retry reference (client name, ref) of a submit/update request, if usable."""
    if not isinstance(request, dict) or request.get("op") not in ("submit", "update"):
        return None
    ref = request.get("ref")
    if isinstance(ref, str) and 0 < len(ref) <= 64:
        return identity.name, ref
    return None


POLICY_OPS = frozenset({"submit", "update", "link_state", "capacity"})
LOOP_FLOWS = 1000  # a submit or update of more flows is parsed in a worker thread


def _where(controller: Controller, request: object) -> str:
    """Where `ApiHandler.handle_on_loop` answers `request`: "loop" (at once), "policy" (on
    the loop, holding the policy) or "thread" (a worker thread: it may wait)."""
    op = request.get("op") if isinstance(request, dict) else None
    if not isinstance(op, str):
        return "loop"  # refused at once
    if op in TENANT_OPS:
        return "thread"
    if op not in POLICY_OPS:
        return "loop"  # reads, cancels, logins (and unknown ops, refused)
    journal = controller.journal
    if journal.store is not None or journal.failing is not None:
        return "thread"  # the reply waits for the shared store
    if op in ("submit", "update"):
        flows, sync = request.get("flows"), request.get("sync", False)
        if not isinstance(flows, list) or len(flows) > LOOP_FLOWS:
            return "thread"
        if controller.files is not None and any(needs_listing(f, sync) for f in flows):
            return "thread"  # asks the senders about their files
        if op == "submit" and not controller.agents_here(flows):
            return "thread"  # waits for agents coming back (await_agents)
    return "policy"


def _only(request: dict, fields: set[str]) -> None:
    unknown = set(request) - fields - _COMMON_FIELDS
    if unknown:
        raise RegistryError("bad_request", f"unknown fields {sorted(map(str, unknown))}")


# ---- server ---------------------------------------------------------------------------------


async def serve_connection_on_loop(
    handler: ApiHandler, sock: socket.socket, addr, identity=INSECURE
) -> None:
    """Answer requests on one authenticated connection, as a task of the owner's loop
    (`sock` non-blocking; ApiHandler.handle_on_loop), until EOF, a malformed message (answered
    "bad_message") or `IDLE_S` without a request; then the caller closes it."""
    reader = FrameReader(sock)
    try:
        with reader.idle:  # a connection idle for IDLE_S leaves it: closed quietly
            await _serve_requests(handler, sock, addr, identity, reader)
    except (OSError, EOFError) as exc:
        LOG.debug("API %s: connection ended: %s", addr, exc)


async def _serve_requests(
    handler: ApiHandler, sock: socket.socket, addr, identity, reader: FrameReader
) -> None:
    while True:
        try:
            body = await reader.read(handler.frame_timeout_s, IDLE_S)
            if body is None:
                return
            request = decode_request(body)
        except WireError as exc:
            LOG.warning("API %s (%s): %s; closing", addr, identity.name, exc)
            message = {"v": API_VERSION, "ok": False, "code": "bad_message",
                       "error": str(exc), "instance": handler.instance}  # fmt: skip
            try:
                await send_all(sock, pack_message(message))
            except OSError:
                pass
            return
        reply = await handler.handle_on_loop(request, identity)
        await send_all(sock, _packed_reply(handler, reply))
        if not reader.waited:  # a client sending without waiting lets the others in too
            await trio.lowlevel.checkpoint()
        reader.waited = False


def _packed_reply(handler: ApiHandler, reply: dict) -> bytes:
    """The encoded reply; a reply too large to send (e.g. an echoed "req" or a long bad
    value quoted in an error) is replaced by a short error reply."""
    try:
        return pack_message(reply)
    except WireError:
        return pack_message(
            {
                "v": API_VERSION,
                "ok": False,
                "code": "reply_too_large",
                "error": f"the reply exceeds {MAX_MESSAGE_BYTES} bytes",
                "instance": handler.instance,
            }
        )


def start_api_server(
    handler: ApiHandler, host: str, port: int, security: ServerSecurity, spawn=None
):
    """Serve the coflow API on host:port (see `transport.listen_and_serve`; its connection
    counts go to the controller's metrics under "coflow API"): each authenticated
    connection is a task of the controller's loop (serve_connection_on_loop)."""
    result = listen_and_serve(
        host, port,
        lambda sock, addr, ident: serve_connection_on_loop(handler, sock, addr, ident),
        security, spawn, name="coflow API", listeners=handler.controller.metrics.listeners,
        owner=handler.controller.owner,
    )  # fmt: skip
    LOG.info("coflow API on %s:%d (%s)", *result[2], "TLS" if security.context else "INSECURE")
    return result
