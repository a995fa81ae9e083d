"""Results of the SWAN testbed experiment: the JSON summary, a table, PNG plots (issue 5 item 5).

`summary(raw)` turns `swan.run_swan`'s output into the issue's JSON map::

    {"terra": {"avg_cct_s", "p95_cct_s", "wan_utilization"}, "per_flow_tcp": {same keys},
     "foi_avg_cct", "foi_wan_utilization", "failure_reaction_s", "bytes_lost",
     "digest_mismatches", "rules_per_switch_max", "flow_mods_after_startup"}

FoI (docs/design.md section 2): per-flow TCP's average CCT / Terra's; for utilization the
ratio is Terra's / per-flow TCP's (> 1 means Terra keeps the WAN busier).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

TARGETS = {  # issue 5 targets: (key, comparison, bound)
    "foi_avg_cct": (">=", 1.55),
    "foi_wan_utilization": (">=", 1.64),
    "failure_reaction_s": ("<=", 1.0),
    "bytes_lost": ("==", 0),
    "digest_mismatches": ("==", 0),
    "rules_per_switch_max": ("<=", 168),
    "flow_mods_after_startup": ("==", 0),
}


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
    """{"avg_cct_s", "p95_cct_s", "wan_utilization"} pooled over repeated runs (RunResults).

    CCT statistics are over every coflow of every run; utilization is the runs' total WAN
    bytes / their total (capacity x busy time), e.g. runs (bytes 10, capacity 10 B/s, busy
    1 s) and (bytes 30, 10 B/s, 3 s): 40 / (10 + 30) = 1.0.
    """
    ccts = {(i, c): v for i, run in enumerate(runs) for c, v in run.cct_s.items()}
    avg, p95 = cct_stats(ccts)
    capacity_time = sum(run.wan_capacity_bps * run.busy_s for run in runs)
    sent = sum(run.wan_bytes_sent for run in runs)
    util = sent / capacity_time if capacity_time > 0 else 0.0
    return {"avg_cct_s": avg, "p95_cct_s": p95, "wan_utilization": util}


def summary(raw: dict) -> dict:
    """The issue's JSON map from run_swan's output (module docstring).

    Args:
        raw: {"terra": [RunResult], "per_flow_tcp": [RunResult] (one per repeat),
            "rules_per_switch": {dpid: n}, "flow_mods_after_startup": n}.

    The failure reaction is the slowest of the repeats; bytes lost and digest mismatches
    are summed over all runs of both systems.
    """
    terra_runs, tcp_runs = raw["terra"], raw["per_flow_tcp"]
    terra, tcp = run_summary(terra_runs), run_summary(tcp_runs)
    reactions = [r.reaction_s for r in terra_runs if r.reaction_s is not None]
    runs = [*terra_runs, *tcp_runs]
    return {
        "terra": terra,
        "per_flow_tcp": tcp,
        "foi_avg_cct": _ratio(tcp["avg_cct_s"], terra["avg_cct_s"]),
        "foi_wan_utilization": _ratio(terra["wan_utilization"], tcp["wan_utilization"]),
        "failure_reaction_s": max(reactions) if reactions else None,
        "bytes_lost": sum(r.bytes_lost for r in runs),
        "digest_mismatches": sum(r.digest_mismatches for r in runs),
        "rules_per_switch_max": max(raw["rules_per_switch"].values(), default=0),
        "flow_mods_after_startup": raw["flow_mods_after_startup"],
    }


def _ratio(a: float, b: float) -> float:
    return a / b if b and b == b else float("nan")


def target_met(key: str, value) -> bool | None:
    """Whether `value` meets the issue's target for `key` (None: no target or no value)."""
    if key not in TARGETS or value is None:
        return None
    op, bound = TARGETS[key]
    return {">=": value >= bound, "<=": value <= bound, "==": value == bound}[op]


def table(result: dict) -> str:
    """A plain-text table of the summary (CCTs and utilization pooled over the repeats) with
    the issue's targets marked ok / MISSED."""
    t, p = result["terra"], result["per_flow_tcp"]
    lines = [
        f"{'':24}{'Terra':>12}{'per-flow TCP':>14}",
        f"{'avg CCT (s)':24}{t['avg_cct_s']:>12.2f}{p['avg_cct_s']:>14.2f}",
        f"{'p95 CCT (s)':24}{t['p95_cct_s']:>12.2f}{p['p95_cct_s']:>14.2f}",
        f"{'WAN utilization':24}{t['wan_utilization']:>12.3f}{p['wan_utilization']:>14.3f}",
        "",
    ]
    for key, (op, bound) in TARGETS.items():
        value = result[key]
        shown = "n/a" if value is None else (f"{value:.3f}" if isinstance(value, float) else value)
        met = target_met(key, value)
        mark = "n/a" if met is None else ("ok" if met else "MISSED")
        lines.append(f"{key:26}{shown!s:>10}   target {op} {bound}  {mark}")
    return "\n".join(lines)


