"""Guaranteed reservations under load and through a link failure (docs/design.md 4.5;
docs/results.md "Guaranteed reservations").

    uv run python benchmarks/reservations.py [--seconds 120] [--k 4] [--tenant-order ON]
        [--json OUT]

SWAN (every link 125e6 bytes/s). Three tenants from a tenants file (the controller's
format, read by terra-sim's --tenants path, terra_sim/tenants.tenant_weights):
  gold   weight 1, reservation HK->BA 50e6 B/s, ceiling 70e6 B/s;
  silver weight 1, reservation NY->LA 40e6 B/s in the window [20 s, 100 s), no ceiling;
  bulk   weight 8, no reservation: floods the WAN (a coflow every 2 s with 4 flows of
         0.5-1.5 GB on random DC pairs, seed 7: about 2 GB/s offered on a WAN whose DCs
         can send 1.75 GB/s in all).
gold sends a 2 GB coflow HK->BA every 20 s, silver a 1 GB coflow NY->LA every 15 s, so both
are backlogged on their reserved pairs. Link LA-NY fails at 40 s and comes back at 80 s (a
failure every reserved pair's tunnels route around).

Every round the simulator runs (terra_sim.simulate, TenantPolicy, cooperative sharing, the Γ
order inside the shares of --tenant-order, tenant_shares.ORDERS), for
each active reservation whose tenant has bytes on its pair: the rate its coflows got there
over the guaranteed rate (held: >= 0.98), and over its ceiling (<= 1). Prints the checks
(round x reservation), the smallest ratio with every link up and during the failure, the
largest ratio to the ceiling, the WAN utilization and each tenant's average CCT; the same
for the run without the reservations (what gold and silver get from their weights alone);
an admission refused with its reason; and the load average.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
import time
from pathlib import Path

from terra_core.reservations import Reservation, admission
from terra_core.tenant_policy import TenantPolicy, TenantSpec
from terra_core.tenant_shares import DEFAULT_ORDER, ORDERS
from terra_model import Coflow, Flow
from terra_sim.events import WanChange
from terra_sim.simulator import simulate
from terra_sim.tenants import per_tenant, tenant_weights
from topologies import load_topology

TENANTS = """sharing = "cooperative"

[tenants.gold]
weight = 1

[[tenants.gold.reservations]]
src = "HK"
dst = "BA"
rate_bytes_per_s = 50_000_000
ceil_bytes_per_s = 70_000_000

[tenants.silver]
weight = 1

[[tenants.silver.reservations]]
src = "NY"
dst = "LA"
rate_bytes_per_s = 40_000_000
start_s = 20
end_s = 100

[tenants.bulk]
weight = 8
"""
FAIL = ("LA", "NY", 40.0, 80.0)


def workload(seconds: float, dcs: list[str]) -> tuple[list[Coflow], dict[str, str]]:
    """The coflows and their tenants (module docstring)."""
    rng = random.Random(7)
    coflows, owner = [], {}
    for i in range(int(seconds / 2)):
        flows = []
        for j in range(4):
            src, dst = rng.sample(dcs, 2)
            flows.append(Flow(f"f{j}", src, dst, rng.uniform(0.5e9, 1.5e9)))
        coflows.append(Coflow(f"bulk{i}", 2.0 * i, flows))
        owner[f"bulk{i}"] = "bulk"
    for i in range(int(seconds / 20)):
        coflows.append(Coflow(f"gold{i}", 20.0 * i, [Flow("f", "HK", "BA", 2e9)]))
        owner[f"gold{i}"] = "gold"
    for i in range(int(seconds / 15)):
        coflows.append(Coflow(f"silver{i}", 15.0 * i, [Flow("f", "NY", "LA", 1e9)]))
        owner[f"silver{i}"] = "silver"
    coflows.sort(key=lambda c: c.arrival_s)
    return coflows, owner


class Probe:
    """Wraps a TenantPolicy; checks every round's rates against `checked` reservations."""

    def __init__(self, inner: TenantPolicy, checked: list[Reservation]) -> None:
        self.inner, self.checked = inner, checked
        self.rows: list[dict] = []

    group_rate_arrays = None  # (the simulator asks group_rates, which checks)

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def group_rates(self, now, volumes):
        rates = self.inner.group_rates(now, volumes)
        owner = self.inner.spec.tenant_of
        failed = FAIL[2] <= now < FAIL[3]
        for r in self.checked:
            mine = [c for c, v in volumes.items() if owner[c] == r.tenant and v.get(r.pair)]
            if not r.active(now) or not mine:
                continue
            got = sum(x for c in mine for _, x in rates.get(c, {}).get(r.pair, ()))
            self.rows.append({"t": now, "tenant": r.tenant, "failed": failed,
                              "ratio": got / r.rate,
                              "ceil_ratio": got / r.ceil if r.ceil else None})  # fmt: skip
        return rates


