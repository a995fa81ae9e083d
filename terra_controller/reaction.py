"""How fast a WAN event's new tunnels and rates reached the agents (the reaction-time record
kept by the agent channel, served in REST /status and measured by
benchmarks/failure_reaction.py)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Reaction:
    """How fast a WAN event's new tunnels and rates reached the agents.

    Attributes (time.monotonic() seconds):
        event_at: the controller learned of the event (link down/up, capacity change).
        pushed_at: the round's messages were queued for the agents.
        pending: ids of those messages not yet acknowledged.
        agents: agents that got messages.
        applied_at: the last of them was acknowledged (applied), or None.
    """

    event_at: float
    pushed_at: float
    pending: set[int] = field(default_factory=set)
    agents: set[str] = field(default_factory=set)
    applied_at: float | None = None

    def to_json(self) -> dict:
        """{"event_to_push_ms", "event_to_applied_ms" (None while pending), "agents"}."""
        applied = None if self.applied_at is None else (self.applied_at - self.event_at) * 1e3
        return {
            "event_to_push_ms": (self.pushed_at - self.event_at) * 1e3,
            "event_to_applied_ms": applied,
            "agents": sorted(self.agents),
        }
