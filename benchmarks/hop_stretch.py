"""Link-bytes per delivered byte of a run: how much capacity a scheduler's routing spends.

    uv run python benchmarks/hop_stretch.py --topology swan [--schedulers per-flow multipath]
        [--link-gbps 1] [--k 4] [--limit N] [--json OUT]

For each scheduler it simulates the FB trace (terra_sim/simulator.py) and prints:
average CCT (s), WAN utilization, hops per delivered byte (bytes x hops carried on
WAN links / bytes delivered) and the same on each flow's shortest path (the least
any routing can spend), so stretch = the two divided. Used for the note in
docs/results.md (1.5) on multipath against per-flow.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from terra_core.registry import SchedulerOptions, make_scheduler
from terra_core.terra_policy import TerraPolicy
from terra_sim.simulator import empty_wan_gammas, simulate
from topologies import load_topology
from topologies.paths import k_shortest_paths, up_graph
from workloads import load_workload


def measure(topology_name: str, scheduler: str, link_gbps: float, k: int, limit: int | None):
    """Simulate the FB trace with `scheduler` and return its routing figures.

    Returns:
        {"avg_cct_s", "wan_utilization", "hops_per_byte", "shortest_hops_per_byte",
        "stretch", "bytes_delivered"} (seconds, fraction, hops, hops, ratio, bytes).
    """
    topology = load_topology(topology_name, link_gbps=link_gbps)
    coflows = load_workload("fb", topology, limit=limit)
    gammas = empty_wan_gammas(coflows, topology, k)
    if scheduler == "terra":
        policy = TerraPolicy(topology.copy(), k=k)
    else:
        policy = make_scheduler(scheduler, topology.copy(), SchedulerOptions(k=k))
    res = simulate(policy, coflows, (), gammas)
    graph = up_graph(topology)
    shortest: dict[tuple[str, str], int] = {}
    least = 0.0
    for c in coflows:
        for f in c.flows:
            if f.src == f.dst:
                continue
            pair = (f.src, f.dst)
            if pair not in shortest:
                shortest[pair] = len(k_shortest_paths(topology, *pair, 1, graph)[0]) - 1
            least += f.bytes * shortest[pair]
    delivered = res.bytes_delivered
    return {
        "avg_cct_s": res.avg_cct_s,
        "wan_utilization": res.wan_utilization,
        "hops_per_byte": res.byte_hops / delivered,
        "shortest_hops_per_byte": least / delivered,
        "stretch": res.byte_hops / least,
        "bytes_delivered": delivered,
    }


def main(argv=None) -> int:
    """Entry point: print one line per scheduler (and write --json). Returns 0."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--topology", default="swan")
    p.add_argument("--schedulers", nargs="+", default=["per-flow", "multipath"])
    p.add_argument("--link-gbps", type=float, default=1.0)
    p.add_argument("--k", type=int, default=4)
    p.add_argument("--limit", type=int, default=None)
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args(argv)
    out = {}
    for name in args.schedulers:
        out[name] = m = measure(args.topology, name, args.link_gbps, args.k, args.limit)
        print(
            f"{args.topology} {name:<10} avg CCT {m['avg_cct_s']:9.2f} s  util "
            f"{m['wan_utilization']:.3f}  hops/byte {m['hops_per_byte']:.3f}  "
            f"shortest {m['shortest_hops_per_byte']:.3f}  stretch {m['stretch']:.3f}",
            file=sys.stdout,
        )
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
