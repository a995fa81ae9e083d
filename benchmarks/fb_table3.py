"""FB workload on SWAN, G-Scale and ATT: FoI of Terra's average CCT over each baseline.

Prints our figures next to the paper's Table 3 FB column (docs/design.md section 9)
and writes them with ``--json OUT`` as ``{"<topology>": {"<baseline>": foi}}``.

    uv run python benchmarks/fb_table3.py [--topology swan gscale att] [--link-gbps G]
        [--limit N] [--k K] [--schedulers terra per-flow ...] [--reuse DIR] [--rerun NAME ...]
        [--jobs N | --dask tcp://HOST:PORT] [--json OUT] [--details OUT]
    uv run python benchmarks/fb_table3.py --combine PART.json ... [--json OUT] [--details OUT]

Every scheduler of a topology runs on the same link capacity (``--link-gbps``,
default 1 Gbps: README "Link capacity, and which FoIs any scheduler can reach" says why
the WAN is the bottleneck there).

Running the schedulers separately (the full trace takes minutes per baseline):

- ``--schedulers NAME ...`` runs only those schedulers (default: terra and the five
  baselines). The FoI table is printed (and ``--json`` written) for every topology
  whose results include terra and all five baselines.
- ``--reuse DIR`` keeps one *part file* per (topology, limit, link Gbps, K, scheduler)
  in DIR, named ``<topology>_<limit|all>_<G>g_k<K>_<scheduler>.json``: a part file that
  exists is loaded instead of simulated, a missing one is simulated and written. So a
  Terra change only needs ``--rerun terra`` (which re-simulates the named schedulers
  even when their part file exists).
- ``--combine PART.json ...`` simulates nothing: it reads part files (written by
  ``--reuse`` or by ``terra-sim --json``, both of which carry a ``meta`` object with
  the topology, limit, link Gbps and K) and prints/writes the table. Parts of one
  topology must agree on limit, link Gbps and K.

- ``--jobs N`` (default: the number of CPUs) simulates up to N missing parts at once,
  each in its own process (concurrent.futures.ProcessPoolExecutor); every run is
  independent and deterministic, so the results are those of ``--jobs 1`` (serial)
  except for the measured times (wall_s, round_ms_*). Each part file is written as
  soon as its run ends.
- ``--dask tcp://HOST:PORT`` simulates the missing parts on the workers of that Dask
  scheduler instead (terra_sim/sweep.py: dask.distributed, the 'sim' extra); the workers
  must import this checkout's code (``PYTHONPATH=<checkout> dask worker ...``). The
  results are again those of ``--jobs 1``; the part files are written here.

A part file has the shape of ``terra-sim --json`` (``{"results": {"<scheduler>":
{"avg_cct_s": x, "avg_slowdown": x, "wall_s": x, "coflows": [...], ...}}, "meta":
{"topology": ..., "limit": N|null, "link_gbps": G, "k": K, "commit": ...}}``).
``--details OUT`` writes ``{"<topology>": {"foi": {...}, "avg_cct_s": {...},
"avg_slowdown": {...}, "wall_s": {...}, "commit": {...}}}``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from concurrent.futures import Executor, Future, as_completed
from pathlib import Path

from terra_core.cli_support import MissingExtra
from terra_core.registry import scheduler_names
from terra_sim import cli as sim_cli
from terra_sim.sweep import open_sweep

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
# Terra and the paper's five baselines (terra_core/registry.py; coflowsim-fair is not one)
SCHEDULERS = [name for name in scheduler_names() if name == "terra" or name in PAPER_TABLE3["swan"]]
BASELINES = [name for name in SCHEDULERS if name != "terra"]


MEASURED = {"wall_s", "round_ms_median", "round_ms_p95"}  # measured times: differ run to run


def without_times(value):
    """`value` (a parsed part file, or any JSON value) with every MEASURED key removed,
    recursively: what must be equal between two runs of the same part, wherever they ran."""
    if isinstance(value, dict):
        return {k: without_times(v) for k, v in value.items() if k not in MEASURED}
    if isinstance(value, list):
        return [without_times(v) for v in value]
    return value


def part_name(topology: str, limit: int | None, link_gbps: float, k: int, scheduler: str) -> str:
    """Return the part file name of one scheduler's run, e.g. ``gscale_all_1g_k4_varys.json``."""
    return f"{topology}_{limit or 'all'}_{link_gbps:g}g_k{k}_{scheduler}.json"


