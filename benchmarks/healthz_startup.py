"""How soon a controller answers REST /healthz after it is started: lone, leader, standby.

Each trial spawns `python -m terra_controller.cli --topology swan --no-openflow` (mutual
TLS, a fresh PKI) and polls https://127.0.0.1:REST/healthz (no client certificate: /healthz
is public) every 10 ms until it answers with the role wanted:

- single: a lone controller with a --state-dir (role "single");
- leader: the first controller of a new cluster on a one-member etcd started here; timed
  twice: its first answer ("first", role "standby": it serves as a standby while it builds
  its scheduler and campaigns) and its first answer as "leader" (elected, state loaded,
  scheduler made, serving);
- standby: a second controller of that cluster while the first leads (role "standby").

Target (controller HA): every one answers within 3 s of its start (median of --repeats).
Prints, per kind, the median and the slowest wall seconds from spawn to the answer, the
CPU seconds the process used by then, and the load average before and after. One untimed
trial first writes the bytecode caches.

Run: uv run python -m benchmarks.healthz_startup [--repeats 5] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import os
import ssl
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from benchmarks.harness import free_port, start_etcd, stop_processes
from benchmarks.startup_times import cpu_seconds
from terra_security.pki import init_ca

POLL_S = 0.01
TIMEOUT_S = 60.0


def spawn(pki: Path, work: Path, etcd: str | None, cluster: str) -> tuple[subprocess.Popen, int]:
    """Start one controller; returns (process, its REST port)."""
    rest = free_port()
    args = [sys.executable, "-m", "terra_controller.cli", "--topology", "swan",
            "--no-openflow", "--pki", str(pki), "--log-level", "WARNING",
            "--api", f"127.0.0.1:{free_port()}", "--agents", f"127.0.0.1:{free_port()}",
            "--rest", f"127.0.0.1:{rest}"]  # fmt: skip
    if etcd:
        args += ["--etcd", etcd, "--cluster", cluster]
    else:
        args += ["--state-dir", tempfile.mkdtemp(prefix="state-", dir=work)]
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return proc, rest


def time_to_role(
    proc: subprocess.Popen, rest: int, context, role: str | None, start: float | None = None
) -> tuple[float, float]:
    """(wall s since `start` (default now), CPU s of `proc`) when /healthz first answers
    with `role` (None: any role)."""
    start = time.perf_counter() if start is None else start
    url = f"https://127.0.0.1:{rest}/healthz"
    while time.perf_counter() - start < TIMEOUT_S:
        try:
            with urllib.request.urlopen(url, timeout=1, context=context) as reply:
                if role is None or json.loads(reply.read()).get("role") == role:
                    return time.perf_counter() - start, cpu_seconds(proc.pid)
        except OSError:
            pass
        if proc.poll() is not None:
            raise RuntimeError(f"the controller exited with status {proc.returncode}")
        time.sleep(POLL_S)
    raise TimeoutError(f"no /healthz answer with role {role} within {TIMEOUT_S} s")


def trial(pki: Path, work: Path, etcd: str, context, n: int) -> dict[str, tuple[float, float]]:
    """One lone controller, then a leader and a standby of cluster `hz{n}`."""
    out = {}
    proc, rest = spawn(pki, work, None, "")
    try:
        out["single"] = time_to_role(proc, rest, context, "single")
    finally:
        stop_processes([proc])
    start = time.perf_counter()
    leader, rest = spawn(pki, work, etcd, f"hz{n}")
    procs = [leader]
    try:
        out["leader, first answer"] = time_to_role(leader, rest, context, None, start)
        out["leader"] = time_to_role(leader, rest, context, "leader", start)
        standby, rest = spawn(pki, work, etcd, f"hz{n}")
        procs.append(standby)
        out["standby"] = time_to_role(standby, rest, context, "standby")
    finally:
        stop_processes(procs)
    return out


def main(argv: list[str] | None = None) -> int:
    """Run the trials; print medians; write --json OUT."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--json", help="write the figures to this file")
    args = p.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="terra-healthz-"))
    pki = work / "pki"
    init_ca(pki)
    context = ssl.create_default_context(cafile=str(pki / "ca.crt"))
    context.check_hostname = False  # dials 127.0.0.1; the CA is still verified
    etcd_procs, addrs = start_etcd(work)
    load = [os.getloadavg()[0]]
    runs: list[dict] = []
    try:
        trial(pki, work, addrs[0], context, -1)  # untimed: bytecode caches
        for n in range(args.repeats):
            runs.append(trial(pki, work, addrs[0], context, n))
            load.append(os.getloadavg()[0])
    finally:
        stop_processes(etcd_procs)
    summary = {}
    for kind in ("single", "leader, first answer", "leader", "standby"):
        walls = [r[kind][0] for r in runs]
        cpus = [r[kind][1] for r in runs]
        summary[kind] = {"wall_s_median": statistics.median(walls), "wall_s_max": max(walls),
                         "cpu_s_median": statistics.median(cpus)}  # fmt: skip
        s = summary[kind]
        print(f"{kind}: /healthz after {s['wall_s_median']:.2f} s median (slowest "
              f"{s['wall_s_max']:.2f} s), {s['cpu_s_median']:.2f} CPU s; target 3 s")  # fmt: skip
    print(f"load average {min(load):.1f}-{max(load):.1f}; {args.repeats} trials")
    if args.json:
        Path(args.json).write_text(json.dumps({"runs": runs, "summary": summary, "load": load}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
