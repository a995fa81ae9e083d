"""Frames over trio streams: the overlay's readers and writers (data connections and the
control channel on the agents).

The frame format, its limits and its checks are terra_wire/frames.py (no I/O); this module sends
and receives frames with it. Everything wrong with a frame (see there, and EOF in the middle of
a frame) raises FrameError; the caller closes that connection.

The optional "x" checksum is computed with ISA-L's crc32 (package isal), which gives exactly
zlib.crc32's value at ~20 GB/s instead of ~1.3 GB/s; zlib is the fallback.

Performance: payloads are never concatenated with headers when large (the
header and the payload go out as separate writes, or in one ``sendmsg`` on a
trio socket stream); the reader keeps a bytearray buffer and, on a
``trio.SocketStream``, receives large payloads straight into their own
buffer with ``recv_into`` (one copy, kernel to payload).
"""

from __future__ import annotations

import os
import struct
import sys

import trio

from terra_wire.frames import (
    MAX_HEADER_BYTES,
    MAX_PAYLOAD_BYTES,
    FrameError,
    check_header,
    encode_frame,
    unpack_map,
)

try:  # ISA-L's crc32: the same CRC-32 as zlib.crc32, ~15x faster (SIMD)
    from isal.isal_zlib import crc32
except ImportError:  # pragma: no cover - isal is a declared dependency
    from zlib import crc32

# Payloads up to this size are joined with their header into one write.
_JOIN_LIMIT = 16 * 1024
# Size of a reader's fixed receive buffer (>= 4 + MAX_HEADER_BYTES).
_RBUF_BYTES = 256 * 1024
_LEN = struct.Struct(">I")
_U32_MAX = 0xFFFFFFFF
# ids of SocketStreams with a vectored send in progress (trio's own conflict
# detection is bypassed when we use the socket directly).
_SENDING: set[int] = set()


async def send_frame(stream: trio.abc.SendStream, header: dict, payload=b"") -> None:
    """Write one frame to `stream`.

    Small payloads (<= 16 KiB) are joined with the header into one write; large
    ones are written without copying (one ``sendmsg`` on a trio SocketStream,
    otherwise two ``send_all`` calls). Not safe for concurrent use on the same
    stream (BusyResourceError) — use FrameWriter for that. A send cancelled
    midway leaves a partial frame on the stream: close the stream then.

    Args:
        stream: any trio SendStream (e.g. trio.SocketStream).
        header: header map, see encode_frame.
        payload: bytes-like payload (bytes, bytearray, memoryview), may be empty.

    Raises:
        FrameError: see encode_frame.
        trio.BrokenResourceError / trio.ClosedResourceError: the stream failed or was closed.
    """
    parts = encode_frame(header, payload)
    await send_encoded(stream, parts[0], parts[1] if len(parts) == 2 else b"")


async def send_encoded(stream: trio.abc.SendStream, head: bytes, body=b"") -> None:
    """Write one frame already encoded as `head` (length prefix and header, encode_head) and
    `body` (its payload, bytes-like, not copied when large); as send_frame otherwise."""
    if 0 < len(body) <= _JOIN_LIMIT:
        head, body = head + bytes(body), b""
    if isinstance(stream, trio.SocketStream):
        await _socket_send(stream, head, body)
        return
    await stream.send_all(head)
    if len(body):
        await stream.send_all(body)


async def _socket_send(stream: trio.SocketStream, head: bytes, body) -> None:
    """Write head and body with vectored sends on the stream's socket (no copies)."""
    if id(stream) in _SENDING:
        raise trio.BusyResourceError("another task is already sending on this stream")
    _SENDING.add(id(stream))
    try:
        await _sendmsg_loop(stream.socket, head, body)
    finally:
        _SENDING.discard(id(stream))


