"""Topology loaders: built-in names, our JSON format and Topology Zoo GraphML.

JSON format (docs/design.md section 7)::

    {"name": "...", "default_capacity_gbps": 10, "dcs": ["A", ...],
     "links": [{"a": "HK", "b": "LA", "capacity_gbps": 10}]}

Every link is undirected (two directed links, each with that capacity);
`capacity_gbps` per link is optional; `dcs` is optional (default: order of
first appearance in `links`). Extra top-level keys (e.g. switch bindings) are
kept in `Topology.attrs`, e.g. "positions": {"HK": [114.2, 22.3], ...} (x, y per DC,
here longitude and latitude), where the controller's operator page draws the DCs.
1 Gbps = 1e9 bit/s = 1.25e8 bytes/s.
"""

from __future__ import annotations

import logging
from importlib import resources
from pathlib import Path as FsPath

import msgspec

from topologies.bigswitch import bigswitch_topology
from topologies.json_topology import DEFAULT_GBPS, TopologyFile
from topologies.topology import GBPS_TO_BYTES_PER_S, Topology, TopologyError
from topologies.typed_json import PositiveNumber, convert, read_json

log = logging.getLogger(__name__)

BUILTIN = {"swan": "swan.json", "gscale": "gscale.json", "att": "AttMpls.graphml"}


def builtin_path(name: str) -> FsPath:
    """Return the package-data file of a built-in topology ("swan", "gscale", "att")."""
    return FsPath(str(resources.files("topologies") / "data" / BUILTIN[name]))


def load_topology(spec: str, link_gbps: float | None = None) -> Topology:
    """Load a topology by built-in name or file path (.json or .graphml).

    Args:
        spec: "swan", "gscale", "att", "bigswitch" (CoflowSim's fabric, built by
            topologies/bigswitch.py, not read from a file), or a path to a JSON /
            GraphML file.
        link_gbps: when given, every link gets this capacity (Gbps), overriding the file.

    Returns:
        The Topology, named "swan"/"gscale"/"att" for built-ins.

    Raises:
        TopologyError: unreadable file, unknown format, or invalid content
            (the message names the file and the field).
    """
    if spec == "bigswitch":
        topo = bigswitch_topology()
        if link_gbps is not None:
            topo = topo.scaled(_gbps(link_gbps, "bigswitch: link_gbps") * GBPS_TO_BYTES_PER_S)
        return topo
    path = builtin_path(spec) if spec in BUILTIN else FsPath(spec)
    if not path.is_file():
        raise TopologyError(
            f"{spec}: no such topology (built-ins: {', '.join(BUILTIN)}, bigswitch)"
        )
    if path.suffix.lower() == ".json":
        topo = load_json_topology(path)
    elif path.suffix.lower() == ".graphml":
        topo = load_graphml_topology(path, name=spec if spec in BUILTIN else None)
    else:
        raise TopologyError(f"{path}: unknown topology format (expected .json or .graphml)")
    if link_gbps is not None:
        topo = topo.scaled(_gbps(link_gbps, f"{path}: link_gbps") * GBPS_TO_BYTES_PER_S)
    return topo


def load_json_topology(path: FsPath | str) -> Topology:
    """Load our JSON topology format (see module docstring; fields in
    topologies/json_topology.py).

    Raises:
        TopologyError: naming the file and the field: invalid JSON, a missing/ill-typed
            field, an unknown DC in a link, a duplicate link, or a non-positive capacity.
    """
    path = FsPath(path)
    doc = read_json(path, TopologyError)
    spec = convert(doc, TopologyFile, TopologyError, str(path), top=True)
    if not spec.links:
        raise TopologyError(f"{path}: 'links' must be a non-empty list")
    order: list[str] = list(spec.dcs or [])
    capacity: dict[tuple[str, str], float] = {}
    for i, link in enumerate(spec.links):
        where, a, b = f"{path}: links[{i}]", link.a, link.b
        if a == b:
            raise TopologyError(f"{where}: a link must join two different DCs ({a})")
        for dc in (a, b):
            if dc not in order:
                if spec.dcs:
                    raise TopologyError(f"{where}: unknown DC {dc!r} (not in 'dcs')")
                order.append(dc)
        if (a, b) in capacity:
            raise TopologyError(f"{where}: duplicate link {a}-{b}")
        gbps = link.capacity_gbps or spec.default_capacity_gbps  # UNSET is false
        capacity[(a, b)] = capacity[(b, a)] = gbps * GBPS_TO_BYTES_PER_S
    name = path.stem if spec.name is msgspec.UNSET else str(spec.name)
    attrs = {key: val for key, val in doc.items() if key not in {"name", "links", "dcs"}}
    return Topology(name, order, capacity, attrs=attrs)


def load_graphml_topology(
    path: FsPath | str, name: str | None = None, default_gbps: float = DEFAULT_GBPS
) -> Topology:
    """Load a Topology Zoo GraphML file: one DC per node, parallel edges summed.

    DC names are node labels (the node id when a node has no label; labels
    that repeat get the id appended). DCs keep the file's node order. The n >= 1
    edges between two DCs (in either direction; self-loops are dropped) become
    one link each way of n x `default_gbps`. For n > 1 a warning names the DC
    pair and n, and the pair is listed in `attrs["parallel_links"]` as
    [a, b, n] (so `Topology.scaled` keeps the sum when capacities are overridden).

    Raises:
        TopologyError: unreadable or invalid GraphML, or no edges.
    """
    import networkx as nx  # imported on use: only GraphML files need it

    path = FsPath(path)
    try:
        graph = nx.read_graphml(path)
    except Exception as exc:  # networkx raises several types for bad XML
        raise TopologyError(f"{path}: invalid GraphML: {exc}") from exc
    names: dict[str, str] = {}
    for node, data in graph.nodes(data=True):
        label = str(data.get("label") or node)
        names[node] = f"{label}-{node}" if label in names.values() else label
    bps = _gbps(default_gbps, f"{path}: default_gbps") * GBPS_TO_BYTES_PER_S
    count: dict[tuple[str, str], int] = {}
    for u, v in graph.edges():  # a multigraph lists every parallel edge
        if u != v:
            a, b = names[u], names[v]
            key = (a, b) if (b, a) not in count else (b, a)
            count[key] = count.get(key, 0) + 1
    if not count:
        raise TopologyError(f"{path}: GraphML has no links")
    capacity: dict[tuple[str, str], float] = {}
    parallel = []
    for (a, b), n in count.items():
        capacity[(a, b)] = capacity[(b, a)] = n * bps
        if n > 1:
            parallel.append([a, b, n])
            log.warning(
                "%s: %d parallel edges between %s and %s: one link of %g Gbps each way",
                path,
                n,
                a,
                b,
                n * bps / GBPS_TO_BYTES_PER_S,
            )
    attrs = {"parallel_links": parallel} if parallel else {}
    return Topology(name or path.stem, list(names.values()), capacity, attrs=attrs)


def _gbps(value: object, where: str) -> float:
    """`value` as a capacity in Gbps (a finite number > 0).

    Raises:
        TopologyError: naming `where`, for anything else.
    """
    return convert(value, PositiveNumber, TopologyError, where, top=False)
