"""How Terra's FoIs over per-flow TCP depend on which FB slice the testbed plays.

Every slice of COUNT consecutive coflows (positions 0, COUNT, 2 COUNT, ...) is shaped exactly as
`terra-testbed swan` shapes its slice (mininet_scenarios.workload: bytes x link/1 Gbps x load /
speedup, arrivals / speedup, the same LA-NY failure) and run through the flow-level simulator
with Terra and ideal per-flow TCP (mininet_scenarios.sim_twin). Prints each slice's FoI of the
average CCT and of the WAN utilization and their distribution, with the default slice's figures
(the testbed measured 1.98 / 1.36 where the simulator gives 2.02 / 1.35).

    uv run python benchmarks/testbed_slices.py [--count 12] [--load 2] [--no-failure] [--json OUT]

--json OUT writes {"slices": [{"first": i, "foi_avg_cct": x, "foi_wan_utilization": x,
"terra_wan_utilization": x, "per_flow_wan_utilization": x}], "median_foi_avg_cct": x,
"median_foi_wan_utilization": x, "default": {...the default slice's entry...}}.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path

from mininet_scenarios.run_result import Failure
from mininet_scenarios.sim_twin import simulate_testbed
from mininet_scenarios.swan import testbed_topology
from mininet_scenarios.workload import DEFAULT_FIRST, scales, testbed_coflows
from terra_model import WorkloadError
from topologies import load_topology
from topologies.binding import load_binding
from workloads import load_workload

TRACE_COFLOWS = 526


def slice_figures(first, count, binding, topology, args) -> dict:
    """Simulated FoIs of one slice (keys as in the module docstring)."""
    byte_scale, time_scale = scales(args.link_mbps, args.speedup, args.load)
    coflows = testbed_coflows("fb", topology, binding, first, count, byte_scale, time_scale)
    failure = None if args.no_failure else Failure("LA", "NY", 4.0, 10.0)
    out = simulate_testbed(coflows, binding, args.link_mbps, failure=failure)
    return {
        "first": first,
        "foi_avg_cct": out["foi_avg_cct"],
        "foi_wan_utilization": out["foi_wan_utilization"],
        "terra_wan_utilization": out["terra"]["wan_utilization"],
        "per_flow_wan_utilization": out["per_flow_tcp"]["wan_utilization"],
    }


def main() -> None:
    """Parse arguments, sweep the slices, print and optionally write the figures."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--count", type=int, default=12, help="coflows per slice (12)")
    p.add_argument("--load", type=float, default=2.0, help="bytes multiplier (2)")
    p.add_argument("--speedup", type=float, default=0.5, help="as terra-testbed (0.5)")
    p.add_argument("--link-mbps", type=float, default=10.0, help="WAN link rate (10)")
    p.add_argument("--no-failure", action="store_true", help="no LA-NY failure")
    p.add_argument("--json", type=Path, help="write the figures as JSON here")
    args = p.parse_args()
    topology = load_topology("swan")
    binding = load_binding(
        load_topology(str(testbed_topology(Path(tempfile.mkdtemp()), args.link_mbps)))
    )
    load_workload("fb", topology)  # fail early on a broken trace
    rows = []
    for first in range(0, TRACE_COFLOWS, args.count):
        try:
            rows.append(slice_figures(first, args.count, binding, topology, args))
        except WorkloadError:  # a slice with no WAN flow
            continue
        r = rows[-1]
        print(
            f"slice {first:3d}-{first + args.count - 1:3d}: FoI avg CCT {r['foi_avg_cct']:5.2f}  "
            f"FoI WAN util {r['foi_wan_utilization']:5.2f}  (util Terra "
            f"{r['terra_wan_utilization']:.3f}, per-flow {r['per_flow_wan_utilization']:.3f})",
            flush=True,
        )
    default = slice_figures(DEFAULT_FIRST, args.count, binding, topology, args)
    summary = {
        "slices": rows,
        "median_foi_avg_cct": statistics.median(r["foi_avg_cct"] for r in rows),
        "median_foi_wan_utilization": statistics.median(r["foi_wan_utilization"] for r in rows),
        "default": default,
    }
    n = len(rows)
    both = sum(r["foi_avg_cct"] >= 1.55 and r["foi_wan_utilization"] >= 1.64 for r in rows)
    print(
        f"\n{n} slices of {args.count}: median FoI avg CCT {summary['median_foi_avg_cct']:.2f}, "
        f"median FoI WAN utilization {summary['median_foi_wan_utilization']:.2f}; "
        f"{sum(r['foi_avg_cct'] >= 1.55 for r in rows)} reach 1.55 on CCT, "
        f"{sum(r['foi_wan_utilization'] >= 1.64 for r in rows)} reach 1.64 on utilization, "
        f"{both} both"
    )
    print(
        f"default slice (positions {DEFAULT_FIRST}-{DEFAULT_FIRST + args.count - 1}): "
        f"FoI avg CCT {default['foi_avg_cct']:.2f}, "
        f"FoI WAN utilization {default['foi_wan_utilization']:.2f}"
    )
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(summary, indent=1) + "\n")


if __name__ == "__main__":
    main()
