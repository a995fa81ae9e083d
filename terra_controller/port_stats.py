"""Switch port counters read over OpenFlow, as WAN link load (docs/runtime.md, "Port
statistics").

The OpenFlow app asks every switch for its port statistics (OFPPortStatsRequest) every
period and hands each reply's entries to `PortStats.record`. This module keeps the last
two samples of every port and turns the WAN ports' counters into per-link figures: bytes
and packets sent, drops, and the measured rate between the last two polls. Pure logic: no
OpenFlow, no threads, no lock: one thread records (os-ken's handler), others read, and a
port's two samples are one value replaced whole.
"""

from __future__ import annotations

from dataclasses import dataclass

from topologies import Link
from topologies.binding import Binding


@dataclass(frozen=True)
class PortSample:
    """One port's counters at one moment.

    Attributes:
        t_s: when the reply arrived (time.monotonic(), seconds).
        tx_bytes, rx_bytes: bytes sent / received by the port since the switch started.
        tx_packets, rx_packets: packets likewise.
        tx_dropped, rx_dropped: packets the port dropped.
    """

    t_s: float
    tx_bytes: int
    rx_bytes: int
    tx_packets: int
    rx_packets: int
    tx_dropped: int
    rx_dropped: int


@dataclass(frozen=True)
class LinkLoad:
    """A directed WAN link (a -> b) as its sending port (on a's switch) counts it.

    Attributes:
        a, b: DC names. dpid, port: a's switch and the port facing b.
        tx_bytes, tx_packets, tx_dropped: counters of that port (sent towards b).
        rx_bytes, rx_dropped: counters of the same port for traffic from b.
        tx_bytes_per_s: bytes sent per second between the last two samples (None with one).
        sampled_s: age of the last sample when the snapshot was taken (seconds).
    """

    a: str
    b: str
    dpid: int
    port: int
    tx_bytes: int
    tx_packets: int
    tx_dropped: int
    rx_bytes: int
    rx_dropped: int
    tx_bytes_per_s: float | None
    sampled_s: float


class PortStats:
    """The last two samples of every (DPID, port), recorded by one thread and read by any:
    each port's (previous, last) pair is replaced whole, in one dict assignment, so a
    reader sees either pair, never half of one.

    Args:
        binding: DPIDs and WAN ports of the topology (topologies.binding).
    """

    def __init__(self, binding: Binding) -> None:
        self.binding = binding
        self._samples: dict[tuple[int, int], tuple[PortSample | None, PortSample]] = {}
        self.replies = 0

    def record(self, dpid: int, port: int, sample: PortSample) -> None:
        """Store a port's new sample; the one it replaces becomes the previous one.

        A counter that went backwards (the switch restarted) drops the previous sample, so
        no negative rate is ever computed.
        """
        key = (dpid, port)
        kept = self._samples.get(key)
        last = None if kept is None else kept[1]
        previous = last if last is not None and sample.tx_bytes >= last.tx_bytes else None
        self._samples[key] = (previous, sample)

    def wan_links(self, now_s: float) -> dict[Link, LinkLoad]:
        """{(a, b): LinkLoad} for every directed WAN link whose sending port was sampled.

        Args:
            now_s: time.monotonic() now (for `sampled_s`).
        """
        out: dict[Link, LinkLoad] = {}
        samples = self._samples
        for dc, switch in self.binding.switches.items():
            for neighbour, port in switch.ports.items():
                kept = samples.get((switch.dpid, port))
                if kept is None:
                    continue
                prev, last = kept
                rate = None
                if prev is not None and last.t_s > prev.t_s:
                    rate = (last.tx_bytes - prev.tx_bytes) / (last.t_s - prev.t_s)
                out[(dc, neighbour)] = LinkLoad(
                    dc, neighbour, switch.dpid, port, last.tx_bytes, last.tx_packets,
                    last.tx_dropped, last.rx_bytes, last.rx_dropped, rate, now_s - last.t_s,
                )  # fmt: skip
        return out

    def wan_tx_bytes(self) -> int:
        """Sum of tx_bytes over every sampled WAN port (the bytes the WAN links carried)."""
        return sum(load.tx_bytes for load in self.wan_links(0.0).values())
