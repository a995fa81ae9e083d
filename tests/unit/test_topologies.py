"""Topologies: built-ins, JSON and GraphML loaders, K shortest paths, bad input."""

import json
import logging

import pytest

from topologies import (
    GBPS_TO_BYTES_PER_S,
    TopologyError,
    all_pairs_paths,
    k_shortest_paths,
    load_topology,
    path_links,
)


@pytest.mark.parametrize(
    ("name", "dcs", "undirected_links"), [("swan", 5, 7), ("gscale", 12, 19), ("att", 25, 56)]
)
def test_builtin_sizes(name, dcs, undirected_links):
    topo = load_topology(name)
    assert len(topo.dcs) == dcs
    # every undirected link is two directed links
    assert len(topo.links) == 2 * undirected_links


def test_swan_dc_order_and_capacity():
    topo = load_topology("swan", link_gbps=10)
    assert topo.dcs == ["HK", "LA", "NY", "FL", "BA"]
    # 10 Gbps = 10e9 bit/s / 8 = 1.25e9 bytes/s
    assert topo.capacity[("HK", "LA")] == pytest.approx(1.25e9)
    assert topo.capacity[("LA", "HK")] == pytest.approx(1.25e9)


def test_swan_has_4_to_7_paths_per_pair():
    topo = load_topology("swan")
    for (src, dst), paths in all_pairs_paths(topo, 100).items():
        assert 4 <= len(paths) <= 7, (src, dst, paths)


def test_paths_ordered_by_hops_then_name():
    topo = load_topology("swan")
    paths = k_shortest_paths(topo, "HK", "BA", 3)
    # HK-NY-BA is the only 2-hop path; among the 3-hop ones LA-FL sorts before LA-NY
    assert paths == [("HK", "NY", "BA"), ("HK", "LA", "FL", "BA"), ("HK", "LA", "NY", "BA")]


def test_paths_avoid_down_links():
    topo = load_topology("swan")
    topo.set_link_state("LA", "NY", up=False)
    for paths in all_pairs_paths(topo, 10).values():
        for path in paths:
            assert ("LA", "NY") not in path_links(path)
            assert ("NY", "LA") not in path_links(path)
    topo.set_link_state("LA", "NY", up=True)
    assert ("HK", "LA", "NY") in k_shortest_paths(topo, "HK", "NY", 10)


def test_no_path_when_cut_off():
    topo = load_topology("swan")
    topo.set_link_state("HK", "LA", up=False)
    topo.set_link_state("HK", "NY", up=False)
    assert k_shortest_paths(topo, "HK", "BA", 4) == []


def test_json_loader_per_link_capacity_and_default(tmp_path):
    path = tmp_path / "t.json"
    path.write_text(
        json.dumps(
            {
                "name": "tri",
                "default_capacity_gbps": 2,
                "links": [{"a": "A", "b": "B"}, {"a": "B", "b": "C", "capacity_gbps": 0.5}],
            }
        )
    )
    topo = load_topology(str(path))
    assert topo.name == "tri" and topo.dcs == ["A", "B", "C"]
    assert topo.capacity[("A", "B")] == 2 * GBPS_TO_BYTES_PER_S
    assert topo.capacity[("C", "B")] == 0.5 * GBPS_TO_BYTES_PER_S


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        ({"links": []}, "'links' must be a non-empty list"),
        ({"links": [{"a": "A", "b": "A"}]}, "links[0]: a link must join two different DCs"),
        ({"links": [{"a": "A", "b": "B", "capacity_gbps": 0}]}, "links[0].capacity_gbps"),
        ({"links": [{"a": "A", "b": "B", "capacity_gbps": "x"}]}, "must be a number"),
        ({"links": [{"a": "A", "b": "B"}, {"a": "A", "b": "B"}]}, "links[1]: duplicate link"),
        ({"dcs": ["A"], "links": [{"a": "A", "b": "Z"}]}, "unknown DC 'Z'"),
    ],
)
def test_json_loader_errors_name_file_and_field(tmp_path, doc, message):
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(TopologyError) as err:
        load_topology(str(path))
    assert str(path) in str(err.value) and message in str(err.value)


