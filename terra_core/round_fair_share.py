"""Weighted max-min fair shares of DC pairs over their paths, for Terra's round steps 5
(the α reserve to the preempted coflows) and 6 (work conservation) and the aged-fair
guard (docs/design.md section 4.2): the SWAN-style max-min MCF (mcf.py) while small,
path-level progressive filling (maxmin.py) beyond.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Mapping
from itertools import repeat
from operator import itemgetter
from typing import Any, NamedTuple

import numpy as np

from terra_core.maxmin_kernels import waterfill_kernel
from terra_core.mcf import K, Rates, maxmin_mcf
from terra_core.min_cct import Pair, links_of
from terra_core.path_masks import FULL, PathIndex
from terra_core.round_rates import PathRates, RoundResult, consume
from topologies import Link, Path

MCF_MAX_COLUMNS = 160  # steps 5-6 use the MCF up to this many (pair, path) columns


def _open_links(avail: dict[Link, float], capacity: dict[Link, float]) -> set[Link]:
    """The links of `avail` with more than FULL of their capacity left (not full)."""
    get = capacity.get
    return {link for link, a in avail.items() if a > FULL * get(link, 0.0)}


def alpha_share(
    active: dict[str, dict[Pair, float]],
    preempted: Iterable[str],
    paths: dict[Pair, list[Path]],
    reserve: dict[Link, float],
    capacity: dict[Link, float],
    rates: dict[str, PathRates],
    result: RoundResult,
    index: PathIndex,
) -> None:
    """Step 5 (and the aged-fair guard's step 2'): max-min over the preempted FlowGroups
    on the reserved capacity.

    FlowGroups of one DC pair have the same paths, so the fair share is computed
    per DC pair weighted by its number of preempted FlowGroups and split equally.
    """
    members: dict[Pair, list[str]] = {}
    for cid in preempted:
        for pair in active[cid]:
            members.setdefault(pair, []).append(cid)
    weights = {pair: float(len(cids)) for pair, cids in members.items()}
    pair_rates = fair_share(weights, paths, reserve, capacity, result, index)
    for pair, lst in pair_rates.items():
        cids = members[pair]
        share = 1.0 / len(cids)
        for cid in cids:  # assign inlined: this loop runs once per preempted FlowGroup
            per_path = rates.setdefault(cid, {}).setdefault(pair, {})
            for path, rate in lst:
                per_path[path] = per_path.get(path, 0.0) + rate * share


def fair_share(
    weights: Mapping[K, float],
    paths: Mapping[K, list[Path]],
    avail: dict[Link, float],
    capacity: dict[Link, float],
    result: RoundResult,
    index: PathIndex,
    classes: list[list[K]] | None = None,
) -> Rates[K]:
    """Weighted max-min rates of DC pairs over their paths on `avail` capacity,
    which shrinks by them (in place); with `classes` (lists of the pairs of `weights`,
    each pair in one), earlier classes are filled first and a class sees only what the
    earlier ones left (without: one class of every pair).

    Up to MCF_MAX_COLUMNS (pair, path) columns: the max-min fair MCF
    (mcf.py, SWAN-style; a pair may shift its rate between paths). Beyond:
    progressive filling on fixed paths, one subflow per (pair, path) weighted
    like its pair (maxmin.maxmin_levels), because the MCF's LPs cost ~0.2 s per
    round on ATT's 600 DC pairs (measured) while water-filling costs ~5 ms.
    Both leave no path with spare capacity on every link unused. `index` is the
    round's path_masks.PathIndex over the links of `avail`.
    """
    fill = fill_classes(weights, paths, avail, capacity, result, index, classes)
    return fill_rates(fill, paths) if isinstance(fill, ClassFill) else fill


def fill_classes(
    weights: Mapping[K, float],
    paths: Mapping[K, list[Path]],
    avail: dict[Link, float],
    capacity: dict[Link, float],
    result: RoundResult,
    index: PathIndex,
    classes: list[list[K]] | None = None,
) -> Rates[K] | ClassFill:
    """`fair_share`, its water-filling's rates left as a ClassFill (the MCF's as
    {pair: [(path, bytes/s)]})."""
    classes = [list(weights)] if classes is None else classes
    if _columns_over(weights, paths, MCF_MAX_COLUMNS):
        return _waterfill_fill(classes, weights, paths, avail, capacity, index)
    priority = {pair: i for i, pairs in enumerate(classes) for pair in pairs}
    open_links = _open_links(avail, capacity)
    usable = {
        pair: [p for p in paths[pair] if open_links.issuperset(links_of(p))] for pair in weights
    }
    demands = {pair: (ps, None) for pair, ps in usable.items() if ps}
    if not demands:
        return {}
    stats = {"lps": 0}
    out = maxmin_mcf(demands, _positive(avail), priority=priority, weights=weights, stats=stats)
    result.lps += stats["lps"]
    out = {pair: lst for pair, lst in out.items() if lst}
    consume(avail, out.values(), 1.0, index)
    return out


def _columns_over(weights: Iterable[K], paths: Mapping[K, list[Path]], limit: int) -> bool:
    """Whether the pairs of `weights` have more than `limit` paths in all."""
    total = 0
    for pair in weights:
        total += len(paths[pair])
        if total > limit:
            return True
    return False


class ClassFill(NamedTuple):
    """The water-filling's rates as arrays (`fill_classes`), in the order its rounds gave
    them: class, then path j, then pair. `keys`: the classes' pairs, class after class;
    per rate `ks` its pair (index into keys), `js` its path (index into the pair's
    paths), `cls` its class (int arrays) and `rates` (float array, bytes/s, > 0 up to
    underflow)."""

    keys: list[Any]  # (DC pairs, or other keys of their paths)
    ks: np.ndarray
    js: np.ndarray
    cls: np.ndarray
    rates: np.ndarray


def _waterfill_classes(
    classes: list[list[K]],
    weights: Mapping[K, float],
    paths: Mapping[K, list[Path]],
    avail: dict[Link, float],
    capacity: dict[Link, float],
    index: PathIndex,
) -> Rates[K]:
    """`_waterfill_fill`'s rates as {pair: [(path, bytes/s)]} of the pairs with a rate."""
    return fill_rates(_waterfill_fill(classes, weights, paths, avail, capacity, index), paths)


