"""The SWAN testbed without switches: workload shaping, results and the TCP baseline node
(tests/system/test_testbed_runs.py runs it end to end with Open vSwitch and Mininet)."""

from __future__ import annotations

import argparse
import json
import math
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from benchmarks.harness import free_port
from mininet_scenarios import cli, results, swan
from mininet_scenarios import workload as tb_workload
from mininet_scenarios.cli import parse_schedulers
from mininet_scenarios.run_result import RunResult, busy_time, expected_digest, verified_by_agents
from mininet_scenarios.tcp_baseline import send_flow, serve
from mininet_scenarios.workload import MIN_FLOW_BYTES, scales
from terra_model import WorkloadError
from topologies import load_topology
from topologies.binding import load_binding

TESTBED = Path(__file__).resolve().parents[2] / "topologies/data/swan_testbed.json"
SUMMARY_KEYS = {
    "schedulers", "foi_avg_cct_by_scheduler", "terra", "per_flow_tcp", "foi_avg_cct",
    "foi_wan_utilization", "failure_reaction_s",
    "bytes_lost", "digest_mismatches", "rules_per_switch_max", "flow_mods_after_startup",
}  # fmt: skip
OUR_BRIDGES = {"s1", "s2", "s3", "s4", "s5", "mgmt0"}


# ---- workload ----------------------------------------------------------------------------------


def test_scales_keep_the_load_of_a_1gbps_wan():
    # 20 Mbit/s links vs the paper's 1 Gbps: bytes x 0.02; twice slower: bytes x 0.04, time x 2.
    assert scales(20, 1.0) == pytest.approx((0.02, 1.0))
    assert scales(20, 0.5) == pytest.approx((0.04, 2.0))
    # 10 Mbit/s at load 2, half speed: 10e6 / 1e9 * 2 / 0.5 = 0.04 (the CLI default's bytes).
    assert scales(10, 0.5, 2.0) == pytest.approx((0.04, 2.0))
    with pytest.raises(ValueError):
        scales(10, 0.5, 0.0)
    with pytest.raises(ValueError):
        scales(0, 1.0)


def test_testbed_coflows_merge_pairs_drop_intra_dc_and_scale(tmp_path):
    doc = {
        "coflows": [
            {"id": "a", "arrival_s": 10.0, "flows": [
                {"id": "f1", "src": "HK", "dst": "LA", "bytes": 1e6},
                {"id": "f2", "src": "HK", "dst": "LA", "bytes": 2e6},
                {"id": "f3", "src": "LA", "dst": "LA", "bytes": 5e6},
                {"id": "f4", "src": "NY", "dst": "BA", "bytes": 1000}]},
            {"id": "b", "arrival_s": 12.0, "flows": [
                {"id": "g", "src": "FL", "dst": "FL", "bytes": 1e6}]},
            {"id": "c", "arrival_s": 14.0, "flows": [
                {"id": "h", "src": "BA", "dst": "HK", "bytes": 4e6}]},
        ]
    }  # fmt: skip
    path = tmp_path / "w.json"
    path.write_text(json.dumps(doc))
    topo = load_topology("swan")
    binding = load_binding(load_topology(str(TESTBED)))
    out = tb_workload.testbed_coflows(
        str(path), topo, binding, 0, 10, byte_scale=0.5, time_scale=2.0
    )
    # "b" has only an intra-DC flow: dropped. Arrivals (t - 10) * 2: 0 and 8.
    assert [c.trace_id for c in out] == ["a", "c"]
    assert [c.arrival_s for c in out] == [0.0, 8.0]
    a = {f["id"]: f for f in out[0].flows}
    # f1 + f2 merged: (1e6 + 2e6) * 0.5 = 1.5e6; f4: 1000 * 0.5 = 500 -> raised to 64 KiB.
    assert a["HK>LA"] == {"id": "HK>LA", "src": "hHK1", "dst": "hLA1", "bytes": 1_500_000}
    assert a["NY>BA"]["bytes"] == MIN_FLOW_BYTES
    assert set(a) == {"HK>LA", "NY>BA"}
    assert out[1].flows[0]["bytes"] == 2_000_000 and out[1].bytes == 2_000_000
    with pytest.raises(WorkloadError):
        tb_workload.testbed_coflows(str(path), topo, binding, 1, 1, byte_scale=0.5, time_scale=2.0)


