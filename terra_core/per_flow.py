"""The per-flow baseline: ideal TCP over IP routing (docs/design.md section 4.4)."""

from __future__ import annotations

from terra_core.fixed_route_fair import FixedRouteFairPolicy


class PerFlowPolicy(FixedRouteFairPolicy):
    """One fixed shortest path per flow, max-min fair per flow: ideal TCP over IP routing
    (the "per-flow" baseline of docs/design.md section 4.4; Terra paper section 6.1).

    Args:
        topology: the shared WAN view.  k: paths per DC pair (only the first is used).
    """

    name = "per-flow"
