"""Topology Zoo GraphML files read into a Topology (docs/design.md section 7).

One DC per node, named by the node's `label` (its id when it has none), in the file's node
order. Every edge between two different nodes is one undirected link; its capacity is the
edge's `LinkSpeedRaw` (bit/s), else `LinkSpeed` x `LinkSpeedUnits` (K, M, G or T: 1e3 ..
1e12 bit/s), else the default capacity. What the file says that the model cannot hold is
repaired, counted and logged, one warning line per kind:

- "self_loops": edges from a node to itself, dropped;
- "renamed_labels": nodes whose label an earlier node already has, named ``label-id``;
- "parallel_edges": edges merged into another edge between the same two DCs (either
  direction; n edges count n - 1): the link's capacity is the sum of theirs, and the
  pair is listed in ``attrs["parallel_links"]`` as [a, b, n] so `Topology.scaled`
  (--link-gbps) keeps n links' worth;
- "edges_without_capacity": edges with no usable link speed, given the default capacity
  (not logged when every link's capacity is overridden anyway).

The counts are in ``attrs["load_warnings"]`` (kind -> number, kinds that occurred only).
Equal-cost paths are ranked by the DCs' positions in the file (``attrs["path_tie_break"]
= "dc_order"``, topologies/paths.py), so renaming nodes does not change which paths are
chosen.
"""

from __future__ import annotations

import logging
import math
from pathlib import Path as FsPath
from typing import TYPE_CHECKING

from topologies.topology import GBPS_TO_BYTES_PER_S, Topology, TopologyError

if TYPE_CHECKING:
    import networkx as nx

log = logging.getLogger(__name__)

