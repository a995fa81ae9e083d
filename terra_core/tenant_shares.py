"""How the WAN is divided among tenants in a round (docs/design.md section 4.5).

Step A, the isolation guarantee over tunnels (HUG, Chowdhury et al., NSDI 2016, section 3,
with the tenant's correlation vector chosen by routing instead of fixed paths; DRF and
DRFH are its single-path special cases). For the tenants t with active coflows, weights
w_t and weight shares s_t = w_t / Σ_u w_u, FlowGroup volumes d_{t,k} (bytes, summed over
t's active coflows per DC pair k), paths P_k (at most K per pair) and link capacities c_e
(bytes/s):

    Γ_t   = Optimization (1) of t's volumes alone on c (seconds; section 4.1)
    maximize    μ
    subject to  Σ_{p ∈ P_k} x_{t,k,p} = μ · s_t · d_{t,k} / Γ_t      for every tenant t, pair k
                Σ_{(t,k,p) : e ∈ p} x_{t,k,p} ≤ c_e                   for every link e
                x_{t,k,p} ≥ 0

A tenant's *progress* under rates r_{t,k} (bytes/s per FlowGroup) is
P_t = min_k r_{t,k} · Γ_t / d_{t,k}: the fraction of its best rate alone on the WAN that
every one of its FlowGroups gets (with one fixed path per pair and t's bottleneck links
this is HUG's min_i a_t^i / d_t^i with d_t normalized to its bottleneck). Its *weighted
progress* is P_t / s_t, and the *isolation guarantee* is min_t P_t / s_t. The LP gives
every tenant P_t = μ*·s_t, so μ* is the optimal isolation guarantee (no allocation gives
every tenant more: at a larger μ the constraints fail). A static partition (s_t·c_e of
every link to t) reaches P_t = s_t, so μ* ≥ 1.

The LP is Optimization (1) of one coflow whose FlowGroup on pair k has volume
V_k = Σ_t s_t·d_{t,k}/Γ_t: tenants on one pair share its paths, and any split of the
pair's per-path rates in proportion s_t·d_{t,k}/Γ_t / V_k is a solution of the LP above
(and the other way round by summing), so it is solved by min_cct.min_cct (HiGHS; the
second stage picks the solution with the fewest link-bytes, leaving the most to step B).

Step B: tenant t's *share* of link e is the load its Step A rates put on e. Terra's round
runs inside each share (tenant_policy.py); what the tenants leave unused is given out by
`leftover_rates` (cooperative work conservation) or not at all (strict isolation).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from terra_core.min_cct import Pair, PairRates, links_of, min_cct
from terra_core.path_masks import IndexCache, index_for
from terra_core.round_fair_share import fair_share
from terra_core.round_rates import RoundResult
from topologies import Link, Path

_EMPTY = 1e-9  # relative: spare capacity below this fraction of a link counts as none

SHARINGS = ("cooperative", "strict", "static")
"""How a round divides the WAN among tenants (docs/design.md 4.5):
cooperative: Step A shares, Terra in each, the leftover to every tenant that can use it
(HUG's cooperative work conservation; the default);
strict: Step A shares only, each tenant also held to its Step A rate per pair, nothing
redistributed (strict isolation; strategy-proof, tenant_policy.hold_to_pairs);
static: w_t / Σ w (over every tenant, active or not) of every link, nothing redistributed
(the baseline static partition; not work-conserving)."""
DEFAULT_SHARING = "cooperative"

ORDERS = ("share", "wan")
"""How each tenant's Terra orders its coflows inside its share (docs/design.md 4.5; step 3
of scheduling_round): by Γ, the coflow's minimum CCT alone (Optimization (1)),
share: on the tenant's share of the round (one LP per coflow and round: the share moves
every round);
wan: on the whole WAN's capacities (links up), the Γ plain Terra orders by, kept between
rounds (TerraPolicy's Γ cache; the default). Either way steps 1, 2 and 4-6 run on the
share."""
DEFAULT_ORDER = "wan"


@dataclass
class TenantShares:
    """What Step A decided for one round.

    Attributes:
        guarantee: μ*, the optimal isolation guarantee (dimensionless; min over tenants
            of weighted progress; 0 when no tenant can move, inf when no tenant has WAN
            bytes).
        solo_gamma: {tenant: Γ_t in seconds} (Optimization (1) alone on the WAN).
        weight_share: {tenant: s_t}.
        rates: {tenant: {pair: [(path, bytes/s)]}}: Step A's allocation (FlowGroup k of t
            gets μ*·s_t·d_{t,k}/Γ_t bytes/s in all).
        share: {tenant: {link: bytes/s}} for every link of the capacity, in its order (0
            where the tenant takes nothing).
        lps: LPs solved.
    """

    guarantee: float = math.inf
    solo_gamma: dict[str, float] = field(default_factory=dict)
    weight_share: dict[str, float] = field(default_factory=dict)
    rates: dict[str, PairRates] = field(default_factory=dict)
    share: dict[str, dict[Link, float]] = field(default_factory=dict)
    lps: int = 0


def isolation_shares(
    volumes: dict[str, dict[Pair, float]],
    weights: dict[str, float],
    paths: dict[Pair, list[Path]],
    capacity: dict[Link, float],
) -> TenantShares:
    """Step A: the allocation with the optimal isolation guarantee over K tunnels.

    Args:
        volumes: {tenant: {(src DC, dst DC): bytes > 0}}: each tenant's active coflows'
            FlowGroup volumes summed per DC pair (pairs with no bytes are ignored).
        weights: {tenant: weight > 0} (at least the tenants of `volumes`).
        paths: {pair: [path, ...]} (at least the pairs of `volumes`).
        capacity: {link: bytes/s}.

    Returns:
        TenantShares (module docstring: the LP and what each field means). A tenant
        whose Γ_t is inf (a pair with no usable path) or 0 (no WAN bytes) takes no part
        and gets no share.

    Raises:
        ValueError: a weight that is not positive, a tenant without a weight, or a pair
            missing from `paths` (from min_cct).
    """
    out = TenantShares()
    movable: dict[str, dict[Pair, float]] = {}
    for tenant, vol in volumes.items():
        w = weights.get(tenant)
        if w is None or not w > 0:
            raise ValueError(f"tenant {tenant!r}: weight must be > 0, got {w!r}")
        vol = {pair: v for pair, v in vol.items() if v > 0 and pair[0] != pair[1]}
        res = min_cct(vol, paths, capacity, fewest_link_bytes=False)
        out.lps += res.lp_solved
        out.solo_gamma[tenant] = res.gamma_s
        if vol and 0 < res.gamma_s < math.inf:
            movable[tenant] = vol
    total_w = sum(weights[t] for t in movable)
    merged: dict[Pair, float] = {}
    part: dict[tuple[str, Pair], float] = {}
    v: float | None  # a tenant's part of a pair's volume (bytes), then of its rates
    for tenant, vol in movable.items():
        s = out.weight_share[tenant] = weights[tenant] / total_w
        for pair, d in vol.items():
            v = part[(tenant, pair)] = s * d / out.solo_gamma[tenant]
            merged[pair] = merged.get(pair, 0.0) + v
    empty = dict.fromkeys(capacity, 0.0)
    out.share = {t: dict(empty) for t in movable}
    if not merged:
        return out
    res = min_cct(merged, paths, capacity)
    out.lps += res.lp_solved
    out.guarantee = 1.0 / res.gamma_s if res.gamma_s > 0 else math.inf
    for pair, lst in res.rates.items():
        for tenant in movable:
            v = part.get((tenant, pair))
            if v:
                mine = [(path, x * v / merged[pair]) for path, x in lst]
                out.rates.setdefault(tenant, {})[pair] = mine
                add_load(out.share[tenant], mine)
    return out


def static_shares(
    tenants: list[str], weights: dict[str, float], capacity: dict[Link, float]
) -> dict[str, dict[Link, float]]:
    """The static partition: {tenant: {link: s_t·c_e}} with s_t = w_t / Σ_{u in tenants} w_u.

    Raises:
        ValueError: a weight that is not positive.
    """
    for t in tenants:
        if not weights.get(t, 0) > 0:
            raise ValueError(f"tenant {t!r}: weight must be > 0, got {weights.get(t)!r}")
    total = sum(weights[t] for t in tenants)
    return {t: {e: c * weights[t] / total for e, c in capacity.items()} for t in tenants}


def add_load(load: dict[Link, float], pair_rates: list[tuple[Path, float]]) -> None:
    """Add the per-path rates [(path, bytes/s)] to `load` ({link: bytes/s}) in place."""
    for path, x in pair_rates:
        for link in links_of(path):
            load[link] = load.get(link, 0.0) + x


def spare_capacity(
    capacity: dict[Link, float], rates: list[dict[str, PairRates]]
) -> dict[Link, float]:
    """{link: capacity − load} (≥ 0, in `capacity`'s order) after every allocation of
    `rates` ({coflow or tenant: {pair: [(path, bytes/s)]}} dicts)."""
    load: dict[Link, float] = {}
    for per in rates:
        for pair_rates in per.values():
            for lst in pair_rates.values():
                add_load(load, lst)
    return {e: max(0.0, c - load.get(e, 0.0)) for e, c in capacity.items()}


def leftover_rates(
    weights: dict[str, dict[Pair, float]],
    paths: dict[Pair, list[Path]],
    spare: dict[Link, float],
    capacity: dict[Link, float],
    index_cache: IndexCache | None = None,
) -> dict[str, PairRates]:
    """Cooperative work conservation: the spare capacity, max-min fair over every tenant's
    FlowGroups weighted by their Step A rates.

    Each (tenant, pair) is one commodity over the pair's paths, raised as weight·t
    (progressive filling continues to raise every tenant's progress together until a
    FlowGroup is blocked; the others keep growing), so a commodity stops only when every
    path it has crosses a full link: no link stays idle while a FlowGroup with a path over
    it could use it. The max-min MCF (mcf.py) while small, path-level progressive filling
    beyond (round_fair_share.fair_share).

    Args:
        weights: {tenant: {pair: weight > 0}} (e.g. Step A's bytes/s per FlowGroup).
        paths: {pair: [path, ...]}.
        spare: {link: bytes/s} unused; reduced in place by what is given out.
        capacity: {link: bytes/s} (to tell full links: spare ≤ 1e-9 of capacity).
        index_cache: optional path_masks.IndexCache the caller keeps between rounds and
            replaces when paths change: the path masks of every (tenant, pair) over the
            links of `spare`, built once instead of every round.

    Returns:
        {tenant: {pair: [(path, bytes/s)]}} (only positive rates).
    """
    for link, left in spare.items():
        if left <= _EMPTY * capacity.get(link, 0.0):
            spare[link] = 0.0
    keyed = {(t, pair): w for t, per in weights.items() for pair, w in per.items() if w > 0}
    if not keyed:
        return {}
    key_paths = {key: paths[key[1]] for key in keyed}
    index = index_for(index_cache, spare)
    got = fair_share(keyed, key_paths, spare, capacity, RoundResult(), index)
    out: dict[str, PairRates] = {}
    for (tenant, pair), lst in got.items():
        lst = [(p, x) for p, x in lst if x > 0]
        if lst:
            out.setdefault(tenant, {})[pair] = lst
    return out


def progress(
    rates: dict[str, dict[Pair, float]],
    volumes: dict[str, dict[Pair, float]],
    solo_gamma: dict[str, float],
) -> dict[str, float]:
    """Each tenant's progress P_t = min_k r_{t,k}·Γ_t / d_{t,k} (module docstring).

    Args:
        rates: {tenant: {pair: bytes/s in all}}.
        volumes: {tenant: {pair: bytes > 0}}.
        solo_gamma: {tenant: Γ_t seconds}.

    Returns:
        {tenant: P_t} for the tenants of `volumes` with a finite positive Γ_t.
    """
    out = {}
    for t, vol in volumes.items():
        g = solo_gamma.get(t, math.inf)
        if 0 < g < math.inf:
            out[t] = min(rates.get(t, {}).get(k, 0.0) * g / d for k, d in vol.items() if d > 0)
    return out


def allocation_progress(
    volumes: dict[Pair, float],
    paths: dict[Pair, list[Path]],
    given: dict[Link, float],
    solo_gamma: float,
) -> float:
    """The progress a tenant's volumes can make on the capacity `given` to it: Γ_t / Γ of
    its volumes on `given` ({link: bytes/s}), i.e. the largest P with P·d_{t,k}/Γ_t bytes/s
    for every FlowGroup routable over its K paths inside `given` (Optimization (1));
    0 when some FlowGroup has no path with capacity there, inf when it has no bytes."""
    res = min_cct(volumes, paths, given, fewest_link_bytes=False)
    if res.gamma_s == 0:
        return math.inf
    return solo_gamma / res.gamma_s
