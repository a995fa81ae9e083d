"""Results of the SWAN testbed experiment: the JSON summary, a table, PNG plots.

`summary(raw)` turns `swan.run_swan`'s output into the summary JSON map::

    {"schedulers": [names, the first judged by the targets],
     name: {"avg_cct_s", "p95_cct_s", "wan_utilization"} for each scheduler,
     "per_flow_tcp": {same keys}, "foi_avg_cct", "foi_wan_utilization",
     "foi_avg_cct_by_scheduler": {name: per-flow TCP avg CCT / its avg CCT},
     "foi_terra_over": {name: its avg CCT / Terra's} (with Terra and others),
     "failure_reaction_s", "bytes_lost", "digest_mismatches", "rules_per_switch_max",
     "flow_mods_after_startup"}

FoI (docs/design.md section 2): per-flow TCP's average CCT / the first scheduler's
(Terra's by default); for utilization the ratio is the scheduler's / per-flow TCP's (> 1
means it keeps the WAN busier). Without a "schedulers" key, raw holds Terra's runs only.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

TARGETS = {  # what every testbed run must hold: (key, comparison, bound)
    "failure_reaction_s": ("<=", 1.0),
    "bytes_lost": ("==", 0),
    "digest_mismatches": ("==", 0),
    "rules_per_switch_max": ("<=", 168),
    "flow_mods_after_startup": ("==", 0),
}
# The FoIs are judged against the simulated twin (the same workload in the flow-level
# simulator: what the scheduling allows on this slice); the paper's testbed figures (Terra
# paper, section 6) are shown beside them as references, not as targets of this slice.
PAPER_FOIS = {"foi_avg_cct": 1.55, "foi_wan_utilization": 1.64}


def cct_stats(cct_s: dict) -> tuple[float, float]:
    """(average, 95th percentile) of {coflow: CCT seconds}; (nan, nan) when empty.

    The percentile is numpy's linear interpolation: for CCTs [1, 2, 3, 4, 5],
    p95 = 4 + 0.8 * (5 - 4) = 4.8.
    """
    values = np.array(list(cct_s.values()), dtype=float)
    if values.size == 0:
        return float("nan"), float("nan")
    return float(values.mean()), float(np.percentile(values, 95))


def run_summary(runs: list) -> dict:
    """{"avg_cct_s", "p95_cct_s", "wan_utilization", "wan_utilization_ofctl"} pooled over
    repeated runs (RunResults); utilization from the OpenFlow port statistics, and from
    `ovs-ofctl dump-ports` for comparison.

    CCT statistics are over every coflow of every run; utilization is the runs' total WAN
    bytes / their total available capacity x busy time (RunResult.capacity_time), e.g. runs
    (bytes 10, capacity 10 B/s, busy 1 s) and (bytes 30, 10 B/s, 3 s): 40 / (10 + 30) = 1.0.
    """
    ccts = {(i, c): v for i, run in enumerate(runs) for c, v in run.cct_s.items()}
    avg, p95 = cct_stats(ccts)
    capacity_time = sum(run.capacity_time for run in runs)
    sent = sum(run.wan_bytes_sent for run in runs)
    sent_ofctl = sum(run.wan_bytes_sent_ofctl for run in runs)
    util = sent / capacity_time if capacity_time > 0 else 0.0
    util_ofctl = sent_ofctl / capacity_time if capacity_time > 0 else 0.0
    return {"avg_cct_s": avg, "p95_cct_s": p95, "wan_utilization": util,
            "wan_utilization_ofctl": util_ofctl}  # fmt: skip


def scheduler_names(raw: dict) -> list[str]:
    """The schedulers of a run_swan result, first = the one the targets judge (["terra"]
    for results without a "schedulers" key)."""
    return list(raw.get("schedulers") or ["terra"])


def summary(raw: dict) -> dict:
    """The summary JSON map from run_swan's output (module docstring).

    Args:
        raw: {"schedulers": [names] (optional, default ["terra"]), name: [RunResult] for
            each, "per_flow_tcp": [RunResult] (one per repeat), "rules_per_switch":
            {dpid: n}, "flow_mods_after_startup": n}.

    The failure reaction is the slowest of the first scheduler's repeats; bytes lost and
    digest mismatches are summed over all runs of every system.
    """
    names = scheduler_names(raw)
    first, tcp_runs = names[0], raw["per_flow_tcp"]
    out: dict = {"schedulers": names}
    for name in names:
        out[name] = run_summary(raw[name])
    tcp = out["per_flow_tcp"] = run_summary(tcp_runs)
    reactions = [r.reaction_s for r in raw[first] if r.reaction_s is not None]
    runs = [*tcp_runs, *(r for name in names for r in raw[name])]
    out["foi_avg_cct"] = _ratio(tcp["avg_cct_s"], out[first]["avg_cct_s"])
    out["foi_wan_utilization"] = _ratio(out[first]["wan_utilization"], tcp["wan_utilization"])
    out["foi_avg_cct_by_scheduler"] = {
        name: _ratio(tcp["avg_cct_s"], out[name]["avg_cct_s"]) for name in names
    }
    if "terra" in names and len(names) > 1:
        out["foi_terra_over"] = {
            name: _ratio(out[name]["avg_cct_s"], out["terra"]["avg_cct_s"])
            for name in names if name != "terra"
        }  # fmt: skip
    out.update({
        "failure_reaction_s": max(reactions) if reactions else None,
        "bytes_lost": sum(r.bytes_lost for r in runs),
        "digest_mismatches": sum(r.digest_mismatches for r in runs),
        "rules_per_switch_max": max(raw["rules_per_switch"].values(), default=0),
        "flow_mods_after_startup": raw["flow_mods_after_startup"],
    })  # fmt: skip
    return out


def _ratio(a: float, b: float) -> float:
    return a / b if b and b == b else float("nan")


def target_met(key: str, value) -> bool | None:
    """Whether `value` meets the TARGETS bound for `key` (None: no bound or no value; the
    FoIs have none: they are compared with the simulated twin, `foi_lines`)."""
    if key not in TARGETS or value is None:
        return None
    op, bound = TARGETS[key]
    return {">=": value >= bound, "<=": value <= bound, "==": value == bound}[op]


def table(result: dict, simulated: dict | None = None) -> str:
    """A plain-text table of the summary (CCTs and utilization pooled over the repeats), one
    column per scheduler and per-flow TCP; then the TARGETS marked ok / MISSED, and the FoIs
    next to the simulated twin's (`simulated`, sim_twin.simulate_testbed) with the paper's
    figures as references (`foi_lines`)."""
    names = [*scheduler_names(result), "per_flow_tcp"]
    heads = {"terra": "Terra", "per_flow_tcp": "per-flow TCP"}
    rows = [("avg CCT (s)", "avg_cct_s", ".2f"), ("p95 CCT (s)", "p95_cct_s", ".2f"),
            ("WAN utilization", "wan_utilization", ".3f"),
            ("  (ovs-ofctl counters)", "wan_utilization_ofctl", ".3f")]  # fmt: skip
    lines = [f"{'':24}" + "".join(f"{heads.get(n, n):>14}" for n in names)]
    for label, key, fmt in rows:
        lines.append(f"{label:24}" + "".join(f"{result[n][key]:>14{fmt}}" for n in names))
    by = result.get("foi_avg_cct_by_scheduler")
    if by and len(by) > 1:
        lines.append(f"{'FoI over per-flow TCP':24}" + "".join(f"{by[n]:>14.2f}" for n in by))
    over = result.get("foi_terra_over")
    if over:
        cells = "".join(f"{'-':>14}" if n not in over else f"{over[n]:>14.2f}" for n in by)
        lines.append(f"{'FoI of Terra over it':24}" + cells)
    lines.append("")
    for key, (op, bound) in TARGETS.items():
        value = result[key]
        shown = "n/a" if value is None else (f"{value:.3f}" if isinstance(value, float) else value)
        met = target_met(key, value)
        mark = "n/a" if met is None else ("ok" if met else "MISSED")
        lines.append(f"{key:26}{shown!s:>10}   target {op} {bound}  {mark}")
    return "\n".join([*lines, *foi_lines(result, simulated)])


def foi_lines(result: dict, simulated: dict | None) -> list[str]:
    """One line per FoI of the first scheduler: the testbed's, the simulated twin's and their
    ratio (within UTILIZATION_TOLERANCE: "as simulated", else "differs from the twin"), and
    the paper's figure as a reference; without a twin only the reference."""
    lines = []
    for key, paper in PAPER_FOIS.items():
        value = result[key]
        text = f"{key:26}{value:>10.3f}   "
        twin = None if simulated is None else simulated.get(key)
        if twin:
            ratio = value / twin
            verdict = "as simulated" if abs(ratio - 1) <= UTILIZATION_TOLERANCE else "differs"
            text += f"simulated twin {twin:.3f} (x{ratio:.2f}: {verdict}); "
        lines.append(text + f"paper {paper} (reference)")
    return lines


