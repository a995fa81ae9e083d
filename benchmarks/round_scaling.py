"""How Terra's scheduling round scales with the WAN's size and the number of coflows.

For every (topology, N) cell, N coflows are active at once: an event-driven run
(every flow at its allocated rate until the next flow finishes) in which a
coflow that finishes is replaced at once by a new one, so N stays constant.
Each event is one `TerraPolicy.allocate` call (one round, docs/design.md 4.2-4.3,
with the Γ cache and memo a real run has); the first `--warmup` rounds (cold
caches) are not counted. Prints the median / p95 wall ms, the LPs per round, the CPU
seconds of the counted rounds and the wall seconds HiGHS ran in them ("LP s", the part
no Python change can remove) per cell, then the fitted growth: the slope of log(median
ms) against log(DCs) at fixed N and against log(N) at fixed topology (least squares).

Topologies: `synthD` is a seeded synthetic connected WAN of D DCs
(`synthetic_wan`: Waxman-style, average degree 3.5); the built-ins are swan,
gscale and att. Links are 1 Gbps (1.25e8 bytes/s), K = 4 paths per DC pair.

Coflows (`random_coflow`): width (flows) and flow sizes are heavy tailed:
width = min(64, ⌊Pareto(α=1.2)⌋) (most coflows 1-2 flows, some tens), size =
min(10 GB, 1 MB × Pareto(α=1.1)); source and destination DCs uniform, distinct.

With `--tenants N` every cell is run twice on the same coflow stream, plain Terra and
Terra with N equal-weight tenants (tenant_policy.TenantPolicy, cooperative sharing;
coflow i in arrival order to tenant t{i mod N}, the rule of `terra-sim --tenants N`),
their rounds interleaved (one of each in turn) so both see the same load; the table
puts the two side by side with the ratio of the medians (tenants / Terra) and of the CPU
seconds. `--tenant-order share wan` runs the tenants once per order inside the shares
(tenant_shares.ORDERS: Γ on each tenant's share, or on the whole WAN, the default), all
interleaved with plain Terra's in one run.

    python -m benchmarks.round_scaling [--topologies synth10 synth100 att swan ...]
        [--coflows 10 1000 ...] [--rounds R] [--tenants N [--tenant-order share wan]]
        [--json OUT]

JSON: {"cells": [{"topology", "dcs", "coflows", "round_ms_median", "round_ms_p95",
"lps_per_round", "cpu_s", "solver_s"; with --tenants also "tenants", and per order the
keys "tenant_round_ms_median", "tenant_round_ms_p95", "tenant_lps_per_round",
"tenant_cpu_s", "tenant_solver_s", "ratio", "cpu_ratio" for the default order ("wan"), and
for the order "share" the same with "tenant_share_" and "ratio_share"/"cpu_ratio_share")}],
"fit": {...}, "loadavg": [1, 5, 15 min]}.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import sys
import time
from pathlib import Path as FsPath

import networkx as nx
import numpy as np

from terra_core.lp import observe_solves
from terra_core.tenant_policy import TenantPolicy, TenantSpec
from terra_core.tenant_shares import DEFAULT_ORDER, ORDERS
from terra_core.terra_policy import TerraPolicy
from terra_model import Coflow, Flow
from terra_sim.tenants import parse_tenants
from topologies import GBPS_TO_BYTES_PER_S, Topology, load_topology

DEFAULT_TOPOLOGIES = [
    "synth10",
    "synth25",
    "synth50",
    "synth100",
    "synth200",
    "swan",
    "gscale",
    "att",
]
DEFAULT_COFLOWS = [10, 50, 200, 1000, 5000]
MAX_WIDTH = 64
MAX_BYTES = 10e9
MIN_BYTES = 1e6


def synthetic_wan(dcs: int, seed: int = 0, degree: float = 3.5, gbps: float = 1.0) -> Topology:
    """A connected Waxman-style WAN of `dcs` DCs with average degree about `degree`.

    DCs are uniform points in the unit square. A Euclidean minimum spanning tree
    makes it connected; then further links are drawn with Waxman's probability
    ∝ exp(−dist / (β·L)) (β = 0.4, L the largest distance) until the graph has
    round(degree·dcs/2) links (or every pair is joined). Seeded: same args, same WAN.

    Args:
        dcs: number of DCs (>= 2). seed: random seed. degree: target average degree.
        gbps: capacity of every link (each direction), Gbps.

    Returns:
        Topology named "synth<dcs>", DCs "S0".."S<dcs-1>", 1 Gbps = 1.25e8 bytes/s.

    Raises:
        ValueError: dcs < 2.
    """
    if dcs < 2:
        raise ValueError(f"a WAN needs at least 2 DCs, got {dcs}")
    rng = random.Random(seed)
    pos = [(rng.random(), rng.random()) for _ in range(dcs)]
    full = nx.Graph()
    for i in range(dcs):
        for j in range(i + 1, dcs):
            full.add_edge(i, j, weight=math.dist(pos[i], pos[j]))
    graph = nx.minimum_spanning_tree(full)
    want = min(round(degree * dcs / 2), dcs * (dcs - 1) // 2)
    longest = max(w for _, _, w in full.edges(data="weight"))
    candidates = sorted(full.edges(data="weight"))
    while graph.number_of_edges() < want:
        u, v, w = candidates[rng.randrange(len(candidates))]
        if not graph.has_edge(u, v) and rng.random() < math.exp(-w / (0.4 * longest)):
            graph.add_edge(u, v)
    names = [f"S{i}" for i in range(dcs)]
    bps = gbps * GBPS_TO_BYTES_PER_S
    capacity = {}
    for u, v in graph.edges():
        capacity[(names[u], names[v])] = capacity[(names[v], names[u])] = bps
    return Topology(f"synth{dcs}", names, capacity)


def make_topology(name: str) -> Topology:
    """`synthD` (synthetic_wan(D)) or a built-in name, every link at 1 Gbps.

    Raises:
        ValueError / TopologyError: unknown name.
    """
    if name.startswith("synth"):
        return synthetic_wan(int(name.removeprefix("synth")))
    return load_topology(name, link_gbps=1.0)


def random_coflow(cid: str, dcs: list[str], rng: random.Random, now: float) -> Coflow:
    """A coflow with a heavy-tailed width and heavy-tailed flow sizes (module docstring).

    Returns:
        Coflow `cid` arriving at `now` (seconds) whose flows join distinct DCs.
    """
    width = min(MAX_WIDTH, int(rng.paretovariate(1.2)))
    flows = []
    for i in range(width):
        src, dst = rng.sample(dcs, 2)
        size = min(MAX_BYTES, MIN_BYTES * rng.paretovariate(1.1))
        flows.append(Flow(f"{cid}.{i}", src, dst, size))
    return Coflow(cid, now, flows)


class _Run:
    """One event-driven run with replacement (module docstring), stepped a round at a time.

    Args:
        topo: the WAN. n: coflows kept active. seed: the coflow stream's seed.
        tenants: 0 for plain Terra; N >= 1 for Terra with N equal-weight tenants
            (tenant_policy.TenantPolicy, cooperative sharing), coflow i (arrival order) to
            tenant t{i mod N}, the rule of `terra-sim --tenants N` (terra_sim/tenants.py).
        order: with tenants, the Γ order inside each share (tenant_shares.ORDERS).
    """

    def __init__(
        self, topo: Topology, n: int, seed: int = 1, tenants: int = 0, order: str = DEFAULT_ORDER
    ) -> None:
        self.rng = random.Random(seed)
        self.dcs = topo.dcs
        self.names = list(parse_tenants(str(tenants))) if tenants else []
        if tenants:
            spec = TenantSpec(parse_tenants(str(tenants)), {}, order=order)
            self.policy = TenantPolicy(topo.copy(), spec, k=4)
        else:
            self.policy = TerraPolicy(topo.copy(), k=4)
        self.remaining: dict[str, dict[str, float]] = {}
        self.count = 0
        self.now = 0.0
        for _ in range(n):
            self._arrive()

    def _arrive(self) -> None:
        cid = f"c{self.count}"
        if self.names:  # coflow i to tenant i mod N (terra_sim.tenants.assign)
            self.policy.spec.tenant_of[cid] = self.names[self.count % len(self.names)]
        coflow = random_coflow(cid, self.dcs, self.rng, self.now)
        self.count += 1
        self.policy.add_coflow(coflow, self.now)
        self.remaining[coflow.id] = {f.id: f.bytes for f in coflow.flows}

    def step(self) -> tuple[float, float, int]:
        """One round, then the run moves on to the next event.

        Returns (wall ms, CPU s, LPs, solver s) of the round's `allocate` call (solver s:
        the wall seconds HiGHS ran in it, lp.observe_solves).
        """
        lps_before = self.policy.stats["lps"]
        solver: list[float] = []
        cpu = time.process_time()
        start = time.perf_counter()
        with observe_solves(solver.append):
            alloc = self.policy.allocate(self.now, self.remaining)
        elapsed = (time.perf_counter() - start) * 1000.0
        cpu = time.process_time() - cpu
        lps = self.policy.stats["lps"] - lps_before
        self.now = _advance(alloc, self.remaining, self.now)
        for cid in [c for c, flows in self.remaining.items() if not flows]:
            del self.remaining[cid]
            self.policy.remove_coflow(cid, self.now)
            self._arrive()
        return elapsed, cpu, lps, math.fsum(solver)


def run_cell(
    topo: Topology,
    n: int,
    rounds: int,
    warmup: int = 2,
    seed: int = 1,
    tenants: int = 0,
    orders: tuple[str, ...] = (DEFAULT_ORDER,),
) -> dict:
    """Time `rounds` rounds after `warmup` ones; with `tenants` > 0 more runs on the same
    coflow stream, plain Terra and Terra with that many tenants once per order of `orders`
    (_Run), stepped in turn (round i of each, then round i + 1 of each) so all see the
    same machine load.

    Returns:
        {"round_ms": [ms per counted round], "lps": [LPs per counted round], "cpu_s": CPU
        seconds of the counted rounds, "solver_s": HiGHS's wall seconds in them}; with
        tenants also the same for each order's run, keys prefixed by `tenant_key(order)`
        ("tenant_round_ms", ..., or "tenant_wan_round_ms", ...).
    """
    runs = {"": _Run(topo, n, seed)}
    for order in orders if tenants else ():
        runs[tenant_key(order)] = _Run(topo, n, seed, tenants, order)
    out: dict = {}
    for key in runs:
        out.update({key + "round_ms": [], key + "lps": [], key + "cpu_s": 0.0})
        out[key + "solver_s"] = 0.0
    for i in range(warmup + rounds):
        for key, run in runs.items():
            ms, cpu, lps, solver = run.step()
            if i >= warmup:
                out[key + "round_ms"].append(ms)
                out[key + "lps"].append(lps)
                out[key + "cpu_s"] += cpu
                out[key + "solver_s"] += solver
    return out


def tenant_key(order: str) -> str:
    """The JSON and run_cell key prefix of the tenants' run with Γ order `order`: "tenant_"
    for the default order (tenant_shares.DEFAULT_ORDER, the keys of runs without
    --tenant-order), "tenant_<order>_" for another ("tenant_share_")."""
    return "tenant_" if order == DEFAULT_ORDER else f"tenant_{order}_"


def _advance(alloc, remaining: dict[str, dict[str, float]], now: float) -> float:
    """Move every flow on at its rate until the next flow finishes; drop finished flows.

    Returns the new time in seconds. A round with no rate (should not happen:
    work conservation) finishes nothing and advances by 1 s.
    """
    rate = {
        (cid, fid): sum(r for _, r in lst)
        for cid, flows in alloc.items()
        for fid, lst in flows.items()
    }
    finish = [
        left / rate[(cid, fid)]
        for cid, flows in remaining.items()
        for fid, left in flows.items()
        if rate.get((cid, fid), 0.0) > 0
    ]
    dt = min(finish, default=1.0)
    for cid, flows in remaining.items():
        for fid in list(flows):
            flows[fid] -= rate.get((cid, fid), 0.0) * dt
            if flows[fid] <= 1e-6 * MIN_BYTES:
                del flows[fid]
    return now + dt


def fit_growth(cells: list[dict]) -> dict:
    """Log-log least-squares slopes of the median round time.

    Returns:
        {"per_dcs": {N: slope over the synthetic WANs at N coflows},
         "per_coflows": {topology: slope over N}} (only where >= 2 points).
    """
    out: dict = {"per_dcs": {}, "per_coflows": {}}
    by_n: dict[int, list] = {}
    by_topo: dict[str, list] = {}
    for c in cells:
        if c["topology"].startswith("synth"):
            by_n.setdefault(c["coflows"], []).append((c["dcs"], c["round_ms_median"]))
        by_topo.setdefault(c["topology"], []).append((c["coflows"], c["round_ms_median"]))
    for key, pts, dest in [(n, p, "per_dcs") for n, p in by_n.items()] + [
        (t, p, "per_coflows") for t, p in by_topo.items()
    ]:
        if len(pts) >= 2:
            x, y = np.log([p[0] for p in pts]), np.log([p[1] for p in pts])
            out[dest][str(key)] = float(np.polyfit(x, y, 1)[0])
    return out


def main(argv: list[str] | None = None) -> int:
    """Run the grid; print the table and the fits; write --json OUT. Returns the exit status."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--topologies", nargs="+", default=DEFAULT_TOPOLOGIES)
    p.add_argument("--coflows", nargs="+", type=int, default=DEFAULT_COFLOWS)
    p.add_argument("--rounds", type=int, default=20, help="counted rounds per cell")
    p.add_argument("--warmup", type=int, default=2, help="uncounted first rounds per cell")
    p.add_argument(
        "--tenants", type=int, default=0, metavar="N",
        help="also time Terra with N equal-weight tenants (coflow i to tenant i mod N)",
    )  # fmt: skip
    p.add_argument(
        "--tenant-order", nargs="+", choices=ORDERS, default=[DEFAULT_ORDER], metavar="ON",
        help="with --tenants: one tenants' run per Γ order inside the shares (share, wan)",
    )  # fmt: skip
    p.add_argument("--json", type=FsPath, default=None, metavar="OUT")
    args = p.parse_args(argv)
    if args.tenants < 0:
        p.error("--tenants must be >= 0")
    orders = tuple(dict.fromkeys(args.tenant_order)) if args.tenants else ()
    cells = []
    head = (
        f"{'topology':<10} {'DCs':>4} {'links':>5} {'coflows':>7} {'median ms':>10} "
        f"{'p95 ms':>9} {'LPs/round':>9} {'CPU s':>7} {'LP s':>6}"
    )
    for _ in orders:
        head += f" | {'tenants':>7} {'order':>5} {'median ms':>10} {'p95 ms':>9} "
        head += f"{'LPs/round':>9} {'CPU s':>7} {'LP s':>6} {'ratio':>6} {'CPU ratio':>9}"
    print(head)
    for name in args.topologies:
        topo = make_topology(name)
        for n in args.coflows:
            res = run_cell(topo, n, args.rounds, args.warmup, tenants=args.tenants, orders=orders)
            cell = {"topology": name, "dcs": len(topo.dcs), "coflows": n}
            cell.update(_summary(res, ""))
            line = (
                f"{name:<10} {cell['dcs']:>4} {len(topo.capacity) // 2:>5} {n:>7} "
                f"{cell['round_ms_median']:>10.2f} {cell['round_ms_p95']:>9.2f} "
                f"{cell['lps_per_round']:>9.1f} {cell['cpu_s']:>7.2f} {cell['solver_s']:>6.2f}"
            )
            if orders:
                cell["tenants"] = args.tenants
            for order in orders:
                line += _tenant_columns(cell, res, args.tenants, order)
            cells.append(cell)
            print(line, flush=True)
    fit = fit_growth(cells)
    for n, slope in fit["per_dcs"].items():
        print(f"growth in DCs at N={n}: ms ~ DCs^{slope:.2f}")
    for t, slope in fit["per_coflows"].items():
        print(f"growth in N on {t}: ms ~ N^{slope:.2f}")
    load = list(os.getloadavg())
    print("load average: " + " ".join(f"{x:.2f}" for x in load))
    if args.json:
        args.json.write_text(json.dumps({"cells": cells, "fit": fit, "loadavg": load}, indent=1))
    return 0


