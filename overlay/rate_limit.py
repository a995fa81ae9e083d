"""Per-path token-bucket rate limiter for trio (docs/design.md section 5, "Rate limiting").

The bucket holds up to `burst_bytes` tokens and fills at `rate` bytes/s. An
``acquire(n)`` proceeds as soon as the bucket is not in debt (tokens >= 0)
and then takes n tokens, possibly going into debt; the next acquire waits
until the debt is paid back. Because tokens are computed from the clock
rather than from how long a sleep lasted, late wake-ups do not accumulate
and a backlogged sender gets exactly `rate` bytes/s in the long run
(chunk after chunk: n bytes, then n / rate seconds of waiting).

Send chunks of at most ~10 ms worth of bytes (rate x 0.01 s) for smooth
per-path rates; larger chunks are fine but arrive in coarser bursts.

The kernel backend ("pacing", terra-agent --rate-limiter pacing) is the socket's own TCP
pacing: set_pacing_rate() sets SO_MAX_PACING_RATE, which caps the rate at which the kernel
releases the socket's stream bytes (TCP payload; our frame headers count, TCP/IP headers do
not). stream_rate() converts a chunk payload rate into that stream rate by adding the frame
header bytes of each chunk (chunk_frame_overhead()).
"""

from __future__ import annotations

import math
import socket
import struct

import msgpack
import trio

from terra_security.data_records import TAG_BYTES
from terra_security.integrity import mac_bytes
from terra_wire.frames import VERSION

RATE_LIMITERS = ("bucket", "pacing")  # terra-agent --rate-limiter choices; "bucket" is the default
SO_MAX_PACING_RATE = getattr(socket, "SO_MAX_PACING_RATE", 47)  # Linux value
UNPACED = 2**64 - 1  # SO_MAX_PACING_RATE value meaning "no limit" (~0UL)
_U64 = struct.Struct("=Q")

DEFAULT_BURST_S = 0.05  # default bucket depth: 50 ms of traffic at the current rate
MIN_BURST_BYTES = 1500


def _check_rate(rate) -> float:
    if isinstance(rate, bool) or not isinstance(rate, int | float) or math.isnan(rate) or rate < 0:
        raise ValueError(f"rate must be a number >= 0 bytes/s (inf = unlimited), got {rate!r}")
    return float(rate)


class TokenBucket:
    """A token bucket that paces one path's sender (bytes/s), for trio.

    TokenBucket(rate_bytes_per_s, burst_bytes=None):
        rate_bytes_per_s: float >= 0; 0 pauses senders until a positive rate is
            set; math.inf means unlimited.
        burst_bytes: bucket depth in bytes (> 0); None = 50 ms of the current
            rate (at least 1500 bytes), re-derived whenever the rate changes.
    The bucket starts empty (no initial burst beyond the first acquire).
    Concurrent acquirers are served first come, first served. Create it inside
    trio.run (it reads trio's clock).

    Raises:
        ValueError: negative/NaN rate, burst_bytes <= 0 or not a number.
    """

    def __init__(self, rate_bytes_per_s: float, burst_bytes: float | None = None) -> None:
        if burst_bytes is not None:
            if isinstance(burst_bytes, bool) or not isinstance(burst_bytes, int | float):
                raise ValueError(f"burst_bytes must be a number > 0, got {burst_bytes!r}")
            if not burst_bytes > 0 or math.isinf(burst_bytes):
                raise ValueError(f"burst_bytes must be finite and > 0, got {burst_bytes!r}")
        self._fixed_burst = None if burst_bytes is None else float(burst_bytes)
        self._rate = _check_rate(rate_bytes_per_s)
        self._tokens = 0.0
        self._stamp = trio.current_time()
        self._changed = trio.Event()
        self._lock = trio.Lock()
        self.acquired_bytes = 0  # total bytes granted, for accounting

    @property
    def rate(self) -> float:
        """Current rate in bytes/s."""
        return self._rate

    @property
    def burst_bytes(self) -> float:
        """Current bucket depth in bytes."""
        if self._fixed_burst is not None:
            return self._fixed_burst
        if math.isinf(self._rate):
            return math.inf
        return max(self._rate * DEFAULT_BURST_S, MIN_BURST_BYTES)

    @property
    def debt_bytes(self) -> float:
        """Bytes granted ahead of the rate and not yet paid back (0 when not in debt)."""
        return max(0.0, -self._tokens)

    def set_rate(self, rate_bytes_per_s: float) -> None:
        """Change the rate (bytes/s) now; a waiting acquire re-plans at once.

        Tokens earned so far at the old rate are kept (capped at the new burst).

        Raises:
            ValueError: negative or NaN rate.
        """
        rate = _check_rate(rate_bytes_per_s)
        self._refill()
        self._rate = rate
        self._tokens = min(self._tokens, self.burst_bytes)
        self._changed.set()
        self._changed = trio.Event()

    async def acquire(self, nbytes: int) -> None:
        """Wait until `nbytes` may be sent on this path, then account for them.

        Returns once the rate is positive and the bucket is out of debt
        (nbytes = 0 returns at once).
        Cancellation while waiting takes no tokens.

        Raises:
            ValueError: nbytes not an int >= 0.
        """
        if isinstance(nbytes, bool) or not isinstance(nbytes, int) or nbytes < 0:
            raise ValueError(f"nbytes must be an int >= 0, got {nbytes!r}")
        if nbytes == 0:
            await trio.lowlevel.checkpoint()
            return
        async with self._lock:
            while True:
                self._refill()
                changed = self._changed
                if self._rate == 0:
                    await changed.wait()
                    continue
                if math.isinf(self._rate) or self._tokens >= 0:
                    break
                deadline = self._stamp + (-self._tokens) / self._rate
                if deadline <= self._stamp:
                    break  # the debt left is below the clock's float resolution
                with trio.move_on_at(deadline):
                    await changed.wait()
            if not math.isinf(self._rate):
                self._tokens -= nbytes
            self.acquired_bytes += nbytes

    def refund(self, nbytes: int) -> None:
        """Give back `nbytes` acquired but not sent (a chunk shorter than acquired: the last
        bytes of a small flow), so they do not cost the path their time at the rate.
        The bucket is never filled past its burst."""
        if nbytes <= 0:
            return
        self._refill()
        if not math.isinf(self._rate):
            self._tokens = min(self._tokens + nbytes, self.burst_bytes)
        self.acquired_bytes -= nbytes

    def _refill(self) -> None:
        now = trio.current_time()
        if self._rate > 0 and not math.isinf(self._rate):
            self._tokens = min(self._tokens + (now - self._stamp) * self._rate, self.burst_bytes)
        self._stamp = now