def test_two_hosts_per_dc_split_each_pair_over_host_pairs(tmp_path):
    path = tmp_path / "w.json"
    flows = [{"id": "f", "src": "HK", "dst": "BA", "bytes": 1e6}]
    path.write_text(json.dumps({"coflows": [{"id": "a", "arrival_s": 0, "flows": flows}]}))
    testbed = load_topology(str(swan.testbed_topology(tmp_path, 20, hosts_per_dc=2)))
    binding = load_binding(testbed)
    assert [(h.name, h.ip, h.port) for h in binding.hosts("BA")] == [
        ("hBA1", "10.0.5.1", 100),
        ("hBA2", "10.0.5.2", 101),
    ]
    # Capacity: 0.92 * 20 Mbit/s = 18.4e6 / 8 = 2.3e6 bytes/s.
    assert testbed.capacity[("HK", "LA")] == pytest.approx(2.3e6)
    (c,) = tb_workload.testbed_coflows(str(path), load_topology("swan"), binding, 0, 1, 1.0, 1.0)
    # 1e6 bytes over two host pairs: 500 000 each, HK host j -> BA host j.
    assert [(f["id"], f["src"], f["dst"], f["bytes"]) for f in c.flows] == [
        ("HK>BA#1", "hHK1", "hBA1", 500_000),
        ("HK>BA#2", "hHK2", "hBA2", 500_000),
    ]


def test_cli_rejects_bad_arguments_before_touching_the_machine(tmp_path, capsys):
    base = ["swan", "--workdir", str(tmp_path)]
    assert cli.main([*base, "--fail-link", "HK-BA"]) == 2  # not a SWAN link
    assert "not a SWAN link" in capsys.readouterr().err
    assert cli.main([*base, "--workload", str(tmp_path / "missing.json")]) == 2
    assert cli.main([*base, "--link-mbps", "0"]) == 2
    assert cli.main([*base, "--load", "-1"]) == 2
    assert cli.main([*base, "--hosts-per-dc", "0"]) == 2
    assert cli.main([*base, "--repeats", "0"]) == 2
    assert cli.main([*base, "--controllers", "0"]) == 2
    assert cli.main([*base, "--kill-leader-at", "5"]) == 2  # one controller: nothing to fail to
    assert "--controllers 2 or more" in capsys.readouterr().err
    assert cli.main([*base, "--controllers", "3", "--schedulers", "terra,varys"]) == 2


def test_fb_slice_is_the_default_burst():
    topo = load_topology("swan")
    binding = load_binding(load_topology(str(TESTBED)))
    out = tb_workload.testbed_coflows("fb", topo, binding, 38, 12, *scales(20, 1.0))
    assert [str(c.trace_id) for c in out] == [str(i) for i in range(39, 51)]
    # Coflow 50 arrives 204.829 - 199.845 = 4.984 s after coflow 39.
    assert out[-1].arrival_s == pytest.approx(4.984)
    assert all(f["src"] != f["dst"] for c in out for f in c.flows)


# ---- results -----------------------------------------------------------------------------------


def test_busy_time_is_the_union_of_active_intervals():
    # [0, 2] and [1, 3] overlap -> [0, 3]; [5, 6] apart: 3 + 1 = 4 s.
    assert busy_time({"a": 0, "b": 1, "c": 5}, {"a": 2, "b": 2, "c": 1}) == pytest.approx(4.0)
    assert busy_time({"a": 0}, {}) == 0.0


