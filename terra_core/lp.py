"""Thin helpers around highspy's low-level API shared by the scheduling LPs.

The LPs of the scheduling core are small (tens to a few thousand columns) and
solved thousands of times per simulated hour, so they are passed to HiGHS as
column-wise (CSC) numpy arrays in one call, with output, presolve and
threading off (docs/design.md section 4).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar

import highspy
import numpy as np
from numpy.typing import NDArray

from terra_core.array_types import FloatArray

INF = highspy.kHighsInf


def new_highs(primal: bool = False) -> highspy.Highs:
    """Return a silent, single-threaded HiGHS instance set up for small LPs.

    Args:
        primal: use the primal simplex. Measured faster here both for
            re-solves where each change keeps the basis primal feasible
            (progressive filling in mcf.py: ~10x fewer iterations than the dual
            simplex) and for fresh Optimization (1) LPs (~1.6x on SWAN/ATT sizes).
    """
    h = highspy.Highs()  # type: ignore[no-untyped-call]  # (its __init__ has no `-> None`)
    h.silent()
    h.setOptionValue("output_flag", False)
    h.setOptionValue("presolve", "off")
    h.setOptionValue("threads", 1)
    h.setOptionValue("solver", "simplex")
    if primal:
        h.setOptionValue("simplex_strategy", 4)
    return h


def pass_lp(
    h: highspy.Highs,
    maximize: bool,
    cost: np.ndarray,
    col_lower: np.ndarray,
    col_upper: np.ndarray,
    row_lower: np.ndarray,
    row_upper: np.ndarray,
    start: np.ndarray,
    index: np.ndarray,
    value: np.ndarray,
) -> None:
    """Load an LP given column-wise into `h`, replacing any previous model.

    Args:
        h: a Highs instance (see `new_highs`).
        maximize: True to maximize cost @ x, False to minimize.
        cost, col_lower, col_upper: float64 arrays, one entry per column.
        row_lower, row_upper: float64 arrays, one entry per row (use INF / -INF).
        start: int32 array of len(columns) + 1 (CSC column starts, last = nnz).
        index, value: int32 row indices and float64 coefficients (CSC).

    Raises:
        RuntimeError: HiGHS refuses the model (malformed arrays).
    """
    sense = highspy.ObjSense.kMaximize if maximize else highspy.ObjSense.kMinimize
    status = h.passModel(
        len(cost),
        len(row_lower),
        len(value),
        int(highspy.MatrixFormat.kColwise),
        int(sense),
        0.0,
        np.ascontiguousarray(cost, dtype=np.float64),
        np.ascontiguousarray(col_lower, dtype=np.float64),
        np.ascontiguousarray(col_upper, dtype=np.float64),
        np.ascontiguousarray(row_lower, dtype=np.float64),
        np.ascontiguousarray(row_upper, dtype=np.float64),
        np.ascontiguousarray(start, dtype=np.int32),
        np.ascontiguousarray(index, dtype=np.int32),
        np.ascontiguousarray(value, dtype=np.float64),
        np.zeros(len(cost), dtype=np.int32),  # every column continuous
    )
    if status == highspy.HighsStatus.kError:
        raise RuntimeError("HiGHS rejected the LP (malformed model arrays)")


def change_rows_bounds(
    h: highspy.Highs,
    rows: NDArray[np.int32],
    lower: FloatArray,
    upper: FloatArray,
) -> None:
    """Set the bounds of the rows `rows` of `h` to `lower` .. `upper` (arrays of one length;
    HiGHS's changeRowsBounds by set, which highspy's type stubs leave out)."""
    h.changeRowsBounds(len(rows), rows, lower, upper)  # type: ignore[attr-defined]


def basic_variables(h: highspy.Highs) -> NDArray[np.int32]:
    """HiGHS's basic index of the solved model in `h` (getBasicVariables, which highspy's
    type stubs leave out): one entry per row, >= 0 a column index, < 0 row -1 - entry."""
    basic: NDArray[np.int32] = h.getBasicVariables()[1]  # type: ignore[attr-defined]
    return basic


# Called with each solve's wall time (seconds) in the current context (see `observe_solves`).
_SOLVE_OBSERVER: ContextVar[Callable[[float], None] | None] = ContextVar(
    "terra_lp_solve_observer", default=None
)


@contextmanager
def observe_solves(observer: Callable[[float], None]) -> Iterator[None]:
    """Within the block (this thread / context only), call `observer(seconds)` after every
    `solve` with its wall time in seconds (the controller's LP solve-time histogram)."""
    token = _SOLVE_OBSERVER.set(observer)
    try:
        yield
    finally:
        _SOLVE_OBSERVER.reset(token)


def solve(h: highspy.Highs) -> bool:
    """Run HiGHS on the loaded model; return True when an optimal solution was found."""
    observer = _SOLVE_OBSERVER.get()
    if observer is None:
        h.run()
    else:
        start = time.perf_counter()
        h.run()
        observer(time.perf_counter() - start)
    return h.getModelStatus() == highspy.HighsModelStatus.kOptimal
