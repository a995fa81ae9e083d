"""Chunks that arrived before their flow's descriptor (receiving side, docs/design.md sec. 5).

The controller sends a flow's descriptor to both agents; the sender may get its copy (and rates)
first and start sending before the receiver knows the flow. The receiver holds such chunks here,
unacknowledged, and feeds them to the flow when its descriptor arrives. The store is bounded in
bytes (per agent) and in time (per flow, from its first held chunk); past either bound the agent
drops the held chunks and closes the connections that carried them, so the sender requeues them
(PeerLink resends unacknowledged chunks only when its connection ends).
"""

from __future__ import annotations

from dataclasses import dataclass

import trio

from overlay.framing import FrameWriter

PENDING_LIMIT_BYTES = 16 << 20  # one MAX_CHUNK_BYTES chunk on each of 4 paths
PENDING_TIMEOUT_S = 5.0


@dataclass
class HeldChunk:
    """One held chunk: byte `offset`, `payload`, sender `digest` (or None), and the connection
    it came on (`stream`, its `writer` for the ack, `peer` agent id); `attempt`: the flow's
    attempt the chunk belongs to (its "a", 0 when absent); `mac`: its "m" (checked with the
    flow's key once the descriptor arrives)."""

    offset: int
    payload: object
    digest: str | None
    stream: trio.SocketStream
    writer: FrameWriter
    peer: str
    attempt: int = 0
    mac: bytes = b""


class PendingChunks:
    """Held chunks of flows without a descriptor yet, at most `limit_bytes` in all.

    PendingChunks(limit_bytes: int >= 0). Attributes: held {(coflow, flow): [HeldChunk, ...]}
    in arrival order, held_bytes (payload bytes held now), peak_bytes, dropped_bytes (bytes
    given up by drop()).

    Raises:
        ValueError: limit_bytes not an int >= 0.
    """

    def __init__(self, limit_bytes: int = PENDING_LIMIT_BYTES) -> None:
        if isinstance(limit_bytes, bool) or not isinstance(limit_bytes, int) or limit_bytes < 0:
            raise ValueError(f"limit_bytes must be an int >= 0, got {limit_bytes!r}")
        self.limit_bytes = limit_bytes
        self.held: dict[tuple[str, str], list[HeldChunk]] = {}
        self.held_bytes = 0
        self.peak_bytes = 0
        self.dropped_bytes = 0

    def add(self, key: tuple[str, str], chunk: HeldChunk) -> bool | None:
        """Hold `chunk` for flow `key`. Returns True if it is the flow's first held chunk, False
        if the flow already had some, None (nothing held) if it would exceed limit_bytes."""
        size = len(chunk.payload)
        if self.held_bytes + size > self.limit_bytes:
            return None
        first = key not in self.held
        self.held.setdefault(key, []).append(chunk)
        self.held_bytes += size
        self.peak_bytes = max(self.peak_bytes, self.held_bytes)
        return first

    def pop(self, key: tuple[str, str]) -> list[HeldChunk]:
        """Remove and return the held chunks of `key` (arrival order; [] if none)."""
        chunks = self.held.pop(key, [])
        self.held_bytes -= sum(len(c.payload) for c in chunks)
        return chunks

    def drop(self, key: tuple[str, str]) -> list[HeldChunk]:
        """pop() and count the bytes as dropped (they must come again from the sender)."""
        chunks = self.pop(key)
        self.dropped_bytes += sum(len(c.payload) for c in chunks)
        return chunks

    def drop_stream(self, stream: trio.SocketStream) -> int:
        """Drop every chunk that came on `stream` (it is being closed); returns bytes dropped."""
        dropped = 0
        for key in list(self.held):
            keep = [c for c in self.held[key] if c.stream is not stream]
            dropped += sum(len(c.payload) for c in self.held[key] if c.stream is stream)
            if keep:
                self.held[key] = keep
            else:
                del self.held[key]
        self.held_bytes -= dropped
        self.dropped_bytes += dropped
        return dropped
