"""The JSON topology format's fields (docs/design.md section 7), as msgspec Structs::

    {"name": "...", "default_capacity_gbps": 10, "dcs": ["A", ...],
     "links": [{"a": "HK", "b": "LA", "capacity_gbps": 10}]}

Capacities are in Gbps (finite, > 0). Keys these Structs do not name are accepted: a link's
are ignored, the top level's are kept in `Topology.attrs` by the loader
(topologies.loaders.load_json_topology, which also checks what types cannot: DCs known,
links not repeated, a link's ends different).
"""

from __future__ import annotations

import msgspec

from topologies.typed_json import Name, PositiveNumber

DEFAULT_GBPS = 1.0


class LinkSpec(msgspec.Struct):
    """One undirected link: two directed links of `capacity_gbps` each (the file's
    default_capacity_gbps when absent)."""

    a: Name
    b: Name
    capacity_gbps: PositiveNumber | msgspec.UnsetType = msgspec.UNSET


class TopologyFile(msgspec.Struct):
    """A topology file: `links` (checked non-empty by the loader), `dcs` (default: the
    order of first appearance in `links`), `name` (default: the file's stem)."""

    links: list[LinkSpec]
    name: str | int | float | msgspec.UnsetType = msgspec.UNSET
    default_capacity_gbps: PositiveNumber = DEFAULT_GBPS
    dcs: list[Name] | None = None
