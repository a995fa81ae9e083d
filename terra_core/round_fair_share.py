"""Weighted max-min fair shares of DC pairs over their paths, for Terra's round steps 5
(the α reserve to the preempted coflows) and 6 (work conservation) and the aged-fair
guard (docs/design.md section 4.2): the SWAN-style max-min MCF (mcf.py) while small,
path-level progressive filling (maxmin.py) beyond.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from itertools import chain

import numpy as np

from terra_core.maxmin import maxmin_levels_sparse
from terra_core.mcf import K, Rates, maxmin_mcf
from terra_core.min_cct import Pair, links_of
from terra_core.path_masks import FULL, PathIndex, full_mask, mark_full
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
    classes = [list(weights)] if classes is None else classes
    if _columns_over(weights, paths, MCF_MAX_COLUMNS):
        out: Rates[K] = {}
        full = full_mask(index, avail, capacity, FULL)
        for pairs in classes:
            got, full = _waterfill_pairs(pairs, weights, paths, avail, capacity, index, full)
            out.update(got)
        return out
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
    for lst in out.values():
        consume(avail, lst)
    return out


def _columns_over(weights: Iterable[K], paths: Mapping[K, list[Path]], limit: int) -> bool:
    """Whether the pairs of `weights` have more than `limit` paths in all."""
    total = 0
    for pair in weights:
        total += len(paths[pair])
        if total > limit:
            return True
    return False


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
    links a round used are checked again, so a class whose paths are all blocked
    costs one AND per path, not a pass over every link (docs/design.md 4.2 steps 5-6).

    Returns:
        ({pair: [(path, bytes/s)]}, the updated full-link mask).
    """
    if len(pairs) == 1:  # most step-6 classes: a coflow with one DC pair
        return _fill_one(pairs[0], weights[pairs[0]], paths, avail, capacity, index, full)
    out: Rates[K] = {}
    get_entries = index.entries
    entries = [get_entries(pair, paths) for pair in pairs]
    depth = max(map(len, entries), default=0)
    links = index.links
    for j in range(depth):
        columns = [
            (pair, ent[j])
            for pair, ent in zip(pairs, entries, strict=True)
            if j < len(ent) and not ent[j][0] & full
        ]
        if not columns:
            continue
        w = [weights[pair] for pair, _ in columns]
        ids, levels, used = _waterfill([e[1] for _, e in columns], w, avail, links)
        for i, x in zip(ids, used, strict=True):
            avail[links[i]] = max(0.0, avail[links[i]] - x)
        full = mark_full(full, index, ids, avail, capacity, FULL)
        rates = (np.asarray(levels) * np.asarray(w)).tolist()  # level × weight, per pair
        for (pair, _), level, x in zip(columns, levels, rates, strict=True):
            if level > 0:
                path = paths[pair][j]
                got = out.get(pair)
                if got is None:
                    out[pair] = [(path, x)]
                else:
                    got.append((path, x))
    return out, full


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
    paths_ids: list[tuple[int, ...]],
    weights: list[float],
    avail: dict[Link, float],
    links: list[Link],
) -> tuple[Sequence[int], list[float], list[float]]:
    """Max-min levels of single-path entities (entity j: the link indices `paths_ids[j]`
    of its path, weight `weights[j]`) on `avail` ({link: bytes/s}; `links[i]` is link i),
    maxmin.maxmin_levels_sparse.

    Only the links the entities cross enter the problem (a link no entity crosses
    has no load and cannot freeze anyone), and the incidence stays sparse (an
    entity has one entry, its weight, per link of its path), so a step costs the
    class's entries, not links x entities. One entity alone: its level is
    min_e avail_e / weight (the same divisions progressive filling makes).

    Returns:
        (link indices crossed, levels per entity, bytes/s used on each of those links),
        as lists.
    """
    ids: Sequence[int]
    if len(paths_ids) == 1:
        ids, weight = paths_ids[0], weights[0]
        level = max(min(max(avail[links[i]], 0.0) / weight for i in ids), 0.0)
        return list(ids), [level], [weight * level] * len(ids)
    lens = np.fromiter(map(len, paths_ids), np.intp, len(paths_ids))
    rows_a = np.fromiter(chain.from_iterable(paths_ids), np.intp, int(lens.sum()))
    cols_a = np.repeat(np.arange(len(paths_ids), dtype=np.intp), lens)
    vals_a = np.repeat(np.asarray(weights, dtype=float), lens)
    present = np.zeros(len(links), dtype=np.intp)
    present[rows_a] = 1
    ids = np.flatnonzero(present).tolist()  # the links crossed, in index order
    inv = (np.cumsum(present) - 1)[rows_a]  # each entry's row among them
    cap = np.fromiter((max(avail[links[i]], 0.0) for i in ids), float, len(ids))
    levels = maxmin_levels_sparse(inv, cols_a, vals_a, cap, len(paths_ids))
    used = np.bincount(inv, weights=vals_a * levels[cols_a], minlength=len(ids))
    return ids, levels.tolist(), used.tolist()


def _positive(capacity: dict[Link, float]) -> dict[Link, float]:
    return {link: c for link, c in capacity.items() if c > 0}
