"""Terra with tenants: the WAN divided among tenants, Terra inside each share (docs/design.md
section 4.5) as a Policy.

Each round: the active coflows are grouped by tenant; with one tenant active the round is
that tenant's Terra round on the whole WAN, unchanged (the tenant layer is a no-op, so the
rates are Terra's to the bit). With more: Step A (tenant_shares.isolation_shares) gives
every tenant a per-link share with the optimal isolation guarantee over K tunnels; each
tenant's own TerraPolicy runs its round (α guard, Γ order, preemption, work
conservation) on its share, the Γ order on the share or on the whole WAN (the
spec's `order`, tenant_shares.ORDERS); then, with the cooperative sharing (the default), the
capacity still unused is given out max-min over every tenant's FlowGroups weighted by
their Step A rates (tenant_shares.leftover_rates), each (tenant, pair) rate to the tenant's
coflow on that pair that Terra gave the most rate (ties: arrival order). Admitted deadline
coflows are guarantees across tenants: the rates that end them at their deadlines (Terra's
step 1, earliest deadline first over every tenant) come before Step A, which divides the
rest among the tenants' other coflows. Deadline admission places a coflow among every
tenant's admitted deadline coflows, so what is admitted ends in time; flows added to one
end its guarantee (it is then served inside its tenant's share).

With guaranteed reservations (reservations.py) active in a round: every tenant with bytes
on a reserved pair first gets its guaranteed rate there (over the pair's tunnels, on the
links up), the round above runs on what is left, the guaranteed rate is added to the
tenant's first coflow with bytes on the pair in the order the tenant's Terra served this
round (TerraPolicy.round_order: deadline coflows, the starving coflow, then smallest Γ
first, so a small coflow is not stuck behind the tenant's big one), and a tenant's rate on
a pair with a ceiling is capped at it (borrowing up to the ceiling). A coflow whose
FlowGroup is smaller than the guarantee carries finishes it sooner; its FlowGroup ending
asks for a round (controller) or is one (simulator), and the next round gives the
guarantee to the next coflow in that order. Deadline admission counts every guarantee
overlapping the deadline's window as taken (the tenant's own too), then every tenant's
admitted deadline coflows.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar, Unpack

from terra_core.min_cct import Pair, PairRates, links_of
from terra_core.path_masks import IndexCache
from terra_core.policy import Allocation, PolicyState, Remaining
from terra_core.reservations import Reservation, cap_ceilings, floors, held_load
from terra_core.round_rates import RoundResult
from terra_core.scheduling_round import reserve_deadlines
from terra_core.tenant_shares import (
    DEFAULT_ORDER,
    DEFAULT_SHARING,
    ORDERS,
    SHARINGS,
    TenantShares,
    add_load,
    allocation_progress,
    isolation_shares,
    leftover_rates,
    progress,
    spare_capacity,
    static_shares,
)
from terra_core.terra_policy import (
    AdmissionView,
    RoundStats,
    TerraOptions,
    TerraPolicy,
    allocate_by_groups,
)
from terra_model import Coflow, Flow
from topologies import Link, Path, Topology

ByTenant = dict[str, dict[str, dict[Pair, float]]]  # {tenant: {coflow id: {pair: bytes}}}
T = TypeVar("T")
_DATED = "\x00"  # leftover_rates' key prefix of a deadline coflow (no tenant name has it)


class TenantStats(RoundStats):
    """TenantPolicy's `stats`: Terra's, with each measured round's Step A guarantee μ* and
    the isolation guarantee achieved (`_record`)."""

    guarantee: list[float]
    achieved: list[float]


@dataclass(frozen=True)
class TenantSpec:
    """The tenants of a run and who owns which coflow.

    Attributes:
        weights: {tenant name: weight > 0}, in a fixed order.
        tenant_of: {coflow id: tenant name} (every coflow the policy will see).
        sharing: one of tenant_shares.SHARINGS ("cooperative", the default; "strict";
            "static").
        reservations: the admitted guarantees (reservations.Reservation; admission is the
            caller's: reservations.admission).
        order: what each tenant's Γ order runs on, one of tenant_shares.ORDERS ("wan",
            the default: Γ on the whole WAN, cached; "share": Γ on the tenant's share).

    Raises:
        ValueError: no tenant, a weight that is not a positive finite number, an unknown
            sharing or order, or a coflow or reservation of a tenant without a weight.
    """

    weights: dict[str, float]
    tenant_of: dict[str, str] = field(default_factory=dict)
    sharing: str = DEFAULT_SHARING
    reservations: tuple[Reservation, ...] = ()
    order: str = DEFAULT_ORDER

    def __post_init__(self) -> None:
        if not self.weights:
            raise ValueError("tenants: at least one tenant is needed")
        for name, w in self.weights.items():
            if isinstance(w, bool) or not isinstance(w, int | float) or not 0 < w < math.inf:
                raise ValueError(f"tenant {name!r}: weight must be a positive number, got {w!r}")
        if self.sharing not in SHARINGS:
            raise ValueError(f"tenant sharing must be one of {', '.join(SHARINGS)}")
        if self.order not in ORDERS:
            raise ValueError(f"tenant order must be one of {', '.join(ORDERS)}, got {self.order!r}")
        unknown = set(self.tenant_of.values()) - self.weights.keys()
        if unknown:
            raise ValueError(f"coflows assigned to tenants without a weight: {sorted(unknown)}")
        unknown = {r.tenant for r in self.reservations} - self.weights.keys()
        if unknown:
            raise ValueError(f"reservations of tenants without a weight: {sorted(unknown)}")


class TenantPolicy:
    """Terra inside per-tenant shares of the WAN (module docstring) implementing Policy.

    Args:
        topology: the shared WAN view (the caller mutates it, then calls wan_changed).
        spec: TenantSpec.
        measure: record the isolation guarantee of every multi-tenant round in `stats`
            (one more LP per tenant and round; with the static sharing also Step A's).
        **terra: TerraPolicy's keyword arguments (k, alpha, epsilon, delta, path_source,
            guard, guard_factor, guard_floor_s), the same for every tenant.

    Attributes:
        name: "terra".
        stats: {"rounds", "round_ms", "lps"} as TerraPolicy's, over all tenants, and
            "guarantee" / "achieved": per multi-tenant round, Step A's optimal isolation
            guarantee μ* and the one reached: min over tenants of the weighted progress
            the capacity given to the tenant allows (docs/design.md 4.5; with `measure`).
        progress: {tenant: that weighted progress P_t/s_t} of the last measured round
            (empty before one).

    Raises:
        ValueError: a TerraPolicy argument out of range.
    """

    name = "terra"

    def __init__(
        self,
        topology: Topology,
        spec: TenantSpec,
        measure: bool = False,
        **terra: Unpack[TerraOptions],
    ) -> None:
        self.topology = topology
        self.measure = measure
        self.spec = spec
        self._terra = terra
        self._policies = {t: TerraPolicy(topology, **terra) for t in spec.weights}
        self._first = next(iter(self._policies.values()))
        self._tenant: dict[str, str] = {}
        self._rank: dict[str, int] = {}  # deadline coflows' admission order, all tenants
        self._ranks = itertools.count()
        self._index = IndexCache()  # leftover_rates' path masks, new when the WAN changes
        self.stats: TenantStats = {
            "rounds": 0,
            "round_ms": [],
            "lps": 0,
            "guarantee": [],
            "achieved": [],
        }
        self.progress: dict[str, float] = {}

    # ----- Policy protocol -------------------------------------------------------------

    def add_coflow(self, coflow: Coflow, now: float) -> bool:
        """Register `coflow` with its tenant's Terra (deadline admission there).

        Raises:
            ValueError: a coflow with no tenant in the spec, or as TerraPolicy.add_coflow.
        """
        tenant = self.spec.tenant_of.get(coflow.id)
        if tenant is None:
            raise ValueError(f"coflow {coflow.id!r} has no tenant")
        policy = self._policies[tenant]
        if coflow.deadline_s is not None:
            deadline = coflow.arrival_s + coflow.deadline_s
            if not self._within_ceilings(tenant, coflow, now, deadline):
                return False
            policy.admission = AdmissionView(
                self._held(now, deadline),
                self._gather(lambda p: p.admitted_deadlines(now), exclude=tenant),
                self._gather(TerraPolicy.pins, exclude=tenant),
                self._rank,
            )
        try:
            ok = policy.add_coflow(coflow, now)
        finally:
            policy.admission = AdmissionView()
        if ok:
            self._tenant[coflow.id] = tenant
            if coflow.deadline_s is not None:
                self._rank[coflow.id] = next(self._ranks)
        return ok

    def add_flows(self, coflow_id: str, flows: list[Flow], now: float) -> None:
        """As TerraPolicy.add_flows; flows added to an admitted deadline coflow end its
        guarantee (it was admitted for its bytes then): from then on it is an ordinary
        coflow of its tenant (TerraPolicy.drop_deadline). Raises KeyError for an unknown
        coflow id."""
        self._owner(coflow_id).add_flows(coflow_id, flows, now)

    def remove_coflow(self, coflow_id: str, now: float) -> None:
        """Forget a finished or cancelled coflow; unknown ids are ignored."""
        self._rank.pop(coflow_id, None)
        tenant = self._tenant.pop(coflow_id, None)
        if tenant is not None:
            self._policies[tenant].remove_coflow(coflow_id, now)

    def wan_changed(self, now: float) -> bool:
        """Tell every tenant's Terra; True when any of them wants a new allocation."""
        changed = any([p.wan_changed(now) for p in self._policies.values()])
        if changed:
            self._index = IndexCache()
        return changed

    def allocate(self, now: float, remaining: Remaining) -> Allocation:
        """Rates per flow (policy.Policy.allocate): group_rates split by remaining bytes."""

        def pairs_of(cid: str) -> dict[str, Pair]:
            return self._owner(cid)._pairs_of(cid)

        return allocate_by_groups(remaining, pairs_of, lambda v: self.group_rates(now, v))

    def group_rates(
        self, now: float, volumes: dict[str, dict[Pair, float]]
    ) -> dict[str, PairRates]:
        """Per-FlowGroup rates of one round (as TerraPolicy.group_rates; module docstring).

        Raises:
            KeyError: an unknown coflow id.  ValueError: as TerraPolicy.group_rates.
        """
        start = time.perf_counter()
        by_tenant: ByTenant = {}
        for cid, vol in volumes.items():
            by_tenant.setdefault(self._tenant_of(cid), {})[cid] = vol
        floor = self._floors(now, by_tenant)
        if floor:
            rates = self._reserved_round(now, by_tenant, floor)
        elif len(by_tenant) == 1 and self.spec.sharing != "static":
            ((tenant, vols),) = by_tenant.items()
            rates = self._policies[tenant].group_rates(now, vols)
        else:
            rates = self._tenant_round(now, by_tenant)
        for t, vols in by_tenant.items():
            self._policies[t].served(now, {cid: rates.get(cid, {}) for cid in vols})
        self.stats["rounds"] += 1
        self.stats["lps"] = sum(p.stats["lps"] for p in self._policies.values())
        self.stats["round_ms"].append((time.perf_counter() - start) * 1000.0)
        return rates

    def set_weights(self, weights: dict[str, float]) -> None:
        """Change the tenants and their weights from the next round on: a new tenant gets
        its own Terra, a tenant left out is dropped (docs/design.md 4.5).

        Raises:
            ValueError: as TenantSpec, or a tenant left out still has coflows; nothing
                changed then.
        """
        spec = dataclasses.replace(self.spec, weights=dict(weights))
        busy = sorted({t for t in self._tenant.values() if t not in spec.weights})
        if busy:
            raise ValueError(f"tenants with active coflows cannot be dropped: {busy}")
        policies = {
            t: self._policies.get(t) or TerraPolicy(self.topology, **self._terra)
            for t in spec.weights
        }
        lps = sum(p.stats["lps"] for p in self._policies.values())
        self.spec, self._policies = spec, policies
        self._first = next(iter(policies.values()))
        self._first.stats["lps"] += lps - sum(p.stats["lps"] for p in policies.values())

    def set_reservations(self, reservations: list[Reservation]) -> None:
        """Take these (admitted) guarantees from the next round on.

        Raises:
            ValueError: a reservation of a tenant without a weight; nothing changed then.
        """
        self.spec = dataclasses.replace(self.spec, reservations=tuple(reservations))

    # ----- extras, as TerraPolicy's ----------------------------------------------------

    def next_wakeup(self, now: float) -> float | None:
        """The earliest wakeup any tenant's Terra asks for, or the next start or end of a
        reservation's window (seconds, > now), or None."""
        times = [t for p in self._policies.values() if (t := p.next_wakeup(now)) is not None]
        for r in self.spec.reservations:
            times += [t for t in (r.start, r.end) if now < t < math.inf]
        return min(times, default=None)

    def starving(self, now: float) -> list[str]:
        """Ids of the starving coflows of every tenant (each tenant's oldest first)."""
        return [cid for p in self._policies.values() for cid in p.starving(now)]

    def gamma_empty(self, coflow: Coflow) -> float:
        """Γ of `coflow` alone on the empty WAN (TerraPolicy.gamma_empty), seconds."""
        return self._first.gamma_empty(coflow)

    def state(self, coflow_id: str) -> PolicyState:
        """The coflow's PolicyState in its tenant's Terra. Raises KeyError when unknown."""
        return self._owner(coflow_id).state(coflow_id)

    def paths(self, src: str, dst: str) -> list[Path]:
        """The pair's paths (TerraPolicy.paths)."""
        return self._first.paths(src, dst)

    # ----- internals -------------------------------------------------------------------

    def _tenant_of(self, cid: str) -> str:
        tenant = self._tenant.get(cid)
        if tenant is None:
            raise KeyError(f"allocate: unknown coflow {cid!r}")
        return tenant

    def _owner(self, cid: str) -> TerraPolicy:
        if cid not in self._tenant:
            raise KeyError(f"unknown coflow {cid!r}")
        return self._policies[self._tenant[cid]]

    def _floors(
        self, now: float, by_tenant: ByTenant
    ) -> dict[tuple[str, Pair], list[tuple[Path, float]]]:
        """The guaranteed rates of this round: {(tenant, pair): [(path, bytes/s)]} for the
        active reservations whose tenant has bytes on their pair (reservations.floors)."""
        targets: dict[tuple[str, Pair], float] = {}
        for r in self.spec.reservations:
            vols = by_tenant.get(r.tenant)
            if vols and r.active(now) and any(v.get(r.pair, 0) > 0 for v in vols.values()):
                targets[(r.tenant, r.pair)] = targets.get((r.tenant, r.pair), 0.0) + r.rate
        if not targets:
            return {}
        paths = {pair: self._first.paths(*pair) for _, pair in targets}
        return floors(targets, paths, self._first._capacity())

    def _reserved_round(
        self,
        now: float,
        by_tenant: ByTenant,
        floor: dict[tuple[str, Pair], list[tuple[Path, float]]],
    ) -> dict[str, PairRates]:
        """The guaranteed rates first, the tenants' round on what they leave, then each
        guaranteed rate added to the tenant's first coflow on the pair in its Terra order
        (`_first_on`) and the ceilings."""
        capacity = self._first._capacity()
        taken: dict[Link, float] = {}
        for lst in floor.values():
            add_load(taken, lst)
        left = {e: max(0.0, c - taken.get(e, 0.0)) for e, c in capacity.items()}
        if len(by_tenant) == 1 and self.spec.sharing != "static":
            ((tenant, vols),) = by_tenant.items()
            rates = self._policies[tenant].group_rates(now, vols, left, self.spec.order)
        else:
            rates = self._tenant_round(now, by_tenant, left)
        for (t, pair), lst in floor.items():
            _add_to(rates, self._first_on(t, pair, by_tenant[t]), pair, lst)
        ceilings: dict[tuple[str, Pair], float] = {}
        for r in self.spec.reservations:
            if r.ceil is not None and r.active(now):
                key = (r.tenant, r.pair)
                ceilings[key] = min(ceilings.get(key, r.ceil), r.ceil)
        owner = {cid: t for t, vols in by_tenant.items() for cid in vols}
        capped = cap_ceilings(rates, owner, ceilings, fixed=self._dated_ids(by_tenant))
        if capped is not rates and self.spec.sharing == "cooperative":
            self._lend_capped(capped, owner, ceilings, by_tenant, capacity)
        return _within(capped, capacity)

    def _first_on(self, tenant: str, pair: Pair, vols: dict[str, dict[Pair, float]]) -> str:
        """The coflow that takes the tenant's guaranteed rate on `pair`: its first coflow
        with bytes there in the order its Terra served them in this round
        (TerraPolicy.round_order: deadline coflows, starving ones, then smallest Γ on the
        tenant's capacity first; no extra LP); admission order for a coflow that round
        did not see (none when the tenant's round ran)."""
        for cid in self._policies[tenant].round_order():
            if vols.get(cid, {}).get(pair, 0) > 0:
                return cid
        return next(c for c, v in vols.items() if v.get(pair, 0) > 0)

    def _lend_capped(
        self,
        rates: dict[str, PairRates],
        owner: dict[str, str],
        ceilings: dict[tuple[str, Pair], float],
        by_tenant: ByTenant,
        capacity: dict[Link, float],
    ) -> None:
        """Give what the ceilings freed to the other FlowGroups (in place): max-min over
        the spare capacity, each (tenant, pair) without a ceiling weighted by its rate
        (tenant_shares.leftover_rates), as HTB lends a capped class's unused rate."""
        weights: dict[str, dict[Pair, float]] = {}
        for cid, per in rates.items():
            for pair, lst in per.items():
                t = owner[cid]
                if (t, pair) not in ceilings and (x := sum(r for _, r in lst)) > 0:
                    weights.setdefault(t, {})[pair] = weights.get(t, {}).get(pair, 0.0) + x
        paths = {pair: self._first.paths(*pair) for per in weights.values() for pair in per}
        extra = leftover_rates(weights, paths, spare_capacity(capacity, [rates]), capacity)
        _attribute(extra, by_tenant, rates)

    def _within_ceilings(self, tenant: str, coflow: Coflow, now: float, deadline: float) -> bool:
        """Whether the tenant's admitted deadline coflows and `coflow` need, together, at
        most the ceiling of each of its reserved pairs whose window overlaps [now,
        deadline] (each FlowGroup at volume / time left: the rates its floor gets)."""
        caps: dict[Pair, float] = {}
        for r in self.spec.reservations:
            if r.tenant == tenant and r.ceil is not None and r.overlaps(now, deadline):
                caps[r.pair] = min(caps.get(r.pair, r.ceil), r.ceil)
        if not caps or deadline <= now:
            return True
        need = {k: v / (deadline - now) for k, v in coflow.flowgroups().items() if k in caps}
        for vol, d in self._policies[tenant].admitted_deadlines(now).values():
            for k, v in vol.items():
                if k in caps and d > now:
                    need[k] = need.get(k, 0.0) + v / (d - now)
        return all(x <= caps[k] * (1 + 1e-9) for k, x in need.items())

    def _held(self, now: float, deadline: float) -> dict[Link, float]:
        """{link: bytes/s} a deadline admission counts as taken: every tenant's guarantees
        overlapping [now, deadline] (reservations.held_load; a round takes them before the
        deadline coflows' floors, so the tenant's own too)."""
        active = [r for r in self.spec.reservations if r.overlaps(now, max(deadline, now) + 1e-9)]
        if not active:
            return {}
        paths = {r.pair: self._first.paths(*r.pair) for r in active}
        return dict(held_load(active, paths, self._first._capacity()))

    def _gather(self, of: Callable[[TerraPolicy], dict[str, T]], exclude: str | None = None
                ) -> dict[str, T]:  # fmt: skip
        """`of(policy)` of every tenant's TerraPolicy but `exclude`'s, merged ({coflow id:
        ...}: its admitted deadline coflows, or their kept splits)."""
        out: dict[str, T] = {}
        for t, policy in self._policies.items():
            if t != exclude:
                out.update(of(policy))
        return out

    def _dated_ids(self, by_tenant: ByTenant) -> set[str]:
        """The admitted deadline coflows among this round's."""
        return {cid for t, vols in by_tenant.items()
                for cid in self._policies[t].admitted_deadlines().keys() & vols.keys()}  # fmt: skip

    def _deadline_floors(
        self,
        now: float,
        coflows: dict[str, tuple[dict[Pair, float], float]],
        left: dict[Link, float],
    ) -> dict[str, PairRates]:
        """Terra's step 1 across tenants: each of `coflows` ({coflow id: (volumes {pair:
        bytes}, absolute deadline s)}) gets the rates on `left` ({link: bytes/s}, reduced
        in place) that end it at its deadline (its min-CCT rates when late), earliest
        deadline first (scheduling_round.reserve_deadlines); {coflow id: {pair: [(path,
        bytes/s)]}}."""
        vols = {cid: vol for cid, (vol, _) in coflows.items()}
        acc: dict[str, dict[Pair, dict[Path, float]]] = {}
        result = RoundResult()
        deadlines = {cid: d for cid, (_, d) in coflows.items()}
        paths = self._first._paths_for(vols)
        pins = self._gather(TerraPolicy.pins)
        reserve_deadlines(vols, paths, left, now, deadlines, acc, result, pinned=pins)
        self._first.stats["lps"] += result.lps
        return {cid: {k: list(pp.items()) for k, pp in per.items()} for cid, per in acc.items()}

    def _round_floors(
        self, now: float, by_tenant: ByTenant, left: dict[Link, float]
    ) -> tuple[dict[str, PairRates], ByTenant]:
        """The floors of this round's admitted deadline coflows (`_deadline_floors` on
        `left`, reduced in place), and each tenant's other coflows: (floors, ByTenant)."""
        dated = {cid: (by_tenant[t][cid], d) for t in by_tenant
                 for cid, (_, d) in self._policies[t].admitted_deadlines().items()
                 if cid in by_tenant[t]}  # fmt: skip
        dated = {c: dated[c] for c in sorted(dated, key=self._rank.__getitem__)}
        floor = self._deadline_floors(now, dated, left) if dated else {}
        rest: ByTenant = {}
        for t, vols in by_tenant.items():
            rest[t] = {cid: v for cid, v in vols.items() if cid not in floor}
            self._policies[t].keep_volumes({c: vols[c] for c in vols.keys() & floor.keys()})
        return floor, rest

    def _tenant_round(
        self, now: float, by_tenant: ByTenant, capacity: dict[Link, float] | None = None
    ) -> dict[str, PairRates]:
        """The admitted deadline coflows' floors first (`_round_floors`: their rates), then
        Step A (or the static partition) on what they leave for the tenants' other
        coflows, Terra in each share, then the leftover, on `capacity` ({link: bytes/s};
        default: the WAN's links up)."""
        if capacity is None:
            capacity = self._first._capacity()
        left = dict(capacity)
        floor, rest = self._round_floors(now, by_tenant, left)
        paths: dict[Pair, list[Path]] = {}
        tenant_vol: dict[str, dict[Pair, float]] = {}
        for t, vols in by_tenant.items():
            paths.update(self._policies[t]._paths_for(vols))
            agg = tenant_vol[t] = {}
            for vol in rest[t].values():
                for pair, v in vol.items():
                    if v > 0:
                        agg[pair] = agg.get(pair, 0.0) + v
        found = None
        if self.spec.sharing != "static" or self.measure:
            found = isolation_shares(tenant_vol, self.spec.weights, paths, left)
            self._first.stats["lps"] += found.lps
        if self.spec.sharing == "static":
            shares = static_shares(list(self.spec.weights), self.spec.weights, left)
        else:
            shares = found.share  # type: ignore[union-attr]  # (found: sharing is not static)
        zero = dict.fromkeys(capacity, 0.0)
        rates: dict[str, PairRates] = {cid: dict(per) for cid, per in floor.items()}
        for t, vols in rest.items():
            if vols:
                share = shares.get(t, zero)
                rates.update(self._policies[t].group_rates(now, vols, share, self.spec.order))
        given = {t: dict(shares.get(t, zero)) for t in by_tenant}
        if self.spec.sharing == "strict":
            self._hold_strict(found, rest, rates)  # type: ignore[arg-type]  # (not static)
        elif self.spec.sharing == "cooperative":
            self._lend(found, floor, rest, paths, capacity, rates, given)  # type: ignore[arg-type]
        if self.measure and found is not None:
            self._record(found, tenant_vol, paths, given, rates, rest)
        return _within(rates, capacity)

    def _lend(
        self,
        found: TenantShares,
        floor: dict[str, PairRates],
        rest: ByTenant,
        paths: dict[Pair, list[Path]],
        capacity: dict[Link, float],
        rates: dict[str, PairRates],
        given: dict[str, dict[Link, float]],
    ) -> None:
        """Cooperative: what is still unused to every (tenant, pair) weighted by its Step A
        rate and to every deadline coflow's pair weighted by its floor (leftover_rates;
        `rates` and the tenants' `given` capacity changed in place)."""
        weights = {t: {k: sum(x for _, x in lst) for k, lst in r.items()}
                   for t, r in found.rates.items()}  # fmt: skip
        for cid, per in floor.items():  # (a key no tenant name can be)
            weights[_DATED + cid] = {k: sum(x for _, x in lst) for k, lst in per.items()}
        spare = spare_capacity(capacity, [rates])
        extra = leftover_rates(weights, paths, spare, capacity, self._index)
        for key in [k for k in extra if k.startswith(_DATED)]:
            for pair, lst in extra.pop(key).items():
                _add_to(rates, key[len(_DATED) :], pair, lst)
        _attribute(extra, rest, rates)
        for t, per_pair in extra.items():
            for lst in per_pair.values():
                add_load(given[t], lst)

    def _hold_strict(
        self, found: TenantShares, rest: ByTenant, rates: dict[str, PairRates]
    ) -> None:
        """Give every tenant its Step A rate per pair, divided among its coflows without
        a floor (`rest`) in the order its Terra served them this round (`hold_to_pairs`;
        in place)."""
        for t, vols in rest.items():
            if not vols:
                continue
            policy = self._policies[t]
            order = [c for c in policy.round_order() if c in vols]
            order = list(dict.fromkeys([*order, *vols]))
            hold_to_pairs(rates, found.rates.get(t, {}), order, vols)

    def _record(
        self,
        found: TenantShares,
        tenant_vol: dict[str, dict[Pair, float]],
        paths: dict[Pair, list[Path]],
        given: dict[str, dict[Link, float]],
        rates: dict[str, PairRates],
        by_tenant: ByTenant,
    ) -> None:
        """Keep Step A's μ* and the isolation guarantee of the capacity each tenant was
        given (its share, plus its leftover when cooperative): min_t of its progress on
        that capacity over s_t (tenant_shares.allocation_progress); with strict sharing,
        where a tenant gets its rate per pair (`hold_to_pairs`), of the progress its
        `rates` make (tenant_shares.progress; no LP: those rates fit its share, so no
        routing on the share does better)."""
        held: dict[str, float] = {}
        if self.spec.sharing == "strict":
            totals: dict[str, dict[Pair, float]] = {}
            for t, cids in by_tenant.items():
                got = totals[t] = {}
                for cid in cids:
                    for k, lst in rates.get(cid, {}).items():
                        got[k] = got.get(k, 0.0) + sum(x for _, x in lst)
            held = progress(totals, tenant_vol, found.solo_gamma)
        weighted = {}
        for t, g in found.solo_gamma.items():
            if t not in found.weight_share:
                continue
            if self.spec.sharing == "strict":
                prog = held[t]
            else:
                prog = allocation_progress(tenant_vol[t], paths, given[t], g)
            weighted[t] = prog / found.weight_share[t]
        if weighted:
            self.stats["guarantee"].append(found.guarantee)
            self.stats["achieved"].append(min(weighted.values()))
            self.progress = weighted


def hold_to_pairs(
    rates: dict[str, PairRates],
    step_a: PairRates,
    order: list[str],
    volumes: dict[str, dict[Pair, float]],
) -> None:
    """Give one tenant exactly its Step A rate on each DC pair, divided among its coflows
    in its Terra order (strict sharing; `rates` changed in place).

    On each pair with a Step A rate, the coflows with bytes there take, in `order`, what
    the tenant's Terra round gave them, as long as the pair's Step A rate lasts; what is
    left of it goes to the first of them. Each one's rate runs over Step A's paths for the
    pair, in Step A's proportions, so the tenant's link loads are Step A's (its share). A
    coflow gets nothing on a pair without a Step A rate. (Admitted deadline coflows keep
    their floors and are not among them: TenantPolicy._round_floors.) Held so, a
    tenant's progress cannot be raised by lying about its bytes, even over K tunnels
    (docs/design.md 4.5, "Strategy-proof").

    Args:
        rates: {coflow id: {pair: [(path, bytes/s)]}} (every tenant's; only the coflows of
            `order` are changed).
        step_a: the tenant's Step A rates {pair: [(path, bytes/s)]}.
        order: the tenant's coflow ids, first served first (every one of them).
        volumes: {coflow id: {pair: bytes}} of the tenant's coflows.
    """
    for pair, lst in step_a.items():
        cap = sum(x for _, x in lst)
        left = cap
        take: dict[str, float] = {}
        for cid in order:
            if volumes[cid].get(pair, 0) > 0:
                got = sum(x for _, x in rates.get(cid, {}).get(pair, ()))
                take[cid] = min(got, left)
                left -= take[cid]
        if take and left > 0:
            take[next(iter(take))] += left
        for cid, x in take.items():
            rates.setdefault(cid, {})[pair] = [(path, y * x / cap) for path, y in lst if y > 0]
    for cid in order:
        for pair in rates.get(cid, {}).keys() - step_a.keys():
            rates[cid][pair] = []


def _attribute(
    extra: dict[str, PairRates], by_tenant: ByTenant, rates: dict[str, PairRates]
) -> None:
    """Add each tenant's leftover rate on a pair to its coflow on that pair with the most
    rate already (ties and no rate: the first in arrival order), in `rates` (in place).
    One pass over each tenant's coflows finds the coflow of every pair at once."""
    for t, per_pair in extra.items():
        best: dict[Pair, tuple[float, str]] = {}
        for cid, vol in by_tenant[t].items():
            got = rates.get(cid, {})
            for pair, v in vol.items():
                if v > 0 and pair in per_pair:
                    have = sum(x for _, x in got.get(pair, ()))
                    if pair not in best or have > best[pair][0]:
                        best[pair] = (have, cid)
        for pair, lst in per_pair.items():
            if pair not in best:
                continue
            _add_to(rates, best[pair][1], pair, lst)


def _add_to(
    rates: dict[str, PairRates], cid: str, pair: Pair, lst: list[tuple[Path, float]]
) -> None:
    """Add the path rates `lst` ([(path, bytes/s)]) to coflow `cid`'s on `pair` (in place)."""
    merged = dict(rates.setdefault(cid, {}).get(pair, ()))
    for path, x in lst:
        merged[path] = merged.get(path, 0.0) + x
    rates[cid][pair] = list(merged.items())


def _within(rates: dict[str, PairRates], capacity: dict[Link, float]) -> dict[str, PairRates]:
    """Scale down the paths over a link that solver round-off left above its capacity
    (each path by the smallest capacity/load over its links); the rest is unchanged."""
    load: dict[Link, float] = {}
    for per in rates.values():
        for lst in per.values():
            add_load(load, lst)
    over = {e: capacity.get(e, 0.0) / x for e, x in load.items() if x > capacity.get(e, 0.0)}
    if not over:
        return rates
    over_links = over.keys()
    out: dict[str, PairRates] = {}
    for cid, per in rates.items():
        mine = out[cid] = {}
        for pair, lst in per.items():
            if all(over_links.isdisjoint(links_of(p)) for p, _ in lst):
                mine[pair] = list(lst)  # (x × min of 1.0s is x)
                continue
            mine[pair] = [(p, x * min([over.get(e, 1.0) for e in links_of(p)])) for p, x in lst]
    return out
