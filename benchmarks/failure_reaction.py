"""Reaction time: WAN link down/up -> new tunnels and rates applied at every affected agent.

Target: at most 100 ms on loopback (the paper: within 10 s on its testbed).

Setup: terra-controller --no-openflow on SWAN (5 DCs; links scaled to --gbps so the
agents' loopback traffic stays well within two cores), one real terra-agent per DC,
and long-running coflows whose paths cross the paper's failing link LA-NY. Then,
--repeats times, the operator command sets LA-NY down and, later, up again.

For every event the controller records (agent_channel.Reaction): when it learned of
the event, when the round's messages were queued, and when the last agent
acknowledged them ("ack" after applying the new tunnel table / rates). The script
prints median / p90 / max of event -> applied (ms) for down and up events and
writes them with --json OUT.

The script polls REST /status for the record every --poll-s seconds (default 0.01). The figure
is the controller's own timestamps, not when the script noticed; but with TLS every poll is a
new HTTPS connection (the REST server closes after each request), a TLS handshake the
controller runs while it reacts. --poll-s 0.05 keeps that load off the measurement (use the
same value for every implementation compared).

Run: uv run python benchmarks/failure_reaction.py [--repeats 10] [--gbps 0.04] [--poll-s S]
    [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.loopback_system import ControllerProcess, start_agents, stop_all
from topologies.loaders import builtin_path

TLS = True  # mutual TLS on the API and the agent channel (--insecure: False)
AGENTS = [("hk", "HK", "127.0.0.31"), ("la", "LA", "127.0.0.32"), ("ny", "NY", "127.0.0.33"),
          ("fl", "FL", "127.0.0.34"), ("ba", "BA", "127.0.0.35")]  # fmt: skip
COFLOWS = [  # long flows whose shortest paths cross LA-NY
    [("f1", "la", "ny"), ("f2", "ny", "la")],
    [("g1", "hk", "fl"), ("g2", "la", "ba")],
    [("h1", "fl", "hk"), ("h2", "ba", "la")],
]
FLOW_BYTES = 4_000_000_000  # never finishes during the benchmark


def wait_reaction(
    ctl: ControllerProcess, before: int, timeout: float = 10.0, poll_s: float = 0.01
) -> dict:
    """Poll /status every `poll_s` seconds until a reaction after the first `before` ones has
    been applied; returns its record. TimeoutError after `timeout` seconds."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        status = ctl.get("/status")
        if status["reactions_total"] > before:
            last = status["reactions"][-1]
            if last["event_to_applied_ms"] is not None:
                return last
        time.sleep(poll_s)
    raise TimeoutError(f"no reaction applied within {timeout} s")


def summary(values: list[float]) -> dict:
    """{"median", "p90", "max", "n"} of a list of milliseconds."""
    ordered = sorted(values)
    p90 = ordered[min(len(ordered) - 1, int(round(0.9 * (len(ordered) - 1))))]
    return {"median": statistics.median(ordered), "p90": p90, "max": ordered[-1],
            "n": len(ordered)}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark; print figures; write --json OUT."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=10, help="down/up cycles")
    p.add_argument("--gbps", type=float, default=0.04, help="WAN link capacity (Gbps)")
    p.add_argument("--poll-s", type=float, default=0.01, help="REST /status poll interval (s)")
    p.add_argument("--json", help="write the figures to this file")
    args = p.parse_args(argv)

    work = Path(tempfile.mkdtemp(prefix="terra-reaction-"))
    doc = json.loads(builtin_path("swan").read_text())
    doc["default_capacity_gbps"] = args.gbps
    topo = work / "swan.json"
    topo.write_text(json.dumps(doc))
    ctl = ControllerProcess(str(topo), k=4, log=work / "controller.log", tls=TLS)
    agents = []
    try:
        agents = start_agents(ctl, AGENTS, work)
        ctl.wait_agents(len(AGENTS))
        client = ctl.client(timeout=10)
        for flows in COFLOWS:
            client.submit_coflow(
                [{"id": f, "src": s, "dst": d, "bytes": FLOW_BYTES} for f, s, d in flows]
            )
        time.sleep(2.0)  # tunnels open, data flowing
        results: dict[str, list[float]] = {"down": [], "up": []}
        pushes: dict[str, list[float]] = {"down": [], "up": []}
        for _ in range(args.repeats):
            for kind, up in (("down", False), ("up", True)):
                before = ctl.get("/status")["reactions_total"]
                assert client.set_link_state("LA", "NY", up)
                reaction = wait_reaction(ctl, before, poll_s=args.poll_s)
                results[kind].append(reaction["event_to_applied_ms"])
                pushes[kind].append(reaction["event_to_push_ms"])
                time.sleep(0.5)
        delivered = sum(c["bytes_delivered"] for c in client.list_coflows())
        client.close()
    finally:
        stop_all(agents)
        ctl.stop()
        shutil.rmtree(work, ignore_errors=True)
    figures = {
        "target_ms": 100,
        "link": "LA-NY",
        "agents": len(AGENTS),
        "link_gbps": args.gbps,
        "poll_s": args.poll_s,
        "event_to_applied_ms": {k: summary(v) for k, v in results.items()},
        "event_to_push_ms": {k: summary(v) for k, v in pushes.items()},
        "bytes_delivered_during_run": delivered,
    }
    for kind in ("down", "up"):
        a, q = figures["event_to_applied_ms"][kind], figures["event_to_push_ms"][kind]
        print(f"link {kind:4s}: event -> applied at every agent: median {a['median']:.1f} ms, "
              f"p90 {a['p90']:.1f} ms, max {a['max']:.1f} ms (n={a['n']}); "
              f"event -> pushed: median {q['median']:.1f} ms")  # fmt: skip
    print(f"bytes delivered meanwhile: {delivered / 1e6:.0f} MB")
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
