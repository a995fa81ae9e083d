"""The numpy array types of the scheduling core's annotations (a module's docstrings give
each array's shape and unit)."""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

FloatArray = NDArray[np.float64]  # bytes, bytes/s, seconds, member counts, weights
IntArray = NDArray[np.intp]  # indices (link rows, columns, CSR pointers) and counts
BoolArray = NDArray[np.bool_]  # masks
