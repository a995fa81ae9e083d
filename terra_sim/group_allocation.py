"""Rates per FlowGroup (Terra's `group_rates` fast path, terra_core/policy.py), split among
each FlowGroup's flows in proportion to their remaining bytes, as `allocate` would
(policy.split_by_remaining: the same floating-point operations in the same order).
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import chain, repeat
from operator import eq, itemgetter
from typing import NamedTuple

import numpy as np

from terra_core.flat_rates import FlatRates
from terra_core.group_volumes import GroupVolumes
from terra_core.policy import GroupRateArraysPolicy, Policy
from terra_sim.allocation import Allocator
from terra_sim.errors import SimulationError
from terra_sim.flow_table import FlowTable, LinkTable

_INF = float("inf")
_ENDS = itemgetter(0, -1)


def _error(cid: str, pair, item: tuple, known: bool) -> str:
    """The message of GroupAllocator's first failing check on the path rate `item` (path,
    bytes/s) of coflow `cid`'s `pair`; `known`: the pair has a FlowGroup."""
    path, r = item
    if not (0 <= r < _INF):
        return f"coflow {cid!r} pair {pair}: rate {r!r}"
    if not known:
        return f"allocation gives coflow {cid!r} a rate on {pair}, where it has no active flow"
    return f"coflow {cid!r}: path {path} does not join {pair[0]} and {pair[1]}"


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