def _tenant_columns(cell: dict, res: dict, tenants: int, order: str) -> str:
    """Add the tenants' run with Γ order `order` to `cell` (its summary under
    tenant_key(order), "ratio"/"cpu_ratio" + the order's suffix: tenants / Terra of the
    median ms and of the CPU seconds) and return its columns of the printed line."""
    key = tenant_key(order)
    suffix = key.removeprefix("tenant")[:-1]  # "" or "_share"
    cell.update(_summary(res, key))
    ratio = cell[f"ratio{suffix}"] = cell[key + "round_ms_median"] / cell["round_ms_median"]
    cpu = cell[f"cpu_ratio{suffix}"] = cell[key + "cpu_s"] / max(cell["cpu_s"], 1e-9)
    return (
        f" | {tenants:>7} {order:>5} {cell[key + 'round_ms_median']:>10.2f} "
        f"{cell[key + 'round_ms_p95']:>9.2f} {cell[key + 'lps_per_round']:>9.1f} "
        f"{cell[key + 'cpu_s']:>7.2f} {cell[key + 'solver_s']:>6.2f} {ratio:>6.2f} {cpu:>9.2f}"
    )


def _summary(res: dict, key: str) -> dict:
    """Median / p95 ms, mean LPs per round, CPU s and solver s of one run of `run_cell`'s result,
    keys prefixed by `key` ("" for Terra, tenant_key(order) for a tenants' run)."""
    return {
        key + "round_ms_median": float(np.median(res[key + "round_ms"])),
        key + "round_ms_p95": float(np.quantile(res[key + "round_ms"], 0.95)),
        key + "lps_per_round": float(np.mean(res[key + "lps"])),
        key + "cpu_s": res[key + "cpu_s"],
        key + "solver_s": res[key + "solver_s"],
    }


if __name__ == "__main__":
    sys.exit(main())
