"""Coflow API calls per second, and a round's latency in the live controller vs offline.

Part 1 (API): terra-controller --no-openflow on SWAN with five fake agents (real
control protocol, they report every flow complete at once, so no bytes move and
the active set stays small). One TerraClient submits --calls one-flow coflows
(1 MB between random DC pairs), then asks checkStatus --calls times; then
--clients clients submit concurrently. Each figure is calls per second on loopback.

Part 2 (round latency): a fresh controller gets the first --coflows coflows of the
FB trace on SWAN (1 Gbps links, fake agents that never finish anything, so the
active set is fixed). Then --rounds times the operator halves or restores the
capacity of HK-LA (a change beyond δ: exactly one round each, waited for). The
same rounds are replayed offline: a TerraPolicy gets the same coflows and the
same capacity changes and `allocate` is timed the way the simulator calls it.
Target: the live controller's round latency within 20% of the offline one.

Run: uv run python benchmarks/api_throughput.py [--calls 2000] [--clients 4] [--coflows 60]
     [--rounds 20] [--json OUT] [--record LOG (the controller records its core events)]
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import statistics
import sys
import threading
import time
from pathlib import Path

from benchmarks.loopback_system import ControllerProcess, FakeAgent
from terra_core.terra_policy import TerraPolicy
from terra_model import Coflow, Flow
from topologies import GBPS_TO_BYTES_PER_S, load_topology
from workloads import load_workload

DCS = ["HK", "LA", "NY", "FL", "BA"]
AGENT_OF = {dc: dc.lower() for dc in DCS}


def fake_agents(ctl: ControllerProcess, complete: bool) -> list[FakeAgent]:
    """One fake agent per SWAN DC, registered."""
    agents = [FakeAgent(ctl, AGENT_OF[dc], dc, complete) for dc in DCS]
    ctl.wait_agents(len(agents))
    return agents


def one_flow(rng: random.Random) -> list[dict]:
    """A one-flow coflow of 1 MB between two random distinct DCs."""
    src, dst = rng.sample(DCS, 2)
    return [{"id": "f", "src": AGENT_OF[src], "dst": AGENT_OF[dst], "bytes": 1_000_000}]


def api_rates(calls: int, clients: int, extra: list[str] | None = None, mark=None) -> dict:
    """Part 1: submit/status calls per second (one client, then `clients` concurrently);
    `extra`: more terra-controller arguments (e.g. --etcd ...); `mark(phase, pid)`, when
    given, is called with the controller's pid at the start ("start") and the end of each
    phase ("submit", "status", "concurrent")."""
    ctl = ControllerProcess("swan", extra=extra)
    agents = fake_agents(ctl, complete=True)
    rng = random.Random(1)
    mark = mark or (lambda phase, pid: None)
    try:
        client = ctl.client()
        mark("start", ctl.proc.pid)
        start = time.perf_counter()
        ids = [client.submit_coflow(one_flow(rng)) for _ in range(calls)]
        submit_s = time.perf_counter() - start
        mark("submit", ctl.proc.pid)
        start = time.perf_counter()
        for _ in range(calls):
            client.check_status(rng.choice(ids))
        status_s = time.perf_counter() - start
        mark("status", ctl.proc.pid)
        per_client = calls // clients
        errors: list[Exception] = []

        def submit_many(seed: int) -> None:
            local, r = ctl.client(), random.Random(seed)
            try:
                for _ in range(per_client):
                    local.submit_coflow(one_flow(r))
            except Exception as exc:  # reported below
                errors.append(exc)
            finally:
                local.close()

        threads = [threading.Thread(target=submit_many, args=(i,)) for i in range(clients)]
        start = time.perf_counter()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        concurrent_s = time.perf_counter() - start
        mark("concurrent", ctl.proc.pid)
        if errors:
            raise errors[0]
        done = sum(c["state"] == "done" for c in client.list_coflows())
        client.close()
    finally:
        for a in agents:
            a.close()
        ctl.stop()
    return {
        "submit_per_s": calls / submit_s,
        "status_per_s": calls / status_s,
        "concurrent_submit_per_s": per_client * clients / concurrent_s,
        "clients": clients,
        "calls": calls,
        "coflows_done": done,
    }


def trace_coflows(n: int) -> list[Coflow]:
    """The first n FB coflows on SWAN, WAN flows only, sizes as whole bytes."""
    coflows = load_workload("fb", load_topology("swan"), limit=n)
    out = []
    for c in coflows:
        flows = [Flow(f.id, f.src, f.dst, float(max(1, round(f.bytes))))
                 for f in c.flows if not f.intra_dc]  # fmt: skip
        if flows:
            out.append(Coflow(c.id, 0.0, flows))
    return out


def wait_rounds(ctl: ControllerProcess, at_least: int, timeout: float = 120.0) -> dict:
    """Wait until the controller has run `at_least` rounds and no round is wanted."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        status = ctl.get("/status")
        if status["rounds"] >= at_least:
            return status
        time.sleep(0.02)
    raise TimeoutError(f"controller did not reach {at_least} rounds")


