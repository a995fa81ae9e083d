"""/metrics scrape time with 100k finished coflows in the controller's history.

Setup (as benchmarks/controller_memory.py): terra-controller --no-openflow on SWAN
with mutual TLS (a fresh PKI) and --keep-finished equal to --coflows (every finished
coflow stays in memory: the worst case for a view that walked them), five fake agents
that report every flow complete at once (real control protocol, no bytes move), one
job client submitting one-flow coflows of 1 MB between random DC pairs. Once all are
done, an operator scrapes /metrics over HTTPS --scrapes times, one connection per
scrape as Prometheus does after an idle interval; the scrape time is the wall time of
one GET (TCP connect, TLS handshake with the operator certificate, request, whole
body). For comparison the same is measured for /status and for /coflows (which lists
every coflow in memory).

Target: median /metrics scrape time under 50 ms.

Run: uv run python benchmarks/metrics_scrape.py [--coflows 100000] [--scrapes 50] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import time
import urllib.request
from pathlib import Path

from benchmarks.api_throughput import fake_agents, one_flow
from benchmarks.loopback_system import ControllerProcess

TARGET_S = 0.050


def timed_get(ctl: ControllerProcess, path: str) -> tuple[float, bytes]:
    """(seconds, body) of one GET on a new HTTPS connection."""
    start = time.perf_counter()
    with urllib.request.urlopen(ctl.rest + path, timeout=30, context=ctl.rest_tls) as reply:
        body = reply.read()
    return time.perf_counter() - start, body


def fill(ctl: ControllerProcess, coflows: int) -> float:
    """Submit `coflows` one-flow coflows and wait until the last is done; returns seconds."""
    rng = random.Random(1)
    client = ctl.client(timeout=60)
    start = time.monotonic()
    last = None
    for i in range(coflows):
        last = client.submit_coflow(one_flow(rng))
        if (i + 1) % 20_000 == 0:
            print(f"{i + 1:>7} submitted ({time.monotonic() - start:.0f} s)", flush=True)
    end = time.monotonic() + 120
    while client.check_status(last)["state"] != "done":
        if time.monotonic() > end:
            raise RuntimeError(f"coflow {last} not done")
        time.sleep(0.05)
    client.close()
    return time.monotonic() - start


def measure(coflows: int, scrapes: int) -> dict:
    """Fill the history, then time `scrapes` /metrics and 5 /status GETs."""
    ctl = ControllerProcess("swan", extra=["--keep-finished", str(coflows)])
    agents = fake_agents(ctl, complete=True)
    try:
        fill_s = fill(ctl, coflows)
        timed_get(ctl, "/metrics")  # warm-up
        times, body = [], b""
        for _ in range(scrapes):
            elapsed, body = timed_get(ctl, "/metrics")
            times.append(elapsed)
            time.sleep(0.02)
        text = body.decode()
        finished = sum(
            float(line.rsplit(" ", 1)[1])
            for line in text.splitlines()
            if line.startswith("terra_coflows_finished_total{")
        )
        status_times = [timed_get(ctl, "/status")[0] for _ in range(5)]
        coflows_times = [timed_get(ctl, "/coflows")[0] for _ in range(3)]
    finally:
        for a in agents:
            a.close()
        ctl.stop()
    return {
        "coflows": coflows,
        "finished_counted": finished,
        "fill_s": fill_s,
        "scrape_s": times,
        "median_scrape_s": statistics.median(times),
        "max_scrape_s": max(times),
        "metrics_bytes": len(body),
        "median_status_s": statistics.median(status_times),
        "median_coflows_s": statistics.median(coflows_times),
        "load_average": os.getloadavg(),
    }


def main() -> None:
    """Command-line entry point."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--coflows", type=int, default=100_000)
    p.add_argument("--scrapes", type=int, default=50)
    p.add_argument("--json", type=Path)
    args = p.parse_args()
    r = measure(args.coflows, args.scrapes)
    load = r["load_average"]
    print(
        f"{r['coflows']} finished coflows in memory ({r['finished_counted']:.0f} counted by "
        f"terra_coflows_finished_total; filled in {r['fill_s']:.0f} s)\n"
        f"/metrics: median scrape {r['median_scrape_s'] * 1e3:.1f} ms, max "
        f"{r['max_scrape_s'] * 1e3:.1f} ms over {len(r['scrape_s'])} scrapes, "
        f"{r['metrics_bytes']} bytes (target < {TARGET_S * 1e3:.0f} ms: "
        f"{'met' if r['median_scrape_s'] < TARGET_S else 'MISSED'})\n"
        f"/status: median {r['median_status_s'] * 1e3:.1f} ms; /coflows (every coflow): "
        f"median {r['median_coflows_s'] * 1e3:.1f} ms\n"
        f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} (2 cores, shared)"
    )
    if args.json:
        args.json.write_text(json.dumps(r, indent=1))


if __name__ == "__main__":
    main()