class _Shares(NamedTuple):
    """The positive path rates of a `group_rates` answer, in the answer's order, gathered
    for the split: per path rate its FlowGroup `g` and rank `j` among its FlowGroup's
    positive rates (int arrays), the rate `rates` (float array, bytes/s), and the rows
    of its links (`lens`: links per path, `rows`: every path's rows one after the other,
    int arrays)."""

    g: np.ndarray
    j: np.ndarray
    rates: np.ndarray
    lens: np.ndarray
    rows: np.ndarray


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
        # {coflow id: (its flow count, its last GroupVolumes, the places among its pairs of
        # the FlowGroups that got a rate in the last round)}: only their flows moved since
        self._last: dict[str, tuple[int, GroupVolumes, np.ndarray]] = {}
        self._arrays = policy if isinstance(policy, GroupRateArraysPolicy) else None

    def allocate(self, now: float, active: dict) -> float:
        """See Allocator.allocate. Only the flows of FlowGroups with a rate are written
        (the engine set every live flow's rate to 0 before)."""
        groups = self._groups(active)
        rem = self.flows.rem[groups.pos]
        volume = np.bincount(groups.gid, weights=rem, minlength=groups.count)
        volumes = self._volumes(active, groups, volume)
        s = self._shares(self._answer(now, volumes), groups)
        self._keep_last(active, groups, volumes, s.g)
        if len(s.g):
            share = s.rates / volume[s.g]  # rate / volume, per path
            table = np.zeros((groups.count, int(s.j.max()) + 1))
            table[s.g, s.j] = share
            rated = np.zeros(groups.count, dtype=bool)
            rated[s.g] = True
            sel = np.flatnonzero(rated[groups.gid])  # the flows of FlowGroups with a rate
            per_flow = table[groups.gid[sel]]
            rem_sel = rem[sel]
            rate = np.zeros(len(sel))
            for j in range(table.shape[1]):  # path by path, as split_by_remaining's sum
                rate += per_flow[:, j] * rem_sel
            self.flows.rate[groups.pos[sel]] = rate
            weights = np.repeat(s.rates, s.lens)
            load = np.bincount(s.rows, weights=weights, minlength=len(self.links.row))
            byte_hops = sum((s.rates * s.lens).tolist())  # (in path order, as a running sum)
        else:
            load, byte_hops = np.zeros(len(self.links.row)), 0.0
        self.links.check_loads(load, now)
        return byte_hops

    def _volumes(self, active: dict, groups: Groups, volume: np.ndarray) -> dict:
        """{coflow id: GroupVolumes} of the FlowGroups (`volume`: float array per FlowGroup).
        A coflow with the same flows as in the last round gets last round's volumes with
        only the FlowGroups that had a rate then updated (group_volumes.GroupVolumes
        .updated): the others' flows did not move, so their sums are the same floats; with
        none, it gets the same object, and the policy can tell it unchanged by identity."""
        last = self._last
        out = {}
        for cid, (base, pairs, _) in groups.coflows.items():
            kept = last.get(cid)
            mine = volume[base : base + len(pairs)]
            if kept is None or kept[0] != len(active[cid].pos):
                out[cid] = GroupVolumes.build(pairs, mine)
            elif len(kept[2]):
                out[cid] = GroupVolumes.updated(kept[1], kept[2], mine)
            else:
                out[cid] = kept[1]
        return out

    def _keep_last(self, active: dict, groups: Groups, volumes: dict, rated: np.ndarray) -> None:
        """Keep each coflow's volumes and the places of its FlowGroups among `rated` (int
        array of FlowGroup indices with a positive rate, any order) for `_volumes`."""
        bases = [base for base, _, _ in groups.coflows.values()]
        mask = np.zeros(groups.count, dtype=bool)
        mask[rated] = True
        hit = np.flatnonzero(mask)  # (ascending, each once)
        cuts = np.searchsorted(hit, bases + [groups.count]).tolist()
        self._last = {
            cid: (len(active[cid].pos), volumes[cid], hit[cuts[i] : cuts[i + 1]] - base)
            for i, (cid, base) in enumerate(zip(groups.coflows, bases, strict=True))
        }

    def _shares(self, answer: FlatRates, groups: Groups) -> _Shares:
        """The positive path rates of `answer` (flat_rates.FlatRates) as `_Shares`, after
        the checks (in the answer's order; the first failing path rate raises).
        FlowGroup -1 stands for a pair or coflow without one.

        Raises:
            SimulationError: a rate not finite or < 0, a positive rate for a FlowGroup
                without active flows, a path that does not join its pair's DCs, or over a
                link the WAN does not have.
        """
        gs: list[int] = []
        at = 0
        for cid, m in zip(answer.coflows, answer.pairs_per_coflow.tolist(), strict=True):
            entry = groups.coflows.get(cid)
            base, where = (entry[0], entry[2]) if entry is not None else (0, {})
            mine = answer.pairs[at : at + m]
            gs.extend(-1 if k is None else base + k for k in map(where.get, mine))
            at += m
        counts, r, paths = answer.counts, answer.rates, answer.paths
        n = len(paths)
        g = np.repeat(np.asarray(gs, dtype=np.intp), counts)
        positive = r > 0
        per_item = list(chain.from_iterable(map(repeat, answer.pairs, counts.tolist())))
        joins = np.fromiter(map(eq, map(_ENDS, paths), per_item), bool, n)
        bad = ~((r >= 0) & (r < _INF)) | (positive & ((g < 0) | ~joins))
        first = int(np.argmax(bad)) if bad.any() else n
        kept = np.flatnonzero(positive[:first])
        kept_paths = paths if len(kept) == n else [paths[i] for i in kept.tolist()]
        rows = self.links.rows_of_all(kept_paths)  # (may raise)
        if first < n:
            seg = int(answer.segment_of_rate()[first])
            owner = answer.coflows[int(answer.coflow_of_segment()[seg])]
            item = (paths[first], float(r[first]))
            raise SimulationError(_error(owner, per_item[first], item, g[first] >= 0))
        starts = np.repeat(np.cumsum(counts) - counts, counts)
        before = np.cumsum(positive) - positive  # positive rates before each one
        j = before - np.append(before, 0)[starts]  # its rank among its FlowGroup's
        lens = np.fromiter(map(len, rows), np.intp, len(rows))
        flat = np.fromiter(chain.from_iterable(rows), np.intp, int(lens.sum()))
        return _Shares(g[kept], j[kept], r[kept], lens, flat)

    def _answer(self, now: float, volumes: dict) -> FlatRates:
        """The policy's rates for `volumes` as FlatRates (group_rate_arrays when it has
        it, else group_rates' dict made flat), the policy's part timed."""
        if self._arrays is not None:
            return self.timed(self._arrays.group_rate_arrays, now, volumes)
        return FlatRates.from_dict(self.timed(self.policy.group_rates, now, volumes))

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
