"""Guaranteed reservations: a tenant's guaranteed rate between two DCs for a time window,
admitted only if every admitted guarantee fits the WAN under every single link failure its
tunnels route around, and enforced in each round before the tenants share the rest
(docs/design.md section 4.5, "Guaranteed reservations").

Sources: YARN's network bandwidth as a schedulable resource (a container's guaranteed
outbound rate, enforced with Linux tc HTB classes, whose `rate` is the guarantee and `ceil`
the most it may borrow when others leave bandwidth unused); HUG (Chowdhury et al., NSDI
2016) for how the rest is divided; Terra's K tunnels per DC pair (docs/design.md 5) for
routing a guarantee over several paths.

Admission (`admission`). For the reservations R whose windows overlap at some instant (the
sets active at each reservation's start: the maximal sets of intervals that overlap), with
rate g_r bytes/s on pair k_r, the K tunnels P_k of each pair on the whole WAN and a
scenario f (no failure, or one link down both ways), the guarantees fit when the LP

    Σ_{p ∈ P_k, f ∉ p} x_{k,p} = Σ_{r: k_r = k} g_r        every pair k
    Σ_{(k,p): e ∈ p} x_{k,p}     ≤ c_e                       every link e ≠ f
    x ≥ 0

is feasible: Optimization (1) (4.1) of one "coflow" of volume Σ g_r on each pair has
Γ ≤ 1 s (min_cct, HiGHS). A failure is *covered* when every pair of the set keeps at least
one of its tunnels: the paths recomputed after it (K shortest over the links left, ranked by
an order that does not depend on the graph) include every surviving tunnel, so what fits on
the survivors fits on the new tunnels too. A failure that cuts every tunnel of a pair is not
covered for that pair (no routing could keep its guarantee) and is listed, not refused;
the other pairs' guarantees are still checked under it.

Enforcement (`floors`): in a round, every active reservation whose tenant has bytes waiting
on its pair gets its rate first, routed over the pair's current tunnels on the links up
(the same LP, scaled to exactly g_r when Γ ≤ 1; all floors scaled by 1/Γ when a failure
that is not covered leaves less); `held_load` is the load the other tenants' guarantees
put on each link (deadline admission counts it as taken); `cap_ceilings` keeps a tenant's
rate on a pair at or below its ceiling.
"""

from __future__ import annotations

import math
from collections.abc import Set as AbstractSet
from dataclasses import dataclass

from terra_core.min_cct import Pair, PairRates, min_cct
from terra_model.reservation_shape import shape_problem
from topologies import Link, Path, Topology
from topologies.paths import all_pairs_paths

FIT_TOL = 1e-9  # relative: Γ up to 1 + FIT_TOL counts as fitting (solver round-off)


class ReservationError(ValueError):
    """A reservation is malformed or is refused; the message is one line naming why."""


@dataclass(frozen=True)
class Reservation:
    """A tenant's guaranteed rate on one ordered DC pair.

    Attributes:
        tenant: the tenant's name.
        src, dst: DC names (src != dst).
        rate: the guaranteed rate, bytes/s (> 0, finite).
        ceil: the most the tenant's traffic on the pair may get, bytes/s (>= rate;
            None: no ceiling, borrowing as far as the sharing gives).
        start, end: the window, seconds on the scheduler's clock (start < end; defaults:
            always).
    """

    tenant: str
    src: str
    dst: str
    rate: float
    ceil: float | None = None
    start: float = -math.inf
    end: float = math.inf

    @property
    def pair(self) -> Pair:
        """(src, dst)."""
        return (self.src, self.dst)

    def active(self, now: float) -> bool:
        """True when `now` (seconds) is inside [start, end)."""
        return self.start <= now < self.end

    def overlaps(self, start: float, end: float) -> bool:
        """True when the window meets [start, end)."""
        return self.start < end and start < self.end

    def describe(self) -> str:
        """ "tenant SRC->DST RATE B/s" for messages."""
        return f"{self.tenant} {self.src}->{self.dst} {self.rate:.6g} B/s"


def check_reservation(r: Reservation, topology: Topology) -> None:
    """Raise ReservationError (one line naming the problem) for a malformed reservation:
    unknown DC, or a shape reservation_shape.shape_problem refuses (src == dst, rate not
    positive and finite, ceil below rate, empty window)."""
    for dc in (r.src, r.dst):
        if dc not in topology.dcs:
            raise ReservationError(f"{r.tenant}: unknown DC {dc!r} (topology {topology.name})")
    problem = shape_problem(r.src, r.dst, r.rate, r.ceil, r.start, r.end)
    if problem is not None:
        raise ReservationError(f"{r.tenant} {r.src}->{r.dst}: {problem[0]}: {problem[1]}")


