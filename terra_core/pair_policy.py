"""Pair-symmetric baselines (per-flow, multipath, swan-mcf): every member of a flow gets,
on each path, a rate that depends only on the flow's DC pair and on how many flow members
of each pair are active, so they answer per DC pair (`PairPolicy.pair_levels`).
"""

from __future__ import annotations

import numpy as np

from terra_core.baseline_policy import BaselinePolicy
from terra_core.flow_bundles import flow_count
from terra_core.policy import Allocation, PairLevels, Remaining
from topologies import Path


class PairPolicy(BaselinePolicy):
    """Baselines under which every member of a flow gets, on each path, a rate that depends
    only on the flow's DC pair and on how many flow members of each pair are active
    (per-flow, multipath, swan-mcf). They implement `pair_levels`; `allocate` expands it
    per flow, and the simulator calls `pair_levels` directly (simulator.py), which spares
    it a dict entry per active flow per event."""

    def pair_levels(
        self, now: float, pairs: tuple[tuple[str, str], ...], members: np.ndarray
    ) -> PairLevels:
        """Per-member rates per path for each DC pair.

        Args:
            now: seconds.
            pairs: the (src DC, dst DC) pairs with active flows, in order of first
                appearance over the active coflows (coflows in admission order, their
                flows in order).
            members: float array, active flow members of each pair (> 0; bundles count
                their members).

        Returns:
            PairLevels; a pair without paths (none up) simply has none (rate 0). Its
            `paths` list is the same object whenever `pairs` and the WAN are the same.
        """
        raise NotImplementedError

    def allocate(self, now: float, remaining: Remaining) -> Allocation:
        """Rates for every flow in `remaining` from `pair_levels`.

        Args:
            now: seconds.
            remaining: {coflow id: {flow id: remaining bytes}}.

        Returns:
            {coflow id: {flow id: [(path, bytes/s)]}}: a flow of n members gets n times
            its pair's per-member rate on each path.
        """
        count: dict[tuple[str, str], float] = {}
        for cid, flows in remaining.items():
            known = self.flows[cid]
            for fid in flows:
                f = known[fid]
                count[(f.src, f.dst)] = count.get((f.src, f.dst), 0.0) + flow_count(f)
        pairs = tuple(count)
        answer = self.pair_levels(now, pairs, np.array([count[p] for p in pairs], dtype=float))
        rates: dict[tuple[str, str], list[tuple[Path, float]]] = {p: [] for p in pairs}
        for path, i, r in zip(
            answer.paths, answer.pair.tolist(), answer.level.tolist(), strict=True
        ):
            rates[pairs[i]].append((path, r))
        out: Allocation = {}
        for cid, flows in remaining.items():
            known = self.flows[cid]
            out[cid] = {}
            for fid in flows:
                f = known[fid]
                n = flow_count(f)
                out[cid][fid] = [(p, n * r) for p, r in rates[(f.src, f.dst)]]
        return out

    def wan_changed(self, now: float) -> bool:
        """Recompute the K paths (dropping cached answers) and re-route; returns True."""
        self._clear_caches()
        return super().wan_changed(now)

    def _clear_caches(self) -> None:
        """Drop what subclasses cached for the current paths and capacities."""
