"""AsyncTerraClient: the coflow API client for asyncio programs (docs/design.md section 6).

The same operations, arguments, results and errors as `TerraClient` (client.py), over one
asyncio stream (mutual TLS with the same PKI, or plain TCP with ``insecure=True``); both
drive the same sans-IO `terra_wire.api_session.ClientSession`. Calls may run concurrently
from one event loop, with no thread per call: each request carries a "req" number that the
controller echoes, the requests are pipelined on the connection and one reader task hands
each reply to its caller. When the connection breaks, every call in flight sends its
request again on a new connection (until the client's timeout; a submit or update keeps
its "ref", so the controller executes it once), and a new controller instance gets the
open coflows resubmitted first, as with TerraClient. Several controllers (a leader and its
standbys): ``controllers=["HOST:PORT", ...]``, failed over as TerraClient does (a standby's
"not_leader" reply sends the calls to the leader it names, else to the next address).

Example:
    async with AsyncTerraClient("127.0.0.1", 7000, pki="pki/", name="job1") as c:
        ids = await asyncio.gather(*(c.submit_coflow(flows) for flows in jobs))
        await c.wait(ids[0], timeout=60)
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import socket
import time
from typing import Any

from terra_controller.client import FILES_TIMEOUT_S, tls_context
from terra_security.pki import CONTROLLER_HOSTNAME
from terra_wire.api import Message, WireError
from terra_wire.api_session import (
    FINAL,
    MAX_OPEN,
    Call,
    ClientSession,
    T,
    decode_reply,
    frame,
    reply_length,
)
from terra_wire.failover import NotLeader, Retry, client_controllers, not_leader

LOG = logging.getLogger("terra.client")


class AsyncTerraClient:
    """Asyncio client of the coflow API (arguments as TerraClient's).

    Args:
        host, port: the controller's API address; or instead controllers: several
            controllers' API addresses (a leader and its standbys), tried in turn.
        pki, name: PKI directory and this client's certificate name.
        insecure: plain TCP (logs a warning).
        timeout: seconds to keep trying to (re)connect and to wait for each reply.
        max_open: coflows remembered for resubmission after a controller restart.

    Attributes:
        session: the ClientSession (its `open`, `forgotten`, `instance`).
        controllers: the ControllerList (terra_wire/failover.py; `addr` is the one in use).

    One event loop at a time: after `close()` the client may be used from another loop
    (another `asyncio.run`), with its open coflows still remembered.

    Raises (constructor): ValueError, PkiError, ssl.SSLError as TerraClient's.
    Raises (from every call): TerraError (an error reply); ConnectionError (no controller,
        or no leader, reachable, or no reply, within `timeout`: one line naming the
        addresses tried).
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
    ) -> None:
        self.controllers = client_controllers(host, port, controllers)
        self.context = tls_context(pki, name, insecure, self.controllers, type(self).__name__)
        self.timeout = timeout
        self.session = ClientSession(max_open)
        self._numbers = itertools.count(1)
        # req number -> (the connection it was sent on, the future of its reply)
        self._waiting: dict[int, tuple[asyncio.StreamWriter, asyncio.Future]] = {}
        self._writer: asyncio.StreamWriter | None = None
        self._reader_task: asyncio.Task | None = None
        self._connect_lock: asyncio.Lock | None = None
        self._ready = False  # the connection said hello and resubmitted what was open

    @property
    def addr(self) -> tuple[str, int]:
        """The API address in use (or tried next)."""
        return self.controllers.current

    # ---- API (as TerraClient's) ---------------------------------------------------------

    async def submit_coflow(
        self,
        flows: list[dict],
        deadline: float | None = None,
        name: str | None = None,
        tags: list[str] | None = None,
        sync: bool = False,
    ) -> int:
        """submitCoflow: the coflow id, or -1 when the deadline cannot be met (flows and sync:
        see TerraClient.submit_coflow; a submit naming files waits up to FILES_TIMEOUT_S)."""
        call = self.session.submit(flows, deadline, name, tags, sync)
        if not any(isinstance(f, dict) and "src_path" in f for f in flows):
            return await self._run(call)
        saved, self.timeout = self.timeout, max(self.timeout, FILES_TIMEOUT_S)
        try:
            return await self._run(call)
        finally:
            self.timeout = saved

    async def check_status(self, coflow_id: int) -> dict:
        """checkStatus: the status map (see TerraClient.check_status)."""
        return await self._run(self.session.status(coflow_id))

    async def cancel_coflow(self, coflow_id: int) -> None:
        """cancelCoflow."""
        await self._run(self.session.cancel(coflow_id))

    async def update_coflow(self, coflow_id: int, flows: list[dict]) -> None:
        """updateCoflow: add flows to an unfinished coflow."""
        await self._run(self.session.update(coflow_id, flows))

    async def wait(self, coflow_id: int, timeout: float, poll_s: float = 0.05) -> dict:
        """Poll check_status until the coflow is final; the final status map.

        Raises:
            TimeoutError: still unfinished after `timeout` seconds.
        """
        end = time.monotonic() + timeout
        while True:
            status = await self.check_status(coflow_id)
            if status["state"] in FINAL:
                return status
            if time.monotonic() >= end:
                raise TimeoutError(f"coflow {coflow_id} not done after {timeout} s: {status}")
            await asyncio.sleep(poll_s)

    async def list_coflows(self) -> list[dict]:
        """The coflows this client may see (operators: all)."""
        return await self._run(self.session.coflows())

    async def list_agents(self) -> dict:
        """{"dcs": [...], "agents": [{"id", "dc", "connected"}]}."""
        return await self._run(self.session.agents())

    async def set_link_state(self, a: str, b: str, up: bool) -> bool:
        """Operator command: link a-b up or down; True when it changed."""
        return await self._run(self.session.link_state(a, b, up))

    async def set_capacity(self, a: str, b: str, bytes_per_s: float) -> bool:
        """Operator command: the capacity of link a-b in bytes/s; True when it changed."""
        return await self._run(self.session.capacity(a, b, bytes_per_s))

    submitCoflow = submit_coflow  # noqa: N815 (the paper's names)
    checkStatus = check_status  # noqa: N815
    updateCoflow = update_coflow  # noqa: N815
    cancelCoflow = cancel_coflow  # noqa: N815

    async def close(self) -> None:
        """Close the connection (the next call reconnects, also from another event loop);
        calls in flight resend."""
        await self._drop(self._writer)
        if self._connect_lock is not None and not self._connect_lock.locked():
            self._connect_lock = None  # made again in the loop of the next call

    async def _drop(self, writer: asyncio.StreamWriter | None) -> None:
        """Close `writer`'s connection if it is still the current one."""
        if writer is None or writer is not self._writer:
            return
        task = self._reader_task
        self._writer, self._reader_task, self._ready = None, None, False
        if task is not None:
            task.cancel()
        writer.close()
        try:
            await asyncio.wait_for(writer.wait_closed(), 1.0)
        except (OSError, ConnectionError, TimeoutError):
            pass
        self._fail_waiting(writer, ConnectionError("connection closed"))

    async def __aenter__(self) -> AsyncTerraClient:
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()

    # ---- plumbing -----------------------------------------------------------------------

    async def _run(self, call: Call[T]) -> T:
        return self.session.finish(call, await self._exchange(call.request))

    async def _exchange(self, request: dict[str, Any]) -> dict[str, Any]:
        """Send one request and await its reply; on a connection failure or a standby's
        reply, send it again (unchanged) at the next controller (failover.Retry)."""
        retry = Retry(self.controllers, self.timeout)
        while True:
            address = self.controllers.current
            writer = None
            try:
                writer = await self._connected(retry.remaining())
                reply = await self._roundtrip(writer, request, retry.remaining())
            except (OSError, EOFError, asyncio.IncompleteReadError, WireError, NotLeader) as exc:
                LOG.debug("coflow API request to %s failed: %s", address, exc)
                await self._drop(writer)
                await asyncio.sleep(retry.failed(address, exc))
                continue
            self.controllers.reached()
            return reply

    async def _roundtrip(
        self, writer: asyncio.StreamWriter, request: dict[str, Any], timeout: float
    ) -> Message:
        """Send `request` with a new "req" number on `writer`; await the reply carrying it.

        Raises:
            ConnectionError: no reply within `timeout` s, or the connection was lost.
            NotLeader: a standby answered (_read_replies).
        """
        number = next(self._numbers)
        future = asyncio.get_running_loop().create_future()
        self._waiting[number] = (writer, future)
        try:
            writer.write(frame(request, req=number))
            await writer.drain()
            return await asyncio.wait_for(future, timeout)
        except TimeoutError as exc:
            raise ConnectionError(f"no reply within {timeout:.1f} s") from exc
        finally:
            self._waiting.pop(number, None)

    async def _connected(self, connect_s: float) -> asyncio.StreamWriter:
        """The ready connection: opened (within `connect_s` seconds, to the controller in
        use) if there is none (one opener at a time, the other calls wait), after its hello
        and, when a new controller instance answered, after the open coflows were
        resubmitted (so no call overtakes a resubmission)."""
        if self._writer is not None and self._ready:
            return self._writer
        if self._connect_lock is None:
            self._connect_lock = asyncio.Lock()
        async with self._connect_lock:
            if self._writer is not None and self._ready:
                return self._writer
            reader, writer = await asyncio.wait_for(
                self._open_stream(), min(self.timeout, connect_s)
            )
            self._writer = writer
            self._reader_task = asyncio.create_task(self._read_replies(reader, writer))
            try:
                hello = await self._roundtrip(writer, self.session.hello().request, self.timeout)
                if self.session.restarted(hello):
                    await self._resubmit(writer)
            except BaseException:
                await self._drop(writer)
                raise
            self._ready = True
            return writer

    async def _open_stream(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        server_hostname = CONTROLLER_HOSTNAME if self.context is not None else None
        reader, writer = await asyncio.open_connection(
            *self.controllers.current, ssl=self.context, server_hostname=server_hostname,
            limit=1 << 20,
        )  # fmt: skip
        sock = writer.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return reader, writer

    async def _read_replies(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        """Hand every reply to the call waiting for its "req"; on EOF or a malformed reply
        fail every call in flight (they resend on a new connection), on a standby's
        "not_leader" reply (whatever its "req") fail them with NotLeader (they go to the
        leader)."""
        try:
            while True:
                length = reply_length(await reader.readexactly(4))
                reply = decode_reply(await reader.readexactly(length))
                standby = not_leader(reply)
                if standby is not None:  # a standby: every call on this connection goes on
                    self._fail_waiting(writer, standby)
                    continue
                waiting = self._waiting.get(reply.get("req"))
                if waiting is not None and not waiting[1].done():
                    waiting[1].set_result(reply)
        except asyncio.CancelledError:
            raise
        except (OSError, EOFError, asyncio.IncompleteReadError, WireError) as exc:
            LOG.debug("coflow API connection ended: %s", exc)
            if self._writer is writer:
                self._writer, self._reader_task, self._ready = None, None, False
                writer.close()
            self._fail_waiting(writer, ConnectionError(f"connection lost: {exc}"))

    def _fail_waiting(self, writer: asyncio.StreamWriter, exc: Exception) -> None:
        """Fail the calls waiting for a reply on `writer`'s connection (with `exc`: they
        resend)."""
        for on, future in self._waiting.values():
            if on is writer and not future.done():
                future.set_exception(exc)

    async def _resubmit(self, writer: asyncio.StreamWriter) -> None:
        """Resubmit the open coflows to a new controller instance (as TerraClient)."""
        for cid in self.session.resubmissions():
            end = time.monotonic() + self.timeout
            while True:
                request = self.session.resubmit_request(cid)
                reply = await self._roundtrip(writer, request, self.timeout)
                if not self.session.resubmitted(cid, reply, time.monotonic() < end):
                    break
                await asyncio.sleep(0.1)