def test_json_syntax_error_names_line(tmp_path):
    path = tmp_path / "bad.json"
    path.write_text('{"links": [\n  {"a": "A", "b": }\n]}')
    with pytest.raises(TopologyError, match="line 2"):
        load_topology(str(path))


def test_graphml_sums_parallel_edges_and_warns(tmp_path, caplog):
    path = tmp_path / "z.graphml"
    path.write_text(
        """<?xml version="1.0" encoding="UTF-8"?>
<graphml xmlns="http://graphml.graphdrawing.org/xmlns">
  <key attr.name="label" attr.type="string" for="node" id="d0"/>
  <graph edgedefault="undirected">
    <node id="0"><data key="d0">X</data></node>
    <node id="1"><data key="d0">Y</data></node>
    <node id="2"/>
    <edge source="0" target="1"/><edge source="1" target="0"/><edge source="0" target="1"/>
    <edge source="1" target="2"/>
  </graph>
</graphml>"""
    )
    with caplog.at_level(logging.WARNING, logger="topologies.loaders"):
        topo = load_topology(str(path))
    # node 2 has no label: its id is the DC name. X-Y three times is one undirected link
    # of 3 x 1 Gbps = 3 x 1.25e8 = 3.75e8 bytes/s each way; Y-2 once is 1.25e8.
    assert topo.dcs == ["X", "Y", "2"]
    assert len(topo.links) == 4
    assert topo.capacity[("X", "Y")] == topo.capacity[("Y", "X")] == 3.75e8
    assert topo.capacity[("Y", "2")] == 1.25e8
    assert topo.attrs["parallel_links"] == [["X", "Y", 3]]
    warned = [r.getMessage() for r in caplog.records]
    assert len(warned) == 2 and "2 parallel edge(s) merged" in warned[1]
    assert "X-Y (3 edges, 3 Gbps in the file)" in warned[1]
    assert "4 of 4 edges without a link speed" in warned[0]
    assert topo.attrs["load_warnings"] == {"edges_without_capacity": 4, "parallel_edges": 2}
    # --link-gbps 2 keeps the sum: 3 x 2 Gbps = 7.5e8 bytes/s, the single link 2.5e8
    wide = load_topology(str(path), link_gbps=2.0)
    assert wide.capacity[("Y", "X")] == 7.5e8
    assert wide.capacity[("2", "Y")] == 2.5e8


def test_att_keeps_its_parallel_link():
    # AttMpls.graphml has two edges LA03-PHNX (e16, e17): 2 x 1 Gbps = 2.5e8 bytes/s each way
    topo = load_topology("att", link_gbps=1.0)
    assert topo.capacity[("LA03", "PHNX")] == topo.capacity[("PHNX", "LA03")] == 2.5e8
    assert sum(1 for c in topo.capacity.values() if c == 2.5e8) == 2


def test_unknown_topology_and_format(tmp_path):
    with pytest.raises(TopologyError, match="no such topology"):
        load_topology("nowhere")
    other = tmp_path / "t.txt"
    other.write_text("x")
    with pytest.raises(TopologyError, match="unknown topology format"):
        load_topology(str(other))


def test_capacity_and_link_errors():
    topo = load_topology("swan")
    with pytest.raises(TopologyError, match="positive"):
        topo.set_capacity("HK", "LA", -1)
    with pytest.raises(TopologyError, match="no link HK-BA"):
        topo.set_link_state("HK", "BA", up=False)
    with pytest.raises(TopologyError, match="unknown DC 'XX'"):
        k_shortest_paths(topo, "HK", "XX", 2)