async def _sendmsg_loop(sock, head: bytes, body) -> None:
    """Write head + body with os.writev on the socket's descriptor; after a short write, wait
    until the socket is writable (trio.lowlevel.wait_writable) instead of retrying at once: the
    kernel then has room for a large piece, so a 4 MiB chunk takes a few system calls, not dozens.
    One checkpoint per frame when no wait was needed (trio's pattern: cancellation is seen before
    the first byte, never after the last)."""
    await trio.lowlevel.checkpoint_if_cancelled()
    with memoryview(head) as h, memoryview(body) as b:
        parts = [h.cast("B"), b.cast("B")] if len(b) else [h.cast("B")]
        waited = False
        while True:
            fd = sock.fileno()  # -1 once closed (never write to a reused descriptor number)
            if fd < 0:
                raise trio.ClosedResourceError("send on a closed stream")
            try:
                sent = os.writev(fd, parts)
            except BlockingIOError:
                sent = 0
            except OSError as exc:
                raise _stream_error(sock, "send", exc) from exc
            parts = _advance(parts, sent)
            if not parts:
                break
            await trio.lowlevel.wait_writable(sock)
            waited = True
        if not waited:
            await trio.lowlevel.cancel_shielded_checkpoint()


def _advance(parts: list, sent: int) -> list:
    """The memoryviews still to write after `sent` more bytes went out."""
    while parts and sent >= len(parts[0]):
        sent -= len(parts[0])
        parts = parts[1:]
    if parts and sent:
        parts = [parts[0][sent:], *parts[1:]]
    return parts


class FrameWriter:
    """Serialises frame writes from several tasks onto one stream.

    FrameWriter(stream: trio.abc.SendStream); ``await writer.send(header, payload=b"")``
    sends one whole frame at a time (a trio.Lock keeps frames from interleaving).
    Raises what send_frame raises.
    """

    def __init__(self, stream: trio.abc.SendStream) -> None:
        self.stream = stream
        self._lock = trio.Lock()

    async def send(self, header: dict, payload=b"", key: str | None = None) -> None:
        """Send one frame (see send_frame); waits while another task is sending. `key` (a
        chunk's flow key) is not used: frames go in clear (overlay/sealed.py seals them)."""
        async with self._lock:
            await send_frame(self.stream, header, payload)

    async def send_headers(self, headers: list[dict]) -> list[tuple[dict, FrameError]]:
        """Send frames without payload for `headers`, in order, in one write (many small
        control messages cost one system call and, on TLS, one record). A header that cannot
        be encoded is left out.

        Returns:
            [(header, its FrameError)] of the headers left out.

        Raises:
            what send_frame raises for the stream.
        """
        heads: list[bytes] = []
        bad = []
        for header in headers:
            try:
                heads.append(encode_frame(header)[0])
            except FrameError as exc:
                bad.append((header, exc))
        if heads:
            async with self._lock:
                await send_encoded(self.stream, b"".join(heads))
        return bad


def _unreferenced_count() -> int:
    """sys.getrefcount() of a list item seen by a for loop when nothing else refers to it."""
    for buf in [bytearray(1)]:
        return sys.getrefcount(buf)
    raise AssertionError("unreachable")


_UNREFERENCED = _unreferenced_count()


class PayloadBuffers:
    """Receive buffers for large payloads, reused once nothing refers to them any more.

    PayloadBuffers(size: bytes per buffer, count: most buffers kept). take(n) (n <= size) returns
    a memoryview of n bytes to receive into: of a kept bytearray that nobody refers to (every
    memoryview of it, slices included, holds a reference, so a payload still held by a reorder
    buffer, a hashing queue or a thread keeps its buffer out of reuse), else of a new one (kept
    while fewer than `count` are). Saves zero-filling and page-faulting a fresh buffer for each
    payload (~0.1 CPU s/GB at 4 MiB payloads). Share one between the readers of a process.

    Raises:
        ValueError: size or count not an int > 0; take() with n outside 0..size.
    """

    def __init__(self, size: int, count: int) -> None:
        for name, value in (("size", size), ("count", count)):
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"{name} must be an int > 0, got {value!r}")
        self.size = size
        self.count = count
        self._kept: list[bytearray] = []

    def take(self, n: int) -> memoryview:
        """A writable memoryview of n bytes (contents undefined) that no one else uses."""
        if not 0 <= n <= self.size:
            raise ValueError(f"buffer of {n} bytes requested, limit {self.size}")
        for buf in self._kept:
            if sys.getrefcount(buf) == _UNREFERENCED:
                return memoryview(buf)[:n]
        if len(self._kept) >= self.count:
            return memoryview(bytearray(n))
        buf = bytearray(self.size)
        self._kept.append(buf)
        return memoryview(buf)[:n]


