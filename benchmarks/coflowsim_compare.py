"""Per-coflow CCTs of CoflowSim and of terra-sim --coflowsim-compat, side by side.

CoflowSim (github.com/coflow/coflowsim, Java) is run outside the project; its per-coflow
CCTs are kept in benchmarks/results/coflowsim/fb_ccts.json so the comparison needs no Java:

    # 1. CoflowSim's source (any checkout) compiled with javac and run on the FB trace,
    #    SEBF and FAIR (about 30-60 min each on a loaded core); writes OUT_DIR/{SEBF,FAIR}.out
    python benchmarks/coflowsim_compare.py run --source COFLOWSIM_DIR --out OUT_DIR
    # 2. their per-coflow CCTs as the result file
    python benchmarks/coflowsim_compare.py extract --output SEBF=OUT_DIR/SEBF.out \
        --output FAIR=OUT_DIR/FAIR.out --commit COFLOWSIM_COMMIT --json RESULT.json
    # 3. terra-sim in compatibility mode, then the comparison
    terra-sim --topology bigswitch --coflowsim-compat --workload fb --scheduler varys \
        --json varys.json
    python benchmarks/coflowsim_compare.py compare --coflowsim RESULT.json \
        --terra varys.json --pair varys=SEBF

`compare` prints, per pair (terra-sim scheduler = CoflowSim algorithm), over the coflows
both finished: how many, the share whose CCTs are within 5 % (|ours / theirs - 1| <=
0.05), the median and average of ours / theirs, the average CCTs, and the coflows that
differ most. CoflowSim's CCT is its printed simulated duration in ms (finish - the epoch
start it admitted the coflow at), here in seconds.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from workloads import fb_trace_path

ALGORITHMS = ("SEBF", "FAIR")
WITHIN = 0.05  # relative tolerance of "agrees"
DEFAULT_RESULT = Path(__file__).parent / "results" / "coflowsim" / "fb_ccts.json"


def run_coflowsim(source: Path, out: Path, trace: Path) -> None:
    """Compile CoflowSim's Java sources under `source`/src with javac into `out`/classes
    and run SEBF and FAIR on `trace`, stdout to `out`/ALGO.out (stderr, its progress, to
    ALGO.err).

    Raises:
        subprocess.CalledProcessError: javac or java failed.
    """
    classes = out / "classes"
    classes.mkdir(parents=True, exist_ok=True)
    sources = sorted(str(p) for p in (source / "src").rglob("*.java"))
    subprocess.run(["javac", "-d", str(classes), *sources], check=True)
    for algo in ALGORITHMS:
        with open(out / f"{algo}.out", "w") as stdout, open(out / f"{algo}.err", "w") as err:
            cmd = ["java", "-cp", str(classes), "coflowsim.CoflowSim", algo]
            cmd += ["COFLOW-BENCHMARK", str(trace)]
            subprocess.run(cmd, stdout=stdout, stderr=err, check=True)


def parse_output(text: str) -> dict[str, float]:
    """CoflowSim's printStats lines -> {coflow id: CCT seconds}.

    A line is "JOB-<id> start finish mappers reducers total max duration_ms deadline sum";
    other lines (the closing sum) are skipped.
    """
    ccts = {}
    for line in text.splitlines():
        tok = line.split()
        if len(tok) >= 8 and tok[0].startswith("JOB-"):
            ccts[tok[0][4:]] = float(tok[7]) / 1000.0
    return ccts


def terra_ccts(path: Path, scheduler: str) -> dict[str, float]:
    """{coflow id: CCT seconds} of `scheduler` in a terra-sim --json file (finished ones).

    Raises:
        KeyError: the file has no results for `scheduler`.
    """
    coflows = json.loads(path.read_text())["results"][scheduler]["coflows"]
    return {c["id"]: c["cct_s"] for c in coflows if c.get("cct_s") is not None}


def agreement(ours: dict[str, float], theirs: dict[str, float]) -> dict:
    """Compare two {coflow id: CCT s} maps over the ids in both with CCTs > 0.

    Returns:
        {"coflows", "within_5pct" (share), "median_ratio", "mean_ratio" (of ours / theirs),
        "avg_cct_ours_s", "avg_cct_theirs_s", "worst": [(id, ours, theirs, ratio)] the ten
        largest |log ratio|}.

    Raises:
        ValueError: no coflow in common.
    """
    ids = [i for i in theirs if i in ours and theirs[i] > 0 and ours[i] > 0]
    if not ids:
        raise ValueError("no coflow in common")
    ratio = {i: ours[i] / theirs[i] for i in ids}
    worst = sorted(ids, key=lambda i: -abs(ratio[i] - 1) / min(ratio[i], 1))[:10]
    return {
        "coflows": len(ids),
        "within_5pct": sum(abs(r - 1) <= WITHIN for r in ratio.values()) / len(ids),
        "median_ratio": statistics.median(ratio.values()),
        "mean_ratio": statistics.fmean(ratio.values()),
        "avg_cct_ours_s": statistics.fmean(ours[i] for i in ids),
        "avg_cct_theirs_s": statistics.fmean(theirs[i] for i in ids),
        "worst": [(i, ours[i], theirs[i], ratio[i]) for i in worst],
    }


def format_agreement(name: str, algo: str, a: dict) -> str:
    """The lines `compare` prints for one pair."""
    lines = [
        f"{name} vs CoflowSim {algo}: {a['coflows']} coflows, within 5 %: "
        f"{100 * a['within_5pct']:.1f} %, ratio ours/CoflowSim median {a['median_ratio']:.4f} "
        f"average {a['mean_ratio']:.4f}; average CCT {a['avg_cct_ours_s']:.3f} s vs "
        f"{a['avg_cct_theirs_s']:.3f} s",
        "  most different (id, ours s, CoflowSim s, ratio): "
        + ", ".join(f"{i} {o:.3f} {t:.3f} {r:.3f}" for i, o, t, r in a["worst"]),
    ]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point (module docstring); returns the exit status."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="compile and run CoflowSim on the FB trace")
    r.add_argument("--source", type=Path, required=True, help="CoflowSim checkout")
    r.add_argument("--out", type=Path, required=True, help="directory for its outputs")
    r.add_argument("--trace", type=Path, default=fb_trace_path())
    e = sub.add_parser("extract", help="CoflowSim outputs -> per-coflow CCT file")
    e.add_argument(
        "--output", action="append", required=True, metavar="NAME=FILE",
        help="a CoflowSim stdout to keep under NAME (e.g. SEBF=SEBF.out); repeatable",
    )  # fmt: skip
    e.add_argument("--note", default=None, help="what the outputs are, kept in the file")
    e.add_argument("--commit", default=None, help="CoflowSim commit the outputs came from")
    e.add_argument("--json", type=Path, default=DEFAULT_RESULT)
    c = sub.add_parser("compare", help="terra-sim --json vs the CoflowSim CCT file")
    c.add_argument("--coflowsim", type=Path, default=DEFAULT_RESULT)
    c.add_argument("--terra", type=Path, required=True, help="terra-sim --json output")
    c.add_argument(
        "--pair", action="append", default=None, metavar="SCHEDULER=ALGO",
        help="terra-sim scheduler = CoflowSim algorithm (default: varys=SEBF and "
        "coflowsim-fair=FAIR, those in the file)",
    )  # fmt: skip
    args = p.parse_args(argv)
    if args.cmd == "run":
        run_coflowsim(args.source, args.out, args.trace)
        return 0
    if args.cmd == "extract":
        ccts = {}
        for spec in args.output:
            name, _, file = spec.partition("=")
            ccts[name] = parse_output(Path(file).read_text())
        meta = {"coflowsim": "github.com/coflow/coflowsim", "commit": args.commit}
        meta["trace"] = "FB2010-1Hr-150-0.txt"
        meta["units"] = "CCT seconds: CoflowSim's duration in ms / 1000"
        meta["note"] = args.note
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"meta": meta, "ccts": ccts}, indent=1, sort_keys=True))
        print(", ".join(f"{n}: {len(c)} coflows" for n, c in ccts.items()), f"-> {args.json}")
        return 0
    theirs = json.loads(args.coflowsim.read_text())["ccts"]
    results = json.loads(args.terra.read_text())["results"]
    pairs = [pair.split("=", 1) for pair in args.pair or ()]
    if not pairs:
        pairs = [[s, a] for s, a in (("varys", "SEBF"), ("coflowsim-fair", "FAIR"))]
        pairs = [[s, a] for s, a in pairs if s in results and a in theirs]
    for name, algo in pairs:
        if name not in results or algo not in theirs:
            print(f"no {name} in {args.terra} or no {algo} in {args.coflowsim}", file=sys.stderr)
            return 2
        print(format_agreement(name, algo, agreement(terra_ccts(args.terra, name), theirs[algo])))
    return 0


if __name__ == "__main__":
    sys.exit(main())
