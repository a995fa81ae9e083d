"""fb_table3 on a loopback Dask cluster against its serial run: the same table, and both wall times.

    uv run python benchmarks/dask_sweep.py [--workers 2] [--repeat 1] [--json OUT]
        [-- FB_TABLE3 ARGS ...]

Starts a ``dask scheduler`` and ``--workers`` ``dask worker`` processes on 127.0.0.1
(benchmarks/dask_cluster.py: one thread each, no nanny), then runs
``benchmarks/fb_table3.py ARGS --jobs 1`` (serial) and ``benchmarks/fb_table3.py ARGS
--dask tcp://127.0.0.1:PORT`` as processes, alternately, ``--repeat`` times each, and
prints the median wall time of each, their ratio, the Dask run's first wall time (the
workers import terra_sim, numba's kernels and the trace then) and the later ones' median,
the 1-minute load average before and after, and whether every run wrote the same part
files (per-coflow results, measured times left out) and FoI table (fb_table3 --json; only
with terra and all five baselines); exit status 1 when they differ. It also prints, from
the first serial run's part files, the sum of the cells' own wall times and the longest
cell: no schedule on W workers can end before max(sum / W, longest), so that bound says
how much of the gap is the sweep's shape.
The default ARGS are a cheap sweep: ``--topology swan gscale --limit 40`` (2 topologies
x 6 schedulers = 12 cells). ``--json OUT`` writes the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.dask_cluster import ROOT, loopback_dask_cluster
from benchmarks.fb_table3 import without_times

DEFAULT_ARGS = ["--topology", "swan", "gscale", "--limit", "40"]


def read_run(parts: Path, table: Path) -> dict:
    """What one fb_table3 run produced: {"parts": {file name: part without measured times},
    "cells": [wall seconds of every cell], "table": the --json FoI table or None (written only
    when some topology has terra and all five baselines)}."""
    run: dict = {"parts": {}, "cells": [], "table": None}
    for path in sorted(parts.glob("*.json")):
        part = json.loads(path.read_text())
        run["parts"][path.name] = without_times(part)
        run["cells"] += [r["wall_s"] for r in part["results"].values()]
    if table.exists():
        run["table"] = json.loads(table.read_text())
    return run


def differences(a, b, where: str = "") -> list[str]:
    """The paths (``/parts/<file>/results/terra/avg_cct_s``...) where two JSON values differ."""
    if isinstance(a, dict) and isinstance(b, dict):
        keys = sorted(set(a) | set(b), key=str)
        return [d for k in keys for d in differences(a.get(k), b.get(k), f"{where}/{k}")]
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        pairs = enumerate(zip(a, b, strict=True))
        return [d for i, (x, y) in pairs for d in differences(x, y, f"{where}[{i}]")]
    return [] if a == b else [where or "/"]


def run_table(args: list[str], out: Path) -> tuple[float, dict]:
    """Run fb_table3 with `args` as a process, its part files in the new folder `out` and its
    --json next to it; print its FoI table; return (wall seconds, read_run of it).

    Raises:
        RuntimeError: it exited with a non-zero status (its stderr's last lines in the text).
    """
    table = out.with_suffix(".table.json")
    start = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.fb_table3", *args, "--json", str(table)]
        + ["--reuse", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    wall = time.monotonic() - start
    if done.returncode != 0:
        raise RuntimeError(f"fb_table3 {args}: exit {done.returncode}: {done.stderr[-2000:]}")
    print(done.stdout.split("\n\n", 1)[-1].rstrip())  # the FoI table (or the parts' lines)
    return wall, read_run(out, table)


def main(argv: list[str] | None = None) -> int:
    """Run the comparison (module docstring); return 0 when the results are equal, else 1."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--repeat", type=int, default=1)
    p.add_argument("--json", type=Path, default=None, metavar="OUT")
    p.add_argument("table_args", nargs="*", help="fb_table3's arguments (after --)")
    args = p.parse_args(argv)
    table_args = args.table_args or DEFAULT_ARGS
    load_before = os.getloadavg()
    walls: dict[str, list[float]] = {"serial": [], "dask": []}
    runs = []
    with tempfile.TemporaryDirectory(prefix="dask-sweep-") as tmp:
        with loopback_dask_cluster(args.workers, Path(tmp) / "cluster") as cluster:
            variants = {"serial": ["--jobs", "1"], "dask": ["--dask", cluster.address]}
            for i in range(args.repeat):
                for name, extra in variants.items():
                    print(f"--- {name} run {i + 1}")
                    wall, run = run_table([*table_args, *extra], Path(tmp) / f"{name}{i}")
                    walls[name].append(wall)
                    runs.append(run)
    load_after = os.getloadavg()
    medians = {n: statistics.median(w) for n, w in walls.items()}
    warm = walls["dask"][1:] or walls["dask"]  # the first run also starts the workers' imports
    results = [{"parts": r["parts"], "table": r["table"]} for r in runs]
    diffs = sorted({d for r in results[1:] for d in differences(results[0], r)})
    same = not diffs
    cells = runs[0]["cells"]  # the first serial run's
    best = max(sum(cells) / args.workers, max(cells))
    print(
        f"\nfb_table3 {' '.join(table_args)}: serial {medians['serial']:.1f} s, Dask "
        f"({args.workers} loopback workers) {medians['dask']:.1f} s, speed-up "
        f"{medians['serial'] / medians['dask']:.2f}x (medians of {args.repeat}); Dask's first "
        f"run (cold workers) {walls['dask'][0]:.1f} s, the later ones' median "
        f"{statistics.median(warm):.1f} s; load average "
        f"{load_before[0]:.2f} before, {load_after[0]:.2f} after, on {os.cpu_count()} CPUs; "
        f"{len(runs[0]['parts'])} part files and the table "
        f"{'equal in every run' if same else 'DIFFERENT'}\n"
        f"{len(cells)} cells (first serial run): {sum(cells):.1f} s of simulation in all, the "
        f"longest {max(cells):.1f} s; no schedule on {args.workers} workers ends before "
        f"{best:.1f} s"
    )
    if diffs:
        print(
            f"differing between runs (meta/commit: the code changed during the runs): {diffs[:10]}"
        )
    if args.json:
        figures = {"args": table_args, "workers": args.workers, "wall_s": walls}
        figures |= {"median_s": medians, "load_before": load_before, "load_after": load_after}
        figures |= {"cpus": os.cpu_count(), "results_equal": same, "table": runs[0]["table"]}
        figures |= {"cell_wall_s": cells, "best_dask_s": best}
        args.json.write_text(json.dumps(figures, indent=1))
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
