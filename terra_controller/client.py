"""TerraClient: the job master's synchronous coflow API client (docs/design.md section 6).

Plain blocking sockets, one persistent TCP connection, the wire format of
`terra_controller.api_server`; the protocol itself (requests, replies, refs, errors, the
coflows to resubmit) is `terra_wire.api_session.ClientSession`, which `AsyncTerraClient`
(async_client.py) shares. When the connection breaks the client
reconnects (retrying until its timeout); when it finds a different controller
instance (the controller restarted) it first resubmits every coflow it
submitted that is not known to be finished, under the same ids, with all flows
added by updates and with its age (seconds since its first submission, so its
CCT still counts from then), so the restarted controller can rebuild its state.

Several controllers (a highly available controller: one leader, standbys answering every
request with a "not_leader" error naming the leader): give them all, ``controllers=[
"HOST:PORT", ...]``. On a connection failure or a standby's reply the client tries the
leader the reply names, else the next address, until its timeout, and sends the request
again there unchanged (terra_wire/failover.py `Retry`: a submit or update keeps its "ref",
so the controller runs it once). A leader that answers hello with another instance id than
the last one counts as a restarted controller: the open coflows are resubmitted there.

A coflow ends in one of the final states "done", "failed" (a flow cannot run;
the status's "reason" says why), "cancelled" (cancel_coflow) or "rejected";
`wait` returns on any of them.

The connection is mutual TLS: the client presents its own certificate (role
"job", or "operator" for operator commands) from a PKI directory made by
`terra-controller pki` and verifies the controller's. Plain TCP only with
``insecure=True`` (a controller started with --insecure).

Example:
    c = TerraClient("127.0.0.1", 7000, pki="pki/", name="job1")
    c = TerraClient(controllers=["10.0.0.1:7000", "10.0.0.2:7000"], pki="pki/", name="job1")
    cid = c.submit_coflow([{"id": "f1", "src": "a1", "dst": "a2", "bytes": 10_000_000}])
    c.wait(cid, timeout=60)
"""

from __future__ import annotations

import logging
import os
import socket
import time
from typing import Any

from terra_controller.transport import connect_tls, read_message
from terra_security.pki import client_context
from terra_wire.api import Message
from terra_wire.api_session import (
    FINAL,
    GONE,
    MAX_OPEN,
    Call,
    ClientSession,
    T,
    TerraError,
    frame,
)
from terra_wire.failover import NotLeader, Retry, check_leader, client_controllers

__all__ = ["FINAL", "GONE", "MAX_OPEN", "TerraClient", "TerraError"]
LOG = logging.getLogger("terra.client")
FILES_TIMEOUT_S = 600.0  # a submit naming files: the agents list (and hash) them first


def tls_context(pki, name: str | None, insecure: bool, where: object, who: str):
    """The client's mutual-TLS context (PKI directory `pki`, certificate `name`), or None
    with `insecure` (logs a warning naming `who` and `where`, the controllers).

    Raises:
        ValueError: neither pki and name nor insecure given. PkiError, ssl.SSLError.
    """
    if insecure:
        LOG.warning("%s: plain TCP to %s, no authentication (insecure)", who, where)
        return None
    if pki is None or name is None:
        raise ValueError(f"{who} needs pki=DIR and name=NAME (or insecure=True)")
    return client_context(pki, name)


