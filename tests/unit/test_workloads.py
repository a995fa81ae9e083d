"""Workloads: the coflow-benchmark trace and the JSON format, with their errors."""

import json

import pytest

from terra_model import WorkloadError
from topologies import load_topology
from workloads import MB_BYTES, load_fb_trace, load_workload

SWAN = load_topology("swan")


def write(tmp_path, text, name="trace.txt"):
    path = tmp_path / name
    path.write_text(text)
    return path


def test_packaged_fb_trace_totals():
    coflows = load_workload("fb", SWAN)
    assert len(coflows) == 526
    total_mb = sum(f.bytes for c in coflows for f in c.flows) / MB_BYTES
    # docs/design.md section 8: 35.5 million MB in all
    assert total_mb == pytest.approx(35.5e6, rel=0.01)


def test_trace_semantics_split_and_rack_mapping(tmp_path):
    # coflow 7 at 1500 ms: mappers on racks 0 and 6, one reducer on rack 2 receiving 10 MB.
    # 10 MB over 2 mappers = 5 MB per flow; racks map r mod 5: 0->HK, 6->LA, 2->NY.
    path = write(tmp_path, "10 1\n7 1500 2 0 6 1 2:10\n")
    [coflow] = load_fb_trace(path, SWAN.dcs)
    assert coflow.id == "7" and coflow.arrival_s == 1.5
    assert [(f.src, f.dst, f.bytes) for f in coflow.flows] == [
        ("HK", "NY", 5 * MB_BYTES),
        ("LA", "NY", 5 * MB_BYTES),
    ]


def test_trace_minimum_flow_is_one_mb(tmp_path):
    # 1 MB over 4 mappers would be 0.25 MB per flow; CoflowSim makes no flow smaller than 1 MB
    path = write(tmp_path, "10 1\n1 0 4 0 1 2 3 1 4:1\n")
    [coflow] = load_fb_trace(path, SWAN.dcs)
    assert {f.bytes for f in coflow.flows} == {MB_BYTES}


def test_intra_dc_flows_kept_but_not_wan(tmp_path):
    # racks 0 and 5 are both HK (r mod 5)
    path = write(tmp_path, "10 1\n1 0 1 0 1 5:2\n")
    [coflow] = load_fb_trace(path, SWAN.dcs)
    assert coflow.flows[0].intra_dc and coflow.wan_bytes == 0


@pytest.mark.parametrize(
    ("text", "where"),
    [
        ("10 1\n1 0 2 0 1 2:3\n", "trace.txt:2"),  # 2 mappers announced, 1 given
        ("10 1\n1 0 1 0 1 2:x\n", "trace.txt:2"),  # non-numeric size
        ("10 1\n1 0 1 0 1 2:-4\n", "trace.txt:2"),  # negative size
        ("10 1\n1 0 1 0 1 2:0\n", "trace.txt:2"),  # zero size
        ("10 1\n1 0 1 99 1 2:3\n", "trace.txt:2"),  # rack outside 0..9
        ("10 1\n1 0 1 0 1 2:3\nbroken\n", "trace.txt:3"),
        ("ten 1\n", "trace.txt:1"),
        ("10 1\n", "no coflows"),
        ("", "empty trace"),
    ],
)
def test_malformed_trace_names_file_and_line(tmp_path, text, where):
    path = write(tmp_path, text)
    with pytest.raises(WorkloadError, match=where):
        load_fb_trace(path, SWAN.dcs)


def json_workload(tmp_path, coflows):
    return write(tmp_path, json.dumps({"coflows": coflows}), "w.json")


def test_json_workload_roundtrip(tmp_path):
    path = json_workload(
        tmp_path,
        [
            {
                "id": "b",
                "arrival_s": 2,
                "flows": [{"id": "f", "src": "HK", "dst": "BA", "bytes": 5}],
            },
            {
                "id": "a",
                "arrival_s": 1,
                "deadline_s": 3,
                "flows": [
                    {"id": "f1", "src": "HK", "dst": "LA", "bytes": 2e9},
                    {"id": "f2", "src": "HK", "dst": "LA", "bytes": 1e9},
                ],
            },
        ],
    )
    coflows = load_workload(str(path), SWAN)
    assert [c.id for c in coflows] == ["a", "b"]  # sorted by arrival
    assert coflows[0].deadline_s == 3.0
    assert coflows[0].flowgroups() == {("HK", "LA"): 3e9}


@pytest.mark.parametrize(
    ("coflows", "field"),
    [
        ([], "no coflows"),
        ([{"id": "a", "flows": []}], r"coflows\[0\].flows"),
        ([{"id": "a", "flows": [{"id": "f", "src": "HK", "dst": "XX", "bytes": 1}]}], "dst"),
        ([{"id": "a", "flows": [{"id": "f", "src": "HK", "dst": "LA", "bytes": -1}]}], "bytes"),
        ([{"id": "a", "flows": [{"id": "f", "src": "HK", "dst": "LA", "bytes": "1"}]}], "bytes"),
        ([{"id": "a", "arrival_s": -1, "flows": []}], "arrival_s"),
        (
            [
                {
                    "id": "a",
                    "deadline_s": 0,
                    "flows": [{"id": "f", "src": "HK", "dst": "LA", "bytes": 1}],
                }
            ],
            "deadline_s",
        ),
        (
            [
                {
                    "id": "a",
                    "flows": [
                        {"id": "f", "src": "HK", "dst": "LA", "bytes": 1},
                        {"id": "f", "src": "HK", "dst": "NY", "bytes": 1},
                    ],
                }
            ],
            "duplicate flow ids",
        ),
    ],
)
def test_json_workload_errors_name_field(tmp_path, coflows, field):
    path = json_workload(tmp_path, coflows)
    with pytest.raises(WorkloadError, match=field):
        load_workload(str(path), SWAN)


