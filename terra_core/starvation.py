"""Starvation guards of Terra's round (docs/design.md section 4.2 steps 2 and 5).

Terra's round serves coflows smallest-Γ first, so a large coflow can be preempted
for as long as smaller coflows keep arriving. The paper's remedy (fixed guard)
holds back a share α of every link in every round and splits it max-min among
all preempted coflows; on the FB trace that reserve costs 6-8 % of the average
CCT (benchmarks/results/alpha0/README.md). The aged guards spend the reserve
only on coflows that have waited too long:

* ``fixed`` — the paper's (and the earlier default): α·c_e of every link is held
  back in every round and goes max-min to every preempted coflow (step 5).
* ``aged`` — a coflow C arriving at a_C with Γ_C (its minimum CCT alone on the
  WAN at arrival, K paths, Optimization (1)) *starves* from
  s_C = a_C + T_C on, with its patience T_C = max(factor·Γ_C, floor_s). In a
  round with starving coflows, the oldest one (smallest s_C, ties by arrival)
  that can reach the reserve gets its min-CCT allocation on α times the capacity
  the deadline coflows left (step 2'), before steps 3-4; the rest of the reserve
  and every round without a starving coflow run as α = 0. It takes part in steps
  3-4 and 6 as usual, on top of that.
* ``aged-fair`` — as ``aged``, but every starving coflow shares the reserve,
  max-min over their FlowGroups (step 5's rule restricted to starving coflows).

Guarantee of ``aged`` (static WAN: no link or capacity change, no admitted
deadline coflow, no flows added after arrival). Let Q_C be C together with the
coflows S still unfinished at s_C with s_S < s_C (or s_S = s_C and S arrived
first). Then

    CCT_C <= T_C + Σ_{S ∈ Q_C} Γ_S / α.

Why: from the round at s_S on, while S is the oldest starving coflow, it holds
min-CCT rates on α·c, which finish its remaining volume d in Γ(d)/α (Γ is
homogeneous of degree -1 in the capacities); later rounds recompute them on the
volume left (or reuse them scaled while they provably stay minimal, see
`serve_starving`), which is d shrunk at least in proportion (steps 3-4 and 6 only add
rate), so the finish time never moves later and S is head for at most
Γ(d)/α <= Γ_S/α. A coflow starving after s_C queues behind C. In particular a
coflow that is the only starving one finishes within T_C + Γ_C/α of its arrival.
The simulator (terra_sim/simulator.py) runs a round at every s_C
(`TerraPolicy.next_wakeup`); a controller with periodic rounds adds at most one
period to the bound.

``aged-fair`` gives each starving FlowGroup at least α·b/N bytes/s while N
starving FlowGroups share the reserve (b: the smallest bottleneck capacity of a
starving pair's shortest path; the equal split on shortest paths is feasible and
max-min does no worse for its smallest share); its bound grows with N, so it
has no fixed time bound.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

from terra_core.min_cct import Pair
from terra_core.path_masks import FULL, PathIndex, all_reachable, full_mask
from terra_core.residual_min_cct import min_cct_on_residual
from terra_core.round_fair_share import alpha_share
from terra_core.round_memo import RoundMemo
from terra_core.round_rates import PathRates, RoundResult, take
from topologies import Link, Path

GUARD_MODES = ("fixed", "aged", "aged-fair")
DEFAULT_GUARD = "aged"
DEFAULT_FACTOR = 2.0  # patience T = max(DEFAULT_FACTOR·Γ, DEFAULT_FLOOR_S)
DEFAULT_FLOOR_S = 1.0


@dataclass(frozen=True)
class Guard:
    """A starvation guard's settings.

    Attributes:
        mode: one of GUARD_MODES.
        alpha: reserve share α in [0, 1) of every link's capacity.
        factor: patience factor c >= 0 (aged modes): T_C = max(c·Γ_C, floor_s).
        floor_s: smallest patience in seconds >= 0 (aged modes).

    Raises:
        ValueError: a setting out of range, or an unknown mode.
    """

    mode: str = DEFAULT_GUARD
    alpha: float = 0.1
    factor: float = DEFAULT_FACTOR
    floor_s: float = DEFAULT_FLOOR_S

    def __post_init__(self) -> None:
        if self.mode not in GUARD_MODES:
            raise ValueError(f"guard must be one of {', '.join(GUARD_MODES)}, got {self.mode!r}")
        if not 0.0 <= self.alpha < 1.0:
            raise ValueError(f"alpha must be in [0, 1), got {self.alpha!r}")
        if not (self.factor >= 0.0 and math.isfinite(self.factor)):
            raise ValueError(f"guard factor must be a finite number >= 0, got {self.factor!r}")
        if not (self.floor_s >= 0.0 and math.isfinite(self.floor_s)):
            raise ValueError(f"guard floor must be a finite number >= 0 s, got {self.floor_s!r}")

    @property
    def aged(self) -> bool:
        """True for the modes that reserve only for starving coflows."""
        return self.mode != "fixed"

    def patience(self, gamma_s: float) -> float:
        """T = max(factor·Γ, floor_s) in seconds for a coflow with Γ = `gamma_s` seconds."""
        return max(self.factor * gamma_s, self.floor_s)


class StarvationClock:
    """When each active coflow starts starving (aged guards).

    Keeps {coflow id: (s, arrival rank)} with s = arrival + T in seconds.
    """

    def __init__(self, guard: Guard) -> None:
        self.guard = guard
        self._arrival: dict[str, float] = {}
        self._since: dict[str, tuple[float, int]] = {}
        self._seq = 0

    def start(self, cid: str, now: float, gamma_s: float) -> None:
        """Track coflow `cid` arriving at `now` (seconds) with Γ = `gamma_s` seconds.

        A coflow with Γ = inf (a FlowGroup with no path) never starves.
        """
        self._arrival[cid] = now
        self._since[cid] = (now + self.guard.patience(gamma_s), self._seq)
        self._seq += 1

    def update(self, cid: str, gamma_s: float) -> None:
        """New Γ (seconds) of a tracked coflow that got more flows: s = arrival + T(Γ).

        Unknown ids are ignored.
        """
        if cid in self._since:
            rank = self._since[cid][1]
            self._since[cid] = (self._arrival[cid] + self.guard.patience(gamma_s), rank)

    def forget(self, cid: str) -> None:
        """Stop tracking `cid` (finished, cancelled); unknown ids are ignored."""
        self._arrival.pop(cid, None)
        self._since.pop(cid, None)

    def starts(self, cid: str) -> float | None:
        """s_C in seconds (when `cid` starves), or None when it is not tracked."""
        entry = self._since.get(cid)
        return None if entry is None else entry[0]

    def starving(self, now: float, ids: Iterable[str]) -> list[str]:
        """The tracked coflows among `ids` with s <= `now` seconds, oldest first
        (smallest s, then arrival order)."""
        since = self._since
        out = [(since[c], c) for c in ids if c in since and since[c][0] <= now]
        out.sort()
        return [c for _, c in out]

    def next_wakeup(self, now: float) -> float | None:
        """The earliest s > `now` (seconds) of a tracked coflow, or None."""
        later = [s for s, _ in self._since.values() if s > now]
        return min(later) if later else None


def serve_starving(
    active: dict[str, dict[Pair, float]],
    starving: list[str],
    paths: dict[Pair, list[Path]],
    left: dict[Link, float],
    capacity: dict[Link, float],
    alpha: float,
    fair: bool,
    rates: dict[str, PathRates],
    result: RoundResult,
    index: PathIndex,
    memo: RoundMemo | None = None,
) -> None:
    """Step 2' of an aged guard: the reserve α·left to the starving coflows.

    Without `fair` (mode ``aged``), the first coflow of `starving` (oldest first)
    that can reach the reserve (every FlowGroup has a path whose links all have
    capacity left in it) gets its min-CCT allocation on α·left (fewest
    link-bytes among the optimal ones, min_cct.py); with `fair` (``aged-fair``)
    every starving coflow shares α·left max-min over its FlowGroups, as step 5.
    `left` (bytes/s per link) shrinks in place by what they take, so the unused
    reserve stays for steps 3-4.

    The reserve is the same round after round on a static WAN, and the starving
    coflow's volumes mostly shrink in proportion, so its allocation is kept in
    `memo` and reused, scaled, while the weak-duality bound proves it still minimal
    (residual_min_cct.min_cct_on_residual, the rule step 4 uses, exact up to its 1e-9
    relative slack on Γ, which the guarantee above then carries too): on the ATT trace
    93 % of these LPs (160-320 FlowGroups each) are skipped (docs/design.md 4.2).

    Args:
        active: {coflow id: {(src, dst): remaining bytes}}.
        starving: ids in starvation order (StarvationClock.starving); ids not in
            `active` must have been filtered out.
        paths: {(src, dst): [path, ...]}.
        left: {link: bytes/s} left after the deadline coflows (reduced in place).
        capacity: {link: bytes/s} of the round (for the "full" test).
        alpha: the reserve share in (0, 1).
        fair: share among all starving coflows instead of serving the oldest.
        rates: the round's {cid: {pair: {path: bytes/s}}} accumulator (in place).
        result: the round's RoundResult (its `lps` grows).
        index: the round's link bits and path masks (path_masks.PathIndex).
        memo: the round's memo (schedule_round's round_memo.RoundMemo; its `starving`
            entry), or None to solve every time.
    """
    pool = {link: alpha * c for link, c in left.items()}
    before = dict(pool)
    if fair:
        alpha_share(active, starving, paths, pool, capacity, rates, result, index)
    else:
        for cid in starving:
            full = full_mask(index, pool, capacity, FULL)
            if not all_reachable(active[cid], paths, index, full):
                continue
            res = min_cct_on_residual(cid, active[cid], paths, pool, memo, result, starving=True)
            if math.isinf(res.gamma_s):
                continue
            take(rates, cid, res.rates, pool, 1.0, index)
            break
    for link, c in before.items():
        left[link] = max(0.0, left[link] - (c - pool[link]))