def simulated_line(simulated: dict) -> str:
    """One line giving the FoIs the flow-level simulator finds for the same workload
    (mininet_scenarios.sim_twin.simulate_testbed's dict), to compare with the testbed's."""
    return (
        f"simulator, same workload (ideal Terra vs ideal per-flow TCP): "
        f"foi_avg_cct {simulated['foi_avg_cct']:.3f}, "
        f"foi_wan_utilization {simulated['foi_wan_utilization']:.3f} "
        f"(utilization {simulated['terra']['wan_utilization']:.3f} vs "
        f"{simulated['per_flow_tcp']['wan_utilization']:.3f})"
    )


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
    """Per-repeat CCTs, arrivals, failure times, bytes and FoIs of both systems, for the JSON."""
    out = {"workload": workload, "rules_per_switch": raw["rules_per_switch"], "repeats": []}
    for terra, tcp in zip(raw["terra"], raw["per_flow_tcp"], strict=True):
        rep = {"foi_avg_cct": _ratio(cct_stats(tcp.cct_s)[0], cct_stats(terra.cct_s)[0])}
        for name, run in (("terra", terra), ("per_flow_tcp", tcp)):
            rep[name] = {
                "cct_s": {str(k): v for k, v in run.cct_s.items()},
                "arrival_s": {str(k): v for k, v in run.arrival_s.items()},
                "duration_s": run.duration_s,
                "busy_s": run.busy_s,
                "wan_bytes_sent": run.wan_bytes_sent,
                "wan_capacity_bytes_per_s": run.wan_capacity_bps,
                "wan_utilization": run.wan_utilization,
                "failure_down_s": run.failure_down_s,
                "failure_up_s": run.failure_up_s,
            }
        rep["foi_wan_utilization"] = _ratio(terra.wan_utilization, tcp.wan_utilization)
        rep["terra"]["reaction_s"] = terra.reaction_s
        rep["terra"]["controller_event_to_applied_ms"] = terra.controller_reaction_ms
        rep["terra"]["rounds"] = terra.rounds
        rep["terra"]["round_ms_median"] = _median(terra.round_ms)
        rep["terra"]["round_ms_max"] = max(terra.round_ms, default=None)
        out["repeats"].append(rep)
    return out


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
    """PNG plots: Terra's per-coflow throughput over time in the first repeat (failure marked)
    and the CCT CDFs of all repeats.

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
    terra = raw["terra"][0]
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for cid, series in sorted(terra.throughput.items(), key=lambda kv: str(kv[0])):
        t, rate = windowed_rate(series)
        if len(t):
            ax.plot(t, rate * 8 / 1e6, label=f"coflow {cid}", linewidth=1)
    if terra.failure_down_s is not None:
        ax.axvline(terra.failure_down_s, color="red", linestyle="--", label="link down")
    if terra.failure_up_s is not None:
        ax.axvline(terra.failure_up_s, color="green", linestyle="--", label="link up")
    ax.set_xlabel("time since first arrival (s)")
    ax.set_ylabel("throughput (Mbit/s)")
    ax.set_title("Terra on the SWAN testbed: per-coflow throughput (first run)")
    ax.legend(fontsize=6, ncol=2)
    paths = [out_dir / "throughput.png", out_dir / "cct_cdf.png"]
    fig.tight_layout()
    fig.savefig(paths[0], dpi=120)
    plt.close(fig)
    fig, ax = plt.subplots(figsize=(6, 4))
    for name, label in (("terra", "Terra"), ("per_flow_tcp", "per-flow TCP")):
        values = np.sort(np.array([v for r in raw[name] for v in r.cct_s.values()], dtype=float))
        if values.size:
            ax.step(values, np.arange(1, values.size + 1) / values.size, where="post", label=label)
    ax.set_xlabel("CCT (s)")
    ax.set_ylabel("fraction of coflows")
    ax.set_title("CCT CDF, SWAN testbed")
    ax.legend()
    fig.tight_layout()
    fig.savefig(paths[1], dpi=120)
    plt.close(fig)
    return paths
