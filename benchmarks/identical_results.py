"""Per-coflow CCTs of every registered scheduler on the FB trace over SWAN, and their comparison.

    uv run python benchmarks/identical_results.py --json OUT.json [--limit N]
        [--jobs N | --dask tcp://HOST:PORT]
    uv run python benchmarks/identical_results.py --compare A.json B.json

The run simulates the README's `terra-sim --topology swan --workload fb` example (default
link capacities and options, the whole trace unless --limit) for every scheduler of
terra_core.registry and writes {"meta": {...}, "ccts": {scheduler: {coflow id: CCT
seconds or null}}}; floats are written as repr (exact round trip). The whole trace (526
coflows), all six schedulers, --jobs 2: about 90 s wall on two cores, Terra most of it.
--dask tcp://HOST:PORT simulates the schedulers on the workers of that Dask scheduler
(terra_sim/sweep.py) instead of --jobs local processes.

--compare prints, per scheduler, how many coflows differ between A and B and the largest
relative difference |a - b| / max(|a|, |b|) (a coflow finished in one and not the other,
or missing from one, counts as differing with relative difference inf). Exit status 1
when any coflow differs by more than 1e-12 relative (or a scheduler is missing from
one file), else 0.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from terra_core.registry import make_scheduler, scheduler_names
from terra_sim.simulator import empty_wan_gammas, simulate
from terra_sim.sweep import open_sweep
from topologies import load_topology
from workloads import load_workload

TOLERANCE = 1e-12  # relative difference above which two CCTs differ


def scheduler_ccts(name: str, limit: int | None) -> dict[str, float | None]:
    """Simulate scheduler `name` on the FB trace over SWAN (first `limit` coflows, all when
    None); return {coflow id: CCT seconds, None when rejected or unfinished}."""
    topology = load_topology("swan")
    coflows = load_workload("fb", topology, limit=limit)
    gammas = empty_wan_gammas(coflows, topology, 4)
    result = simulate(make_scheduler(name, topology.copy()), coflows, (), gammas)
    return {c.id: c.cct_s for c in result.coflows}


def run_all(
    limit: int | None, jobs: int, dask: str | None = None
) -> dict[str, dict[str, float | None]]:
    """{scheduler: scheduler_ccts(scheduler, limit)} for every registered scheduler, up to
    `jobs` at once (each in its own process; the runs are deterministic), or on the Dask
    scheduler at address `dask` (terra_sim/sweep.py)."""
    names = scheduler_names()
    with open_sweep(max(1, min(jobs, len(names))), dask) as sweep:
        if sweep.executor is None:
            return {n: scheduler_ccts(n, limit) for n in names}
        futures = {n: sweep.executor.submit(scheduler_ccts, n, limit) for n in names}
        return {n: futures[n].result() for n in names}


def relative_difference(a: float | None, b: float | None) -> float:
    """|a - b| / max(|a|, |b|); 0 when equal (both None included), inf when one is None."""
    if a == b:
        return 0.0
    if a is None or b is None:
        return math.inf
    return abs(a - b) / max(abs(a), abs(b))


def compare(a: dict, b: dict) -> tuple[list[str], bool]:
    """Compare two files' "ccts" objects; return (report lines, True when identical within
    TOLERANCE)."""
    lines, ok = [], True
    for name in sorted(set(a) | set(b), key=lambda n: (n not in a, n)):
        if name not in a or name not in b:
            lines.append(f"{name:<10} only in {'A' if name in a else 'B'}")
            ok = False
            continue
        ids = set(a[name]) | set(b[name])
        diffs = [relative_difference(a[name].get(i), b[name].get(i)) for i in ids]
        differ = sum(1 for d in diffs if d > 0)
        worst = max(diffs, default=0.0)
        over = sum(1 for d in diffs if d > TOLERANCE)
        ok = ok and over == 0
        lines.append(
            f"{name:<10} coflows {len(ids):>4}  differ {differ:>4}  "
            f"max rel diff {worst:.3g}  over {TOLERANCE:g}: {over}"
        )
    return lines, ok


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; returns the exit status (see the module docstring)."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--json", type=Path, help="write the CCTs of every scheduler here")
    p.add_argument("--limit", type=int, default=None, help="only the first N coflows")
    p.add_argument("--jobs", type=int, default=2, help="schedulers simulated at once")
    p.add_argument("--dask", default=None, metavar="tcp://HOST:PORT", help="Dask scheduler")
    p.add_argument("--compare", nargs=2, type=Path, metavar=("A.json", "B.json"))
    args = p.parse_args(argv)
    if args.compare:
        a, b = (json.loads(f.read_text())["ccts"] for f in args.compare)
        lines, ok = compare(a, b)
        print("\n".join(lines))
        print("identical" if ok else f"DIFFERENT (over {TOLERANCE:g} relative)")
        return 0 if ok else 1
    if args.json is None:
        p.error("--json OUT or --compare A B is required")
    start = time.monotonic()
    ccts = run_all(args.limit, args.jobs, args.dask)
    meta = {"topology": "swan", "workload": "fb", "limit": args.limit, "k": 4}
    meta["wall_s"] = round(time.monotonic() - start, 1)
    args.json.write_text(json.dumps({"meta": meta, "ccts": ccts}, indent=1))
    print(f"{len(ccts)} schedulers, {meta['wall_s']} s wall -> {args.json}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
