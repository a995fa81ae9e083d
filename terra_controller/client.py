"""TerraClient: the job master's synchronous coflow API client (DESIGN.md section 6).

Plain blocking sockets, one persistent TCP connection, the wire format of
`terra_controller.api_server`. When the connection breaks the client
reconnects (retrying until its timeout); when it finds a different controller
instance (the controller restarted) it first resubmits every coflow it
submitted that is not known to be done, under the same ids and with all flows
added by updates, so the restarted controller can rebuild its state
(issue 4 item 6).

Example:
    c = TerraClient("127.0.0.1", 7000)
    cid = c.submit_coflow([{"id": "f1", "src": "a1", "dst": "a2", "bytes": 10_000_000}])
    c.wait(cid, timeout=60)
"""

from __future__ import annotations

import secrets
import socket
import time

from terra_controller.api_server import API_VERSION, pack_message, read_message


class TerraError(Exception):
    """The controller refused a request.

    Attributes:
        code: the reply's code ("unknown_coflow", "unknown_agent", "duplicate_flow",
            "bad_size", "bad_request", "bad_token", "coflow_done", "no_path", ...).
    """

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code


class TerraClient:
    """Synchronous client of the coflow API.

    Args:
        host, port: the controller's API address.
        token: the shared token when the controller requires one.
        timeout: seconds to keep trying to (re)connect and to wait for a reply.

    Raises (from every call):
        TerraError: the controller answered with an error.
        ConnectionError: no controller reachable within `timeout`.
    """

    def __init__(self, host: str, port: int, token: str | None = None, timeout: float = 30.0):
        self.addr = (host, int(port))
        self.token = token
        self.timeout = timeout
        self.sock: socket.socket | None = None
        self.instance: str | None = None
        # coflow id -> {"flows": [...], "deadline_at": monotonic s or None}; for resubmission
        self.open: dict[int, dict] = {}

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
        cid = self._call(request)["coflow"]
        if cid >= 0:
            deadline_at = None if deadline is None else time.monotonic() + deadline
            self.open[cid] = {"flows": list(flows), "deadline_at": deadline_at}
        return cid

    def check_status(self, coflow_id: int) -> dict:
        """checkStatus: state, bytes_total, bytes_delivered, cct_s, flows (per-flow progress).

        Returns:
            the status map of `CoflowState.status` plus each flow's current "rate" (bytes/s).
        """
        status = self._call({"op": "status", "coflow": coflow_id})["status"]
        if status["state"] == "done":
            self.open.pop(coflow_id, None)
        return status

    def update_coflow(self, coflow_id: int, flows: list[dict]) -> None:
        """updateCoflow: add flows (same shape as submit_coflow's) to an unfinished coflow."""
        self._call(
            {"op": "update", "coflow": coflow_id, "flows": flows, "ref": secrets.token_hex(12)}
        )
        if coflow_id in self.open:
            self.open[coflow_id]["flows"].extend(flows)

    def wait(self, coflow_id: int, timeout: float, poll_s: float = 0.05) -> dict:
        """Poll check_status until the coflow is done.

        Returns:
            the final status map.

        Raises:
            TimeoutError: not done within `timeout` seconds.
        """
        end = time.monotonic() + timeout
        while True:
            status = self.check_status(coflow_id)
            if status["state"] in ("done", "rejected"):
                return status
            if time.monotonic() >= end:
                raise TimeoutError(f"coflow {coflow_id} not done after {timeout} s: {status}")
            time.sleep(poll_s)

    def list_coflows(self) -> list[dict]:
        """Return [{id, state, bytes_total, bytes_delivered, cct_s}] for every coflow."""
        return self._call({"op": "list"})["coflows"]

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
        if self.token is not None:
            message["token"] = self.token
        self.sock.sendall(pack_message(message))
        reply = read_message(self.sock, frame_timeout=self.timeout)
        if reply is None:
            raise ConnectionError("controller closed the connection")
        return reply

    def _connected(self) -> None:
        """Connect if needed; on a new connection say hello and resubmit after a restart."""
        if self.sock is not None:
            return
        sock = socket.create_connection(self.addr, timeout=self.timeout)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sock = sock
        instance = self._roundtrip({"op": "hello"}).get("instance")
        if self.instance is not None and instance != self.instance:
            self._resubmit()
        self.instance = instance

    def _resubmit(self) -> None:
        """A new controller instance answered: resubmit open coflows under their ids.

        Agents may not have re-registered yet, so "unknown_agent" is retried until
        the client's timeout; a coflow refused for any other reason is forgotten.
        """
        for cid, info in sorted(self.open.items()):
            end = time.monotonic() + self.timeout
            while True:
                request = {"op": "submit", "coflow": cid, "flows": info["flows"]}
                if info["deadline_at"] is not None:
                    request["deadline"] = max(info["deadline_at"] - time.monotonic(), 1e-3)
                reply = self._roundtrip(request)
                if reply.get("code") == "unknown_agent" and time.monotonic() < end:
                    time.sleep(0.1)
                    continue
                if not reply.get("ok") or reply.get("coflow", -1) < 0:
                    self.open.pop(cid)
                break
