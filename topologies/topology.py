"""The WAN model: DCs, directed links with capacities (bytes/s), and link state.

A `Topology` is the operator's view of the WAN that the scheduler and the
simulator share (docs/design.md sections 2 and 7). Every undirected WAN link is two
directed links, each with its own capacity and state.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

GBPS_TO_BYTES_PER_S = 1e9 / 8  # 1 Gbps = 1e9 bit/s = 1.25e8 bytes/s

Link = tuple[str, str]
Path = tuple[str, ...]


class TopologyError(ValueError):
    """A topology file or a topology operation is invalid (message names the file/field)."""


def path_links(path: Path) -> list[Link]:
    """Return the directed links [(u, v), ...] a path of DC names crosses, in order."""
    return list(zip(path[:-1], path[1:], strict=False))


@dataclass
class Topology:
    """A WAN: DCs in the order the topology lists them and directed links.

    Attributes:
        name: topology name (e.g. "swan").
        dcs: DC names, in the order the source lists them (rack r of a trace
            maps to ``dcs[r % len(dcs)]``).
        capacity: directed link (u, v) -> capacity in bytes/s (> 0).
        down: directed links that are currently down.
        attrs: extra per-DC data from the topology file (e.g. DPIDs), by DC name.
    """

    name: str
    dcs: list[str]
    capacity: dict[Link, float]
    down: set[Link] = field(default_factory=set)
    attrs: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        known = set(self.dcs)
        if len(known) != len(self.dcs):
            raise TopologyError(f"topology {self.name}: duplicate DC names in {self.dcs}")
        for (u, v), cap in self.capacity.items():
            if u not in known or v not in known:
                raise TopologyError(f"topology {self.name}: link {u}-{v} names an unknown DC")
            if u == v:
                raise TopologyError(f"topology {self.name}: self-loop link {u}-{v}")
            _check_capacity(cap, f"topology {self.name}: link {u}-{v}")

    @property
    def links(self) -> list[Link]:
        """All directed links, up or down, in a stable order."""
        return sorted(self.capacity)

    def up_links(self) -> list[Link]:
        """Directed links that are up."""
        return [link for link in self.links if link not in self.down]

    def available(self, link: Link) -> float:
        """Capacity of a directed link in bytes/s, 0 when it is down.

        Raises:
            TopologyError: the link does not exist.
        """
        self._check_link(link)
        return 0.0 if link in self.down else self.capacity[link]

    def set_link_state(self, a: str, b: str, up: bool, both: bool = True) -> None:
        """Mark link a->b (and b->a when `both`) up or down.

        Raises:
            TopologyError: the link does not exist.
        """
        for link in [(a, b), (b, a)] if both else [(a, b)]:
            self._check_link(link)
            if up:
                self.down.discard(link)
            else:
                self.down.add(link)

    def set_capacity(self, a: str, b: str, bytes_per_s: float, both: bool = True) -> None:
        """Set the capacity of link a->b (and b->a when `both`), in bytes/s.

        Raises:
            TopologyError: unknown link, or a non-positive / non-numeric capacity.
        """
        _check_capacity(bytes_per_s, f"link {a}-{b}")
        for link in [(a, b), (b, a)] if both else [(a, b)]:
            self._check_link(link)
            self.capacity[link] = float(bytes_per_s)

    def scaled(self, bytes_per_s: float) -> Topology:
        """Return a copy of this topology with every link at `bytes_per_s`.

        A link that stands for n parallel links (``attrs["parallel_links"]``
        entries [a, b, n], from a GraphML file) gets n x `bytes_per_s` each way.
        """
        _check_capacity(bytes_per_s, "uniform capacity")
        times = {}
        for a, b, n in self.attrs.get("parallel_links", []):
            times[(a, b)] = times[(b, a)] = n
        return Topology(
            self.name,
            list(self.dcs),
            {link: float(bytes_per_s) * times.get(link, 1) for link in self.capacity},
            set(self.down),
            dict(self.attrs),
        )

    def copy(self) -> Topology:
        """Return an independent copy (capacities and link state)."""
        return Topology(
            self.name, list(self.dcs), dict(self.capacity), set(self.down), dict(self.attrs)
        )

    def check_dc(self, dc: str, where: str = "") -> None:
        """Raise TopologyError naming `where` unless `dc` is a DC of this topology."""
        if dc not in self.dcs:
            prefix = f"{where}: " if where else ""
            raise TopologyError(f"{prefix}unknown DC {dc!r} (topology {self.name} has {self.dcs})")

    def _check_link(self, link: Link) -> None:
        if link not in self.capacity:
            raise TopologyError(f"topology {self.name}: no link {link[0]}-{link[1]}")


def _check_capacity(value: object, where: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TopologyError(f"{where}: capacity must be a number, got {value!r}")
    try:
        finite = math.isfinite(float(value))
    except OverflowError:  # an int beyond float range
        finite = False
    if not value > 0 or not finite:
        raise TopologyError(f"{where}: capacity must be positive and finite, got {value!r}")
