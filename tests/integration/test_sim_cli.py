"""terra-sim end to end on tiny workloads (terra_sim/cli.py)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from terra_core.registry import scheduler_names
from terra_sim.cli import main, parse_fail_link
from topologies import load_topology

# SWAN at 1 Gbps = 1.25e8 B/s. c1 (2.5e9 B HK->BA) and c2 (1.25e9 B LA->FL, deadline 30 s);
# c3 is intra-DC only.
WORKLOAD = {
    "coflows": [
        {
            "id": "c1",
            "arrival_s": 0.0,
            "flows": [{"id": "f1", "src": "HK", "dst": "BA", "bytes": 2.5e9}],
        },
        {
            "id": "c2",
            "arrival_s": 1.0,
            "deadline_s": 30,
            "flows": [{"id": "f1", "src": "LA", "dst": "FL", "bytes": 1.25e9}],
        },
        {
            "id": "c3",
            "arrival_s": 2.0,
            "flows": [{"id": "f", "src": "HK", "dst": "HK", "bytes": 1}],
        },
    ]
}

KEYS = {
    "avg_cct_s",
    "p95_cct_s",
    "wan_utilization",
    "avg_slowdown",
    "deadlines_met",
    "admitted",
    "intra_dc_coflows",
    "rounds",
    "round_ms_median",
    "round_ms_p95",
    "lps_per_round",
    "wall_s",
    "coflows",
}


@pytest.fixture
def workload(tmp_path):
    path = tmp_path / "w.json"
    path.write_text(json.dumps(WORKLOAD))
    return path


def test_all_schedulers_json_and_plot(workload, tmp_path, capsys):
    out, png = tmp_path / "r.json", tmp_path / "cdf.png"
    argv = ["--topology", "swan", "--workload", str(workload), "--json", str(out)]
    assert main([*argv, "--plot", str(png), "--fail-link", "NY-BA@1:5"]) == 0
    table = capsys.readouterr().out
    results = json.loads(out.read_text())["results"]
    assert set(results) == set(scheduler_names())
    for name, r in results.items():
        assert set(r) == KEYS, name
        assert [c["id"] for c in r["coflows"]] == ["c1", "c2", "c3"]
        assert set(r["coflows"][0]) == {
            "id",
            "arrival_s",
            "finish_s",
            "cct_s",
            "admitted",
            "met_deadline",
            "wan",
        }
        assert r["admitted"] == 2  # the intra-DC coflow is not counted
        assert r["intra_dc_coflows"] == 1
        assert [c["wan"] for c in r["coflows"]] == [True, True, False]
        assert name in table
    # a lone LA->FL coflow needs 1.25e9 / 1.25e8 = 10 s on its direct link, well within 30 s
    assert results["per-flow"]["coflows"][1]["met_deadline"] is True
    assert results["per-flow"]["coflows"][2]["cct_s"] == 0.0
    assert results["per-flow"]["lps_per_round"] is None
    assert results["terra"]["lps_per_round"] is not None
    assert png.stat().st_size > 1000
    assert "FoI" in table
    assert "intra-DC coflows: 1 of 3 (no WAN flow: CCT 0 at arrival" in table
    assert "link changes: NY-BA down at 1 s; NY-BA up at 5 s\n" in table


def test_fail_link_after_the_run_is_said(workload, capsys):
    # c1 (the last to finish) needs 20 s at most on SWAN: a failure at 1000 s never happens
    argv = ["--topology", "swan", "--workload", str(workload), "--scheduler", "per-flow"]
    assert main([*argv, "--fail-link", "LA-NY@1000"]) == 0
    assert "link changes: LA-NY down at 1000 s (after every run ended)" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("option", "path", "message"),
    [
        ("--json", "/nonexistent/dir/x.json", "--json /nonexistent/dir/x.json: no directory"),
        ("--plot", ".", "--plot .: is a directory"),
    ],
)
def test_output_paths_are_checked_before_the_run(option, path, message, capsys):
    # the workload does not exist either: the output path is checked first, before any run
    assert main(["--topology", "swan", "--workload", "nowhere.json", option, path]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"terra-sim: error: {message}")
    assert err.count("\n") == 1 and "nowhere" not in err


def test_a_large_cut_is_summarised():
    from terra_sim.cli import format_cut

    racks = [str(r) for r in range(150)]
    assert format_cut(frozenset({"HK", "LA"}), ["HK", "LA", "NY"]) == "{HK, LA}"
    # bigswitch: every rack but one on the source side
    side = frozenset(racks) - {"4"}
    assert format_cut(side, [*racks, "core"]) == "every DC but {4, core}"
    half = frozenset(racks[:75])
    assert format_cut(half, racks) == "75 DCs {0, 1, 10, 11, 12, 13, 14, 15, ...}"


def test_jobs_give_the_serial_results(tmp_path, capsys):
    """--jobs 2 runs the six schedulers in two processes: every coflow's CCT equals the
    serial run's (the first 30 FB coflows on SWAN at 1 Gbps, with a failure)."""
    argv = ["--topology", "swan", "--workload", "fb", "--link-gbps", "1", "--limit", "30"]
    argv += ["--fail-link", "LA-NY@5:20"]
    serial, parallel = tmp_path / "s.json", tmp_path / "p.json"
    assert main([*argv, "--json", str(serial)]) == 0
    assert main([*argv, "--jobs", "2", "--json", str(parallel)]) == 0
    a = json.loads(serial.read_text())["results"]
    b = json.loads(parallel.read_text())["results"]
    assert list(a) == list(b) == scheduler_names()
    for name in a:
        assert [c["cct_s"] for c in a[name]["coflows"]] == [c["cct_s"] for c in b[name]["coflows"]]
    assert "terra-sim: rapier done in" in capsys.readouterr().err
    listed = tmp_path / "l.json"
    assert main([*argv, "--scheduler", "varys,per-flow,terra", "--jobs", "2",
                 "--json", str(listed)]) == 0  # fmt: skip
    c = json.loads(listed.read_text())["results"]
    assert list(c) == ["varys", "per-flow", "terra"]  # the order given
    for name in c:
        assert [x["cct_s"] for x in c[name]["coflows"]] == [x["cct_s"] for x in a[name]["coflows"]]