def simulated_line(simulated: dict) -> str:
    """One line giving the FoIs the flow-level simulator finds for the same workload
    (mininet_scenarios.sim_twin.simulate_testbed's dict), to compare with the testbed's."""
    first = simulated.get("schedulers", ["terra"])[0]
    return (
        f"simulator, same workload (ideal {first} vs ideal per-flow TCP): "
        f"foi_avg_cct {simulated['foi_avg_cct']:.3f}, "
        f"foi_wan_utilization {simulated['foi_wan_utilization']:.3f} "
        f"(utilization {simulated[first]['wan_utilization']:.3f} vs "
        f"{simulated['per_flow_tcp']['wan_utilization']:.3f})"
    )


UTILIZATION_TOLERANCE = 0.10  # testbed vs simulated twin, relative


def utilization_vs_simulated(result: dict, simulated: dict) -> dict:
    """{name: testbed WAN utilization / the simulated twin's} for each scheduler and
    per-flow TCP (kernel TCP vs the simulator's per-flow max-min); nan without a figure."""
    names = [*scheduler_names(result), "per_flow_tcp"]
    return {
        n: _ratio(result[n]["wan_utilization"], (simulated.get(n) or {}).get("wan_utilization"))
        for n in names
    }


def simulated_table(result: dict, simulated: dict) -> str:
    """Lines comparing each system's testbed WAN utilization with its simulated twin's
    (same workload, same failure), marked ok within UTILIZATION_TOLERANCE."""
    lines = [f"{'WAN utilization':24}{'testbed':>10}{'simulated':>11}{'ratio':>8}"]
    for name, ratio in utilization_vs_simulated(result, simulated).items():
        sim = (simulated.get(name) or {}).get("wan_utilization")
        mark = "ok" if abs(ratio - 1) <= UTILIZATION_TOLERANCE else "MISSED"
        lines.append(
            f"{name:24}{result[name]['wan_utilization']:>10.3f}"
            f"{float('nan') if sim is None else sim:>11.3f}{ratio:>8.3f}  within 10 %: {mark}"
        )
    return "\n".join(lines)


