"""How much a lying tenant can gain from Step A's shares (docs/design.md 4.5,
"Strategy-proof").

    uv run python benchmarks/tenant_lies.py [--instances 2000] [--seed 1] [--k 1 3]

Random 4-DC WANs (each directed link present with probability 1/2 at 1-10 B/s, plus a
ring at 1 B/s so every pair is connected), 2-3 tenants with 1-3 DC pairs of 1-100 bytes
and weights 1-4. Tenant t0 lies: on 1-3 pairs its claim becomes its true bytes times 1, 2
or 10 plus 0-100 bytes (an inflated FlowGroup or a dummy one). Under strict isolation a
tenant gets its share and nothing more, so what the lie gains is the progress its true
volumes can make on the share it got by lying over the progress on its truthful share
(Optimization (1) of the true volumes on each share). The same lies are also measured on
pair shares: the tenant held to Step A's total rate per DC pair (its progress the minimum
over its true pairs of that rate x Γ_t / true bytes). For every K given, prints the largest
gain over the instances (1.0: no lie helped), how many lies gained more than 1e-6, and the
worst instance, for link shares and for pair shares.
"""

from __future__ import annotations

import argparse
import math
import os

import numpy as np

from terra_core.min_cct import min_cct
from terra_core.tenant_shares import isolation_shares
from topologies import Topology, all_pairs_paths

DCS = ("A", "B", "C", "D")
PAIRS = [(u, v) for u in DCS for v in DCS if u != v]


def random_case(rng: np.random.Generator):
    """One WAN, the tenants' true volumes and weights, and t0's lie (module docstring)."""
    links = {(u, v): float(rng.integers(1, 11)) for u, v in PAIRS if rng.random() < 0.5}
    for i, u in enumerate(DCS):
        links.setdefault((u, DCS[(i + 1) % 4]), 1.0)
    vol = {}
    for t in range(int(rng.integers(2, 4))):
        chosen = rng.choice(len(PAIRS), size=int(rng.integers(1, 4)), replace=False)
        vol[f"t{t}"] = {PAIRS[i]: float(rng.integers(1, 101)) for i in chosen}
    weights = {t: float(rng.integers(1, 5)) for t in vol}
    lie = dict(vol["t0"])
    for i in rng.choice(len(PAIRS), size=int(rng.integers(1, 4)), replace=False):
        k = PAIRS[i]
        lie[k] = lie.get(k, 0.0) * float(rng.choice([1.0, 2.0, 10.0])) + float(rng.integers(0, 101))
    return Topology("random", list(DCS), links), vol, weights, lie


def gain(topo: Topology, vol, weights, lie, k: int) -> tuple[float, float]:
    """t0's progress when lying over its progress when truthful, on its link share and
    held to its pair rates ((1.0, 1.0) when t0 takes no part)."""
    paths, cap = all_pairs_paths(topo, k), dict(topo.capacity)
    truth = isolation_shares(vol, weights, paths, cap)
    if "t0" not in truth.share:
        return 1.0, 1.0
    lied = isolation_shares({**vol, "t0": lie}, weights, paths, cap)
    real = vol["t0"]

    def on(share) -> float:
        res = min_cct(real, paths, share, fewest_link_bytes=False)
        return truth.solo_gamma["t0"] / res.gamma_s if res.gamma_s > 0 else math.inf

    def held(found) -> float:
        rates = found.rates.get("t0", {})
        g = truth.solo_gamma["t0"]
        return min(sum(x for _, x in rates.get(k, ())) * g / d for k, d in real.items())

    return on(lied.share["t0"]) / on(truth.share["t0"]), held(lied) / held(truth)


def main() -> None:
    """Parse the arguments, run the instances for each K, print the figures."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--instances", type=int, default=2000)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--k", type=int, nargs="+", default=[1, 3])
    args = ap.parse_args()
    cases = [random_case(np.random.default_rng([args.seed, i])) for i in range(args.instances)]
    for k in args.k:
        both = [gain(*case, k) for case in cases]
        for col, what in enumerate(("link shares", "pair shares")):
            gains = [g[col] for g in both]
            worst = int(np.argmax(gains))
            topo, vol, weights, lie = cases[worst]
            print(
                f"K={k}, {what}: largest gain {gains[worst]:.6f} over {len(cases)} lies, "
                f"{sum(g > 1 + 1e-6 for g in gains)} gained more than 1e-6; worst: "
                f"links {dict(topo.capacity)} volumes {vol} weights {weights} lie {lie}"
            )
    print(f"load average {os.getloadavg()}")


if __name__ == "__main__":
    main()
