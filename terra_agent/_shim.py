"""TEMPORARY stand-ins for overlay.rate_limit / overlay.reorder until they land (to be removed)."""

import math

import trio


class TokenBucket:
    def __init__(self, rate_bytes_per_s, burst_bytes=None):
        self.rate = float(rate_bytes_per_s)
        self.burst = burst_bytes or max(self.rate * 0.05, 1)
        self.tokens = self.burst
        self.last = trio.current_time()
        self._ev = trio.Event()

    def _refill(self):
        now = trio.current_time()
        self.tokens = min(self.burst, self.tokens + (now - self.last) * self.rate)
        self.last = now

    def set_rate(self, r):
        self._refill()
        self.rate = float(r)
        self._ev.set()
        self._ev = trio.Event()

    async def acquire(self, n):
        while True:
            self._refill()
            if self.tokens >= min(n, self.burst):
                self.tokens -= n
                return
            if self.rate <= 0 or not math.isfinite(self.rate):
                if math.isinf(self.rate):
                    return
                await self._ev.wait()
                continue
            need = (min(n, self.burst) - self.tokens) / self.rate
            with trio.move_on_after(need):
                await self._ev.wait()


class ReorderBuffer:
    def __init__(self, size_bytes, memory_limit_bytes, spill_dir):
        self.size = size_bytes
        self.delivered = 0
        self.held = {}
        self.resident_bytes = 0
        self.peak_resident_bytes = 0
        self.spilled_bytes = 0

    @property
    def complete(self):
        return self.delivered >= self.size

    def add(self, offset, data):
        out = []
        end = offset + len(data)
        if end <= self.delivered:
            return out
        if offset < self.delivered:
            data = memoryview(data)[self.delivered - offset :]
            offset = self.delivered
        if offset > self.delivered:
            if offset not in self.held or len(self.held[offset]) < len(data):
                self.held[offset] = bytes(data)
            return out
        out.append(data)
        self.delivered = end
        while True:
            nxt = None
            for o in list(self.held):
                d = self.held[o]
                if o + len(d) <= self.delivered:
                    del self.held[o]
                elif o <= self.delivered:
                    nxt = (o, d)
            if nxt is None:
                break
            o, d = nxt
            del self.held[o]
            out.append(memoryview(d)[self.delivered - o :])
            self.delivered = o + len(d)
        return out

    def close(self):
        self.held.clear()
