"""`terra-job` against a real controller (--no-openflow) and three real agents on loopback
(benchmarks/loopback_system.py): submit --wait, watch, cancel, agents, list and replay, with
their exit statuses (0 done, 1 failed or cancelled, 2 usage error)."""

from __future__ import annotations

import json
import re

import pytest

from benchmarks.loopback_system import ControllerProcess, start_agents, stop_all
from terra_controller import job_cli
from terra_security.pki import Role

AGENTS = [("a1", "A", "127.0.0.21"), ("b1", "B", "127.0.0.22"), ("c1", "C", "127.0.0.23")]
TRIANGLE = {
    "name": "tri",
    "dcs": ["A", "B", "C"],
    "default_capacity_gbps": 0.16,  # 20 MB/s each way
    "links": [{"a": "A", "b": "B"}, {"a": "B", "b": "C"}, {"a": "A", "b": "C"}],
}
DIGEST = re.compile(r"digest [0-9a-f]{64}\b")


@pytest.fixture(scope="module")
def system(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("job-cli")
    topo = workdir / "tri.json"
    topo.write_text(json.dumps(TRIANGLE))
    ctl = ControllerProcess(str(topo), k=2, log=workdir / "controller.log")
    agents = start_agents(ctl, AGENTS, workdir)
    try:
        ctl.wait_agents(len(AGENTS))
        ctl.identity(Role.JOB, "job1")
        yield ctl
    finally:
        stop_all(agents)
        ctl.stop()


def run(system, argv: list[str], capsys, name: str = "job1") -> tuple[int, str, str]:
    """terra-job in-process as job `name`; (exit status, stdout, stderr)."""
    base = ["--api", system.api, "--pki", str(system.pki), "--name", name]
    try:
        code = job_cli.main([*base, *argv])
    except SystemExit as exc:
        code = exc.code
    out, err = capsys.readouterr()
    return code, out, err


def write(path, data) -> str:
    path.write_text(json.dumps(data))
    return str(path)


def test_submit_wait_returns_0_with_each_flows_digest(system, tmp_path, capsys):
    flows = [{"id": "f1", "src": "a1", "dst": "b1", "bytes": 3_000_000},
             {"id": "f2", "src": "c1", "dst": "b1", "bytes": 1_000_000}]  # fmt: skip
    code, out, err = run(system, ["submit", write(tmp_path / "c.json", flows), "--wait",
                                  "--progress"], capsys)  # fmt: skip
    assert code == 0, err
    lines = out.splitlines()
    assert re.fullmatch(r"coflow \d+ submitted", lines[0])
    assert any("ETA" in line and "/s" in line for line in lines)  # progress lines (no tty)
    assert re.search(r"coflow \d+ done: 4\.00 MB in \d+\.\d\d s", out)
    assert len(DIGEST.findall(out)) == 2
    assert "f1 a1 -> b1 3000000 B" in out


def test_submit_without_wait_prints_the_id(system, tmp_path, capsys):
    job = {"deadline_s": 600, "flows": [{"id": "g", "src": "a1", "dst": "c1", "bytes": 1000}]}
    code, out, _ = run(system, ["submit", write(tmp_path / "c.json", job)], capsys)
    assert code == 0
    cid = int(out.strip())
    code, out, _ = run(system, ["--json", "watch", str(cid)], capsys)
    assert code == 0 and json.loads(out[out.index("{") :])["state"] == "done"


def test_a_cancelled_coflow_exits_1_with_the_reason(system, tmp_path, capsys):
    big = [{"id": "big", "src": "a1", "dst": "c1", "bytes": 20_000_000_000}]
    code, out, _ = run(system, ["submit", write(tmp_path / "big.json", big)], capsys)
    cid = int(out.strip())
    code, out, err = run(system, ["cancel", str(cid)], capsys)
    assert code == 0 and out.strip() == f"coflow {cid} cancelled"
    code, out, err = run(system, ["watch", str(cid)], capsys)
    assert code == 1
    assert f"coflow {cid} cancelled: " in err and "cancel" in err.split(":", 1)[1]
    code, _, _ = run(system, ["cancel", str(cid)], capsys)  # again: harmless
    assert code == 0


def test_another_jobs_coflow_is_unknown(system, tmp_path, capsys):
    system.identity(Role.JOB, "job2")
    code, out, _ = run(system, ["submit", write(tmp_path / "c.json", [
        {"id": "x", "src": "a1", "dst": "b1", "bytes": 10}])], capsys)  # fmt: skip
    code, _, err = run(system, ["watch", out.strip()], capsys, name="job2")
    assert code == 1 and "unknown_coflow" in err
    code, _, err = run(system, ["cancel", out.strip()], capsys, name="job2")
    assert code == 1 and "unknown_coflow" in err


@pytest.mark.parametrize(
    "argv, message",
    [
        (["submit", "/nonexistent/c.json"], "cannot read"),
        (["submit", "FILE", "--wait", "--bogus"], "unrecognized arguments"),
        (["watch", "seven"], "invalid int value"),
        (["replay", "W", "--map", "A=a1,A=b1"], "expected DC=AGENT"),
        (["replay", "W", "--map", "A=a1"], "unknown DC"),
        (["frobnicate"], "invalid choice"),
    ],
)
def test_usage_errors_exit_2(system, tmp_path, capsys, argv, message):
    workload = {"coflows": [{"id": "c", "flows": [{"id": "f", "src": "A", "dst": "B",
                                                   "bytes": 5}]}]}  # fmt: skip
    paths = {"FILE": write(tmp_path / "f.json", {"flows": "x"}),
             "W": write(tmp_path / "w.json", workload)}  # fmt: skip
    code, _, err = run(system, [paths.get(a, a) for a in argv], capsys)
    assert code == 2
    assert message in err


def test_a_bad_file_shape_is_a_usage_error(system, tmp_path, capsys):
    for data in ({"flows": []}, {"flows": [{"id": 1}], "colour": "red"}, 7):
        code, _, err = run(system, ["submit", write(tmp_path / "f.json", data)], capsys)
        assert code == 2, data


def test_a_refused_submit_exits_1(system, tmp_path, capsys):
    flows = [{"id": "f", "src": "a1", "dst": "nowhere", "bytes": 10}]
    code, _, err = run(system, ["submit", write(tmp_path / "c.json", flows)], capsys)
    assert code == 1 and "unknown_agent" in err


def test_agents_lists_the_agents_and_dcs(system, capsys):
    code, out, _ = run(system, ["--json", "agents"], capsys)
    assert code == 0
    view = json.loads(out)
    assert view["dcs"] == ["A", "B", "C"]
    assert view["agents"] == [
        {"id": a, "dc": dc, "connected": True} for a, dc, _ in AGENTS
    ]  # no addresses
    code, out, _ = run(system, ["agents"], capsys)
    assert code == 0
    assert re.search(r"^a1\s+A\s+connected$", out, re.MULTILINE)
    assert "DCs: A, B, C" in out


def test_list_shows_this_jobs_coflows(system, tmp_path, capsys):
    code, out, _ = run(system, ["submit", write(tmp_path / "c.json", [
        {"id": "x", "src": "b1", "dst": "a1", "bytes": 10}])], capsys)  # fmt: skip
    cid = int(out)
    code, out, _ = run(system, ["list"], capsys)
    assert code == 0 and re.search(rf"^\s+{cid} ", out, re.MULTILINE)
    code, out, _ = run(system, ["list"], capsys, name="job2")
    assert not re.search(rf"^\s+{cid} ", out, re.MULTILINE)


def test_name_and_tags_reach_watch_and_list(system, tmp_path, capsys):
    job = {"name": "etl-daily", "tags": ["nightly"],
           "flows": [{"id": "x", "src": "a1", "dst": "b1", "bytes": 1000}]}  # fmt: skip
    path = write(tmp_path / "c.json", job)
    code, out, _ = run(system, ["submit", path], capsys)
    cid = int(out)
    code, out, _ = run(system, ["watch", str(cid)], capsys)
    assert code == 0 and f"coflow {cid} (etl-daily) [nightly] done" in out
    code, out, _ = run(system, ["submit", path, "--coflow-name", "other", "--tag", "a",
                                "--tag", "b"], capsys)  # fmt: skip
    other = int(out)
    code, out, _ = run(system, ["list"], capsys)
    assert re.search(rf"^\s+{cid} .* etl-daily nightly$", out, re.MULTILINE)
    assert re.search(rf"^\s+{other} .* other a,b$", out, re.MULTILINE)
    code, _, err = run(system, ["submit", path, "--tag", "x", "--tag", "x"], capsys)
    assert code == 2 and "tags: distinct strings" in err


def test_replay_of_a_tiny_workload_completes(system, tmp_path, capsys):
    workload = {"coflows": [
        {"id": "first", "arrival_s": 0.0, "flows": [
            {"id": "f1", "src": "A", "dst": "B", "bytes": 2e6},
            {"id": "local", "src": "A", "dst": "A", "bytes": 1e9}]},
        {"id": "second", "arrival_s": 0.5, "flows": [
            {"id": "f1", "src": "C", "dst": "A", "bytes": 1.5e6}]},
        {"id": "inside", "arrival_s": 0.6, "flows": [
            {"id": "f1", "src": "B", "dst": "B", "bytes": 1e6}]},
    ]}  # fmt: skip
    path = write(tmp_path / "w.json", workload)
    code, out, err = run(system, ["replay", path, "--map", "A=a1,B=b1,C=c1", "--timeout", "60"],
                         capsys)  # fmt: skip
    assert code == 0, err
    assert "replaying 2 coflows; skipped 2 intra-DC flows (1 coflows without a WAN flow)" in out
    assert re.search(r"t=0\.[5-9]s second: coflow \d+, 1 flows", out)  # at its arrival time
    assert "2 of 2 coflows done" in out
    code, out, _ = run(system, ["--json", "list"], capsys)
    names = {c["name"]: c["tags"] for c in json.loads(out)}
    assert names["first"] == ["replay"] and names["second"] == ["replay"]
