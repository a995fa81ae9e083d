"""What keeping the controller's state in etcd costs: API submits and rounds, side by side.

The same two measurements as benchmarks/api_throughput.py (part 1: one-flow submits and
status calls per second from one client and from --clients clients, fake agents completing
every flow at once; part 2: the live round latency with --coflows FB coflows active, one
round per capacity change), run --repeats times, interleaved, for a controller with its
journal in a state directory ("single") and one with `--etcd` on a one-member etcd started
here (benchmarks/harness.start_etcd) whose data directory is on this machine's disk
("etcd"); with --tmpfs also on an etcd whose data directory is in /dev/shm ("etcd_tmpfs":
the same etcd without a disk's fsync, to show where a transaction's time goes).

Each admission and each end is written to etcd (batched: one transaction carries what is
queued); a submit's reply waits for the transaction that holds its coflow. Per
configuration and repeat it records: the call rates; the controller's and etcd's CPU
seconds over part 1; etcd's writes (revision growth) and writes per second in each phase of
part 1; and, before part 1, the latency of --txns sequential guarded etcd transactions
(each the size of a submit's) on each etcd.

Target (controller HA): with etcd, submit throughput and round latency within 20 % of the
single controller's. One sequential client's submits are bounded by 1 / (1 / single rate +
one transaction's latency); the script prints that bound next to the figure. Prints medians
over the repeats and the load average; --json OUT keeps every run.

Run: uv run python -m benchmarks.etcd_overhead [--calls 1000] [--clients 4] [--coflows 60]
     [--rounds 20] [--repeats 3] [--txns 200] [--tmpfs] [--json OUT]
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import statistics
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from benchmarks.api_throughput import api_rates, round_latency
from benchmarks.harness import start_etcd, stop_processes
from benchmarks.startup_times import cpu_seconds

PHASES = ("submit", "status", "concurrent")


def etcd_revision(addr: str) -> int:
    """etcd's current revision (a range request's header)."""
    body = json.dumps({"key": base64.b64encode(b"/").decode()}).encode()
    with urllib.request.urlopen(f"http://{addr}/v3/kv/range", body, timeout=5) as reply:
        return int(json.loads(reply.read())["header"]["revision"])


def txn_latency_ms(addr: str, txns: int, cluster: str) -> tuple[float, float]:
    """(median wall ms, mean CPU ms of this process) of `txns` sequential guarded
    transactions, each putting the id counter and one coflow's records as a submit does
    (terra_controller/etcd_state.py), on `addr`."""
    from terra_controller.etcd_state import EtcdState, parse_endpoints

    state = EtcdState(parse_endpoints(addr), cluster)
    assert state.campaign({"id": "probe"}, 10) is not None
    records = [{"c": 0, "o": "job", "s": "00" * 16, "fl": [["f", "hk", "la", 10**6, None, None]],
                "at": time.time()}]  # fmt: skip
    times = []
    cpu = time.process_time()
    try:
        for i in range(txns):
            start = time.perf_counter()
            state.write(i + 1, {i: records})
            times.append((time.perf_counter() - start) * 1e3)
        cpu = time.process_time() - cpu
    finally:
        state.resign()
    return statistics.median(times), cpu / txns * 1e3


class Probe:
    """api_rates' `mark`: the time, the controller's and etcd's CPU seconds and etcd's
    revision at each phase boundary."""

    def __init__(self, etcd_addr: str | None, etcd_pid: int | None) -> None:
        self.addr, self.etcd_pid = etcd_addr, etcd_pid
        self.at: dict[str, tuple[float, float, float, int]] = {}

    def __call__(self, phase: str, pid: int) -> None:
        etcd_cpu = cpu_seconds(self.etcd_pid) if self.etcd_pid else 0.0
        revision = etcd_revision(self.addr) if self.addr else 0
        self.at[phase] = (time.perf_counter(), cpu_seconds(pid), etcd_cpu, revision)

    def figures(self, calls: int) -> dict:
        """Per phase: etcd writes and writes/s; over part 1: CPU seconds of each process."""
        out: dict = {}
        previous = self.at["start"]
        for phase in PHASES:
            now = self.at[phase]
            writes = now[3] - previous[3]
            out[f"etcd_writes_{phase}"] = writes
            out[f"etcd_writes_per_s_{phase}"] = writes / (now[0] - previous[0])
            previous = now
        first, last = self.at["start"], self.at[PHASES[-1]]
        out["controller_cpu_s"] = last[1] - first[1]
        out["etcd_cpu_s"] = last[2] - first[2]
        out["etcd_writes_per_submit"] = (
            out["etcd_writes_submit"] + out["etcd_writes_concurrent"]
        ) / (2 * calls)
        return out


def measure(args, etcd: tuple[str, int] | None, cluster: str) -> dict:
    """One repeat of both parts for one configuration (`etcd`: (address, pid) or None)."""
    extra = ["--etcd", etcd[0], "--cluster", cluster] if etcd else None
    out: dict = {"load": os.getloadavg()[0]}
    if etcd:
        out["txn_ms"], out["txn_cpu_ms"] = txn_latency_ms(etcd[0], args.txns, cluster + "-probe")
    probe = Probe(*(etcd or (None, None)))
    api = api_rates(args.calls, args.clients, extra, mark=probe)
    rounds = round_latency(args.coflows, args.rounds, extra)
    out |= {key: api[key] for key in ("submit_per_s", "concurrent_submit_per_s", "status_per_s")}
    out |= probe.figures(args.calls)
    out["round_ms"] = rounds["live_round_ms_median"]
    return out


def report(median: dict, repeats: int, load: list[float]) -> None:
    """Print the medians, the ratios to the single controller and the sequential bound."""
    single = median["single"]
    for name, m in median.items():
        if name == "single":
            continue
        print(f"-- {name}")
        for key in ("submit_per_s", "concurrent_submit_per_s", "status_per_s", "round_ms"):
            print(f"{key}: single {single[key]:.1f}, {name} {m[key]:.1f} "
                  f"({name} / single {m[key] / single[key]:.2f})")  # fmt: skip
        bound = 1 / (1 / single["submit_per_s"] + m["txn_ms"] / 1e3)
        print(f"one etcd transaction {m['txn_ms']:.2f} ms ({m['txn_cpu_ms']:.2f} CPU ms): "
              f"one client's submits bounded by {bound:.0f}/s "
              f"({bound / single['submit_per_s']:.2f} of single)")  # fmt: skip
        print(f"etcd writes/s: one client {m['etcd_writes_per_s_submit']:.0f}, "
              f"{m['etcd_writes_per_s_concurrent']:.0f} with concurrent clients; "
              f"{m['etcd_writes_per_submit']:.2f} per submit")  # fmt: skip
    for name, m in median.items():
        print(f"CPU s over part 1, {name}: controller {m['controller_cpu_s']:.2f}, "
              f"etcd {m['etcd_cpu_s']:.2f}")  # fmt: skip
    print(f"load average {min(load):.1f}-{max(load):.1f}; medians of {repeats} repeats")


def txns_only(etcds: dict[str, tuple[str, int]], txns: int, repeats: int) -> int:
    """Print the median over `repeats` of each etcd's transaction wall and CPU ms."""
    load = [os.getloadavg()[0]]
    got: dict[str, list[tuple[float, float]]] = {name: [] for name in etcds}
    for i in range(repeats):
        for name, (addr, _) in etcds.items():
            got[name].append(txn_latency_ms(addr, txns, f"txn{i}"))
        load.append(os.getloadavg()[0])
    for name, runs in got.items():
        wall = statistics.median(r[0] for r in runs)
        cpu = statistics.median(r[1] for r in runs)
        print(f"{name}: one transaction {wall:.2f} ms, {cpu:.2f} CPU ms in the client")
    print(f"load average {min(load):.1f}-{max(load):.1f}; medians of {repeats} x {txns}")
    return 0


