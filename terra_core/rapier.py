"""The rapier baseline: per-flow path choice minimizing the coflow's CCT, then MADD
(docs/design.md section 4.4).
"""

from __future__ import annotations

import numpy as np

from terra_core.baseline_policy import Route
from terra_core.flow_bundles import flow_count
from terra_core.madd import MaddPolicy
from terra_core.policy import PathSource
from terra_model import Flow
from topologies import Link, Path, Topology, path_links


class RapierPolicy(MaddPolicy):
    """Rapier (Zhao et al., "Rapier: Integrating routing and scheduling for coflow-aware
    data center networks", INFOCOM 2015) on a WAN: when a coflow arrives, each of its flows
    gets one of its K paths, chosen greedily (largest flow first) to minimize the coflow's
    own CCT (max over links of its bytes / capacity); coflows are then ordered by that CCT,
    given MADD per-flow rates, and the leftover is backfilled max-min per flow. No
    FlowGroup aggregation: each flow has exactly one path (a bundle's members may take
    different paths). After a WAN change, coflows with a flow on a broken path (or none)
    are re-routed on their remaining bytes at the next allocation.

    Args:
        topology: the shared WAN view.  k: paths per DC pair.
    """

    name = "rapier"

    def __init__(
        self, topology: Topology, k: int = 4, path_source: PathSource | None = None
    ) -> None:
        self._stale: set[str] = set()
        super().__init__(topology, k, path_source)

    def wan_changed(self, now: float) -> bool:
        """Recompute the K paths; mark coflows whose routes broke for re-routing. Returns True."""
        self._cap_vec = None
        self._paths = self.path_source(self.topology, self.k)
        down = self.topology.down
        for cid, routes in self.routes.items():
            for route in routes.values():
                if not route or any(link in down for p, _ in route for link in path_links(p)):
                    self._stale.add(cid)
                    break
        return True

    def remove_coflow(self, coflow_id: str, now: float) -> None:
        """Forget a coflow (unknown ids are ignored)."""
        super().remove_coflow(coflow_id, now)
        self._stale.discard(coflow_id)

    def _hooked(self) -> set[str]:
        """Coflows to re-route before the next rates (their routes broke)."""
        return self._stale

    def _before_allocate(self, coflow_id: str, remaining: np.ndarray) -> None:
        if coflow_id in self._stale:
            self._stale.discard(coflow_id)
            known = self.flows[coflow_id]
            fids = self._coflow_incidence(coflow_id).fids
            pairs = zip(fids, remaining.tolist(), strict=True)
            alive = [(fid, left) for fid, left in pairs if left > 0]
            sizes = {fid: left / flow_count(known[fid]) for fid, left in alive}
            self._set_routes(coflow_id, self._greedy([known[fid] for fid, _ in alive], sizes))

    def _route(self, coflow_id: str, flows: list[Flow]) -> dict[str, Route]:
        return self._greedy(flows, {f.id: f.bytes / flow_count(f) for f in flows})

    def _greedy(self, flows: list[Flow], member_bytes: dict[str, float]) -> dict[str, Route]:
        """Assign each member of each flow (largest first) the path that least raises the
        coflow's bottleneck max_e volume_e / c_e; ties go to fewer hops, then path order."""
        capacity = {link: self.topology.available(link) for link in self._rows}
        volume: dict[Link, float] = {}
        counts: dict[str, dict[Path, int]] = {f.id: {} for f in flows}
        for f in sorted(flows, key=lambda f: -member_bytes[f.id]):
            size = member_bytes[f.id]
            paths = self._paths.get((f.src, f.dst), [])
            if not paths:
                continue
            links = [path_links(p) for p in paths]
            for _ in range(flow_count(f)):
                best = min(
                    range(len(paths)),
                    key=lambda i: (
                        max((volume.get(e, 0.0) + size) / capacity[e] for e in links[i]),
                        len(links[i]),
                        i,
                    ),
                )
                for e in links[best]:
                    volume[e] = volume.get(e, 0.0) + size
                counts[f.id][paths[best]] = counts[f.id].get(paths[best], 0) + 1
        return {fid: list(c.items()) for fid, c in counts.items()}
