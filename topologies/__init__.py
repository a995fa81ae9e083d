"""WAN topologies: the model, loaders (built-in, JSON, GraphML) and K shortest paths."""

from topologies.loaders import load_topology
from topologies.paths import all_pairs_paths, k_shortest_paths
from topologies.topology import (
    GBPS_TO_BYTES_PER_S,
    Link,
    Path,
    Topology,
    TopologyError,
    path_links,
)

__all__ = [
    "GBPS_TO_BYTES_PER_S",
    "Link",
    "Path",
    "Topology",
    "TopologyError",
    "all_pairs_paths",
    "k_shortest_paths",
    "load_topology",
    "path_links",
]
