"""Max-min fairness per (sub)flow on fixed routes, per DC pair (per-flow and multipath's
common part; Bertsekas & Gallager, "Data Networks", 6.5.2 progressive filling, maxmin.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import numpy as np
from numpy.typing import NDArray

from terra_core.array_types import IntArray
from terra_core.maxmin import maxmin_levels_entries
from terra_core.pair_policy import PairPolicy
from terra_core.policy import PairLevels, PairTable, PathSource
from terra_core.sparse_index import csr_ranges
from topologies import Path, Topology, path_links

_PAIR_CACHE_SIZE = 64  # cached per-pair-set incidences kept before the cache is emptied


class _PairEntries(NamedTuple):
    """A set of DC pairs' paths and their sparse link incidence (`_FairPolicy`).

    Attributes:
        paths: the pairs' paths, pair after pair, in the order of the pairs.
        pair: int array (len(paths),), index of each path's pair in the pairs.
        rows, cols: int arrays (nnz,), one entry per (path, link of it): link row
            (BaselinePolicy._rows order) and index of the path in `paths`.
        entry_pair: int array (nnz,), index of the entry's pair in the pairs.
    """

    paths: list[Path]
    pair: np.ndarray
    rows: np.ndarray
    cols: np.ndarray
    entry_pair: np.ndarray


class FixedRouteFairPolicy(PairPolicy):
    """Max-min fair per (sub)flow on fixed routes; members on one path are symmetric, so the
    water-filling runs over paths weighted by their member count (maxmin.py). Every flow
    of a DC pair has the same route (`_pair_paths`), so a path's weight is its pair's
    active member count. The links x paths incidence is kept sparse (a path crosses a few
    of many links: 2 of 300 on bigswitch): each pair's paths are numbered once, with the
    link rows of each path, and a set of pairs is water-filled by
    maxmin.maxmin_levels_entries (dense on small WANs, sparse on large ones). The
    simulator numbers its pairs once per WAN state (`pair_table`) and asks by index
    (`table_levels`): no tuple of pairs or list of paths per event."""

    # the numbered pairs (`_clear_caches`, `_number_pair`) and their CSR arrays (`_pair_ids`)
    _table: PairTable | None  # see pair_table
    _pair_number: dict[tuple[str, str], int]  # pair -> its number (CSR row)
    _all_paths: list[Path]  # the numbered pairs' paths, pair after pair
    _pair_ptr_list: list[int]  # pair i's paths: _all_paths[ptr[i]:ptr[i + 1]]
    _path_ptr_list: list[int]  # path j's links: _link_rows_list[ptr[j]:ptr[j + 1]]
    _link_rows_list: list[int]
    _dirty: bool  # the lists changed since their arrays were made
    _pair_ptr: IntArray
    _path_ptr: IntArray
    _link_rows: IntArray
    _path_objects: NDArray[np.object_]

    def __init__(
        self, topology: Topology, k: int = 4, path_source: PathSource | None = None
    ) -> None:
        super().__init__(topology, k, path_source)
        self._by_pairs: dict[tuple[tuple[str, str], ...], _PairEntries] = {}
        self._clear_caches()

    def pair_levels(
        self, now: float, pairs: tuple[tuple[str, str], ...], members: np.ndarray
    ) -> PairLevels:
        """Max-min fair per-member rates on each pair's path(s) (see `PairPolicy`)."""
        found = self._pair_entries(pairs)
        vals = np.asarray(members, dtype=float)[found.entry_pair]
        levels = maxmin_levels_entries(
            found.rows, found.cols, vals, self._capacity(), len(found.paths)
        )
        return PairLevels(found.paths, found.pair, levels)

    def pair_table(self, pairs: Sequence[tuple[str, str]]) -> PairTable:
        """Number the paths of `pairs` for `table_levels` (index-based `pair_levels`).

        Args:
            pairs: sequence of (src DC, dst DC) pairs, e.g. every pair of a workload;
                held by the table, so it must not change while the table is used.

        Returns:
            The PairTable; the same object for the same `pairs` object until the next
            wan_changed, which makes it stale.
        """
        if self._table is not None and self._table.pairs is pairs:
            return self._table
        ids = self._pair_ids(pairs)
        path_ids = csr_ranges(self._pair_ptr, ids)
        per_pair = self._pair_ptr[ids + 1] - self._pair_ptr[ids]
        hops = self._path_ptr[path_ids + 1] - self._path_ptr[path_ids]
        self._table = PairTable(
            pairs,
            self._path_objects[path_ids].tolist(),
            np.concatenate(([0], np.cumsum(per_pair))).astype(np.intp),
            np.concatenate(([0], np.cumsum(hops))).astype(np.intp),
            self._link_rows[csr_ranges(self._path_ptr, path_ids)],
        )
        return self._table

    def table_levels(
        self, now: float, table: PairTable, active: np.ndarray, members: np.ndarray
    ) -> np.ndarray:
        """Max-min fair per-member rates on the paths of some pairs of `table`: the answer of
        `pair_levels` for those pairs, by index (no pair or path object is touched).

        Args:
            now: seconds.
            table: this policy's current `pair_table`.
            active: int array of distinct indices into table.pairs, the pairs with active
                flows (any order).
            members: float array (len(active),), active flow members of each (> 0).

        Returns:
            float array of per-member rates (bytes/s), one per path of the active pairs, in
            the order csr_ranges(table.ptr, active) numbers them in table.paths.

        Raises:
            ValueError: `table` is not the current one (the WAN changed since), or
                mismatched lengths.
        """
        if table is not self._table:
            raise ValueError("stale pair table: ask pair_table again after a WAN change")
        active = np.asarray(active, dtype=np.intp)
        members = np.asarray(members, dtype=float)
        if members.shape != active.shape:
            raise ValueError(f"{members.shape} member counts for {active.shape} pairs")
        path_ids = csr_ranges(table.ptr, active)
        path_pair = np.repeat(members, table.ptr[active + 1] - table.ptr[active])
        hops = table.path_ptr[path_ids + 1] - table.path_ptr[path_ids]
        cols = np.repeat(np.arange(len(path_ids), dtype=np.intp), hops)
        rows = table.rows[csr_ranges(table.path_ptr, path_ids)]
        return maxmin_levels_entries(rows, cols, path_pair[cols], self._capacity(), len(path_ids))

    def _pair_ids(self, pairs: Sequence[tuple[str, str]]) -> IntArray:
        """The numbers of `pairs` (int array), numbering new ones, with the CSR arrays
        (_pair_ptr, _path_ptr, _link_rows, _path_objects) brought up to date."""
        found = list(map(self._pair_number.get, pairs))
        if None in found:
            for i, pr in enumerate(pairs):
                if found[i] is None:
                    found[i] = self._number_pair(pr)
        if self._dirty:
            self._pair_ptr = np.array(self._pair_ptr_list, dtype=np.intp)
            self._path_ptr = np.array(self._path_ptr_list, dtype=np.intp)
            self._link_rows = np.array(self._link_rows_list, dtype=np.intp)
            self._path_objects = np.empty(len(self._all_paths), dtype=object)
            for j, path in enumerate(self._all_paths):  # elementwise: paths are tuples
                self._path_objects[j] = path
            self._dirty = False
        return np.array(found, dtype=np.intp)

    def _pair_entries(self, pairs: tuple[tuple[str, str], ...]) -> _PairEntries:
        """The paths of `pairs` in order and their sparse link incidence (_PairEntries),
        cached per tuple of pairs until the next WAN change."""
        cached = self._by_pairs.get(pairs)
        if cached is None:
            if len(self._by_pairs) >= _PAIR_CACHE_SIZE:
                self._by_pairs.clear()
            ids = self._pair_ids(pairs)
            path_ids = csr_ranges(self._pair_ptr, ids)
            per_pair = self._pair_ptr[ids + 1] - self._pair_ptr[ids]
            pair = np.repeat(np.arange(len(pairs), dtype=np.intp), per_pair)
            entries = csr_ranges(self._path_ptr, path_ids)
            hops = self._path_ptr[path_ids + 1] - self._path_ptr[path_ids]
            cols = np.repeat(np.arange(len(path_ids), dtype=np.intp), hops)
            cached = _PairEntries(
                self._path_objects[path_ids].tolist(),
                pair,
                self._link_rows[entries],
                cols,
                pair[cols],
            )
            self._by_pairs[pairs] = cached
        return cached

    def _number_pair(self, pair: tuple[str, str]) -> int:
        """Number `pair` and its current routes (`_pair_paths`), with their link rows."""
        routes = self._pair_paths(pair)
        for path in routes:
            hit = self._path_rows.get(path)
            if hit is None:
                hit = self._path_rows[path] = [self._rows[link] for link in path_links(path)]
            self._link_rows_list.extend(hit)
            self._path_ptr_list.append(len(self._link_rows_list))
        self._all_paths.extend(routes)
        self._pair_ptr_list.append(len(self._all_paths))
        self._dirty = True
        number = self._pair_number[pair] = len(self._pair_number)
        return number

    def _clear_caches(self) -> None:
        self._by_pairs.clear()
        self._table = None  # see pair_table
        self._pair_number = {}  # pair -> its number (CSR row)
        self._all_paths = []  # the numbered pairs' paths, pair after pair
        self._pair_ptr_list = [0]  # pair i's paths: _all_paths[ptr[i]:ptr[i + 1]]
        self._path_ptr_list = [0]  # path j's links: _link_rows_list[ptr[j]:ptr[j + 1]]
        self._link_rows_list = []
        self._dirty = True  # the lists changed since their arrays were made

    def _pair_paths(self, pair: tuple[str, str]) -> list[Path]:
        """The paths every flow of `pair` uses (as `_route` assigns them)."""
        return self._paths.get(pair, [])[:1]