def test_bigswitch_is_coflowsims_fabric():
    # 150 racks + core; each rack has an uplink and a downlink of 1 MiB per 8 ms epoch:
    # 1,048,576 B / 0.008 s = 131,072,000 B/s = 1.048576 Gbit/s.
    from topologies.bigswitch import COFLOWSIM_PORT_GBPS, bigswitch_topology

    topo = load_topology("bigswitch")
    assert topo.name == "bigswitch"
    assert topo.dcs == [*map(str, range(150)), "core"]
    assert topo.attrs["rack_dcs"] == [str(r) for r in range(150)]
    assert sorted(topo.capacity) == sorted(
        [(str(r), "core") for r in range(150)] + [("core", str(r)) for r in range(150)]
    )
    assert set(topo.capacity.values()) == {131_072_000.0}
    assert COFLOWSIM_PORT_GBPS == pytest.approx(1.048576)
    assert load_topology("bigswitch", link_gbps=1).capacity[("0", "core")] == 1.25e8
    small = bigswitch_topology(3)
    assert small.dcs == ["0", "1", "2", "core"] and len(small.capacity) == 6
    with pytest.raises(TopologyError, match="at least 2 racks"):
        bigswitch_topology(1)


def test_bigswitch_paths_through_the_core_are_unique():
    # Every rack pair has exactly one simple path, r -> core -> s, whatever K.
    from topologies import k_shortest_paths
    from topologies.bigswitch import bigswitch_topology

    topo = bigswitch_topology(4)
    assert k_shortest_paths(topo, "0", "3", 4) == [("0", "core", "3")]


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        (  # a wrong type, in the fourth link
            {
                "links": [
                    {"a": "A", "b": "B"},
                    {"a": "B", "b": "C"},
                    {"a": "C", "b": "D"},
                    {"a": "D", "b": "A", "capacity_gbps": "10"},
                ]
            },
            "links[3].capacity_gbps: must be a number, got str",
        ),
        ({"links": [{"a": "A"}]}, "links[0].b: required field missing"),
        ({"name": "x"}, "links: required field missing"),
        (
            {"links": [{"a": "A", "b": "B", "capacity_gbps": -2}]},
            "links[0].capacity_gbps: must be a number > 0, got -2",
        ),
        (
            {"links": [{"a": "A", "b": "B", "capacity_gbps": float("inf")}]},
            "links[0].capacity_gbps: must be a finite number, got inf",
        ),
        (
            {"links": [{"a": "A", "b": "B", "capacity_gbps": True}]},
            "links[0].capacity_gbps: must be a number, got bool",
        ),
        ({"links": [{"a": "A", "b": ""}]}, "links[0].b: must be a non-empty string, got ''"),
        ({"links": [{"a": "A", "b": "B"}], "dcs": ["A", 7]}, "dcs[1]: must be a string, got int"),
        (
            {"links": [{"a": "A", "b": "B"}], "default_capacity_gbps": 0},
            "default_capacity_gbps: must be a number > 0, got 0",
        ),
        ({"links": "A-B"}, "links: must be a list, got str"),
        ([{"a": "A", "b": "B"}], "must be an object, got array"),  # the document itself
    ],
)
def test_json_loader_errors_name_the_field_and_what_it_must_be(tmp_path, doc, message):
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(TopologyError) as err:
        load_topology(str(path))
    assert str(err.value) == f"{path}: {message}"


def test_json_loader_keeps_unknown_top_level_keys_and_ignores_a_links_extra_keys(tmp_path):
    path = tmp_path / "t.json"
    doc = {"name": 7, "positions": {"A": [1, 2]}, "links": [{"a": "A", "b": "B", "note": "x"}]}
    path.write_text(json.dumps(doc))
    topo = load_topology(str(path))
    assert topo.name == "7" and topo.attrs == {"positions": {"A": [1, 2]}}
    assert topo.capacity[("A", "B")] == GBPS_TO_BYTES_PER_S  # the default 1 Gbps


def test_link_gbps_must_be_a_positive_number():
    with pytest.raises(TopologyError, match=r"swan.json: link_gbps: must be a number > 0, got -1"):
        load_topology("swan", link_gbps=-1)
    with pytest.raises(TopologyError, match="bigswitch: link_gbps: must be a finite number"):
        load_topology("bigswitch", link_gbps=float("inf"))
