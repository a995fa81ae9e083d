"""Reference: the scheduling round's water-filling in Python, class by class, as it was
before it was compiled (terra_core/round_fair_share.py's waterfill branch; docs/design.md
4.2 steps 5-6).

Kept only so that tests/unit/test_waterfill_kernel.py can check that the compiled
water-filling (maxmin_kernels.waterfill_kernel) gives the same rates, in the same order,
and leaves the same capacities, to the bit. Not used by the package; do not optimise.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Mapping
from functools import lru_cache
from itertools import repeat
from operator import itemgetter

import numpy as np

from terra_core.array_types import BoolArray, FloatArray, IntArray
from terra_core.maxmin import maxmin_levels_sparse
from terra_core.mcf import K, Rates
from terra_core.path_masks import FULL, PathArrays, PathIndex, full_mask, mark_full
from topologies import Link, Path


def waterfill_classes(
    classes: list[list[K]],
    weights: Mapping[K, float],
    paths: Mapping[K, list[Path]],
    avail: dict[Link, float],
    capacity: dict[Link, float],
    index: PathIndex,
) -> Rates[K]:
    """The water-filling branch of fair_share as it was: class after class."""
    out: Rates[K] = {}
    full = full_mask(index, avail, capacity, FULL)
    for pairs in classes:
        got, full = _waterfill_pairs(pairs, weights, paths, avail, capacity, index, full)
        out.update(got)
    return out


def _waterfill_pairs(
    pairs: list[K],
    weights: Mapping[K, float],
    paths: Mapping[K, list[Path]],
    avail: dict[Link, float],
    capacity: dict[Link, float],
    index: PathIndex,
    full: int,
) -> tuple[Rates[K], int]:
    """Water-filling of `pairs` on `avail`, which shrinks by the result (in place):
    shortest paths first. Round j fills every pair's j-th path (paths come fewest hops
    first) max-min fair weighted like its pair, on what rounds 0..j-1 left; paths through
    a full link get 0. A byte sent over a longer path takes capacity on more links, so
    the pairs' short paths are used up before any pair spills onto a longer one.

    `full` is the bitmask of full links of `avail` (path_masks.full_mask); only the
    links a round used are checked again. The class's paths are flat arrays
    (`_PairColumns`), so which paths a full link blocks, the problem of round j and its
    rates are array passes, not a Python loop per pair (docs/design.md 4.2 steps 5-6).

    Returns:
        ({pair: [(path, bytes/s)]}, the updated full-link mask).
    """
    if len(pairs) == 1:  # most step-6 classes: a coflow with one DC pair
        return _fill_one(pairs[0], weights[pairs[0]], paths, avail, capacity, index, full)
    out: Rates[K] = {}
    cols = _PairColumns(pairs, paths, index)
    w = np.fromiter(map(weights.__getitem__, pairs), float, len(pairs))
    links = index.links
    for j in range(cols.depth):
        sel, flat, lens = cols.open(j, full)
        if not len(sel):
            continue
        ids, levels, used = _waterfill(flat, lens, w[sel], avail, links)
        for i, x in zip(ids, used, strict=True):
            avail[links[i]] = max(0.0, avail[links[i]] - x)
        full = mark_full(full, index, ids, avail, capacity, FULL)
        mine = list(map(pairs.__getitem__, sel.tolist()))
        _add_column_rates(out, mine, paths, j, levels, w[sel])
    return out, full


class _PairColumns:
    """The paths of one class's DC pairs, over the index's path_masks.PathArrays.

    Attributes:
        depth: the most paths a pair has.  count: int (pairs,), each pair's paths.
        first: int (pairs,), each pair's first path in the arrays.  arrays: the
        PathArrays.  n_links: the index's links (the extra slot of the missing bit).
    """

    def __init__(self, pairs: list[K], paths: Mapping[K, list[Path]], index: PathIndex) -> None:
        nos, self.arrays = index.path_arrays(pairs, paths)
        self.n_links = len(index.links)
        self.count: IntArray = self.arrays.count[nos]
        self.first: IntArray = self.arrays.first[nos]
        self.depth = int(self.count.max()) if len(nos) else 0

    def open(self, j: int, full: int) -> tuple[IntArray, IntArray, IntArray]:
        """The pairs (positions, ascending) whose j-th path crosses no link of the `full`
        bitmask, those paths' link indices one path after the other, and their link
        counts (int arrays)."""
        arrays: PathArrays = self.arrays
        has = np.flatnonzero(self.count > j)
        q = self.first[has] + j  # the j-th paths
        hops = arrays.hops[q]
        if not len(q):
            return has, hops, hops
        at = np.cumsum(hops) - hops  # each path's first entry among theirs
        entries = np.repeat(arrays.starts[q] - at, hops) + np.arange(int(hops.sum()))
        ids = arrays.ids[entries]
        open_ = ~np.logical_or.reduceat(_bits(full, self.n_links)[ids], at)
        return has[open_], ids[np.repeat(open_, hops)], hops[open_]


@lru_cache(maxsize=8)
def _bits(full: int, n_links: int) -> BoolArray:
    """The bitmask `full` as a bool array of n_links + 1 entries (bit i: link i; the last,
    the missing-link bit), read only: the classes of one round mostly see the same mask."""
    nbytes = (n_links + 8) // 8
    raw = np.frombuffer(full.to_bytes(nbytes, "little"), np.uint8)
    bits = np.unpackbits(raw, bitorder="little")[: n_links + 1].astype(bool)
    bits.flags.writeable = False
    return bits


def _add_column_rates(
    out: Rates[K],
    pairs: list[K],
    paths: Mapping[K, list[Path]],
    j: int,
    levels: FloatArray,
    w: FloatArray,
) -> None:
    """Append (j-th path, level × weight) to `out[pair]` for each of `pairs` (one column
    each; `levels` and `w` float arrays in their order) whose level is > 0, in order."""
    x = (levels * w).tolist()  # level × weight, per pair
    got = np.flatnonzero(levels > 0).tolist()
    if not got:
        return
    pairs = list(map(pairs.__getitem__, got))
    rates = map(x.__getitem__, got)
    items = zip(map(itemgetter(j), map(paths.__getitem__, pairs)), rates, strict=True)
    fresh: Iterable[list[tuple[Path, float]]] = map(list, repeat((), len(pairs)))
    deque(map(list.append, map(out.setdefault, pairs, fresh), items), maxlen=0)


def _fill_one(
    pair: K,
    weight: float,
    paths: Mapping[K, list[Path]],
    avail: dict[Link, float],
    capacity: dict[Link, float],
    index: PathIndex,
    full: int,
) -> tuple[Rates[K], int]:
    """`_waterfill_pairs` for a class of one pair, without building a problem: each open
    path in turn gets the level min_e avail_e / weight (one entity's progressive filling).

    Returns:
        ({pair: [(path, bytes/s)]} or {}, the updated full-link mask).
    """
    out: Rates[K] = {}
    links = index.links
    for j, (mask, ids) in enumerate(index.entries(pair, paths)):
        if mask & full:
            continue
        level = max(min(max(avail[links[i]], 0.0) / weight for i in ids), 0.0)
        x = weight * level
        for i in ids:
            avail[links[i]] = max(0.0, avail[links[i]] - x)
        full = mark_full(full, index, ids, avail, capacity, FULL)
        if level > 0:
            out.setdefault(pair, []).append((paths[pair][j], level * weight))
    return out, full


def _waterfill(
    flat: IntArray,
    lens: IntArray,
    weights: FloatArray,
    avail: dict[Link, float],
    links: list[Link],
) -> tuple[list[int], FloatArray, list[float]]:
    """Max-min levels of single-path entities (entity j: the link indices
    `flat[sum(lens[:j]) : sum(lens[:j + 1])]` of its path, weight `weights[j]`) on `avail`
    ({link: bytes/s}; `links[i]` is link i), maxmin.maxmin_levels_sparse.

    Only the links the entities cross enter the problem (a link no entity crosses
    has no load and cannot freeze anyone), and the incidence stays sparse (an
    entity has one entry, its weight, per link of its path), so a step costs the
    class's entries, not links x entities. One entity alone: its level is
    min_e avail_e / weight (the same divisions progressive filling makes).

    Returns:
        (link indices crossed (list), levels per entity (float array), bytes/s used on
        each of those links (list)).
    """
    if len(lens) == 1:
        ids: list[int] = flat.tolist()
        weight = float(weights[0])
        level = max(min(max(avail[links[i]], 0.0) / weight for i in ids), 0.0)
        return ids, np.array([level]), [weight * level] * len(ids)
    cols_a = np.repeat(np.arange(len(lens), dtype=np.intp), lens)
    vals_a = np.repeat(weights, lens)
    present = np.zeros(len(links), dtype=np.intp)
    present[flat] = 1
    ids = np.flatnonzero(present).tolist()  # the links crossed, in index order
    inv = (np.cumsum(present) - 1)[flat]  # each entry's row among them
    cap = np.fromiter((max(avail[links[i]], 0.0) for i in ids), float, len(ids))
    levels = maxmin_levels_sparse(inv, cols_a, vals_a, cap, len(lens))
    used = np.bincount(inv, weights=vals_a * levels[cols_a], minlength=len(ids))
    return ids, levels, used.tolist()
