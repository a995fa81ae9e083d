"""FB workload on SWAN, G-Scale and ATT: FoI of Terra's average CCT over each baseline.

Prints our figures next to the paper's Table 3 FB column (DESIGN.md section 9)
and writes them with ``--json OUT`` as ``{"<topology>": {"<baseline>": foi}}``.

    uv run python benchmarks/fb_table3.py [--link-gbps G] [--limit N] [--topology swan ...]
        [--json OUT]

Every scheduler of a topology runs on the same link capacity (``--link-gbps``,
default 1 Gbps: see README "Simulation" for why the WAN is the bottleneck there).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from terra_controller import sim_cli

PAPER_TABLE3 = {
    "swan": {"per-flow": 1.96, "varys": 1.04, "swan-mcf": 1.69, "multipath": 1.65, "rapier": 2.15},
    "gscale": {
        "per-flow": 8.08,
        "varys": 3.87,
        "swan-mcf": 4.26,
        "multipath": 4.11,
        "rapier": 1.91,
    },
    "att": {"per-flow": 4.50, "varys": 2.79, "swan-mcf": 2.64, "multipath": 2.48, "rapier": 1.90},
}
BASELINES = ["per-flow", "varys", "swan-mcf", "multipath", "rapier"]


def foi_table(topology: str, link_gbps: float, limit: int | None, k: int) -> dict:
    """Simulate the FB trace on `topology` with Terra and every baseline.

    Returns:
        {"foi": {baseline: FoI}, "avg_cct_s": {scheduler: seconds},
         "avg_slowdown": {scheduler: x}, "wall_s": {scheduler: seconds}}.
    """
    args = sim_cli.build_parser().parse_args(
        ["--topology", topology, "--workload", "fb", "--link-gbps", str(link_gbps), "--k", str(k)]
        + (["--limit", str(limit)] if limit else [])
    )
    results = sim_cli.run(args)
    terra = results["terra"].avg_cct_s
    return {
        "foi": {b: results[b].avg_cct_s / terra for b in BASELINES},
        "avg_cct_s": {n: r.avg_cct_s for n, r in results.items()},
        "avg_slowdown": {n: r.avg_slowdown for n, r in results.items()},
        "wall_s": {n: r.wall_s for n, r in results.items()},
    }


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark; print the table; write --json OUT. Returns the exit status."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--topology", nargs="+", default=["swan", "gscale", "att"])
    p.add_argument("--link-gbps", type=float, default=1.0)
    p.add_argument("--limit", type=int, default=None, help="only the first N coflows")
    p.add_argument("--k", type=int, default=4)
    p.add_argument("--json", type=Path, default=None, metavar="OUT")
    p.add_argument("--details", type=Path, default=None, help="also write CCTs/slowdowns/wall")
    args = p.parse_args(argv)
    out, details = {}, {}
    for topo in args.topology:
        details[topo] = foi_table(topo, args.link_gbps, args.limit, args.k)
        out[topo] = details[topo]["foi"]
    print(f"\nFoI of Terra's average CCT, FB trace, {args.link_gbps:g} Gbps links, K={args.k}")
    print(f"{'topology':<8} " + " ".join(f"{b:>17}" for b in BASELINES) + "   Terra slowdown")
    for topo, fois in out.items():
        paper = PAPER_TABLE3.get(topo, {})
        cells = " ".join(
            f"{fois[b]:>7.2f} (paper {paper.get(b, float('nan')):4.2f})" for b in BASELINES
        )
        print(f"{topo:<8} {cells}   {details[topo]['avg_slowdown']['terra']:.2f}")
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))
    if args.details:
        args.details.write_text(json.dumps(details, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
