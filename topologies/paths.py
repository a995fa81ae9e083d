"""K shortest simple paths per ordered DC pair over the links that are up."""

from __future__ import annotations

from itertools import islice
from typing import TYPE_CHECKING

from topologies.topology import Path, Topology, TopologyError

if TYPE_CHECKING:
    import networkx as nx


def up_graph(topology: Topology) -> nx.DiGraph:
    """Return a DiGraph of the DCs and the directed links that are up."""
    import networkx as nx  # imported on use: a client or an agent never computes paths

    graph = nx.DiGraph()
    graph.add_nodes_from(topology.dcs)
    graph.add_edges_from(topology.up_links())
    return graph


def k_shortest_paths(
    topology: Topology, src: str, dst: str, k: int, graph: nx.DiGraph | None = None
) -> list[Path]:
    """Return up to `k` simple paths from `src` to `dst` over links that are up.

    Paths are ordered by hop count, ties broken by the tuple of DC names, so the
    result is deterministic. The K-th path's hop count is found with Yen's
    algorithm (networkx.shortest_simple_paths); every path of at most that hop
    count is then ranked by (hops, names). A pair whose only path is forced (the
    source's one outgoing link and the destination's one incoming link meet: a
    rack to a rack of CoflowSim's fabric, topologies/bigswitch.py) is answered
    without Yen, with the same result.

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
    return sorted(first, key=lambda p: (len(p), p))[:k]


def _forced_path(graph: nx.DiGraph, src: str, dst: str) -> list[Path] | None:
    """[the only simple path src -> dst] when the graph forces it, else None (unknown).

    Forced: `src` has one outgoing link, to u, and `dst` one incoming link, from w; if
    u == dst (or w == src) the only path is the link src -> dst; if u == w the only path
    is src -> u -> dst (a simple path passes u once, so u is both its second and its
    second-to-last DC).
    """
    out, into = graph.succ[src], graph.pred[dst]
    if len(out) != 1 or len(into) != 1:
        return None
    (u,), (w,) = out, into
    if u == dst:
        return [(src, dst)]
    if u == w:
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
