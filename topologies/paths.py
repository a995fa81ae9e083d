"""K shortest simple paths per ordered DC pair over the links that are up.

Paths are ranked by hop count, then by their DCs' names (the default: the built-in SWAN,
G-Scale and ATT, JSON files; Yen's order) or, when ``attrs["path_tie_break"] ==
"dc_order"`` (GraphML files, JSON files that ask for it), by bottleneck capacity (the
smallest capacity of their links, larger first) and then the DCs' positions in
`Topology.dcs`, the file's order, so that relabelling nodes does not change which paths are
chosen (docs/design.md section 7).
"""

from __future__ import annotations

from collections.abc import Callable
from itertools import islice
from typing import TYPE_CHECKING

from topologies.topology import Path, Topology, TopologyError

if TYPE_CHECKING:
    import networkx as nx

TIE_BREAKS = ("name", "dc_order")  # values of attrs["path_tie_break"], the default first


def up_graph(topology: Topology) -> nx.DiGraph:
    """Return a DiGraph of the DCs and the directed links that are up."""
    import networkx as nx  # imported on use: a client or an agent never computes paths

    graph = nx.DiGraph()
    graph.add_nodes_from(topology.dcs)
    graph.add_edges_from(topology.up_links())
    return graph


def full_graph(topology: Topology) -> nx.DiGraph:
    """Return a DiGraph of the DCs and every directed link, up or down."""
    import networkx as nx  # imported on use, as in up_graph

    graph = nx.DiGraph()
    graph.add_nodes_from(topology.dcs)
    graph.add_edges_from(topology.links)
    return graph


def k_shortest_paths(
    topology: Topology, src: str, dst: str, k: int, graph: nx.DiGraph | None = None
) -> list[Path]:
    """Return up to `k` simple paths from `src` to `dst` over links that are up.

    Paths are ordered by `path_rank` (hop count, then DC names; or bottleneck capacity and
    file order), so the result is deterministic. The K-th path's hop count is found
    with Yen's algorithm (networkx.shortest_simple_paths); every path of at most that
    hop count is then ranked. A pair whose paths are forced (`_forced_path`: e.g. the
    source's one outgoing link and the destination's one incoming link meet, a rack to a
    rack of CoflowSim's fabric, topologies/bigswitch.py) is answered without Yen, with
    the same result.

    Args:
        topology: the WAN.
        src, dst: DC names (src != dst).
        k: at most this many paths (>= 1).
        graph: optional prebuilt `up_graph(topology)` to reuse across pairs.

    Returns:
        A list of paths, each a tuple of DC names from src to dst; empty when
        no path is up.

    Raises:
        TopologyError: unknown DC, src == dst, or k < 1.
    """
    topology.check_dc(src, "path source")
    topology.check_dc(dst, "path destination")
    if src == dst:
        raise TopologyError(f"no WAN path from a DC to itself ({src})")
    if not isinstance(k, int) or k < 1:
        raise TopologyError(f"K must be a positive integer, got {k!r}")
    graph = up_graph(topology) if graph is None else graph
    forced = _forced_path(graph, src, dst)
    if forced is not None:
        return forced
    import networkx as nx

    found = nx.shortest_simple_paths(graph, src, dst)  # simple paths, fewest hops first
    try:
        first = [tuple(p) for p in islice(found, k)]
    except nx.NetworkXNoPath:
        return []
    if len(first) == k:  # every further path of the K-th path's hop count is a candidate too
        bound = len(first[-1])
        for p in found:
            if len(p) > bound:
                break
            first.append(tuple(p))
    return sorted(first, key=path_rank(topology))[:k]


def path_rank(topology: Topology) -> Callable[[Path], tuple]:
    """Return the sort key of `topology`'s paths (module docstring): (hops, DC names) by
    default, as Yen's algorithm orders them; with ``path_tie_break = "dc_order"`` (GraphML
    files) (hops, -bottleneck capacity in bytes/s, DC positions in `topology.dcs`), which does
    not depend on the DCs' labels.

    Raises:
        TopologyError: ``attrs["path_tie_break"]`` is not one of TIE_BREAKS.
    """
    tie_break = topology.attrs.get("path_tie_break", TIE_BREAKS[0])
    if tie_break not in TIE_BREAKS:
        raise TopologyError(f"topology {topology.name}: unknown path_tie_break {tie_break!r}")
    capacity = topology.capacity
    if tie_break == "name":
        return lambda p: (len(p), p)
    position = {dc: i for i, dc in enumerate(topology.dcs)}
    return lambda p: (len(p), -_bottleneck(p, capacity), tuple(position[dc] for dc in p))


def _bottleneck(path: Path, capacity: dict) -> float:
    """The smallest capacity of `path`'s links (bytes/s)."""
    return min(capacity[link] for link in zip(path[:-1], path[1:], strict=False))


def _forced_path(graph: nx.DiGraph, src: str, dst: str) -> list[Path] | None:
    """The simple paths src -> dst when the graph forces them, else None (unknown).

    Forced: `src` has no outgoing or `dst` no incoming link (no path); `src`'s one
    outgoing link goes to `dst`, or `dst`'s one incoming link comes from `src` (a simple
    path passes src only at its start), so the only path is the link src -> dst; or `src`
    has one outgoing link, to u, and `dst` one incoming link, from u: the only path is
    src -> u -> dst (a simple path passes u once, so u is both its second and its
    second-to-last DC).
    """
    out, into = graph.succ[src], graph.pred[dst]
    if not out or not into:
        return []
    u = next(iter(out)) if len(out) == 1 else None
    w = next(iter(into)) if len(into) == 1 else None
    if u == dst or w == src:
        return [(src, dst)]
    if u is not None and u == w:
        return [(src, u, dst)]
    return None


def all_pairs_paths(topology: Topology, k: int) -> dict[tuple[str, str], list[Path]]:
    """Return {(src, dst): k_shortest_paths(...)} for every ordered DC pair."""
    graph = up_graph(topology)
    return {
        (s, d): k_shortest_paths(topology, s, d, k, graph)
        for s in topology.dcs
        for d in topology.dcs
        if s != d
    }
