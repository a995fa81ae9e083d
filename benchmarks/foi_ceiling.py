"""Which FoI over each baseline is attainable at all: the FB trace against a CCT lower bound.

For each topology and link capacity this prints the lower bound on the average CCT
(terra_sim/cct_bound.py) over the trace's WAN coflows, Terra's average CCT over
it (its distance from the best possible schedule), and for every baseline:

    FoI      = baseline avg CCT / Terra avg CCT          (what we measure)
    ceiling  = baseline avg CCT / bound                  (no scheduler can exceed it)
    paper    = the paper's Table 3 FB figure (docs/design.md section 9)

Two bounds, so two ceilings: the cut bound (SRPT on the most loaded cut) holds for
every scheduler, whatever its routing ("any routing"); the larger of it and the mean Γ
alone on the empty WAN holds for schedulers on the K shortest paths ("K paths", as all
of ours and Terra with the same K). A paper figure above the any-routing ceiling cannot
be reached by any scheduler over our baseline on our mapping of the trace (rack r to
DC r mod N) and capacity, however good; above only the K-path ceiling, by none that
routes over those K paths.

    uv run python benchmarks/foi_ceiling.py [--topology swan gscale att]
        [--link-gbps 1 ...] [--limit N] [--k K] [--schedulers terra rapier ...]
        [--reuse DIR] [--jobs N | --dask tcp://HOST:PORT] [--json OUT]

``--jobs N`` (default: the number of CPUs) runs the missing simulations of every
capacity and the bounds in up to N processes at once (concurrent.futures); ``--dask
tcp://HOST:PORT`` runs them on the workers of that Dask scheduler instead
(terra_sim/sweep.py; the workers import this checkout's code); the results are those
of ``--jobs 1`` (serial) except for measured times.
Results come from fb_table3's part files (``--reuse DIR``: loaded when present, else
simulated and written; benchmarks/results/fulltrace holds the 1 Gbps whole-trace ones)
or are simulated; the whole trace is simulated only with ``--reuse`` (each missing part
is announced on stderr first), else ``--limit`` is required. A part whose settings
(topology, limit, link Gbps, K) differ from the run, or in which some WAN coflow was
rejected or did not finish, is an error: every average is over the same WAN coflows as
the bound. ``--json OUT`` writes::

    {"<topology>": {"<G>": {
        "coflows": N,                       # WAN coflows every average is over
        "bound_avg_cct_s": x,               # K-path bound (max of the two), seconds
        "bound_cut_avg_cct_s": x,           # any-routing bound, seconds
        "bound_cut": [DCs],                 # source side of the best cut
        "bound_isolation_avg_cct_s": x,     # mean Γ_empty, seconds
        "terra_avg_cct_s": x | null, "terra_over_bound": x | null,   # null without terra
        "baselines": {"<baseline>": {       # only baselines that were run
            "avg_cct_s": x, "foi": x | null,                        # null without terra
            "ceiling": x, "ceiling_any_routing": x,
            "paper": x | null, "paper_attainable": bool | null,     # vs the K-path ceiling
            "paper_attainable_any_routing": bool | null}}}}}
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from concurrent.futures import Executor
from pathlib import Path

from benchmarks.fb_table3 import (
    BASELINES,
    PAPER_TABLE3,
    SCHEDULERS,
    finish_gather,
    part_name,
    start_gather,
)
from terra_core.cli_support import MissingExtra
from terra_sim.cct_bound import CctBound, avg_cct_lower_bound
from terra_sim.simulator import empty_wan_gammas
from terra_sim.sweep import open_sweep
from topologies import load_topology
from workloads import load_workload

_AVG_REL = 1e-9  # a part's avg_cct_s must match the mean over the bound's coflows this well


def bound_for(topology: str, link_gbps: float, limit: int | None, k: int):
    """The bound of the FB trace (first `limit` coflows) on `topology` at `link_gbps` Gbps.

    Returns:
        (CctBound with the isolation bound for K = `k`, seconds; ids of the WAN coflows
        it averages over).

    Raises:
        TopologyError, WorkloadError: bad names (from the loaders).
        ValueError: the bound is not finite and positive (a disconnected WAN).
    """
    topo = load_topology(topology, link_gbps=link_gbps)
    coflows = load_workload("fb", topo, limit=limit)
    bound = avg_cct_lower_bound(coflows, topo, empty_wan_gammas(coflows, topo, k))
    if not 0 < bound.cut_avg_cct_s < math.inf or not bound.avg_cct_s < math.inf:
        raise ValueError(f"{topology} at {link_gbps:g} Gbps: bound {bound.avg_cct_s} s")
    return bound, [c.id for c in coflows if c.flowgroups()]


def wan_average(name: str, result: dict, wan_ids: list[str]) -> float:
    """Mean CCT (seconds) of `result` (a part file's result) over the coflows `wan_ids`.

    Raises:
        ValueError: a coflow of `wan_ids` missing, rejected or unfinished in `result`, or
            the result's own avg_cct_s differing from that mean (other coflows counted).
    """
    cct = {c["id"]: c["cct_s"] for c in result["coflows"] if c["admitted"]}
    bad = [cid for cid in wan_ids if cct.get(cid) is None]
    if bad:
        raise ValueError(f"{name}: WAN coflows {bad[:5]} missing, rejected or unfinished")
    mean = sum(cct[cid] for cid in wan_ids) / len(wan_ids)
    if not math.isclose(mean, result["avg_cct_s"], rel_tol=_AVG_REL):
        raise ValueError(f"{name}: avg_cct_s {result['avg_cct_s']} is not over the WAN coflows")
    return mean


def announce_missing(run: argparse.Namespace) -> None:
    """Print on stderr every (topology, scheduler) `gather(run)` is about to simulate."""
    for topology in run.topology:
        for name in run.schedulers:
            part = part_name(topology, run.limit, run.link_gbps, run.k, name)
            if run.reuse is None or not (run.reuse / part).exists():
                print(f"foi_ceiling: simulating {part} (not in --reuse)", file=sys.stderr)


def ceiling_row(topology: str, bound: CctBound, wan_ids: list[str], results: dict) -> dict:
    """The JSON entry of one (topology, capacity) (module docstring) from its bound, the
    ids of the WAN coflows it averages over and {scheduler: part-file result}.

    Raises:
        ValueError: a result not averaged over exactly `wan_ids` (see wan_average).
    """
    terra = None
    if "terra" in results:
        terra = wan_average("terra", results["terra"], wan_ids)
    row = {
        "coflows": bound.coflows,
        "bound_avg_cct_s": bound.avg_cct_s,
        "bound_cut_avg_cct_s": bound.cut_avg_cct_s,
        "bound_cut": sorted(bound.cut),
        "bound_isolation_avg_cct_s": bound.isolation_avg_cct_s,
        "terra_avg_cct_s": terra,
        "terra_over_bound": None if terra is None else terra / bound.avg_cct_s,
        "baselines": {},
    }
    for name in BASELINES:
        if name not in results:
            continue
        avg = wan_average(name, results[name], wan_ids)
        ceiling, any_routing = avg / bound.avg_cct_s, avg / bound.cut_avg_cct_s
        paper = PAPER_TABLE3.get(topology, {}).get(name)
        row["baselines"][name] = {
            "avg_cct_s": avg,
            "foi": None if terra is None else avg / terra,
            "ceiling": ceiling,
            "ceiling_any_routing": any_routing,
            "paper": paper,
            "paper_attainable": None if paper is None else paper <= ceiling,
            "paper_attainable_any_routing": None if paper is None else paper <= any_routing,
        }
    return row


def print_row(topology: str, gbps: float, row: dict) -> None:
    """Print one (topology, capacity) block of the table."""
    terra = row["terra_avg_cct_s"]
    gap = "" if terra is None else f"; Terra {terra:.2f} s = {row['terra_over_bound']:.2f}x bound"
    print(
        f"\n{topology} at {gbps:g} Gbps, {row['coflows']} WAN coflows: avg CCT bound "
        f"{row['bound_avg_cct_s']:.2f} s (K paths) / {row['bound_cut_avg_cct_s']:.2f} s "
        f"(any routing; cut {', '.join(row['bound_cut'])}; mean Γ alone "
        f"{row['bound_isolation_avg_cct_s']:.2f} s){gap}"
    )
    print(
        f"  {'baseline':<10}{'avg CCT s':>11}{'FoI':>8}{'ceiling':>9}{'any rt.':>9}{'paper':>7}"
        "  attainable (K paths / any routing)"
    )
    verdict = {True: "yes", False: "NO", None: "-"}
    for name, b in row["baselines"].items():
        foi = "-" if b["foi"] is None else f"{b['foi']:.2f}"
        paper = "-" if b["paper"] is None else f"{b['paper']:.2f}"
        print(
            f"  {name:<10}{b['avg_cct_s']:>11.2f}{foi:>8}{b['ceiling']:>9.2f}"
            f"{b['ceiling_any_routing']:>9.2f}{paper:>7}  {verdict[b['paper_attainable']]} / "
            f"{verdict[b['paper_attainable_any_routing']]}"
        )


def sweep_rows(args: argparse.Namespace, pool: Executor | None) -> dict[str, dict]:
    """Simulate (or load) every run of `args` and compute the bounds, in `pool` when given
    (else here, one after the other); print each (topology, capacity) block as it is done.

    Returns:
        {topology: {"<G>": row}} (the --json object, module docstring).

    Raises:
        ValueError: a part file not of this run or not averaged over the bound's coflows.
        OSError: an unreadable part file.
    """
    out: dict[str, dict] = {}
    started = []  # per capacity: (Gbps, started runs, {topology: Future of bound or None})
    for gbps in args.link_gbps:
        run = argparse.Namespace(**{**vars(args), "link_gbps": gbps, "rerun": []})
        announce_missing(run)
        runs = start_gather(run, pool)
        bounds = {
            topology: None
            if pool is None
            else pool.submit(bound_for, topology, gbps, args.limit, args.k)
            for topology in args.topology
        }
        started.append((gbps, runs, bounds))
    for gbps, runs, bounds in started:
        for topology, entry in finish_gather(runs).items():
            future = bounds[topology]
            if future is None:
                bound, wan_ids = bound_for(topology, gbps, args.limit, args.k)
            else:
                bound, wan_ids = future.result()
            row = ceiling_row(topology, bound, wan_ids, entry["results"])
            out.setdefault(topology, {})[f"{gbps:g}"] = row
            print_row(topology, gbps, row)
    return out


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark; print the table; write --json OUT. Returns the exit status
    (0 ok, 2 bad input or inconsistent part files)."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--topology", nargs="+", default=["swan", "gscale", "att"])
    p.add_argument("--link-gbps", nargs="+", type=float, default=[1.0])
    p.add_argument("--limit", type=int, default=None, help="only the first N coflows")
    p.add_argument("--k", type=int, default=4)
    p.add_argument("--schedulers", nargs="+", choices=SCHEDULERS, default=SCHEDULERS)
    p.add_argument("--reuse", type=Path, default=None, metavar="DIR", help="part-file cache")
    p.add_argument("--json", type=Path, default=None, metavar="OUT")
    p.add_argument(
        "--jobs",
        type=int,
        default=os.cpu_count() or 1,
        metavar="N",
        help="run up to N simulations and bounds at once, one process each "
        "(default: the number of CPUs; 1 = serial)",
    )
    p.add_argument(
        "--dask",
        default=None,
        metavar="tcp://HOST:PORT",
        help="run the simulations and bounds on the workers of this Dask scheduler",
    )
    args = p.parse_args(argv)
    if any(not g > 0 for g in args.link_gbps):
        p.error("--link-gbps must be positive")
    if args.jobs < 1:
        p.error("--jobs must be >= 1")
    if args.k < 1 or (args.limit is not None and args.limit < 1):
        p.error("--k and --limit must be >= 1")
    if args.limit is None and args.reuse is None:
        p.error("the whole trace takes minutes to hours per run: give --reuse DIR or --limit N")
    try:
        with open_sweep(args.jobs, args.dask) as sweep:
            out = sweep_rows(args, sweep.executor)
    except (OSError, ValueError, KeyError, MissingExtra) as exc:
        print(f"foi_ceiling: error: {exc}", file=sys.stderr)
        return 2
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