def run_part(topology: str, scheduler: str, link_gbps: float, limit: int | None, k: int) -> dict:
    """Simulate the FB trace on `topology` with one scheduler; return its part (see module doc).

    Raises:
        TopologyError, WorkloadError, ValueError: invalid inputs (from sim_cli.run).
    """
    args = sim_cli.build_parser().parse_args(
        ["--topology", topology, "--workload", "fb", "--link-gbps", str(link_gbps)]
        + ["--k", str(k), "--scheduler", scheduler]
        + (["--limit", str(limit)] if limit else [])
    )
    results = sim_cli.run(args)
    return sim_cli.results_json(results, sim_cli.run_meta(args))


def load_parts(paths: list[Path]) -> dict[str, dict]:
    """Read part files into {topology: {"meta": meta, "results": {scheduler: result}}}.

    Raises:
        ValueError: a file without a meta object, parts of one topology with different
            limit / link Gbps / K, or one scheduler given twice for a topology.
        OSError, json.JSONDecodeError: unreadable file.
    """
    by_topo: dict[str, dict] = {}
    for path in paths:
        part = json.loads(Path(path).read_text())
        meta = part.get("meta")
        if not isinstance(meta, dict) or "topology" not in meta:
            raise ValueError(f"{path}: no meta object naming the topology (not a part file)")
        key = {k: meta.get(k) for k in ("limit", "link_gbps", "k")}
        entry = by_topo.setdefault(meta["topology"], {"meta": key, "results": {}, "commit": {}})
        if entry["meta"] != key:
            raise ValueError(f"{path}: run settings {key} differ from {entry['meta']}")
        for name, result in part["results"].items():
            if name in entry["results"]:
                raise ValueError(f"{path}: scheduler {name!r} on {meta['topology']} given twice")
            entry["results"][name] = result
            entry["commit"][name] = meta.get("commit")
    return by_topo


def table_row(results: dict[str, dict], commits: dict[str, str | None]) -> dict:
    """FoI of terra over each baseline from per-scheduler results (dicts of part files).

    Returns:
        {"foi": {baseline: FoI}, "avg_cct_s": {scheduler: seconds},
         "avg_slowdown": {scheduler: x}, "wall_s": {scheduler: seconds},
         "commit": {scheduler: git commit or None}}.
    """
    terra = results["terra"]["avg_cct_s"]
    return {
        "foi": {b: results[b]["avg_cct_s"] / terra for b in BASELINES},
        "avg_cct_s": {n: r["avg_cct_s"] for n, r in results.items()},
        "avg_slowdown": {n: r["avg_slowdown"] for n, r in results.items()},
        "wall_s": {n: r.get("wall_s") for n, r in results.items()},
        "commit": commits,
    }


def start_gather(args: argparse.Namespace, pool: Executor | None = None) -> list[tuple]:
    """Load the reusable parts of every (topology, scheduler) of `args`; start the others.

    With `pool` None the missing parts are simulated here, one after the other (each
    written to --reuse as soon as it is done); else each is submitted to `pool` (a
    concurrent.futures executor) and finish_gather waits for it.

    Returns:
        [(topology, scheduler, part-file path or None, part dict or Future)] in the
        order of args.topology x args.schedulers.

    Raises:
        ValueError: a reused part file made with another topology, limit, link Gbps or K.
        OSError, json.JSONDecodeError: an unreadable part file.
    """
    started = []
    for topo in args.topology:
        for name in args.schedulers:
            cached = None
            if args.reuse:
                cached = args.reuse / part_name(topo, args.limit, args.link_gbps, args.k, name)
            if cached is not None and cached.exists() and name not in args.rerun:
                part = json.loads(cached.read_text())
                want = {"topology": topo, "limit": args.limit, "link_gbps": args.link_gbps}
                want["k"] = args.k
                got = {key: (part.get("meta") or {}).get(key) for key in want}
                if got != want:
                    raise ValueError(f"{cached}: made with {got}, not {want}")
                print(f"{topo} {name}: reusing {cached}", file=sys.stderr)
            elif pool is None:
                part = run_part(topo, name, args.link_gbps, args.limit, args.k)
                _write_part(cached, part)
            else:
                part = pool.submit(run_part, topo, name, args.link_gbps, args.limit, args.k)
            started.append((topo, name, cached, part))
    return started


