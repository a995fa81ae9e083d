"""GraphML input: a link speed given but unusable is an error naming the edge (ignored,
and logged, under --link-gbps), labels such as 0 name their DC, a disconnected topology is
loaded with one warning line, and a missing topology file cannot be read."""

import logging

import pytest

from terra_sim.cli import main
from topologies import TopologyError, load_topology
from topologies.graphml import edge_bytes_per_s

KEYS = """\
  <key attr.name="label" attr.type="{label_type}" for="node" id="d0"/>
  <key attr.name="LinkSpeedRaw" attr.type="double" for="edge" id="d1"/>
  <key attr.name="LinkSpeed" attr.type="string" for="edge" id="d2"/>
  <key attr.name="LinkSpeedUnits" attr.type="string" for="edge" id="d3"/>
"""


def graphml(nodes, edges, label_type="string"):
    """A GraphML document: nodes (id, label or None), edges (source, target, data XML)."""
    lines = ['<?xml version="1.0" encoding="UTF-8"?>']
    lines.append('<graphml xmlns="http://graphml.graphdrawing.org/xmlns">')
    lines.append(KEYS.format(label_type=label_type) + '  <graph edgedefault="undirected">')
    for node, label in nodes:
        data = f'<data key="d0">{label}</data>' if label is not None else ""
        lines.append(f'    <node id="{node}">{data}</node>')
    for u, v, data in edges:
        lines.append(f'    <edge source="{u}" target="{v}">{data}</edge>')
    lines.append("  </graph>\n</graphml>")
    return "\n".join(lines)


ABC = [("0", "A"), ("1", "B"), ("2", "C")]
GOOD = '<data key="d1">1e9</data>'
BAD_SPEEDS = [
    ('<data key="d1">0</data>', "LinkSpeedRaw: must be a finite number > 0, got 0"),
    ('<data key="d1">-1e9</data>', "LinkSpeedRaw: must be a finite number > 0, got -1e\\+09"),
    ('<data key="d1">NaN</data>', "LinkSpeedRaw: must be a finite number > 0, got nan"),
    ('<data key="d1">INF</data>', "LinkSpeedRaw: must be a finite number > 0, got inf"),
    ('<data key="d2">abc</data><data key="d3">G</data>', "LinkSpeed: must be a finite number"),
    ('<data key="d2">-2</data><data key="d3">G</data>', "LinkSpeed: must be a finite number"),
    ('<data key="d2">10</data><data key="d3">X</data>', "LinkSpeedUnits: must be one of K, M"),
    ('<data key="d2">45</data>', "LinkSpeedUnits: must be one of K, M, G, T, got none"),
]


@pytest.mark.parametrize(
    "data",
    [
        {"LinkSpeedRaw": 0},
        {"LinkSpeedRaw": -1.0},
        {"LinkSpeedRaw": float("nan")},
        {"LinkSpeedRaw": float("inf")},
        {"LinkSpeedRaw": True},
        {"LinkSpeed": "x", "LinkSpeedUnits": "G"},
        {"LinkSpeed": "10", "LinkSpeedUnits": "Q"},
        {"LinkSpeed": "45"},
        {"LinkSpeed": 1e300, "LinkSpeedUnits": "T"},
    ],
)
def test_edge_speed_given_but_unusable(data):
    with pytest.raises(ValueError, match="must be"):
        edge_bytes_per_s(data)


@pytest.mark.parametrize(("speed", "message"), BAD_SPEEDS)
def test_invalid_link_speed_is_an_error_naming_the_edge(tmp_path, speed, message):
    path = tmp_path / "zoo.graphml"
    path.write_text(graphml(ABC, [("0", "1", GOOD), ("1", "2", speed)]))
    with pytest.raises(TopologyError, match=f"zoo.graphml: edge B-C \\(nodes 1-2\\): {message}"):
        load_topology(str(path))


def test_link_gbps_ignores_invalid_speeds_with_one_warning(tmp_path, caplog):
    path = tmp_path / "zoo.graphml"
    bad = '<data key="d1">-5</data>'
    path.write_text(graphml(ABC, [("0", "1", GOOD), ("1", "2", bad), ("0", "2", "")]))
    with caplog.at_level(logging.WARNING, logger="topologies.graphml"):
        topo = load_topology(str(path), link_gbps=2)
    assert topo.capacity[("B", "C")] == topo.capacity[("A", "B")] == 2.5e8
    assert topo.attrs["load_warnings"] == {"invalid_link_speeds": 1, "edges_without_capacity": 1}
    [line] = [r.getMessage() for r in caplog.records]
    assert "1 edge(s) with an invalid link speed, ignored" in line and "B-C (LinkSpeedRaw" in line