def fill_rates(fill: ClassFill, paths: Mapping[K, list[Path]]) -> Rates[K]:
    """A ClassFill's rates as {pair: [(path, bytes/s)]}, pairs in order of their first
    rate, each pair's in the fill's order."""
    keys, ks, js, cls, rates = fill
    out: Rates[K] = {}
    # runs of one class and one path j: the pairs of a run are distinct (C-level passes)
    cuts = np.flatnonzero((np.diff(cls) != 0) | (np.diff(js) != 0)) + 1
    bounds = [0, *cuts.tolist(), len(rates)]
    ks_list, js_list, values = ks.tolist(), js.tolist(), rates.tolist()
    for lo, hi in zip(bounds, bounds[1:], strict=False):
        if hi > lo:
            _append_column(out, keys, ks_list[lo:hi], paths, js_list[lo], values[lo:hi])
    return out


def _waterfill_fill(
    classes: list[list[K]],
    weights: Mapping[K, float],
    paths: Mapping[K, list[Path]],
    avail: dict[Link, float],
    capacity: dict[Link, float],
    index: PathIndex,
) -> ClassFill:
    """Water-filling of `classes` on `avail`, which shrinks by the result (in place): the
    classes one after the other, each shortest paths first. Round j of a class fills every
    pair's j-th path (paths come fewest hops first) max-min fair weighted like its pair, on
    what rounds 0..j-1 and the earlier classes left; paths through a full link get 0. A
    byte sent over a longer path takes capacity on more links, so the pairs' short paths
    are used up before any pair spills onto a longer one.

    The rounds run compiled (maxmin_kernels.waterfill_kernel) over the index's flat path
    arrays (path_masks.PathArrays); the levels it returns become rates (level × weight)
    here, in the order the rounds gave them: class, then path j, then pair.

    Returns:
        ClassFill of the (pair, path) columns with a rate.

    Raises:
        ValueError: a weight that is not finite and > 0, a pair in two classes, or a
            path without a link.
    """
    keys = [pair for pairs in classes for pair in pairs]
    if not keys:
        empty = np.zeros(0, dtype=np.intp)
        return ClassFill(keys, empty, empty, empty, np.zeros(0))
    nos, arrays = index.path_arrays(keys, paths)
    sizes = np.fromiter(map(len, classes), np.intp, len(classes))
    class_ptr = np.concatenate(([0], np.cumsum(sizes))).astype(np.intp)
    w = np.fromiter(map(weights.__getitem__, keys), float, len(keys))
    if not (np.isfinite(w) & (w > 0)).all():
        raise ValueError("water-filling weights must be finite and > 0")
    if len(set(nos.tolist())) != len(keys):
        raise ValueError("a DC pair is in two classes of the water-filling")
    if len(arrays.hops) and not arrays.hops.min() > 0:
        raise ValueError("a path without a link cannot be water-filled")
    links = index.links
    get, cap_of = avail.get, capacity.get
    left = np.fromiter((get(link, 0.0) for link in links), float, len(links))
    cap = np.fromiter((cap_of(link, 0.0) for link in links), float, len(links))
    full = np.append(~(left > FULL * cap), True)  # (path_masks.full_mask's rule; the
    # last slot: links outside the index, always full)
    touched = np.zeros(len(links), dtype=bool)
    levels = waterfill_kernel(
        class_ptr, arrays.count[nos], arrays.first[nos], arrays.hops, arrays.starts,
        arrays.ids, w, left, cap, full, touched, FULL,
    )  # fmt: skip
    for i in np.flatnonzero(touched).tolist():
        avail[links[i]] = float(left[i])
    ks, js = np.nonzero(levels > 0)
    cls = np.repeat(np.arange(len(classes)), sizes)[ks]
    order = np.lexsort((ks, js, cls))  # class, then path j, then pair
    ks, js, cls = ks[order], js[order], cls[order]
    return ClassFill(keys, ks, js, cls, levels[ks, js] * w[ks])


def _append_column(
    out: Rates[K],
    keys: list[K],
    ks: list[int],
    paths: Mapping[K, list[Path]],
    j: int,
    rates: list[float],
) -> None:
    """Append (j-th path, rate) to `out[keys[k]]` for each k of `ks` (distinct) and its rate
    (bytes/s), in order."""
    pairs = list(map(keys.__getitem__, ks))
    items = zip(map(itemgetter(j), map(paths.__getitem__, pairs)), rates, strict=True)
    fresh: Iterable[list[tuple[Path, float]]] = map(list, repeat((), len(pairs)))
    deque(map(list.append, map(out.setdefault, pairs, fresh), items), maxlen=0)


def _positive(capacity: dict[Link, float]) -> dict[Link, float]:
    return {link: c for link, c in capacity.items() if c > 0}