def observe_lines(report: dict) -> str:
    """Lines summarizing what Prometheus saw (mininet_scenarios.observe.Observer.report)."""
    up = sum(state == "up" for state in report["targets"].values())
    lines = [f"prometheus: {up} of {len(report['targets'])} targets up at the end"]
    missing = report["missing"]
    lines.append("prometheus: every series has data" if not missing
                 else f"prometheus: no data for {', '.join(missing)}")  # fmt: skip
    alerts = ", ".join(f"{name} ({'/'.join(states)})" for name, states in report["alerts"].items())
    lines.append(f"prometheus alerts seen: {alerts or 'none'}")
    return "\n".join(lines)


def write_json(result: dict, path: Path, extra: dict | None = None) -> None:
    """Write the summary (plus `extra` under "details" when given) as JSON to `path`.

    Missing parent directories are created.
    """
    doc = dict(result)
    if extra:
        doc["details"] = extra
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=1, default=_plain) + "\n")


def _plain(value):
    if isinstance(value, np.generic):
        return value.item()
    return str(value)


def details(raw: dict, workload: dict) -> dict:
    """Per-repeat CCTs, arrivals, failure times, bytes and FoIs of every system, for the JSON
    (FoIs per repeat: per-flow TCP over the first scheduler)."""
    names = scheduler_names(raw)
    out = {"workload": workload, "rules_per_switch": raw["rules_per_switch"], "repeats": []}
    for i, tcp in enumerate(raw["per_flow_tcp"]):
        first = raw[names[0]][i]
        rep = {
            "foi_avg_cct": _ratio(cct_stats(tcp.cct_s)[0], cct_stats(first.cct_s)[0]),
            "foi_wan_utilization": _ratio(first.wan_utilization, tcp.wan_utilization),
        }
        rep["per_flow_tcp"] = _run_details(tcp)
        for name in names:
            if i < len(raw[name]):
                run = raw[name][i]
                rep[name] = _run_details(run)
                rep[name]["reaction_s"] = run.reaction_s
                rep[name]["controller_event_to_applied_ms"] = run.controller_reaction_ms
                rep[name]["rounds"] = run.rounds
                rep[name]["round_ms_median"] = _median(run.round_ms)
                rep[name]["round_ms_max"] = max(run.round_ms, default=None)
        out["repeats"].append(rep)
    return out