def test_a_down_link_counts_no_capacity_while_busy():
    # Links 10 B/s in all, 4 B/s of them down over [1, 3]; busy [0, 2] and [2.5, 4] (3.5 s).
    # Down while busy: [1, 2] and [2.5, 3] = 1.5 s. Capacity x time: 10 x 3.5 - 4 x 1.5 = 29.
    run = RunResult(cct_s={"a": 2.0, "b": 1.5}, arrival_s={"a": 0.0, "b": 2.5},
                    wan_bytes_sent=58, wan_capacity_bps=10.0, failed_capacity_bps=4.0,
                    failure_down_s=1.0, failure_up_s=3.0)  # fmt: skip
    assert run.capacity_time == pytest.approx(29.0)
    assert run.wan_utilization == pytest.approx(2.0)  # 58 / 29
    # Never back up within the run: down from 1 s to the end, [1, 2] and [2.5, 4] = 2.5 s.
    run.failure_up_s = None
    assert run.capacity_time == pytest.approx(35.0 - 4 * 2.5)
    # No failure: the whole capacity counts.
    assert RunResult(cct_s={"a": 2.0}, arrival_s={"a": 0.0}, wan_capacity_bps=10.0,
                     failed_capacity_bps=4.0).capacity_time == pytest.approx(20.0)  # fmt: skip


def test_summary_foi_and_percentiles():
    # Terra: both coflows arrive at 0, CCTs 1 and 3: busy 3 s; 15 bytes / (10 B/s * 3 s) = 0.5.
    terra = RunResult(cct_s={1: 1.0, 2: 3.0}, arrival_s={1: 0.0, 2: 0.0}, wan_bytes_sent=15,
                      wan_capacity_bps=10.0, reaction_s=0.2)  # fmt: skip
    # TCP: [0, 2] and [4, 10]: busy 8 s; 16 bytes / (10 B/s * 8 s) = 0.2.
    tcp = RunResult(cct_s={1: 2.0, 2: 6.0}, arrival_s={1: 0.0, 2: 4.0}, wan_bytes_sent=16,
                    wan_capacity_bps=10.0, bytes_lost=0, digest_mismatches=1)  # fmt: skip
    out = results.summary(
        {
            "terra": [terra],
            "per_flow_tcp": [tcp],
            "rules_per_switch": {1: 94, 3: 144},
            "flow_mods_after_startup": 0,
        }
    )
    assert set(out) == SUMMARY_KEYS
    # Terra: avg (1 + 3) / 2 = 2; p95 = 1 + 0.95 * (3 - 1) = 2.9.
    assert out["terra"] == pytest.approx(
        {"avg_cct_s": 2.0, "p95_cct_s": 2.9, "wan_utilization": 0.5, "wan_utilization_ofctl": 0.0}
    )
    # TCP: avg (2 + 6) / 2 = 4. FoI: 4 / 2 = 2 and 0.5 / 0.2 = 2.5.
    assert out["foi_avg_cct"] == pytest.approx(2.0)
    assert out["foi_wan_utilization"] == pytest.approx(2.5)
    assert out["rules_per_switch_max"] == 144 and out["digest_mismatches"] == 1
    text = results.table(out)
    assert "MISSED" in text  # one digest mismatch
    assert not results.target_met("bytes_lost", 3) and results.target_met("bytes_lost", 0)
    # The FoIs are compared with the simulated twin; the paper's figures are references.
    assert results.target_met("foi_avg_cct", 2.0) is None
    assert "foi_avg_cct                    2.000   paper 1.55 (reference)" in text
    twin = {"foi_avg_cct": 1.9, "foi_wan_utilization": 3.0}
    lines = results.foi_lines(out, twin)
    assert lines[0] == ("foi_avg_cct                    2.000   simulated twin 1.900 "
                        "(x1.05: as simulated); paper 1.55 (reference)")  # fmt: skip
    assert "(x0.83: differs); paper 1.64 (reference)" in lines[1]  # 2.5 / 3.0
    assert "MISSED" not in "\n".join(lines)
    assert lines[0] in results.table(out, twin)
    assert math.isnan(results.cct_stats({})[0])


def test_summary_pools_repeats():
    # Run 1: 10 bytes, 10 B/s, busy 1 s; run 2: 30 bytes, busy 3 s: 40 / (10 + 30) = 1.0.
    # CCTs pooled: (1 + 3) / 2 = 2. Reaction: the slower of 0.1 and 0.3 s.
    runs = [
        RunResult(cct_s={1: 1.0}, arrival_s={1: 0.0}, wan_bytes_sent=10, wan_capacity_bps=10.0,
                  reaction_s=0.1),
        RunResult(cct_s={1: 3.0}, arrival_s={1: 0.0}, wan_bytes_sent=30, wan_capacity_bps=10.0,
                  reaction_s=0.3, bytes_lost=5),
    ]  # fmt: skip
    out = results.summary({"terra": runs, "per_flow_tcp": runs,
                           "rules_per_switch": {}, "flow_mods_after_startup": 2})  # fmt: skip
    assert out["terra"]["avg_cct_s"] == pytest.approx(2.0)
    assert out["terra"]["wan_utilization"] == pytest.approx(1.0)
    assert out["failure_reaction_s"] == pytest.approx(0.3)
    assert out["bytes_lost"] == 10  # 5 in each system's second run
    assert out["foi_avg_cct"] == pytest.approx(1.0)


