"""What one Terra scheduling round decides (RoundResult) and how its rates add up: every
step adds a coflow's per-path rates to the round's accumulator and takes them from the
capacity left (docs/design.md section 4.2).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from enum import StrEnum
from itertools import chain
from operator import eq, itemgetter

import numpy as np

from terra_core.flat_rates import FlatRates
from terra_core.min_cct import MinCct, Pair, PairRates, links_of, min_cct
from terra_core.path_masks import PathIndex
from terra_core.round_kernels import consume_kernel
from topologies import Link, Path

_PATH, _RATE = itemgetter(0), itemgetter(1)
PathRates = dict[Pair, dict[Path, float]]  # one coflow's {pair: {path: bytes/s}} (`take`)


class RoundState(StrEnum):
    """A coflow's place in one round: admitted with a deadline (step 1), scheduled in Γ
    order (step 4) or preempted (step 4: no capacity left; step 5 may still feed it)."""

    SCHEDULED = "scheduled"
    PREEMPTED = "preempted"
    DEADLINE = "deadline"


SCHEDULED, PREEMPTED, DEADLINE = RoundState.SCHEDULED, RoundState.PREEMPTED, RoundState.DEADLINE


@dataclass
class RoundResult:
    """What one round decided.

    Attributes:
        rates: {coflow id: {(src, dst): [(path, bytes/s), ...]}} for every
            coflow that gets any rate (paths merged, rates > 0); built from `flat` when
            first read, if the round gave its rates flat.
        flat: the same rates as flat_rates.FlatRates (schedule_round's), or None.
        state: {coflow id: RoundState} for every input coflow.
        order: non-deadline coflow ids in the order steps 3-4 took them.
        gammas: {coflow id: the key it was taken with}: Γ in seconds on the full
            capacities for coflows that could still be scheduled, a lower bound on
            it for coflows preempted without an LP.
        exact: {coflow id: MinCct on the full capacities} solved in this round (for Γ
            and prices; its rates skip the fewest-link-bytes stage)
            (with link prices: the caller may cache them, see terra_policy.py).
        lps: LPs solved in this round (min-CCT and MCF).
    """

    state: dict[str, str] = field(default_factory=dict)
    order: list[str] = field(default_factory=list)
    gammas: dict[str, float] = field(default_factory=dict)
    exact: dict[str, MinCct] = field(default_factory=dict)
    lps: int = 0
    flat: FlatRates | None = None
    _rates: dict[str, PairRates] | None = field(default=None, repr=False)

    @property
    def rates(self) -> dict[str, PairRates]:
        """See the class docstring."""
        if self._rates is None:
            self._rates = {} if self.flat is None else self.flat.as_dict()
        return self._rates

    @rates.setter
    def rates(self, value: dict[str, PairRates]) -> None:
        self._rates, self.flat = value, None


def solve_min_cct(
    volumes: dict[Pair, float],
    paths: dict[Pair, list[Path]],
    capacity: dict[Link, float],
    result: RoundResult,
    rates_needed: bool = True,
    finish_s: float | None = None,
) -> MinCct:
    """Optimization (1) (min_cct.min_cct; with the fewest-link-bytes stage when
    `rates_needed`; rates ending in `finish_s` when that is later than Γ), counting its
    LPs in `result.lps`."""
    res = min_cct(volumes, paths, capacity, fewest_link_bytes=rates_needed, finish_s=finish_s)
    result.lps += res.lp_solved
    return res


def take(
    rates: dict[str, PathRates],
    cid: str,
    pair_rates: PairRates,
    left: dict[Link, float],
    scale: float,
    index: PathIndex | None = None,
) -> list[int]:
    """Add `pair_rates` × scale to coflow `cid` and subtract them from `left` (`consume`).

    Returns:
        The indices (in `index`, ascending) of the links the paths cross.
    """
    mine = rates.setdefault(cid, {})
    if scale == 1.0 and not mine:  # (a coflow's first rates: `add_rates` in C loops)
        lists = pair_rates.values()
        dicts = list(map(dict, lists))
        if all(map(eq, map(len, dicts), map(len, lists))):  # (no path twice in a pair)
            mine.update(zip(pair_rates, dicts, strict=True))
            return consume(left, lists, scale, index)
    for pair, lst in pair_rates.items():
        assign(mine, pair, lst, scale)
    return consume(left, pair_rates.values(), scale, index)


def assign(mine: PathRates, pair: Pair, lst: list[tuple[Path, float]], scale: float) -> None:
    """Add the path rates `lst` × scale to one coflow's {pair: {path: bytes/s}}."""
    if scale == 1.0:
        add_rates(mine, pair, lst)
        return
    per_path = mine.setdefault(pair, {})
    for path, rate in lst:
        per_path[path] = per_path.get(path, 0.0) + rate * scale


def add_rates(mine: PathRates, pair: Pair, lst: list[tuple[Path, float]]) -> None:
    """`assign(mine, pair, lst, 1.0)`: the same sums (rate × 1.0 is the rate, and a new
    pair's 0.0 + rate is the rate), without the multiplications."""
    per_path = mine.get(pair)
    if per_path is None:
        per_path = mine[pair] = dict(lst)
        if len(per_path) == len(lst):  # (no path twice)
            return
        per_path.clear()
    get = per_path.get
    for path, rate in lst:
        per_path[path] = get(path, 0.0) + rate


def consume(
    left: dict[Link, float],
    lists: Iterable[list[tuple[Path, float]]],
    scale: float = 1.0,
    index: PathIndex | None = None,
) -> list[int]:
    """Subtract the path rates of `lists` (each [(path, bytes/s)]) × scale from the
    capacities `left` (bytes/s, floored at 0, in place): for each path rate in order and
    each link of its path in order, left = max(0.0, left − x) (0.0 for NaN too).

    One compiled pass over the links' indices in `index` (a PathIndex over the links of
    `left` in their order; a new one when not given or over other links).

    Returns:
        The indices of the links the paths cross, ascending.

    Raises:
        KeyError: a path crosses a link that `left` does not have.
    """
    if index is None or len(index.links) != len(left) or not all(map(eq, left, index.links)):
        index = PathIndex(tuple(left))
    items = list(chain.from_iterable(lists))
    ids = index.ids_of(map(_PATH, items))
    lens = np.fromiter(map(len, ids), np.intp, len(ids))
    flat = np.fromiter(chain.from_iterable(ids), np.intp, int(lens.sum()))
    if len(flat) and flat.min() < 0:  # (the first such link, as a dict look-up raises)
        path = next(item[0] for item, one in zip(items, ids, strict=True) if -1 in one)
        raise KeyError(next(link for link in links_of(path) if link not in left))
    x = np.fromiter(map(_RATE, items), float, len(items))
    if scale != 1.0:
        x = x * scale
    values = np.fromiter(left.values(), float, len(left))
    hit = np.zeros(len(values), dtype=bool)
    consume_kernel(values, flat, lens, x, hit)
    left.update(zip(index.links, values.tolist(), strict=True))
    crossed: list[int] = np.flatnonzero(hit).tolist()  # (ascending, each once)
    return crossed