def _run_details(run) -> dict:
    return {
        "cct_s": {str(k): v for k, v in run.cct_s.items()},
        "arrival_s": {str(k): v for k, v in run.arrival_s.items()},
        "duration_s": run.duration_s,
        "busy_s": run.busy_s,
        "wan_bytes_sent": run.wan_bytes_sent,
        "wan_bytes_sent_ofctl": run.wan_bytes_sent_ofctl,
        "wan_capacity_bytes_per_s": run.wan_capacity_bps,
        "failed_capacity_bytes_per_s": run.failed_capacity_bps,
        "capacity_time_bytes": run.capacity_time,
        "wan_utilization": run.wan_utilization,
        "failure_down_s": run.failure_down_s,
        "failure_up_s": run.failure_up_s,
    }


def _median(values: list) -> float | None:
    return float(np.median(values)) if values else None


def windowed_rate(series, window_s: float = 1.0, step_s: float = 0.25):
    """Throughput (bytes/s) over a sliding window from cumulative progress samples.

    Args:
        series: [(t seconds, bytes delivered so far)], t increasing.

    Returns:
        (times, rates) numpy arrays: at each grid time t (every step_s from the first sample
        to the last), (B(t) - B(t - window_s)) / window_s with B linearly interpolated and
        B = 0 before the first sample. E.g. samples (0, 0), (2, 4e6): 2e6 bytes/s throughout.
    """
    if len(series) < 2:
        return np.array([]), np.array([])
    t = np.array([s[0] for s in series], dtype=float)
    b = np.array([s[1] for s in series], dtype=float)
    grid = np.arange(t[0] + step_s, t[-1] + step_s / 2, step_s)
    now = np.interp(grid, t, b, left=0.0)
    before = np.interp(grid - window_s, t, b, left=0.0)
    span = np.minimum(window_s, grid - t[0])
    return grid, (now - before) / span


