"""The testbed's workload in the flow-level simulator: what ideal schedulers (Terra or any of
the registry's) and ideal per-flow TCP would achieve on the same emulated WAN, to tell the
system apart from the workload.

`simulate_testbed` replays the very coflows the testbed runs (same bytes, arrival times and
link failure) through terra_sim.simulator with the real policies and the per-flow
baseline (max-min fair per flow on one shortest path: ideal TCP), on the SWAN testbed
topology with every link at `link_mbps` x swan.CAPACITY_FRACTION (the capacity Terra's
controller is given; one capacity for both, so the FoIs do not depend on it). Agents'
hosts map back to their DCs through the binding. CCTs, p95 and WAN utilization (bytes x
hops / (capacity x busy time), the testbed's definition) are computed as in the testbed.

One difference: on a link failure the simulated per-flow baseline moves to the next
shortest path (as IP routing would), while the testbed's TCP flows stay on their tunnel
and stall until the link returns, so with a failure the simulated per-flow TCP is an
optimistic bound and the simulated FoIs are lower bounds.

If the testbed's FoIs are close to these, the testbed measured the scheduling, not the
agents or the emulation; a FoI the simulator cannot reach either is a property of the
workload. benchmarks/testbed_slices.py uses this to show the FoIs over many trace slices.
"""

from __future__ import annotations

from collections.abc import Sequence

from mininet_scenarios.results import cct_stats
from mininet_scenarios.run_result import Failure
from mininet_scenarios.swan import CAPACITY_FRACTION, TESTBED_TOPOLOGY
from mininet_scenarios.workload import TestbedCoflow
from terra_core.registry import SchedulerOptions, make_scheduler
from terra_model import Coflow, Flow
from terra_sim.simulator import SimResult, WanChange, simulate
from topologies import load_topology
from topologies.binding import Binding


def to_coflows(coflows: Sequence[TestbedCoflow], binding: Binding) -> list[Coflow]:
    """The testbed coflows as simulator Coflows: each flow's hosts replaced by their DCs.

    Raises:
        ValueError: a flow names a host the binding does not know.
    """
    dc_of = {host.name: dc for dc, host in binding.all_hosts()}
    out = []
    for c in coflows:
        try:
            flows = [Flow(f["id"], dc_of[f["src"]], dc_of[f["dst"]], f["bytes"]) for f in c.flows]
        except KeyError as exc:
            raise ValueError(f"coflow {c.trace_id}: unknown host {exc.args[0]!r}") from None
        out.append(Coflow(str(c.trace_id), c.arrival_s, flows))
    return out


def simulate_testbed(
    coflows: Sequence[TestbedCoflow],
    binding: Binding,
    link_mbps: float,
    k: int = 4,
    failure: Failure | None = None,
    schedulers: Sequence[str] = ("terra",),
) -> dict:
    """Simulate the testbed workload with each scheduler and per-flow TCP (module docstring).

    Args:
        coflows: the testbed's coflows (mininet_scenarios.workload.testbed_coflows).
        binding: the testbed binding (host names -> DCs).
        link_mbps: the HTB rate of every WAN link (Mbit/s).
        k: paths per DC pair (as the testbed's tunnels).
        failure: the link failure the testbed scripts, or None.
        schedulers: registry names (terra_core/registry.py) the testbed ran; the first
            is the one the FoIs compare with per-flow TCP.

    Returns:
        {"schedulers": [names], name: {"avg_cct_s", "p95_cct_s", "wan_utilization"} for
         each scheduler, "per_flow_tcp": {same} (the per-flow max-min policy standing for
         kernel TCP), "foi_avg_cct": per-flow avg / first scheduler's avg,
         "foi_wan_utilization": first scheduler's / per-flow's}.

    Raises:
        ValueError: non-positive link_mbps, unknown hosts or scheduler names;
            SimulationError from the simulator.
    """
    if not link_mbps > 0:
        raise ValueError(f"link_mbps must be positive, got {link_mbps!r}")
    workload = to_coflows(coflows, binding)
    changes = []
    if failure is not None:
        changes = [
            WanChange(failure.down_s, failure.a, failure.b, up=False),
            WanChange(failure.up_s, failure.a, failure.b, up=True),
        ]
    out: dict = {"schedulers": list(schedulers)}
    for key, name in [*((n, n) for n in schedulers), ("per_flow_tcp", "per-flow")]:
        topology = load_topology(
            str(TESTBED_TOPOLOGY), link_gbps=link_mbps * CAPACITY_FRACTION / 1000
        )
        policy = make_scheduler(name, topology, SchedulerOptions(k=k))
        out[key] = _summary(simulate(policy, workload, changes))
    first = out[schedulers[0]]
    out["foi_avg_cct"] = out["per_flow_tcp"]["avg_cct_s"] / first["avg_cct_s"]
    out["foi_wan_utilization"] = float(
        first["wan_utilization"] / out["per_flow_tcp"]["wan_utilization"]
    )
    return out


def _summary(result: SimResult) -> dict:
    done = [c for c in result.coflows if c.wan and c.cct_s is not None]
    avg, p95 = cct_stats({c.id: c.cct_s for c in done})
    util = result.wan_utilization
    return {
        "avg_cct_s": avg,
        "p95_cct_s": p95,
        "wan_utilization": None if util is None else float(util),
    }
