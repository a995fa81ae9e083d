"""Terra's online scheduler (docs/design.md section 4.3; Pseudocode 2 of the paper) as a Policy.

On every event the caller (simulator or controller) asks `allocate` for rates;
the policy aggregates the remaining bytes of each coflow into FlowGroups, runs
one scheduling round (scheduling_round.py) and splits every FlowGroup's per-path
rates among its flows in proportion to their remaining bytes (policy.split_by_remaining).

What is kept between rounds (the incremental part of docs/design.md 4.3):
  * paths per DC pair, over links that are up, recomputed only on link down/up;
  * Γ of every coflow on the full capacities (the order of step 3) with its LP
    dual (link prices): later rounds get an upper bound (Γ is monotone and
    homogeneous of degree 1 in the volumes) and a weak-duality lower bound
    without an LP; equal bounds are the exact Γ, otherwise the lower bound
    keys the lazy order of scheduling_round._sequential, which solves the LP
    only if the coflow can still get capacity. The cache is dropped when the
    WAN changes (link state, or a capacity change larger than δ).

Deadlines: a coflow with a deadline D (absolute: arrival + deadline_s) is
admitted iff Γ·(1 + ε) ≤ D − now, with Γ computed on the capacity the already
admitted deadline coflows leave in their kept splits (step 1), and no admitted
coflow due later is set back (`_admissible`). Admitted deadline coflows are
never preempted.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypedDict

from terra_core import round_kernels
from terra_core.flat_rates import FlatRates
from terra_core.gamma_cache import GammaEntry, same_volumes
from terra_core.group_volumes import same_pairs
from terra_core.min_cct import DualBound, Pair, PairRates, min_cct
from terra_core.policy import Allocation, PathSource, PolicyState, Remaining, split_by_remaining
from terra_core.round_memo import RoundMemo
from terra_core.round_rates import PREEMPTED, RoundResult
from terra_core.scheduling_round import Split, reserve_deadlines, schedule_round, split_of
from terra_core.starvation import (
    DEFAULT_FACTOR,
    DEFAULT_FLOOR_S,
    DEFAULT_GUARD,
    Guard,
    StarvationClock,
)
from terra_core.tenant_shares import ORDERS
from terra_model import Coflow, Flow
from topologies import Link, Path, Topology, k_shortest_paths
from topologies.paths import full_graph, up_graph


class RoundStats(TypedDict):
    """A policy's `stats`: rounds run, each round's wall time (ms), LPs solved in all."""

    rounds: int
    round_ms: list[float]
    lps: int


class TerraOptions(TypedDict, total=False):
    """TerraPolicy's keyword arguments (passed on as they are, e.g. by tenant_policy)."""

    k: int
    alpha: float
    epsilon: float
    delta: float
    path_source: PathSource | None
    guard: str
    guard_factor: float
    guard_floor_s: float


@dataclass(frozen=True)
class AdmissionView:
    """What deadline admission counts beside a TerraPolicy's own deadline coflows: set by
    tenant_policy.py around each admission (empty for plain Terra).

    Attributes:
        held: {link: bytes/s} the guarantees take (reservations.held_load).
        deadlines: other tenants' admitted deadline coflows {id: (volumes {pair: bytes},
            absolute deadline s)}.
        pins: their kept splits {id: {pair: [(path, fraction)]}}.
        ranks: {coflow id: rank}, the order equal deadlines go in across tenants.
    """

    held: dict[Link, float] = field(default_factory=dict)
    deadlines: dict[str, tuple[dict[Pair, float], float]] = field(default_factory=dict)
    pins: dict[str, Split] = field(default_factory=dict)
    ranks: dict[str, int] = field(default_factory=dict)


