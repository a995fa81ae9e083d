"""Concurrent coflow submits from one asyncio event loop (AsyncTerraClient), all answered.

terra-controller --no-openflow on SWAN with five fake agents (the real control protocol;
they report every flow complete at once, so no bytes move). One AsyncTerraClient (one
mutual-TLS connection, one event loop, no thread per call) submits --submits one-flow
coflows (1 MB between random DC pairs) all at once with asyncio.gather, then asks the
status of each, again all at once. Printed per run: the wall time of the submits and of
the status calls, calls per second, whether every call was answered (distinct ids, one
status per id), and the threads of this process during the calls; then the medians over
--runs runs and the load average. For comparison, the blocking TerraClient's sequential
submit rate on the same controller.

Run: uv run python benchmarks/async_submits.py [--submits 1000] [--runs 3] [--json OUT]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import sys
import threading
import time
from pathlib import Path

from benchmarks.api_throughput import fake_agents, one_flow
from benchmarks.loopback_system import OPERATOR, ControllerProcess
from terra_controller.async_client import AsyncTerraClient


async def one_run(ctl: ControllerProcess, submits: int, seed: int) -> dict:
    """Submit `submits` coflows concurrently, then their statuses; the figures of one run."""
    rng = random.Random(seed)
    flows = [one_flow(rng) for _ in range(submits)]
    host, port = ctl.api_addr
    async with AsyncTerraClient(host, port, pki=ctl.pki, name=OPERATOR, timeout=120) as c:
        await c.list_agents()  # connect first: the figures are of the calls alone
        threads = threading.active_count()
        start = time.perf_counter()
        ids = await asyncio.gather(*(c.submit_coflow(f) for f in flows))
        submit_s = time.perf_counter() - start
        threads_during = threading.active_count()
        start = time.perf_counter()
        statuses = await asyncio.gather(*(c.check_status(cid) for cid in ids))
        status_s = time.perf_counter() - start
    answered = len(set(ids)) == submits and all(cid >= 0 for cid in ids)
    answered = answered and [s["id"] for s in statuses] == ids
    return {
        "submits": submits,
        "submit_s": submit_s,
        "submit_per_s": submits / submit_s,
        "status_s": status_s,
        "status_per_s": submits / status_s,
        "all_answered": answered,
        "threads_added_during_calls": threads_during - threads,
    }


def blocking_rate(ctl: ControllerProcess, calls: int) -> float:
    """Sequential submits per second of one blocking TerraClient."""
    rng = random.Random(7)
    with ctl.client() as client:
        client.list_agents()
        start = time.perf_counter()
        for _ in range(calls):
            client.submit_coflow(one_flow(rng))
        return calls / (time.perf_counter() - start)


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark; print the figures; write --json OUT."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--submits", type=int, default=1000, help="concurrent submits per run")
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--json", help="write the figures to this file")
    args = p.parse_args(argv)
    ctl = ControllerProcess("swan", extra=["--keep-finished", str(4 * args.submits * args.runs)])
    agents = fake_agents(ctl, complete=True)
    try:
        runs = []
        for i in range(args.runs):
            run = asyncio.run(one_run(ctl, args.submits, i))
            runs.append(run)
            print(f"run {i + 1}: {args.submits} concurrent submits in {run['submit_s']:.2f} s "
                  f"({run['submit_per_s']:.0f}/s), statuses in {run['status_s']:.2f} s "
                  f"({run['status_per_s']:.0f}/s); all answered: {run['all_answered']}; "
                  f"threads added: {run['threads_added_during_calls']}", flush=True)  # fmt: skip
        blocking = blocking_rate(ctl, min(args.submits, 500))
    finally:
        for a in agents:
            a.close()
        ctl.stop()
    load = os.getloadavg()
    summary = {
        "runs": runs,
        "submit_s_median": statistics.median(r["submit_s"] for r in runs),
        "submit_per_s_median": statistics.median(r["submit_per_s"] for r in runs),
        "status_per_s_median": statistics.median(r["status_per_s"] for r in runs),
        "all_answered": all(r["all_answered"] for r in runs),
        "blocking_sequential_submit_per_s": blocking,
        "load_average": load,
    }
    print(f"median: {args.submits} concurrent submits in {summary['submit_s_median']:.2f} s "
          f"({summary['submit_per_s_median']:.0f}/s), statuses "
          f"{summary['status_per_s_median']:.0f}/s; all answered in every run: "
          f"{summary['all_answered']}; blocking client, sequential: {blocking:.0f} submits/s; "
          f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")  # fmt: skip
    if args.json:
        Path(args.json).write_text(json.dumps(summary, indent=1))
    return 0 if summary["all_answered"] else 1


if __name__ == "__main__":
    sys.exit(main())
