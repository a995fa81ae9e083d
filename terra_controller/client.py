"""TerraClient: the job master's synchronous coflow API client (docs/design.md section 6).

Plain blocking sockets, one persistent TCP connection, the wire format of
`terra_controller.api_server`. When the connection breaks the client
reconnects (retrying until its timeout); when it finds a different controller
instance (the controller restarted) it first resubmits every coflow it
submitted that is not known to be finished, under the same ids, with all flows
added by updates and with its age (seconds since its first submission, so its
CCT still counts from then), so the restarted controller can rebuild its state.

A coflow ends in one of the final states "done", "failed" (a flow cannot run;
the status's "reason" says why), "cancelled" (cancel_coflow) or "rejected";
`wait` returns on any of them.

The connection is mutual TLS: the client presents its own certificate (role
"job", or "operator" for operator commands) from a PKI directory made by
`terra-controller pki` and verifies the controller's. Plain TCP only with
``insecure=True`` (a controller started with --insecure).

Example:
    c = TerraClient("127.0.0.1", 7000, pki="pki/", name="job1")
    cid = c.submit_coflow([{"id": "f1", "src": "a1", "dst": "a2", "bytes": 10_000_000}])
    c.wait(cid, timeout=60)
"""

from __future__ import annotations

import logging
import os
import secrets
import socket
import time

from terra_controller.transport import connect_tls, read_message
from terra_model.states import FINAL_STATES
from terra_security.pki import client_context
from terra_wire.api import API_VERSION, pack_message

LOG = logging.getLogger("terra.client")
FINAL = frozenset(s.value for s in FINAL_STATES)  # the states wait() returns on
MAX_OPEN = 10_000  # coflows remembered for resubmission (the oldest are forgotten first)
GONE = frozenset({"coflow_done", "unknown_coflow"})  # errors saying a coflow is not open


class TerraError(Exception):
    """The controller refused a request.

    Attributes:
        code: the reply's code ("unknown_coflow", "unknown_agent", "duplicate_flow",
            "bad_size", "bad_request", "bad_token", "coflow_done", "no_path", "path_busy"
            (a flow's dst_path is being written by another flow), "too_many_flows", ...).
    """

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code


