"""Event-driven, flow-level WAN simulator that drives any Policy.

Between events every flow's rate is constant. The next event is the earliest
of: a flow finishing at its current rate, a coflow arriving, a scripted WAN
change (link down / up, capacity change), a wakeup the policy asks for
(optional ``next_wakeup(now)``: TerraPolicy's aged starvation guard). At every event the simulator
(docs/design.md section 4.3, policy.py):

1. removes finished coflows from the policy (`remove_coflow`);
2. applies the WAN changes due now to the shared topology, then calls
   `wan_changed`;
3. hands arriving coflows to the policy (`add_coflow`; a False answer is a
   rejection, recorded, and the coflow is not run);
4. asks for an allocation (`allocate`) of every unfinished WAN flow and checks
   it: unknown or finished flows, negative rates, paths that do not join the
   flow's DCs, rates on links that are down, and link loads above capacity by
   more than 1e-6 relative raise `SimulationError` (a policy bug; nothing is
   clamped). Policies with ``pair_table`` / ``table_levels`` (per-flow, multipath:
   the workload's DC pairs numbered once per WAN state, then asked by index),
   ``pair_levels`` (swan-mcf) or ``live_coflow_rates`` (varys, rapier) are asked through
   those instead of `allocate`: the same rates as arrays per DC pair or per coflow,
   with the same checks, without a dict entry per active flow per event
   (pair_allocation.py, coflow_allocation.py). Per event the loop touches only the live
   flows (admitted, not finished; an index array kept in position order). Policies
   with ``group_rates`` (Terra) are asked for rates per FlowGroup, given the
   FlowGroups' remaining volumes, and the simulator splits them among the flows in
   proportion to their remaining bytes, as `allocate` would (the same floating-point
   operations in the same order, so the same rates to the bit; group_allocation.py).

Conventions:
- Intra-DC flows do not use the WAN and finish instantly; a coflow with only
  intra-DC flows finishes at its arrival (CCT 0). Such coflows are reported
  (``wan=False``) but left out of every CCT, slowdown and deadline statistic,
  and are never shown to the policy.
- Identical WAN flows of a coflow are bundled (flow_bundles.py) unless
  ``bundle=False``; this changes no rate, only the bookkeeping cost.
- A flow finishes when its remaining bytes would reach zero within 1e-9 of the
  step (relative) or within 1e-6 bytes; its last remaining bytes are then
  delivered in full. Bytes are conserved: delivered + remaining = total is
  checked at the end.
- If nothing has a positive rate and no arrival or WAN change is pending, the
  run stops and the unfinished coflows are reported (finish_s None).
- WAN utilization = bytes x hops carried over WAN links / (sum over links of
  available capacity x time, integrated over the time during which at least one
  admitted WAN coflow is unfinished). Down links count 0 capacity.
- Slowdown = CCT / Γ on the empty WAN (all links up, initial capacities, K
  paths), computed with the same LP (min_cct.py) for every scheduler.

The run itself is engine.py (the event loop), events.py (arrivals, WAN changes, wakeups),
flow_table.py (flows and links as arrays), the Allocators (allocation.py and its fast
paths), kernels.py (the compiled passes over the live flows) and results.py.
"""

from __future__ import annotations

import gc
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import replace

from terra_core.policy import Policy
from terra_model import Coflow
from terra_sim.engine import Engine
from terra_sim.events import WanChange
from terra_sim.results import SimResult
from topologies import Topology, all_pairs_paths


def empty_wan_gammas(coflows: Iterable[Coflow], topology: Topology, k: int) -> dict[str, float]:
    """Γ of every WAN coflow alone on the empty WAN (Optimization (1), docs/design.md 4.1).

    Args:
        coflows: the workload.
        topology: the WAN; its current link states and capacities are used.
        k: paths per DC pair.

    Returns:
        {coflow id: Γ in seconds} for coflows with WAN flows (inf when a
        FlowGroup has no path).
    """
    from terra_core.min_cct import min_cct  # the LP lives with Terra

    paths = all_pairs_paths(topology, k)
    capacity = {link: topology.available(link) for link in topology.links}
    gammas = {}
    for c in coflows:
        volumes = c.flowgroups()
        if volumes:
            need = {pair: paths[pair] for pair in volumes}
            gammas[c.id] = float(min_cct(volumes, need, capacity).gamma_s)
    return gammas


def with_deadline_factor(
    coflows: Sequence[Coflow], gammas: dict[str, float], factor: float
) -> list[Coflow]:
    """Give every WAN coflow a deadline of `factor` x its Γ on the empty WAN.

    Args:
        coflows: the workload.
        gammas: {coflow id: Γ_empty seconds} (see empty_wan_gammas).
        factor: > 0.

    Returns:
        New Coflow objects; coflows without a finite positive Γ keep their deadline.

    Raises:
        ValueError: factor <= 0.
    """
    if not factor > 0:
        raise ValueError(f"deadline factor must be positive, got {factor!r}")
    out = []
    for c in coflows:
        g = gammas.get(c.id)
        ok = g is not None and 0 < g < float("inf")
        out.append(replace(c, deadline_s=factor * g) if ok else c)
    return out


def simulate(
    policy: Policy,
    coflows: Sequence[Coflow],
    changes: Sequence[WanChange] = (),
    gammas: dict[str, float] | None = None,
    bundle: bool = True,
    progress: object | None = None,
    quantum_s: float | None = None,
) -> SimResult:
    """Run `coflows` through `policy` on `policy.topology` (which the run mutates).

    Args:
        policy: any Policy; it must be fresh (no coflows yet).
        coflows: the workload (any order; ids unique).
        changes: scripted WAN changes.
        gammas: optional {coflow id: Γ_empty seconds} for slowdowns.
        bundle: bundle identical flows (exact; see flow_bundles.py).
        progress: optional object with ``update(n)`` (e.g. tqdm), told of
            every coflow that completes, is rejected, or is intra-DC only.
        quantum_s: when given, time advances in whole quanta of this many seconds from 0:
            every event after the start is moved up to the next multiple (a flow that
            would finish within a quantum finishes at its end; rates change only on the
            grid), as CoflowSim's 8-ms steps (engine.on_grid; arrivals and WAN changes
            should lie on the grid).

    Returns:
        A SimResult.

    Raises:
        SimulationError: infeasible allocation from the policy, or lost bytes.
        ValueError: duplicate coflow ids, or what the policy raises for a coflow
            (e.g. a DC pair with no path).
    """
    with _fewer_gc_passes():
        engine = Engine(policy, coflows, changes, gammas or {}, bundle, progress, quantum_s)
        return engine.run()


GC_THRESHOLDS = (100_000, 50, 100)  # during a run: gen-0 allocations between passes, gen-1, gen-2


@contextmanager
def _fewer_gc_passes() -> Iterator[None]:
    """Run the block with the cyclic garbage collector tuned as the controller's `tune_gc`
    does: what is alive at the start is frozen (not scanned again) and gen-0 passes run
    every GC_THRESHOLDS[0] allocations instead of 700. A run allocates millions of
    short-lived objects and few cycles; with the defaults the passes cost ~10 % of a Terra
    run on ATT. The previous thresholds are restored and the frozen objects released
    afterwards; no result depends on it."""
    before = gc.get_threshold()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)
    try:
        yield
    finally:
        gc.set_threshold(*before)
        gc.unfreeze()