def main(argv: list[str] | None = None) -> int:
    """Run the repeats interleaved; print medians and ratios; write --json OUT."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--calls", type=int, default=1000)
    p.add_argument("--clients", type=int, default=4)
    p.add_argument("--coflows", type=int, default=60)
    p.add_argument("--rounds", type=int, default=20)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--txns", type=int, default=200, help="timed etcd transactions per repeat")
    p.add_argument("--tmpfs", action="store_true", help="also an etcd with its data in /dev/shm")
    p.add_argument("--txns-only", action="store_true",
                   help="only the transactions' latency and CPU, --repeats times")  # fmt: skip
    p.add_argument("--json", help="write the figures to this file")
    args = p.parse_args(argv)
    etcds: dict[str, tuple[str, int]] = {}
    procs = []
    dirs = {"etcd": None, "etcd_tmpfs": "/dev/shm"} if args.tmpfs else {"etcd": None}
    try:
        for name, base in dirs.items():
            work = Path(tempfile.mkdtemp(prefix="terra-etcd-bench-", dir=base))
            started, addrs = start_etcd(work)
            procs += started
            etcds[name] = (addrs[0], started[0].pid)
        runs: dict[str, list[dict]] = {"single": [], **{name: [] for name in etcds}}
        load = [os.getloadavg()[0]]
        if args.txns_only:
            return txns_only(etcds, args.txns, args.repeats)
        for i in range(args.repeats):
            runs["single"].append(measure(args, None, ""))
            for name, etcd in etcds.items():
                runs[name].append(measure(args, etcd, f"bench{i}"))
            load.append(os.getloadavg()[0])
    finally:
        stop_processes(procs)
    median = {name: {key: statistics.median(r[key] for r in rs) for key in rs[0]}
              for name, rs in runs.items()}  # fmt: skip
    report(median, args.repeats, load)
    if args.json:
        Path(args.json).write_text(json.dumps({"runs": runs, "median": median, "load": load}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