@dataclass
class Admission:
    """What `admission` found for a set of reservations.

    Attributes:
        ok: every guarantee fits with no failure and under every covered failure.
        reason: one line naming the scenario and link that do not fit (None when ok).
        covered: undirected links (u, v), u < v, whose failure every overlapping set
            survives with a tunnel per pair and fits.
        uncovered: {link: "SRC->DST[, ...]"}: failures that cut every tunnel of a reserved
            pair (those pairs named); the other pairs were checked under them.
        lps: LPs solved.
    """

    ok: bool = True
    reason: str | None = None
    covered: list[Link] | None = None
    uncovered: dict[Link, str] | None = None
    lps: int = 0


def admission(reservations: list[Reservation], topology: Topology, k: int) -> Admission:
    """Check that all `reservations` fit the whole WAN (every link up) over their pairs'
    `k` tunnels, with no failure and under every single link failure the tunnels route
    around (module docstring).

    Raises:
        ReservationError: a malformed reservation, or a pair with no tunnel at all.
    """
    whole = topology.copy()
    whole.down = set()
    for r in reservations:
        check_reservation(r, whole)
    paths = all_pairs_paths(whole, k) if reservations else {}
    for r in reservations:
        if not paths.get(r.pair):
            raise ReservationError(f"{r.describe()}: no tunnel from {r.src} to {r.dst}")
    links = sorted({(u, v) if u < v else (v, u) for u, v in whole.capacity})
    out = Admission(covered=[], uncovered={})
    for group in overlapping_sets(reservations):
        refusals: list[tuple[float, str]] = []
        for failed in [None, *links]:
            why = _fits(group, paths, whole.capacity, failed, out)
            if why is not None:
                refusals.append(why)
            if failed is None and refusals:
                break  # it does not fit with every link up: that is the reason
        if refusals:
            fit, reason = min(refusals, key=lambda x: x[0])  # the worst; ties: the first
            more = f" (and {len(refusals) - 1} other failures)" if len(refusals) > 1 else ""
            out.ok, out.reason = False, reason.replace(" down:", f" down{more}:", 1)
            return out
    out.covered = [e for e in links if e not in out.uncovered]  # type: ignore[operator]
    return out


def overlapping_sets(reservations: list[Reservation]) -> list[list[Reservation]]:
    """The distinct sets of reservations active together at some instant: those active at
    each reservation's start (every maximal set of overlapping intervals is one of them)."""
    seen: set[tuple[int, ...]] = set()
    out = []
    for r in reservations:
        ids = tuple(i for i, s in enumerate(reservations) if s.active(r.start))
        if ids not in seen:
            seen.add(ids)
            out.append([reservations[i] for i in ids])
    return [g for g in out if not any(set(map(id, g)) < set(map(id, h)) for h in out)]


def _fits(
    group: list[Reservation],
    paths: dict[Pair, list[Path]],
    capacity: dict[Link, float],
    failed: Link | None,
    out: Admission,
) -> tuple[float, str] | None:
    """None when `group` fits with `failed` down, else (the fraction that fits, the reason).
    A pair whose every tunnel the failure cuts is left out (recorded in out.uncovered); the
    other pairs are still checked."""
    cap = dict(capacity)
    if failed is not None:
        u, v = failed
        cap.pop((u, v), None)
        cap.pop((v, u), None)
    volumes: dict[Pair, float] = {}
    for r in group:
        volumes[r.pair] = volumes.get(r.pair, 0.0) + r.rate
    for pair in list(volumes):
        if failed is not None and not any(_survives(p, cap) for p in paths[pair]):
            name, had = f"{pair[0]}->{pair[1]}", out.uncovered.get(failed)  # type: ignore[union-attr]
            if had is None or name not in had.split(", "):
                out.uncovered[failed] = name if had is None else f"{had}, {name}"  # type: ignore[index]
            del volumes[pair]
    res = min_cct(volumes, paths, cap, fewest_link_bytes=False)
    out.lps += res.lp_solved
    if res.gamma_s <= 1.0 + FIT_TOL:
        return None
    where = "with every link up" if failed is None else f"with link {failed[0]}-{failed[1]} down"
    worst = max(res.prices, key=lambda e: res.prices[e], default=None)
    link = f"; bottleneck link {worst[0]}->{worst[1]}" if worst else ""
    names = ", ".join(r.describe() for r in group)
    return 1.0 / res.gamma_s, (f"does not fit {where}: the guarantees active together "
                               f"({names}) fit only {100.0 / res.gamma_s:.1f} %{link}")  # fmt: skip


