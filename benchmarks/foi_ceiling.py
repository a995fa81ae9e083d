"""Which FoI over each baseline is attainable at all: the FB trace against a CCT lower bound.

For each topology and link capacity this prints the lower bound on the average CCT of
*any* scheduler (terra_controller/cct_bound.py: SRPT on the WAN's most loaded cut, or
the mean Γ alone on the empty WAN, whichever is larger), Terra's average CCT over that
bound (its distance from the best possible schedule), and for every baseline:

    FoI      = baseline avg CCT / Terra avg CCT          (what we measure)
    ceiling  = baseline avg CCT / bound                  (no scheduler can exceed it)
    paper    = the paper's Table 3 FB figure (DESIGN.md section 9)

A paper figure above the ceiling cannot be reached by any scheduler on that workload
and capacity, however good.

    uv run python benchmarks/foi_ceiling.py [--topology swan gscale att]
        [--link-gbps 1 ...] [--limit N] [--k K] [--schedulers terra rapier ...]
        [--reuse DIR] [--json OUT]

Results come from fb_table3's part files (``--reuse DIR``: loaded when present, else
simulated and written; benchmarks/results/fulltrace holds the 1 Gbps whole-trace ones)
or are simulated. ``--json OUT`` writes ``{"<topology>": {"<G>": {"bound_avg_cct_s": x,
"bound_cut": [DCs], "bound_isolation_avg_cct_s": x, "terra_avg_cct_s": x,
"terra_over_bound": x, "baselines": {"<baseline>": {"avg_cct_s": x, "foi": x,
"ceiling": x, "paper": x, "paper_attainable": bool}}}}}`` (keys of schedulers not run
are left out; FoI needs terra).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from fb_table3 import BASELINES, PAPER_TABLE3, SCHEDULERS, gather  # noqa: E402

from terra_controller.cct_bound import avg_cct_lower_bound  # noqa: E402
from terra_controller.simulator import empty_wan_gammas  # noqa: E402
from topologies import load_topology  # noqa: E402
from workloads import load_workload  # noqa: E402


def bound_for(topology: str, link_gbps: float, limit: int | None, k: int):
    """CctBound of the FB trace (first `limit` coflows) on `topology` at `link_gbps` Gbps.

    Raises:
        TopologyError, WorkloadError: bad names (from the loaders).
    """
    topo = load_topology(topology, link_gbps=link_gbps)
    coflows = load_workload("fb", topo, limit=limit)
    return avg_cct_lower_bound(coflows, topo, empty_wan_gammas(coflows, topo, k))


def ceiling_row(topology: str, bound, results: dict[str, dict]) -> dict:
    """The JSON entry of one (topology, capacity) from its bound and scheduler results."""
    terra = results.get("terra", {}).get("avg_cct_s")
    row = {
        "bound_avg_cct_s": bound.avg_cct_s,
        "bound_cut": sorted(bound.cut),
        "bound_isolation_avg_cct_s": bound.isolation_avg_cct_s,
        "terra_avg_cct_s": terra,
        "terra_over_bound": None if terra is None else terra / bound.avg_cct_s,
        "baselines": {},
    }
    for name in BASELINES:
        if name not in results:
            continue
        avg = results[name]["avg_cct_s"]
        ceiling = avg / bound.avg_cct_s
        paper = PAPER_TABLE3.get(topology, {}).get(name)
        row["baselines"][name] = {
            "avg_cct_s": avg,
            "foi": None if terra is None else avg / terra,
            "ceiling": ceiling,
            "paper": paper,
            "paper_attainable": None if paper is None else paper <= ceiling,
        }
    return row


def print_row(topology: str, gbps: float, row: dict) -> None:
    """Print one (topology, capacity) block of the table."""
    terra = row["terra_avg_cct_s"]
    gap = "" if terra is None else f", Terra {terra:.2f} s = {row['terra_over_bound']:.2f}x bound"
    print(
        f"\n{topology} at {gbps:g} Gbps: avg CCT bound {row['bound_avg_cct_s']:.2f} s "
        f"(cut {', '.join(row['bound_cut'])}; isolation "
        f"{row['bound_isolation_avg_cct_s']:.2f} s){gap}"
    )
    print(f"  {'baseline':<10}{'avg CCT s':>11}{'FoI':>8}{'ceiling':>9}{'paper':>7}  attainable")
    for name, b in row["baselines"].items():
        foi = "-" if b["foi"] is None else f"{b['foi']:.2f}"
        paper = "-" if b["paper"] is None else f"{b['paper']:.2f}"
        verdict = {True: "yes", False: "NO", None: "-"}[b["paper_attainable"]]
        print(
            f"  {name:<10}{b['avg_cct_s']:>11.2f}{foi:>8}{b['ceiling']:>9.2f}{paper:>7}  {verdict}"
        )


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark; print the table; write --json OUT. Returns the exit status."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--topology", nargs="+", default=["swan", "gscale", "att"])
    p.add_argument("--link-gbps", nargs="+", type=float, default=[1.0])
    p.add_argument("--limit", type=int, default=None, help="only the first N coflows")
    p.add_argument("--k", type=int, default=4)
    p.add_argument("--schedulers", nargs="+", choices=SCHEDULERS, default=SCHEDULERS)
    p.add_argument("--reuse", type=Path, default=None, metavar="DIR", help="part-file cache")
    p.add_argument("--json", type=Path, default=None, metavar="OUT")
    args = p.parse_args(argv)
    if any(not g > 0 for g in args.link_gbps):
        p.error("--link-gbps must be positive")
    out: dict[str, dict] = {}
    try:
        for gbps in args.link_gbps:
            run = argparse.Namespace(**{**vars(args), "link_gbps": gbps, "rerun": []})
            for topology, entry in gather(run).items():
                bound = bound_for(topology, gbps, args.limit, args.k)
                row = ceiling_row(topology, bound, entry["results"])
                out.setdefault(topology, {})[f"{gbps:g}"] = row
                print_row(topology, gbps, row)
    except (OSError, ValueError, KeyError) as exc:
        print(f"foi_ceiling: error: {exc}", file=sys.stderr)
        return 2
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
