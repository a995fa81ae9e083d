"""The testbed's workload: a slice of the FB trace (or a JSON workload) on the SWAN testbed.

How the trace is placed on the testbed, identical for Terra and the
per-flow TCP baseline:

1. Racks map to DCs as `r mod 5` (docs/design.md section 8: HK, LA, NY, FL, BA).
2. A slice of `count` consecutive coflows starting at trace position `first` is taken
   (default: the burst of 12 coflows that arrive 199.8-204.8 s into the trace, seven
   of them 240-295 MiB and five of 5-7 MiB on the WAN, 1650 MiB in all).
3. Intra-DC flows are dropped (they never cross the WAN; Terra counts them done with
   the WAN part). A coflow's flows between the same two DCs are merged into one flow
   (with one host per DC they would share source host, destination host and FlowGroup
   anyway); flow id "SRC>DST", bytes = the sum. With n hosts per DC the sum is split
   into n flows "SRC>DST#j" from the j-th host of SRC to the j-th host of DST.
4. Bytes are multiplied by `byte_scale` and arrival times (relative to the slice's
   first arrival) by `time_scale` (`scales()`): byte_scale = testbed link rate / 1 Gbps
   (the seed paper's testbed links; 20 Mbit/s -> 1/50) / speedup and time_scale =
   1 / speedup. The testbed's links then carry the load the unscaled slice puts on a
   1 Gbps SWAN, `speedup` times faster. `load` (default 1 here; the CLI's default is 2,
   see mininet_scenarios.cli for why) multiplies byte_scale: the offered load relative to
   the links' capacity, with the same arrival times. Every flow is at least MIN_FLOW_BYTES.
"""

from __future__ import annotations

from dataclasses import dataclass

from terra_model import Coflow, WorkloadError
from topologies import Topology
from topologies.binding import Binding
from workloads import load_workload

PAPER_LINK_BPS = 1e9  # the seed paper's testbed links (docs/design.md section 7)
MIN_FLOW_BYTES = 64 * 1024
DEFAULT_FIRST = 38  # trace position of coflow id 39 (arrives at 199.8 s)
DEFAULT_COUNT = 12


@dataclass(frozen=True)
class TestbedCoflow:
    """One coflow as the testbed runs it.

    Attributes:
        trace_id: the coflow's id in the workload.
        arrival_s: seconds after the run's start (already time-scaled).
        flows: [{"id": "SRC>DST", "src": agent host, "dst": agent host, "bytes": int}].
        tenant: the tenant submitting it (mininet_scenarios.testbed_tenants), or None: the
            testbed's one job master.
    """

    trace_id: int | str
    arrival_s: float
    flows: tuple[dict, ...]
    tenant: str | None = None

    @property
    def bytes(self) -> int:
        """Total bytes of the coflow's flows."""
        return sum(f["bytes"] for f in self.flows)


def scales(link_mbps: float, speedup: float, load: float = 1.0) -> tuple[float, float]:
    """(byte_scale, time_scale) for a testbed with `link_mbps` links.

    byte_scale = load * link_mbps * 1e6 / PAPER_LINK_BPS / speedup and time_scale =
    1 / speedup: with load 1 the slice loads the testbed's links exactly as the unscaled
    slice loads the paper's 1 Gbps links, played `speedup` times faster (CCTs shrink by the
    same factor); `load` multiplies every flow's bytes (offered load x `load`, arrival
    times unchanged). E.g. 20 Mbit/s, speedup 0.5, load 2: bytes x 0.08, times x 2.

    Raises:
        ValueError: link_mbps, speedup or load not positive.
    """
    if link_mbps <= 0 or speedup <= 0 or load <= 0:
        raise ValueError("link_mbps, speedup and load must be positive")
    return load * link_mbps * 1e6 / PAPER_LINK_BPS / speedup, 1.0 / speedup


def testbed_coflows(
    spec: str,
    topology: Topology,
    binding: Binding,
    first: int,
    count: int,
    byte_scale: float,
    time_scale: float,
) -> list[TestbedCoflow]:
    """Load workload `spec` ("fb", a trace path or a .json) and shape it for the testbed.

    Args:
        spec, topology: as workloads.load_workload. binding: gives each DC's agent hosts.
        first, count: the slice of coflows (positions in arrival order).
        byte_scale, time_scale: multipliers for bytes and arrival times (module docstring).

    Returns:
        Coflows with at least one WAN flow, in arrival order, arrivals starting at 0.

    Raises:
        WorkloadError: unreadable workload, or no coflow with WAN bytes in the slice.
        ValueError: first < 0, count < 1 or non-positive scales.
    """
    if first < 0 or count < 1 or byte_scale <= 0 or time_scale <= 0:
        raise ValueError("need first >= 0, count >= 1 and positive scales")
    coflows = sorted(load_workload(spec, topology, limit=first + count), key=lambda c: c.arrival_s)
    chosen = [c for c in coflows[first : first + count] if c.wan_bytes > 0]
    if not chosen:
        raise WorkloadError(f"{spec}: no coflow with WAN flows at positions {first}..")
    t0 = chosen[0].arrival_s
    hosts = {dc: [h.name for h in binding.hosts(dc)] for dc in topology.dcs}
    return [_shape(c, t0, hosts, byte_scale, time_scale) for c in chosen]


def _shape(c: Coflow, t0: float, hosts: dict, byte_scale: float, time_scale: float):
    flows = []
    for (src, dst), volume in sorted(c.flowgroups().items()):
        if src == dst:
            continue
        n = min(len(hosts[src]), len(hosts[dst]))
        for j in range(n):
            flows.append(
                {
                    "id": f"{src}>{dst}" if n == 1 else f"{src}>{dst}#{j + 1}",
                    "src": hosts[src][j],
                    "dst": hosts[dst][j],
                    "bytes": max(MIN_FLOW_BYTES, round(volume * byte_scale / n)),
                }
            )
    return TestbedCoflow(c.id, (c.arrival_s - t0) * time_scale, tuple(flows))