def plot(raw: dict, out_dir: Path) -> list[Path]:
    """PNG plots: the first scheduler's per-coflow throughput over time in its first repeat
    (failure marked; throughput_figure) and the CCT CDFs of every system, all repeats pooled
    (cdf_figure).

    Returns:
        The written paths: out_dir/throughput.png, out_dir/cct_cdf.png.

    Raises:
        MissingExtra: matplotlib is not installed (the 'plots' extra).
    """
    from terra_core.cli_support import require

    matplotlib = require("matplotlib", "plots")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir.mkdir(parents=True, exist_ok=True)
    names = scheduler_names(raw)
    paths = [out_dir / "throughput.png", out_dir / "cct_cdf.png"]
    for path, make in zip(paths, (lambda: throughput_figure(raw[names[0]][0], names[0]),
                                  lambda: cdf_figure(raw)), strict=True):  # fmt: skip
        fig = make()
        try:
            fig.savefig(path, dpi=120)
        finally:
            plt.close(fig)
    return paths


def throughput_figure(run, name: str):
    """The matplotlib Figure of `run`'s (a RunResult) per-coflow throughput (Mbit/s, over a
    1 s sliding window: windowed_rate) against time, with the link failure and repair
    marked. Every coflow has its own colour (terra_sim/plot_style.py); a coflow whose series
    has fewer than two points (it ended within one step of the window) draws no line, so it
    is left out of the plot and its legend and named in a note under the axes instead.
    The caller closes the figure. Needs matplotlib."""
    import matplotlib.pyplot as plt

    from terra_sim.plot_style import MARKER_COLORS, drawable, series_styles

    drawn, short = [], []
    for cid, series in sorted(run.throughput.items(), key=lambda kv: str(kv[0])):
        t, rate = windowed_rate(series)
        (drawn if drawable(t, rate) else short).append((cid, t, rate))
    fig, ax = plt.subplots(figsize=(9, 4.8))
    for (cid, t, rate), style in zip(drawn, series_styles(len(drawn)), strict=True):
        ax.plot(t, rate * 8 / 1e6, label=f"coflow {cid}", linewidth=1, **style)
    marks = (("link down", run.failure_down_s, "--"), ("link up", run.failure_up_s, ":"))
    for (label, at, dash), color in zip(marks, MARKER_COLORS, strict=True):
        if at is not None:
            ax.axvline(at, color=color, linestyle=dash, linewidth=1.2, label=label)
    ax.set_xlabel("time since first arrival (s)")
    ax.set_ylabel("throughput (Mbit/s)")
    ax.set_title(f"{name} on the SWAN testbed: per-coflow throughput (first run)")
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=6, ncol=max(1, math.ceil(len(drawn) / 25)), loc="upper left",
                  bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0)  # fmt: skip
    if short:
        ids = ", ".join(str(cid) for cid, _, _ in short)
        fig.text(0.01, 0.01, f"not drawn (shorter than one 0.25 s step): coflow {ids}", fontsize=6)
    fig.tight_layout()
    return fig


def cdf_figure(raw: dict):
    """The matplotlib Figure of the CCT CDF of every system in `raw` (the schedulers and
    per-flow TCP, all repeats pooled), one colour each; systems without a CCT are left out.
    The caller closes the figure. Needs matplotlib."""
    import matplotlib.pyplot as plt

    from terra_sim.plot_style import series_styles

    fig, ax = plt.subplots(figsize=(6, 4))
    labels = {"terra": "Terra", "per_flow_tcp": "per-flow TCP"}
    curves = []
    for name in [*scheduler_names(raw), "per_flow_tcp"]:
        values = np.sort(np.array([v for r in raw[name] for v in r.cct_s.values()], dtype=float))
        if values.size:
            curves.append((labels.get(name, name), values))
    for (label, values), style in zip(curves, series_styles(len(curves)), strict=True):
        ys = np.arange(1, values.size + 1) / values.size
        ax.step(values, ys, where="post", label=label, **style)
    ax.set_xlabel("CCT (s)")
    ax.set_ylabel("fraction of coflows")
    ax.set_title("CCT CDF, SWAN testbed")
    if curves:
        ax.legend()
    fig.tight_layout()
    return fig


