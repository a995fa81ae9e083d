"""The varys baseline: SEBF order and MADD rates on fixed shortest paths (docs/design.md
section 4.4).
"""

from __future__ import annotations

from terra_core.madd import MaddPolicy


class VarysPolicy(MaddPolicy):
    """Varys (Chowdhury, Zhong, Stoica, "Efficient coflow scheduling with Varys", SIGCOMM
    2014) on a WAN: flows on fixed shortest paths, coflows ordered Smallest Effective
    Bottleneck First (Γ = max over links of the coflow's remaining bytes / capacity), MADD
    rates on the capacity the earlier coflows left, leftover backfilled max-min per flow.
    Varys' deadline admission is not modelled (all coflows are accepted).

    Args:
        topology: the shared WAN view.  k: paths per DC pair (only the first is used).
    """

    name = "varys"
