"""fb_table3 on a loopback Dask cluster against its serial run: the same table, and both wall times.

    uv run python benchmarks/dask_sweep.py [--workers 2] [--repeat 1] [--json OUT]
        [-- FB_TABLE3 ARGS ...]

Starts a ``dask scheduler`` and ``--workers`` ``dask worker`` processes on 127.0.0.1
(benchmarks/dask_cluster.py: one thread each, no nanny), then runs
``benchmarks/fb_table3.py ARGS --jobs 1`` (serial) and ``benchmarks/fb_table3.py ARGS
--dask tcp://127.0.0.1:PORT`` as processes, alternately, ``--repeat`` times each, and
prints the median wall time of each, their ratio, the 1-minute load average before and
after, and whether the two FoI tables (fb_table3 --json) are equal; exit status 1 when
they differ. The default ARGS are a cheap sweep: ``--topology swan gscale --limit 40``
(2 topologies x 6 schedulers = 12 cells). ``--json OUT`` writes the figures.
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

DEFAULT_ARGS = ["--topology", "swan", "gscale", "--limit", "40"]


def run_table(args: list[str], out: Path) -> float:
    """Run fb_table3 with `args` (its --json to `out`) as a process; return the wall seconds.

    Raises:
        RuntimeError: it exited with a non-zero status (its stderr's last lines in the text).
    """
    start = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.fb_table3", *args, "--json", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    wall = time.monotonic() - start
    if done.returncode != 0:
        raise RuntimeError(f"fb_table3 {args}: exit {done.returncode}: {done.stderr[-2000:]}")
    print(done.stdout.split("\n\n", 1)[-1].rstrip())  # the FoI table
    return wall


def main(argv: list[str] | None = None) -> int:
    """Run the comparison (module docstring); return 0 when the tables are equal, else 1."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--repeat", type=int, default=1)
    p.add_argument("--json", type=Path, default=None, metavar="OUT")
    p.add_argument("table_args", nargs="*", help="fb_table3's arguments (after --)")
    args = p.parse_args(argv)
    table_args = args.table_args or DEFAULT_ARGS
    load_before = os.getloadavg()
    walls: dict[str, list[float]] = {"serial": [], "dask": []}
    with tempfile.TemporaryDirectory(prefix="dask-sweep-") as tmp:
        tmpdir = Path(tmp)
        with loopback_dask_cluster(args.workers, tmpdir / "cluster") as cluster:
            variants = {"serial": ["--jobs", "1"], "dask": ["--dask", cluster.address]}
            for i in range(args.repeat):
                for name, extra in variants.items():
                    print(f"--- {name} run {i + 1}")
                    wall = run_table([*table_args, *extra], tmpdir / f"{name}.json")
                    walls[name].append(wall)
        tables = {n: json.loads((tmpdir / f"{n}.json").read_text()) for n in walls}
    load_after = os.getloadavg()
    medians = {n: statistics.median(w) for n, w in walls.items()}
    same = tables["serial"] == tables["dask"]
    print(
        f"\nfb_table3 {' '.join(table_args)}: serial {medians['serial']:.1f} s, Dask "
        f"({args.workers} loopback workers) {medians['dask']:.1f} s, speed-up "
        f"{medians['serial'] / medians['dask']:.2f}x (median of {args.repeat}); load average "
        f"{load_before[0]:.2f} before, {load_after[0]:.2f} after, on {os.cpu_count()} CPUs; "
        f"tables {'equal' if same else 'DIFFERENT'}"
    )
    if args.json:
        figures = {"args": table_args, "workers": args.workers, "wall_s": walls}
        figures |= {"median_s": medians, "load_before": load_before, "load_after": load_after}
        figures |= {"cpus": os.cpu_count(), "tables_equal": same, "table": tables["serial"]}
        args.json.write_text(json.dumps(figures, indent=1))
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
