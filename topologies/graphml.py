"""Topology Zoo GraphML files read into a Topology (docs/design.md section 7).

One DC per node, named by the node's `label` (its id when it has none or an empty one; a
label such as 0 counts), in the file's node order. Every edge between two different nodes
is one undirected link; its capacity is the edge's `LinkSpeedRaw` (bit/s), else `LinkSpeed`
x `LinkSpeedUnits` (K, M, G or T: 1e3 .. 1e12 bit/s), else (neither given) the default
capacity. A link speed that is given but unusable (not a finite number > 0, `LinkSpeed`
without known `LinkSpeedUnits`) is an error naming the edge, unless every link's capacity
is overridden (`speeds_overridden`, terra-sim --link-gbps): the file's speeds are then
ignored, and such edges counted and logged as "invalid_link_speeds". What the file says
that the model cannot hold is repaired, counted and logged, one warning line per kind:

- "self_loops": edges from a node to itself, dropped;
- "renamed_labels": nodes whose label an earlier node already has, named ``label-id``;
- "parallel_edges": edges merged into another edge between the same two DCs (either
  direction; n edges count n - 1): the link's capacity is the sum of theirs, and the
  pair is listed in ``attrs["parallel_links"]`` as [a, b, n] so `Topology.scaled`
  (--link-gbps) keeps n links' worth;
- "edges_without_capacity": edges with no usable link speed, given the default capacity
  (not logged when every link's capacity is overridden anyway);
- "components": the topology is not connected; the count is its number of connected
  components (loaded all the same: a workload may stay within one; a coflow across two
  fails in the run).

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
    speeds_overridden: bool = False,
) -> Topology:
    """Read a Topology Zoo GraphML file (module docstring).

    Args:
        path: the file.  name: the Topology's name.
        default_bps: capacity of an edge without a link speed, bytes/s (> 0).
        log_missing: log the edges without a capacity (count them either way).
        dc_order_ties: rank equal-cost paths by file order (else by DC name).
        speeds_overridden: the caller replaces every link's capacity (--link-gbps): an
            invalid link speed is then counted and logged ("invalid_link_speeds"), not
            an error.

    Raises:
        TopologyError: unreadable or invalid GraphML, no edge between two nodes, or (unless
            `speeds_overridden`) an edge with an invalid link speed (one line naming it).
    """
    import networkx as nx  # imported on use: a client or an agent never reads GraphML

    path = FsPath(path)
    try:
        graph = nx.read_graphml(path)
    except OSError as exc:
        raise TopologyError(f"{path}: cannot read: {exc}") from exc
    except Exception as exc:  # networkx raises several types for bad XML
        raise TopologyError(f"{path}: invalid GraphML: {exc}") from exc
    repairs = _Repairs()
    names = _dc_names(graph, repairs)
    try:
        capacity, parallel = _links(graph, names, default_bps, repairs, speeds_overridden)
    except TopologyError as exc:
        raise TopologyError(f"{path}: {exc}") from None
    if not capacity:
        raise TopologyError(f"{path}: GraphML has no links")
    _components(list(names.values()), capacity, repairs)
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
        label = data.get("label")
        label = str(node) if label is None or str(label) == "" else str(label)
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
    graph: nx.Graph,
    names: dict[str, str],
    default_bps: float,
    repairs: _Repairs,
    speeds_overridden: bool = False,
) -> tuple[dict[tuple[str, str], float], list[list]]:
    """(directed link -> capacity in bytes/s, [[a, b, n] per pair joined by n > 1 edges]).

    Raises:
        TopologyError: "edge A-B (nodes u-v): KEY: ..." for an invalid link speed, unless
            `speeds_overridden` (then counted as "invalid_link_speeds").
    """
    total: dict[tuple[str, str], float] = {}
    count: dict[tuple[str, str], int] = {}
    for u, v, data in graph.edges(data=True):  # a multigraph lists every parallel edge
        if u == v:
            repairs.add("self_loops", names[u])
            continue
        a, b = names[u], names[v]
        key = (b, a) if (b, a) in count else (a, b)
        try:
            bps = edge_bytes_per_s(data)
        except ValueError as exc:
            if not speeds_overridden:
                raise TopologyError(f"edge {a}-{b} (nodes {u}-{v}): {exc}") from None
            bps = default_bps  # replaced by the caller's capacity
            repairs.add("invalid_link_speeds", f"{a}-{b} ({exc})")
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
    """An edge's capacity in bytes/s from its Topology Zoo attributes, None when it gives
    none: `LinkSpeedRaw` (bit/s), else `LinkSpeed` in `LinkSpeedUnits` (K/M/G/T, case and
    a trailing "bps" or "b/s" ignored). An attribute that is absent or an empty string is
    not given; `LinkSpeedUnits` alone gives no speed.

    Raises:
        ValueError: "KEY: ..." for a given speed that is not a finite number > 0 (bits
            too), or a `LinkSpeed` without known `LinkSpeedUnits`.
    """
    if _given(data.get("LinkSpeedRaw")):
        bits = _positive("LinkSpeedRaw", data["LinkSpeedRaw"])
    elif _given(data.get("LinkSpeed")):
        speed = _positive("LinkSpeed", data["LinkSpeed"])
        units = data.get("LinkSpeedUnits")
        unit = str(units).strip().upper()[:1] if _given(units) else ""
        if unit not in UNIT_BITS:
            got = "none" if not _given(units) else repr(units)
            raise ValueError(f"LinkSpeedUnits: must be one of K, M, G, T, got {got}")
        bits = speed * UNIT_BITS[unit]
        if not math.isfinite(bits):
            raise ValueError(f"LinkSpeed: must be a finite number of bit/s, got {speed:g} {unit}")
    else:
        return None
    return bits / 8


def _given(value: object) -> bool:
    """True for an attribute value other than None and an empty (or blank) string."""
    return value is not None and str(value).strip() != ""


def _positive(key: str, value: object) -> float:
    """`value` (a number or a numeric string) as a finite float > 0.

    Raises:
        ValueError: "KEY: must be a number > 0, got VALUE" for anything else.
    """
    number = None
    if not isinstance(value, bool):
        try:
            number = float(str(value).strip())
        except ValueError:
            pass
    if number is None or not (math.isfinite(number) and number > 0):
        got = f"{value:g}" if isinstance(value, float) else f"{value!r:.40}"
        raise ValueError(f"{key}: must be a finite number > 0, got {got}")
    return number


def _components(dcs: list[str], capacity: dict[tuple[str, str], float], repairs: _Repairs) -> None:
    """Count the connected components of the DCs and links when there are several, each
    named by its DCs (its first few, in file order)."""
    parent = {dc: dc for dc in dcs}

    def root(dc: str) -> str:
        while parent[dc] != dc:
            parent[dc] = parent[parent[dc]]
            dc = parent[dc]
        return dc

    for a, b in capacity:
        parent[root(a)] = root(b)
    groups: dict[str, list[str]] = {}
    for dc in dcs:
        groups.setdefault(root(dc), []).append(dc)
    if len(groups) < 2:
        return
    for members in groups.values():
        shown = ", ".join(members[:3]) + (", ..." if len(members) > 3 else "")
        size = f"{len(members)} DC" + ("s" if len(members) > 1 else "")
        repairs.add("components", f"{{{shown}}} ({size})")


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
        "invalid_link_speeds": "edge(s) with an invalid link speed, ignored (every link's "
        "capacity is overridden)",
        "components": "connected components: the topology is not connected (a coflow "
        "between two of them has no path)",
    }
    for kind, items in repairs.items.items():
        if kind == "edges_without_capacity" and not missing:
            continue
        if kind == "edges_without_capacity" and len(items) == edges:
            items = []  # all of them: naming a few says nothing
        shown = ", ".join(items[:EXAMPLES]) + (", ..." if len(items) > EXAMPLES else "")
        line = f"{repairs.counts[kind]} {what[kind]}" + (f": {shown}" if shown else "")
        log.warning("%s: %s", path, line)
