"""Figures table of the starvation guards from saved terra-sim JSONs.

    uv run python benchmarks/guard_table.py [--guard-dir benchmarks/results/guard] [--json OUT]

For SWAN, G-Scale and ATT (whole FB trace, 1 Gbps, K=4) it reads Terra with α = 0
(results/alpha0), with the fixed α = 0.1 reserve (results/fulltrace) and with the aged
guard ({topology}_all_1g_k4_terra_aged.json in --guard-dir), the five baselines
(results/fulltrace) and the lower bound on any scheduler's average CCT
(results/ceiling/fb_1gbps.json), and prints per Terra variant: average CCT (s), ratio to
the α = 0 average, to the bound, and the FoI over each baseline (baseline's average
CCT / Terra's). A missing file is skipped.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"
TOPOLOGIES = ["swan", "gscale", "att"]
BASELINES = ["per-flow", "multipath", "swan-mcf", "varys", "rapier"]


def _avg(path: Path, name: str) -> float | None:
    """Average CCT (s) of scheduler `name` in terra-sim JSON `path`, None if absent."""
    if not path.exists():
        return None
    return json.loads(path.read_text())["results"][name]["avg_cct_s"]


def table(guard_dir: Path) -> dict:
    """{topology: {"bound_s", "baselines": {name: s}, "terra": {variant: {...}}}}.

    Each variant has "avg_cct_s", "over_alpha0", "over_bound" and "foi" ({baseline: ratio}).
    """
    ceiling = json.loads((RESULTS / "ceiling" / "fb_1gbps.json").read_text())
    out: dict = {}
    for topo in TOPOLOGIES:
        full = RESULTS / "fulltrace"
        bound = ceiling[topo]["1"]["bound_avg_cct_s"]
        base = {b: _avg(full / f"{topo}_all_1g_k4_{b}.json", b) for b in BASELINES}
        variants = {
            "alpha0": _avg(RESULTS / "alpha0" / f"{topo}_all_1g_k4_terra_alpha0.json", "terra"),
            "fixed0.1": _avg(full / f"{topo}_all_1g_k4_terra.json", "terra"),
            "aged": _avg(guard_dir / f"{topo}_all_1g_k4_terra_aged.json", "terra"),
        }
        a0 = variants["alpha0"]
        rows = {}
        for name, avg in variants.items():
            if avg is None:
                continue
            rows[name] = {
                "avg_cct_s": avg,
                "over_alpha0": avg / a0 if a0 else None,
                "over_bound": avg / bound,
                "foi": {b: v / avg for b, v in base.items() if v is not None},
            }
        out[topo] = {"bound_s": bound, "baselines": base, "terra": rows}
    return out


def main(argv=None) -> int:
    """Print the table (and write it with --json). Returns 0."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--guard-dir", type=Path, default=RESULTS / "guard")
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args(argv)
    data = table(args.guard_dir)
    print(
        f"{'topology':<8} {'terra':<9} {'avg s':>8} {'/a0':>6} {'/bound':>6}  FoI "
        + " ".join(BASELINES)
    )
    for topo, t in data.items():
        for name, r in t["terra"].items():
            foi = " ".join(f"{r['foi'].get(b, float('nan')):.2f}" for b in BASELINES)
            print(
                f"{topo:<8} {name:<9} {r['avg_cct_s']:8.2f} {r['over_alpha0']:6.3f} "
                f"{r['over_bound']:6.3f}  {foi}"
            )
    if args.json:
        args.json.write_text(json.dumps(data, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
