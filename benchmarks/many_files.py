"""A directory of many small files as one coflow: the time per file beyond its bytes.

Setup: terra-controller --no-openflow on a two-DC topology (A, B; one link of --rate-mbs MB/s
each way, --k 1 tunnel) with mutual TLS, two terra-agent processes on loopback (a1 in A,
b1 in B) with their own data roots under --workdir. A seeded tree of --files files (sizes
log-uniform in 1 KiB..1 MiB, in directories of 100) is written to a1's root once (reused
by later runs with the same seed and count); each run submits it as one coflow
({"src_path": "tree/", "dst_path": "copy-N"}, no bytes given) and waits for it.

Printed per run and as the median of --runs: the submit time (the sender lists 10,000
files), the CCT, the bytes' time at the coflow's rate (total bytes / the link capacity, the
rate the scheduler gives the coflow's one FlowGroup), and the overhead per file
(CCT - bytes' time) / files; the CPU seconds (user + system) the controller and each agent
spent from the submit to the end; every file's sha256 in the status is checked against
hashlib's of the source (a mismatch exits 1), and the load average. The run waits by polling
the coflow list twice a second and reads the per-flow status once, at the end.

Target: <= 5 ms per file beyond its bytes.

Run: uv run python benchmarks/many_files.py [--files 10000] [--runs 3] [--rate-mbs 200]
     [--json OUT]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import random
import shutil
import statistics
import sys
import time
from pathlib import Path

from benchmarks.loopback_system import ControllerProcess, start_agents, stop_all
from terra_controller.client import FINAL
from terra_security.pki import Role

AGENTS = [("a1", "A", "127.0.0.41"), ("b1", "B", "127.0.0.42")]
JOB = "bench-files-job"


def make_tree(root: Path, files: int, seed: int) -> dict[str, str]:
    """Write the seeded tree under root/tree (unless a complete one is there); returns
    {path relative to the data root: sha256 hex}."""
    rng = random.Random(seed)
    sizes = [int(math.exp(rng.uniform(math.log(1024), math.log(1 << 20)))) for _ in range(files)]
    marker = root / f".tree-{files}-{seed}"
    shas = {}
    for i, size in enumerate(sizes):
        rel = f"tree/d{i // 100:03d}/f{i:05d}.bin"
        path = root / rel
        if not marker.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(rng.randbytes(size))
        shas[rel] = hashlib.sha256(path.read_bytes()).hexdigest()
    marker.touch()
    return shas


def cpu_seconds(procs: dict[str, int]) -> dict[str, float]:
    """{name: user + system CPU seconds so far} of the processes {name: pid} (/proc)."""
    tick = os.sysconf("SC_CLK_TCK")
    out = {}
    for name, pid in procs.items():
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        out[name] = (int(fields[11]) + int(fields[12])) / tick
    return out


def wait_final(client, cid: int, timeout_s: float, poll_s: float = 0.5) -> None:
    """Poll the coflow list (one summary row per coflow, not a row per flow: a full status
    of 10,000 flows every poll would load the controller and this process) until coflow
    `cid` is final."""
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        row = next((c for c in client.list_coflows() if c["id"] == cid), None)
        if row is not None and row["state"] in FINAL:
            return
        time.sleep(poll_s)
    raise SystemExit(f"coflow {cid} not final after {timeout_s} s")


def one_run(ctl: ControllerProcess, procs: dict[str, int], n: int, shas: dict[str, str],
            rate: float) -> dict:  # fmt: skip
    """Submit the tree once, wait, check every sha256; the run's figures, with the CPU
    seconds the processes {name: pid} spent during it."""
    flow = {"id": "t", "src": "a1", "dst": "b1", "src_path": "tree/", "dst_path": f"copy-{n}"}
    cpu0 = cpu_seconds(procs)
    with ctl.client(timeout=600, name=JOB) as client:
        t0 = time.monotonic()
        cid = client.submit_coflow([flow])
        submitted = time.monotonic() - t0
        wait_final(client, cid, timeout_s=3600)
        status = client.check_status(cid)  # every flow's row: once, at the end
    cpu = {k: v - cpu0[k] for k, v in cpu_seconds(procs).items()}
    if status["state"] != "done":
        raise SystemExit(f"coflow {cid} {status['state']}: {status.get('reason')}")
    got = {f["id"].removeprefix("t/"): f["sha256"] for f in status["flows"]}
    want = {rel.removeprefix("tree/"): sha for rel, sha in shas.items()}
    bad = [rel for rel in want if got.get(rel) != want[rel]]
    if bad or len(got) != len(want):
        raise SystemExit(f"sha256 mismatch or missing files: {bad[:5]} ({len(bad)} in all)")
    total = status["bytes_total"]
    cct = status["cct_s"]
    bytes_s = total / rate
    return {"files": len(got), "bytes": total, "submit_s": submitted, "cct_s": cct,
            "bytes_s": bytes_s, "per_file_ms": (cct - bytes_s) / len(got) * 1000,
            "cpu_s": cpu, "load": os.getloadavg()}  # fmt: skip


def main() -> None:
    """Run the benchmark (see the module docstring)."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--files", type=int, default=10_000)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--rate-mbs", type=float, default=200.0, help="link capacity, MB/s")
    p.add_argument("--workdir", type=Path, default=Path("/var/tmp/terra-many-files"))
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args()
    rate = args.rate_mbs * 1e6
    work = args.workdir
    roots = {a: work / f"root-{a}" for a, _, _ in AGENTS}
    for root in roots.values():
        root.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(roots["b1"], ignore_errors=True)
    roots["b1"].mkdir()
    shas = make_tree(roots["a1"], args.files, args.seed)
    topo = work / "pair.json"
    topo.write_text(json.dumps({"name": "pair", "dcs": ["A", "B"],
                                "default_capacity_gbps": rate * 8 / 1e9,
                                "links": [{"a": "A", "b": "B"}]}))  # fmt: skip
    ctl = ControllerProcess(str(topo), k=1, log=work / "controller.log")
    extra = {a: ["--data-root", str(root)] for a, root in roots.items()}
    agents = start_agents(ctl, AGENTS, work, tunnels=2, extra=extra)
    runs = []
    procs = {"controller": ctl.proc.pid}
    procs.update({a: p.pid for (a, _, _), p in zip(AGENTS, agents, strict=True)})
    try:
        ctl.wait_agents(len(AGENTS))
        ctl.identity(Role.JOB, JOB)
        for n in range(args.runs):
            run = one_run(ctl, procs, n, shas, rate)
            runs.append(run)
            print(
                f"run {n}: {run['files']} files, {run['bytes'] / 1e6:.1f} MB: submit "
                f"{run['submit_s']:.2f} s, CCT {run['cct_s']:.2f} s, bytes at "
                f"{args.rate_mbs:.0f} MB/s {run['bytes_s']:.2f} s, overhead "
                f"{run['per_file_ms']:.2f} ms/file; CPU s "
                + ", ".join(f"{k} {v:.1f}" for k, v in run["cpu_s"].items())
                + f"; load {run['load'][0]:.2f}",
                flush=True,
            )
            shutil.rmtree(roots["b1"] / f"copy-{n}", ignore_errors=True)
    finally:
        stop_all(agents)
        ctl.stop()
    med = {k: statistics.median(r[k] for r in runs) for k in ("submit_s", "cct_s", "per_file_ms")}
    med["cpu_s"] = {k: statistics.median(r["cpu_s"][k] for r in runs) for k in procs}
    print(f"median of {len(runs)}: submit {med['submit_s']:.2f} s, CCT {med['cct_s']:.2f} s, "
          f"overhead {med['per_file_ms']:.2f} ms per file beyond its bytes at "
          f"{args.rate_mbs:.0f} MB/s (target <= 5 ms); CPU s "
          + ", ".join(f"{k} {v:.1f}" for k, v in med["cpu_s"].items())
          + "; every sha256 matched")  # fmt: skip
    print("load average (1, 5, 15 min): " + ", ".join(f"{x:.2f}" for x in os.getloadavg()))
    if args.json:
        args.json.write_text(json.dumps({"runs": runs, "median": med, "args": vars(args)},
                                        default=str, indent=1))  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
