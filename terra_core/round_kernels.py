"""Compiled loops of the scheduling round's rate passes (round_rates.consume), kept in
their own module so that their compiled code in `__pycache__` stays valid while the
passes around them change.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from terra_core.array_types import BoolArray, FloatArray, IntArray
from terra_core.maxmin_kernels import waterfill_kernel


@njit(cache=True, error_model="numpy")
def consume_kernel(
    left: FloatArray, ids: IntArray, lens: IntArray, x: FloatArray, hit: BoolArray
) -> None:  # pragma: no cover - compiled
    """left[i] = max(0, left[i] - x[p]) for every link i of every path p, in order.

    Args:
        left: float array (links,) of bytes/s, changed in place.
        ids: int array (entries,), the link indices of every path, one path after the other.
        lens: int array (paths,), the links per path.
        x: float array (paths,), each path's rate in bytes/s.
        hit: bool array (links,), set for every link a path crosses (in place).
    """
    k = 0
    for p in range(len(x)):
        xp = x[p]
        for _ in range(lens[p]):
            i = ids[k]
            k += 1
            hit[i] = True
            v = left[i] - xp
            left[i] = v if v > 0.0 else 0.0


def warm() -> None:
    """Load the kernels (from numba's cache in `__pycache__`, or compile them) with the
    argument types the round passes, so the first scheduling round does not pay it: about
    1.4 s from the cache, several seconds to compile. The controller builds its policy, and
    with it this, before it says it is ready."""
    consume_kernel(np.zeros(1), np.zeros(1, np.intp), np.ones(1, np.intp), np.zeros(1),
                   np.zeros(1, dtype=bool))  # fmt: skip
    one = np.ones(1, np.intp)
    zero = np.zeros(1, np.intp)
    waterfill_kernel(np.array([0, 1], np.intp), one, zero, one, zero, zero, np.ones(1),
                     np.ones(1), np.ones(1), np.zeros(2, dtype=bool), np.zeros(1, dtype=bool),
                     1e-6)  # fmt: skip
