"""Plots with many series (terra_sim/plot_style.py, mininet_scenarios/results.py): every drawn
series has its own colour, and the legend lists only series that draw a line."""

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt
import pytest
from matplotlib.colors import to_rgb

from mininet_scenarios.results import cdf_figure, throughput_figure
from mininet_scenarios.run_result import RunResult
from terra_sim.plot_style import MARKER_COLORS, drawable, series_styles

SHORT = {41, 43, 46}  # coflows that end within one 0.25 s step: one grid point, no line


def progress(arrival_s: float, duration_s: float, rate: float) -> list[tuple[float, float]]:
    """Cumulative (t, bytes) samples every 0.1 s of a coflow sending `rate` bytes/s."""
    steps = max(1, round(duration_s / 0.1))
    times = [arrival_s + i * duration_s / steps for i in range(steps + 1)]
    return [(t, rate * (t - arrival_s)) for t in times]


def synthetic_run(first: int, count: int) -> RunResult:
    """Coflows first .. first+count-1, arriving 0.3 s apart, 2 s long at 2-5 MB/s, except
    those in SHORT (0.2 s); the link goes down at 4 s and up at 10 s."""
    throughput = {
        cid: progress(0.3 * i, 0.2 if cid in SHORT else 2.0, 2e6 + 1e5 * i)
        for i, cid in enumerate(range(first, first + count))
    }
    return RunResult(throughput=throughput, failure_down_s=4.0, failure_up_s=10.0)


def legend_lines(fig):
    """{label: Line2D} of the axes' lines and markers the legend names."""
    ax = fig.axes[0]
    named = {line.get_label(): line for line in ax.get_lines()}
    return {text.get_text(): named[text.get_text()] for text in ax.get_legend().get_texts()}


@pytest.mark.parametrize("first,count", [(39, 12), (39, 30)])
def test_throughput_plot_has_distinct_colours_and_no_empty_legend_entries(first, count):
    fig = throughput_figure(synthetic_run(first, count), "terra")
    try:
        lines = legend_lines(fig)
        drawn = [c for c in range(first, first + count) if c not in SHORT]
        assert list(lines) == [f"coflow {c}" for c in drawn] + ["link down", "link up"]
        for label, line in lines.items():  # every entry draws a visible line
            assert (
                len(line.get_xydata()) >= 2 and line.get_linewidth() > 0 and line.get_visible()
            ), label
        colours = [to_rgb(line.get_color()) for line in lines.values()]
        assert len(set(colours)) == len(colours)  # coflows 39 and 49 no longer share blue
        notes = " ".join(t.get_text() for t in fig.texts)
        assert all(f"{c}" in notes for c in SHORT)
    finally:
        plt.close(fig)


def test_cdf_plot_leaves_out_systems_without_ccts():
    raw = {
        "schedulers": ["terra", "varys"],
        "terra": [RunResult(cct_s={1: 1.0, 2: 2.0})],
        "varys": [RunResult()],  # nothing finished: no curve, no entry
        "per_flow_tcp": [RunResult(cct_s={1: 3.0})],
    }
    fig = cdf_figure(raw)
    try:
        lines = legend_lines(fig)
        assert list(lines) == ["Terra", "per-flow TCP"]
        assert len({to_rgb(line.get_color()) for line in lines.values()}) == 2
    finally:
        plt.close(fig)


@pytest.mark.parametrize("count", [0, 1, 9, 10, 18, 19, 60, 300])
def test_series_styles_are_distinct_and_not_marker_colours(count):
    styles = series_styles(count)
    assert len(styles) == count
    colours = [to_rgb(s["color"]) for s in styles]
    assert len(set(colours)) == count
    assert not {to_rgb(c) for c in MARKER_COLORS} & set(colours)
    assert not [c for c in colours if c[0] == c[1] == c[2]]  # no grey


def test_drawable_needs_two_finite_points():
    assert drawable([0.0, 1.0], [1.0, 2.0])
    assert not drawable([0.5], [3.0])
    assert not drawable([], [])
    assert not drawable([0.0, 1.0], [1.0, float("nan")])
    with pytest.raises(ValueError):
        series_styles(-1)