def finish_gather(started: list[tuple]) -> dict[str, dict]:
    """Wait for the runs start_gather submitted (writing each part file as soon as its run
    ends, in completion order) and put the parts together in the original order.

    Returns {topology: {"results": {scheduler: result dict}, "commit": {scheduler: commit}}}.

    Raises:
        whatever a run raised (TopologyError, WorkloadError, ValueError), re-raised here.
    """
    pending = {part: cached for _, _, cached, part in started if isinstance(part, Future)}
    for future in as_completed(pending):
        _write_part(pending[future], future.result())
    out: dict[str, dict] = {}
    for topo, _name, _cached, part in started:
        if isinstance(part, Future):
            part = part.result()
        entry = out.setdefault(topo, {"results": {}, "commit": {}})
        entry["results"].update(part["results"])
        entry["commit"].update(dict.fromkeys(part["results"], part["meta"].get("commit")))
    return out


def gather(args: argparse.Namespace, pool: Executor | None = None) -> dict[str, dict]:
    """Simulate (or load from --reuse DIR) every requested scheduler on every topology,
    in `pool` when given (start_gather, finish_gather).

    Raises:
        ValueError: a reused part file made with another topology, limit, link Gbps or K.
        OSError, json.JSONDecodeError: an unreadable part file.

    Returns {topology: {"results": {scheduler: result dict}, "commit": {scheduler: commit}}}.
    """
    return finish_gather(start_gather(args, pool))


def _write_part(cached: Path | None, part: dict) -> None:
    """Write one part file into the --reuse directory (nothing when `cached` is None)."""
    if cached is not None:
        cached.parent.mkdir(parents=True, exist_ok=True)
        cached.write_text(json.dumps(part, indent=1))


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark; print the table; write --json OUT. Returns the exit status."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--topology", nargs="+", default=["swan", "gscale", "att"])
    p.add_argument("--link-gbps", type=float, default=1.0)
    p.add_argument("--limit", type=int, default=None, help="only the first N coflows")
    p.add_argument("--k", type=int, default=4)
    p.add_argument("--schedulers", nargs="+", choices=SCHEDULERS, default=SCHEDULERS)
    p.add_argument("--reuse", type=Path, default=None, metavar="DIR", help="part-file cache")
    p.add_argument("--rerun", nargs="+", choices=SCHEDULERS, default=[], metavar="NAME")
    p.add_argument("--combine", nargs="+", type=Path, default=None, metavar="PART.json")
    p.add_argument("--json", type=Path, default=None, metavar="OUT")
    p.add_argument("--details", type=Path, default=None, help="also write CCTs/slowdowns/wall")
    p.add_argument(
        "--jobs",
        type=int,
        default=os.cpu_count() or 1,
        metavar="N",
        help="simulate up to N (topology, scheduler) runs at once, one process each "
        "(default: the number of CPUs; 1 = serial)",
    )
    p.add_argument(
        "--dask",
        default=None,
        metavar="tcp://HOST:PORT",
        help="simulate the runs on the workers of this Dask scheduler instead of --jobs",
    )
    args = p.parse_args(argv)
    if args.jobs < 1:
        p.error("--jobs must be >= 1")
    try:
        if args.combine:
            parts = load_parts(args.combine)
        else:
            with open_sweep(args.jobs, args.dask) as sweep:
                parts = gather(args, sweep.executor)
    except (OSError, ValueError, KeyError, MissingExtra) as exc:  # JSONDecodeError: ValueError
        print(f"fb_table3: error: {exc}", file=sys.stderr)
        return 2
    details = {
        topo: table_row(entry["results"], entry["commit"])
        for topo, entry in parts.items()
        if set(SCHEDULERS) <= set(entry["results"])
    }
    for topo, entry in parts.items():
        for name, r in entry["results"].items():
            print(f"{topo} {name}: avg CCT {r['avg_cct_s']:.2f} s, wall {r.get('wall_s')} s")
    if not details:
        print("no topology has terra and all five baselines: no FoI table", file=sys.stderr)
        return 0
    out = {topo: row["foi"] for topo, row in details.items()}
    gbps = next(iter(parts.values())).get("meta", {}).get("link_gbps", args.link_gbps)
    links = "topology's own link capacities" if gbps is None else f"{gbps:g} Gbps links"
    print(f"\nFoI of Terra's average CCT, FB trace, {links}")
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
