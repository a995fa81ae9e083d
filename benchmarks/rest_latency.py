"""REST answer times of the operator console's routes with 10,000 finished coflows kept.

Setup (as benchmarks/metrics_scrape.py): terra-controller --no-openflow on SWAN with mutual
TLS (a fresh PKI) and --keep-finished equal to --coflows, five fake agents that report every
flow complete at once (real control protocol, no bytes move), one job client submitting
one-flow coflows of 1 MB between random DC pairs, and one more coflow left running (its
receiver does not complete it). Once all the others are done, an operator GETs every route
the page polls (and the other JSON routes) --gets times each, one connection per GET as a
browser after an idle second may; the time is the wall time of one GET (TCP connect, TLS
handshake with the operator certificate, request, whole body).

Target: every route's median under 50 ms (TARGET_S).

Run: uv run python benchmarks/rest_latency.py [--coflows 10000] [--gets 30] [--routes R,...]
    [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

from benchmarks.api_throughput import AGENT_OF, fake_agents
from benchmarks.loopback_system import ControllerProcess, FakeAgent
from benchmarks.metrics_scrape import fill, timed_get

TARGET_S = 0.050
ROUTES = ["/", "/status", "/topology", "/links", "/tunnels", "/coflows?finished=200",
          "/coflows/{running}", "/coflows/{done}", "/agents", "/events?since={last}",
          "/events", "/metrics", "/coflows"]  # fmt: skip


def measure(coflows: int, gets: int) -> dict:
    """Fill the history, then time `gets` GETs of every route in ROUTES."""
    ctl = ControllerProcess("swan", extra=["--keep-finished", str(coflows)])
    agents = fake_agents(ctl, complete=True)
    sink = None
    try:
        fill_s = fill(ctl, coflows)
        sink = FakeAgent(ctl, "sink", "BA", complete=False)
        ctl.wait_agents(len(agents) + 1)
        client = ctl.client()
        running = client.submit_coflow([{"id": "r", "src": AGENT_OF["HK"], "dst": "sink",
                                         "bytes": 10**12}])  # fmt: skip
        client.close()
        last = ctl.get("/events?since=0")["last"] if "/events" in ROUTES else 0
        ids = {"running": running, "done": running - 1, "last": max(0, last - 5)}
        rows = {}
        for route in ROUTES:
            path = route.format(**ids)
            timed_get(ctl, path)  # warm-up
            times, size = [], 0
            for _ in range(gets):
                elapsed, body = timed_get(ctl, path)
                times.append(elapsed)
                size = len(body)
                time.sleep(0.01)
            rows[route] = {"median_ms": statistics.median(times) * 1e3,
                           "p95_ms": sorted(times)[int(0.95 * (len(times) - 1))] * 1e3,
                           "bytes": size}  # fmt: skip
        status = ctl.get("/status")
        return {"coflows": coflows, "fill_s": fill_s, "gets": gets, "routes": rows,
                "in_memory": sum(status["coflows"].values()),
                "loadavg": os.getloadavg()}  # fmt: skip
    finally:
        for agent in [*agents, *([sink] if sink else [])]:
            agent.close()
        ctl.stop()


def main() -> None:
    """Run `measure`, print a table of medians / p95 per route and the load average."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--coflows", type=int, default=10_000)
    p.add_argument("--gets", type=int, default=30)
    p.add_argument("--routes", help="comma-separated subset of ROUTES (default: all)")
    p.add_argument("--json", type=Path)
    args = p.parse_args()
    if args.routes:
        ROUTES[:] = [r for r in ROUTES if r in args.routes.split(",")]
    print(f"load average before: {os.getloadavg()}")
    result = measure(args.coflows, args.gets)
    print(f"{result['coflows']} coflows done in {result['fill_s']:.1f} s; "
          f"{result['in_memory']} in memory")  # fmt: skip
    print(f"{'route':28} {'median ms':>10} {'p95 ms':>8} {'bytes':>9}")
    for route, row in result["routes"].items():
        flag = "" if row["median_ms"] < TARGET_S * 1e3 else "  over target"
        print(f"{route:28} {row['median_ms']:10.2f} {row['p95_ms']:8.2f} {row['bytes']:9d}{flag}")
    print(f"load average after: {result['loadavg']}")
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
