"""Topology Zoo GraphML: link speeds, repairs (self-loops, repeated labels, parallel edges,
edges without a speed) and equal-cost paths chosen independently of the node labels."""

import json
import logging

import pytest

from topologies import (
    GBPS_TO_BYTES_PER_S,
    TopologyError,
    all_pairs_paths,
    k_shortest_paths,
    load_topology,
)
from topologies.graphml import edge_bytes_per_s
from topologies.loaders import load_graphml_topology

KEYS = """\
  <key attr.name="label" attr.type="string" for="node" id="d0"/>
  <key attr.name="LinkSpeedRaw" attr.type="double" for="edge" id="d1"/>
  <key attr.name="LinkSpeed" attr.type="string" for="edge" id="d2"/>
  <key attr.name="LinkSpeedUnits" attr.type="string" for="edge" id="d3"/>
"""


def graphml(nodes: list[tuple[str, str | None]], edges: list[tuple[str, str, str]]) -> str:
    """A GraphML document: nodes (id, label or None), edges (source, target, data XML)."""
    lines = ['<?xml version="1.0" encoding="UTF-8"?>']
    lines.append('<graphml xmlns="http://graphml.graphdrawing.org/xmlns">')
    lines.append(KEYS + '  <graph edgedefault="undirected">')
    for node, label in nodes:
        data = f'<data key="d0">{label}</data>' if label is not None else ""
        lines.append(f'    <node id="{node}">{data}</node>')
    for u, v, data in edges:
        lines.append(f'    <edge source="{u}" target="{v}">{data}</edge>')
    lines.append("  </graph>\n</graphml>")
    return "\n".join(lines)


def raw(bits: float) -> str:
    return f'<data key="d1">{bits}</data>'


def speed(value: str, units: str) -> str:
    return f'<data key="d2">{value}</data><data key="d3">{units}</data>'


def test_speeds_self_loop_repeated_labels_parallel_edges(tmp_path, caplog):
    path = tmp_path / "zoo.graphml"
    nodes = [("n0", "Paris"), ("n1", "Lyon"), ("n2", "Paris"), ("n3", None)]
    edges = [
        ("n0", "n1", raw(10e9)),  # 10 Gbps = 1.25e9 bytes/s
        ("n1", "n0", raw(2.5e9)),  # parallel (other direction): 2.5 Gbps more
        ("n1", "n2", speed("622", "M")),  # 622 Mbps = 7.775e7 bytes/s
        ("n2", "n2", raw(1e9)),  # self-loop: dropped
        ("n2", "n3", ""),  # no speed: the default, 1 Gbps = 1.25e8 bytes/s
        ("n3", "n0", speed("", "G")),  # units without a speed: no speed, the default too
    ]
    path.write_text(graphml(nodes, edges))
    with caplog.at_level(logging.WARNING, logger="topologies.graphml"):
        topo = load_topology(str(path))
    # the second "Paris" (node n2) is renamed with its id; n3 has no label: its id
    assert topo.dcs == ["Paris", "Lyon", "Paris-n2", "n3"]
    assert topo.capacity[("Paris", "Lyon")] == topo.capacity[("Lyon", "Paris")] == 1.5625e9
    assert topo.capacity[("Lyon", "Paris-n2")] == 7.775e7
    assert topo.capacity[("Paris-n2", "n3")] == topo.capacity[("n3", "Paris")] == 1.25e8
    assert len(topo.capacity) == 8  # four undirected links, no self-loop
    assert topo.attrs["parallel_links"] == [["Paris", "Lyon", 2]]
    assert topo.attrs["load_warnings"] == {
        "renamed_labels": 1,
        "parallel_edges": 1,
        "self_loops": 1,
        "edges_without_capacity": 2,
    }
    warned = [r.getMessage() for r in caplog.records]
    assert len(warned) == 4  # one line per kind
    text = "\n".join(warned)
    assert "1 repeated label(s) renamed: Paris (n2) -> Paris-n2" in text
    assert "1 self-loop(s) dropped: Paris-n2" in text
    assert "Paris-Lyon (2 edges, 12.5 Gbps in the file)" in text
    assert "2 of 5 edges without a link speed" in text
    assert "Paris-n2-n3" in text and "Paris-n3" in text
    # --link-gbps overrides every link; the parallel pair keeps two links' worth
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="topologies.graphml"):
        flat = load_topology(str(path), link_gbps=1)
    assert flat.capacity[("Paris", "Lyon")] == 2.5e8
    assert flat.capacity[("Lyon", "Paris-n2")] == 1.25e8
    # edges without a speed do not matter then: not logged, still counted
    assert not any("without a link speed" in r.getMessage() for r in caplog.records)
    assert flat.attrs["load_warnings"]["edges_without_capacity"] == 2


