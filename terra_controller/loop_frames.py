"""The coflow API's messages on the controller's loop: ``u32 length | msgpack map`` frames
over a connected non-blocking socket (plain or `ssl.SSLSocket`, its TLS handshake done by
transport.py), read and written by a task of the owner loop (owner_loop.py) instead of a
thread per connection.

The limits are those of the blocking reader (transport.read_message): a connection idle
for `idle_s` before a message is closed; once a message's first byte arrived, the whole
message must arrive within `frame_timeout_s`; a length above `max_bytes` is refused.
"""

from __future__ import annotations

import math
import ssl
import struct

import trio

from terra_wire.api import MAX_MESSAGE_BYTES, WireError

_LEN = struct.Struct(">I")
CHUNK = 1 << 16  # bytes asked of the socket at a time


async def send_all(sock, data: bytes) -> None:
    """Write all of `data` to the non-blocking `sock`. A TLS write that must read first (a
    key update: rare) retries shortly instead of waiting for readability, which another
    task of the loop may be waiting for already (an agent connection's reader).

    Raises:
        OSError: the connection broke.
    """
    view = memoryview(data)
    while view:
        try:
            sent = sock.send(view)
        except (ssl.SSLWantWriteError, BlockingIOError):
            await trio.lowlevel.wait_writable(sock)
            continue
        except ssl.SSLWantReadError:
            await trio.sleep(0.001)
            continue
        view = view[sent:]


def _whole(buf: bytearray, max_bytes: int) -> bytes | None:
    """The body of the frame at the start of `buf` when all of it is there, else None.

    Raises:
        WireError: an oversized length.
    """
    if len(buf) < 4:
        return None
    (length,) = _LEN.unpack_from(buf)
    if length > max_bytes:
        raise WireError(f"message length {length} exceeds {max_bytes}")
    if len(buf) < 4 + length:
        return None
    return bytes(buf[4 : 4 + length])


class FrameReader:
    """Reads whole frames from one connection, keeping what arrived beyond a frame.

    Args:
        sock: the connected non-blocking socket (plain or ssl.SSLSocket), used by tasks of
            one loop only.

    Attributes:
        idle: the connection's idle CancelScope: the caller runs its reads inside
            ``with reader.idle:``; `read` gives it a deadline of `idle_s` while it waits for
            a frame's first byte, so a connection idle that long leaves that block
            (``reader.idle.cancelled_caught``).
    """

    def __init__(self, sock) -> None:
        self.sock = sock
        self.buf = bytearray()
        self.idle = trio.CancelScope()
        self.waited = False  # `read` waited for the socket since the caller last cleared it
        self._want_write = False

    async def read(
        self, frame_timeout_s: float, idle_s: float, max_bytes: int = MAX_MESSAGE_BYTES
    ) -> bytes | None:
        """The next frame's body; None at EOF (`idle` is cancelled after `idle_s` without a
        first byte).

        Raises:
            WireError: an oversized length, EOF inside a frame, or the frame's deadline
                passed (the messages of transport.read_message).
        """
        if not self.buf:
            data = self._recv_now()  # (no deadline to set up when it is there)
            if data is None:
                self.idle.deadline = trio.current_time() + idle_s
                data = await self._recv_some(wait_first=True)
                self.idle.deadline = math.inf
                self.waited = True
            if not data:
                return None
            self.buf += data
        whole = _whole(self.buf, max_bytes)
        if whole is None:
            try:
                with trio.fail_after(frame_timeout_s):
                    await self._fill(4)
                    _whole(self.buf, max_bytes)  # refuses an oversized length at once
                    await self._fill(4 + _LEN.unpack_from(self.buf)[0])
            except EOFError as exc:
                raise WireError(
                    f"truncated message (or its {frame_timeout_s} s deadline passed): {exc}"
                ) from exc
            except trio.TooSlowError as exc:
                raise WireError(f"message not received within {frame_timeout_s} s") from exc
            whole = _whole(self.buf, max_bytes)
            assert whole is not None
        del self.buf[: 4 + len(whole)]
        return whole

    async def read_some(self) -> bytes:
        """What arrived beyond the frames read so far, else the next bytes the socket gives
        (waiting as long as it takes; b"" at EOF)."""
        if self.buf:
            data, self.buf = bytes(self.buf), bytearray()
            return data
        data = self._recv_now()
        return data if data is not None else await self._recv_some(wait_first=True)

    async def _fill(self, n: int) -> None:
        while len(self.buf) < n:
            data = await self._recv_some()
            if not data:
                raise EOFError(f"connection closed after {len(self.buf)} of {n} bytes")
            self.buf += data

    def _recv_now(self) -> bytes | None:
        """What the socket has now (b"" at EOF), or None when nothing arrived yet; sets
        `_want_write` when TLS must write before it can read."""
        self._want_write = False
        try:
            return self.sock.recv(CHUNK)
        except (ssl.SSLWantReadError, BlockingIOError):
            return None
        except ssl.SSLWantWriteError:
            self._want_write = True
            return None
        except ssl.SSLZeroReturnError:
            return b""

    async def _recv_some(self, wait_first: bool = False) -> bytes:
        """Some bytes (b"" at EOF), waiting for the socket as long as it takes
        (`wait_first`: a read just found nothing, so wait before the next)."""
        if wait_first:
            await self._wait()
        while True:
            data = self._recv_now()
            if data is not None:
                return data
            await self._wait()

    async def _wait(self) -> None:
        if self._want_write:  # (rare: a TLS read that must write first; the connection's
            await trio.sleep(0.001)  # writer task may be waiting for writability already)
        else:
            await trio.lowlevel.wait_readable(self.sock)
