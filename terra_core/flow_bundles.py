"""Bundling identical flows of a coflow, so the simulator tracks thousands, not 700k, flows.

In the FB trace a reducer's bytes are split equally over the coflow's mappers
(docs/design.md section 8), so one coflow often has many flows with the same source
DC, destination DC and size. Under every policy we simulate such flows are
exchangeable and get the same rate at every instant (max-min fairness, MADD and
FlowGroup splits are symmetric in them), so they finish together. A
`FlowBundle` stands for `count` such flows: its `bytes` is their total, and the
baselines weight it by `count` wherever they are fair per flow (getattr(flow,
"count", 1)), which gives exactly the rates the separate flows would get.
"""

from __future__ import annotations

from dataclasses import dataclass

from terra_model import Coflow, Flow


@dataclass(frozen=True)
class FlowBundle(Flow):
    """`count` identical flows (same coflow, source DC, destination DC and size) as one.

    Attributes:
        count: number of flows bundled (>= 1); `bytes` is the bundle's total,
            so each member has ``bytes / count`` bytes.
        members: the ids of the bundled flows.
    """

    count: int = 1
    members: tuple[str, ...] = ()


def flow_count(flow: Flow) -> int:
    """Return how many flows `flow` stands for (a FlowBundle's count, else 1)."""
    return getattr(flow, "count", 1)


def bundle_wan_flows(coflow: Coflow) -> Coflow:
    """Return a copy of `coflow` with only its WAN flows, identical ones bundled.

    Args:
        coflow: any coflow.

    Returns:
        A Coflow with the same id, arrival and deadline whose flows are
        FlowBundles, one per distinct (src DC, dst DC, bytes) of the WAN flows,
        in order of first appearance; a bundle's id is the id of its first
        member. Intra-DC flows are dropped (they do not use the WAN).
    """
    groups: dict[tuple[str, str, float], list[Flow]] = {}
    for f in coflow.flows:
        if not f.intra_dc:
            groups.setdefault((f.src, f.dst, f.bytes), []).append(f)
    bundles: list[Flow] = [
        FlowBundle(fs[0].id, src, dst, size * len(fs), len(fs), tuple(f.id for f in fs))
        for (src, dst, size), fs in groups.items()
    ]
    return Coflow(coflow.id, coflow.arrival_s, bundles, coflow.deadline_s)


def unbundled_wan_flows(coflow: Coflow) -> Coflow:
    """Return a copy of `coflow` with only its WAN flows, each as a bundle of one."""
    flows: list[Flow] = [
        FlowBundle(f.id, f.src, f.dst, f.bytes, 1, (f.id,)) for f in coflow.flows if not f.intra_dc
    ]
    return Coflow(coflow.id, coflow.arrival_s, flows, coflow.deadline_s)