@pytest.mark.parametrize(
    ("data", "bytes_per_s"),
    [
        ({"LinkSpeedRaw": 1e10}, 1.25e9),
        ({"LinkSpeedRaw": 1e10, "LinkSpeed": "1", "LinkSpeedUnits": "M"}, 1.25e9),
        ({"LinkSpeed": "2.5", "LinkSpeedUnits": "G"}, 3.125e8),
        ({"LinkSpeed": 45, "LinkSpeedUnits": "m"}, 5.625e6),
        ({"LinkSpeed": "64", "LinkSpeedUnits": "Kbps"}, 8e3),
        ({"LinkSpeed": "1", "LinkSpeedUnits": "T"}, 1.25e11),
        ({"LinkSpeedUnits": "G"}, None),  # units alone give no speed
        ({"LinkSpeedRaw": "", "LinkSpeed": " "}, None),  # empty values: not given
        ({}, None),
    ],
)
def test_edge_speed(data, bytes_per_s):
    assert edge_bytes_per_s(data) == bytes_per_s


def ladder(labels: list[str]) -> str:
    """A 2 x 4 ladder (many equal-hop paths): nodes 0..3 on top, 4..7 below, rungs i-(i+4),
    1 Gbps everywhere (no speeds)."""
    nodes = [(f"v{i}", labels[i]) for i in range(8)]
    rails = [(i, i + 1) for i in (0, 1, 2, 4, 5, 6)]
    rungs = [(i, i + 4) for i in range(4)]
    return graphml(nodes, [(f"v{a}", f"v{b}", "") for a, b in rails + rungs])


def test_equal_cost_paths_do_not_depend_on_labels(tmp_path):
    first = list("ABCDEFGH")
    other = ["zeta", "eta", "mu", "alpha", "omega", "beta", "pi", "chi"]  # another order
    one, two = tmp_path / "one.graphml", tmp_path / "two.graphml"
    one.write_text(ladder(first))
    two.write_text(ladder(other))
    rename = dict(zip(first, other, strict=True))

    def relabelled(paths):
        return {(rename[s], rename[d]): [tuple(rename[x] for x in p) for p in ps]
                for (s, d), ps in paths.items()}  # fmt: skip

    for k in (1, 2, 3):
        a = all_pairs_paths(load_graphml_topology(one), k)
        b = all_pairs_paths(load_graphml_topology(two), k)
        assert relabelled(a) == b
    # ranked by DC name instead, the relabelling changes the chosen paths
    by_name = [load_graphml_topology(f, dc_order_ties=False) for f in (one, two)]
    assert relabelled(all_pairs_paths(by_name[0], 1)) != all_pairs_paths(by_name[1], 1)


def test_equal_hop_paths_prefer_capacity_then_file_order(tmp_path):
    # a square s-a-t, s-b-t: two 2-hop paths; b's links are faster, so s-b-t comes first
    # although a comes before b in the file; with equal speeds, file order (a) decides.
    nodes = [("s", "S"), ("a", "Zed"), ("b", "Alpha"), ("t", "T")]
    fast = [("s", "a", raw(1e9)), ("a", "t", raw(1e9)), ("s", "b", raw(4e9)), ("t", "b", raw(4e9))]
    path = tmp_path / "sq.graphml"
    path.write_text(graphml(nodes, fast))
    assert k_shortest_paths(load_topology(str(path)), "S", "T", 2) == [
        ("S", "Alpha", "T"),
        ("S", "Zed", "T"),
    ]
    path.write_text(graphml(nodes, [(u, v, raw(1e9)) for u, v, _ in fast]))
    assert k_shortest_paths(load_topology(str(path)), "S", "T", 1) == [("S", "Zed", "T")]


def test_builtin_att_keeps_name_ordered_ties():
    att = load_topology("att", link_gbps=1)
    assert "path_tie_break" not in att.attrs
    assert att.attrs["load_warnings"] == {"edges_without_capacity": 57, "parallel_edges": 1}
    assert att.capacity[("LA03", "PHNX")] == 2 * GBPS_TO_BYTES_PER_S


def test_json_may_ask_for_file_order_ties(tmp_path):
    # S-Zed-T and S-Alpha-T tie (2 hops, 1 Gbps): by name Alpha first, by "dcs" order Zed
    links = [["S", "Zed"], ["Zed", "T"], ["S", "Alpha"], ["Alpha", "T"]]
    doc = {"dcs": ["S", "Zed", "Alpha", "T"], "links": [{"a": a, "b": b} for a, b in links]}
    path = tmp_path / "t.json"
    path.write_text(json.dumps(doc))
    assert k_shortest_paths(load_topology(str(path)), "S", "T", 1) == [("S", "Alpha", "T")]
    path.write_text(json.dumps({**doc, "path_tie_break": "dc_order"}))
    assert k_shortest_paths(load_topology(str(path)), "S", "T", 1) == [("S", "Zed", "T")]
    path.write_text(json.dumps({**doc, "path_tie_break": "random"}))
    with pytest.raises(TopologyError, match="path_tie_break: must be one of name, dc_order"):
        load_topology(str(path))
