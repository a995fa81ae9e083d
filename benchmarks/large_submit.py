"""Other jobs' submits while one job submits a very large coflow.

Setup: terra-controller --no-openflow on SWAN with mutual TLS (a fresh PKI) and two agents in
different DCs (hk in HK, ba in BA): fake agents by default (the real control protocol; they
acknowledge every message and never finish a flow, so no bytes move), or with
--agents real two terra-agent processes (synthetic bytes move). Two job certificates:

- job B submits one-flow coflows (hk -> ba, 1 MB) in a loop, one every --b-interval seconds,
  from before job A starts until a second after A's submit returned;
- job A, after --warmup seconds, submits one coflow of --flows flows hk -> ba (--flow-bytes
  each) in one request (--batch N: the first N flows in the submit, the rest in updates of N).

Printed: A's submit time and outcome (the coflow id, or the controller's refusal, or the
client's timeout), B's submit latency before A (median) and during A's submit (median, max,
count, errors; a B submit counts as "during" when it started before A's submit returned
and ended after A's started), the controller's CPU seconds during A's submit and its peak
RSS, the agents' peak RSS with --agents real, and the load average.

Target: while a 100,000-flow submit is handled, other jobs' submits are answered within 1 s.

Run: uv run python benchmarks/large_submit.py [--flows 100000] [--batch 0]
     [--agents {fake,real}] [--json OUT]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

from benchmarks.loopback_system import ControllerProcess, FakeAgent, start_agents, stop_all
from terra_security.pki import Role

JOB_A, JOB_B = "bench-large-job", "bench-small-job"
FAKE = [("hk", "HK"), ("ba", "BA")]
REAL = [("hk1", "HK", "127.0.0.1"), ("ba1", "BA", "127.0.0.1")]  # data_addr = own address
B_BYTES = 1_000_000


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of process `pid` so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss_mb(pid: int) -> float:
    """Resident set size of process `pid` in MB (10^6 bytes); 0 once it is gone."""
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024 / 1e6
    return 0.0


class RssPeaks:
    """Samples the RSS of some processes every 50 ms in a thread; peaks (MB) by name."""

    def __init__(self, pids: dict[str, int]) -> None:
        self.pids = pids
        self.peak = {name: rss_mb(pid) for name, pid in pids.items()}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.05):
            for name, pid in self.pids.items():
                self.peak[name] = max(self.peak[name], rss_mb(pid))

    def stop(self) -> None:
        """Stop sampling."""
        self._stop.set()
        self._thread.join()


class SmallSubmits:
    """Job B: one-flow coflows src -> dst in a thread until stopped.

    Attributes:
        calls: [(start, end, error or None)], monotonic seconds.
    """

    def __init__(self, ctl: ControllerProcess, src: str, dst: str, interval: float,
                 timeout: float) -> None:  # fmt: skip
        self.client = ctl.client(timeout=timeout, name=JOB_B)
        self.flows = [{"id": "f", "src": src, "dst": dst, "bytes": B_BYTES}]
        self.interval = interval
        self.calls: list[tuple[float, float, str | None]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            start, error = time.monotonic(), None
            try:
                self.client.submit_coflow(self.flows)
            except Exception as exc:  # the figure is what happened
                error = f"{type(exc).__name__}: {exc}"[:200]
            self.calls.append((start, time.monotonic(), error))
            self._stop.wait(self.interval)

    def stop(self) -> None:
        """Stop after the call in progress."""
        self._stop.set()
        self._thread.join()
        self.client.close()


def large_submit(ctl: ControllerProcess, src: str, dst: str, args) -> dict:
    """Job A's coflow of args.flows flows; {"s", "coflow" or "error", "request_s" per call}."""
    flows = [{"id": f"f{i}", "src": src, "dst": dst, "bytes": args.flow_bytes}
             for i in range(args.flows)]  # fmt: skip
    batch = args.batch or len(flows)
    out: dict = {"request_s": []}
    start = time.monotonic()
    try:
        with ctl.client(timeout=args.a_timeout, name=JOB_A) as client:
            client.list_coflows()  # connected and said hello before the clock matters
            start = time.monotonic()
            cid = client.submit_coflow(flows[:batch])
            out["request_s"].append(time.monotonic() - start)
            out["coflow"] = cid
            for i in range(batch, len(flows), batch):
                t = time.monotonic()
                client.update_coflow(cid, flows[i : i + batch])
                out["request_s"].append(time.monotonic() - t)
    except (
        Exception
    ) as exc:  # refused, timed out, or too large to send: the figure is what happened
        out["error"] = f"{type(exc).__name__}: {exc}"[:300]
    out["start"], out["end"] = start, time.monotonic()
    out["s"] = out["end"] - start
    return out


def b_figures(calls: list, start: float, end: float) -> dict:
    """Job B's latencies before A's submit and during it (seconds), and errors during it."""
    before = [e - s for s, e, err in calls if e <= start and err is None]
    during = [(e - s, err) for s, e, err in calls if s < end and e > start]
    ok = [d for d, err in during if err is None]
    return {
        "before_median_s": statistics.median(before) if before else None,
        "before_count": len(before),
        "during_count": len(during),
        "during_median_s": statistics.median(ok) if ok else None,
        "during_max_s": max((d for d, _ in during), default=None),
        "during_errors": [err for _, err in during if err is not None],
    }