def set_pacing_rate(sock: socket.socket, rate_bytes_per_s: float) -> None:
    """Cap `sock`'s TCP pacing at `rate_bytes_per_s` (stream bytes/s; math.inf = unpaced).

    Takes effect at once, also for bytes already queued in the socket. Linux only (TCP paces
    internally without the fq qdisc). The value is rounded to whole bytes/s (at least 1).

    Raises:
        ValueError: rate <= 0 or NaN (the kernel reads 0 as "unpaced", so a pause must be done
            by not writing: see docs/design.md section 5).
        OSError: the socket refuses the option (not Linux, closed socket).
    """
    rate = _check_rate(rate_bytes_per_s)
    if rate == 0:
        raise ValueError("a pacing rate must be > 0 bytes/s (the kernel reads 0 as unpaced)")
    value = UNPACED if math.isinf(rate) else max(1, min(UNPACED - 1, round(rate)))
    sock.setsockopt(socket.SOL_SOCKET, SO_MAX_PACING_RATE, _U64.pack(value))


def pacing_rate(sock: socket.socket) -> float:
    """The pacing cap `sock` has now, in bytes/s (math.inf when unpaced).

    Raises:
        OSError: the socket refuses the option (not Linux, closed socket).
    """
    (value,) = _U64.unpack(sock.getsockopt(socket.SOL_SOCKET, SO_MAX_PACING_RATE, _U64.size))
    return math.inf if value == UNPACED else float(value)


def chunk_frame_overhead(
    coflow: str, flow: str, payload_bytes: int, attempt: int = 0, sealed: bool = False
) -> int:
    """Bytes a chunk frame of `payload_bytes` adds to the stream besides its payload.

    sealed=True: the frame of an encrypted connection (overlay/sealed.py: type "schunk", a
    u64 record number "s" counted at its longest, and the TAG_BYTES AEAD tag).

    That is the 4-byte length prefix and the msgpack header terra_wire.frames.chunk_header()
    builds, with the chunk's leaf MACs (terra_security.integrity.mac_bytes) and the offset packed
    as a
    uint32 (5 bytes: offsets below 4 GiB; smaller values pack shorter, larger ones 4 bytes
    longer), so the estimate is within a few bytes of every real frame.
    Returns an int > 0. Raises ValueError for payload_bytes < 0.
    """
    if payload_bytes < 0:
        raise ValueError(f"payload_bytes must be >= 0, got {payload_bytes!r}")
    macs = bytes(mac_bytes(payload_bytes))
    header = {"t": "chunk", "c": coflow, "f": flow, "o": 2**31, "n": payload_bytes, "m": macs}
    header["v"] = VERSION
    if attempt:
        header["a"] = attempt
    if sealed:
        header["t"], header["s"], header["n"] = "schunk", 2**64 - 1, payload_bytes + TAG_BYTES
    tag = TAG_BYTES if sealed else 0
    return 4 + len(msgpack.packb(header, use_bin_type=True)) + tag


def stream_rate(payload_rate: float, chunk_bytes: int, overhead_bytes: int) -> float:
    """The stream rate (bytes/s) that carries `payload_rate` bytes/s of chunk payload.

    Chunks of `chunk_bytes` payload each put `overhead_bytes` of frame header on the stream
    too: stream = payload_rate * (chunk_bytes + overhead_bytes) / chunk_bytes.
    Raises ValueError for chunk_bytes <= 0, overhead_bytes < 0 or a bad rate (_check_rate).
    """
    rate = _check_rate(payload_rate)
    if chunk_bytes <= 0 or overhead_bytes < 0:
        raise ValueError(f"need chunk_bytes > 0, overhead >= 0: {chunk_bytes}, {overhead_bytes}")
    return rate * (chunk_bytes + overhead_bytes) / chunk_bytes
