"""The multipath baseline: ideal uncoupled MPTCP over K paths (docs/design.md section 4.4)."""

from __future__ import annotations

from terra_core.baseline_policy import Route
from terra_core.fixed_route_fair import FixedRouteFairPolicy
from terra_core.flow_bundles import flow_count
from terra_model import Flow
from topologies import Path


class MultipathPolicy(FixedRouteFairPolicy):
    """Every flow split over all its K paths, one subflow per path, max-min fair per subflow:
    ideal uncoupled MPTCP (the "multipath" baseline of docs/design.md section 4.4).

    Args:
        topology: the shared WAN view.  k: paths per DC pair.
    """

    name = "multipath"

    def _route(self, coflow_id: str, flows: list[Flow]) -> dict[str, Route]:
        return {
            f.id: [(p, flow_count(f)) for p in self._paths.get((f.src, f.dst), [])] for f in flows
        }

    def _pair_paths(self, pair: tuple[str, str]) -> list[Path]:
        return self._paths.get(pair, [])