def test_deadline_factor_and_single_scheduler(workload, tmp_path):
    out = tmp_path / "r.json"
    argv = ["--topology", "swan", "--workload", str(workload), "--scheduler", "terra"]
    assert main([*argv, "--deadline-factor", "2", "--json", str(out)]) == 0
    res = json.loads(out.read_text())["results"]
    assert list(res) == ["terra"]
    # each WAN coflow gets a deadline of 2 x its empty-WAN Γ: Terra admits both and meets them
    assert res["terra"]["deadlines_met"] == 2


def test_json_parts_combine_into_the_fb_table(workload, tmp_path, capsys):
    # each scheduler run on its own (as fb_table3 --reuse does) carries its settings in
    # "meta"; fb_table3 --combine puts the parts back together into {topology: {baseline: FoI}}
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "fb_table3", Path(__file__).resolve().parents[2] / "benchmarks" / "fb_table3.py"
    )
    fb_table3 = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(fb_table3)
    parts = []
    for name in ["terra", "per-flow", "multipath", "swan-mcf", "varys", "rapier"]:
        parts.append(tmp_path / f"{name}.json")
        argv = ["--topology", "swan", "--workload", str(workload), "--scheduler", name]
        assert main([*argv, "--k", "2", "--json", str(parts[-1])]) == 0
    meta = json.loads(parts[0].read_text())["meta"]
    assert (meta["topology"], meta["k"], meta["limit"]) == ("swan", 2, None)
    out = tmp_path / "table.json"
    assert fb_table3.main(["--combine", *map(str, parts), "--json", str(out)]) == 0
    table = json.loads(out.read_text())
    avg = {p.stem: json.loads(p.read_text())["results"][p.stem]["avg_cct_s"] for p in parts}
    assert set(table) == {"swan"}
    assert table["swan"] == {b: pytest.approx(avg[b] / avg["terra"]) for b in avg if b != "terra"}
    # parts run with other settings do not mix
    other = tmp_path / "k1.json"
    argv = ["--topology", "swan", "--workload", str(workload), "--scheduler", "varys"]
    assert main([*argv, "--k", "1", "--json", str(other)]) == 0
    capsys.readouterr()
    assert fb_table3.main(["--combine", str(parts[0]), str(other)]) == 2
    assert "differ" in capsys.readouterr().err


