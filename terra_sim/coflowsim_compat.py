"""terra-sim --coflowsim-compat: the big switch simulated the way CoflowSim's code does it
(docs/design.md section 7; github.com/coflow/coflowsim).

What changes against the default big-switch model:

- Fabric: each rack is split into a sending node (uplink) and a receiving node (downlink)
  (topologies.bigswitch.split_bigswitch_topology), so a flow within a rack uses both of
  the rack's ports, and a coflow made only of such flows is timed like any other.
- Workload: the trace is read as CoflowSim reads it (workloads/coflowsim_trace.py):
  racks coalesced, reducer bytes rounded up to a multiple of the mapper count in MiB,
  coflows admitted (and their CCT counted) from the start of their 10,240-ms epoch.
- Time: 8-ms steps (QUANTUM_S; simulator.simulate's quantum_s): rates hold for whole
  steps and a flow finishing within a step leaves at its end.
"""

from __future__ import annotations

from topologies import Topology, TopologyError
from topologies.bigswitch import COFLOWSIM_PORT_BYTES_PER_S, split_bigswitch_topology
from topologies.topology import GBPS_TO_BYTES_PER_S

QUANTUM_S = 0.008  # CoflowSim's SIMULATION_QUANTA: 1 MiB through a port, 8 ms


def coflowsim_topology(spec: str, link_gbps: float | None = None) -> Topology:
    """The split big switch for --coflowsim-compat.

    Args:
        spec: the --topology value; only "bigswitch" is accepted.
        link_gbps: every port's capacity in Gbps (default CoflowSim's 1.048576).

    Raises:
        ValueError: `spec` is not "bigswitch", or link_gbps is not a positive number.
    """
    if spec != "bigswitch":
        raise ValueError(f"--coflowsim-compat needs --topology bigswitch, got {spec!r}")
    port = COFLOWSIM_PORT_BYTES_PER_S
    if link_gbps is not None:
        if not 0 < link_gbps < float("inf"):
            raise ValueError(f"--link-gbps must be positive, got {link_gbps}")
        port = link_gbps * GBPS_TO_BYTES_PER_S
    try:
        return split_bigswitch_topology(port_bytes_per_s=port)
    except TopologyError as exc:  # (not with these arguments)
        raise ValueError(str(exc)) from exc
