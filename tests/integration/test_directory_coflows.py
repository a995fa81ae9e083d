"""Files as users have them, against a real controller (--no-openflow) and two real agents on
loopback (benchmarks/loopback_system.py), each with its own data root:

- a directory coflow submitted with `terra-job submit --wait` recreates the tree under the
  destination, every flow's bytes left out, and prints each file's sha256, which is
  hashlib's of the file;
- a single file without bytes gets its size from the sender; a missing source is refused in
  one line and no coflow is created;
- a glob expands into the files of the matching directories;
- sync skips the files already there (size and sha256), and sends a changed one;
- paths escaping the data root (a symlink out of it) and two flows writing one file are
  refused before anything is scheduled.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import re

import pytest

from benchmarks.loopback_system import ControllerProcess, start_agents, stop_all
from terra_controller import job_cli
from terra_controller.client import TerraError
from terra_security.pki import Role

AGENTS = [("a1", "A", "127.0.0.31"), ("b1", "B", "127.0.0.32")]
PAIR = {
    "name": "pair",
    "dcs": ["A", "B"],
    "default_capacity_gbps": 0.8,  # 100 MB/s each way
    "links": [{"a": "A", "b": "B"}],
}
SHA_LINE = re.compile(r"^  (\S+) a1 -> b1 (\d+) B digest [0-9a-f]+ sha256 ([0-9a-f]{64})", re.M)


@pytest.fixture(scope="module")
def system(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("dir-coflows")
    topo = workdir / "pair.json"
    topo.write_text(json.dumps(PAIR))
    roots = {a: workdir / f"root-{a}" for a, _, _ in AGENTS}
    for root in roots.values():
        root.mkdir()
    ctl = ControllerProcess(str(topo), k=1, log=workdir / "controller.log")
    extra = {a: ["--data-root", str(root)] for a, root in roots.items()}
    agents = start_agents(ctl, AGENTS, workdir, tunnels=2, extra=extra)
    try:
        ctl.wait_agents(len(AGENTS))
        ctl.identity(Role.JOB, "job1")
        ctl.roots = roots
        yield ctl
    finally:
        stop_all(agents)
        ctl.stop()


def make_tree(root, base: str, n: int, seed: int) -> dict[str, bytes]:
    """n files of 1..200 KB in nested directories under root/base; {relative path: bytes}."""
    rng = random.Random(seed)
    files = {}
    for i in range(n):
        rel = f"d{i % 3}/sub{i % 2}/f{i}.bin" if i % 4 else f"top{i}.bin"
        data = rng.randbytes(rng.randint(1, 200_000))
        path = root / base / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        files[rel] = data
    return files


def run(system, argv: list[str], capsys) -> tuple[int, str, str]:
    base = ["--api", system.api, "--pki", str(system.pki), "--name", "job1"]
    try:
        code = job_cli.main([*base, *argv])
    except SystemExit as exc:
        code = exc.code
    out, err = capsys.readouterr()
    return code, out, err


def client(system):
    return system.client(name="job1")


def test_a_directory_is_sent_with_the_command_line_and_every_sha256_matches(
    system, tmp_path, capsys
):
    src, dst = system.roots["a1"], system.roots["b1"]
    files = make_tree(src, "logs", 12, seed=1)
    job = tmp_path / "dir.json"
    flow = {"id": "logs", "src": "a1", "dst": "b1", "src_path": "logs/", "dst_path": "copy"}
    job.write_text(json.dumps({"flows": [flow]}))
    code, out, err = run(system, ["submit", str(job), "--wait"], capsys)
    assert code == 0, err
    shown = {m[0]: (int(m[1]), m[2]) for m in SHA_LINE.findall(out)}
    assert len(shown) == len(files), out
    for rel, data in files.items():
        assert (dst / "copy" / rel).read_bytes() == data
        assert shown[f"logs/{rel}"] == (len(data), hashlib.sha256(data).hexdigest())
    assert not [p for p in dst.rglob("*") if p.name.endswith((".terra-part", ".digest"))]


def test_a_file_without_bytes_gets_its_size_and_a_missing_one_is_refused(system):
    src, dst = system.roots["a1"], system.roots["b1"]
    data = os.urandom(3_000_001)
    (src / "one.bin").write_bytes(data)
    with client(system) as c:
        cid = c.submit_coflow(
            [{"id": "f", "src": "a1", "dst": "b1", "src_path": "one.bin", "dst_path": "one.bin"}]
        )
        status = c.wait(cid, timeout=60)
        (flow,) = status["flows"]
        assert status["state"] == "done" and flow["bytes"] == len(data)
        assert flow["sha256"] == hashlib.sha256(data).hexdigest()
        assert (dst / "one.bin").read_bytes() == data
        before = {x["id"] for x in c.list_coflows()}
        good = {"id": "g", "src": "a1", "dst": "b1", "src_path": "one.bin", "dst_path": "two"}
        missing = {"id": "m", "src": "a1", "dst": "b1", "src_path": "nope/x.bin"}
        with pytest.raises(TerraError) as info:
            c.submit_coflow([good, missing])
        message = str(info.value)
        assert "nope/x.bin" in message and "\n" not in message, message
        assert {x["id"] for x in c.list_coflows()} == before  # nothing of it was kept


def test_a_glob_expands_into_the_matching_directories_files(system):
    src, dst = system.roots["a1"], system.roots["b1"]
    for day in ("2026-11-01", "2026-11-02", "2026-12-01"):
        make_tree(src, f"days/{day}", 3, seed=hash(day) % 1000)
    with client(system) as c:
        cid = c.submit_coflow([{"id": "nov", "src": "a1", "dst": "b1",
                                "src_path": "days/2026-11-*/", "dst_path": "nov"}])  # fmt: skip
        status = c.wait(cid, timeout=60)
    assert status["state"] == "done"
    assert sorted(os.listdir(dst / "nov")) == ["2026-11-01", "2026-11-02"]
    for f in status["flows"]:
        rel = f["id"].removeprefix("nov/")
        data = (src / "days" / rel).read_bytes()
        assert (dst / "nov" / rel).read_bytes() == data
        assert f["sha256"] == hashlib.sha256(data).hexdigest()


def test_sync_skips_the_files_already_there_and_sends_a_changed_one(system):
    src, dst = system.roots["a1"], system.roots["b1"]
    files = make_tree(src, "data", 6, seed=7)
    flow = {"id": "d", "src": "a1", "dst": "b1", "src_path": "data/", "dst_path": "mirror"}
    with client(system) as c:
        first = c.wait(c.submit_coflow([flow], sync=True), timeout=60)
        assert first["state"] == "done"
        assert not any(f["skipped"] for f in first["flows"])
        changed = next(iter(files))
        (src / "data" / changed).write_bytes(b"new bytes")
        again = c.wait(c.submit_coflow([flow], sync=True), timeout=60)
    assert again["state"] == "done"
    skipped = {f["id"].removeprefix("d/") for f in again["flows"] if f["skipped"]}
    assert skipped == set(files) - {changed}
    for f in again["flows"]:
        rel = f["id"].removeprefix("d/")
        assert f["sha256"] == hashlib.sha256((src / "data" / rel).read_bytes()).hexdigest()
    assert (dst / "mirror" / changed).read_bytes() == b"new bytes"


def test_escapes_and_colliding_destinations_are_refused(system, tmp_path):
    src = system.roots["a1"]
    (src / "esc").mkdir()
    (src / "esc" / "ok.bin").write_bytes(b"x" * 10)
    (tmp_path / "secret").write_bytes(b"secret")
    (src / "esc" / "link.bin").symlink_to(tmp_path / "secret")
    (src / "two").mkdir()
    (src / "two" / "a.bin").write_bytes(b"a" * 10)
    with client(system) as c:
        with pytest.raises(TerraError, match="outside the data root"):
            c.submit_coflow([{"id": "e", "src": "a1", "dst": "b1", "src_path": "esc/"}])
        for bad in ("../x", "/etc/passwd", "a/../../x"):
            with pytest.raises(TerraError) as info:
                c.submit_coflow([{"id": "e", "src": "a1", "dst": "b1", "src_path": bad}])
            assert info.value.code == "bad_request"
        ends = {"src": "a1", "dst": "b1"}
        both = [
            {"id": "p", **ends, "src_path": "two/", "dst_path": "same"},
            {"id": "q", **ends, "src_path": "two/a.bin", "dst_path": "same/a.bin"},
        ]
        with pytest.raises(TerraError, match="both write 'same/a.bin'") as info:
            c.submit_coflow(both)
        assert info.value.code == "path_busy"


def test_an_update_adds_a_directory_of_files(system):
    src, dst = system.roots["a1"], system.roots["b1"]
    files = make_tree(src, "more", 4, seed=11)
    (src / "first.bin").write_bytes(os.urandom(50_000_000))  # ~0.5 s: still running
    with client(system) as c:
        cid = c.submit_coflow([{"id": "first", "src": "a1", "dst": "b1", "bytes": 50_000_000,
                                "src_path": "first.bin", "dst_path": "u/first.bin"}])  # fmt: skip
        c.update_coflow(cid, [{"id": "more", "src": "a1", "dst": "b1", "src_path": "more/",
                               "dst_path": "u/more"}])  # fmt: skip
        status = c.wait(cid, timeout=60)
    assert status["state"] == "done" and len(status["flows"]) == 1 + len(files)
    for rel, data in files.items():
        assert (dst / "u" / "more" / rel).read_bytes() == data