def test_malformed_trace_line_names_file_and_line(tmp_path, capsys):
    trace = tmp_path / "bad.txt"
    trace.write_text("150 2\n1 0 1 3 1 4:10\n2 10 two 3 1 4:10\n")
    assert main(["--topology", "swan", "--workload", str(trace)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1
    assert f"{trace}:3" in err[0]


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--topology", "nowhere", "--workload", "fb"], "nowhere"),
        (["--topology", "swan", "--workload", "fb", "--k", "0"], "--k"),
        (["--topology", "swan", "--workload", "fb", "--limit", "2", "--jobs", "0"], "--jobs"),
        (["--topology", "swan", "--workload", "fb", "--fail-link", "HK-XX@3"], "HK-XX"),
        (
            ["--topology", "swan", "--workload", "fb", "--deadline-factor", "-1", "--limit", "2"],
            "deadline",
        ),
    ],
)
def test_bad_input_exits_2_with_one_line(argv, message, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0]


def test_parse_fail_link():
    swan = load_topology("swan")
    down, up = parse_fail_link("LA-NY@10:20.5", swan)
    assert (down.a, down.b, down.time_s, down.up) == ("LA", "NY", 10.0, False)
    assert (up.time_s, up.up) == (20.5, True)
    assert len(parse_fail_link("LA-NY@10", swan)) == 1
    for bad in ["LA-NY", "LA-NY@x", "LA-NY@5:4", "LA@1"]:
        with pytest.raises(ValueError):
            parse_fail_link(bad, swan)


def test_console_script_runs(workload):
    exe = [sys.executable, "-m", "terra_sim.cli"]
    done = subprocess.run(
        [*exe, "--topology", "swan", "--workload", str(workload), "--scheduler", "varys"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert "varys" in done.stdout


def test_bound_line_and_json(workload, tmp_path, capsys):
    # SWAN, 1 Gbps = 1.25e8 B/s. Cut {HK, LA} -> rest has 3 links (HK-NY, LA-NY, LA-FL), 3.75e8
    # B/s: c1 needs 2.5e9 / 3.75e8 = 6.67 s of it from t=0, c2 1.25e9 / 3.75e8 = 3.33 s from
    # t=1. SRPT: c2 runs 1 -> 4.33 (3.33), c1 ends at 10 (10): 13.33 s over 2 WAN coflows =
    # 6.67 s. Alone: c1 (HK's two links) 10 s, c2 (LA's three links) 3.33 s: mean 6.67 s too.
    out = tmp_path / "r.json"
    argv = ["--topology", "swan", "--workload", str(workload), "--scheduler", "per-flow"]
    assert main([*argv, "--bound", "--json", str(out)]) == 0
    assert "average CCT of K-path schedulers: 6.667 s" in capsys.readouterr().out
    bound = json.loads(out.read_text())["bound"]
    assert bound["avg_cct_s"] == pytest.approx(20 / 3)
    assert bound["isolation_avg_cct_s"] == pytest.approx(20 / 3)
    assert bound["coflows"] == 2
    per_flow = json.loads(out.read_text())["results"]["per-flow"]["avg_cct_s"]
    assert per_flow >= bound["avg_cct_s"]


def test_bound_with_a_failure_is_the_cut_bound_only(workload, tmp_path, capsys):
    # Same workload with HK-NY down from t=0: the mean Γ_empty over the K paths before the
    # failure is no bound once the schedulers re-route, so it is left out; the cut bound,
    # computed before the failure (which only removes capacity), is still 20/3 s.
    out = tmp_path / "r.json"
    argv = ["--topology", "swan", "--workload", str(workload), "--scheduler", "terra"]
    assert main([*argv, "--bound", "--fail-link", "HK-NY@0", "--json", str(out)]) == 0
    assert "lower bound on any scheduler's average CCT: 6.667 s" in capsys.readouterr().out
    bound = json.loads(out.read_text())["bound"]
    assert bound["isolation_avg_cct_s"] is None
    assert bound["avg_cct_s"] == bound["cut_avg_cct_s"] == pytest.approx(20 / 3)


def test_bound_ratio_marks_an_average_over_fewer_coflows(workload, capsys):
    # Deadlines 1.2 x Γ_empty: Terra admits c1 (Γ 10 s, alone at t=0, CCT 10 s) and rejects
    # c2 (arriving at t=1 while c1 runs), so its average (10 s) covers 1 of the 2 WAN
    # coflows the bound averages over: 10 / (20/3) = 1.50x, marked.
    argv = ["--topology", "swan", "--workload", str(workload), "--scheduler", "terra"]
    assert main([*argv, "--bound", "--deadline-factor", "1.2"]) == 0
    assert "terra 1.50x (over 1 of 2 coflows)" in capsys.readouterr().out
