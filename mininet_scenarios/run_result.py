"""What one testbed run measured: CCTs, bytes, digests, WAN utilization, the failure's times."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

from terra_agent.sources import SYNTHETIC_PERIOD, SyntheticSource, flow_key


@dataclass
class Failure:
    """A WAN link that goes down at `down_s` and up at `up_s` (seconds after the first arrival)."""

    a: str
    b: str
    down_s: float
    up_s: float


@dataclass
class RunResult:
    """What one run (Terra or per-flow TCP) measured.

    Attributes:
        cct_s: coflow trace id -> CCT (seconds), for completed coflows.
        duration_s: first arrival to last completion (seconds).
        wan_bytes_sent: bytes sent on WAN switch ports during the run, from the controller's
            OpenFlow port statistics (REST /links).
        wan_bytes_sent_ofctl: the same from `ovs-ofctl dump-ports` text, for comparison.
        wan_capacity_bps: sum of the directed WAN links' HTB rates (bytes/s).
        failed_capacity_bps: HTB rates of the failure link's two directions (bytes/s), set
            when it goes down; 0 without a failure.
        bytes_lost: expected bytes not delivered (unfinished flows, short flows).
        digest_mismatches: flows whose received digest differs from the expected one.
        throughput: coflow trace id -> [(t seconds after start, bytes delivered so far)].
        failure_down_s / failure_up_s: when the link went down / up (s after start), or None.
        reaction_s: link-down command to new rates acknowledged by all agents, or None.
        rounds / round_ms: Terra only: scheduling rounds the controller ran during the run
            and the wall ms of each (up to the last 100; REST /status), else None / [].
        takeover: with several controllers and a leader killed in this run, the
            controller_cluster.LeaderKill report completed by takeover_checks, else {}.
        reserved_pair: Terra with a reservation: [(t s after start, bytes delivered on the
            reserved pair, its flows not done)] (testbed_reservation.PairWatch), else [].
    """

    cct_s: dict = field(default_factory=dict)
    arrival_s: dict = field(default_factory=dict)
    duration_s: float = 0.0
    wan_bytes_sent: int = 0
    wan_bytes_sent_ofctl: int = 0
    wan_capacity_bps: float = 0.0
    failed_capacity_bps: float = 0.0
    bytes_lost: int = 0
    digest_mismatches: int = 0
    throughput: dict = field(default_factory=dict)
    failure_down_s: float | None = None
    failure_up_s: float | None = None
    reaction_s: float | None = None
    controller_reaction_ms: float | None = None
    rounds: int | None = None
    round_ms: list = field(default_factory=list)
    takeover: dict = field(default_factory=dict)
    reserved_pair: list = field(default_factory=list)

    @property
    def busy_s(self) -> float:
        """Seconds during which at least one coflow was active (see `busy_time`)."""
        return busy_time(self.arrival_s, self.cct_s)

    @property
    def capacity_time(self) -> float:
        """Bytes the WAN could carry while a coflow was active: wan_capacity_bps x busy_s,
        less failed_capacity_bps x the busy seconds while the failure link was down (from
        failure_down_s to failure_up_s, or to the end when it never came back up in the run).
        A down link counts 0 capacity, as in the simulator (terra_sim/simulator.py), so the
        testbed's utilization and its simulated twin's use the same denominator.

        E.g. 10 B/s of links, 4 B/s of them failed over [1, 3], busy [0, 2] and [2.5, 4]:
        10 x 3.5 - 4 x (1 + 0.5) = 29 bytes.
        """
        total = self.wan_capacity_bps * self.busy_s
        if self.failure_down_s is None or not self.failed_capacity_bps:
            return total
        up = self.failure_up_s if self.failure_up_s is not None else float("inf")
        down_busy = sum(
            max(0.0, min(hi, up) - max(lo, self.failure_down_s))
            for lo, hi in busy_intervals(self.arrival_s, self.cct_s)
        )
        return total - self.failed_capacity_bps * down_busy

    @property
    def wan_utilization(self) -> float:
        """wan_bytes_sent / capacity_time: the WAN's use while there is demand.

        The port counters are read at the run's start and end, so bytes sent while no coflow
        is active (none: agents and TCP nodes are idle then) would only raise the figure.
        Idle gaps between arrivals (the same in both runs, set by the workload) are left out.
        0 for an empty run.
        """
        return self._per_capacity_time(self.wan_bytes_sent)

    @property
    def wan_utilization_ofctl(self) -> float:
        """`wan_utilization` from the `ovs-ofctl dump-ports` counters (for comparison)."""
        return self._per_capacity_time(self.wan_bytes_sent_ofctl)

    def _per_capacity_time(self, sent: int) -> float:
        denom = self.capacity_time
        return sent / denom if denom > 0 else 0.0


def busy_intervals(arrival_s: dict, cct_s: dict) -> list[tuple[float, float]]:
    """The union of the intervals [arrival, arrival + CCT] (seconds) of completed coflows, as
    sorted disjoint (start, end) pairs.

    E.g. arrivals {a: 0, b: 1, c: 5} and CCTs {a: 2, b: 2, c: 1}: [(0, 3), (5, 6)].
    """
    merged: list[tuple[float, float]] = []
    for lo, hi in sorted((arrival_s[c], arrival_s[c] + cct) for c, cct in cct_s.items()):
        if merged and lo <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], hi))
        else:
            merged.append((lo, hi))
    return merged


def busy_time(arrival_s: dict, cct_s: dict) -> float:
    """Length (s) of the union of the intervals [arrival, arrival + CCT] of completed coflows.

    E.g. arrivals {a: 0, b: 1, c: 5} and CCTs {a: 2, b: 2, c: 1}: [0, 3] and [5, 6] -> 4 s.
    """
    return sum(hi - lo for lo, hi in busy_intervals(arrival_s, cct_s))


def verified_by_agents(flow: dict) -> bool:
    """A Terra flow's status row shows its bytes verified end to end: state "done" with a keyed
    flow digest (64 hex chars). The digest cannot be recomputed here: its key stays inside the
    controller and the flow's two agents (terra_security/integrity.py); the receiver reports "done"
    only when its digest equals the sender's."""
    digest = flow.get("digest")
    return (
        flow.get("state") == "done"
        and isinstance(digest, str)
        and len(digest) == 64
        and all(c in "0123456789abcdef" for c in digest)
    )


def expected_digest(coflow: str, flow: str, size: int) -> str:
    """BLAKE2b (hex) of a flow's synthetic bytes, computed independently of the receivers of
    the TCP baseline (Terra's agents use keyed digests: verified_by_agents)."""
    source = SyntheticSource(flow_key(coflow, flow), size)
    h = hashlib.blake2b()
    for offset in range(0, size, SYNTHETIC_PERIOD):
        h.update(source.read(offset, min(SYNTHETIC_PERIOD, size - offset)))
    return h.hexdigest()
