"""The events of a simulation run besides flows finishing: coflow arrivals, scripted WAN
changes (WanChange) and the policy's wakeups, in time order (docs/design.md 4.4).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from terra_model import Coflow
from topologies import Topology


@dataclass(frozen=True)
class WanChange:
    """A scripted WAN change at `time_s` seconds on the undirected link a-b.

    Attributes:
        time_s: when it happens (seconds, >= 0).
        a, b: the DCs the link joins (both directions change).
        up: True / False to bring the link up / down; None to leave its state.
        capacity: new capacity in bytes/s for both directions; None to keep it.
    """

    time_s: float
    a: str
    b: str
    up: bool | None = None
    capacity: float | None = None

    def apply(self, topology: Topology) -> None:
        """Mutate `topology` accordingly.

        Raises:
            TopologyError: unknown link or invalid capacity.
        """
        if self.up is not None:
            topology.set_link_state(self.a, self.b, self.up)
        if self.capacity is not None:
            topology.set_capacity(self.a, self.b, self.capacity)


class Events:
    """The arrivals (coflows by arrival time, ties in workload order) and WAN changes (by
    time) still to come, and the policy's next wakeup (`wake`, seconds or None, set by
    the engine at every event).

    Args:
        coflows: the workload.  changes: the scripted WAN changes.
    """

    def __init__(self, coflows: Sequence[Coflow], changes: Sequence[WanChange]) -> None:
        order = sorted(range(len(coflows)), key=lambda i: coflows[i].arrival_s)
        self.arrivals = [coflows[i] for i in order]
        self.next_arrival = 0
        self.changes = sorted(changes, key=lambda ch: ch.time_s)
        self.next_change = 0
        self.wake: float | None = None

    def first_time(self) -> float:
        """Seconds of the first arrival or change (0.0 when there is none)."""
        times = [c.arrival_s for c in self.arrivals[:1]] + [ch.time_s for ch in self.changes[:1]]
        return min(times, default=0.0)

    def arrivals_left(self) -> bool:
        """Some coflow has not arrived yet."""
        return self.next_arrival < len(self.arrivals)

    def apply_changes(self, now: float, topology: Topology) -> bool:
        """Apply the changes due at `now` (seconds) to `topology`; True when there was one."""
        changed = False
        while self.next_change < len(self.changes) and self.changes[self.next_change].time_s <= now:
            self.changes[self.next_change].apply(topology)
            self.next_change += 1
            changed = True
        return changed

    def due_arrivals(self, now: float) -> Iterator[Coflow]:
        """The coflows arriving at or before `now` (seconds), each once, in order."""
        while (
            self.next_arrival < len(self.arrivals)
            and self.arrivals[self.next_arrival].arrival_s <= now
        ):
            coflow = self.arrivals[self.next_arrival]
            self.next_arrival += 1
            yield coflow

    def bound_step(self, step: float, now: float) -> float:
        """`step` (seconds from `now`) cut at the next arrival, change and wakeup."""
        if self.next_arrival < len(self.arrivals):
            step = min(step, self.arrivals[self.next_arrival].arrival_s - now)
        if self.next_change < len(self.changes):
            step = min(step, self.changes[self.next_change].time_s - now)
        if self.wake is not None:
            step = min(step, self.wake - now)
        return step

    def land(self, now: float) -> float:
        """`now` (seconds) moved back onto the next arrival, change or wakeup time when it
        went past one by round-off, so those events happen exactly at their times."""
        if self.next_arrival < len(self.arrivals):
            now = min(now, self.arrivals[self.next_arrival].arrival_s)
        if self.next_change < len(self.changes):
            now = min(now, self.changes[self.next_change].time_s)
        if self.wake is not None:
            now = min(now, self.wake)
        return now
