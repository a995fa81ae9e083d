"""Tenants on one WAN: isolation, CCT and utilization of four ways to share it
(docs/design.md 4.5; docs/results.md "Tenants").

    uv run python benchmarks/tenant_isolation.py --topology {swan,gscale,att} --tenants N
        [--workload fb] [--limit N] [--k 4] [--pieces 100] [--no-greedy]
        [--tenant-order {share,wan}] [--json OUT]

The workload's coflows go to N equal tenants (coflow i to tenant i mod N,
terra_sim/tenants.py). Policies, each simulated on the same coflows:
  terra    Terra without tenants (one owner);
  static   each tenant s_t = 1/N of every link, active or not, Terra inside (TenantPolicy
           "static": the static partition);
  maxmin   per-tenant max-min, DRF-like on fixed shortest paths: every (tenant, pair) one
           commodity on its shortest path, progressive filling weighted by s_t·d/Γ_t (Γ_t
           on shortest paths), each pair's rate split equally among the tenant's coflows
           on it (fair sharing, no coflow order);
  tenants  ours (TenantPolicy "cooperative": Step A shares over K tunnels, Terra inside,
           leftover max-min).
static and tenants order each tenant's coflows by Γ on the whole WAN (the default) or, with
--tenant-order share, on its share (tenant_shares.ORDERS).
Per cell (topology x policy): the min isolation guarantee reached and its optimum (means
over the rounds with at least two tenants active; a round's reached value is min_t of the
progress tenant t's volumes can make on the capacity it was given (static, tenants: its
share, plus its leftover) or, for terra and maxmin, on the link loads of its rates, over
s_t; "min_isolation_guarantee_used" takes the loads for every policy), each tenant's
average CCT and its average CCT alone on a static partition of its weight (Terra alone on
s_t x every link), the overall average CCT, WAN utilization, Jain's index over tenants'
progress ("jain_index": in each round with two or more tenants active, Jain's index over
the tenants' weighted progress P_t / s_t on the link loads of their rates, the values of
"min_isolation_guarantee_used"; the mean over those rounds; 1 when every tenant progresses
in proportion to its weight), Jain's index over tenants of (static-partition avg CCT / avg
CCT) ("jain_index_cct"), and greedy_honest_avg_cct_change: the largest
relative change of an honest tenant's average CCT when the last tenant replays each of its
coflows as --pieces coflows (same bytes, same arrival). Prints one line per cell and the
load average; writes {"cells": [...]} with --json.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import sys
import time
from pathlib import Path

import numpy as np

from terra_core.min_cct import min_cct
from terra_core.round_rates import RoundResult
from terra_core.tenant_policy import TenantPolicy, TenantSpec
from terra_core.tenant_shares import (
    DEFAULT_ORDER,
    ORDERS,
    add_load,
    allocation_progress,
    isolation_shares,
    leftover_rates,
)
from terra_core.terra_policy import TerraPolicy
from terra_sim.simulator import empty_wan_gammas, simulate
from terra_sim.tenants import per_tenant, split_greedy
from topologies import load_topology
from workloads import load_workload

POLICIES = ("terra", "static", "maxmin", "tenants")


class TenantMaxMin(TerraPolicy):
    """Per-tenant max-min on fixed shortest paths (module docstring: maxmin)."""

    name = "maxmin"

    def __init__(self, topology, spec: TenantSpec, **kw) -> None:
        super().__init__(topology, **kw)
        self.spec = spec

    def _round(self, now, volumes, share=None, order="share"):
        paths = {k: ps[:1] for k, ps in self._paths_for(volumes).items()}
        capacity = self._capacity()
        by_t: dict = {}
        for cid, vol in volumes.items():
            agg = by_t.setdefault(self.spec.tenant_of[cid], {})
            for k, v in vol.items():
                agg[k] = agg.get(k, 0.0) + v
        total_w = sum(self.spec.weights[t] for t in by_t)
        weights = {}
        for t, vol in by_t.items():
            gamma = min_cct(vol, paths, capacity, fewest_link_bytes=False).gamma_s
            if 0 < gamma < float("inf"):
                s = self.spec.weights[t] / total_w
                weights[t] = {k: s * d / gamma for k, d in vol.items()}
        got = leftover_rates(weights, paths, dict(capacity), capacity)
        members: dict = {}
        for cid, vol in volumes.items():
            for k, v in vol.items():
                if v > 0:
                    members.setdefault((self.spec.tenant_of[cid], k), []).append(cid)
        out: dict = {}
        for (t, k), cids in members.items():
            lst = got.get(t, {}).get(k)
            for cid in cids if lst else ():
                out.setdefault(cid, {})[k] = [(p, x / len(cids)) for p, x in lst]
        self.stats["rounds"] += 1
        result = RoundResult()
        result.rates = out
        return result


class Probe:
    """Wraps a policy with group_rates and measures, in every round with two or more
    tenants active, the optimal isolation guarantee and the one reached (module docstring)."""

    def __init__(self, inner, spec: TenantSpec) -> None:
        self.inner, self.spec = inner, spec
        self.optimum: list[float] = []
        self.reached: list[float] = []
        self.used: list[float] = []
        self.jain: list[float] = []

    group_rate_arrays = None  # (the simulator asks group_rates, which measures)

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def group_rates(self, now, volumes):
        rates = self.inner.group_rates(now, volumes)
        tenant_vol: dict = {}
        for cid, vol in volumes.items():
            agg = tenant_vol.setdefault(self.spec.tenant_of[cid], {})
            for k, v in vol.items():
                if v > 0:
                    agg[k] = agg.get(k, 0.0) + v
        tenant_vol = {t: v for t, v in tenant_vol.items() if v}
        if len(tenant_vol) >= 2:
            self._measure(tenant_vol, rates)
        return rates

    def _measure(self, tenant_vol, rates) -> None:
        inner = getattr(self.inner, "_first", self.inner)
        capacity = inner._capacity()
        paths = {k: inner.paths(*k) for vol in tenant_vol.values() for k in vol}
        found = isolation_shares(tenant_vol, self.spec.weights, paths, capacity)
        loads: dict = {t: dict.fromkeys(capacity, 0.0) for t in tenant_vol}
        for cid, per in rates.items():
            t = self.spec.tenant_of[cid]
            for lst in per.values():
                add_load(loads[t], lst)
        used = [
            allocation_progress(tenant_vol[t], paths, loads[t], g) / found.weight_share[t]
            for t, g in found.solo_gamma.items()
            if t in found.weight_share
        ]
        if not used:
            return
        self.optimum.append(found.guarantee)
        self.used.append(min(used))
        self.jain.append(jain_index(used))
        stats = getattr(self.inner, "stats", {})
        given = stats.get("achieved")
        self.reached.append(given[-1] if given else min(used))


def make(policy: str, topology, spec: TenantSpec, k: int):
    """A fresh policy `policy` (POLICIES) on `topology`."""
    if policy == "terra":
        return TerraPolicy(topology, k=k)
    if policy == "maxmin":
        return TenantMaxMin(topology, spec, k=k)
    sharing = "static" if policy == "static" else "cooperative"
    return TenantPolicy(topology, dataclasses.replace(spec, sharing=sharing), True, k=k)


def static_alone(topology, coflows, spec: TenantSpec, k: int) -> dict[str, float | None]:
    """{tenant: avg CCT of its coflows alone with Terra on s_t x every link}."""
    total = sum(spec.weights.values())
    out = {}
    for t, w in spec.weights.items():
        topo = topology.copy()
        topo.capacity = {e: c * w / total for e, c in topo.capacity.items()}
        mine = [c for c in coflows if spec.tenant_of[c.id] == t]
        out[t] = simulate(TerraPolicy(topo, k=k), mine).avg_cct_s
    return out


def cell(name, topology, coflows, spec, k, alone, pieces) -> dict:
    """One policy's figures (module docstring), as the JSON's cell."""
    probe = Probe(make(name, topology.copy(), spec, k), spec)
    gammas = empty_wan_gammas(coflows, topology, k)
    res = simulate(probe, coflows, gammas=gammas)
    mine = per_tenant(res, spec.tenant_of)
    ratios = [alone[t] / v["avg_cct_s"] for t, v in mine.items() if v["avg_cct_s"]]
    out = {
        "policy": name,
        "avg_cct_s": res.avg_cct_s,
        "wan_utilization": res.wan_utilization,
        "min_isolation_guarantee": _mean(probe.reached),
        "optimal_isolation_guarantee": _mean(probe.optimum),
        "min_isolation_guarantee_used": _mean(probe.used),
        "multi_tenant_rounds": len(probe.optimum),
        "per_tenant": {
            t: {"avg_cct_s": v["avg_cct_s"], "static_partition_avg_cct_s": alone[t]}
            for t, v in mine.items()
        },
        "jain_index": _mean(probe.jain),
        "jain_index_cct": jain_index(ratios) if ratios else None,
        "greedy_honest_avg_cct_change": None,
        "wall_s": res.wall_s,
    }
    if pieces:
        greedy = list(spec.weights)[-1]
        work, owner = split_greedy(coflows, spec.tenant_of, greedy, pieces)
        gspec = dataclasses.replace(spec, tenant_of=owner)
        gres = simulate(make(name, topology.copy(), gspec, k), work)
        gmine = per_tenant(gres, owner, greedy)
        changes = [
            abs(gmine[t]["avg_cct_s"] / mine[t]["avg_cct_s"] - 1)
            for t in spec.weights
            if t != greedy and mine[t]["avg_cct_s"] and gmine[t]["avg_cct_s"]
        ]
        out["greedy_honest_avg_cct_change"] = max(changes) if changes else None
    return out


def jain_index(xs: list[float]) -> float:
    """Jain's index (Σx)² / (n Σx²) of n >= 1 values >= 0: 1 when all are equal, 1/n when
    one has everything; nan when all are 0 (left out of the means)."""
    sq = sum(x * x for x in xs)
    return sum(xs) ** 2 / (len(xs) * sq) if sq > 0 else math.nan


def _mean(xs: list[float]) -> float | None:
    xs = [x for x in xs if np.isfinite(x)]
    return float(np.mean(xs)) if xs else None


def main(argv=None) -> int:
    """Run the cells of one topology and print / write them (module docstring)."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--topology", required=True, choices=["swan", "gscale", "att"])
    p.add_argument("--tenants", type=int, default=4)
    p.add_argument("--workload", default="fb")
    p.add_argument("--limit", type=int, default=None)
    p.add_argument("--k", type=int, default=4)
    p.add_argument("--pieces", type=int, default=100, help="greedy tenant's pieces per coflow")
    p.add_argument("--no-greedy", action="store_true")
    p.add_argument("--policies", default=",".join(POLICIES))
    p.add_argument("--tenant-order", choices=ORDERS, default=DEFAULT_ORDER,
                   help="Γ order inside each share (static, tenants)")  # fmt: skip
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args(argv)
    topology = load_topology(args.topology)
    coflows = load_workload(args.workload, topology, limit=args.limit)
    weights = {f"t{i}": 1.0 for i in range(args.tenants)}
    names = list(weights)
    owner = {c.id: names[i % len(names)] for i, c in enumerate(coflows)}
    spec = TenantSpec(weights, owner, order=args.tenant_order)
    start = time.perf_counter()
    alone = static_alone(topology, coflows, spec, args.k)
    cells = []
    for name in args.policies.split(","):
        pieces = 0 if args.no_greedy else args.pieces
        got = cell(name, topology, coflows, spec, args.k, alone, pieces)
        got = {"topology": args.topology, "tenants": args.tenants, **got}
        cells.append(got)
        print(json.dumps({k: v for k, v in got.items() if k != "per_tenant"}), flush=True)
        for t, v in got["per_tenant"].items():
            print(f"  {t}: avg CCT {v['avg_cct_s']:.3f} s, alone on its static partition "
                  f"{v['static_partition_avg_cct_s']:.3f} s", flush=True)  # fmt: skip
    load = os.getloadavg()
    print(f"wall {time.perf_counter() - start:.0f} s; load average {load[0]:.2f} {load[1]:.2f} "
          f"{load[2]:.2f}; cpus {os.cpu_count()}")  # fmt: skip
    if args.json:
        args.json.write_text(json.dumps({"cells": cells, "argv": sys.argv[1:]}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
