"""Terra in the simulator when failed links cut a DC pair off: the pair's FlowGroups wait
at rate 0 until a path comes back, the other FlowGroups and coflows go on, and a coflow
arriving during the cut is admitted (as the baselines do, terra_core/baseline_policy.py)."""

from __future__ import annotations

import pytest

from terra_core.registry import SchedulerOptions, make_scheduler
from terra_core.terra_policy import TerraPolicy
from terra_model import Coflow, Flow
from terra_sim.simulator import WanChange, simulate
from topologies import Topology

GBPS = 1.25e8  # bytes/s


def line_wan() -> Topology:
    """A - B - C, 1 Gbps each way: C is reached only over B-C."""
    cap = {}
    for a, b in [("A", "B"), ("B", "C")]:
        cap[(a, b)] = cap[(b, a)] = GBPS
    return Topology("line", ["A", "B", "C"], cap)


def cut_b_c(down_s: float = 1.0, up_s: float = 5.0) -> list[WanChange]:
    return [WanChange(down_s, "B", "C", up=False), WanChange(up_s, "B", "C", up=True)]


def test_a_cut_off_pair_waits_and_the_rest_goes_on():
    # A->C moves 1 Gbps for 1 s, waits 4 s, then needs 7 more seconds: done at 12 s.
    # B->A shares no link with it and ends at 8 s, untouched by the cut.
    coflows = [
        Coflow("cut", 0.0, [Flow("f1", "A", "C", 8 * GBPS)]),
        Coflow("other", 0.0, [Flow("f2", "B", "A", 8 * GBPS)]),
    ]
    per_flow = make_scheduler("per-flow", line_wan(), SchedulerOptions(k=4))
    for policy in (TerraPolicy(line_wan(), k=4), per_flow):
        result = simulate(policy, coflows, cut_b_c())
        cct = {c.id: c.cct_s for c in result.coflows}
        assert cct["cut"] == pytest.approx(12.0)
        assert cct["other"] == pytest.approx(8.0)


def test_a_coflow_arriving_during_the_cut_is_admitted_and_waits():
    # Arrives at 2 s while B-C is down; starts at 5 s and takes 1 s: CCT 4 s.
    coflows = [Coflow("late", 2.0, [Flow("f", "A", "C", GBPS)])]
    result = simulate(TerraPolicy(line_wan(), k=4), coflows, cut_b_c())
    (late,) = result.coflows
    assert late.admitted
    assert late.cct_s == pytest.approx(4.0)


def test_a_pair_with_no_path_at_all_is_still_refused():
    topo = Topology("two", ["A", "B", "C"], {("A", "B"): GBPS, ("B", "A"): GBPS})
    policy = TerraPolicy(topo, k=4)
    with pytest.raises(ValueError, match="no path from A to C"):
        policy.add_coflow(Coflow("c", 0.0, [Flow("f", "A", "C", GBPS)]), 0.0)
