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
"""

from __future__ import annotations

import math

import trio

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

    def _refill(self) -> None:
        now = trio.current_time()
        if self._rate > 0 and not math.isinf(self._rate):
            self._tokens = min(self._tokens + (now - self._stamp) * self._rate, self.burst_bytes)
        self._stamp = now