class FrameReader:
    """Reads frames from a trio ReceiveStream.

    FrameReader(stream, max_payload=MAX_PAYLOAD_BYTES, buffers=None, initial=b""); ``await
    reader.read()``
    returns ``(header: dict, payload: memoryview | bytes)`` or None on a clean
    EOF between frames. The payload belongs to the caller: it is not reused while
    anything refers to it (payloads of exactly `buffers.size` bytes go into `buffers`, a
    PayloadBuffers, when given; others into a bytearray of their own size; do not modify a
    payload or keep a raw pointer to it without a reference).
    Only one task may call read() at a time. `initial`: bytes already received from the
    stream (e.g. left over by a TLS layer unwrapped below it, at most 256 KiB), read first.
    keep_raw=True: `raw_header` holds the last frame's length prefix and encoded header as
    received (what a sealed record authenticates, overlay/sealed.py).

    Validation (raises FrameError): header length 0 or > MAX_HEADER_BYTES,
    malformed msgpack or a non-map header, "v" != VERSION, missing/non-str "t",
    "n" not an int in [0, max_payload], chunk frames with "c"/"f" not str, "o"
    not an int >= 0, "m" not bytes of integrity.mac_bytes(n), "x" not a u32, a payload
    whose crc32 differs
    from "x" (frames that carry one; chunks carry a MAC instead, checked by the agent),
    and EOF in the middle of a frame. trio.BrokenResourceError (connection
    reset), trio.ClosedResourceError (stream closed by us) and
    trio.BusyResourceError (two tasks reading at once) are raised as trio's
    streams do.
    """

    def __init__(
        self,
        stream: trio.abc.ReceiveStream,
        max_payload: int = MAX_PAYLOAD_BYTES,
        buffers: PayloadBuffers | None = None,
        initial: bytes = b"",
        keep_raw: bool = False,
    ):
        if len(initial) > _RBUF_BYTES:
            raise ValueError(f"initial bytes ({len(initial)}) exceed {_RBUF_BYTES}")
        if isinstance(max_payload, bool) or not isinstance(max_payload, int) or max_payload < 0:
            raise ValueError(f"max_payload must be an int >= 0, got {max_payload!r}")
        self.stream = stream
        self.max_payload = max_payload
        self.buffers = buffers
        # A fixed receive buffer (never resized, so a memoryview of it stays valid):
        # unread bytes are self._rbuf[self._start:self._end].
        self._rbuf = bytearray(_RBUF_BYTES)
        self._rview = memoryview(self._rbuf)
        self._start = 0
        self._end = len(initial)
        self._rbuf[: self._end] = initial
        self._reading = False
        self._waited = False  # read(): the current frame waited for the socket at least once
        self._sock = stream.socket if isinstance(stream, trio.SocketStream) else None
        self.keep_raw = keep_raw
        self.raw_header = b""  # with keep_raw: the last frame's length prefix and header

    async def read(self) -> tuple[dict, memoryview | bytes] | None:
        """Read the next frame; None on clean EOF before its first byte.

        Returns:
            (header dict incl. "v", "t", "n", payload of exactly header["n"] bytes).

        Raises:
            FrameError: see the class docstring.
        """
        if self._reading:
            raise trio.BusyResourceError("another task is already reading frames from this stream")
        self._reading = True
        try:
            await trio.lowlevel.checkpoint_if_cancelled()
            self._waited = False
            frame = await self._read_frame()
            if not self._waited and self._sock is not None:
                await trio.lowlevel.cancel_shielded_checkpoint()
            return frame
        finally:
            self._reading = False

    async def _read_frame(self) -> tuple[dict, memoryview | bytes] | None:
        if not await self._fill(_LEN.size, at_frame_start=True):
            return None
        (hlen,) = _LEN.unpack_from(self._rbuf, self._start)
        if hlen == 0 or hlen > MAX_HEADER_BYTES:
            raise FrameError(f"frame header length {hlen} out of range 1..{MAX_HEADER_BYTES}")
        self._start += _LEN.size
        await self._fill(hlen, at_frame_start=False)
        raw = self._rview[self._start : self._start + hlen]
        header = self._decode_header(raw)
        if self.keep_raw:
            self.raw_header = _LEN.pack(hlen) + bytes(raw)
        self._start += hlen
        payload = await self._read_payload(header["n"])
        if "x" in header and crc32(payload) != header["x"]:
            raise FrameError(
                f"checksum mismatch in {header['t']!r} frame (coflow {header.get('c')!r}, "
                f"flow {header.get('f')!r}, offset {header.get('o')!r})"
            )
        return header, payload

    def _decode_header(self, raw: memoryview) -> dict:
        return check_header(unpack_map(raw), self.max_payload)

    async def _fill(self, need: int, at_frame_start: bool) -> bool:
        """Have at least `need` unread bytes buffered; False on clean EOF at a frame start."""
        while self._end - self._start < need:
            if self._start:  # move the unread bytes to the front
                unread = self._end - self._start
                self._rview[:unread] = self._rview[self._start : self._end]
                self._start, self._end = 0, unread
            got = await self._receive_into(self._rview[self._end :])
            if got == 0:
                if at_frame_start and self._end == 0:
                    return False
                raise FrameError(
                    f"connection closed mid-frame ({self._end - self._start} of "
                    f"{need} bytes received)"
                )
            self._end += got
        return True

    async def _read_payload(self, n: int) -> memoryview | bytes:
        """The next n bytes: bytes when already buffered, else a memoryview of a new (or
        reused, see PayloadBuffers) bytearray filled straight from the socket."""
        if n == 0:
            return b""
        avail = self._end - self._start
        if avail >= n:
            out = bytes(self._rview[self._start : self._start + n])
            self._start += n
            return out
        if self.buffers is not None and n == self.buffers.size:
            # Only payloads that fill a whole buffer are pooled: a held payload then pins
            # exactly the bytes the reorder / hashing bounds count for it (a short view of a
            # 4 MiB buffer would pin all 4 MiB).
            view = self.buffers.take(n)
        else:
            view = memoryview(bytearray(n))
        view[:avail] = self._rview[self._start : self._end]
        self._start = self._end = 0
        got = avail
        while got < n:
            k = await self._receive_into(view[got:])
            if k == 0:
                raise FrameError(
                    f"connection closed mid-frame ({got} of {n} payload bytes received)"
                )
            got += k
        return view

    async def _receive_into(self, view: memoryview) -> int:
        """Receive up to len(view) bytes into view; 0 at EOF.

        On a socket: os.readv on its descriptor, waiting (trio.lowlevel.wait_readable) only
        when nothing is buffered; read() adds one checkpoint per frame that needed no wait.
        """
        if self._sock is None:
            data = await self.stream.receive_some(len(view))
            n = len(data)
            view[:n] = data
            return n
        while True:
            fd = self._sock.fileno()  # -1 once closed (never read a reused descriptor number)
            if fd < 0:
                raise trio.ClosedResourceError("receive on a closed stream")
            try:
                return os.readv(fd, [view])
            except BlockingIOError:
                pass
            except OSError as exc:
                raise _stream_error(self._sock, "receive", exc) from exc
            await trio.lowlevel.wait_readable(self._sock)
            self._waited = True


def _stream_error(sock, what: str, exc: OSError) -> Exception:
    """The trio stream error for a failed socket call: Closed if we closed it, else Broken."""
    if sock.fileno() == -1:
        return trio.ClosedResourceError(f"{what} on a closed stream")
    return trio.BrokenResourceError(f"socket {what} failed: {exc}")