def test_fb_racks_map_one_to_one_onto_bigswitch(tmp_path):
    # On a topology with a node per rack, rack r is node "r" (not r mod N): on SWAN's 5 DCs
    # rack 7 would be DC 7 mod 5 = 2; on bigswitch it is node "7". Racks 3 -> 3 stay
    # inside one node (intra-DC, not WAN).
    from topologies import load_topology
    from topologies.bigswitch import bigswitch_topology
    from workloads import load_workload

    trace = tmp_path / "t.txt"
    trace.write_text("150 1\n1 0 2 7 3 1 3:2\n")
    topo = load_topology("bigswitch")
    flows = load_workload(str(trace), topo)[0].flows
    assert [(f.src, f.dst) for f in flows] == [("7", "3"), ("3", "3")]
    assert [f.bytes for f in flows] == [1_048_576, 1_048_576]  # 2 MB over 2 mappers
    fb = load_workload("fb", topo)
    assert len(fb) == 526
    assert {f.src for c in fb for f in c.flows} <= set(topo.attrs["rack_dcs"])
    with pytest.raises(WorkloadError, match=r"t.txt:2: rack 7: the topology has racks 0..3"):
        load_workload(str(trace), bigswitch_topology(4))
    wrong = bigswitch_topology(4)
    wrong.attrs["rack_dcs"] = ["0", "1", "X"]
    with pytest.raises(WorkloadError, match="'rack_dcs' must list DCs of it"):
        load_workload(str(trace), wrong)


FLOW = {"id": "f", "src": "HK", "dst": "LA", "bytes": 5}


@pytest.mark.parametrize(
    ("coflows", "message"),
    [
        (
            [{"id": "a", "flows": [FLOW, {**FLOW, "id": "g", "bytes": "5"}]}],
            "coflows[0].flows[1].bytes: must be a number, got str",
        ),
        (
            [{"id": "a", "flows": [FLOW]}, {"id": "b", "flows": [{**FLOW, "bytes": -5}]}],
            "coflows[1].flows[0].bytes: must be a number > 0, got -5",
        ),
        (
            [{"id": "a", "flows": [{"id": "f", "src": "HK", "dst": "LA"}]}],
            "coflows[0].flows[0].bytes: required field missing",
        ),
        ([{"flows": [FLOW]}], "coflows[0].id: required field missing"),
        (
            [{"id": True, "flows": [FLOW]}],
            "coflows[0].id: must be an integer or a string, got bool",
        ),
        (
            [{"id": "a", "flows": [{**FLOW, "bytes": float("nan")}]}],
            "coflows[0].flows[0].bytes: must be a number > 0, got nan",
        ),
        (
            [{"id": "a", "deadline_s": float("inf"), "flows": [FLOW]}],
            "coflows[0].deadline_s: must be a finite number, got inf",
        ),
        ([{"id": "a", "flows": FLOW}], "coflows[0].flows: must be a list, got object"),
        ([3], "coflows[0]: must be an object, got int"),
    ],
)
def test_json_workload_errors_say_the_field_and_what_it_must_be(tmp_path, coflows, message):
    path = json_workload(tmp_path, coflows)
    with pytest.raises(WorkloadError) as err:
        load_workload(str(path), SWAN)
    assert str(err.value) == f"{path}: {message}"


def test_json_workload_top_level_errors_name_the_file(tmp_path):
    cases = [
        ("[]", "must be an object, got array"),
        ("{}", "coflows: required field missing"),
        ('{"coflows": 3}', "coflows: must be a list, got int"),
    ]
    for text, message in cases:
        path = write(tmp_path, text, "w.json")
        with pytest.raises(WorkloadError) as err:
            load_workload(str(path), SWAN)
        assert str(err.value) == f"{path}: {message}"


def test_json_workload_integer_ids_and_extra_keys(tmp_path):
    """Integer ids become strings, numbers become floats, keys the format does not name are
    ignored."""
    path = json_workload(
        tmp_path, [{"id": 7, "arrival_s": 2, "note": "x", "flows": [{**FLOW, "id": 1, "tag": 3}]}]
    )
    [coflow] = load_workload(str(path), SWAN)
    assert (coflow.id, coflow.arrival_s, coflow.flows[0].id) == ("7", 2.0, "1")
    assert coflow.flows[0].bytes == 5.0 and isinstance(coflow.flows[0].bytes, float)


def test_parse_coflow_names_the_given_place():
    from workloads import parse_coflow, parse_flow

    with pytest.raises(WorkloadError, match=r"^x.json: coflows\[4\].flows: required field"):
        parse_coflow({"id": "a"}, SWAN.dcs, "x.json: coflows[4]")
    with pytest.raises(WorkloadError, match=r"^x.json: f\[1\].dst: unknown DC 'XX'"):
        parse_flow({**FLOW, "dst": "XX"}, SWAN.dcs, "x.json: f[1]")
    assert parse_flow(FLOW, SWAN.dcs, "x").bytes == 5.0
