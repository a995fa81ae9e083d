"""CoflowSim's non-blocking fabric as a WAN: one node per rack, each joined to one core.

CoflowSim (Chowdhury's coflow simulator, used with the coflow-benchmark traces)
models the datacenter as one big non-blocking switch: only the racks' ports
limit a flow. Here rack r is the node ``str(r)`` with its own uplink r -> core
and downlink core -> r; the core node has no traffic of its own. Every path
between two racks is the unique r -> core -> s, so K is irrelevant.

Rate: CoflowSim moves 1 MiB per rack port per 8 ms epoch, i.e.
1,048,576 bytes / 0.008 s = 131,072,000 bytes/s = 1.048576 Gbit/s per
direction (docs/design.md section 7 lists where we differ from CoflowSim).

The topology carries ``attrs["rack_dcs"]``: the node of each rack, in rack order.
workloads.load_workload maps rack r of a coflow-benchmark trace to
``rack_dcs[r]`` (the identity) instead of ``dcs[r % N]``.
"""

from __future__ import annotations

from topologies.topology import GBPS_TO_BYTES_PER_S, Topology, TopologyError

BIGSWITCH_RACKS = 150  # the racks of the packaged FB trace (workloads/data)
COFLOWSIM_PORT_BYTES_PER_S = 1_048_576 / 0.008  # 1 MiB per 8 ms epoch = 131,072,000 B/s
COFLOWSIM_PORT_GBPS = COFLOWSIM_PORT_BYTES_PER_S / GBPS_TO_BYTES_PER_S  # 1.048576
CORE = "core"


def bigswitch_topology(
    racks: int = BIGSWITCH_RACKS, port_bytes_per_s: float = COFLOWSIM_PORT_BYTES_PER_S
) -> Topology:
    """Build the non-blocking fabric: racks "0".."racks-1" plus "core" (module docstring).

    Args:
        racks: number of racks (>= 2).
        port_bytes_per_s: capacity of each uplink and each downlink, bytes/s
            (default CoflowSim's 131,072,000 bytes/s).

    Returns:
        A Topology named "bigswitch" with DCs ["0", ..., str(racks - 1), "core"],
        2 * racks directed links and ``attrs["rack_dcs"]`` = the rack nodes in order.

    Raises:
        TopologyError: fewer than 2 racks or a non-positive / non-finite capacity.
    """
    if isinstance(racks, bool) or not isinstance(racks, int) or racks < 2:
        raise TopologyError(f"bigswitch: needs at least 2 racks, got {racks!r}")
    nodes = [str(r) for r in range(racks)]
    capacity: dict[tuple[str, str], float] = {}
    for node in nodes:
        capacity[(node, CORE)] = capacity[(CORE, node)] = port_bytes_per_s
    return Topology("bigswitch", [*nodes, CORE], capacity, attrs={"rack_dcs": nodes})
