"""One agent's control connection on the controller: reading and writing control frames
(blocking sockets, TLS through shared_socket.SharedSocket) and the writer thread with its queue.

Frames are those of `overlay/framing.py` with an empty payload, decoded and checked by the
codec shared with the agents (`terra_wire.frames.unpack_map`, `check_header`) and validated as
`terra_wire/control.py` messages (docs/runtime.md).
"""

from __future__ import annotations

import logging
import queue
import socket
import threading
import time
from collections.abc import Callable

from terra_controller.transport import FRAME_TIMEOUT_S, read_message
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
    """A connected agent: its socket, outbound queue and writer thread.

    Attributes:
        agent: agent id once registered (None before). identity: the peer's certificate.
        last_seen: wall-clock s of the last message read.
    """

    def __init__(self, sock: socket.socket, addr) -> None:
        self.sock = sock
        self.addr = addr
        self.agent: str | None = None
        self.identity: Identity = INSECURE
        self.outbox: queue.SimpleQueue = queue.SimpleQueue()
        self.closed = False
        self.before_close: Callable[[], None] | None = None  # e.g. wake the loop's reader
        self.last_seen = time.time()  # wall-clock s of the last message read (console)
        self.writer = threading.Thread(target=self._write_loop, daemon=True)
        self.writer.start()

    def send(self, header: dict) -> None:
        """Queue one control message (returns at once)."""
        if not self.closed:
            self.outbox.put(header)

    def close(self) -> None:
        """Close the socket and stop the writer."""
        if not self.closed:
            self.closed = True
            self.outbox.put(None)
            if self.before_close is not None:
                self.before_close()
            try:
                self.sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            self.sock.close()

    def _write_loop(self) -> None:
        while True:
            header = self.outbox.get()
            if header is None:
                return
            try:
                send_parts(self.sock, header)
            except OSError as exc:
                LOG.info("agent %s: send failed: %s", self.agent or self.addr, exc)
                self.close()
                return
