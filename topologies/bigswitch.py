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

The split fabric (`split_bigswitch_topology`, terra-sim --coflowsim-compat) gives each rack
a sending node ``str(r)`` with the uplink and a receiving node ``f"{r}.rx"`` with the
downlink, so a flow within a rack (``r`` -> ``r.rx``) crosses both of the rack's ports,
as in CoflowSim, instead of being intra-DC; ``attrs["rack_rx_dcs"]`` lists the receiving
nodes.
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


def split_bigswitch_topology(
    racks: int = BIGSWITCH_RACKS, port_bytes_per_s: float = COFLOWSIM_PORT_BYTES_PER_S
) -> Topology:
    """The fabric with each rack split into a sending and a receiving node (module
    docstring): uplinks r -> core, downlinks core -> "r.rx".

    Args:
        racks, port_bytes_per_s: as bigswitch_topology.

    Returns:
        A Topology named "bigswitch" with DCs ["0", ..., "0.rx", ..., "core"], 2 * racks
        directed links, ``attrs["rack_dcs"]`` = the sending nodes and
        ``attrs["rack_rx_dcs"]`` = the receiving nodes, in rack order.

    Raises:
        TopologyError: as bigswitch_topology.
    """
    whole = bigswitch_topology(racks, port_bytes_per_s)
    senders = whole.attrs["rack_dcs"]
    receivers = [f"{node}.rx" for node in senders]
    capacity: dict[tuple[str, str], float] = {}
    for node, rx in zip(senders, receivers, strict=True):
        capacity[(node, CORE)] = capacity[(CORE, rx)] = port_bytes_per_s
    attrs = {"rack_dcs": senders, "rack_rx_dcs": receivers}
    return Topology("bigswitch", [*senders, *receivers, CORE], capacity, attrs=attrs)