def test_edges_without_a_speed_keep_the_default_and_warning(tmp_path, caplog):
    path = tmp_path / "zoo.graphml"
    path.write_text(graphml(ABC, [("0", "1", GOOD), ("1", "2", '<data key="d3">G</data>')]))
    with caplog.at_level(logging.WARNING, logger="topologies.graphml"):
        topo = load_topology(str(path))
    assert topo.capacity[("B", "C")] == 1.25e8  # 1 Gbps
    assert "1 of 2 edges without a link speed" in caplog.text


def test_terra_sim_exits_2_on_an_invalid_speed(tmp_path, capsys):
    path = tmp_path / "zoo.graphml"
    path.write_text(graphml(ABC, [("0", "1", GOOD), ("1", "2", '<data key="d1">-1</data>')]))
    assert main(["--topology", str(path), "--workload", "fb", "--scheduler", "varys"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        f"terra-sim: error: {path}: edge B-C (nodes 1-2): LinkSpeedRaw: must be a finite "
        "number > 0, got -1"
    ]


def test_integer_label_zero_names_its_dc(tmp_path):
    path = tmp_path / "ints.graphml"
    nodes = [("n0", "0"), ("n1", "1"), ("n2", None), ("n3", "")]
    edges = [("n0", "n1", GOOD), ("n1", "n2", GOOD), ("n2", "n3", GOOD)]
    path.write_text(graphml(nodes, edges, label_type="int"))
    assert load_topology(str(path)).dcs == ["0", "1", "n2", "n3"]
    path.write_text(graphml(nodes, edges, label_type="string"))
    assert load_topology(str(path)).dcs == ["0", "1", "n2", "n3"]


def test_disconnected_topology_loads_with_one_warning(tmp_path, caplog):
    path = tmp_path / "two.graphml"
    nodes = [*ABC, ("3", "D"), ("4", "E")]
    path.write_text(graphml(nodes, [("0", "1", GOOD), ("2", "3", GOOD), ("3", "3", GOOD)]))
    with caplog.at_level(logging.WARNING, logger="topologies.graphml"):
        topo = load_topology(str(path))
    assert topo.dcs == ["A", "B", "C", "D", "E"]
    assert topo.attrs["load_warnings"] == {"self_loops": 1, "components": 3}
    lines = [r.getMessage() for r in caplog.records if "components" in r.getMessage()]
    assert lines == [
        f"{path}: 3 connected components: the topology is not connected (a coflow between "
        "two of them has no path): {A, B} (2 DCs), {C, D} (2 DCs), {E} (1 DC)"
    ]
    caplog.clear()
    path.write_text(graphml(ABC, [("0", "1", GOOD), ("1", "2", GOOD)]))
    with caplog.at_level(logging.WARNING, logger="topologies.graphml"):
        assert "load_warnings" not in load_topology(str(path)).attrs
    assert not caplog.records


@pytest.mark.parametrize("name", ["none.graphml", "none.json", "none.xml", "sub/none", "."])
def test_missing_topology_file_cannot_be_read(tmp_path, capsys, name):
    spec = str(tmp_path / name)
    with pytest.raises(TopologyError, match="cannot read") as caught:
        load_topology(spec)
    assert isinstance(caught.value.__cause__, OSError)
    assert main(["--topology", spec, "--workload", "fb", "--scheduler", "varys"]) == 1
    [line] = capsys.readouterr().err.strip().splitlines()
    assert line.startswith(f"terra-sim: error: {spec}: cannot read: [Errno")


def test_unknown_topology_name_and_missing_workload(tmp_path, capsys):
    assert main(["--topology", "nowhere", "--workload", "fb", "--scheduler", "varys"]) == 2
    assert "nowhere: no such topology" in capsys.readouterr().err
    missing = str(tmp_path / "none.txt")
    assert main(["--topology", "swan", "--workload", missing, "--scheduler", "varys"]) == 1
    assert f"{missing}: cannot read" in capsys.readouterr().err
