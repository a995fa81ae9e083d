"""The shape of a guaranteed reservation (docs/design.md 4.5: a tenant's guaranteed rate
between two DCs, an optional ceiling, an optional window), checked one way for the
tenants file and live changes (terra_controller.tenants_config) and for the scheduling
core (terra_core.reservations), which each frame the problem in their own terms."""

from __future__ import annotations

import math

FIELDS = ("dst", "rate_bytes_per_s", "ceil_bytes_per_s", "end_s")


def shape_problem(
    src: str,
    dst: str,
    rate: float,
    ceil: float | None = None,
    start: float | None = None,
    end: float | None = None,
) -> tuple[str, str] | None:
    """The first thing wrong with a reservation's shape, or None.

    Args:
        src, dst: DC names.
        rate: the guaranteed rate, bytes/s (a finite number > 0, not a bool).
        ceil: the most the tenant's traffic on the pair may get, bytes/s (finite, >= rate),
            or None (no ceiling).
        start, end: the window in seconds (start < end); None or an infinity: open.

    Returns:
        (field, problem): field one of FIELDS (named as the tenants file names it),
        problem a phrase without the field's name; None when the shape is right.
    """
    if src == dst:
        return "dst", f"same DC as src ({src!r})"
    if isinstance(rate, bool) or not 0 < rate < math.inf:
        return "rate_bytes_per_s", f"must be a finite number > 0, got {rate!r}"
    if ceil is not None and not rate <= ceil < math.inf:
        return "ceil_bytes_per_s", (f"must be finite and >= rate_bytes_per_s ({rate:.6g}), "
                                    f"got {ceil:.6g}")  # fmt: skip
    lo = -math.inf if start is None else start
    hi = math.inf if end is None else end
    if not lo < hi:
        return "end_s", f"must be after start_s ({lo:.6g}), got {hi:.6g}"
    return None
