"""Path/link membership as bitmasks, and the set of full links as one integer.

The scheduling round (docs/design.md 4.2 steps 4-6) asks, thousands of times a
round, whether a path crosses a link that is full. With every link given a bit
(its position in the capacity map), a path is the OR of its links' bits and the
full links are one Python int, so the question is one AND of two ints instead of
a set built over every link and a subset test per path. The full set only grows
during a round (capacities are only taken away), so it is kept by OR-ing in the
links a step has just used (`mark_full`).

A path that crosses a link missing from the index gets the extra bit
`1 << len(links)`, which every full mask has: such a path is always blocked (as
a link with no capacity is).
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Mapping, Sequence
from itertools import chain, repeat
from typing import TypeVar

import numpy as np

from terra_core.array_types import IntArray
from topologies import Link, Path, path_links

Pair = tuple[str, str]
PathEntry = tuple[int, tuple[int, ...]]  # (mask of the path's links, their indices)
Key = TypeVar("Key", bound=Hashable)  # a DC pair, or another key of a pair's paths
FULL = 1e-6  # a link with less than this fraction of its capacity left counts as full


class PathArrays:
    """The paths of several DC pairs as flat arrays (PathIndex.path_arrays).

    Args:
        per_pair: for each pair, its paths' link indices (-1: a link outside the index).
        n_links: the index's links (n_links is the extra slot of the missing bit).

    Attributes:
        count: int (pairs,), each pair's paths.  first: int (pairs,), its first path's
        number.  hops: int (paths,), links per path.  starts: int (paths,), each path's
        first entry.  ids: int (entries,), every path's link indices, one path after
        the other (n_links for a link outside the index).
    """

    def __init__(self, per_pair: Sequence[Sequence[tuple[int, ...]]], n_links: int) -> None:
        self.count: IntArray = np.fromiter(map(len, per_pair), np.intp, len(per_pair))
        self.first: IntArray = np.cumsum(self.count) - self.count
        every = list(chain.from_iterable(per_pair))
        self.hops: IntArray = np.fromiter(map(len, every), np.intp, len(every))
        self.starts: IntArray = np.cumsum(self.hops) - self.hops
        n = int(self.hops.sum())
        self.ids: IntArray = np.fromiter(chain.from_iterable(every), np.intp, n)
        self.ids[self.ids < 0] = n_links


class PathIndex:
    """Link indices and per-DC-pair path masks for one set of links.

    Args:
        links: the links, in a fixed order (bit i is links[i]).

    Attributes:
        links: list of links. bit: {link: index}. missing: the extra bit (see module doc).
    """

    def __init__(self, links: Iterable[Link]) -> None:
        self.links: list[Link] = list(links)
        self.bit: dict[Link, int] = {link: i for i, link in enumerate(self.links)}
        self.missing = 1 << len(self.links)
        self._pairs: dict[Hashable, list[PathEntry]] = {}
        self.clean: set[Pair] = set()  # pairs with a path inside the index (all_reachable)
        self._ids: dict[Path, tuple[int, ...]] = {}
        self._distinct: dict[Hashable, bool] = {}
        self._pair_no: dict[Hashable, int] = {}  # pairs met by path_arrays, numbered
        self._arrays: PathArrays | None = None

    def path_arrays(
        self, pairs: Sequence[Key], paths: Mapping[Key, list[Path]]
    ) -> tuple[IntArray, PathArrays]:
        """(each of `pairs`' number in the PathArrays (int array), the PathArrays of every
        pair met so far), the arrays rebuilt when a pair is new (cached as `entries`)."""
        nos = list(map(self._pair_no.get, pairs))
        if None in nos:
            for pair in pairs:
                self._pair_no.setdefault(pair, len(self._pair_no))
            nos = list(map(self._pair_no.get, pairs))
            self._arrays = None
        if self._arrays is None:
            met: list[Key] = list(self._pair_no)  # type: ignore[arg-type]
            entries = map(self.entries, met, repeat(paths))
            self._arrays = PathArrays([[i for _, i in one] for one in entries], len(self.links))
        return np.fromiter(nos, np.intp, len(nos)), self._arrays

    def entries(self, pair: Key, paths: Mapping[Key, list[Path]]) -> list[PathEntry]:
        """[(mask, link indices)] of `paths[pair]`, in path order (cached per pair).

        The cache assumes a pair's paths do not change while the index is kept
        (the round's memo, which holds it, is cleared when paths change).

        Raises:
            KeyError: `pair` not in `paths`.
        """
        got = self._pairs.get(pair)
        if got is None:
            got = self._pairs[pair] = [self._entry(p) for p in paths[pair]]
        return got

    def distinct(self, pair: Key, paths: Mapping[Key, list[Path]]) -> bool:
        """Whether `paths[pair]` has no path twice (cached per pair, as `entries`).

        Raises:
            KeyError: `pair` not in `paths`.
        """
        got = self._distinct.get(pair)
        if got is None:
            got = self._distinct[pair] = len(set(paths[pair])) == len(paths[pair])
        return got

    def ids(self, path: Path) -> tuple[int, ...]:
        """Indices of the links of `path` in order (-1 for a link not in the index), cached."""
        got = self._ids.get(path)
        if got is None:
            got = self._ids[path] = tuple(self.bit.get(link, -1) for link in path_links(path))
        return got

    def ids_of(self, paths: Iterable[Path]) -> list[tuple[int, ...]]:
        """`ids(path)` for every path of the iterable `paths`, in order (one C-level pass
        over the cache when every path is in it)."""
        paths = list(paths)
        try:
            return list(map(self._ids.__getitem__, paths))
        except KeyError:
            return [self.ids(path) for path in paths]

    def _entry(self, path: Path) -> PathEntry:
        ids = self.ids(path)
        mask = 0
        for i in ids:
            mask |= self.missing if i < 0 else 1 << i
        return mask, ids


class IndexCache:
    """The PathIndex over the links of a capacity map, kept while the links (and their
    order) stay the same (a round's memo holds one; round_memo.RoundMemo)."""

    __slots__ = ("_links", "_index")

    def __init__(self) -> None:
        self._links: tuple[Link, ...] | None = None
        self._index: PathIndex | None = None

    def get(self, capacity: dict[Link, float]) -> PathIndex:
        """The PathIndex over the links of `capacity` (in its order): the kept one while
        they are the same links in the same order, a new one otherwise."""
        links = tuple(capacity)
        if self._index is None or self._links != links:
            self._links, self._index = links, PathIndex(links)
        return self._index


def index_for(cache: IndexCache | None, capacity: dict[Link, float]) -> PathIndex:
    """`cache.get(capacity)`, or a new PathIndex over `capacity`'s links without a cache."""
    return PathIndex(tuple(capacity)) if cache is None else cache.get(capacity)


def full_mask(
    index: PathIndex, avail: dict[Link, float], capacity: dict[Link, float], full_below: float
) -> int:
    """Bitmask of the links of `index` with avail <= full_below x capacity (full), plus
    the `missing` bit. Links absent from `avail` count as full."""
    get, cap = avail.get, capacity.get
    mask = index.missing
    for i, link in enumerate(index.links):
        if not get(link, 0.0) > full_below * cap(link, 0.0):
            mask |= 1 << i
    return mask


def mark_full(
    mask: int,
    index: PathIndex,
    ids: Iterable[int],
    avail: dict[Link, float],
    capacity: dict[Link, float],
    full_below: float,
) -> int:
    """`mask` with the links `ids` (indices) that are now full added; returns the new mask."""
    links, cap = index.links, capacity.get
    for i in ids:
        link = links[i]
        if not avail[link] > full_below * cap(link, 0.0):
            mask |= 1 << i
    return mask


def all_reachable(
    volumes: Mapping[Pair, float], paths: dict[Pair, list[Path]], index: PathIndex, full: int
) -> bool:
    """Every FlowGroup (DC pair of `volumes`) has a path of `paths` that crosses no link of
    the `full` bitmask (full_mask).

    With no link full (`full` is the missing bit alone) the answer is kept per pair in
    `index.clean`, so a coflow whose pairs are all known costs one set inclusion."""
    nothing_full = full == index.missing
    if nothing_full and volumes.keys() <= index.clean:
        return True
    entries = index.entries
    for pair in volumes:
        for mask, _ in entries(pair, paths):
            if not mask & full:
                break
        else:
            return False
    if nothing_full:
        index.clean.update(volumes)
    return True
