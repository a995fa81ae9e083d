"""A coflow's solved Γ kept for later rounds, and the bounds on Γ it gives once the
coflow's FlowGroups have shrunk (docs/design.md 4.3, the Γ cache; TerraPolicy's hints).
"""

from __future__ import annotations

import math
import operator

import numpy as np

from terra_core.group_volumes import GroupVolumes, same_pairs
from terra_core.min_cct import TIGHT, DualBound, Pair

ARRAY_MIN = 64  # FlowGroups from which `GammaEntry.hint` runs in numpy passes


class GammaEntry:
    """Γ of a coflow's FlowGroup volumes on the WAN's capacities, with its DualBound.

    For the cached solve at volumes d with Γ and link prices y, later volumes d' (FlowGroups
    only shrink between updates) satisfy
        LB = Σ_k d'_k m_k(y) / Σ_e c_e y_e  <=  Γ(d')  <=  Γ · max_k d'_k / d_k = UB
    (weak duality; monotonicity and homogeneity of Γ, docs/design.md 4.1). When
    UB <= LB (1 + TIGHT) the value is exact; otherwise LB is a bound (`hint`).

    Attributes:
        volumes: {(src DC, dst DC): bytes} the Γ was solved for (read only).
        gamma_s: Γ in seconds.
        bound: the DualBound of the solve's prices.
    """

    __slots__ = (
        "volumes",
        "gamma_s",
        "bound",
        "_pos",
        "_old",
        "_price",
        "_keys",
        "_shared",
        "_idx",
    )

    def __init__(self, volumes: dict[Pair, float], gamma_s: float, bound: DualBound) -> None:
        self.volumes = volumes
        self.gamma_s = gamma_s
        self.bound = bound
        self._pos: dict[Pair, int] | None = None  # each pair's place in the arrays below
        self._old = self._price = np.zeros(0)  # d_k and m_k(y), in `volumes`' order
        self._keys: list[Pair] = []  # the pairs of the last `hint` call and their places
        self._shared: list[Pair] | None = None  # ... its GroupVolumes' pair list, if any
        self._idx = np.zeros(0, dtype=np.intp)

    def hint(self, volumes: dict[Pair, float]) -> tuple[float, bool] | None:
        """(bound on Γ in seconds of `volumes` ({pair: bytes}), exact), or None when this
        entry cannot bound them (a pair it has not, no FlowGroup, a FlowGroup of 0 bytes
        then, or Γ then infinite).

        UB is Γ · max_k d'_k / d_k and LB the DualBound's sum, taken in `volumes`' order
        one term after the other (a cumulative sum: the additions of a Python sum, so the
        same floats as the bound's own `gamma`)."""
        if math.isinf(self.gamma_s) or not volumes:
            return None
        if len(volumes) < ARRAY_MIN or not self._arrays_ok():  # (Python loops: cheaper)
            old_vol = self.volumes
            if not volumes.keys() <= old_vol.keys():
                return None
            try:
                ratios = map(operator.truediv, volumes.values(), map(old_vol.__getitem__, volumes))
                upper = self.gamma_s * max(ratios)
            except ZeroDivisionError:  # (a FlowGroup of 0 bytes then: no bound from the entry)
                return None
            lower = self.bound.gamma(volumes)
            return (upper, True) if upper <= lower * (1 + TIGHT) else (lower, False)
        idx = self._places(volumes)
        if idx is None:
            return None
        old = self._old[idx]
        if not old.all():
            return None
        if isinstance(volumes, GroupVolumes):
            d = volumes.array
        else:
            d = np.fromiter(volumes.values(), float, len(volumes))
        with np.errstate(all="ignore"):  # (inf and NaN as Python's floats give them)
            ratios = d / old
            top = float(ratios.max())
            if not top != 0.0 or top != top:  # (NaN or a zero max: Python max's first wins)
                top = max(ratios.tolist())
            upper = self.gamma_s * top
            lower = self._lower(d, idx)
        return (upper, True) if upper <= lower * (1 + TIGHT) else (lower, False)

    def _arrays_ok(self) -> bool:
        """The numpy passes apply: every pair of the entry has a price (else only the
        scalar path raises, as DualBound.gamma, for a priced pair that is missing)."""
        return self._pos is not None or self.bound.path_price.keys() >= self.volumes.keys()

    def _places(self, volumes: dict[Pair, float]) -> np.ndarray | None:
        """The places of `volumes`' pairs in the entry's arrays (int array), or None when
        one is not among the entry's pairs. The last call's are kept: a coflow's pairs
        stay the same, in the same order, from round to round until a FlowGroup ends (a
        GroupVolumes on the same pair list has the same pairs)."""
        if same_pairs(volumes, self._shared):
            return self._idx
        keys = list(volumes)
        if keys != self._keys:
            if self._pos is None:
                self._pos = {pair: i for i, pair in enumerate(self.volumes)}
                self._old = np.fromiter(self.volumes.values(), float, len(self.volumes))
                price = self.bound.path_price
                self._price = np.fromiter(map(price.__getitem__, self.volumes), float,
                                          len(self._pos))  # fmt: skip
            try:
                idx = np.fromiter(map(self._pos.__getitem__, keys), np.intp, len(keys))
            except KeyError:
                return None
            self._keys, self._idx = keys, idx
        self._shared = volumes.pairs if isinstance(volumes, GroupVolumes) else None
        return self._idx

    def _lower(self, d: np.ndarray, idx: np.ndarray) -> float:
        """DualBound.gamma of the volumes `d` (float array) on the pairs at `idx`."""
        cy = self.bound.capacity_price
        if cy <= 0:
            return 0.0
        terms = d * self._price[idx]
        positive = d > 0
        if not positive.all():
            terms = terms[positive]
        # (+ 0.0: Python's sum starts from 0, so it never ends on -0.0; 0.0 / cy for none)
        total = float(np.cumsum(terms)[-1]) + 0.0 if len(terms) else 0.0
        return total / cy


def same_volumes(a: dict[Pair, float], b: dict[Pair, float]) -> bool:
    """The same {pair: bytes} in the same order (the hints' sums run in that order); the
    same dict is (a dict handed in again, read only), and two GroupVolumes on one pair
    list are when their arrays are equal."""
    if a is b:
        return True
    if isinstance(a, GroupVolumes) and same_pairs(b, a.pairs):
        return bool(np.array_equal(a.array, b.array))  # type: ignore[attr-defined]
    return a == b and list(a) == list(b)
