"""A round's rates as flat arrays (FlatRates): the form in which the simulator reads them,
so that the round's answer is not built as lists of (path, rate) tuples only to be taken
apart again (docs/design.md 4.2, the round's array passes).

The entries are in the order of the dict form {coflow id: {(src, dst): [(path, bytes/s)]}}:
coflows, then each coflow's DC pairs (its segments), then each pair's path rates.
"""

from __future__ import annotations

from collections.abc import Mapping
from itertools import chain, islice, repeat
from operator import itemgetter

import numpy as np

from terra_core.array_types import FloatArray, IntArray
from terra_core.min_cct import Pair, PairRates
from topologies import Path

_PATH, _RATE = itemgetter(0), itemgetter(1)


class FlatRates:
    """Per-path rates of several coflows, flat.

    Args / attributes:
        coflows: coflow ids, in order.
        pairs_per_coflow: int array (coflows,): each coflow's segments (DC pairs).
        pairs: the segments' DC pairs (src DC, dst DC), coflow after coflow.
        counts: int array (segments,): each segment's path rates (0: a pair without one,
            left out of the dict form, as is a coflow without any).
        paths: one path per path rate, segment after segment.
        rates: float array (path rates,), bytes/s.

    Raises:
        ValueError: lengths that do not add up.
    """

    __slots__ = ("coflows", "pairs_per_coflow", "pairs", "counts", "paths", "rates")

    def __init__(
        self,
        coflows: list[str],
        pairs_per_coflow: IntArray,
        pairs: list[Pair],
        counts: IntArray,
        paths: list[Path],
        rates: FloatArray,
    ) -> None:
        if (
            len(pairs_per_coflow) != len(coflows)
            or int(pairs_per_coflow.sum()) != len(pairs)
            or len(counts) != len(pairs)
            or int(counts.sum()) != len(paths)
            or len(rates) != len(paths)
        ):
            raise ValueError("FlatRates: coflows, pairs, counts, paths and rates do not add up")
        self.coflows = coflows
        self.pairs_per_coflow = pairs_per_coflow
        self.pairs = pairs
        self.counts = counts
        self.paths = paths
        self.rates = rates

    @classmethod
    def from_dict(cls, rates: Mapping[str, PairRates]) -> FlatRates:
        """The flat form of {coflow id: {pair: [(path, bytes/s)]}}, every entry kept (also
        rates <= 0 or not finite), in the dict's order."""
        per_coflow = list(rates.values())
        lists = list(chain.from_iterable(map(dict.values, per_coflow)))
        items = list(chain.from_iterable(lists))
        return cls(
            list(rates),
            np.fromiter(map(len, per_coflow), np.intp, len(per_coflow)),
            list(chain.from_iterable(per_coflow)),
            np.fromiter(map(len, lists), np.intp, len(lists)),
            list(map(_PATH, items)),
            np.fromiter(map(_RATE, items), float, len(items)),
        )

    def as_dict(self) -> dict[str, PairRates]:
        """{coflow id: {pair: [(path, bytes/s)]}}, pairs without a path rate and coflows
        without a pair left out."""
        counts = self.counts.tolist()
        it = zip(self.paths, self.rates.tolist(), strict=True)
        lists = list(map(list, map(islice, repeat(it), counts)))
        per = self.pairs_per_coflow.tolist()
        segs = zip(self.pairs, lists, strict=True)
        if all(counts) and all(per):
            return {cid: dict(islice(segs, m)) for cid, m in zip(self.coflows, per, strict=True)}
        out: dict[str, PairRates] = {}
        for cid, m in zip(self.coflows, per, strict=True):
            mine = {pair: lst for pair, lst in islice(segs, m) if lst}
            if mine:
                out[cid] = mine
        return out

    def segment_of_rate(self) -> IntArray:
        """int array (path rates,): each path rate's segment."""
        return np.repeat(np.arange(len(self.counts), dtype=np.intp), self.counts)

    def coflow_of_segment(self) -> IntArray:
        """int array (segments,): each segment's coflow (index into `coflows`)."""
        return np.repeat(np.arange(len(self.coflows), dtype=np.intp), self.pairs_per_coflow)
