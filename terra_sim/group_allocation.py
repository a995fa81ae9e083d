"""Rates per FlowGroup (Terra's `group_rates` fast path, terra_core/policy.py), split among
each FlowGroup's flows in proportion to their remaining bytes, as `allocate` would
(policy.split_by_remaining: the same floating-point operations in the same order).
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import chain

import numpy as np

from terra_core.policy import Policy
from terra_sim.allocation import Allocator
from terra_sim.errors import SimulationError
from terra_sim.flow_table import FlowTable, LinkTable

_INF = float("inf")


@dataclass
class Groups:
    """The FlowGroups of the active flows (one per coflow and DC pair), for `group_rates`.

    Attributes:
        pos: positions (in the global flow arrays) of the active flows, coflows in
            admission order, each one's flows in workload order.
        gid: for each of them, its FlowGroup's index (0 .. count - 1).
        count: the number of FlowGroups.
        coflows: {coflow id: (index of its first FlowGroup, its DC pairs in order,
            {DC pair: its position among them})}.
    """

    pos: np.ndarray
    gid: np.ndarray
    count: int
    coflows: dict[str, tuple[int, list[tuple[str, str]], dict[tuple[str, str], int]]]


class _Shares:
    """The positive path rates of a `group_rates` answer, gathered for the split: per path
    rate its FlowGroup, path slot, rate (bytes/s) and the rows of its links."""

    def __init__(self) -> None:
        self.g: list[int] = []
        self.j: list[int] = []
        self.rates: list[float] = []
        self.rows: list[list[int]] = []


class GroupAllocator(Allocator):
    """Rates through ``group_rates(now, volumes)`` (Terra): the FlowGroup volumes are summed
    with np.bincount (sequential, in flow order: the same sums as `allocate`'s), the
    policy answers per FlowGroup, and each flow gets, path by path, (FlowGroup rate /
    volume) x its remaining bytes, added up in path order: the operations of
    policy.split_by_remaining and DictAllocator, so the same rates. Checks: rates finite
    and >= 0, none for unknown coflows or FlowGroups, paths joining the FlowGroup's DCs
    over known links, link loads within capacity."""

    def __init__(self, policy: Policy, flows: FlowTable, links: LinkTable) -> None:
        super().__init__(policy, flows, links)
        # {coflow id: (flows, DC pairs, each flow's pair slot, {pair: slot})} (see _groups)
        self._group_of: dict[str, tuple[int, list, np.ndarray, dict]] = {}
        self._layout: tuple[tuple, Groups] | None = None

    def allocate(self, now: float, active: dict) -> float:
        """See Allocator.allocate."""
        groups = self._groups(active)
        rem = self.flows.rem[groups.pos]
        volume = np.bincount(groups.gid, weights=rem, minlength=groups.count).tolist()
        volumes = {
            cid: dict(zip(pairs, volume[base : base + len(pairs)], strict=True))
            for cid, (base, pairs, _) in groups.coflows.items()
        }
        answer = self.timed(self.policy.group_rates, now, volumes)
        s = _Shares()
        for cid, pair_rates in answer.items():
            entry = groups.coflows.get(cid)
            base, where = (entry[0], entry[2]) if entry is not None else (0, {})
            for pair, lst in pair_rates.items():
                slot = where.get(pair)
                self._gather(cid, pair, lst, None if slot is None else base + slot, s)
        if s.g:
            r = np.asarray(s.rates, dtype=float)
            share = r / np.asarray(volume, dtype=float)[s.g]  # rate / volume, per path
            table = np.zeros((groups.count, max(s.j) + 1))
            table[s.g, s.j] = share
            per_flow = table[groups.gid]
            rate = np.zeros(len(rem))
            for j in range(table.shape[1]):  # path by path, as split_by_remaining's sum
                rate += per_flow[:, j] * rem
            self.flows.rate[groups.pos] = rate
            lens = np.fromiter(map(len, s.rows), np.intp, len(s.rows))
            rows = np.fromiter(chain.from_iterable(s.rows), np.intp, int(lens.sum()))
            load = np.bincount(rows, weights=np.repeat(r, lens), minlength=len(self.links.row))
            byte_hops = sum((r * lens).tolist())  # (in path order, as a running sum)
        else:
            load, byte_hops = np.zeros(len(self.links.row)), 0.0
        self.links.check_loads(load, now)
        return byte_hops

    def _gather(self, cid: str, pair, lst, g: int | None, s: _Shares) -> None:
        """Check one FlowGroup's path rates `lst` (FlowGroup `g`, None when unknown) and add
        the positive ones to `s`."""
        j = 0
        for path, r in lst:
            if not (0 <= r < _INF):
                raise SimulationError(f"coflow {cid!r} pair {pair}: rate {r!r}")
            if r == 0:
                continue
            if g is None:
                raise SimulationError(
                    f"allocation gives coflow {cid!r} a rate on {pair}, where it has no active flow"
                )
            if path[0] != pair[0] or path[-1] != pair[1]:
                raise SimulationError(
                    f"coflow {cid!r}: path {path} does not join {pair[0]} and {pair[1]}"
                )
            s.g.append(g)
            s.j.append(j)
            s.rates.append(r)
            s.rows.append(self.links.rows_of(path))
            j += 1

    def _groups(self, active: dict) -> Groups:
        """The FlowGroups of the active flows (`Groups`), rebuilt only when a coflow
        arrived or lost flows since the last call (a coflow's flows only ever leave)."""
        key = tuple((cid, len(a.pos)) for cid, a in active.items())
        if self._layout is not None and self._layout[0] == key:
            return self._layout[1]
        pos, gid = [], []
        coflows: dict[str, tuple[int, list[tuple[str, str]], dict[tuple[str, str], int]]] = {}
        base = 0
        for cid, a in active.items():
            cached = self._group_of.get(cid)
            if cached is None or cached[0] != len(a.pos):
                pairs, local = self._coflow_groups(a.pos)
                where = {pair: i for i, pair in enumerate(pairs)}
                cached = self._group_of[cid] = (len(a.pos), pairs, local, where)
            _, pairs, local, where = cached
            coflows[cid] = (base, pairs, where)
            pos.append(a.pos)
            gid.append(local + base)
            base += len(pairs)
        for cid in [c for c in self._group_of if c not in active]:
            del self._group_of[cid]
        groups = Groups(
            np.concatenate(pos) if pos else np.zeros(0, dtype=np.intp),
            np.concatenate(gid) if gid else np.zeros(0, dtype=np.intp),
            base,
            coflows,
        )
        self._layout = (key, groups)
        return groups

    def _coflow_groups(self, pos: np.ndarray) -> tuple[list[tuple[str, str]], np.ndarray]:
        """(DC pairs of a coflow's flows at positions `pos`, in order of first appearance;
        each flow's index in that list), the FlowGroups `allocate` would form."""
        present, first, inverse = np.unique(
            self.flows.pair_of[pos], return_index=True, return_inverse=True
        )
        order = np.argsort(first, kind="stable")
        rank = np.empty(len(order), dtype=np.intp)
        rank[order] = np.arange(len(order))
        pairs = [self.flows.pairs.pairs[i] for i in present[order].tolist()]
        return pairs, rank[inverse.reshape(-1)]
