"""Topology loaders: built-in names, our JSON format and Topology Zoo GraphML.

JSON format (docs/design.md section 7)::

    {"name": "...", "default_capacity_gbps": 10, "dcs": ["A", ...],
     "links": [{"a": "HK", "b": "LA", "capacity_gbps": 10}]}

Every link is undirected (two directed links, each with that capacity);
`capacity_gbps` per link is optional; `dcs` is optional (default: order of
first appearance in `links`). Extra top-level keys (e.g. switch bindings) are
kept in `Topology.attrs`, e.g. "positions": {"HK": [114.2, 22.3], ...} (x, y per DC,
here longitude and latitude), where the controller's operator page draws the DCs, and
"path_tie_break": "dc_order" (equal-cost paths ranked by the order of `dcs` rather than
by DC name, topologies/paths.py). 1 Gbps = 1e9 bit/s = 1.25e8 bytes/s.
"""

from __future__ import annotations

import errno
import os
from importlib import resources
from pathlib import Path as FsPath
from typing import cast

import msgspec

from topologies.bigswitch import bigswitch_topology
from topologies.graphml import read_graphml
from topologies.json_topology import DEFAULT_GBPS, TopologyFile
from topologies.paths import TIE_BREAKS
from topologies.topology import GBPS_TO_BYTES_PER_S, Topology, TopologyError
from topologies.typed_json import PositiveNumber, convert, read_json

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
        TopologyError: an unknown name ("no such topology"); a file that cannot be read
            ("cannot read", raised from the OSError: a missing path with a file extension
            such as .json, .graphml or .xml, or with a directory separator, is a file
            that cannot be read, not an unknown name); an unknown format or invalid
            content (the message names the file and the field).
    """
    if spec == "bigswitch":
        topo = bigswitch_topology()
        if link_gbps is not None:
            topo = topo.scaled(_gbps(link_gbps, "bigswitch: link_gbps") * GBPS_TO_BYTES_PER_S)
        return topo
    path = builtin_path(spec) if spec in BUILTIN else FsPath(spec)
    if not path.is_file():
        if spec not in BUILTIN and _names_a_file(spec):
            error = _not_a_file(path)
            raise TopologyError(f"{spec}: cannot read: {error}") from error
        raise TopologyError(
            f"{spec}: no such topology (built-ins: {', '.join(BUILTIN)}, bigswitch)"
        )
    if path.suffix.lower() == ".json":
        topo = load_json_topology(path)
    elif path.suffix.lower() == ".graphml":  # the built-in ATT keeps name-ordered ties
        builtin = spec in BUILTIN
        name = spec if builtin else None
        missing = link_gbps is None  # edges without a speed matter only then
        topo = load_graphml_topology(
            path,
            name,
            log_missing=missing,
            dc_order_ties=not builtin,
            speeds_overridden=not missing,
        )
    else:
        raise TopologyError(f"{path}: unknown topology format (expected .json or .graphml)")
    if link_gbps is not None:
        topo = topo.scaled(_gbps(link_gbps, f"{path}: link_gbps") * GBPS_TO_BYTES_PER_S)
    return topo


def _names_a_file(spec: str) -> bool:
    """True when `spec` is meant as a file: it has a file extension or a directory part."""
    return bool(FsPath(spec).suffix) or "/" in spec or os.sep in spec


def _not_a_file(path: FsPath) -> OSError:
    """The OSError of reading `path`, which is not a regular file."""
    code = errno.EISDIR if path.is_dir() else errno.ENOENT
    return OSError(code, os.strerror(code), str(path))


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
    fields = cast(dict[str, object], doc)  # (a JSON object: convert accepted it)
    attrs = {key: val for key, val in fields.items() if key not in {"name", "links", "dcs"}}
    if attrs.get("path_tie_break", TIE_BREAKS[0]) not in TIE_BREAKS:
        raise TopologyError(
            f"{path}: path_tie_break: must be one of {', '.join(TIE_BREAKS)}, "
            f"got {attrs['path_tie_break']!r}"
        )
    return Topology(name, order, capacity, attrs=attrs)


def load_graphml_topology(
    path: FsPath | str,
    name: str | None = None,
    default_gbps: float = DEFAULT_GBPS,
    log_missing: bool = True,
    dc_order_ties: bool = True,
    speeds_overridden: bool = False,
) -> Topology:
    """Load a Topology Zoo GraphML file (topologies/graphml.py): link speeds from
    `LinkSpeedRaw` (or `LinkSpeed` and `LinkSpeedUnits`), `default_gbps` for edges without
    one; self-loops dropped, repeated labels renamed, parallel edges summed, a topology
    of several connected components loaded, each kind counted in
    ``attrs["load_warnings"]`` and logged on one line (edges without a capacity only when
    `log_missing`). Equal-cost paths are ranked by file order when `dc_order_ties` (else
    by DC name). Named `name`, else the file's stem. `speeds_overridden`: the caller
    replaces every capacity (--link-gbps), so an invalid link speed is logged, not an error.

    Raises:
        TopologyError: unreadable or invalid GraphML, no edges, or an edge with an invalid
            link speed (unless `speeds_overridden`).
    """

    path = FsPath(path)
    bps = _gbps(default_gbps, f"{path}: default_gbps") * GBPS_TO_BYTES_PER_S
    return read_graphml(path, name or path.stem, bps, log_missing, dc_order_ties, speeds_overridden)


def _gbps(value: object, where: str) -> float:
    """`value` as a capacity in Gbps (a finite number > 0).

    Raises:
        TopologyError: naming `where`, for anything else.
    """
    return convert(value, PositiveNumber, TopologyError, where, top=False)
