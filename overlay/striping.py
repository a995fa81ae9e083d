"""Striping a FlowGroup's chunks over its paths in proportion to the per-path rates.

docs/design.md section 5 ("Chunks": the sender stripes chunks over a FlowGroup's
paths in proportion to the per-path rates). The scheduler is weighted fair
queueing by virtual finish time (a deficit / weighted round-robin): path p
with rate r_p has a virtual clock V_p; a chunk of n bytes goes to the path
with the smallest V_p + n / r_p, which then advances by n / r_p. Over any
stretch of chunks the bytes per path follow the rates to within one chunk
per path.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Mapping


def _check_rates(path_rates: Mapping) -> dict:
    if not isinstance(path_rates, Mapping):
        raise ValueError(f"path rates must be a mapping, got {type(path_rates).__name__}")
    rates = {}
    for path_id, rate in path_rates.items():
        if isinstance(rate, bool) or not isinstance(rate, int | float):
            raise ValueError(f"rate of path {path_id!r} must be a number, got {rate!r}")
        if not math.isfinite(rate) or rate < 0:
            raise ValueError(f"rate of path {path_id!r} must be finite and >= 0, got {rate!r}")
        rates[path_id] = float(rate)
    return rates


class Striper:
    """Chooses the path of each next chunk so bytes per path follow the rates.

    Striper(path_rates: {path_id: bytes/s}); path ids are any hashable (tunnel
    ids, indices). Rates of 0 take a path out of the rotation.

    Attributes:
        assigned_bytes: {path_id: bytes handed to that path since creation}.

    Raises:
        ValueError: rates that are not a mapping of finite numbers >= 0.
    """

    def __init__(self, path_rates: Mapping[Hashable, float]) -> None:
        self.assigned_bytes: dict[Hashable, int] = {}
        self._rates: dict[Hashable, float] = {}
        self._vtime: dict[Hashable, float] = {}
        self.set_rates(path_rates)

    @property
    def rates(self) -> dict[Hashable, float]:
        """Current {path_id: bytes/s} (a copy)."""
        return dict(self._rates)

    def set_rates(self, path_rates: Mapping[Hashable, float]) -> None:
        """Replace the per-path rates (bytes/s); takes effect from the next chunk.

        Paths absent from `path_rates` are dropped. Virtual clocks restart at 0,
        so the new proportions hold from now on without paying back history.

        Raises:
            ValueError: see the class docstring.
        """
        rates = _check_rates(path_rates)
        self._rates = rates
        self._vtime = dict.fromkeys(rates, 0.0)
        for path_id in rates:
            self.assigned_bytes.setdefault(path_id, 0)

    def next_path(self, nbytes: int) -> Hashable | None:
        """Pick the path for the next chunk of `nbytes` bytes and account for it.

        Returns:
            The path id with the earliest virtual finish time (ties: first in
            the rates mapping), or None when every rate is 0 (nothing accounted).

        Raises:
            ValueError: nbytes not an int >= 0.
        """
        if isinstance(nbytes, bool) or not isinstance(nbytes, int) or nbytes < 0:
            raise ValueError(f"chunk size must be an int >= 0, got {nbytes!r}")
        best, best_finish = None, math.inf
        for path_id, rate in self._rates.items():
            if rate <= 0:
                continue
            finish = self._vtime[path_id] + nbytes / rate
            if finish < best_finish:
                best, best_finish = path_id, finish
        if best is not None:
            self._vtime[best] = best_finish
            self.assigned_bytes[best] += nbytes
        return best
