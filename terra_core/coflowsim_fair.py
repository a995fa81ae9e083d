"""The coflowsim-fair baseline: CoflowSim's FAIR, per-flow shares without redistribution
(docs/design.md sections 4.4 and 7).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from terra_core.baseline_policy import Route
from terra_core.madd import MaddPolicy, checked_live, flow_positions
from terra_core.sparse_index import csr_ranges


class CoflowSimFairPolicy(MaddPolicy):
    """CoflowSim's flow-level FAIR sharing (github.com/coflow/coflowsim,
    FlowSimulator.fairShare) on any WAN: every flow on its shortest path gets, per member,
    the smallest over the links of its path of capacity / members of active flows
    crossing the link. On the big switch a flow's links are its mapper rack's uplink and
    its reducer rack's downlink, so a flow gets min(port / flows leaving its mapper rack,
    port / flows entering its reducer rack), CoflowSim's rule. Capacity a flow cannot use
    because its other link is more crowded is not handed to anyone (not max-min fair, not
    work-conserving). All flows of a coflow start at once (CoflowSim's cap of 5 flows per
    reducer is overwritten before use). Only the per-coflow bookkeeping is MaddPolicy's.

    Args:
        topology: the shared WAN view.  k: paths per DC pair (only the first is used).
    """

    name = "coflowsim-fair"

    def live_coflow_rates(
        self,
        now: float,
        cids: Sequence[str],
        counts: Sequence[int] | np.ndarray,
        local: np.ndarray,
        remaining: np.ndarray,
    ) -> tuple[np.ndarray, list[list[Route]]]:
        """Per-member rates of the unfinished flows of the active coflows (the class rule;
        arguments and result shapes as `MaddPolicy.live_coflow_rates`). A flow without a
        route, or with a link of no capacity, gets 0.

        Raises:
            ValueError: lengths that do not agree, a negative count, an index outside its
                coflow, or remaining bytes not finite and > 0.
            KeyError: an unknown coflow.
        """
        counts, local, remaining = checked_live(cids, counts, local, remaining)
        if not cids:
            return np.zeros(0), []
        lay = self._layout(cids)
        flow = flow_positions(lay, counts, local)
        capacity = self._capacity()
        nnz = lay.ptr[flow + 1] - lay.ptr[flow]
        entry = csr_ranges(lay.ptr, flow)
        rows = lay.rows[entry]
        crossing = np.bincount(rows, weights=lay.vals[entry], minlength=len(capacity))
        share = np.divide(capacity, crossing, out=np.zeros(len(capacity)), where=crossing > 0)
        rate = np.zeros(len(flow))
        some = np.flatnonzero(nnz)
        if len(some):
            starts = (np.cumsum(nnz) - nnz)[some]
            rate[some] = np.minimum.reduceat(share[rows], starts)
        return rate, lay.routes
