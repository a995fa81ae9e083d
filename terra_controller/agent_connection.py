"""One agent's control connection on the controller: its control frames, and the connection
with its outbound queue and writer task on the controller's loop (blocking reads and writes
for the tools and tests that use a plain socket).

Frames are those of `overlay/framing.py` with an empty payload, decoded and checked by the
codec shared with the agents (`terra_wire.frames.unpack_map`, `check_header`) and validated as
`terra_wire/control.py` messages (docs/runtime.md).
"""

from __future__ import annotations

import logging
import math
import socket
import time

import trio

from terra_controller.loop_frames import send_all
from terra_controller.transport import FRAME_TIMEOUT_S, read_message, shutdown
from terra_security.pki import INSECURE, Identity
from terra_wire import control as protocol
from terra_wire.api import WireError
from terra_wire.frames import (
    MAX_HEADER_BYTES,
    FrameError,
    check_header,
    encode_frame,
    unpack_map,
)

LOG = logging.getLogger("terra.agents")


class ChannelError(Exception):
    """A control-channel frame or message is malformed (that connection is closed)."""


def send_parts(sock: socket.socket, header: dict) -> None:
    """Send one control message (a frame with an empty payload)."""
    sock.sendall(b"".join(bytes(p) for p in encode_frame(header)))


def read_control(sock: socket.socket, frame_timeout: float = FRAME_TIMEOUT_S) -> dict | None:
    """Read one frame and return its validated control message; None on a clean EOF.

    The frame's outer format is the API's (`transport.read_message`: u32 length |
    msgpack map, the whole frame within `frame_timeout` seconds once it started);
    control frames carry no payload.

    Raises:
        ChannelError: oversized, slow or malformed frame, a payload, wrong version,
            invalid message.
    """
    try:
        header = read_message(sock, frame_timeout, MAX_HEADER_BYTES)
    except WireError as exc:
        raise ChannelError(str(exc)) from exc
    if header is None:
        return None
    return checked_control(header)


def parse_control(body: bytes) -> dict:
    """A frame's body (read on the controller's loop, loop_frames.FrameReader) as its
    validated control message.

    Raises:
        ChannelError: as read_control.
    """
    try:
        header = unpack_map(body)
    except FrameError as exc:
        raise ChannelError(str(exc)) from exc
    return checked_control(header)


def checked_control(header: dict) -> dict:
    """`header` checked as a control frame's and validated as a control message.

    Raises:
        ChannelError: a payload, wrong version, invalid message.
    """
    try:
        check_header(header, max_payload=0)  # the agents' own header checks (overlay/framing)
    except FrameError as exc:
        raise ChannelError(f"{exc} (control frames carry no payload)") from exc
    try:
        return protocol.validate_control(header)
    except protocol.ProtocolError as exc:
        raise ChannelError(str(exc)) from exc


class AgentConnection:
    """A connected agent, owned by the controller's loop: its socket (non-blocking, plain or
    TLS), and its outbound queue, which the connection's writer task (`write_loop`) drains.
    The reading task and the writer task share the socket on the one loop thread, so no
    lock guards it.

    Attributes:
        agent: agent id once registered (None before). identity: the peer's certificate.
        last_seen: wall-clock s of the last message read.
        closed: the connection was closed (`close`).
    """

    def __init__(self, sock, addr) -> None:
        self.sock = sock
        self.addr = addr
        self.agent: str | None = None
        self.identity: Identity = INSECURE
        self._outbox, self._queued = trio.open_memory_channel[dict](math.inf)
        self.closed = False
        self.closing = False  # `finish_sending` or `close`: nothing more is queued
        self.written = trio.Event()  # set when the writer task ended
        self.last_seen = time.time()  # wall-clock s of the last message read (console)

    def send(self, header: dict) -> None:
        """Queue one control message (on the loop; returns at once).

        Raises:
            RuntimeError: called from another thread (hand it to the loop: OwnerLoop.run).
        """
        if not trio.lowlevel.in_trio_run():
            raise RuntimeError("an agent connection is written on the controller's loop only")
        if not self.closing:  # (else dropped: the connection is ending)
            self._outbox.send_nowait(header)

    def finish_sending(self) -> None:
        """Queue nothing more (later `send`s are dropped): the writer task sends what is
        queued, then ends."""
        self.closing = True
        self._outbox.close()

    def close(self) -> None:
        """Close the socket (on the loop): the tasks waiting on it wake up, the writer ends."""
        if self.closed:
            return
        self.closed = self.closing = True
        self._outbox.close()
        try:
            trio.lowlevel.notify_closing(self.sock)
        except RuntimeError:  # (not on a running loop any more)
            pass
        shutdown(self.sock, socket.SHUT_RDWR)
        self.sock.close()

    async def write_loop(self, send_timeout_s: float) -> None:
        """The writer task: send the queued messages in order, those queued together in one
        write, each write within `send_timeout_s` (an agent that does not read for that
        long is disconnected); ends when the queue is finished or the connection closed.
        Never raises."""
        try:
            async for header in self._queued:
                batch = [header]
                while True:
                    try:
                        batch.append(self._queued.receive_nowait())
                    except (trio.WouldBlock, trio.EndOfChannel):
                        break
                data = b"".join(bytes(p) for h in batch for p in encode_frame(h))
                with trio.fail_after(send_timeout_s):
                    await send_all(self.sock, data)
        except _SEND_FAILURES as exc:
            if not self.closed:
                why = str(exc) or type(exc).__name__
                LOG.info("agent %s: send failed: %s", self.agent or self.addr, why)
                self.close()
        finally:
            self.written.set()


_SEND_FAILURES = (OSError, trio.TooSlowError, trio.ClosedResourceError, trio.BusyResourceError)