def test_takeover_summary_compares_the_killed_run_with_the_runs_before():
    # Runs without the kill: CCTs 2 and 4 (avg 3); with the kill at 5 s: CCTs 3 and 6 (avg
    # 4.5, 1.5x); coflow 2 (arrived at 1 s, done at 7 s) spans the kill, coflow 1 does not.
    before = [RunResult(cct_s={1: 2.0}, arrival_s={1: 0.0}),
              RunResult(cct_s={1: 4.0}, arrival_s={1: 0.0})]  # fmt: skip
    report = {"kill_s": 5.0, "leader_s": 2.0, "agents_back_s": 2.3, "takeover_s": 2.4,
              "coflows_active": 1, "resubmitted": 0, "coflows_submitted": 2,
              "coflows_done": 2, "coflows_unknown": 0, "flow_mods_at_takeover": 0,
              "flow_mods_after_takeover": 0, "link_events_after_takeover": 0,
              "submit_wait_max_s": 0.01, "submits_refused": 0,
              "rounds_before_kill": 9}  # fmt: skip
    killed = RunResult(cct_s={1: 3.0, 2: 6.0}, arrival_s={1: 0.0, 2: 1.0}, bytes_lost=0,
                       takeover=report)  # fmt: skip
    out = results.takeover_summary({"terra": [*before, killed], "takeover": report})
    assert out["avg_cct_s"] == pytest.approx(4.5)
    assert out["avg_cct_s_without_kill"] == pytest.approx(3.0)
    assert out["cct_vs_without_kill"] == pytest.approx(1.5)
    assert out["ccts_spanning_kill"] == 1
    assert out["takeover_s"] == 2.4 and "rounds_before_kill" not in out
    assert "scheduling (takeover) 2.40 s after the kill" in results.takeover_lines(out)
    alone = results.takeover_summary({"terra": [killed], "takeover": report})
    assert alone["avg_cct_s_without_kill"] is None and alone["cct_vs_without_kill"] is None
    assert results.takeover_summary({"terra": before}) is None
    assert results.takeover_summary({"terra": before, "takeover": {}}) == {"kill_s": None}


def test_summary_with_several_schedulers_has_a_column_and_foi_for_each():
    # Three coflow CCTs per system, one repeat: Terra avg (1 + 2 + 3) / 3 = 2, varys 3,
    # rapier 4, per-flow TCP 6. FoI over TCP: 6/2 = 3, 6/3 = 2, 6/4 = 1.5; Terra over the
    # others: 3/2 = 1.5 and 4/2 = 2. Each run: 12 bytes, 10 B/s, busy 1..3 s.
    def run(ccts, sent, lost=0):
        return RunResult(cct_s=dict(enumerate(ccts)), arrival_s=dict.fromkeys(range(3), 0.0),
                         wan_bytes_sent=sent, wan_capacity_bps=10.0, bytes_lost=lost)  # fmt: skip

    raw = {"schedulers": ["terra", "varys", "rapier"], "terra": [run([1, 2, 3], 15)],
           "varys": [run([2, 3, 4], 20, lost=7)], "rapier": [run([3, 4, 5], 25)],
           "per_flow_tcp": [run([5, 6, 7], 35)], "rules_per_switch": {1: 144},
           "flow_mods_after_startup": 0}  # fmt: skip
    out = results.summary(raw)
    assert out["schedulers"] == ["terra", "varys", "rapier"]
    assert out["foi_avg_cct"] == pytest.approx(3.0)  # judged on the first scheduler
    assert out["foi_avg_cct_by_scheduler"] == pytest.approx({"terra": 3, "varys": 2, "rapier": 1.5})
    assert out["foi_terra_over"] == pytest.approx({"varys": 1.5, "rapier": 2.0})
    # busy 3 s, 5 s, 5 s... utilization = bytes / (10 B/s x busy): Terra 15 / 30 = 0.5.
    assert out["terra"]["wan_utilization"] == pytest.approx(0.5)
    assert out["bytes_lost"] == 7  # summed over every system
    text = results.table(out)
    assert "varys" in text and "rapier" in text and "FoI of Terra over it" in text
    # The simulated twin: utilization ratios testbed / simulated, ok within 10 %.
    simulated = {
        "terra": {"wan_utilization": 0.5},
        "varys": {"wan_utilization": 0.5},
        "rapier": {"wan_utilization": 0.3},
        "per_flow_tcp": {"wan_utilization": 0.7},
    }
    ratios = results.utilization_vs_simulated(out, simulated)
    assert ratios["terra"] == pytest.approx(1.0)
    assert ratios["varys"] == pytest.approx(out["varys"]["wan_utilization"] / 0.5)
    lines = results.simulated_table(out, simulated).splitlines()
    assert lines[1].startswith("terra") and lines[1].endswith("ok")
    assert lines[3].startswith("rapier") and lines[3].endswith("MISSED")  # 0.5 / 0.3
    details = results.details(raw, {"spec": "test"})
    assert set(details["repeats"][0]) >= {"terra", "varys", "rapier", "per_flow_tcp"}


