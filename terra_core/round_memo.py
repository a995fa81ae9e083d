"""What Terra's scheduling rounds keep from one round to the next (docs/design.md 4.2).

A round (scheduling_round.schedule_round) is run again at every arrival, FlowGroup finish
and starvation wakeup, mostly on the same links and on volumes that shrank in proportion,
so what it found is kept for the next round, each part reused only when exact:

- step 4's min-CCT solution on r per coflow and step 2''s solution on the reserve
  (`ResidualEntry`, reused by residual_min_cct.min_cct_on_residual while weak duality
  proves it still minimal);
- the link bits and path masks of the round's links (path_masks.IndexCache);
- step 3's per-pair denominators Σ_p bottleneck(p) of the quick Γ bound, for one set of
  capacities (`PairFlowCache`);
- the last round's checked active coflows (`ActiveCache`) and step 6's pair numbers
  (`PairNumbers`).

The owner (TerraPolicy) clears the memo when paths or capacities change and forgets a
coflow's entry when the coflow is removed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import filterfalse
from typing import NamedTuple

import numpy as np

from terra_core.array_types import IntArray
from terra_core.group_volumes import GroupVolumes
from terra_core.min_cct import DualBound, MinCct, Pair
from terra_core.path_masks import IndexCache
from topologies import Link, Path


class ResidualEntry(NamedTuple):
    """One min-CCT solution kept for reuse (residual_min_cct.min_cct_on_residual).

    Attributes:
        r: {link: bytes/s} the capacities it was solved on.
        volumes: {(src DC, dst DC): bytes} the FlowGroup volumes it was solved for.
        solved: the MinCct (Γ in seconds, rates per path in bytes/s, link prices).
        bound: the weak-duality bound on Γ built from its prices (min_cct.DualBound).
    """

    r: dict[Link, float]
    volumes: dict[Pair, float]
    solved: MinCct
    bound: DualBound


@dataclass(slots=True)
class PairFlowCache:
    """Step 3's {pair: Σ_p bottleneck(p) in bytes/s} for the capacities `capacity`
    (bytes/s per link); `flows` fills as pairs are met (scheduling_round._quick_bound)."""

    capacity: dict[Link, float]
    flows: dict[Pair, float] = field(default_factory=dict)


class ActiveCache(NamedTuple):
    """The last round's active coflows (scheduling_round._active_coflows), checked against
    the paths dict `paths` ({pair: paths}): `given` {coflow id: the volumes dict given},
    `active` {coflow id: its positive FlowGroups} (coflows with none left out), `routed`
    {coflow id: the pair list (group_volumes.GroupVolumes.pairs) of its volumes, every
    pair found in `paths`}. A volumes dict given again, or a GroupVolumes on the same pair
    list, with the same paths dict, has the same FlowGroups: the round does not write into
    either (TerraPolicy._paths_for skips its pairs by the same rule)."""

    paths: dict[Pair, list[Path]]
    given: dict[str, dict[Pair, float]]
    active: dict[str, dict[Pair, float]]
    routed: dict[str, list[Pair]]


@dataclass(slots=True)
class PairNumbers:
    """A number per DC pair met (0, 1, ... in the order met) and each coflow's pairs'
    numbers, kept while its volumes are the same dict or a GroupVolumes on the same pair
    list: step 6 marks the pairs an earlier coflow holds in one bool array
    (scheduling_round._work_conservation).

    Attributes:
        number: {pair: its number}.
        of_coflow: {coflow id: (the volumes dict or pair list numbered, int array of its
            pairs' numbers in the volumes' order)}.
    """

    number: dict[Pair, int] = field(default_factory=dict)
    of_coflow: dict[str, tuple[object, IntArray]] = field(default_factory=dict)

    def of(self, cid: str, volumes: dict[Pair, float]) -> IntArray:
        """The numbers (int array) of the pairs of coflow `cid`'s `volumes`, in order."""
        key = volumes.pairs if isinstance(volumes, GroupVolumes) else volumes
        kept = self.of_coflow.get(cid)
        if kept is not None and kept[0] is key:
            return kept[1]
        number = self.number
        for pair in filterfalse(number.__contains__, volumes):
            number[pair] = len(number)
        nos = np.fromiter(map(number.__getitem__, volumes), np.intp, len(volumes))
        self.of_coflow[cid] = (key, nos)
        return nos


@dataclass(slots=True)
class RoundMemo:
    """The results a round keeps for the next ones (module docstring).

    Attributes:
        residual: {coflow id: step 4's ResidualEntry on r}.
        starving: step 2''s ResidualEntry on the reserve (aged guard), or None.
        index: the path masks of the round's links.
        pair_flow: step 3's denominators for the last capacities seen, or None.
        active: the last round's checked active coflows (`ActiveCache`), or None.
        pairs: step 6's pair numbers (`PairNumbers`).
    """

    residual: dict[str, ResidualEntry] = field(default_factory=dict)
    starving: ResidualEntry | None = None
    index: IndexCache = field(default_factory=IndexCache)
    pair_flow: PairFlowCache | None = None
    active: ActiveCache | None = None
    pairs: PairNumbers = field(default_factory=PairNumbers)

    def clear(self) -> None:
        """Forget everything (paths or capacities changed)."""
        self.residual.clear()
        self.starving = None
        self.index = IndexCache()
        self.pair_flow = None
        self.active = None
        self.pairs = PairNumbers()

    def forget(self, coflow_id: str) -> None:
        """Forget a removed coflow's step-4 entry and pair numbers (unknown ids are
        ignored)."""
        self.residual.pop(coflow_id, None)
        self.pairs.of_coflow.pop(coflow_id, None)

    def pair_flows(self, capacity: dict[Link, float]) -> dict[Pair, float]:
        """Step 3's {pair: Σ_p bottleneck(p)} cache for `capacity` (bytes/s per link): the
        kept one while the capacities are equal, a new empty one otherwise."""
        if self.pair_flow is None or self.pair_flow.capacity != capacity:
            self.pair_flow = PairFlowCache(dict(capacity))
        return self.pair_flow.flows
