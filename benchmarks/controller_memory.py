"""Controller memory after many finished coflows: RSS after 1k and after 100k.

Setup: terra-controller --no-openflow on SWAN with mutual TLS (a fresh PKI), five
fake agents that report every flow complete at once (real control protocol,
no bytes move), one job client. The client submits one-flow coflows (1 MB
between random DC pairs) and, after each checkpoint, waits until the last one
is done; the controller's RSS (VmRSS of its process) is read at each
checkpoint. Target: RSS after 100k finished coflows within 50 MB of
the RSS after 1k (finished coflows are kept for a bounded time/count, then
dropped from memory and only counted).

Run: uv run python benchmarks/controller_memory.py [--coflows 100000] [--checkpoints 1000 10000 ...]
     [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import time
from pathlib import Path

from benchmarks.api_throughput import fake_agents, one_flow
from benchmarks.loopback_system import ControllerProcess


def rss_mb(pid: int) -> float:
    """Resident set size of process `pid` in MB (10^6 bytes)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024 / 1e6
    raise RuntimeError("no VmRSS")


def measure(coflows: int, checkpoints: list[int]) -> dict:
    """Submit `coflows` coflows; RSS (MB) once each checkpoint's coflows are all done."""
    ctl = ControllerProcess("swan")
    agents = fake_agents(ctl, complete=True)
    rng = random.Random(1)
    out = {"rss_mb": {}, "submit_s": {}}
    try:
        client = ctl.client(timeout=60)
        start = time.monotonic()
        submitted, last = 0, None
        for target in sorted(set(checkpoints + [coflows])):
            while submitted < target:
                last = client.submit_coflow(one_flow(rng))
                submitted += 1
            end = time.monotonic() + 120
            while client.check_status(last)["state"] != "done":
                if time.monotonic() > end:
                    raise RuntimeError(f"coflow {last} not done")
                time.sleep(0.05)
            out["rss_mb"][target] = rss_mb(ctl.proc.pid)
            out["submit_s"][target] = time.monotonic() - start
            print(f"{target:>7} finished coflows: RSS {out['rss_mb'][target]:.1f} MB "
                  f"({out['submit_s'][target]:.1f} s)", flush=True)  # fmt: skip
        client.close()
    finally:
        for a in agents:
            a.close()
        ctl.stop()
    return out


def main() -> None:
    """Command-line entry point."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--coflows", type=int, default=100_000)
    p.add_argument("--checkpoints", type=int, nargs="*", default=[1000, 10_000, 30_000])
    p.add_argument("--json", type=Path)
    args = p.parse_args()
    result = measure(args.coflows, args.checkpoints)
    first, last = min(result["rss_mb"]), max(result["rss_mb"])
    growth = result["rss_mb"][last] - result["rss_mb"][first]
    print(f"RSS growth from {first} to {last} finished coflows: {growth:+.1f} MB "
          f"(target <= 50 MB); load average {os.getloadavg()[0]:.2f}")  # fmt: skip
    if args.json:
        args.json.write_text(json.dumps(result | {"growth_mb": growth}, indent=1))


if __name__ == "__main__":
    main()