class TerraPolicy:
    """Terra (You & Chowdhury, arXiv 1904.08480) implementing the Policy protocol.

    Args:
        topology: the shared WAN view; the caller mutates it and then calls wan_changed.
        k: paths kept per DC pair (K >= 1).
        alpha: starvation share α in [0, 1) (docs/design.md 4.2 step 2).
        epsilon: deadline admission slack ε >= 0 (docs/design.md 4.3).
        delta: relative capacity-change threshold δ >= 0 (docs/design.md 4.3).
        path_source: where routes come from (policy.PathSource); default the K shortest
            paths over the links that are up, searched per pair when first needed.
        guard: starvation guard, "aged" (default), "aged-fair" or "fixed" (the
            paper's: α of every link for all preempted coflows, every round);
            see starvation.py for each one's guarantee.
        guard_factor: patience factor c >= 0 of the aged guards: a coflow starves
            max(c·Γ, guard_floor_s) seconds after its arrival (Γ: its minimum CCT
            alone on the WAN at arrival).
        guard_floor_s: smallest patience in seconds >= 0 (aged guards).

    Attributes:
        name: "terra".
        stats: {"rounds": int, "round_ms": [wall ms per allocate call], "lps": total LPs}.

    Raises:
        ValueError: a parameter out of range.
    """

    name = "terra"

    def __init__(
        self,
        topology: Topology,
        k: int = 4,
        alpha: float = 0.1,
        epsilon: float = 0.1,
        delta: float = 0.1,
        path_source: PathSource | None = None,
        guard: str = DEFAULT_GUARD,
        guard_factor: float = DEFAULT_FACTOR,
        guard_floor_s: float = DEFAULT_FLOOR_S,
    ) -> None:
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise ValueError(f"K must be a positive integer, got {k!r}")
        if not 0.0 <= alpha < 1.0:
            raise ValueError(f"alpha must be in [0, 1), got {alpha!r}")
        if not epsilon >= 0.0:
            raise ValueError(f"epsilon must be >= 0, got {epsilon!r}")
        if not delta >= 0.0:
            raise ValueError(f"delta must be >= 0, got {delta!r}")
        self.guard = Guard(guard, alpha, guard_factor, guard_floor_s)
        self.topology = topology
        self.k, self.alpha, self.epsilon, self.delta = k, alpha, epsilon, delta
        self._clock = StarvationClock(self.guard)
        self.stats: RoundStats = {"rounds": 0, "round_ms": [], "lps": 0}
        self._empty = topology.copy()  # the empty WAN of gamma_empty: every link up
        self._empty.down.clear()
        self._empty_paths: dict[Pair, list[Path]] = {}
        self._paths: dict[Pair, list[Path]] = {}
        self._routable: dict[Pair, list[Path]] = {}  # pairs of _paths with a path (_paths_for)
        self.path_source = path_source
        self._graph = None
        self._down_seen = set(topology.down)
        self._cap_seen = dict(topology.capacity)
        self._coflows: dict[str, Coflow] = {}
        self._flow_pair: dict[str, dict[str, Pair]] = {}
        self._deadline: dict[str, float] = {}  # admitted deadline coflows: absolute deadline
        # what deadline admission counts beside this policy's own coflows (tenants)
        self.admission = AdmissionView()
        # admitted deadline coflows' splits, kept from admission (reserve_deadlines)
        self._pinned: dict[str, Split] = {}
        # (time s, {deadline coflow: {pair: bytes/s}}) of the last round (`served`)
        self._served: tuple[float, dict[str, dict[Pair, float]]] = (0.0, {})
        self._volumes: dict[str, dict[Pair, float]] = {}  # last known FlowGroup volumes
        self._gamma: dict[str, GammaEntry] = {}  # volumes, Γ on the full WAN, DualBound
        # last round's hints: {coflow id: (the cache entry, the volumes, the hint)}
        self._hinted: dict[str, tuple[GammaEntry, dict[Pair, float], tuple[float, bool]]] = {}
        self._state: dict[str, PolicyState] = {}
        self._memo = RoundMemo()  # what a round keeps for the next (round_memo.py)
        round_kernels.warm()  # the round's compiled passes loaded now, not in the first round
        self._total: dict[str, dict[Pair, float]] = {}  # aged guards: all bytes ever added
        # the last round's deadlines, starving and Γ order (round_order)
        self._last_order: tuple[dict[str, float], list[str], list[str]] = ({}, [], [])

    # ----- Policy protocol -------------------------------------------------------------

    def add_coflow(self, coflow: Coflow, now: float) -> bool:
        """Register a coflow arriving at `now` (seconds); deadline admission control.

        Returns:
            False when the coflow has a deadline it cannot meet (it is not
            registered); True otherwise.

        Raises:
            ValueError: duplicate coflow id, duplicate flow id, unknown DC, or a
                flow between DCs with no path (naming the coflow and the pair).
        """
        if coflow.id in self._coflows:
            raise ValueError(f"coflow {coflow.id!r} is already active (duplicate coflow id)")
        pairs = self._check_flows(coflow.id, coflow.flows, set())
        volumes = coflow.flowgroups()
        if coflow.deadline_s is not None:
            deadline = coflow.arrival_s + coflow.deadline_s
            if not self._admissible(coflow.id, volumes, deadline, now):
                return False
            self._deadline[coflow.id] = deadline
        self._coflows[coflow.id] = coflow
        self._flow_pair[coflow.id] = pairs
        self._volumes[coflow.id] = volumes
        self._state[coflow.id] = PolicyState.QUEUED
        if self.guard.aged and coflow.deadline_s is None:
            self._clock.start(coflow.id, now, self._gamma_now(coflow.id, volumes))
        return True

    def add_flows(self, coflow_id: str, flows: list[Flow], now: float) -> None:
        """Add flows to an active coflow (updateCoflow, docs/design.md 4.3). Flows added to
        an admitted deadline coflow end its guarantee (it was admitted for its bytes then):
        from now on it is an ordinary coflow (`drop_deadline`).

        Raises:
            KeyError: unknown coflow id.
            ValueError: duplicate flow id, unknown DC, or a DC pair with no path.
        """
        if coflow_id not in self._coflows:
            raise KeyError(f"unknown coflow {coflow_id!r}")
        known = self._flow_pair[coflow_id]
        pairs = self._check_flows(coflow_id, flows, set(known))
        if flows and coflow_id in self._deadline:
            self.drop_deadline(coflow_id, now)
        known.update(pairs)
        # a new dict: the old one may be the caller's (and the round's caches') still
        volumes = self._volumes[coflow_id] = dict(self._volumes[coflow_id])
        for f in flows:
            if not f.intra_dc:
                volumes[(f.src, f.dst)] = volumes.get((f.src, f.dst), 0.0) + f.bytes
        self._gamma.pop(coflow_id, None)
        if self._clock.starts(coflow_id) is not None:
            total = self._total[coflow_id]
            for f in flows:
                if not f.intra_dc:
                    total[(f.src, f.dst)] = total.get((f.src, f.dst), 0.0) + f.bytes
            self._clock.update(coflow_id, self._gamma_now(coflow_id, total))

    def remove_coflow(self, coflow_id: str, now: float) -> None:
        """Forget a finished or cancelled coflow; unknown ids are ignored."""
        for table in (
            self._coflows,
            self._flow_pair,
            self._deadline,
            self._volumes,
            self._gamma,
            self._state,
            self._total,
            self._pinned,
        ):
            table.pop(coflow_id, None)
        self._memo.forget(coflow_id)
        self._clock.forget(coflow_id)

    def wan_changed(self, now: float) -> bool:
        """Take note of a mutated topology.

        Link state changes recompute the paths (over links that are up) and drop
        the cached Γs; a capacity change counts only when some link changed by
        more than δ relative to the capacity last taken into account.
        Allocations always use the current capacities, so they stay feasible either way.

        Returns:
            True when the change warrants a new allocation.
        """
        topo = self.topology
        changed = False
        if topo.down != self._down_seen:
            self._down_seen = set(topo.down)
            self._paths.clear()
            self._routable = {}
            self._graph = None
            changed = True
        for link, cap in topo.capacity.items():
            seen = self._cap_seen.get(link)
            if seen is None or abs(cap - seen) > self.delta * seen:
                changed = True
                break
        if changed:
            self._cap_seen = dict(topo.capacity)
            self._gamma.clear()
            self._memo.clear()
        return changed

    def allocate(self, now: float, remaining: Remaining) -> Allocation:
        """Rates for every active flow from `now` until the next event (docs/design.md 4.2-4.3).

        Args:
            now: seconds.
            remaining: {coflow id: {flow id: remaining bytes}} of unfinished WAN flows.

        Returns:
            {coflow id: {flow id: [(path, bytes/s)]}}.

        Raises:
            KeyError: a coflow or flow id that was never added.
            ValueError: a DC pair that lost every path (link failures) — the
                message names the coflow and the pair.
        """
        start = time.perf_counter()
        alloc = allocate_by_groups(remaining, self._pairs_of, lambda v: self._round(now, v).rates)
        self.stats["round_ms"].append((time.perf_counter() - start) * 1000.0)
        return alloc

    def group_rates(
        self,
        now: float,
        volumes: dict[str, dict[Pair, float]],
        capacity: dict[Link, float] | None = None,
        order: str = "share",
    ) -> dict[str, PairRates]:
        """Per-FlowGroup rates: the round of `allocate`, given the FlowGroup volumes (the
        simulator's fast path, policy.GroupRatesPolicy; it splits each FlowGroup's rates
        among its flows in proportion to their remaining bytes, as `allocate` does).

        Args:
            now: seconds.
            volumes: {coflow id: {(src DC, dst DC): remaining bytes}} of every active
                coflow in admission order, each FlowGroup's volume the sum of its flows'
                remaining bytes (> 0) in flow order, pairs in the order of their first
                unfinished flow: what `allocate` builds from its `remaining`. Read only
                once handed in (policy.GroupRatesPolicy): a dict handed in again is taken
                as the same volumes without checking them again.
            capacity: optional {link: bytes/s} to schedule on instead of the WAN's
                capacities (a tenant's share, tenant_policy.py; it must keep the links of
                the WAN, in their order). With order "share" the round then orders by Γ
                on it, without the cached Γs (those are on the WAN's capacities) and
                without caching its Γs.
            order: with `capacity`, the capacities step 3's Γ order is computed on
                (tenant_shares.ORDERS): "share", `capacity`; "wan", the WAN's capacities
                (links up), with the Γ cache as in a round on the WAN (its Γs are cached
                too). Steps 1, 2 and 4-6 run on `capacity` either way. Ignored without
                `capacity`.

        Returns:
            {coflow id: {(src, dst): [(path, bytes/s), ...]}} for the coflows that get
            any rate; a FlowGroup missing from it gets rate 0.

        Raises:
            KeyError: a coflow id that was never added.
            ValueError: a DC pair that lost every path (as `allocate`), or an unknown
                `order`.
        """
        if order not in ORDERS:
            raise ValueError(f"order must be one of {', '.join(ORDERS)}, got {order!r}")
        return self._served_round(now, volumes, capacity, order).rates

    def group_rate_arrays(self, now: float, volumes: dict[str, dict[Pair, float]]) -> FlatRates:
        """`group_rates(now, volumes)` on the WAN's capacities, as flat arrays (the same
        rates in the same order; flat_rates.FlatRates): the simulator's fast path, which
        reads them without the dict of lists (policy.GroupRateArraysPolicy).

        Raises:
            KeyError, ValueError: as group_rates.
        """
        result = self._served_round(now, volumes)
        return result.flat if result.flat is not None else FlatRates.from_dict(result.rates)

    def _served_round(
        self,
        now: float,
        volumes: dict[str, dict[Pair, float]],
        capacity: dict[Link, float] | None = None,
        order: str = "share",
    ) -> RoundResult:
        """`_round` for group_rates and group_rate_arrays: unknown coflow ids refused
        (KeyError, as allocate), the deadline coflows' rates kept (`served`), the round's
        wall ms in stats."""
        start = time.perf_counter()
        for cid in volumes:
            self._pairs_of(cid)
        result = self._round(now, volumes, capacity, order)
        self.served(now, result.rates if self._deadline else {})
        self.stats["round_ms"].append((time.perf_counter() - start) * 1000.0)
        return result

    def _round(
        self,
        now: float,
        volumes: dict[str, dict[Pair, float]],
        share: dict[Link, float] | None = None,
        order: str = "share",
    ) -> RoundResult:
        """One scheduling round on `volumes` ({coflow id: {pair: bytes}}) on the WAN's
        capacities or on `share`, ordered by Γ on `order`'s capacities (see group_rates):
        keeps them as the coflows' last known volumes, updates the Γ cache (Γs on the
        WAN's capacities only), states and stats (rounds, LPs) and returns the round's
        RoundResult (its rates: {coflow id: {pair: [(path, bytes/s)]}})."""
        for cid, vol in volumes.items():
            self._volumes[cid] = vol
        paths = self._paths_for(volumes)
        wan: dict[Link, float] | None  # the WAN's capacities when step 3 orders by Γ on them
        if share is None:
            capacity = wan = self._capacity()
        else:
            capacity, wan = share, self._capacity() if order == "wan" else None
        hints = None if wan is None else self._gamma_hints(volumes, paths, wan)
        deadlines = {cid: d for cid, d in self._deadline.items() if cid in volumes}
        starving = None
        if self.guard.aged:
            starving = self._clock.starving(now, volumes)
        result = schedule_round(
            volumes,
            paths,
            capacity,
            now,
            deadlines,
            self.alpha,
            hints=hints,
            memo=self._memo,
            starving=starving,
            starving_fair=self.guard.mode == "aged-fair",
            order_capacity=None if share is None else wan,
            pinned=self._pinned,
        )
        self._last_order = (deadlines, starving or [], result.order)
        if wan is not None:  # Γs on the WAN's capacities go to the cache
            for cid, res in result.exact.items():
                bound = DualBound.build(volumes[cid], paths, wan, res.prices)
                self._gamma[cid] = GammaEntry(volumes[cid], res.gamma_s, bound)
        for cid, state in result.state.items():
            self._state[cid] = PolicyState.PREEMPTED if state == PREEMPTED else PolicyState.RUNNING
        self.stats["rounds"] += 1
        self.stats["lps"] += result.lps
        return result

    # ----- extras for the simulator and the controller ---------------------------------

    def next_wakeup(self, now: float) -> float | None:
        """The next time (seconds, > `now`) a coflow starts starving, when a round is
        due even if nothing else happens (aged guards; None with the fixed guard or
        when no coflow is waiting to starve). See starvation.py for the guarantee."""
        return self._clock.next_wakeup(now) if self.guard.aged else None

    def starving(self, now: float) -> list[str]:
        """Ids of the active coflows starving at `now` (seconds), oldest first
        (aged guards; [] with the fixed guard)."""
        return self._clock.starving(now, self._coflows) if self.guard.aged else []

    def admitted_deadlines(
        self, now: float | None = None
    ) -> dict[str, tuple[dict[Pair, float], float]]:
        """The admitted deadline coflows with bytes left: {coflow id: (FlowGroup volumes
        {pair: bytes}, absolute deadline in seconds)}, in admission order. The volumes
        are the last round's, or at `now` (seconds) those less what the last round's
        rates (`served`) have sent since."""
        at, rate = self._served
        out = {}
        for cid, d in self._deadline.items():
            vol = self._volumes.get(cid)
            if vol and now is not None and cid in rate:
                gone = rate[cid]
                vol = {k: max(0.0, v - gone.get(k, 0.0) * (now - at)) for k, v in vol.items()}
            if vol and any(v > 0 for v in vol.values()):
                out[cid] = (vol, d)
        return out

    def pins(self) -> dict[str, Split]:
        """The admitted deadline coflows' splits ({coflow id: {pair: [(path, fraction)]}},
        kept from their admission; read only)."""
        return self._pinned

    def served(self, now: float, rates: dict[str, PairRates]) -> None:
        """Keep the rates ({coflow id: {pair: [(path, bytes/s)]}}) the round at `now`
        (seconds) gave, of the admitted deadline coflows: admission projects their volumes
        with them (`admitted_deadlines`)."""
        self._served = (now, {cid: {k: sum(x for _, x in lst) for k, lst in per.items()}
                              for cid, per in rates.items() if cid in self._deadline})  # fmt: skip

    def drop_deadline(self, coflow_id: str, now: float) -> None:
        """Serve an admitted deadline coflow as an ordinary one from now on (seconds): it
        leaves step 1 and, with an aged guard, starts its starvation clock. Unknown ids
        and coflows without a deadline are ignored."""
        self._pinned.pop(coflow_id, None)
        if self._deadline.pop(coflow_id, None) is None:
            return
        if self.guard.aged:
            volumes = self._volumes.get(coflow_id, {})
            self._clock.start(coflow_id, now, self._gamma_now(coflow_id, volumes))

    def keep_volumes(self, volumes: dict[str, dict[Pair, float]]) -> None:
        """Keep `volumes` ({coflow id: {pair: bytes}}) as those coflows' last known
        FlowGroup volumes (a round that served them without this policy: their floors
        across tenants, tenant_policy.py)."""
        for cid, vol in volumes.items():
            if cid in self._volumes:
                self._volumes[cid] = vol

    def round_order(self) -> list[str]:
        """Ids of the last round's coflows (those with bytes) in the order Terra served
        them: the admitted deadline coflows, earliest deadline first (step 1); the
        starving coflows, oldest first (aged guards, step 2'); then the others in the
        Γ order of steps 3-4 (smallest first, Γ on the round's capacity; a coflow
        preempted without an LP at the place of its lower bound on Γ). Built from what
        the round kept: no LP. [] before the first round."""
        deadlines, starving, by_gamma = self._last_order
        first = sorted(deadlines, key=deadlines.__getitem__)  # (stable: ties by admission)
        return list(dict.fromkeys([*first, *starving, *by_gamma]))

    def gamma_empty(self, coflow: Coflow) -> float:
        """Γ of `coflow` alone on the empty WAN (every link up, current capacities), seconds.

        Returns 0 for a coflow with no WAN bytes and inf when a FlowGroup has no path.
        """
        volumes = coflow.flowgroups()
        graph = up_graph(self._empty)
        for pair in volumes:
            if pair not in self._empty_paths:
                self._empty_paths[pair] = k_shortest_paths(self._empty, *pair, self.k, graph)
        capacity = dict(self.topology.capacity)
        return min_cct(volumes, self._empty_paths, capacity, fewest_link_bytes=False).gamma_s

    def state(self, coflow_id: str) -> PolicyState:
        """Return the coflow's PolicyState: QUEUED (not yet in a round), RUNNING or PREEMPTED.

        Raises:
            KeyError: unknown coflow id.
        """
        if coflow_id not in self._state:
            raise KeyError(f"unknown coflow {coflow_id!r}")
        return self._state[coflow_id]

    def paths(self, src: str, dst: str) -> list[Path]:
        """The (cached) paths of the pair that may carry traffic: the path source's, else
        the K shortest paths from src to dst over links that are up; when links that are
        down cut the pair off, the K shortest over every link, which carry nothing until
        their links come back (as the controller's tunnels over a failed link: the pair's
        FlowGroups wait at rate 0, the round goes on for the others)."""
        pair = (src, dst)
        if pair not in self._paths and self.path_source is not None:
            self._paths = self.path_source(self.topology, self.k)
            self._routable = {}
            return self._paths.setdefault(pair, [])
        if pair not in self._paths:
            if self._graph is None:
                self._graph = up_graph(self.topology)
            found = k_shortest_paths(self.topology, src, dst, self.k, self._graph)
            if not found and self.topology.down:
                found = k_shortest_paths(self.topology, src, dst, self.k, full_graph(self.topology))
            self._paths[pair] = found
        return self._paths[pair]

    # ----- internals -------------------------------------------------------------------

    def _check_flows(self, cid: str, flows: list[Flow], seen: set[str]) -> dict[str, Pair]:
        pairs: dict[str, Pair] = {}
        for f in flows:
            if f.id in seen or f.id in pairs:
                raise ValueError(f"coflow {cid!r}: duplicate flow id {f.id!r}")
            self.topology.check_dc(f.src, f"coflow {cid!r} flow {f.id!r} source")
            self.topology.check_dc(f.dst, f"coflow {cid!r} flow {f.id!r} destination")
            if not f.intra_dc and not self.paths(f.src, f.dst):
                raise ValueError(f"coflow {cid!r}: no path from {f.src} to {f.dst} (flow {f.id!r})")
            pairs[f.id] = (f.src, f.dst)
        return pairs

    def _pairs_of(self, cid: str) -> dict[str, Pair]:
        if cid not in self._flow_pair:
            raise KeyError(f"allocate: unknown coflow {cid!r}")
        return self._flow_pair[cid]

    def _paths_for(self, volumes: dict[str, dict[Pair, float]]) -> dict[Pair, list[Path]]:
        """{pair: paths} with at least the pairs of `volumes` (read only: the policy's
        dict of the pairs checked to have a path, kept until the paths change). A volumes
        dict the last round was given on that dict (the round memo's `active`) has them,
        and so has a GroupVolumes on a pair list it checked.

        Raises:
            ValueError: a pair with no path (naming the coflow and the pair).
        """
        while True:
            ok = self._routable
            last = self._memo.active
            checked: dict[str, dict[Pair, float]] = {}
            routed: dict[str, list[Pair]] = {}
            if last is not None and last.paths is ok:
                checked, routed = last.given, last.routed
            for cid, fgs in volumes.items():
                if checked.get(cid) is fgs or same_pairs(fgs, routed.get(cid)):
                    continue
                if fgs.keys() <= ok.keys():  # (most add no pair)
                    continue
                for pair in fgs:
                    if pair not in ok:
                        found = self.paths(*pair)
                        if not found:
                            raise ValueError(f"coflow {cid!r}: no path from {pair[0]} to {pair[1]}")
                        ok[pair] = found
            if ok is self._routable:  # (else the path source was read again: check again)
                return ok

    def _capacity(self) -> dict[Link, float]:
        topo = self.topology
        return {link: c for link, c in topo.capacity.items() if link not in topo.down}

    def _gamma_hints(
        self,
        volumes: dict[str, dict[Pair, float]],
        paths: dict[Pair, list[Path]],
        capacity: dict[Link, float],
    ) -> dict[str, tuple[float, bool]]:
        """{coflow id: (lower bound on Γ, exact)} from the cache of solved Γs
        (gamma_cache.GammaEntry.hint: exact when the weak-duality lower bound meets the
        upper bound, e.g. all FlowGroups shrank in proportion, or only FlowGroups off the
        bottleneck shrank faster; otherwise the lower bound). The hint is the same as last
        round's when neither the cache entry nor the volumes (in their order) changed, as
        for a preempted coflow: it is kept with its inputs for the next round (`_hinted`).
        """
        hints: dict[str, tuple[float, bool]] = {}
        last, self._hinted = self._hinted, {}
        for cid, now_vol in volumes.items():
            cached = self._gamma.get(cid)
            if cid in self._deadline or cached is None:
                continue
            seen = last.get(cid)
            if seen is None or seen[0] is not cached or not same_volumes(seen[1], now_vol):
                hint = cached.hint(now_vol)
                if hint is None:
                    del self._gamma[cid]
                    continue
                seen = (cached, now_vol, hint)
            self._hinted[cid] = seen
            hints[cid] = seen[2]
        return hints

    def _gamma_now(self, cid: str, volumes: dict[Pair, float]) -> float:
        """Γ in seconds of `volumes` alone on the current WAN (one LP; 0 without WAN bytes).

        Also keeps `volumes` as the coflow's total (for add_flows)."""
        self._total[cid] = dict(volumes)
        if not volumes:
            return 0.0
        paths = self._paths_for({cid: volumes})
        res = min_cct(volumes, paths, self._capacity(), fewest_link_bytes=False)
        self.stats["lps"] += res.lp_solved
        return res.gamma_s

    def _admissible(
        self, cid: str, volumes: dict[Pair, float], deadline: float, now: float
    ) -> bool:
        """Deadline admission (docs/design.md 4.3): the coflow joins the admitted deadline
        coflows (its own and `admission`'s) in the earliest-deadline-first order step 1
        serves them in, on the capacity minus `admission.held`. Admitted when its Γ on
        what the earlier ones leave, times (1 + ε), fits in D − now, and every admitted
        coflow due later still fits with it (Γ ≤ its D − now), or, already behind, is not
        set back by it. Equal deadlines go in `admission.ranks` order (else admission
        order), the newcomer last."""
        if not volumes:
            return True
        capacity = self._capacity()
        view = self.admission
        if view.held:
            capacity = {e: max(0.0, c - view.held.get(e, 0.0)) for e, c in capacity.items()}
        admitted: dict[str, dict[Pair, float]] = {}
        due: dict[str, float] = {}
        known = self.admitted_deadlines(now) | view.deadlines
        for c in sorted(known, key=lambda c: view.ranks.get(c, 0)):  # (stable: own order)
            admitted[c], due[c] = known[c]
        paths = self._paths_for({cid: volumes, **admitted})
        gammas: dict[str, float] = {}
        taken = self._edf(
            admitted | {cid: volumes}, paths, capacity, now, due | {cid: deadline}, gammas
        )
        if not gammas[cid] * (1 + self.epsilon) <= deadline - now:  # (inf too)
            return False
        hurt = [c for c in admitted if due[c] > deadline and not _fits(gammas[c], due[c], now)]
        if hurt:
            alone: dict[str, float] = {}
            self._edf(admitted, paths, capacity, now, due, alone)
            if any(gammas[c] > alone[c] * (1 + 1e-9) for c in hurt):
                return False
        mine = taken.get(cid, {})
        self._pinned[cid] = split_of({k: list(pp.items()) for k, pp in mine.items()})
        return True

    def _edf(
        self,
        coflows: dict[str, dict[Pair, float]],
        paths: dict[Pair, list[Path]],
        capacity: dict[Link, float],
        now: float,
        due: dict[str, float],
        gammas: dict[str, float],
    ) -> dict[str, dict[Pair, dict[Path, float]]]:
        """Step 1 on a copy of `capacity`, the admitted coflows in their splits (own and
        `admission.pins`; charged in full even where `held` leaves less, so a newcomer is
        placed on what they will take): fills `gammas` ({cid: Γ s on what the earlier ones
        leave}), counts the LPs and returns the rates ({cid: {pair: {path: bytes/s}}})."""
        taken = RoundResult()
        rates: dict[str, dict[Pair, dict[Path, float]]] = {}
        pins = self._pinned | self.admission.pins
        left = dict(capacity)
        reserve_deadlines(coflows, paths, left, now, due, rates, taken, gammas, pins, force=True)
        self.stats["lps"] += taken.lps
        return rates


