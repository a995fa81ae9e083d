"""Line styles for plots with many series: a distinct colour per series, and which series
can be drawn at all (terra-sim --plot, terra-testbed --plots).

Colours: up to 9 series get matplotlib's qualitative "tab10" palette, up to 18 "tab20"
(its 10 strong colours first, then their 10 light ones), both without their greys (kept
for markers such as a link going down or up: MARKER_COLORS); more series get evenly
spaced colours along the "turbo" colormap (no grey, and without its near-black ends) with
the line style cycling through solid, dashed, dash-dot and dotted, so that neighbours in
hue also differ in style. Every series thus has its own colour, whatever their number.

Needs matplotlib (the 'plots' extra): the callers require it first.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

LINE_STYLES = ("-", "--", "-.", ":")
MARKER_COLORS = ("black", "0.45")  # for vertical markers: not in any series palette
TURBO_FROM, TURBO_TO = 24, 240  # of turbo's 256 colours: without its near-black ends


def _not_grey(colors: Sequence) -> list[tuple[float, float, float]]:
    """`colors` (RGB tuples) less the greys (R = G = B)."""
    return [tuple(c[:3]) for c in colors if not (c[0] == c[1] == c[2])]


def series_styles(count: int) -> list[dict]:
    """Keyword arguments for Axes.plot / Axes.step of `count` series, one dict each
    ({"color": (r, g, b), "linestyle": str}), every colour distinct (module docstring).

    Raises:
        ValueError: count < 0.
    """
    if count < 0:
        raise ValueError(f"count must be >= 0, got {count}")
    from matplotlib import colormaps
    from matplotlib.colors import LinearSegmentedColormap

    tab10 = _not_grey(colormaps["tab10"].colors)
    if count <= len(tab10):
        return [{"color": c, "linestyle": "-"} for c in tab10[:count]]
    tab20 = colormaps["tab20"].colors
    paired = _not_grey([*tab20[0::2], *tab20[1::2]])
    if count <= len(paired):
        return [{"color": c, "linestyle": "-"} for c in paired[:count]]
    turbo = colormaps["turbo"].colors[TURBO_FROM:TURBO_TO]
    ramp = LinearSegmentedColormap.from_list("series", turbo, N=count)
    return [
        {"color": tuple(ramp(i)[:3]), "linestyle": LINE_STYLES[i % len(LINE_STYLES)]}
        for i in range(count)
    ]


def drawable(xs: Sequence[float], ys: Sequence[float]) -> bool:
    """True when the series (xs, ys) draws a visible line: at least two points with finite
    coordinates (a single point, or none, draws nothing without a marker)."""
    finite = sum(
        1
        for x, y in zip(xs, ys, strict=True)
        if math.isfinite(float(x)) and math.isfinite(float(y))
    )
    return finite >= 2