def round_latency(n_coflows: int, rounds: int, extra: list[str] | None = None) -> dict:
    """Part 2: live round latency vs the same rounds replayed offline (`extra`: more
    terra-controller arguments)."""
    coflows = trace_coflows(n_coflows)
    full = GBPS_TO_BYTES_PER_S
    caps = [full / 2 if i % 2 == 0 else full for i in range(rounds)]
    ctl = ControllerProcess("swan", extra=extra)
    agents = fake_agents(ctl, complete=False)
    try:
        client = ctl.client(timeout=60)
        ids = []
        for c in coflows:
            flows = [{"id": f.id, "src": AGENT_OF[f.src], "dst": AGENT_OF[f.dst],
                      "bytes": int(f.bytes)} for f in c.flows]  # fmt: skip
            ids.append(client.submit_coflow(flows))
        time.sleep(1.0)
        status = wait_rounds(ctl, 1)
        time.sleep(0.5)
        before = ctl.get("/status")["rounds"]
        for i, cap in enumerate(caps):
            assert client.set_capacity("HK", "LA", cap)
            status = wait_rounds(ctl, before + i + 1)
            time.sleep(0.5)  # let the rates reach the agents before the next round
        live_round = status["recent_round_ms"][-rounds:]
        live_alloc = status["recent_allocate_ms"][-rounds:]
        client.close()
    finally:
        for a in agents:
            a.close()
        ctl.stop()

    topo = load_topology("swan")
    policy = TerraPolicy(topo, k=4)
    for cid, c in zip(ids, coflows, strict=True):
        policy.add_coflow(Coflow(str(cid), 0.0, c.flows), 0.0)
    remaining = {
        str(cid): {f.id: f.bytes for f in c.flows} for cid, c in zip(ids, coflows, strict=True)
    }
    policy.allocate(0.0, remaining)  # the rounds the controller ran while coflows arrived
    offline: dict[str, list[float]] = {"gc_on": [], "gc_paused": []}
    for i in range(2 * len(caps)):  # (alternating, so every step is a change, odd counts too)
        cap = full / 2 if i % 2 == 0 else full
        mode = "gc_on" if i < len(caps) else "gc_paused"
        topo.set_capacity("HK", "LA", cap)
        assert policy.wan_changed(1.0)
        if mode == "gc_paused":
            gc.disable()
        start = time.perf_counter()
        policy.allocate(1.0, remaining)
        offline[mode].append((time.perf_counter() - start) * 1e3)
        gc.enable()
    live_med, alloc_med = statistics.median(live_round), statistics.median(live_alloc)
    off_on, off_paused = (statistics.median(offline[m]) for m in ("gc_on", "gc_paused"))
    return {
        "coflows": len(coflows),
        "flows": sum(len(c.flows) for c in coflows),
        "rounds": rounds,
        "live_round_ms_median": live_med,
        "live_allocate_ms_median": alloc_med,
        "offline_allocate_ms_median_gc_on": off_on,
        "offline_allocate_ms_median_gc_paused": off_paused,
        "live_round_over_offline_gc_on": live_med / off_on,
        "live_round_over_offline_gc_paused": live_med / off_paused,
        # minima: the uncontended cost when other processes share the CPUs
        "live_round_ms_min": min(live_round),
        "live_allocate_ms_min": min(live_alloc),
        "offline_allocate_ms_min_gc_paused": min(offline["gc_paused"]),
        "live_round_over_offline_min_gc_paused": min(live_round) / min(offline["gc_paused"]),
        "target_ratio_max": 1.2,
    }


def main(argv: list[str] | None = None) -> int:
    """Run both parts; print figures; write --json OUT."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--calls", type=int, default=2000)
    p.add_argument("--clients", type=int, default=4)
    p.add_argument("--coflows", type=int, default=60, help="FB coflows for part 2")
    p.add_argument("--rounds", type=int, default=20, help="rounds timed in part 2")
    p.add_argument("--json", help="write the figures to this file")
    p.add_argument("--record", metavar="LOG", help="the controller records its events there")
    args = p.parse_args(argv)
    api = api_rates(args.calls, args.clients, ["--record", args.record] if args.record else None)
    print(f"API: submit {api['submit_per_s']:.0f}/s, status {api['status_per_s']:.0f}/s "
          f"(one client); submit {api['concurrent_submit_per_s']:.0f}/s with "
          f"{api['clients']} clients; {api['coflows_done']} coflows done")  # fmt: skip
    rl = round_latency(args.coflows, args.rounds)
    print(f"round latency, {rl['coflows']} FB coflows ({rl['flows']} WAN flows) on SWAN: live "
          f"round {rl['live_round_ms_median']:.1f} ms (allocate "
          f"{rl['live_allocate_ms_median']:.1f} ms, GC paused); offline allocate "
          f"{rl['offline_allocate_ms_median_gc_on']:.1f} ms (GC on, as the simulator runs) / "
          f"{rl['offline_allocate_ms_median_gc_paused']:.1f} ms (GC paused); live round / "
          f"offline: {rl['live_round_over_offline_gc_on']:.2f} / "
          f"{rl['live_round_over_offline_gc_paused']:.2f} (target <= 1.2); minima: live round "
          f"{rl['live_round_ms_min']:.1f} ms, offline {rl['offline_allocate_ms_min_gc_paused']:.1f}"
          f" ms (ratio {rl['live_round_over_offline_min_gc_paused']:.2f})")  # fmt: skip
    if args.json:
        Path(args.json).write_text(json.dumps({"api": api, "round_latency": rl}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