def _survives(path: Path, capacity: dict[Link, float]) -> bool:
    return all((a, b) in capacity for a, b in zip(path, path[1:], strict=False))


def floors(
    targets: dict[tuple[str, Pair], float],
    paths: dict[Pair, list[Path]],
    capacity: dict[Link, float],
) -> dict[tuple[str, Pair], list[tuple[Path, float]]]:
    """Route guaranteed rates over the current tunnels (module docstring: enforcement).

    Args:
        targets: {(tenant, pair): bytes/s > 0} (the active guarantees with demand).
        paths: {pair: [path, ...]} (current tunnels; pairs without one are skipped).
        capacity: {link: bytes/s} of the links up.

    Returns:
        {(tenant, pair): [(path, bytes/s)]}: exactly the target per key when all fit,
        else every key's target scaled by the same factor (the largest that fits).
    """
    merged: dict[Pair, float] = {}
    for (_, pair), g in targets.items():
        if g > 0 and paths.get(pair):
            merged[pair] = merged.get(pair, 0.0) + g
    if not merged:
        return {}
    res = min_cct(merged, paths, capacity)
    if math.isinf(res.gamma_s):  # some pair lost every tunnel up: route the others
        merged = {k: v for k, v in merged.items() if min_cct({k: v}, paths, capacity).rates}
        res = min_cct(merged, paths, capacity) if merged else res
    scale = min(1.0, res.gamma_s) if 0 < res.gamma_s < math.inf else 0.0
    out = {}
    for (tenant, pair), g in targets.items():
        lst = res.rates.get(pair)
        if g > 0 and lst:
            out[(tenant, pair)] = [(p, x * scale * g / merged[pair]) for p, x in lst]
    return out


def held_load(
    reservations: list[Reservation],
    paths: dict[Pair, list[Path]],
    capacity: dict[Link, float],
) -> dict[Link, float]:
    """{link: bytes/s} the guarantees of `reservations` take when all are in use, routed
    as `floors` routes them (for deadline admission: capacity a deadline coflow of another
    tenant must not count on)."""
    targets: dict[tuple[str, Pair], float] = {}
    for r in reservations:
        key = (r.tenant, r.pair)
        targets[key] = targets.get(key, 0.0) + r.rate
    load: dict[Link, float] = {}
    for lst in floors(targets, paths, capacity).values():
        for p, x in lst:
            for e in zip(p, p[1:], strict=False):
                load[e] = load.get(e, 0.0) + x
    return load


def cap_ceilings(
    rates: dict[str, PairRates],
    tenant_of: dict[str, str],
    ceilings: dict[tuple[str, Pair], float],
    fixed: AbstractSet[str] = frozenset(),
) -> dict[str, PairRates]:
    """`rates` ({coflow: {pair: [(path, bytes/s)]}}) with each tenant's total on a pair
    scaled down to its ceiling where it is above (`ceilings`: {(tenant, pair): bytes/s}).
    The coflows of `fixed` (admitted deadline coflows, whose needs admission kept under
    the ceiling) are scaled only when they alone are above it; the others get what they
    leave of the ceiling."""
    total: dict[tuple[str, Pair], list[float]] = {}  # {key: [fixed total, others' total]}
    for cid, per in rates.items():
        for pair, lst in per.items():
            key = (tenant_of.get(cid, ""), pair)
            if key in ceilings:
                total.setdefault(key, [0.0, 0.0])[cid not in fixed] += sum(x for _, x in lst)
    over: dict[tuple[str, Pair], tuple[float, float]] = {}  # {key: (fixed, others' factor)}
    for key, (f, o) in total.items():
        ceil = ceilings[key]
        if f + o > ceil:
            over[key] = (1.0, (ceil - f) / o) if f <= ceil else (ceil / f, 0.0)
    if not over:
        return rates
    out: dict[str, PairRates] = {}
    for cid, per in rates.items():
        t, which = tenant_of.get(cid, ""), int(cid not in fixed)
        out[cid] = {
            pair: [(p, x * over[(t, pair)][which]) for p, x in lst] if (t, pair) in over else lst
            for pair, lst in per.items()
        }
    return out