def run(
    seconds: float, k: int, reserved: bool, order: str = DEFAULT_ORDER
) -> tuple[Probe, float, dict]:
    """One simulation (`order`: the Γ order inside the shares); returns the probe, its wall
    time (seconds) and {"wan_utilization", "avg_cct_s": {tenant: seconds}}."""
    topology = load_topology("swan")
    weights, reservations = tenant_weights_from_text(topology, k)
    coflows, owner = workload(seconds, topology.dcs)
    held = tuple(reservations) if reserved else ()
    spec = TenantSpec(weights, owner, "cooperative", held, order)
    probe = Probe(TenantPolicy(topology, spec, k=k), reservations)
    a, b, down, up = FAIL
    changes = [WanChange(down, a, b, up=False), WanChange(up, a, b, up=True)]
    start = time.perf_counter()
    res = simulate(probe, coflows, changes)
    wall = time.perf_counter() - start
    cct = {t: round(v["avg_cct_s"], 2) for t, v in per_tenant(res, owner).items()}
    return probe, wall, {"wan_utilization": round(res.wan_utilization, 3), "avg_cct_s": cct}


def summary(probe: Probe) -> dict:
    """{"rounds", "min_ratio_up", "min_ratio_failed", "max_ceil_ratio", per tenant mins}."""
    rows = probe.rows
    up = [r["ratio"] for r in rows if not r["failed"]]
    down = [r["ratio"] for r in rows if r["failed"]]
    ceil = [r["ceil_ratio"] for r in rows if r["ceil_ratio"] is not None]
    per = {}
    for t in sorted({r["tenant"] for r in rows}):
        per[t] = min(r["ratio"] for r in rows if r["tenant"] == t)
    return {"checks": len(rows), "failed_checks": len(down), "min_ratio_up": min(up, default=None),
            "min_ratio_failed": min(down, default=None),
            "max_ceil_ratio": max(ceil, default=None), "min_ratio_per_tenant": per}  # fmt: skip


def main(argv=None) -> int:
    """Run with and without the reservations; print the figures (module docstring)."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seconds", type=float, default=120.0, help="arrivals for this long")
    p.add_argument("--k", type=int, default=4)
    p.add_argument("--tenant-order", choices=ORDERS, default=DEFAULT_ORDER)
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args(argv)
    out: dict[str, object] = {}
    held: dict = {}
    for reserved in (True, False):
        probe, wall, figures = run(args.seconds, args.k, reserved, args.tenant_order)
        got = summary(probe) | figures | {"wall_s": round(wall, 1)}
        out["reserved" if reserved else "weights_only"] = got
        held = got if reserved else held
        print(("with reservations: " if reserved else "weights only:      ") + json.dumps(got))
    ok = min(held["min_ratio_up"], held["min_ratio_failed"]) >= 0.98
    print(f"guarantees held within 2 % in every round: {ok} "
          f"(ceiling kept: {held['max_ceil_ratio'] <= 1 + 1e-9})")  # fmt: skip
    extra = Reservation("bulk", "HK", "BA", 100e6)
    swan = load_topology("swan")
    _, reservations = tenant_weights_from_text(swan, args.k)
    refused = admission([*reservations, extra], swan, args.k)
    out["refused"] = refused.reason
    print(f"request {extra.describe()}: admitted {refused.ok}; {refused.reason}")
    load = os.getloadavg()
    print(f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}; cpus {os.cpu_count()}")
    if args.json:
        args.json.write_text(json.dumps(out | {"argv": sys.argv[1:]}, indent=1))
    return 0 if ok else 1


def tenant_weights_from_text(topology, k: int):
    """tenant_weights of TENANTS (written to a temporary file)."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "tenants.toml"
        path.write_text(TENANTS)
        return tenant_weights(str(path), topology, k)


if __name__ == "__main__":
    sys.exit(main())
