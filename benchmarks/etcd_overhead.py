"""What keeping the controller's state in etcd costs: API submits and rounds, side by side.

The same two measurements as benchmarks/api_throughput.py (part 1: one-flow submits and
status calls per second from one client and from --clients clients, fake agents completing
every flow at once; part 2: the live round latency with --coflows FB coflows active), run
--repeats times alternating a controller with its journal in a state directory and one
with `--etcd` on a one-member etcd started here (benchmarks/harness.start_etcd). Each
admission and each end is one etcd transaction; the etcd writes per second are etcd's
revision growth over part 1's submits.

Target (controller HA): with etcd, submit throughput and round latency within 20 % of the
single controller's. Prints medians, the load average and the etcd writes per second.

Run: uv run python benchmarks/etcd_overhead.py [--calls 1000] [--clients 4] [--coflows 60]
     [--rounds 20] [--repeats 3] [--json OUT]
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import statistics
import sys
import tempfile
import urllib.request
from pathlib import Path

from benchmarks.api_throughput import api_rates, round_latency
from benchmarks.harness import start_etcd, stop_processes


def etcd_revision(addr: str) -> int:
    """etcd's current revision (a range request's header)."""
    body = json.dumps({"key": base64.b64encode(b"/").decode()}).encode()
    with urllib.request.urlopen(f"http://{addr}/v3/kv/range", body, timeout=5) as reply:
        return int(json.loads(reply.read())["header"]["revision"])


def measure(args, extra: list[str] | None, etcd: str | None) -> dict:
    """One repeat of both parts under one configuration."""
    before = etcd_revision(etcd) if etcd else 0
    api = api_rates(args.calls, args.clients, extra)
    writes = etcd_revision(etcd) - before if etcd else 0
    rounds = round_latency(args.coflows, args.rounds, extra)
    return {
        "submit_per_s": api["submit_per_s"],
        "concurrent_submit_per_s": api["concurrent_submit_per_s"],
        "status_per_s": api["status_per_s"],
        "round_ms": rounds["live_round_ms_median"],
        "etcd_writes": writes,
        "etcd_writes_per_submit": writes / (2 * args.calls) if etcd else 0.0,
    }


def main(argv: list[str] | None = None) -> int:
    """Run the repeats; print medians and ratios; write --json OUT."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--calls", type=int, default=1000)
    p.add_argument("--clients", type=int, default=4)
    p.add_argument("--coflows", type=int, default=60)
    p.add_argument("--rounds", type=int, default=20)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--json", help="write the figures to this file")
    args = p.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="terra-etcd-bench-"))
    procs, addrs = start_etcd(work)
    runs: dict[str, list[dict]] = {"single": [], "etcd": []}
    load = [os.getloadavg()[0]]
    try:
        for i in range(args.repeats):
            extra = ["--etcd", addrs[0], "--cluster", f"bench{i}"]
            runs["single"].append(measure(args, None, None))
            runs["etcd"].append(measure(args, extra, addrs[0]))
            load.append(os.getloadavg()[0])
    finally:
        stop_processes(procs)
    median = {name: {key: statistics.median(r[key] for r in rs) for key in rs[0]}
              for name, rs in runs.items()}  # fmt: skip
    single, etcd = median["single"], median["etcd"]
    for key in ("submit_per_s", "concurrent_submit_per_s", "status_per_s", "round_ms"):
        print(f"{key}: single {single[key]:.1f}, etcd {etcd[key]:.1f} "
              f"(etcd / single {etcd[key] / single[key]:.2f})")  # fmt: skip
    print(f"etcd writes during {2 * args.calls} submits: {etcd['etcd_writes']:.0f} "
          f"({etcd['etcd_writes_per_submit']:.2f} per submit; at the one-client submit rate "
          f"{etcd['etcd_writes_per_submit'] * etcd['submit_per_s']:.0f} writes/s)")  # fmt: skip
    print(f"load average {min(load):.1f}-{max(load):.1f}; medians of {args.repeats} repeats")
    if args.json:
        Path(args.json).write_text(json.dumps({"runs": runs, "median": median, "load": load}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
