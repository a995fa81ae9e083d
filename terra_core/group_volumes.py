"""One coflow's FlowGroup volumes as a read-only dict with its arrays beside it: the form a
caller that keeps its volumes in arrays (the simulator) hands to Terra's round, so the
round's per-FlowGroup checks and sums run in numpy passes (docs/design.md 4.2).

A `GroupVolumes` is a dict {(src DC, dst DC): bytes} like any other volumes dict (every
reader of a plain dict reads it the same way), plus
  * `pairs`: its keys in order, one list object shared by every GroupVolumes built for
    the same FlowGroups, so a reader that checked those pairs once can tell by identity
    that they are the same (the checks against the paths, a cached Γ's places);
  * `array`: its values in order (float64; the same floats).
"""

from __future__ import annotations

from typing import Any, NoReturn

from terra_core.array_types import FloatArray, IntArray

Pair = tuple[str, str]


class GroupVolumes(dict[Pair, float]):
    """A read-only {pair: bytes} with `pairs` (its keys, a shared list) and `array` (its
    values, float64) beside it (module docstring). Built by `build` or `updated` only;
    every mutating method raises TypeError."""

    __slots__ = ("pairs", "array")
    pairs: list[Pair]
    array: FloatArray

    @classmethod
    def build(cls, pairs: list[Pair], values: FloatArray) -> GroupVolumes:
        """The volumes `values` (float array, bytes, one per pair) of `pairs` (distinct DC
        pairs; kept by reference as `pairs`).

        Raises:
            ValueError: the lengths differ.
        """
        if len(pairs) != len(values):
            raise ValueError(f"{len(pairs)} pairs but {len(values)} volumes")
        out = cls(zip(pairs, values.tolist(), strict=True))
        out.pairs, out.array = pairs, values
        return out

    @classmethod
    def updated(cls, old: GroupVolumes, places: IntArray, values: FloatArray) -> GroupVolumes:
        """`old` with the pairs at `places` (int array, ascending, into `old.pairs`) set to
        their volumes in `values` (float array, bytes, one per pair of `old`): the same dict
        `build(old.pairs, values)` gives when the others are `old`'s, without hashing them.

        Raises:
            ValueError: `values` is not one volume per pair of `old`.
        """
        if len(values) != len(old.pairs):
            raise ValueError(f"{len(old.pairs)} pairs but {len(values)} volumes")
        out = cls(old)
        pairs = old.pairs
        at = places.tolist()
        dict.update(out, zip(map(pairs.__getitem__, at), values[places].tolist(), strict=True))
        out.pairs, out.array = pairs, values
        return out

    def _read_only(self, *args: Any, **kwargs: Any) -> NoReturn:
        raise TypeError("GroupVolumes is read only")

    __setitem__ = __delitem__ = __ior__ = _read_only
    update = pop = popitem = clear = setdefault = _read_only


def same_pairs(volumes: dict[Pair, float], pairs: object) -> bool:
    """`volumes` is a GroupVolumes over the shared pair list `pairs` (by identity)."""
    return pairs is not None and getattr(volumes, "pairs", None) is pairs