def _fits(gamma_s: float, deadline: float, now: float) -> bool:
    """Γ (seconds) fits before the absolute `deadline` (1e-9 relative slack)."""
    return gamma_s <= (deadline - now) * (1 + 1e-9)


def allocate_by_groups(
    remaining: Remaining,
    pairs_of: Callable[[str], dict[str, Pair]],
    group_rates: Callable[[dict[str, dict[Pair, float]]], dict[str, PairRates]],
) -> Allocation:
    """Policy.allocate from per-FlowGroup rates: aggregate each coflow's unfinished flows
    into FlowGroups, ask `group_rates` for their rates and split each FlowGroup's rates
    among its flows in proportion to their remaining bytes (policy.split_by_remaining).

    Args:
        remaining: {coflow id: {flow id: remaining bytes}} (policy.Remaining).
        pairs_of: coflow id -> {flow id: (src DC, dst DC)}; raises KeyError when unknown.
        group_rates: {coflow id: {pair: bytes}} -> {coflow id: {pair: [(path, bytes/s)]}}.

    Returns:
        {coflow id: {flow id: [(path, bytes/s)]}}.

    Raises:
        KeyError: a coflow or flow id that was never added.
    """
    volumes: dict[str, dict[Pair, float]] = {}
    by_group: dict[str, dict[Pair, dict[str, float]]] = {}
    for cid, flows in remaining.items():
        pair_of = pairs_of(cid)
        groups: dict[Pair, dict[str, float]] = {}
        for fid, left in flows.items():
            if left > 0:
                if fid not in pair_of:
                    raise KeyError(f"allocate: coflow {cid!r} has no flow {fid!r}")
                groups.setdefault(pair_of[fid], {})[fid] = left
        by_group[cid] = groups
        volumes[cid] = {pair: sum(fl.values()) for pair, fl in groups.items()}
    rates = group_rates(volumes)
    alloc: Allocation = {}
    for cid, pair_rates in rates.items():
        flows_alloc = {}
        for pair, lst in pair_rates.items():
            flows_alloc.update(split_by_remaining(lst, by_group[cid][pair]))
        alloc[cid] = flows_alloc
    return alloc
