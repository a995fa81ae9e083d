"""Scheduling overhead of Terra: milliseconds per round and LPs per round per topology.

Runs the FB trace through TerraPolicy in the simulator (the load the trace
produces) and reports the median and 95th-percentile wall time of a scheduling
round (one ``allocate`` call) and the LPs solved per round. Writes ``--json OUT``
as ``{"<topology>": {"round_ms_median": x, "round_ms_p95": x, "lps_per_round": x}}``.

    uv run python benchmarks/sched_overhead.py [--topology swan gscale att] [--link-gbps G]
        [--limit N] [--k K] [--json OUT] [--parts DIR]

``--parts DIR`` also writes each run's full result as a terra part file of
benchmarks/fb_table3.py (``DIR/<topology>_<limit|all>_<G>g_k<K>_terra.json``, the shape
of ``terra-sim --json`` with a ``meta`` object), so the same run gives Terra's average
CCT for the FoI table (``fb_table3.py --reuse DIR`` or ``--combine``).

Targets: median ≤ 10 ms on SWAN and ≤ 100 ms on ATT (the paper: O(100) ms and O(1) s).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from terra_core.cli_support import progress
from terra_sim import cli as sim_cli
from terra_sim.simulator import empty_wan_gammas, simulate
from topologies import load_topology
from workloads import load_workload


def overhead(
    topology: str, link_gbps: float, limit: int | None, k: int, parts: Path | None = None
) -> dict:
    """Simulate the FB trace with Terra on `topology`; return the round statistics.

    Terra runs as `terra-sim --scheduler terra` runs it (sim_cli.make_policy, default α, ε).
    With `parts`, also writes the run as a part file there (see the module docstring).

    Returns:
        {"round_ms_median", "round_ms_p95", "lps_per_round", "rounds", "sim_wall_s",
         "avg_cct_s"}.
    """
    argv = ["--topology", topology, "--workload", "fb", "--link-gbps", str(link_gbps)]
    argv += ["--k", str(k), "--scheduler", "terra"] + (["--limit", str(limit)] if limit else [])
    args = sim_cli.build_parser().parse_args(argv)
    topo = load_topology(topology, link_gbps=link_gbps)
    coflows = load_workload("fb", topo, limit=limit)
    gammas = empty_wan_gammas(coflows, topo, k)
    policy = sim_cli.make_policy("terra", topo.copy(), args)
    with progress(len(coflows), desc=f"terra {topology}", unit="coflow") as bar:
        result = simulate(policy, coflows, gammas=gammas, progress=bar)
    if parts is not None:
        parts.mkdir(parents=True, exist_ok=True)
        name = f"{topology}_{limit or 'all'}_{link_gbps:g}g_k{k}_terra.json"
        part = sim_cli.results_json({"terra": result}, sim_cli.run_meta(args))
        (parts / name).write_text(json.dumps(part, indent=1))
    return {
        "round_ms_median": result.round_ms_quantile(0.5),
        "round_ms_p95": result.round_ms_quantile(0.95),
        "lps_per_round": result.lps_per_round,
        "rounds": result.rounds,
        "sim_wall_s": result.wall_s,
        "avg_cct_s": result.avg_cct_s,
    }


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark; print the table; write --json OUT. Returns the exit status."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--topology", nargs="+", default=["swan", "gscale", "att"])
    p.add_argument("--link-gbps", type=float, default=1.0)
    p.add_argument("--limit", type=int, default=None)
    p.add_argument("--k", type=int, default=4)
    p.add_argument("--json", type=Path, default=None, metavar="OUT")
    p.add_argument("--parts", type=Path, default=None, metavar="DIR", help="write part files")
    args = p.parse_args(argv)
    rows = {t: overhead(t, args.link_gbps, args.limit, args.k, args.parts) for t in args.topology}
    print(f"Terra scheduling rounds, FB trace, {args.link_gbps:g} Gbps links, K={args.k}")
    head = ("topology", "median ms", "p95 ms", "LPs/round", "rounds", "sim s")
    print("{:<8} {:>10} {:>8} {:>10} {:>7} {:>7}".format(*head))
    for t, r in rows.items():
        print(
            f"{t:<8} {r['round_ms_median']:>10.2f} {r['round_ms_p95']:>8.2f} "
            f"{r['lps_per_round']:>10.1f} {r['rounds']:>7} {r['sim_wall_s']:>7.1f}"
        )
    if args.json:
        keep = ("round_ms_median", "round_ms_p95", "lps_per_round")
        args.json.write_text(json.dumps({t: {k: r[k] for k in keep} for t, r in rows.items()}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
