"""`terra-sim`: run a workload through Terra and the baselines in the simulator.

    terra-sim --topology {swan,gscale,att,bigswitch,PATH} --workload {fb,PATH}
              [--scheduler {terra,per-flow,multipath,swan-mcf,varys,rapier,coflowsim-fair,all}
                           or a comma-separated list of names]
              [--k K] [--alpha A] [--guard {fixed,aged,aged-fair}] [--guard-factor F]
              [--guard-floor S] [--epsilon E] [--delta D] [--link-gbps G] [--deadline-factor F]
              [--limit N] [--coflowsim-compat] [--json OUT] [--plot OUT.png]
              [--fail-link A-B@T1[:T2]] [--bound] [--jobs N | --dask tcp://HOST:PORT]
              [--tenants N|FILE [--sharing {cooperative,strict,static}]
               [--tenant-order {share,wan}] [--greedy-tenant NAME]]
              [--log-level LEVEL] [--version]

Prints one table row per scheduler: average and 95th-percentile CCT, FoI of Terra over it
(its average CCT / Terra's), WAN utilization, average slowdown, deadlines met, admitted
coflows and wall time. --jobs N with several schedulers (all, or a list such as
terra,varys) simulates up to N at once, each in its own process, the costliest first (the
same results as one at a time); --dask tcp://HOST:PORT
simulates them on the workers of that Dask scheduler instead (terra_sim/sweep.py). With
--bound it also prints a lower bound on the average CCT (cct_bound.py) over every WAN
coflow and each scheduler's average over it: the cut bound and the mean Γ alone on the
empty WAN with K paths, or with --fail-link the cut bound only (re-routing after a failure
can beat Γ_empty; failures only remove capacity, so the cut bound computed before them
still holds). A scheduler that rejected or did not finish some WAN coflows averages over
fewer; its ratio is then marked.
With --tenants (docs/design.md 4.5; terra_sim/tenants.py; a .toml tenants file brings its
guaranteed reservations) Terra runs with tenants and the
JSON gives each scheduler's per-tenant average CCT ("per_tenant").
Under the table: how many coflows have only intra-DC flows (CCT 0, left out of the
statistics; "intra_dc_coflows" in the JSON) and the --fail-link changes.
Exit status: 0 on success; 2 on invalid input (options, an unknown topology, a workload
or topology file whose contents are invalid, an output path whose directory is missing or
not writable: checked before the run), with one line on stderr; 1 when a file cannot
be read or written (the line names it), --plot without matplotlib (the 'plots' extra),
--dask without dask.distributed (the 'sim' extra) or a Dask scheduler that does not answer,
or a simulation error. A progress bar per scheduler is drawn on stderr when it is a terminal.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
from collections.abc import Sequence
from concurrent.futures import as_completed
from pathlib import Path
from typing import NamedTuple

from terra_core.cli_support import (
    HelpFormatter,
    MissingExtra,
    add_common_args,
    progress,
    require,
    setup_logging,
)
from terra_core.registry import (
    add_scheduler_arguments,
    make_scheduler,
    options_from_args,
    scheduler_names,
)
from terra_core.tenant_shares import DEFAULT_ORDER, DEFAULT_SHARING, ORDERS, SHARINGS
from terra_model import WorkloadError
from terra_sim.cct_bound import CctBound, avg_cct_lower_bound
from terra_sim.coflowsim_compat import QUANTUM_S, coflowsim_topology
from terra_sim.errors import SimulationError
from terra_sim.events import WanChange
from terra_sim.plot_style import series_styles
from terra_sim.results import SimResult
from terra_sim.simulator import empty_wan_gammas, simulate, with_deadline_factor
from terra_sim.sweep import open_sweep
from terra_sim.tenants import per_tenant, tenant_spec, tenant_weights
from topologies import Topology, TopologyError, load_topology
from workloads import load_workload

SCHEDULERS = scheduler_names()  # the registry's (terra_core/registry.py), Terra first
CUT_NAMES = 8  # DCs a printed cut names at most


def build_parser() -> argparse.ArgumentParser:
    """Return the argument parser of terra-sim."""
    p = argparse.ArgumentParser(
        prog="terra-sim",
        description="Simulate a workload under Terra and the baselines on a WAN topology "
        "(flow level, event driven) and print average / p95 CCT, FoIs and WAN utilization.",
        formatter_class=HelpFormatter,
    )
    p.add_argument(
        "--topology", required=True, help="swan, gscale, att, bigswitch, or a JSON/GraphML file"
    )
    p.add_argument("--workload", required=True, help="fb, a coflow-benchmark trace, or .json")
    add_scheduler_arguments(p, choices_extra=["all"], several=True)
    p.set_defaults(scheduler="all")
    p.add_argument("--link-gbps", type=float, default=None, help="set every link to G Gbps")
    p.add_argument(
        "--deadline-factor", type=float, default=None, help="deadline = F x Γ in an empty WAN"
    )
    p.add_argument("--limit", type=int, default=None, help="only the first N coflows")
    p.add_argument(
        "--coflowsim-compat",
        action="store_true",
        help="bigswitch and a trace: simulate as CoflowSim's code does (docs/design.md 7)",
    )
    p.add_argument("--json", type=Path, default=None, metavar="OUT", help="write results as JSON")
    p.add_argument("--plot", type=Path, default=None, metavar="OUT.png", help="CCT CDF plot")
    p.add_argument(
        "--fail-link",
        action="append",
        default=[],
        metavar="A-B@T1[:T2]",
        help="link A-B goes down at T1 s (and up at T2 s); repeatable",
    )
    p.add_argument("--bound", action="store_true", help="print a lower bound on the average CCT")
    p.add_argument("--tenants", metavar="N|FILE",
                   help="coflow i to tenant i mod N, or a tenants file")  # fmt: skip
    p.add_argument(
        "--sharing", choices=SHARINGS, default=DEFAULT_SHARING, metavar="MODE",
        help="cooperative|strict|static",
    )  # fmt: skip
    p.add_argument(
        "--tenant-order", choices=ORDERS, default=DEFAULT_ORDER, metavar="ON",
        help="wan|share: Γ on the WAN or the share",
    )  # fmt: skip
    p.add_argument("--greedy-tenant", metavar="NAME", help="split its coflows in 100 (same bytes)")
    p.add_argument(
        "--jobs",
        type=int,
        default=1,
        metavar="N",
        help="with several schedulers: N at once (same results)",
    )
    p.add_argument(
        "--dask",
        default=None,
        metavar="tcp://HOST:PORT",
        help="with several schedulers: on this Dask cluster",
    )
    add_common_args(p)
    return p


def parse_fail_link(spec: str, topology: Topology) -> list[WanChange]:
    """Parse ``A-B@T1[:T2]`` into WanChanges (down at T1, up at T2).

    DC names may contain '-': every split point is tried until one names a link.

    Raises:
        ValueError: malformed spec, unknown link, times that are not finite numbers,
            negative times or T2 <= T1.
    """
    link, at, times = spec.rpartition("@")
    if not at or not link:
        raise ValueError(f"--fail-link {spec!r}: expected A-B@T1[:T2]")
    try:
        t = [float(x) for x in times.split(":")]
    except ValueError:
        raise ValueError(f"--fail-link {spec!r}: times must be numbers") from None
    if not all(math.isfinite(x) for x in t):
        raise ValueError(f"--fail-link {spec!r}: times must be finite numbers of seconds")
    if len(t) not in (1, 2) or t[0] < 0 or (len(t) == 2 and t[1] <= t[0]):
        raise ValueError(f"--fail-link {spec!r}: need 0 <= T1 (< T2)")
    ends = [
        (link[:i], link[i + 1 :])
        for i, ch in enumerate(link)
        if ch == "-" and (link[:i], link[i + 1 :]) in topology.capacity
    ]
    if not ends:
        raise ValueError(f"--fail-link {spec!r}: no link {link!r} in topology {topology.name}")
    a, b = ends[0]
    changes = [WanChange(t[0], a, b, up=False)]
    if len(t) == 2:
        changes.append(WanChange(t[1], a, b, up=True))
    return changes


def make_policy(name: str, topology: Topology, args: argparse.Namespace, tenants=None):
    """Return a fresh policy called `name` on `topology` (registry.make_scheduler with the
    options of `args` and `tenants`, a tenant_policy.TenantSpec or None).

    Raises:
        ValueError: unknown name or an option out of range.
    """
    return make_scheduler(name, topology, options_from_args(args, tenants=tenants))


def check_terra_options(args: argparse.Namespace, topology: Topology) -> None:
    """Check Terra's options (--alpha, --epsilon, --delta, the guard's) before any run,
    whichever schedulers run: a Terra policy is made on `topology` with them (its checks,
    terra_core/terra_policy.py) and dropped.

    Raises:
        ValueError: "invalid Terra option: ..." for an option out of range.
    """
    try:
        make_policy("terra", topology.copy(), args)
    except ValueError as exc:
        raise ValueError(f"invalid Terra option: {exc}") from None


class Inputs(NamedTuple):
    """What a run simulates: the topology (never mutated: each policy gets a copy), the
    scripted WAN changes, the coflows (with deadlines if --deadline-factor) and
    {coflow id: Γ_empty seconds}; with --tenants the TenantSpec (tenant_policy.py)."""

    topology: Topology
    changes: list[WanChange]
    coflows: list
    gammas: dict[str, float]
    quantum_s: float | None = None
    tenants: object | None = None


def load_inputs(args: argparse.Namespace) -> Inputs:
    """Check the options and load the topology, WAN changes and workload of `args`.

    Raises:
        TopologyError, WorkloadError, ValueError: invalid inputs.
    """
    if args.k < 1:
        raise ValueError(f"--k must be >= 1, got {args.k}")
    if args.limit is not None and args.limit < 1:
        raise ValueError(f"--limit must be >= 1, got {args.limit}")
    if args.jobs < 1:
        raise ValueError(f"--jobs must be >= 1, got {args.jobs}")
    if args.deadline_factor is not None and not args.deadline_factor > 0:
        raise ValueError(f"--deadline-factor must be positive, got {args.deadline_factor}")
    compat = getattr(args, "coflowsim_compat", False)
    if compat:
        topology = coflowsim_topology(args.topology, args.link_gbps)
    else:
        topology = load_topology(args.topology, link_gbps=args.link_gbps)
    check_terra_options(args, topology)
    changes = [ch for spec in args.fail_link for ch in parse_fail_link(spec, topology)]
    coflows = load_workload(args.workload, topology, limit=args.limit, coflowsim=compat)
    spec = None
    if getattr(args, "tenants", None):
        weights, reserved = tenant_weights(args.tenants, topology, args.k)
        coflows, spec = tenant_spec(
            coflows, weights, args.greedy_tenant, args.sharing, reserved,
            order=getattr(args, "tenant_order", DEFAULT_ORDER),
        )  # fmt: skip
    elif getattr(args, "greedy_tenant", None):
        raise ValueError("--greedy-tenant needs --tenants")
    gammas = empty_wan_gammas(coflows, topology, args.k)
    if args.deadline_factor is not None:
        coflows = with_deadline_factor(coflows, gammas, args.deadline_factor)
    return Inputs(topology, changes, coflows, gammas, QUANTUM_S if compat else None, spec)


def run(args: argparse.Namespace, inputs: Inputs | None = None) -> dict[str, SimResult]:
    """Simulate every requested scheduler on `inputs` (default: load_inputs(args)), return
    {name: SimResult}.

    Raises:
        TopologyError, WorkloadError, ValueError: invalid inputs.
    """
    inputs = inputs or load_inputs(args)
    names = SCHEDULERS if args.scheduler == "all" else args.scheduler.split(",")
    if (args.jobs > 1 or args.dask) and len(names) > 1:
        return _run_parallel(args, inputs, names)
    results = {}
    for name in names:
        result = _run_one(name, args, inputs, show_progress=True)
        if result is not None:
            results[name] = result
    return results


def _run_one(
    name: str, args: argparse.Namespace, inputs: Inputs, show_progress: bool
) -> SimResult | None:
    """Simulate scheduler `name` on `inputs`; None (and a note on stderr) when `name` does
    not apply to them under --scheduler all (the options themselves were checked before,
    by load_inputs: an invalid one is an error whatever --scheduler). Raises as `run`."""
    topology, changes, coflows, gammas, quantum_s, tenants = inputs
    try:
        policy = make_policy(name, topology.copy(), args, tenants)
    except ValueError as exc:
        if args.scheduler != "all":
            raise
        print(f"terra-sim: skipping {name}: {exc}", file=sys.stderr)
        return None
    if not show_progress:
        return simulate(policy, coflows, changes, gammas, quantum_s=quantum_s)
    with progress(len(coflows), desc=name, unit="coflow") as bar:
        return simulate(policy, coflows, changes, gammas, progress=bar, quantum_s=quantum_s)


def _run_parallel(
    args: argparse.Namespace, inputs: Inputs, names: Sequence[str]
) -> dict[str, SimResult]:
    """`run` with the schedulers simulated at once: on the Dask cluster of args.dask, else in
    up to args.jobs local processes (independent, deterministic runs, so the results equal
    the serial ones but for wall times), the costliest first (`_costly_first`). Each
    finished scheduler is reported on stderr; the results keep the order of `names`.

    Raises:
        as `run`; OSError: the Dask scheduler does not answer; MissingExtra: --dask without
        dask.distributed.
    """
    done: dict[str, SimResult | None] = {}
    with open_sweep(min(args.jobs, len(names)), args.dask) as sweep:
        pool, shared = sweep.executor, sweep.share(inputs)
        futures = {pool.submit(_run_one, n, args, shared, False): n for n in _costly_first(names)}
        for future in as_completed(futures):
            name = futures[future]
            done[name] = future.result()
            if done[name] is not None:
                print(f"terra-sim: {name} done in {done[name].wall_s:.1f} s", file=sys.stderr)
    return {n: done[n] for n in names if done.get(n) is not None}


# The schedulers by CPU time on large WANs, costliest first (GEANT 2012 and the 40-DC WAN,
# docs/results.md 1.6 and 2.2).
_BY_COST = ("swan-mcf", "terra", "rapier", "varys", "coflowsim-fair", "multipath", "per-flow")


def _costly_first(names: Sequence[str]) -> list[str]:
    """`names` with the costliest schedulers first (`_BY_COST`; others after, in order),
    the order in which parallel workers take them: starting the long runs first keeps
    the workers busy until near the end (longest processing time first)."""
    rank = {name: i for i, name in enumerate(_BY_COST)}
    return sorted(names, key=lambda name: rank.get(name, len(rank)))


def format_table(results: dict[str, SimResult]) -> str:
    """Return the results as a text table (FoI = scheduler's avg CCT / Terra's avg CCT)."""
    terra = results.get("terra")
    base = terra.avg_cct_s if terra else None
    width = max([10, *map(len, results)])  # the longest name: coflowsim-fair
    head = (
        f"{'scheduler':<{width}} {'avg CCT s':>11} {'p95 CCT s':>11} {'FoI':>6} {'WAN util':>8} "
        f"{'slowdown':>9} {'deadl.met':>9} {'admitted':>8} {'unfin.':>6} {'wall s':>7}"
    )
    lines = [head, "-" * len(head)]
    for name, r in results.items():
        foi = r.avg_cct_s / base if base and r.avg_cct_s is not None else None
        lines.append(
            f"{name:<{width}} {_num(r.avg_cct_s, 11, 2)} {_num(r.p95_cct_s, 11, 2)} "
            f"{_num(foi, 6, 2)} {_num(r.wan_utilization, 8, 3)} {_num(r.avg_slowdown, 9, 2)} "
            f"{r.deadlines_met:>9} {r.admitted:>8} {len(r.unfinished):>6} {r.wall_s:>7.1f}"
        )
    return "\n".join(lines)


def format_notes(results: dict[str, SimResult], changes: Sequence[WanChange]) -> list[str]:
    """Lines under the table: the coflows with only intra-DC flows (finished at arrival,
    CCT 0, left out of the statistics; the same for every scheduler) and the scripted
    link changes, each marked when it came after every run had ended."""
    lines = []
    first = next(iter(results.values()), None)
    if first is not None and first.intra_dc_coflows:
        lines.append(
            f"intra-DC coflows: {first.intra_dc_coflows} of {len(first.coflows)} (no WAN "
            "flow: CCT 0 at arrival, left out of the CCT, slowdown and deadline columns)"
        )
    end = max((r.end_s for r in results.values()), default=0.0)
    done = [
        f"{c.a}-{c.b} {_change_word(c)} at {c.time_s:g} s"
        + (" (after every run ended)" if c.time_s > end else "")
        for c in changes
    ]
    if done:
        lines.append(f"link changes: {'; '.join(done)}")
    return lines


def _change_word(change: WanChange) -> str:
    if change.up is None:
        return f"to {change.capacity:g} B/s"
    return "up" if change.up else "down"


def check_outputs(args: argparse.Namespace) -> None:
    """Check, before the run, that every output file (--json, --plot) can be written:
    its directory exists and is writable, and the path is not a directory.

    Raises:
        ValueError: naming the option and the path.
    """
    for option, out in (("--json", args.json), ("--plot", args.plot)):
        if out is None:
            continue
        folder = out.parent if str(out.parent) else Path(".")
        if out.is_dir():
            problem = "is a directory"
        elif not folder.is_dir():
            problem = f"no directory {folder}"
        elif not os.access(folder, os.W_OK | os.X_OK) or (
            out.exists() and not os.access(out, os.W_OK)
        ):
            problem = "cannot be written"
        else:
            continue
        raise ValueError(f"{option} {out}: {problem}")


def lower_bound(args: argparse.Namespace, inputs: Inputs) -> CctBound:
    """The lower bound on the average CCT over every WAN coflow of the run `args` describes.

    Computed on the WAN before any scripted change. Without --fail-link: the larger of
    the cut bound and the mean Γ_empty with K = args.k paths (a bound for every scheduler
    on the K shortest paths, as all of terra-sim's are). With --fail-link: the cut bound
    only (valid for any scheduler, as failures only remove capacity; Γ_empty is not a
    bound once the schedulers re-route around a failure). See cct_bound.py.

    Args:
        args: the parsed options.  inputs: what load_inputs(args) returned.

    Returns:
        CctBound (seconds).

    Raises:
        ValueError: no WAN coflow (from cct_bound).
    """
    gammas = None if args.fail_link else inputs.gammas
    return avg_cct_lower_bound(inputs.coflows, inputs.topology, gammas)


def format_bound(
    bound: CctBound, results: dict[str, SimResult], dcs: Sequence[str] | None = None
) -> str:
    """Return the bound line and every scheduler's average CCT over it.

    The cut is named by its source side (format_cut; `dcs`, the topology's DCs, lets a
    large side be named by the few DCs it leaves out). A scheduler whose average covers
    fewer WAN coflows than the bound (rejected or unfinished ones) gets "(over n of N
    coflows)" after its ratio: it is then not comparable with the bound.
    """
    ratios = ", ".join(
        f"{name} {r.avg_cct_s / bound.avg_cct_s:.2f}x{_subset_note(r, bound)}"
        for name, r in results.items()
        if r.avg_cct_s is not None and 0 < bound.avg_cct_s < float("inf")
    )
    cut = f"cut bound {bound.cut_avg_cct_s:.3f} s from {format_cut(bound.cut, dcs)}"
    if bound.isolation_avg_cct_s is None:
        head = f"lower bound on any scheduler's average CCT: {bound.avg_cct_s:.3f} s ({cut})"
    else:
        head = (
            f"lower bound on the average CCT of K-path schedulers: {bound.avg_cct_s:.3f} s "
            f"({cut}, valid for any scheduler; mean Γ alone {bound.isolation_avg_cct_s:.3f} s)"
        )
    return f"{head}; avg CCT / bound: {ratios or '-'}"


def format_cut(side: frozenset, dcs: Sequence[str] | None = None, most: int = CUT_NAMES) -> str:
    """Name a cut's source side: "{A, B}" when it has at most `most` DCs; else, when the
    other side is that small, "every DC but {C}" (of `dcs`); else "N DCs {A, B, ...}"
    (its first `most` DCs by name; the JSON's "cut" lists them all)."""
    if len(side) <= most:
        return "{" + ", ".join(sorted(side)) + "}"
    rest = [dc for dc in dcs or () if dc not in side]
    if dcs is not None and len(rest) <= most:
        return f"every DC but {{{', '.join(sorted(rest))}}}"
    return f"{len(side)} DCs {{{', '.join(sorted(side)[:most])}, ...}}"


def _subset_note(result: SimResult, bound: CctBound) -> str:
    done = sum(1 for c in result.coflows if c.wan and c.admitted and c.cct_s is not None)
    return "" if done == bound.coflows else f" (over {done} of {bound.coflows} coflows)"


def bound_json(bound: CctBound) -> dict:
    """Return {"avg_cct_s", "cut_avg_cct_s", "cut": [DCs], "isolation_avg_cct_s", "coflows"}."""
    return {
        "avg_cct_s": bound.avg_cct_s,
        "cut_avg_cct_s": bound.cut_avg_cct_s,
        "cut": sorted(bound.cut),
        "isolation_avg_cct_s": bound.isolation_avg_cct_s,
        "coflows": bound.coflows,
    }


def _num(value: float | None, width: int, digits: int) -> str:
    return f"{'-':>{width}}" if value is None else f"{value:>{width}.{digits}f}"


def run_meta(args: argparse.Namespace) -> dict:
    """Return the settings of a run: {"topology", "workload", "limit", "link_gbps", "k",
    "alpha", "guard", "guard_factor", "guard_floor_s", "epsilon", "delta", "deadline_factor",
    "fail_link", "coflowsim_compat", "tenants", "sharing", "tenant_order", "greedy_tenant",
    "commit"}
    (commit: $TERRA_COMMIT if
    set, for runs from an exported tree, else the git commit of this checkout, None when
    unknown; uncommitted edits are not recorded)."""
    return {
        "topology": args.topology,
        "workload": args.workload,
        "limit": args.limit,
        "link_gbps": args.link_gbps,
        "k": args.k,
        "alpha": args.alpha,
        "guard": args.guard,
        "guard_factor": args.guard_factor,
        "guard_floor_s": args.guard_floor_s,
        "epsilon": args.epsilon,
        "delta": args.delta,
        "deadline_factor": args.deadline_factor,
        "fail_link": list(args.fail_link),
        "coflowsim_compat": getattr(args, "coflowsim_compat", False),
        "tenants": getattr(args, "tenants", None),
        "sharing": getattr(args, "sharing", None),
        "tenant_order": getattr(args, "tenant_order", None),
        "greedy_tenant": getattr(args, "greedy_tenant", None),
        "commit": os.environ.get("TERRA_COMMIT") or git_commit(),
    }


def git_commit() -> str | None:
    """Return the short git commit of the checkout holding this file, or None."""
    try:
        done = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=Path(__file__).resolve().parent,
            capture_output=True,
            text=True,
            timeout=10,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return (done.stdout.strip() or None) if done.returncode == 0 else None


def results_json(
    results: dict[str, SimResult],
    meta: dict | None = None,
    bound: CctBound | None = None,
    tenants=None,
) -> dict:
    """Return {"results": {scheduler: SimResult.to_json()}, "meta": meta, "bound":
    bound_json(bound)} (meta and bound left out when None); with `tenants` (a
    tenant_policy.TenantSpec) each scheduler's object has "per_tenant" {name: {"avg_cct_s",
    "coflows"}} (terra_sim/tenants.py)."""
    out: dict = {"results": {n: r.to_json() for n, r in results.items()}}
    if tenants is not None:
        greedy = meta.get("greedy_tenant") if meta else None
        for n, r in results.items():
            out["results"][n]["per_tenant"] = per_tenant(r, tenants.tenant_of, greedy)
    if meta is not None:
        out["meta"] = meta
    if bound is not None:
        out["bound"] = bound_json(bound)
    return out


def write_json(
    results: dict[str, SimResult],
    out: Path,
    meta: dict | None = None,
    bound: CctBound | None = None,
    tenants=None,
) -> None:
    """Write `results_json(results, meta, bound, tenants)` to `out`."""
    out.write_text(json.dumps(results_json(results, meta, bound, tenants), indent=1))


def plot_cdf(results: dict[str, SimResult], out: Path) -> None:
    """Draw the CCT CDF of every scheduler (finished, admitted WAN coflows) to `out` (PNG),
    one colour each (plot_style.py); a scheduler without such a coflow is left out.

    Raises:
        MissingExtra: matplotlib is not installed (the 'plots' extra).
        OSError: `out` cannot be written.
    """
    matplotlib = require("matplotlib", "plots")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    curves = {}
    for name, r in results.items():
        ccts = sorted(c.cct_s for c in r.coflows if c.wan and c.cct_s is not None)
        if ccts:
            curves[name] = ccts
    for (name, ccts), style in zip(curves.items(), series_styles(len(curves)), strict=True):
        ys = [(i + 1) / len(ccts) for i in range(len(ccts))]
        ax.step(ccts, ys, where="post", label=name, **style)
    ax.set_xscale("log")
    ax.set_xlabel("CCT (s)")
    ax.set_ylabel("fraction of coflows")
    ax.grid(True, alpha=0.3)
    if curves:
        ax.legend()
    fig.tight_layout()
    fig.savefig(out)
    plt.close(fig)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of `terra-sim`. Returns the exit status (module docstring: 0 ok, 2 invalid
    input, 1 unreadable file, missing extra or simulation error)."""
    args = build_parser().parse_args(argv)
    setup_logging(args.log_level)
    try:
        check_outputs(args)
    except ValueError as exc:
        print(f"terra-sim: error: {exc}", file=sys.stderr)
        return 2
    for option, module, extra in (
        ("--plot", "matplotlib", "plots"),
        ("--dask", "distributed", "sim"),
    ):
        if getattr(args, option[2:]):
            try:
                require(module, extra)  # before a long run, not after it
            except MissingExtra as exc:
                print(f"terra-sim: error: {option}: {exc}", file=sys.stderr)
                return 1
    try:
        inputs = load_inputs(args)
        results = run(args, inputs)
        bound = lower_bound(args, inputs) if args.bound else None
    except (TopologyError, WorkloadError, ValueError, OSError) as exc:
        print(f"terra-sim: error: {exc}", file=sys.stderr)
        return 1 if _io_failure(exc) else 2
    except SimulationError as exc:
        print(f"terra-sim: simulation error: {exc}", file=sys.stderr)
        return 1
    print(format_table(results))
    for line in format_notes(results, inputs.changes):
        print(line)
    if bound is not None:
        print(format_bound(bound, results, inputs.topology.dcs))
    try:
        if args.json:
            write_json(results, args.json, run_meta(args), bound, inputs.tenants)
        if args.plot:
            plot_cdf(results, args.plot)
    except (OSError, MissingExtra) as exc:
        print(f"terra-sim: error: {exc}", file=sys.stderr)
        return 1
    return 0


def _io_failure(exc: BaseException) -> bool:
    """True when `exc` is (or was raised from) an OSError: a file that cannot be read."""
    return isinstance(exc, OSError) or isinstance(exc.__cause__, OSError)


if __name__ == "__main__":
    sys.exit(main())
