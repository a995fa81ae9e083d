"""The controller's event log: what an operator wants to see happen, kept in memory.

A bounded, numbered log of the few events that change what the WAN or a coflow does:

    link_down / link_up        a link a-b set down or up (operator API or switch port)
    capacity                   a link a-b's capacity set (bytes/s)
    admitted / rejected        a coflow admitted, or refused (deadline cannot be met)
    done / failed / cancelled  a coflow finished, with the reason when it did not succeed
    agent_registered / agent_lost  an agent (re-)registered, or its control connection ended

Each event is {"seq": n (1, 2, ... in order), "t": wall-clock UNIX seconds, "kind", ...
fields of the kind}. The controller appends with `add` at the points these happen and
REST /events?since=N returns the events after N, both on the controller's loop (its one
owner, owner_loop.py), so the log takes no lock.
At most `capacity` events are kept; older ones are dropped (a reader whose `since` is
older than the first kept event sees "dropped" > 0).
"""

from __future__ import annotations

import time
from collections import deque

EVENTS_KEPT = 1000  # events kept in memory (the oldest are dropped)


class EventLog:
    """A bounded, numbered in-memory event log, used from one thread (the controller's loop).

    Args:
        capacity: events kept (>= 1).
        clock: wall-clock seconds (default time.time).

    Raises (constructor):
        ValueError: capacity < 1.
    """

    def __init__(self, capacity: int = EVENTS_KEPT, clock=time.time) -> None:
        if capacity < 1:
            raise ValueError("capacity must be >= 1")
        self.capacity = capacity
        self.clock = clock
        self.seq = 0  # the last event's number
        self._events: deque[dict] = deque(maxlen=capacity)

    def add(self, kind: str, **fields) -> dict:
        """Append an event of `kind` with `fields` (JSON values); returns it."""
        self.seq += 1
        event = {"seq": self.seq, "t": self.clock(), "kind": kind, **fields}
        self._events.append(event)
        return event

    def since(self, seq: int, limit: int | None = None) -> dict:
        """The events numbered above `seq`, oldest first.

        Args:
            seq: the last event number the reader has (0: from the start).
            limit: return at most this many (the oldest of them); None: all kept.

        Returns:
            {"events": [...], "last": the newest event number now, "dropped": events after
            `seq` no longer kept (the log is bounded)}. O(returned events).
        """
        events = self._events
        first = events[0]["seq"] if events else self.seq + 1
        skip = max(0, seq + 1 - first)
        count = len(events) - skip
        if limit is not None:
            count = min(count, max(0, limit))
        out = [events[i] for i in range(skip, skip + count)] if count > 0 else []
        return {"events": out, "last": self.seq, "dropped": max(0, first - seq - 1)}