def test_parse_schedulers_accepts_registry_names_only():
    assert parse_schedulers("terra,varys, rapier") == ["terra", "varys", "rapier"]
    for bad in ("terra,fifo", "terra,terra", ","):
        with pytest.raises(argparse.ArgumentTypeError):
            parse_schedulers(bad)


def test_windowed_rate_of_steady_progress():
    # 4e6 bytes in 2 s, sampled every 0.5 s: 2e6 bytes/s over every 1 s window.
    series = [(t * 0.5, t * 1e6) for t in range(5)]
    t, rate = results.windowed_rate(series)
    assert t[0] == pytest.approx(0.25) and t[-1] == pytest.approx(2.0)
    assert rate == pytest.approx([2e6] * len(t))


def test_plots_are_written(tmp_path):
    run = RunResult(cct_s={1: 1.0}, throughput={1: [(0, 0), (1, 1e6), (2, 2e6)]},
                    failure_down_s=0.5, failure_up_s=1.5)  # fmt: skip
    paths = results.plot({"terra": [run], "per_flow_tcp": [RunResult(cct_s={1: 2.0})]}, tmp_path)
    assert all(p.stat().st_size > 1000 for p in paths)


# ---- the per-flow TCP node, over loopback -------------------------------------------------------


def test_tcp_baseline_node_receives_flows_with_their_digests(tmp_path):
    port = free_port()
    out = tmp_path / "out.jsonl"
    serve(("127.0.0.1", port), out)
    sizes = {"f1": 3_000_000, "f2": 1}  # more than one synthetic period; a single byte
    threads = [threading.Thread(target=send_flow, args=("127.0.0.1", port, "7", f, n))
               for f, n in sizes.items()]  # fmt: skip
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    with socket.create_connection(("127.0.0.1", port)) as junk:  # no header line: ignored
        junk.sendall(b"not json\n" + b"x" * 10)
    time.sleep(0.2)
    records = {r["flow"]: r for r in map(json.loads, out.read_text().splitlines())}
    assert set(records) == set(sizes)
    for flow, size in sizes.items():
        assert records[flow]["received"] == size
        assert records[flow]["digest"] == expected_digest("7", flow, size)
    assert expected_digest("7", "f1", 10) != expected_digest("7", "f2", 10)