class TerraClient:
    """Synchronous client of the coflow API.

    Args:
        host, port: the controller's API address; or instead
        controllers: the API addresses of several controllers (a leader and its standbys),
            "HOST:PORT" strings or (host, port) pairs, tried in turn (module docstring).
        pki: PKI directory holding ca.crt, NAME.crt and NAME.key.
        name: this client's name (its certificate's).
        insecure: plain TCP without certificates (a controller run with --insecure);
            logs a warning.
        timeout: seconds to keep trying to (re)connect and to wait for a reply.
        max_open: coflows remembered for resubmission after a controller restart (`open`).

    Attributes:
        session: the ClientSession (protocol state).
        controllers: the ControllerList (terra_wire/failover.py; `addr` is the one in use).
        open: {coflow id: its flows, deadline, first submission time, name and tags} of the
            coflows this client submitted and has not yet learned to be finished. An entry
            goes when a reply shows the coflow in a final state (check_status, wait,
            list_coflows) or gone (cancel_coflow, "coflow_done" / "unknown_coflow"); beyond
            `max_open` entries the oldest go (those coflows are then not resubmitted;
            `forgotten` counts them).

    Raises (constructor):
        ValueError: neither pki and name nor insecure=True given; neither host and port
            nor controllers given (or both), or a malformed address.
        PkiError: a certificate file is missing; ssl.SSLError: unreadable.

    Raises (from every call):
        TerraError: the controller answered with an error.
        ConnectionError: no controller (no leader) reachable within `timeout`: one line
            naming the addresses tried and the last failure.
    """

    def __init__(
        self,
        host: str | None = None,
        port: int | None = None,
        pki: str | os.PathLike | None = None,
        name: str | None = None,
        insecure: bool = False,
        timeout: float = 30.0,
        max_open: int = MAX_OPEN,
        controllers: list[str] | None = None,
    ):
        self.controllers = client_controllers(host, port, controllers)
        self.context = tls_context(pki, name, insecure, self.controllers, type(self).__name__)
        self.timeout = timeout
        self.sock: socket.socket | None = None
        self.session = ClientSession(max_open)

    @property
    def addr(self) -> tuple[str, int]:
        """The API address in use (or tried next)."""
        return self.controllers.current

    @property
    def open(self) -> dict[int, dict[str, Any]]:
        """The coflows to resubmit after a controller restart (ClientSession.open)."""
        return self.session.open

    @property
    def max_open(self) -> int:
        """Coflows remembered for resubmission at most."""
        return self.session.max_open

    @max_open.setter
    def max_open(self, value: int) -> None:
        self.session.max_open = value

    @property
    def forgotten(self) -> int:
        """Open coflows forgotten beyond `max_open` (not resubmitted)."""
        return self.session.forgotten

    # ---- API ----------------------------------------------------------------------------

    def submit_coflow(
        self,
        flows: list[dict],
        deadline: float | None = None,
        name: str | None = None,
        tags: list[str] | None = None,
        sync: bool = False,
    ) -> int:
        """submitCoflow: submit a coflow.

        Args:
            flows: [{"id": str, "src": agent id, "dst": agent id, "bytes"?: int > 0,
                "src_path"?: file, directory ("dir/") or glob at the sender, "dst_path"?:
                file (or directory the tree is recreated in) at the receiver}]; bytes may be
                left out of a flow with a src_path (the sender reports the size).
            deadline: seconds from now, or None.
            name: a label for people (1..128 printable characters), or None.
            tags: labels (at most 16 distinct strings of 1..64 printable characters).
            sync: skip the files whose destination already has the same size and SHA-256
                (they count as done, status flows say "skipped": true).

        A submit naming files waits up to FILES_TIMEOUT_S for its reply (the agents list,
        and with sync hash, the files first).

        Returns:
            the coflow id (>= 0), or -1 when the deadline cannot be met.

        Raises:
            TerraError("bad_request"): a bad name or tags (checked before sending).
        """
        call = self.session.submit(flows, deadline, name, tags, sync)
        if not any(isinstance(f, dict) and "src_path" in f for f in flows):
            return self._run(call)
        saved = self.timeout
        self.timeout = max(saved, FILES_TIMEOUT_S)
        try:
            if self.sock is not None:
                self.sock.settimeout(self.timeout)
            return self._run(call)
        finally:
            self.timeout = saved
            if self.sock is not None:
                self.sock.settimeout(saved)

    def check_status(self, coflow_id: int) -> dict:
        """checkStatus: state, bytes_total, bytes_delivered, cct_s, flows (per-flow progress).

        Returns:
            the status map of `CoflowState.status` plus each flow's current "rate_bytes_per_s":
            {"id", "state", "reason" (why it failed / was cancelled, else None), "bytes_total",
            "bytes_delivered", "cct_s" (s, None until done), "deadline_s", "name", "tags",
            "flows": [...]}.

        Raises:
            TerraError("unknown_coflow"): no such coflow (or finished long ago and dropped).
        """
        return self._run(self.session.status(coflow_id))

    def cancel_coflow(self, coflow_id: int) -> None:
        """cancelCoflow: stop an unfinished coflow for good; check_status then says
        "cancelled" and its capacity goes to the other coflows in the next round.
        Cancelling it again is harmless.

        Raises:
            TerraError: "coflow_done" (already done, failed or rejected), "unknown_coflow".
        """
        self._run(self.session.cancel(coflow_id))

    def update_coflow(self, coflow_id: int, flows: list[dict]) -> None:
        """updateCoflow: add flows (same shape as submit_coflow's) to an unfinished coflow."""
        self._run(self.session.update(coflow_id, flows))

    def wait(self, coflow_id: int, timeout: float, poll_s: float = 0.05) -> dict:
        """Poll check_status every `poll_s` seconds until the coflow is in a final state
        (done, failed, cancelled or rejected: check "state", and "reason" when failed).

        Returns:
            the final status map.

        Raises:
            TimeoutError: still unfinished after `timeout` seconds.
        """
        end = time.monotonic() + timeout
        while True:
            status = self.check_status(coflow_id)
            if status["state"] in FINAL:
                return status
            if time.monotonic() >= end:
                raise TimeoutError(f"coflow {coflow_id} not done after {timeout} s: {status}")
            time.sleep(poll_s)

    def login(self, ttl_s: float | None = None) -> dict:
        """A short-lived REST token for this client's certificate (its name and role):
        {"token", "expires" (UNIX s), "name", "role"}; ttl_s: lifetime (default 900 s)."""
        return self._run(self.session.login(ttl_s))

    def list_coflows(self) -> list[dict]:
        """Return [{id, state, bytes_total, bytes_delivered, cct_s, name, tags}] for every
        coflow (of this client's; operators: all); forgets the finished ones in `open`."""
        return self._run(self.session.coflows())

    def list_agents(self) -> dict:
        """The agents a coflow's flows may name: {"dcs": [DC names], "agents": [{"id", "dc",
        "connected": bool}]} (API op "agents"; job and operator certificates)."""
        return self._run(self.session.agents())

    def set_link_state(self, a: str, b: str, up: bool) -> bool:
        """Operator command: set WAN link a-b up or down (used with --no-openflow).

        Returns:
            True when the link state changed.
        """
        return self._run(self.session.link_state(a, b, up))

    def set_capacity(self, a: str, b: str, bytes_per_s: float) -> bool:
        """Operator command: set the capacity of WAN link a-b in bytes/s."""
        return self._run(self.session.capacity(a, b, bytes_per_s))

    def tenant_request(self, request: dict) -> dict:
        """A tenant operation (terra_controller/tenant_api.py: "tenant", "tenants",
        "tenant_set", "tenant_remove"); its reply map. TerraError when refused."""
        return self._call(request)

    submitCoflow = submit_coflow  # noqa: N815 (the paper's names)
    checkStatus = check_status  # noqa: N815
    updateCoflow = update_coflow  # noqa: N815
    cancelCoflow = cancel_coflow  # noqa: N815

    def close(self) -> None:
        """Close the connection (the next call reconnects)."""
        if self.sock is not None:
            self.sock.close()
            self.sock = None

    def __enter__(self) -> TerraClient:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ---- plumbing -----------------------------------------------------------------------

    def _run(self, call: Call[T]) -> T:
        return self.session.finish(call, self._exchange(call.request))

    def _call(self, request: dict) -> dict:
        """Send a raw request map; its reply map (TerraError for an error reply)."""
        return self._run(Call(request, lambda reply: reply))

    def _exchange(self, request: dict) -> dict:
        """Send one request and return its reply; on a connection failure or a standby's
        reply, send it again (unchanged) at the next controller (failover.Retry)."""
        retry = Retry(self.controllers, self.timeout)
        while True:
            address = self.controllers.current
            try:
                self._connected(address, retry.remaining())
                reply = self._roundtrip(request)
            except (OSError, EOFError, NotLeader) as exc:
                self.close()
                time.sleep(retry.failed(address, exc))
                continue
            self.controllers.reached()
            return reply

    def _roundtrip(self, request: dict) -> Message:
        """One request and its reply on the open connection.

        Raises:
            NotLeader: a standby answered. ConnectionError: the connection closed.
        """
        self.sock.sendall(frame(request))
        reply = read_message(self.sock, frame_timeout=self.timeout)
        if reply is None:
            raise ConnectionError("controller closed the connection")
        return check_leader(reply)

    def _connected(self, address: tuple[str, int], connect_s: float) -> None:
        """Connect to `address` if not connected (within `connect_s` seconds); on a new
        connection say hello and resubmit after a restart."""
        if self.sock is not None:
            return
        self.sock = connect_tls(*address, self.context, min(self.timeout, connect_s))
        self.sock.settimeout(self.timeout)
        if self.session.restarted(self._roundtrip(self.session.hello().request)):
            self._resubmit()

    def _resubmit(self) -> None:
        """A new controller instance answered: resubmit open coflows under their ids
        (ClientSession.resubmit_request), retrying "unknown_agent" until the client's
        timeout (agents may not have re-registered yet)."""
        for cid in self.session.resubmissions():
            end = time.monotonic() + self.timeout
            while True:
                reply = self._roundtrip(self.session.resubmit_request(cid))
                if not self.session.resubmitted(cid, reply, time.monotonic() < end):
                    break
                time.sleep(0.1)