class TerraClient:
    """Synchronous client of the coflow API.

    Args:
        host, port: the controller's API address.
        pki: PKI directory holding ca.crt, NAME.crt and NAME.key.
        name: this client's name (its certificate's).
        insecure: plain TCP without certificates (a controller run with --insecure);
            logs a warning.
        timeout: seconds to keep trying to (re)connect and to wait for a reply.
        max_open: coflows remembered for resubmission after a controller restart (`open`).

    Attributes:
        open: {coflow id: its flows, deadline and first submission time} of the coflows this
            client submitted and has not yet learned to be finished. An entry goes when a
            reply shows the coflow in a final state (check_status, wait, list_coflows) or
            gone (cancel_coflow, "coflow_done" / "unknown_coflow"); beyond `max_open`
            entries the oldest go (those coflows are then not resubmitted; `forgotten`
            counts them).

    Raises (constructor):
        ValueError: neither pki and name nor insecure=True given.
        PkiError: a certificate file is missing; ssl.SSLError: unreadable.

    Raises (from every call):
        TerraError: the controller answered with an error.
        ConnectionError: no controller reachable within `timeout`.
    """

    def __init__(
        self,
        host: str,
        port: int,
        pki: str | os.PathLike | None = None,
        name: str | None = None,
        insecure: bool = False,
        timeout: float = 30.0,
        max_open: int = MAX_OPEN,
    ):
        self.addr = (host, int(port))
        if insecure:
            LOG.warning("TerraClient: plain TCP to %s:%d, no authentication (insecure)", *self.addr)
            self.context = None
        elif pki is None or name is None:
            raise ValueError("TerraClient needs pki=DIR and name=NAME (or insecure=True)")
        else:
            self.context = client_context(pki, name)
        self.timeout = timeout
        self.sock: socket.socket | None = None
        self.instance: str | None = None
        # coflow id -> {"flows": [...], "deadline_at": monotonic s or None, "submitted_at":
        # monotonic s of the first submission}; coflows not known to be finished, for
        # resubmission, oldest first
        self.open: dict[int, dict] = {}
        self.max_open = max_open
        self.forgotten = 0

    # ---- API ----------------------------------------------------------------------------

    def submit_coflow(self, flows: list[dict], deadline: float | None = None) -> int:
        """submitCoflow: submit a coflow.

        Args:
            flows: [{"id": str, "src": agent id, "dst": agent id, "bytes": int > 0,
                "src_path"?: file at the sender, "dst_path"?: file at the receiver}].
            deadline: seconds from now, or None.

        Returns:
            the coflow id (>= 0), or -1 when the deadline cannot be met.
        """
        request = {"op": "submit", "flows": flows, "ref": secrets.token_hex(12)}
        if deadline is not None:
            request["deadline"] = deadline
        submitted_at = time.monotonic()
        cid = self._call(request)["coflow"]
        if cid >= 0:
            deadline_at = None if deadline is None else submitted_at + deadline
            self._remember(cid, list(flows), deadline_at, submitted_at)
        return cid

    def check_status(self, coflow_id: int) -> dict:
        """checkStatus: state, bytes_total, bytes_delivered, cct_s, flows (per-flow progress).

        Returns:
            the status map of `CoflowState.status` plus each flow's current "rate_bytes_per_s":
            {"id", "state", "reason" (why it failed / was cancelled, else None), "bytes_total",
            "bytes_delivered", "cct_s" (s, None until done), "deadline_s", "flows": [...]}.

        Raises:
            TerraError("unknown_coflow"): no such coflow (or finished long ago and dropped).
        """
        status = self._call_about(coflow_id, {"op": "status", "coflow": coflow_id})["status"]
        self._learned(coflow_id, status["state"])
        return status

    def cancel_coflow(self, coflow_id: int) -> None:
        """cancelCoflow: stop an unfinished coflow for good; check_status then says
        "cancelled" and its capacity goes to the other coflows in the next round.
        Cancelling it again is harmless.

        Raises:
            TerraError: "coflow_done" (already done, failed or rejected), "unknown_coflow".
        """
        self._call_about(coflow_id, {"op": "cancel", "coflow": coflow_id})
        self.open.pop(coflow_id, None)

    def update_coflow(self, coflow_id: int, flows: list[dict]) -> None:
        """updateCoflow: add flows (same shape as submit_coflow's) to an unfinished coflow."""
        self._call(
            {"op": "update", "coflow": coflow_id, "flows": flows, "ref": secrets.token_hex(12)}
        )
        if coflow_id in self.open:
            self.open[coflow_id]["flows"].extend(flows)

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

    def list_coflows(self) -> list[dict]:
        """Return [{id, state, bytes_total, bytes_delivered, cct_s}] for every coflow (of
        this client's; operators: all); forgets the finished ones in `open`."""
        coflows = self._call({"op": "list"})["coflows"]
        for c in coflows:
            self._learned(c["id"], c["state"])
        return coflows

    def list_agents(self) -> dict:
        """The agents a coflow's flows may name: {"dcs": [DC names], "agents": [{"id", "dc",
        "connected": bool}]} (API op "agents"; job and operator certificates)."""
        reply = self._call({"op": "agents"})
        return {"dcs": reply["dcs"], "agents": reply["agents"]}

    def set_link_state(self, a: str, b: str, up: bool) -> bool:
        """Operator command: set WAN link a-b up or down (used with --no-openflow).

        Returns:
            True when the link state changed.
        """
        return self._call({"op": "link_state", "a": a, "b": b, "up": up})["changed"]

    def set_capacity(self, a: str, b: str, bytes_per_s: float) -> bool:
        """Operator command: set the capacity of WAN link a-b in bytes/s."""
        return self._call({"op": "capacity", "a": a, "b": b, "bytes_per_s": bytes_per_s})["changed"]

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

    def _remember(self, cid: int, flows: list[dict], deadline_at, submitted_at: float) -> None:
        """Keep a submitted coflow in `open`, forgetting the oldest beyond max_open."""
        self.open[cid] = {"flows": flows, "deadline_at": deadline_at, "submitted_at": submitted_at}
        while len(self.open) > self.max_open:
            oldest = next(iter(self.open))
            del self.open[oldest]
            self.forgotten += 1
            LOG.debug("coflow %d forgotten: more than %d open coflows", oldest, self.max_open)

    def _learned(self, cid: int, state: str) -> None:
        """A reply showed coflow `cid` in `state`: forget it if that is final."""
        if state in FINAL:
            self.open.pop(cid, None)

    def _call_about(self, cid: int, request: dict) -> dict:
        """_call for a request about one coflow; an error saying it is not open (done, or
        unknown: the controller forgot it) forgets it too before it is raised."""
        try:
            return self._call(request)
        except TerraError as exc:
            if exc.code in GONE:
                self.open.pop(cid, None)
            raise

    def _call(self, request: dict) -> dict:
        reply = self._exchange(request)
        if not reply.get("ok"):
            raise TerraError(str(reply.get("code")), str(reply.get("error")))
        return reply

    def _exchange(self, request: dict) -> dict:
        """Send one request and return its reply, reconnecting on connection failures."""
        end = time.monotonic() + self.timeout
        delay = 0.05
        while True:
            try:
                self._connected()
                return self._roundtrip(request)
            except (OSError, EOFError) as exc:
                self.close()
                if time.monotonic() + delay > end:
                    raise ConnectionError(f"controller {self.addr} unreachable: {exc}") from exc
                time.sleep(delay)
                delay = min(delay * 2, 1.0)

    def _roundtrip(self, request: dict) -> dict:
        message = dict(request, v=API_VERSION)
        self.sock.sendall(pack_message(message))
        reply = read_message(self.sock, frame_timeout=self.timeout)
        if reply is None:
            raise ConnectionError("controller closed the connection")
        return reply

    def _connected(self) -> None:
        """Connect if needed; on a new connection say hello and resubmit after a restart."""
        if self.sock is not None:
            return
        self.sock = connect_tls(*self.addr, self.context, self.timeout)
        instance = self._roundtrip({"op": "hello"}).get("instance")
        if self.instance is not None and instance != self.instance:
            self._resubmit()
        self.instance = instance

    def _resubmit(self) -> None:
        """A new controller instance answered: resubmit open coflows under their ids.

        Each carries "age_s", the seconds since its first submission, so the new
        controller counts its CCT from then. Agents may not have re-registered yet, so
        "unknown_agent" is retried until the client's timeout; a coflow refused for any
        other reason is forgotten.
        """
        for cid, info in sorted(self.open.items()):
            end = time.monotonic() + self.timeout
            while True:
                age = max(0.0, time.monotonic() - info["submitted_at"])
                request = {"op": "submit", "coflow": cid, "flows": info["flows"], "age_s": age}
                if info["deadline_at"] is not None:
                    request["deadline"] = max(info["deadline_at"] - time.monotonic(), 1e-3)
                reply = self._roundtrip(request)
                if reply.get("code") == "unknown_agent" and time.monotonic() < end:
                    time.sleep(0.1)
                    continue
                if not reply.get("ok") or reply.get("coflow", -1) < 0:
                    self.open.pop(cid)
                break