def test_tcp_baseline_node_process_waits_for_the_start_file_then_sends(tmp_path):
    port = free_port()
    schedule = tmp_path / "schedule.json"
    flows = [{"coflow": "3", "flow": "a>b", "dst_ip": "127.0.0.1", "bytes": 100_000,
              "arrival_s": 0.1}]  # fmt: skip
    schedule.write_text(json.dumps(flows))
    out, start = tmp_path / "out.jsonl", tmp_path / "start"
    node = subprocess.Popen(
        [sys.executable, "-m", "mininet_scenarios.tcp_baseline", "node", "--listen",
         f"127.0.0.1:{port}", "--schedule", str(schedule), "--start-file", str(start),
         "--out", str(out)],
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        while not Path(f"{out}.ready").exists():
            assert time.monotonic() < deadline and node.poll() is None
            time.sleep(0.05)
        time.sleep(0.3)
        assert not out.exists() or out.read_text() == ""  # nothing sent before the start
        start.write_text(repr(time.time()))
        while not (out.exists() and out.read_text()):
            assert time.monotonic() < deadline
            time.sleep(0.05)
        record = json.loads(out.read_text())
        assert record["received"] == 100_000
        assert record["digest"] == expected_digest("3", "a>b", 100_000)
    finally:
        node.terminate()
        node.wait(timeout=10)


def test_terra_flows_count_as_verified_only_when_done_with_a_keyed_digest():
    """The testbed cannot recompute Terra's keyed digests (the key stays with the controller
    and the two agents); a flow counts as verified when done with a well-formed digest."""
    good = {"state": "done", "digest": "ab" * 32}
    assert verified_by_agents(good)
    for bad in ({**good, "state": "running"}, {**good, "digest": None},
                {**good, "digest": "AB" * 32}, {**good, "digest": "ab" * 31}):  # fmt: skip
        assert not verified_by_agents(bad)


# ---- tenants -----------------------------------------------------------------------------------


def test_tenants_arguments_assign_split_and_refuse(tmp_path, capsys):
    from mininet_scenarios.testbed_tenants import PIECES

    base = ["swan", "--quick", "--workdir", str(tmp_path)]
    plain, _ = cli.options_from_args(cli.build_parser().parse_args(base), tmp_path)
    assert plain.tenants == [] and plain.greedy_coflows is None  # default run unchanged
    assert all(c.tenant is None for c in plain.coflows)

    args = cli.build_parser().parse_args([*base, "--tenants", "2", "--greedy-tenant"])
    opts, workload = cli.options_from_args(args, tmp_path)
    assert opts.tenants == workload["tenants"] == ["t0", "t1"]
    assert opts.sharing == workload["sharing"] == "cooperative"
    args = cli.build_parser().parse_args([*base, "--tenants", "2", "--sharing", "strict"])
    assert cli.options_from_args(args, tmp_path)[1]["sharing"] == "strict"
    # terra-sim's rule: coflow i to tenant i mod N, in workload order.
    assert [c.tenant for c in opts.coflows] == ["t0", "t1"] * (len(opts.coflows) // 2) + (
        ["t0"] if len(opts.coflows) % 2 else []
    )
    assert [c.trace_id for c in opts.coflows] == [c.trace_id for c in plain.coflows]
    # The greedy (last) tenant's coflows become PIECES each, same arrival and bytes.
    greedy = opts.greedy_coflows
    t1 = [c for c in opts.coflows if c.tenant == "t1"]
    assert len(greedy) == len(opts.coflows) + (PIECES - 1) * len(t1)
    for c in t1:
        pieces = [p for p in greedy if str(p.trace_id).startswith(f"{c.trace_id}/")]
        assert len(pieces) == PIECES and {p.arrival_s for p in pieces} == {c.arrival_s}
        assert sum(p.bytes for p in pieces) == c.bytes
        assert {p.tenant for p in pieces} == {"t1"}
    assert [c for c in greedy if c.tenant == "t0"] == [c for c in opts.coflows if c.tenant == "t0"]

    # --greedy-tenant 100: every t1 coflow becomes 100.
    args = cli.build_parser().parse_args([*base, "--tenants", "2", "--greedy-tenant", "100"])
    many = cli.options_from_args(args, tmp_path)[0].greedy_coflows
    assert len(many) == len(opts.coflows) + 99 * len(t1)
    assert sum(p.bytes for p in many) == sum(c.bytes for c in opts.coflows)

    assert cli.main([*base, "--greedy-tenant"]) == 2
    assert "--greedy-tenant needs --tenants" in capsys.readouterr().err
    assert cli.main([*base, "--tenants", "2", "--greedy-tenant", "0"]) == 2
    assert "--greedy-tenant P must be >= 1, got 0" in capsys.readouterr().err
    assert cli.main([*base, "--tenants", "-1"]) == 2
    assert cli.main([*base, "--tenants", "2", "--schedulers", "terra,varys"]) == 2
    assert cli.main([*base, "--tenants", "2", "--controllers", "3"]) == 2
    assert "terra scheduler alone" in capsys.readouterr().err
    assert cli.main([*base, "--tenants", "50", "--greedy-tenant"]) == 2  # t49 owns no coflow
    assert "owns no coflow" in capsys.readouterr().err
    for sharing in ("strict", "cooperative"):
        assert cli.main([*base, "--sharing", sharing]) == 2
        assert "--sharing needs --tenants" in capsys.readouterr().err


def test_tenants_file_and_certificates_are_the_controllers(tmp_path):
    from cryptography import x509

    from mininet_scenarios.testbed_processes import job_name, make_pki
    from mininet_scenarios.testbed_tenants import tenants_toml
    from terra_controller.tenants_config import parse_tenants
    from terra_security.pki import TENANT_URI

    path = tenants_toml(["t0", "t1", "t2"], tmp_path / "tenants.toml")
    config = parse_tenants(path.read_text(), str(path))
    assert {n: t.weight for n, t in config.tenants.items()} == {"t0": 1, "t1": 1, "t2": 1}
    assert config.sharing == "cooperative"
    path = tenants_toml(["t0", "t1"], tmp_path / "strict.toml", sharing="strict")
    assert parse_tenants(path.read_text(), str(path)).sharing == "strict"
    pki = make_pki(tmp_path, ["hHK1"], ["t0", "t1"])
    assert job_name("t1") == "testbed-job-t1"
    cert = x509.load_pem_x509_certificate((pki / "testbed-job-t1.crt").read_bytes())
    sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert TENANT_URI + "t1" in sans.get_values_for_type(x509.UniformResourceIdentifier)


def test_tenant_summary_joins_pieces_and_reports_the_honest_change():
    from mininet_scenarios.testbed_tenants import tenant_lines, tenant_summary

    a = tb_workload.TestbedCoflow(1, 0.0, (), "t0")
    b = tb_workload.TestbedCoflow(2, 1.0, (), "t1")
    pieces = [tb_workload.TestbedCoflow(f"2/{j}", 1.0, (), "t1") for j in range(2)]
    honest = RunResult(cct_s={1: 4.0, 2: 2.0}, arrival_s={1: 0.0, 2: 1.0})
    # The greedy run: t0's coflow takes 4.2 s (+5 %); t1's pieces end at 2.5 and 4.0 s, so
    # its coflow takes 4.0 - 1.0 = 3.0 s.
    greedy = RunResult(cct_s={1: 4.2, "2/0": 1.5, "2/1": 3.0},
                       arrival_s={1: 0.0, "2/0": 1.0, "2/1": 1.0})  # fmt: skip
    raw = {"schedulers": ["terra"], "terra": [honest], "tenant_coflows": [a, b],
           "greedy_runs": [greedy], "greedy_coflows": [a, *pieces],
           "greedy_tenant": "t1"}  # fmt: skip
    out = tenant_summary(raw)
    assert out["honest"] == {"t0": {"avg_cct_s": 4.0, "coflows": 1},
                             "t1": {"avg_cct_s": 2.0, "coflows": 1}}  # fmt: skip
    assert out["greedy"]["t1"]["avg_cct_s"] == pytest.approx(3.0)
    assert out["change"] == {"t0": pytest.approx(0.05)}
    assert out["max_change"] == pytest.approx(0.05) and out["target_met"]
    assert out["greedy_bytes_lost"] == 0 and out["greedy_digest_mismatches"] == 0
    assert out["change_per_repeat"] == [{"t0": pytest.approx(0.05)}]
    assert "change +5.0%" in tenant_lines(out) and "at most 5.0% either way" in tenant_lines(out)
    # An unfinished piece leaves its coflow out.
    del greedy.cct_s["2/1"]
    assert tenant_summary(raw)["greedy"]["t1"] == {"avg_cct_s": None, "coflows": 0}
    assert tenant_summary({"schedulers": ["terra"], "terra": [honest]}) is None