TAKEOVER_KEYS = ("kill_s", "leader_s", "agents_back_s", "takeover_s", "coflows_active",
                 "resubmitted", "coflows_submitted", "coflows_done", "coflows_unknown",
                 "flow_mods_at_takeover", "flow_mods_after_takeover",
                 "link_events_after_takeover", "submit_wait_max_s",
                 "submits_refused")  # fmt: skip


def takeover_summary(raw: dict) -> dict | None:
    """The leader's kill and the takeover (swan.run_swan with kill_leader_at), or None.

    Returns:
        {TAKEOVER_KEYS (controller_cluster.LeaderKill, takeover_checks), "bytes_lost",
        "digest_mismatches", "avg_cct_s" of the run with the kill, "avg_cct_s_without_kill"
        (the first scheduler's repeats before it, pooled; None without any),
        "cct_vs_without_kill" (their ratio), "ccts_spanning_kill" (coflows that arrived
        before the kill and ended after it: their CCTs count from the first submission)}.
        Without a kill in the run (it ended first): {"kill_s": None}.
    """
    report = raw.get("takeover")
    if report is None:
        return None
    if "kill_s" not in report:
        return {"kill_s": None}
    runs = raw[scheduler_names(raw)[0]]
    killed, before = runs[-1], runs[:-1]
    out = {key: report.get(key) for key in TAKEOVER_KEYS}
    out["bytes_lost"], out["digest_mismatches"] = killed.bytes_lost, killed.digest_mismatches
    out["avg_cct_s"] = cct_stats(killed.cct_s)[0]
    out["avg_cct_s_without_kill"] = run_summary(before)["avg_cct_s"] if before else None
    out["cct_vs_without_kill"] = (
        _ratio(out["avg_cct_s"], out["avg_cct_s_without_kill"]) if before else None
    )
    kill = report["kill_s"]
    out["ccts_spanning_kill"] = sum(
        killed.arrival_s[c] < kill < killed.arrival_s[c] + cct for c, cct in killed.cct_s.items()
    )
    return out


def takeover_lines(t: dict) -> str:
    """Plain-text lines of a takeover_summary."""
    if t.get("kill_s") is None:
        return "leader kill: the run ended before the kill was due"

    def s(key: str) -> str:
        return "not seen" if t[key] is None else f"{t[key]:.2f} s"

    lines = [
        f"leader killed (SIGKILL) {t['kill_s']:.2f} s after the first arrival, "
        f"{t['coflows_active']} coflows active; new leader: /healthz leader {s('leader_s')}, "
        f"agents back {s('agents_back_s')}, scheduling (takeover) {s('takeover_s')} after "
        "the kill",
        f"run with the kill: bytes lost {t['bytes_lost']}, digest mismatches "
        f"{t['digest_mismatches']}, coflows resubmitted {t['resubmitted']} (the new leader "
        f"has {t['coflows_done']} of {t['coflows_submitted']} done, "
        f"{t['coflows_unknown']} never submitted), flow-mods at takeover "
        f"{t['flow_mods_at_takeover']}, after it {t['flow_mods_after_takeover']} (for "
        f"{t['link_events_after_takeover']} link events); longest submit wait "
        f"{t['submit_wait_max_s']:.2f} s, {t['submits_refused']} refused (agents not back)",
    ]
    cct = f"avg CCT with the kill {t['avg_cct_s']:.3f} s"
    if t["avg_cct_s_without_kill"] is not None:
        cct += (f" vs {t['avg_cct_s_without_kill']:.3f} s without "
                f"({t['cct_vs_without_kill']:.3f}x)")  # fmt: skip
    lines.append(f"{cct}; {t['ccts_spanning_kill']} CCTs span the kill, counted from the "
                 "first submission")  # fmt: skip
    return "\n".join(lines)
