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
   (pair_policy.py, madd.py). Per event the loop touches only the live flows (admitted, not
   finished; an index array kept in position order). Policies
   with ``group_rates`` (Terra) are asked for rates per FlowGroup, given the
   FlowGroups' remaining volumes, and the simulator splits them among the flows in
   proportion to their remaining bytes, as `allocate` would (the same floating-point
   operations in the same order, so the same rates to the bit).

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
"""

from __future__ import annotations

import gc
import time
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace

import numpy as np
from numba import njit

from terra_core.flow_bundles import bundle_wan_flows, flow_count, unbundled_wan_flows
from terra_core.maxmin import add_held, csr_ranges, flush_held
from terra_core.policy import (
    Allocation,
    CoflowRatesPolicy,
    GroupRatesPolicy,
    PairLevelsPolicy,
    PairTablePolicy,
    Policy,
    Remaining,
)
from terra_model import Coflow
from topologies import Topology, all_pairs_paths, path_links

_FINISH_REL = 1e-9  # a flow whose finish time is within this fraction of the step finishes
_FINISH_BYTES = 1e-6  # ... or whose remaining bytes after the step are below this
_CAPACITY_REL = 1e-6  # tolerated relative link overload before SimulationError
_CONSERVE_REL = 1e-6  # tolerated relative error in bytes conservation


class SimulationError(RuntimeError):
    """A policy returned an infeasible allocation, or the simulation lost bytes."""


@dataclass(frozen=True)
class WanChange:
    """A scripted WAN change at `time_s` seconds on the undirected link a-b.

    Attributes:
        time_s: when it happens (seconds, >= 0).
        a, b: the DCs the link joins (both directions change).
        up: True / False to bring the link up / down; None to leave its state.
        capacity: new capacity in bytes/s for both directions; None to keep it.
    """

    time_s: float
    a: str
    b: str
    up: bool | None = None
    capacity: float | None = None

    def apply(self, topology: Topology) -> None:
        """Mutate `topology` accordingly.

        Raises:
            TopologyError: unknown link or invalid capacity.
        """
        if self.up is not None:
            topology.set_link_state(self.a, self.b, self.up)
        if self.capacity is not None:
            topology.set_capacity(self.a, self.b, self.capacity)


@dataclass
class CoflowResult:
    """Outcome of one coflow.

    Attributes:
        id, arrival_s: as in the workload (seconds).
        finish_s: when its last byte was delivered (None = rejected or unfinished).
        cct_s: finish_s - arrival_s (None likewise).
        admitted: False when the policy rejected it (deadline admission).
        met_deadline: None without a deadline; else finished within it (1e-9 relative slack).
        wan: False for coflows with only intra-DC flows (left out of statistics).
        deadline_s: deadline relative to arrival, or None.
        gamma_empty_s: Γ on the empty WAN, or None when not computed.
    """

    id: str
    arrival_s: float
    finish_s: float | None = None
    cct_s: float | None = None
    admitted: bool = True
    met_deadline: bool | None = None
    wan: bool = True
    deadline_s: float | None = None
    gamma_empty_s: float | None = None

    def to_json(self) -> dict:
        """Return {"id", "arrival_s", "finish_s", "cct_s", "admitted", "met_deadline"}."""
        return {
            "id": self.id,
            "arrival_s": self.arrival_s,
            "finish_s": self.finish_s,
            "cct_s": self.cct_s,
            "admitted": self.admitted,
            "met_deadline": self.met_deadline,
        }


@dataclass
class SimResult:
    """What one simulation run measured (see the module docstring for definitions).

    Attributes:
        scheduler: the policy's name.
        coflows: one CoflowResult per coflow, in workload order.
        wan_utilization: fraction in [0, 1], None when no WAN flow ever ran.
        rounds: scheduling rounds (the policy's own count when it keeps
            `stats["rounds"]`, else allocate() calls).
        round_ms: wall milliseconds per round (policy's `stats["round_ms"]` or
            measured around allocate()).
        lps_per_round: LPs solved per round (policy's `stats["lps"]` / rounds),
            None for policies that do not count LPs.
        bytes_total, bytes_delivered: WAN bytes of admitted coflows, and delivered.
        end_s: simulated time at which the run ended (seconds).
        wall_s: wall-clock seconds the run took.
    """

    scheduler: str
    coflows: list[CoflowResult]
    wan_utilization: float | None = None
    rounds: int = 0
    round_ms: list[float] = field(default_factory=list)
    lps_per_round: float | None = None
    bytes_total: float = 0.0
    bytes_delivered: float = 0.0
    end_s: float = 0.0
    wall_s: float = 0.0

    def _done(self) -> list[CoflowResult]:
        return [c for c in self.coflows if c.wan and c.admitted and c.cct_s is not None]

    @property
    def unfinished(self) -> list[str]:
        """Ids of admitted coflows that never finished."""
        return [c.id for c in self.coflows if c.admitted and c.finish_s is None]

    @property
    def avg_cct_s(self) -> float | None:
        """Mean CCT in seconds over finished, admitted WAN coflows (None if none)."""
        done = self._done()
        return float(np.mean([c.cct_s for c in done])) if done else None

    @property
    def p95_cct_s(self) -> float | None:
        """95th percentile (linear interpolation) of the same CCTs, seconds."""
        done = self._done()
        return float(np.percentile([c.cct_s for c in done], 95)) if done else None

    @property
    def avg_slowdown(self) -> float | None:
        """Mean of CCT / Γ_empty over finished, admitted WAN coflows with a known Γ > 0."""
        ratios = [c.cct_s / c.gamma_empty_s for c in self._done() if c.gamma_empty_s]
        return float(np.mean(ratios)) if ratios else None

    @property
    def deadlines_met(self) -> int:
        """WAN coflows with a deadline that finished within it."""
        return sum(1 for c in self.coflows if c.wan and c.met_deadline)

    @property
    def admitted(self) -> int:
        """WAN coflows the policy admitted."""
        return sum(1 for c in self.coflows if c.wan and c.admitted)

    def round_ms_quantile(self, q: float) -> float | None:
        """The q-quantile (0..1) of round_ms, None without rounds."""
        return float(np.quantile(self.round_ms, q)) if self.round_ms else None

    def to_json(self) -> dict:
        """Return the per-scheduler object of `terra-sim --json` (plus wall_s)."""
        return {
            "avg_cct_s": self.avg_cct_s,
            "p95_cct_s": self.p95_cct_s,
            "wan_utilization": self.wan_utilization,
            "avg_slowdown": self.avg_slowdown,
            "deadlines_met": self.deadlines_met,
            "admitted": self.admitted,
            "rounds": self.rounds,
            "round_ms_median": self.round_ms_quantile(0.5),
            "round_ms_p95": self.round_ms_quantile(0.95),
            "lps_per_round": self.lps_per_round,
            "wall_s": self.wall_s,
            "coflows": [c.to_json() for c in self.coflows],
        }


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

    Returns:
        A SimResult.

    Raises:
        SimulationError: infeasible allocation from the policy, or lost bytes.
        ValueError: duplicate coflow ids, or what the policy raises for a coflow
            (e.g. a DC pair with no path).
    """
    with _fewer_gc_passes():
        return _Run(policy, coflows, changes, gammas or {}, bundle, progress).run()


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


def _ranges(starts: np.ndarray, lens: np.ndarray) -> np.ndarray:
    """The concatenated index ranges starts[i] .. starts[i] + lens[i] - 1, in order (int
    arrays of equal length, lens >= 0) -> int array (lens.sum(),)."""
    total = int(lens.sum())
    if total == 0:
        return np.zeros(0, dtype=np.intp)
    ends = np.cumsum(lens)
    return np.arange(total) + np.repeat(starts - (ends - lens), lens)


@dataclass
class _Active:
    """Bookkeeping of one running coflow: positions (int array, ascending) of its unfinished
    flows in the global flow arrays."""

    pos: np.ndarray


@dataclass
class _Groups:
    """The FlowGroups of the active flows (one per coflow and DC pair), for `group_rates`.

    Attributes:
        pos: positions (in the global flow arrays) of the active flows, coflows in
            admission order, each one's flows in workload order.
        gid: for each of them, its FlowGroup's index (0 .. count - 1).
        count: the number of FlowGroups.
        coflows: {coflow id: (index of its first FlowGroup, its DC pairs in order,
            {DC pair: its position among them})}.
    """

    pos: np.ndarray
    gid: np.ndarray
    count: int
    coflows: dict[str, tuple[int, list[tuple[str, str]], dict[tuple[str, str], int]]]


class _Run:
    """One simulation run (see `simulate`)."""

    def __init__(self, policy, coflows, changes, gammas, bundle, progress) -> None:
        self.policy = policy
        self.topology: Topology = policy.topology
        self.progress = progress
        ids = [c.id for c in coflows]
        if len(set(ids)) != len(ids):
            raise ValueError("duplicate coflow ids in the workload")
        order = sorted(range(len(coflows)), key=lambda i: coflows[i].arrival_s)
        self.arrivals = [coflows[i] for i in order]
        self.next_arrival = 0
        self.changes = sorted(changes, key=lambda ch: ch.time_s)
        self.next_change = 0
        self.results = {
            c.id: CoflowResult(
                c.id, c.arrival_s, deadline_s=c.deadline_s, gamma_empty_s=gammas.get(c.id)
            )
            for c in coflows
        }
        self.order = ids
        make = bundle_wan_flows if bundle else unbundled_wan_flows
        self.wan = {c.id: make(c) for c in coflows}
        flows = [f for c in self.arrivals for f in self.wan[c.id].flows]
        self.src = [f.src for f in flows]
        self.dst = [f.dst for f in flows]
        self.size = np.array([f.bytes for f in flows], dtype=float)
        self.rem = self.size.copy()
        self.zero_sized = bool((self.size <= 0).any())  # see _finish_flows
        self.rate = np.zeros(len(flows))
        self.owner: list[str] = [c.id for c in self.arrivals for _ in self.wan[c.id].flows]
        self.owner_ids: list[str] = [f.id for f in flows]
        # for policies with pair_levels (pair-symmetric baselines): DC pair and members per flow
        self.by_table = isinstance(policy, PairTablePolicy)
        self.by_pair = not self.by_table and isinstance(policy, PairLevelsPolicy)
        self.table: tuple | None = None  # the policy's PairTable and its entries, see _table
        self.pairs = list(dict.fromkeys(zip(self.src, self.dst, strict=True)))
        self.pair_index = {pair: i for i, pair in enumerate(self.pairs)}
        self.pair_objects = np.empty(len(self.pairs), dtype=object)  # self.pairs, for takes
        for i, pair in enumerate(self.pairs):
            self.pair_objects[i] = pair
        self.pair_of = np.array([self.pair_index[(f.src, f.dst)] for f in flows], dtype=np.intp)
        self.members = np.array([flow_count(f) for f in flows], dtype=float)
        self.alive = np.zeros(len(flows), dtype=bool)  # admitted and not finished
        # table policies: live members per pair, kept as flows come and go (whole numbers,
        # so the sums are exact: the bincount over the live flows to the bit)
        self.pair_members = np.zeros(len(self.pairs))
        self.next_finish: float | None = None  # _allocate_by_table's answer to _step's min
        self.live = np.zeros(0, dtype=np.intp)  # positions where alive, ascending
        # by_coflow: the live flows' index in their coflow, remaining bytes and rate, in live
        # order (kept up to date in place by _advance_live, so no gather or scatter per
        # event); there, live_rem holds the live flows' remaining bytes and self.rem[p] is
        # only brought up to date when the flow finishes or by _sync_rem, and self.rate is
        # not used
        self.live_local = np.zeros(0, dtype=np.intp)
        self.live_rem = np.zeros(0)
        self.live_rate = np.zeros(0)
        # for policies with coflow_rates (Varys, Rapier): per-coflow arrays
        pairwise = self.by_table or self.by_pair
        self.by_coflow = not pairwise and isinstance(policy, CoflowRatesPolicy)
        # for policies with group_rates (Terra): FlowGroups of the active flows, see _groups
        self.by_group = not pairwise and not self.by_coflow and isinstance(policy, GroupRatesPolicy)
        # {coflow id: (flows, DC pairs, each flow's pair slot, {pair: slot})} (see _groups)
        self.group_of: dict[str, tuple[int, list, np.ndarray, dict]] = {}
        self.layout: tuple[tuple, _Groups] | None = None
        self.path_rows: dict[tuple[str, ...], list[int]] = {}
        self.n_flows = {c.id: len(self.wan[c.id].flows) for c in coflows}
        self.link_row = {link: i for i, link in enumerate(self.topology.links)}
        self.route_cache: dict[str, list] = {}  # the route list kept per coflow, see _store_routes
        self.entry_start = np.zeros(len(flows), dtype=np.intp)  # see _store_routes
        self.entry_count = np.zeros(len(flows), dtype=np.intp)
        self.routed_members = np.zeros(len(flows))
        self.pool_rows = np.zeros(0, dtype=np.int32)  # (int32: fewer bytes read per event)
        self.pool_vals = np.zeros(0)
        self.pool_used = 0
        self.some_unrouted = False  # some route list kept so far leaves a flow unrouted
        self.hops: int | None = None  # entries of every flow kept so far if all equal, else 0
        self.single = True  # every route kept so far is one path with all the flow's members
        self.pair_path_cache: dict[int, tuple] = {}  # see _pair_path_entries
        # paths seen, numbered: path j crosses links path_rows[path_ptr[j]:path_ptr[j + 1]]
        self.path_col: dict[tuple[str, ...], int] = {}
        self.path_ptr_list = [0]
        self.path_rows_list: list[int] = []
        self.path_pair_list: list[int] = []  # index in self.pairs of a path's ends (-1: none)
        self.path_arrays: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None
        self.path_row_cache: dict[tuple[str, ...], list[int]] = {}  # see _link_rows_of
        starts = np.cumsum([0] + [len(self.wan[c.id].flows) for c in self.arrivals])
        self.start = {c.id: int(s) for c, s in zip(self.arrivals, starts, strict=False)}
        sizes = np.diff(starts)
        # per position, the flow's index in its coflow's flows (position - first position)
        self.local = np.arange(len(flows), dtype=np.intp) - np.repeat(starts[:-1], sizes)
        self.active: dict[str, _Active] = {}
        self.bytes_total = 0.0
        self.delivered = 0.0
        self.byte_hops = 0.0
        self.capacity_time = 0.0
        self.round_ms: list[float] = []
        self.wake: float | None = None  # the policy's next wakeup (see _wakeup)
        self.path_links: dict[tuple[str, ...], list[tuple[str, str]]] = {}
        self._total_capacity()

    # ---- the event loop -------------------------------------------------------------------

    def run(self) -> SimResult:
        wall = time.perf_counter()
        now = self._first_event_time()
        while True:
            self._apply_changes(now)
            self._admit_arrivals(now)
            if not self.active and self.next_arrival >= len(self.arrivals):
                break
            if not (self.by_table or self.by_coflow):  # (those set every live flow's rate)
                self.rate[self.live] = 0.0  # the other flows' rates are 0 already
            byte_hop_rate = self._allocate(now) if self.active else 0.0
            step = self._step(now)
            if step is None:
                break
            now = self._advance(now, step, byte_hop_rate)
        self._check_conservation()
        return self._result(now, time.perf_counter() - wall)

    def _first_event_time(self) -> float:
        times = [c.arrival_s for c in self.arrivals[:1]] + [ch.time_s for ch in self.changes[:1]]
        return min(times, default=0.0)

    def _apply_changes(self, now: float) -> None:
        changed = False
        while self.next_change < len(self.changes) and self.changes[self.next_change].time_s <= now:
            self.changes[self.next_change].apply(self.topology)
            self.next_change += 1
            changed = True
        if changed:
            self._total_capacity()
            self.table = None  # the policy's PairTable goes stale
            self.policy.wan_changed(now)

    def _admit_arrivals(self, now: float) -> None:
        while (
            self.next_arrival < len(self.arrivals)
            and self.arrivals[self.next_arrival].arrival_s <= now
        ):
            coflow = self.arrivals[self.next_arrival]
            self.next_arrival += 1
            self._admit(coflow, now)

    def _admit(self, coflow: Coflow, now: float) -> None:
        result = self.results[coflow.id]
        wan = self.wan[coflow.id]
        if not wan.flows:
            result.wan = False
            result.finish_s, result.cct_s = coflow.arrival_s, 0.0
            result.met_deadline = None if coflow.deadline_s is None else True
            self._tick()
            return
        if not self.policy.add_coflow(wan, now):
            result.admitted = False
            result.met_deadline = None if coflow.deadline_s is None else False
            self._tick()
            return
        first = self.start[coflow.id]
        pos = np.arange(first, first + len(wan.flows), dtype=np.intp)
        self.active[coflow.id] = _Active(pos)
        self.bytes_total += float(self.size[pos].sum())
        self.alive[pos] = True
        self.live = np.concatenate((self.live, pos))  # arrivals take ever larger positions
        if self.by_coflow:
            self.live_local = np.concatenate((self.live_local, self.local[pos]))
            self.live_rem = np.concatenate((self.live_rem, self.rem[pos]))
        if self.by_table:
            np.add.at(self.pair_members, self.pair_of[pos], self.members[pos])

    def _remaining(self) -> Remaining:
        rem, ids = self.rem, self.owner_ids
        return {
            cid: {ids[p]: r for p, r in zip(a.pos.tolist(), rem[a.pos].tolist(), strict=True)}
            for cid, a in self.active.items()
        }

    def _allocate(self, now: float) -> float:
        """Ask the policy for rates, check them, store them in self.rate (by_coflow: in
        self.live_rate, in live order).

        Returns the WAN byte-hop rate (bytes x hops per second) of the allocation.
        """
        if self.by_table:
            return self._allocate_by_table(now)
        if self.by_pair:
            return self._allocate_by_pair(now)
        if self.by_coflow:
            return self._allocate_by_coflow(now)
        if self.by_group:
            return self._allocate_by_group(now)
        remaining = self._remaining()
        t0 = time.perf_counter()
        alloc = self.policy.allocate(now, remaining)
        self.round_ms.append((time.perf_counter() - t0) * 1000.0)
        path_rate = self._take_rates(alloc)
        self._check_links(path_rate, now)
        return sum(r * (len(p) - 1) for p, r in path_rate.items())

    def _allocate_by_group(self, now: float) -> float:
        """`_allocate` for policies with ``group_rates(now, volumes)`` (Terra): the FlowGroup
        volumes are summed with np.bincount (sequential, in flow order: the same sums as
        `allocate`'s), the policy answers per FlowGroup, and each flow gets, path by path,
        (FlowGroup rate / volume) x its remaining bytes, added up in path order: the
        operations of policy.split_by_remaining and `_take_rates`, so the same rates.
        Checks: rates finite and >= 0, none for unknown coflows or FlowGroups, paths
        joining the FlowGroup's DCs over known links, link loads within capacity.

        Returns the WAN byte-hop rate (bytes x hops per second) of the allocation.
        """
        groups = self._groups()
        rem = self.rem[groups.pos]
        volume = np.bincount(groups.gid, weights=rem, minlength=groups.count).tolist()
        volumes = {
            cid: dict(zip(pairs, volume[base : base + len(pairs)], strict=True))
            for cid, (base, pairs, _) in groups.coflows.items()
        }
        t0 = time.perf_counter()
        answer = self.policy.group_rates(now, volumes)
        self.round_ms.append((time.perf_counter() - t0) * 1000.0)
        share_g: list[int] = []  # FlowGroup, path slot and rate / volume of every path rate
        share_j: list[int] = []
        share: list[float] = []
        rows: list[int] = []  # link rows and rates of the paths, for the loads
        loads: list[float] = []
        byte_hops = 0.0
        for cid, pair_rates in answer.items():
            entry = groups.coflows.get(cid)
            for pair, lst in pair_rates.items():
                g = None
                if entry is not None and pair in entry[2]:
                    g = entry[0] + entry[2][pair]
                j = 0
                for path, r in lst:
                    if not (0 <= r < float("inf")):
                        raise SimulationError(f"coflow {cid!r} pair {pair}: rate {r!r}")
                    if r == 0:
                        continue
                    if g is None:
                        raise SimulationError(
                            f"allocation gives coflow {cid!r} a rate on {pair}, where it has "
                            "no active flow"
                        )
                    if path[0] != pair[0] or path[-1] != pair[1]:
                        raise SimulationError(
                            f"coflow {cid!r}: path {path} does not join {pair[0]} and {pair[1]}"
                        )
                    ids = self.path_rows.get(path)
                    if ids is None:
                        ids = self.path_rows[path] = self._link_rows_of(path)
                    share_g.append(g)
                    share_j.append(j)
                    share.append(r / volume[g])
                    j += 1
                    rows.extend(ids)
                    loads.extend([r] * len(ids))
                    byte_hops += r * len(ids)
        if share:
            table = np.zeros((groups.count, max(share_j) + 1))
            table[share_g, share_j] = share
            per_flow = table[groups.gid]
            rate = np.zeros(len(rem))
            for j in range(table.shape[1]):  # path by path, as split_by_remaining's sum
                rate += per_flow[:, j] * rem
            self.rate[groups.pos] = rate
        load = np.bincount(
            np.asarray(rows, dtype=np.intp), weights=loads, minlength=len(self.link_row)
        )
        self._check_link_loads(load, now)
        return byte_hops

    def _groups(self) -> _Groups:
        """The FlowGroups of the active flows (`_Groups`), rebuilt only when a coflow
        arrived or lost flows since the last call (a coflow's flows only ever leave)."""
        key = tuple((cid, len(a.pos)) for cid, a in self.active.items())
        if self.layout is not None and self.layout[0] == key:
            return self.layout[1]
        pos, gid = [], []
        coflows: dict[str, tuple[int, list[tuple[str, str]], dict[tuple[str, str], int]]] = {}
        base = 0
        for cid, a in self.active.items():
            cached = self.group_of.get(cid)
            if cached is None or cached[0] != len(a.pos):
                pairs, local = self._coflow_groups(a.pos)
                where = {pair: i for i, pair in enumerate(pairs)}
                cached = self.group_of[cid] = (len(a.pos), pairs, local, where)
            _, pairs, local, where = cached
            coflows[cid] = (base, pairs, where)
            pos.append(a.pos)
            gid.append(local + base)
            base += len(pairs)
        for cid in [c for c in self.group_of if c not in self.active]:
            del self.group_of[cid]
        groups = _Groups(
            np.concatenate(pos) if pos else np.zeros(0, dtype=np.intp),
            np.concatenate(gid) if gid else np.zeros(0, dtype=np.intp),
            base,
            coflows,
        )
        self.layout = (key, groups)
        return groups

    def _coflow_groups(self, pos: np.ndarray) -> tuple[list[tuple[str, str]], np.ndarray]:
        """(DC pairs of a coflow's flows at positions `pos`, in order of first appearance;
        each flow's index in that list), the FlowGroups `allocate` would form."""
        present, first, inverse = np.unique(
            self.pair_of[pos], return_index=True, return_inverse=True
        )
        order = np.argsort(first, kind="stable")
        rank = np.empty(len(order), dtype=np.intp)
        rank[order] = np.arange(len(order))
        pairs = [self.pairs[i] for i in present[order].tolist()]
        return pairs, rank[inverse.reshape(-1)]

    def _allocate_by_table(self, now: float) -> float:
        """`_allocate` for policies with ``pair_table`` / ``table_levels`` (per-flow,
        multipath): the pairs with active flows by index, in index order, with their active
        members; a flow of n members gets n times its pair's per-member rate on each path
        (the sum of its pair's path levels, in path order). Checks: finite rates >= 0, the
        table's paths joining their pair's DCs over known links (once per table), link loads.

        Returns the WAN byte-hop rate (bytes x hops per second) of the allocation.
        """
        live, count = self.live, self.pair_members
        active = np.flatnonzero(count)
        members = count[active]
        table, ptr, path_ptr, rows = self._table()
        t0 = time.perf_counter()
        level = np.asarray(self.policy.table_levels(now, table, active, members), dtype=float)
        self.round_ms.append((time.perf_counter() - t0) * 1000.0)
        path_ids = csr_ranges(ptr, active)
        if level.shape != path_ids.shape:
            raise SimulationError(f"{level.shape} per-path rates for {len(path_ids)} paths")
        bad = ~((level >= 0) & (level < float("inf")))
        if bad.any():
            path = table.paths[path_ids[bad.argmax()]]
            raise SimulationError(f"rate {float(level[bad][0])!r} per member on {path}")
        pair_pos = np.repeat(np.arange(len(active)), ptr[active + 1] - ptr[active])
        per_member = np.zeros(len(self.pairs))
        per_member[active] = np.bincount(pair_pos, weights=level, minlength=len(active))
        self.next_finish = _set_rates(
            live, self.pair_of, self.members, per_member, self.rate, self.rem
        )
        path_rate = members[pair_pos] * level
        hops = path_ptr[path_ids + 1] - path_ptr[path_ids]
        load = np.bincount(
            rows[csr_ranges(path_ptr, path_ids)],
            weights=np.repeat(path_rate, hops),
            minlength=len(self.link_row),
        )
        self._check_link_loads(load, now)
        return float(load.sum())

    def _table(self) -> tuple:
        """(the policy's PairTable of self.pairs, its pair -> paths pointers, and the
        simulator's own path -> link rows CSR: pointers and rows), asked for and checked
        once per WAN state: every path must join its pair's DCs over known links."""
        if self.table is None:
            table = self.policy.pair_table(self.pairs)
            ptr = np.asarray(table.ptr, dtype=np.intp)
            if ptr.shape != (len(self.pairs) + 1,) or ptr[-1] != len(table.paths):
                raise SimulationError(
                    f"pair table of {ptr.shape} pointers for {len(self.pairs)} pairs"
                )
            path_ptr, rows = [0], []
            pair_of_path = np.repeat(np.arange(len(self.pairs)), np.diff(ptr)).tolist()
            for path, i in zip(table.paths, pair_of_path, strict=True):
                rows.extend(self._link_rows_of(path))
                pair = self.pairs[i]
                if path[0] != pair[0] or path[-1] != pair[1]:
                    raise SimulationError(f"pair {pair}: path {path} does not join it")
                path_ptr.append(len(rows))
            self.table = (
                table,
                ptr,
                np.array(path_ptr, dtype=np.intp),
                np.array(rows, dtype=np.intp),
            )
        return self.table

    def _allocate_by_pair(self, now: float) -> float:
        """`_allocate` for policies with ``pair_levels(now, pairs, members)`` (pair_policy.py
        `PairPolicy`): one call per event with the active members per DC pair; a flow of
        n members gets n times its pair's per-member rate on each path. Checks: finite
        rates >= 0, paths joining their pair's DCs over known links, link loads.

        Returns the WAN byte-hop rate (bytes x hops per second) of the allocation.
        """
        alive = self.live
        pair_of = self.pair_of[alive]
        count = np.bincount(pair_of, weights=self.members[alive], minlength=len(self.pairs))
        present, first = np.unique(pair_of, return_index=True)
        order = present[np.argsort(first, kind="stable")]  # first appearance
        pairs = tuple(self.pair_objects[order].tolist())
        members = count[order]
        t0 = time.perf_counter()
        paths, pair, level = self.policy.pair_levels(now, pairs, members)
        self.round_ms.append((time.perf_counter() - t0) * 1000.0)
        pair, level = np.asarray(pair, dtype=np.intp), np.asarray(level, dtype=float)
        rows, cols = self._pair_path_entries(paths, pair, pairs, order)
        if level.shape != (len(paths),):
            raise SimulationError(f"{level.shape} per-path rates for {len(paths)} paths")
        bad = ~((level >= 0) & (level < float("inf")))
        if bad.any():
            raise SimulationError(
                f"rate {float(level[bad][0])!r} per member on {paths[bad.argmax()]}"
            )
        per_member = np.zeros(len(self.pairs))
        per_member[order] = np.bincount(pair, weights=level, minlength=len(pairs))
        self.rate[alive] = self.members[alive] * per_member[pair_of]
        path_rate = members[pair] * level
        load = np.bincount(rows, weights=path_rate[cols], minlength=len(self.link_row))
        self._check_link_loads(load, now)
        return float(load.sum())

    def _pair_path_entries(
        self, paths: list, pair: np.ndarray, pairs: tuple, order: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """The links x `paths` incidence as (link rows, path indices), int arrays with one
        entry per (path, link of it), after checking every path joins its pair's DCs
        (``pairs[pair[j]]``, whose index in self.pairs is ``order[pair[j]]``) over known
        links; cached (64 lists) while the policy hands back the same list for the same
        pairs."""
        cached = self.pair_path_cache.get(id(paths))
        if cached is not None and cached[0] is paths and cached[1] == pairs:
            return cached[2], cached[3]
        if pair.shape != (len(paths),) or (
            len(paths) and not 0 <= pair.min() <= pair.max() < len(pairs)
        ):
            raise SimulationError(f"pair indices {pair!r} do not fit {len(paths)} paths")
        cols = list(map(self.path_col.get, paths))
        if None in cols:
            for j, col in enumerate(cols):
                if col is None:
                    cols[j] = self._path_column(paths[j])
        ptr, link_rows, path_pair = self._path_arrays()
        cols = np.array(cols, dtype=np.intp)
        wrong = np.flatnonzero(path_pair[cols] != order[pair]) if len(paths) else []
        if len(wrong):
            j = int(wrong[0])
            raise SimulationError(f"pair {pairs[pair[j]]}: path {paths[j]} does not join it")
        entries = csr_ranges(ptr, cols)
        index = np.repeat(np.arange(len(paths), dtype=np.intp), ptr[cols + 1] - ptr[cols])
        if len(self.pair_path_cache) >= 64:
            self.pair_path_cache.clear()
        rows = link_rows[entries]
        self.pair_path_cache[id(paths)] = (paths, pairs, rows, index)  # holds paths: id unique
        return rows, index

    def _path_column(self, path: tuple[str, ...]) -> int:
        """Number of `path` among the paths seen (self.path_col), with its link rows and
        pair recorded on first use; SimulationError for an unknown link."""
        col = self.path_col.get(path)
        if col is None:
            rows = self._link_rows_of(path)
            col = self.path_col[path] = len(self.path_col)
            self.path_rows_list.extend(rows)
            self.path_ptr_list.append(len(self.path_rows_list))
            self.path_pair_list.append(self.pair_index.get((path[0], path[-1]), -1))
            self.path_arrays = None
        return col

    def _path_arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(ptr, link rows, pair) of the paths seen as arrays: path j crosses the links
        rows[ptr[j]:ptr[j + 1]] and joins the ends of self.pairs[pair[j]] (-1: no pair)."""
        if self.path_arrays is None:
            self.path_arrays = (
                np.array(self.path_ptr_list, dtype=np.intp),
                np.array(self.path_rows_list, dtype=np.intp),
                np.array(self.path_pair_list, dtype=np.intp),
            )
        return self.path_arrays

    def _allocate_by_coflow(self, now: float) -> float:
        """`_allocate` for policies with ``live_coflow_rates`` (madd.py `MaddPolicy`):
        the live flows (coflows in admission order, each one's flows in workload order)
        as one array of remaining bytes with each flow's index in its coflow, per-member
        rates back as one array and the routes as one list per coflow, turned into sparse
        incidence entries once per route list (`_store_routes`); the flows' rates go to
        self.live_rate, in live order, with the seconds to the first finish in
        self.next_finish. Checks: finite rates
        >= 0, none for unrouted flows, paths joining the flow's DCs over known links, link
        loads within capacity.

        Returns the WAN byte-hop rate (bytes x hops per second) of the allocation.
        """
        live = self.live  # ascending positions: coflow after coflow, in admission order
        cids = list(self.active)
        counts = [len(a.pos) for a in self.active.values()]
        t0 = time.perf_counter()
        rate, routes = self.policy.live_coflow_rates(
            now, cids, counts, self.live_local, self.live_rem
        )
        self.round_ms.append((time.perf_counter() - t0) * 1000.0)
        rate = np.asarray(rate, dtype=float)
        if rate.shape != live.shape:
            raise SimulationError(f"{rate.shape} rates for {len(live)} flows")
        if len(routes) != len(cids):
            raise SimulationError(f"{len(routes)} route lists for {len(cids)} coflows")
        for cid, route_list in zip(cids, routes, strict=True):
            if self.route_cache.get(cid) is not route_list:
                self._store_routes(cid, route_list)
        self.live_rate = np.empty(len(live))
        if self.hops:  # every route kept so far has `hops` entries: the pool is a matrix
            bad, load, self.next_finish = _store_hop_rates(
                live,
                rate,
                self.routed_members,
                self.live_rate,
                self.entry_start,
                self.pool_rows,
                self.pool_vals,
                self.hops,
                self.single,
                len(self.link_row),
                self.some_unrouted,
                self.live_rem,
            )
            if bad >= 0:
                self._rate_fault(live, rate, bad)
        else:
            members = self.routed_members[live]
            bad = _first_bad_rate(rate, members, self.some_unrouted)
            if bad >= 0:
                self._rate_fault(live, rate, bad)
            np.multiply(members, rate, out=self.live_rate)
            self.next_finish = _next_finish(np.arange(len(live)), self.live_rem, self.live_rate)
            nnz = self.entry_count[live]
            entry = _ranges(self.entry_start[live], nnz)
            rows = self.pool_rows[entry]
            weights = self.pool_vals[entry] * rate[np.repeat(np.arange(len(live)), nnz)]
            load = np.bincount(rows, weights=weights, minlength=len(self.link_row)).astype(float)
        self._check_link_loads(load, now)
        return float(load.sum())

    def _rate_fault(self, live: np.ndarray, rate: np.ndarray, k: int) -> None:
        """Raise SimulationError for the live flow at index k, whose per-member rate is
        not finite and >= 0 or is positive with no member routed."""
        cid = self.owner[int(live[k])]
        if not (rate[k] >= 0 and rate[k] < float("inf")):
            raise SimulationError(f"coflow {cid!r}: rate {float(rate[k])!r}")
        raise SimulationError(f"coflow {cid!r}: rate for an unrouted flow")

    def _store_routes(self, cid: str, routes: list) -> None:
        """Check a coflow's route list (one Route per flow, in workload order: every path
        joins the flow's DCs over known links) and keep it as sparse incidence entries: for
        each of its flows at position p, entry_count[p] entries from entry_start[p] in
        pool_rows (link row) and pool_vals (members crossing), one per (path, link of the
        path); routed_members[p] = the members routed. Entries are appended (a run's pool
        grows with its route lists, about one entry per flow and hop). Also notes whether
        some flow is unrouted, whether every flow so far has the same number of entries
        (`hops`), which lets `_allocate_by_coflow` skip a check and gather entries as a
        matrix, and whether every route so far is one path with all its members (`single`:
        each entry's members are then the flow's routed members)."""
        a = self.start[cid]
        b = a + self.n_flows[cid]
        if len(routes) != b - a:
            raise SimulationError(f"coflow {cid!r}: {len(routes)} routes for {b - a} flows")
        rows: list[int] = []
        vals: list[float] = []
        count = np.zeros(b - a, dtype=np.intp)
        members = np.zeros(b - a)
        for j, route in enumerate(routes):
            pos = a + j
            for path, n in route:
                if path[0] != self.src[pos] or path[-1] != self.dst[pos]:
                    raise SimulationError(
                        f"coflow {cid!r} flow {self.owner_ids[pos]!r}: path {path} does not "
                        f"join {self.src[pos]} and {self.dst[pos]}"
                    )
                hit = self._link_rows_of(path)
                rows.extend(hit)
                vals.extend([n] * len(hit))
                count[j] += len(hit)
                members[j] += n
        used = self.pool_used
        if used + len(rows) > len(self.pool_rows):
            size = max(2 * len(self.pool_rows), used + len(rows))
            zeros = np.zeros(size - used, np.int32)
            self.pool_rows = np.concatenate((self.pool_rows[:used], zeros))
            self.pool_vals = np.concatenate((self.pool_vals[:used], np.zeros(size - used)))
        self.pool_rows[used : used + len(rows)] = rows
        self.pool_vals[used : used + len(rows)] = vals
        self.pool_used = used + len(rows)
        self.entry_start[a:b] = used + np.cumsum(count) - count
        self.entry_count[a:b] = count
        self.routed_members[a:b] = members
        self.some_unrouted = self.some_unrouted or bool((members == 0).any())
        self.single = self.single and all(len(route) == 1 for route in routes)
        if self.hops is None:
            self.hops = int(count[0]) if len(count) else None
        if self.hops and (count != self.hops).any():
            self.hops = 0  # from now on, always the general gather
        self.route_cache[cid] = routes

    def _link_rows_of(self, path: tuple[str, ...]) -> list[int]:
        """Rows (self.link_row) of a path's links, cached per path; SimulationError for an
        unknown link."""
        rows = self.path_row_cache.get(path)
        if rows is None:
            rows = []
            for link in path_links(path):
                if link not in self.link_row:
                    raise SimulationError(f"allocation uses unknown link {link}")
                rows.append(self.link_row[link])
            self.path_row_cache[path] = rows
        return rows

    def _check_link_loads(self, load: np.ndarray, now: float) -> None:
        """Raise SimulationError if a link (in self.link_row order) is loaded above capacity."""
        avail = self.avail  # in self.link_row order (topology.links is sorted)
        over = np.flatnonzero(load > avail * (1 + _CAPACITY_REL))
        if over.size:
            link = self.topology.links[over[0]]
            raise SimulationError(
                f"t={now:.6f}s: link {link[0]}-{link[1]} loaded {load[over[0]]:.6g} B/s, "
                f"available {avail[over[0]]:.6g} B/s (policy {self.policy.name})"
            )

    def _take_rates(self, alloc: Allocation) -> dict[tuple[str, ...], float]:
        path_rate: dict[tuple[str, ...], float] = {}
        positions: list[int] = []
        totals: list[float] = []
        src, dst = self.src, self.dst
        for cid, flows in alloc.items():
            active = self.active.get(cid)
            if active is None:
                if flows:
                    raise SimulationError(f"allocation names coflow {cid!r}, which is not active")
                continue
            pos_of = {self.owner_ids[p]: p for p in active.pos.tolist()}
            for fid, path_rates in flows.items():
                pos = pos_of.get(fid)
                if pos is None:
                    if any(r for _, r in path_rates):
                        raise SimulationError(
                            f"coflow {cid!r}: rate for unknown or done flow {fid!r}"
                        )
                    continue
                total = 0.0
                for path, r in path_rates:
                    if r > 0:
                        if path[0] != src[pos] or path[-1] != dst[pos]:
                            raise SimulationError(
                                f"coflow {cid!r} flow {fid!r}: path {path} does not join "
                                f"{src[pos]} and {dst[pos]}"
                            )
                        path_rate[path] = path_rate.get(path, 0.0) + r
                        total += r
                    elif r != 0:
                        raise SimulationError(f"coflow {cid!r} flow {fid!r}: rate {r!r}")
                if not total < float("inf"):
                    raise SimulationError(f"coflow {cid!r} flow {fid!r}: rate {total!r}")
                positions.append(pos)
                totals.append(total)
        self.rate[positions] = totals
        return path_rate

    def _check_links(self, path_rate: dict[tuple[str, ...], float], now: float) -> None:
        load: dict[tuple[str, str], float] = {}
        cache = self.path_links
        for path, r in path_rate.items():
            links = cache.get(path)
            if links is None:
                links = cache[path] = path_links(path)
            for link in links:
                load[link] = load.get(link, 0.0) + r
        for link, used in load.items():
            if link not in self.topology.capacity:
                raise SimulationError(f"t={now:.6f}s: allocation uses unknown link {link}")
            avail = self.topology.available(link)
            if used > avail * (1 + _CAPACITY_REL):
                raise SimulationError(
                    f"t={now:.6f}s: link {link[0]}-{link[1]} loaded {used:.6g} B/s, "
                    f"available {avail:.6g} B/s (policy {self.policy.name})"
                )

    def _step(self, now: float) -> float | None:
        """Seconds to the next event, or None when nothing will ever happen again."""
        step = self.next_finish
        if step is None:
            step = _next_finish(self.live, self.rem, self.rate)
        self.next_finish = None
        if self.next_arrival < len(self.arrivals):
            step = min(step, self.arrivals[self.next_arrival].arrival_s - now)
        if self.next_change < len(self.changes):
            step = min(step, self.changes[self.next_change].time_s - now)
        self.wake = self._wakeup(now)
        if self.wake is not None:
            step = min(step, self.wake - now)
        return None if step == float("inf") else max(step, 0.0)

    def _wakeup(self, now: float) -> float | None:
        """The policy's next_wakeup(now) (seconds, > now) when it has one and a WAN flow
        is active (e.g. TerraPolicy's aged guard: a coflow starts starving), else None."""
        ask = getattr(self.policy, "next_wakeup", None)
        if ask is None or not self.active:
            return None
        wake = ask(now)
        return wake if wake is not None and wake > now else None

    def _advance(self, now: float, step: float, byte_hop_rate: float) -> float:
        """Move every flow `step` seconds on at its rate, finish those that reach 0 bytes
        (see the module docstring), and return the time of the next event."""
        limit = step * (1 + _FINISH_REL)
        if self.by_coflow:
            moved, done, n_kept = _advance_live(
                self.live,
                self.live_local,
                self.live_rem,
                self.live_rate,
                self.rem,
                step,
                limit,
                _FINISH_BYTES,
            )
            kept = self.live[:n_kept]
            self.live_local, self.live_rem = self.live_local[:n_kept], self.live_rem[:n_kept]
        else:
            moved, done, kept = _advance_flows(
                self.live, self.rem, self.rate, step, limit, _FINISH_BYTES
            )
        self.delivered += float(moved.sum())  # numpy's pairwise sum, as before
        self.byte_hops += byte_hop_rate * step
        if self.active:
            self.capacity_time += self.capacity_sum * step
        now += step
        if self.next_arrival < len(self.arrivals):  # land exactly on arrival / change times
            now = min(now, self.arrivals[self.next_arrival].arrival_s)
        if self.next_change < len(self.changes):
            now = min(now, self.changes[self.next_change].time_s)
        if self.wake is not None:
            now = min(now, self.wake)
        self._finish_flows(done, kept, now)
        return now

    def _sync_rem(self) -> None:
        """Bring self.rem of the live flows up to date (by_coflow keeps it in live_rem)."""
        if self.by_coflow:
            self.rem[self.live] = self.live_rem

    def _finish_flows(self, positions: np.ndarray, kept: np.ndarray, now: float) -> None:
        """Retire the flows at `positions` (their bytes all delivered; `kept` = the live
        flows without them, ascending): not alive, rate 0; coflows left without flows
        finish at `now`."""
        if not len(positions):
            return
        self.alive[positions] = False
        self.rate[positions] = 0.0
        self.live = kept
        if self.by_table:
            np.subtract.at(self.pair_members, self.pair_of[positions], self.members[positions])
        if self.zero_sized:
            self._sync_rem()
        owners = [self.owner[p] for p in positions.tolist()]
        at = 0
        for cid in dict.fromkeys(owners):  # (positions ascending: a coflow's are together)
            active = self.active[cid]
            ends = at + owners.count(cid)  # (few finish per event)
            if self.zero_sized:  # a flow of no bytes leaves with the next one that finishes
                active.pos = active.pos[self.rem[active.pos] > 0]
            else:  # the flows with no bytes left are exactly those that finished now
                gone = np.searchsorted(active.pos, positions[at:ends])
                active.pos = np.delete(active.pos, gone)
            at = ends
            if not len(active.pos):
                self._finish_coflow(cid, now)

    def _finish_coflow(self, cid: str, now: float) -> None:
        del self.active[cid]
        self.route_cache.pop(cid, None)
        result = self.results[cid]
        result.finish_s = now
        result.cct_s = now - result.arrival_s
        if result.deadline_s is not None:
            result.met_deadline = result.cct_s <= result.deadline_s * (1 + _FINISH_REL)
        self.policy.remove_coflow(cid, now)
        self._tick()

    # ---- bookkeeping ---------------------------------------------------------------------

    def _tick(self) -> None:
        if self.progress is not None:
            self.progress.update(1)

    def _total_capacity(self) -> None:
        self.capacity_sum = sum(self.topology.available(link) for link in self.topology.links)
        self.avail = np.array([self.topology.available(link) for link in self.topology.links])

    def _check_conservation(self) -> None:
        self._sync_rem()
        remaining = sum(float(self.rem[a.pos].sum()) for a in self.active.values())
        # rem of active flows plus everything delivered must equal what was admitted
        error = abs(self.delivered + remaining - self.bytes_total)
        if error > _CONSERVE_REL * max(self.bytes_total, 1.0):
            raise SimulationError(
                f"bytes not conserved: delivered {self.delivered:.6g} + remaining "
                f"{remaining:.6g} != admitted {self.bytes_total:.6g}"
            )

    def _result(self, now: float, wall: float) -> SimResult:
        stats = getattr(self.policy, "stats", None)
        rounds, round_ms, lps = len(self.round_ms), self.round_ms, None
        if isinstance(stats, dict) and "rounds" in stats:
            rounds = int(stats["rounds"])
            round_ms = list(stats.get("round_ms", round_ms))
            if stats.get("lps") is not None and rounds:
                lps = stats["lps"] / rounds
        util = self.byte_hops / self.capacity_time if self.capacity_time > 0 else None
        return SimResult(
            scheduler=self.policy.name,
            coflows=[self.results[cid] for cid in self.order],
            wan_utilization=util,
            rounds=rounds,
            round_ms=round_ms,
            lps_per_round=lps,
            bytes_total=self.bytes_total,
            bytes_delivered=self.delivered,
            end_s=now,
            wall_s=wall,
        )


# ---- compiled passes over the live flows (numba) -------------------------------------------
# Each does the float operations of the numpy expressions it replaced, in their order, so
# every rate, remaining byte count and finish time is the same to the bit; the callers check
# nothing here that they did not check before.


@njit(cache=True, error_model="numpy")
def _set_rates(live, pair_of, members, per_member, rate, rem):  # pragma: no cover - compiled
    """``rate[live] = members[live] * per_member[pair_of[live]]`` (bytes/s), in place, and
    what `_next_finish(live, rem, rate)` then answers (seconds), in the same pass.

    Args:
        live: int array of flow positions; pair_of: int array (flows,) of pair indices;
        members: float array (flows,); per_member: float array (pairs,) of bytes/s;
        rate: float array (flows,), written; rem: float array (flows,) of bytes.
    """
    best = np.inf
    for p in live:
        r = members[p] * per_member[pair_of[p]]
        rate[p] = r
        if r > 0 and not np.isnan(best):
            t = rem[p] / r
            if t < best or np.isnan(t):
                best = t
    return best


@njit(cache=True, error_model="numpy")
def _next_finish(live, rem, rate):  # pragma: no cover - compiled
    """Seconds until the first live flow with a positive rate finishes at its rate (the
    smallest rem / rate; inf when none moves).

    Args:
        live: int array of flow positions; rem: float array (flows,) of remaining bytes;
        rate: float array (flows,) of bytes/s.
    """
    best = np.inf
    for p in live:
        r = rate[p]
        if r > 0:
            t = rem[p] / r
            if t < best or np.isnan(t):
                best = t
                if np.isnan(t):
                    break
    return best


@njit(cache=True, error_model="numpy")
def _moved_on(before, r, step, limit, finish_bytes):  # pragma: no cover - compiled
    """One flow's remaining bytes after `step` seconds at `r` bytes/s (> 0), and whether it
    finishes: when before / r <= `limit` (seconds) or what is left is <= `finish_bytes`,
    and then 0.0 bytes are left. The finish rule of `_advance_flows` and `_advance_live`."""
    after = before - r * step
    if before / r <= limit or after <= finish_bytes:
        return 0.0, True
    return after, False


@njit(cache=True, error_model="numpy")
def _advance_flows(live, rem, rate, step, limit, finish_bytes):  # pragma: no cover - compiled
    """Move the live flows with a positive rate `step` seconds on, in place in `rem`; a
    flow whose rem / rate <= `limit` (seconds) or whose remaining bytes after the step are
    <= `finish_bytes` finishes (its remaining bytes become 0).

    Args:
        live: int array of flow positions, ascending; rem, rate: float arrays (flows,) of
            bytes and bytes/s; step, limit: seconds; finish_bytes: bytes.

    Returns:
        (bytes each moving flow delivered, float array in position order; positions of the
        flows that finished, int array, ascending; the other live flows, ascending).
    """
    n = len(live)
    moved = np.empty(n)
    done = np.empty(n, dtype=np.intp)
    kept = np.empty(n, dtype=np.intp)
    k = 0
    d = 0
    n_kept = 0
    for i in range(n):
        p = live[i]
        r = rate[p]
        finished = False
        if r > 0:
            before = rem[p]
            after, finished = _moved_on(before, r, step, limit, finish_bytes)
            if finished:
                done[d] = p
                d += 1
            moved[k] = before - after
            rem[p] = after
            k += 1
        if not finished:
            kept[n_kept] = p
            n_kept += 1
    return moved[:k], done[:d], kept[:n_kept]


@njit(cache=True, error_model="numpy")
def _advance_live(
    live, tag, live_rem, live_rate, rem, step, limit, finish_bytes
):  # pragma: no cover - compiled
    """`_advance_flows` on flows kept in live order, in place: the live flows with a
    positive rate move `step` seconds on in `live_rem`; a flow whose remaining bytes /
    rate <= `limit` (seconds) or whose remaining bytes after the step are <= `finish_bytes`
    finishes: its remaining bytes become 0 in `rem` and its entries leave `live`, `tag`
    and `live_rem`, the others moving forward in order (the first n_kept entries are then
    the kept flows'; `live_rate` is left as it is). The same float operations as
    `_advance_flows`, so the same bytes to the bit.

    Args:
        live: int array (n,) of flow positions, ascending; tag: int array (n,) of values
            carried along (each flow's index in its coflow); live_rem, live_rate: float
            arrays (n,) of each live flow's remaining bytes and bytes/s; rem: float array
            (flows,) of bytes by position; step, limit: seconds; finish_bytes: bytes.

    Returns:
        (bytes each moving flow delivered, float array in live order; positions of the
        flows that finished, int array, ascending; n_kept, the number of flows left).
    """
    n = len(live)
    moved = np.empty(n)
    done = np.empty(n, dtype=np.intp)
    k = 0
    d = 0
    n_kept = 0
    for i in range(n):
        r = live_rate[i]
        if r > 0:
            before = live_rem[i]
            after, finished = _moved_on(before, r, step, limit, finish_bytes)
            moved[k] = before - after
            k += 1
            if finished:
                rem[live[i]] = after
                done[d] = live[i]
                d += 1
                continue
            live_rem[i] = after
        if n_kept != i:
            live[n_kept] = live[i]
            tag[n_kept] = tag[i]
            live_rem[n_kept] = live_rem[i]
        n_kept += 1
    return moved[:k], done[:d], n_kept


@njit(cache=True)
def _first_bad_rate(rate, members, some_unrouted):  # pragma: no cover - compiled
    """Index of the first per-member rate that is not finite and >= 0 (NaN included),
    else, when `some_unrouted`, of the first positive rate with 0 members routed; -1 if
    none. rate, members: float arrays of the same length."""
    for i in range(len(rate)):
        if not (rate[i] >= 0 and rate[i] < np.inf):
            return i
    if some_unrouted:
        for i in range(len(rate)):
            if rate[i] > 0 and members[i] == 0:
                return i
    return -1


@njit(cache=True, error_model="numpy")
def _store_hop_rates(
    live,
    per_member,
    routed_members,
    rate,
    entry_start,
    pool_rows,
    pool_vals,
    hops,
    single,
    n_rows,
    some_unrouted,
    live_rem,
):  # pragma: no cover - compiled
    """``rate[:] = routed_members[live] * per_member`` (bytes/s, in live order: rate is a
    float array (len(live),)), the link loads it puts on the `n_rows` link rows, when
    every flow has `hops` pool entries from entry_start (flow position order, then hop
    order: np.bincount's order of old), and the seconds to the first finish (the smallest
    live_rem / rate over positive rates, as `_next_finish`), all in one pass; live_rem:
    float array (len(live),), the live flows' remaining bytes, in live order; single: every
    flow's route is one path with all its routed members (each entry's value is then the
    flow's routed members, and the loads add the flow's rate: the same floats, without
    reading pool_vals).

    Returns:
        (index into `live` of a faulty rate or -1: the first that is not finite and >= 0,
        else, when `some_unrouted`, the first positive one with no member routed (the
        caller raises; what was written then does not matter); float array (n_rows,) of
        bytes/s per link row; seconds to the first finish).
    """
    load = np.zeros(n_rows)
    h0, a0, h1, a1 = -1, 0.0, -1, 0.0  # link rows summed in registers (maxmin.add_held)
    unrouted = -1
    best = np.inf
    for i in range(len(live)):
        p = live[i]
        r = per_member[i]
        if not (r >= 0 and r < np.inf):
            return i, load, best
        members = routed_members[p]
        if some_unrouted and unrouted < 0 and r > 0 and members == 0:
            unrouted = i
        flow_rate = members * r
        rate[i] = flow_rate
        start = entry_start[p]
        if single and hops == 2:  # (bigswitch's routes; the loop below, unrolled)
            # (flow_rate = pool_vals[start] * r: the same floats; flows to one DC follow
            # each other: each hop's loads are summed in a register, the same floats)
            h0, a0, h1, a1 = add_held(load, pool_rows[start], flow_rate, 0, h0, a0, h1, a1)
            h0, a0, h1, a1 = add_held(load, pool_rows[start + 1], flow_rate, 1, h0, a0, h1, a1)
        else:
            for h in range(start, start + hops):
                load[pool_rows[h]] += pool_vals[h] * r
        if flow_rate > 0 and not np.isnan(best):
            t = live_rem[i] / flow_rate
            if t < best or np.isnan(t):
                best = t
    flush_held(load, h0, a0, h1, a1)
    return unrouted, load, best