UNIT_BITS = {"K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12}  # LinkSpeedUnits -> bit/s
EXAMPLES = 5  # repairs named in a warning line, per kind


def read_graphml(
    path: FsPath | str,
    name: str,
    default_bps: float,
    log_missing: bool = True,
    dc_order_ties: bool = True,
) -> Topology:
    """Read a Topology Zoo GraphML file (module docstring).

    Args:
        path: the file.  name: the Topology's name.
        default_bps: capacity of an edge without a link speed, bytes/s (> 0).
        log_missing: log the edges without a capacity (count them either way).
        dc_order_ties: rank equal-cost paths by file order (else by DC name).

    Raises:
        TopologyError: unreadable or invalid GraphML, or no edge between two nodes.
    """
    import networkx as nx  # imported on use: a client or an agent never reads GraphML

    path = FsPath(path)
    try:
        graph = nx.read_graphml(path)
    except Exception as exc:  # networkx raises several types for bad XML
        raise TopologyError(f"{path}: invalid GraphML: {exc}") from exc
    repairs = _Repairs()
    names = _dc_names(graph, repairs)
    capacity, parallel = _links(graph, names, default_bps, repairs)
    if not capacity:
        raise TopologyError(f"{path}: GraphML has no links")
    edges = graph.number_of_edges() - repairs.counts.get("self_loops", 0)
    _log_repairs(path, repairs, edges, default_bps, log_missing)
    attrs: dict = {"parallel_links": parallel} if parallel else {}
    if repairs.counts:
        attrs["load_warnings"] = dict(repairs.counts)
    if dc_order_ties:
        attrs["path_tie_break"] = "dc_order"
    return Topology(name, list(names.values()), capacity, attrs=attrs)


class _Repairs:
    """Repairs by kind: how many (`counts`) and how to name each (`items`)."""

    def __init__(self) -> None:
        self.counts: dict[str, int] = {}
        self.items: dict[str, list[str]] = {}

    def add(self, kind: str, item: str, n: int = 1) -> None:
        """Count `n` repairs of `kind`, named `item` in the warning."""
        self.counts[kind] = self.counts.get(kind, 0) + n
        self.items.setdefault(kind, []).append(item)


def _dc_names(graph: nx.Graph, repairs: _Repairs) -> dict[str, str]:
    """{node id: DC name}, in the file's node order; repeated labels are renamed."""
    names: dict[str, str] = {}
    taken: set[str] = set()
    for node, data in graph.nodes(data=True):
        label = str(data.get("label") or node)
        dc = label
        if dc in taken:
            dc = f"{label}-{node}"
            while dc in taken:
                dc += "'"
            repairs.add("renamed_labels", f"{label} ({node}) -> {dc}")
        names[node] = dc
        taken.add(dc)
    return names


def _links(
    graph: nx.Graph, names: dict[str, str], default_bps: float, repairs: _Repairs
) -> tuple[dict[tuple[str, str], float], list[list]]:
    """(directed link -> capacity in bytes/s, [[a, b, n] per pair joined by n > 1 edges])."""
    total: dict[tuple[str, str], float] = {}
    count: dict[tuple[str, str], int] = {}
    for u, v, data in graph.edges(data=True):  # a multigraph lists every parallel edge
        if u == v:
            repairs.add("self_loops", names[u])
            continue
        a, b = names[u], names[v]
        key = (b, a) if (b, a) in count else (a, b)
        bps = edge_bytes_per_s(data)
        if bps is None:
            bps = default_bps
            repairs.add("edges_without_capacity", f"{a}-{b}")
        total[key] = total.get(key, 0.0) + bps
        count[key] = count.get(key, 0) + 1
    capacity: dict[tuple[str, str], float] = {}
    for (a, b), bps in total.items():
        capacity[(a, b)] = capacity[(b, a)] = bps
    parallel: list[list] = [[a, b, n] for (a, b), n in count.items() if n > 1]
    for a, b, n in parallel:
        gbps = total[(a, b)] / GBPS_TO_BYTES_PER_S
        repairs.add("parallel_edges", f"{a}-{b} ({n} edges, {gbps:g} Gbps in the file)", n - 1)
    return capacity, parallel


def edge_bytes_per_s(data: dict) -> float | None:
    """An edge's capacity in bytes/s from its Topology Zoo attributes, None when it has no
    usable one: `LinkSpeedRaw` (bit/s), else `LinkSpeed` in `LinkSpeedUnits` (K/M/G/T,
    case and a trailing "bps" or "b/s" ignored). A value must be a finite number > 0."""
    bits = _positive(data.get("LinkSpeedRaw"))
    if bits is None:
        speed = _positive(data.get("LinkSpeed"))
        unit = str(data.get("LinkSpeedUnits", "")).strip().upper()[:1]
        bits = speed * UNIT_BITS[unit] if speed is not None and unit in UNIT_BITS else None
    return None if bits is None else bits / 8


def _positive(value: object) -> float | None:
    """`value` (a number or a numeric string) as a finite float > 0, else None."""
    if value is None or isinstance(value, bool):
        return None
    try:
        number = float(str(value).strip())
    except ValueError:
        return None
    return number if math.isfinite(number) and number > 0 else None


def _log_repairs(
    path: FsPath, repairs: _Repairs, edges: int, default_bps: float, missing: bool
) -> None:
    """One warning line per kind of repair (module docstring), naming a few of them."""
    what = {
        "self_loops": "self-loop(s) dropped",
        "renamed_labels": "repeated label(s) renamed",
        "parallel_edges": "parallel edge(s) merged, one link per DC pair of their summed capacity",
        "edges_without_capacity": f"of {edges} edges without a link speed (LinkSpeedRaw or "
        f"LinkSpeed and LinkSpeedUnits): {default_bps / GBPS_TO_BYTES_PER_S:g} Gbps each",
    }
    for kind, items in repairs.items.items():
        if kind == "edges_without_capacity" and not missing:
            continue
        if kind == "edges_without_capacity" and len(items) == edges:
            items = []  # all of them: naming a few says nothing
        shown = ", ".join(items[:EXAMPLES]) + (", ..." if len(items) > EXAMPLES else "")
        line = f"{repairs.counts[kind]} {what[kind]}" + (f": {shown}" if shown else "")
        log.warning("%s: %s", path, line)