def start_agents_of(ctl: ControllerProcess, kind: str, workdir: Path):
    """(src, dst agent ids, FakeAgents, Popen list) once both agents registered."""
    if kind == "fake":
        fakes = [FakeAgent(ctl, agent, dc, complete=False) for agent, dc in FAKE]
        ctl.wait_agents(len(fakes))
        return FAKE[0][0], FAKE[1][0], fakes, []
    procs = start_agents(ctl, REAL, workdir)
    ctl.wait_agents(len(REAL))
    return REAL[0][0], REAL[1][0], [], procs


def run(args) -> dict:
    """One measurement (module docstring); returns its figures."""
    workdir = Path(tempfile.mkdtemp(prefix="terra-bench-large-"))
    ctl = ControllerProcess("swan", log=workdir / "controller.log")
    fakes, procs, small = [], [], None
    try:
        ctl.identity(Role.JOB, JOB_A)
        ctl.identity(Role.JOB, JOB_B)
        src, dst, fakes, procs = start_agents_of(ctl, args.agents, workdir)
        pids = {"controller": ctl.proc.pid, **{f"agent {p.args[p.args.index('--id') + 1]}":
                                               p.pid for p in procs}}  # fmt: skip
        rss = RssPeaks(pids)
        rss_before = {name: rss_mb(pid) for name, pid in pids.items()}
        small = SmallSubmits(ctl, src, dst, args.b_interval, args.b_timeout)
        time.sleep(args.warmup)
        cpu0 = cpu_s(ctl.proc.pid)
        a = large_submit(ctl, src, dst, args)
        cpu = cpu_s(ctl.proc.pid) - cpu0
        time.sleep(1.0)
        small.stop()
        rss.stop()
        alive = ctl.proc.poll() is None
        log_tail = (workdir / "controller.log").read_text().splitlines()[-5:]
        return {"flows": args.flows, "batch": args.batch, "agents": args.agents,
                "a": a, "b": b_figures(small.calls, a["start"], a["end"]),
                "controller_cpu_s": cpu, "rss_before_mb": rss_before,
                "rss_peak_mb": rss.peak, "controller_alive": alive,
                "controller_log_tail": log_tail}  # fmt: skip
    finally:
        if small is not None:
            small.stop()
        for f in fakes:
            f.close()
        stop_all(procs)
        ctl.stop()
        shutil.rmtree(workdir, ignore_errors=True)


def report(out: dict) -> None:
    """Print the figures."""
    a, b = out["a"], out["b"]
    how = f"coflow {a['coflow']}" if "error" not in a else f"FAILED: {a['error']}"
    if "error" in a and "coflow" in a:
        how = f"coflow {a['coflow']}, then FAILED: {a['error']}"
    requests = len(a["request_s"])
    print(f"job A: {out['flows']:,} flows in {requests} request(s): {a['s']:.2f} s, {how}")
    if requests > 1:
        print(f"  slowest request {max(a['request_s']):.2f} s")

    def s(x):
        return "-" if x is None else f"{x:.3f} s"

    print(f"job B before A: median {s(b['before_median_s'])} ({b['before_count']} submits)")
    print(f"job B during A's submit: {b['during_count']} submits, median "
          f"{s(b['during_median_s'])}, max {s(b['during_max_s'])}, "
          f"{len(b['during_errors'])} failed (target: every one within 1 s)")  # fmt: skip
    for err in b["during_errors"][:3]:
        print(f"  {err}")
    print(f"controller CPU during A's submit: {out['controller_cpu_s']:.2f} s; "
          f"still running: {out['controller_alive']}")  # fmt: skip
    for name, peak in out["rss_peak_mb"].items():
        print(f"{name} RSS: {out['rss_before_mb'][name]:.1f} MB before, peak {peak:.1f} MB")
    print("load average (1, 5, 15 min): " + ", ".join(f"{x:.2f}" for x in os.getloadavg()))


def main() -> None:
    """Command-line entry point."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--flows", type=int, default=100_000, help="flows of job A's coflow")
    p.add_argument("--flow-bytes", type=int, default=1_000_000)
    p.add_argument("--batch", type=int, default=0,
                   help="flows per request of job A (0: all in one submit)")  # fmt: skip
    p.add_argument("--agents", choices=("fake", "real"), default="fake")
    p.add_argument("--b-interval", type=float, default=0.05, help="seconds between B's submits")
    p.add_argument("--b-timeout", type=float, default=30.0, help="B's client timeout (s)")
    p.add_argument("--a-timeout", type=float, default=120.0, help="A's client timeout (s)")
    p.add_argument("--warmup", type=float, default=2.0, help="seconds of B alone first")
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # run the clean-up below
    out = run(args)
    out["load"] = os.getloadavg()
    report(out)
    if args.json:
        args.json.write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
