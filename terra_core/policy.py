"""The interface every scheduling policy offers (Terra and the five baselines).

The simulator and the controller drive a policy the same way: they tell it
about coflows and WAN changes, keep the truth about remaining bytes
themselves, and ask for an allocation at every event (docs/design.md section 4.3).

Shapes:
    Remaining = {coflow id: {flow id: remaining bytes}} — only unfinished WAN
        flows (src DC != dst DC) of coflows that are active now.
    Allocation = {coflow id: {flow id: [(path, bytes/s), ...]}} — a path is a
        tuple of DC names from the flow's source DC to its destination DC;
        flows missing from the allocation get rate 0.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from enum import StrEnum
from typing import TYPE_CHECKING, NamedTuple, Protocol, runtime_checkable

from terra_model import Coflow, Flow
from topologies import Path, Topology

if TYPE_CHECKING:
    import numpy as np

    from terra_core.flat_rates import FlatRates


Remaining = dict[str, dict[str, float]]
Allocation = dict[str, dict[str, list[tuple[Path, float]]]]
PathSource = Callable[[Topology, int], dict[tuple[str, str], list[Path]]]
"""Where a policy takes its paths from: (topology, K) -> {(src DC, dst DC): [paths that
may carry traffic now]}. The default (`topologies.all_pairs_paths`) gives the K shortest
paths over the links that are up; the controller with switches gives the installed
tunnels that are up (docs/design.md section 5)."""


class PolicyState(StrEnum):
    """An active coflow's state as a policy reports it (`StatefulPolicy.state`); the values
    are the words the controller's CoflowStatus uses for active coflows."""

    QUEUED = "queued"  # registered, not yet in a round
    RUNNING = "running"  # has rates from the last round
    PREEMPTED = "preempted"  # waits (docs/design.md 4.2 step 4) or lives on the reserve


@runtime_checkable
class Policy(Protocol):
    """A scheduling policy: Terra or a baseline (docs/design.md section 4.4).

    Attributes:
        name: short name ("terra", "per-flow", "multipath", "swan-mcf", "varys", "rapier").
        topology: the shared, mutable WAN view (the caller mutates it, then calls wan_changed).
    """

    name: str
    topology: Topology

    def add_coflow(self, coflow: Coflow, now: float) -> bool:
        """Register a coflow arriving at `now` (seconds).

        Returns:
            False when the coflow has a deadline that cannot be met and is
            rejected (it must then not appear in later Remaining maps); True otherwise.

        Raises:
            ValueError: duplicate coflow id, or a flow between DCs with no path.
        """
        ...

    def add_flows(self, coflow_id: str, flows: list[Flow], now: float) -> None:
        """Add flows to an active coflow (updateCoflow).

        Raises:
            KeyError: unknown coflow id.  ValueError: duplicate flow id.
        """
        ...

    def remove_coflow(self, coflow_id: str, now: float) -> None:
        """Forget a coflow that finished (or was cancelled). Unknown ids are ignored."""
        ...

    def wan_changed(self, now: float) -> bool:
        """The topology was mutated (link down/up, capacity change).

        Returns:
            True when the change warrants a new allocation (any link state
            change, or a capacity change larger than the relative threshold δ).
        """
        ...

    def allocate(self, now: float, remaining: Remaining) -> Allocation:
        """Return the rates every active flow gets from `now` until the next event."""
        ...


def split_by_remaining(
    path_rates: list[tuple[Path, float]], flows: dict[str, float]
) -> dict[str, list[tuple[Path, float]]]:
    """Split a FlowGroup's per-path rates among its flows in proportion to remaining bytes.

    With this split every flow of the FlowGroup finishes at the same moment
    (docs/design.md section 4.1; the controller splits among agent pairs the same way).

    Args:
        path_rates: [(path, bytes/s)] of the FlowGroup.
        flows: {flow id: remaining bytes (> 0)}.

    Returns:
        {flow id: [(path, bytes/s)]}; empty when `flows` carry no bytes.
    """
    total = sum(flows.values())
    if total <= 0:
        return {}
    shares = [(path, rate / total) for path, rate in path_rates if rate > 0]
    return {fid: [(path, share * left) for path, share in shares] for fid, left in flows.items()}


@runtime_checkable
class StatefulPolicy(Protocol):
    """A policy that reports each active coflow's PolicyState (Terra does)."""

    def state(self, coflow_id: str) -> PolicyState:
        """The coflow's state. Raises KeyError for an unknown coflow id."""
        ...


class PairLevels(NamedTuple):
    """Per-member rates per path of some DC pairs (answer of `PairLevelsPolicy.pair_levels`).

    Attributes:
        paths: the paths with a rate, grouped by pair in the order of the pairs asked.
        pair: int array, for each path the index of its pair in the pairs asked.
        level: float array, for each path the rate of one flow member on it (bytes/s).
    """

    paths: list[Path]
    pair: np.ndarray
    level: np.ndarray


class PairTable(NamedTuple):
    """The paths of a fixed list of DC pairs, numbered (`PairTablePolicy.pair_table`): what
    `table_levels` answers refer to, valid until the next WAN change.

    Attributes:
        pairs: the (src DC, dst DC) pairs, the caller's sequence as given.
        paths: every pair's paths (as routed), pair after pair.
        ptr: int array (len(pairs) + 1,): pair i's paths are paths[ptr[i]:ptr[i + 1]]
            (none when no path is up).
        path_ptr, rows: int arrays: path j crosses the links of rows
            rows[path_ptr[j]:path_ptr[j + 1]] (BaselinePolicy._rows order).
    """

    pairs: object
    paths: list[Path]
    ptr: np.ndarray
    path_ptr: np.ndarray
    rows: np.ndarray


@runtime_checkable
class PairLevelsPolicy(Protocol):
    """Fast path of the pair-symmetric baselines (per-flow, multipath, swan-mcf): every
    member of a flow gets, on each path, a rate that depends only on its DC pair and the
    number of active members per pair. The simulator calls it instead of `allocate`."""

    def pair_levels(
        self, now: float, pairs: tuple[tuple[str, str], ...], members: np.ndarray
    ) -> PairLevels:
        """Per-member rates per path for each pair (a pair_policy.PairLevels)."""
        ...


@runtime_checkable
class PairTablePolicy(Protocol):
    """Index-based fast path of per-flow and multipath
    (fixed_route_fair.FixedRouteFairPolicy): the caller numbers its DC pairs once
    (`pair_table`, again after each WAN change) and then asks for the per-member rates of
    the active pairs by index (`table_levels`), so no tuple of pairs or list of paths is
    built per event. The simulator prefers it to `pair_levels`."""

    def pair_table(self, pairs: Sequence[tuple[str, str]]) -> PairTable:
        """Sequence of (src DC, dst DC) pairs -> a fixed_route_fair.PairTable of their paths."""
        ...

    def table_levels(
        self, now: float, table: PairTable, active: np.ndarray, members: np.ndarray
    ) -> np.ndarray:
        """Per-member rates (float array) on the paths of the pairs `active` of `table`
        (shapes: fixed_route_fair.FixedRouteFairPolicy.table_levels)."""
        ...


@runtime_checkable
class CoflowRatesPolicy(Protocol):
    """Fast path of the coflow-at-a-time baselines (Varys, Rapier): per-member rates of the
    unfinished flows of every active coflow as one flat array. The simulator calls it
    instead of `allocate`."""

    def live_coflow_rates(
        self,
        now: float,
        cids: Sequence[str],
        counts: Sequence[int] | np.ndarray,
        local: np.ndarray,
        remaining: np.ndarray,
    ) -> tuple[np.ndarray, list[list[list[tuple[Path, int]]]]]:
        """The unfinished flows of the active coflows `cids` (counts[i] of coflow i, given
        by their index `local` in the coflow's flow order, with `remaining` bytes > 0) ->
        (per-member rates in bytes/s, one per given flow; each coflow's Route list,
        baseline_policy.Route)
        (shapes: madd.MaddPolicy.live_coflow_rates)."""
        ...


@runtime_checkable
class GroupRateArraysPolicy(Protocol):
    """Terra's fast path with its rates as flat arrays (terra_policy.TerraPolicy
    .group_rate_arrays): `GroupRatesPolicy.group_rates`'s rates in the same order, as
    flat_rates.FlatRates, so the simulator does not read them from lists of tuples."""

    def group_rate_arrays(
        self, now: float, volumes: dict[str, dict[tuple[str, str], float]]
    ) -> FlatRates:
        """{coflow id: {(src DC, dst DC): remaining bytes}} -> FlatRates."""
        ...


@runtime_checkable
class GroupRatesPolicy(Protocol):
    """Fast path of Terra (terra_policy.TerraPolicy.group_rates): rates per FlowGroup, which
    the caller splits among the FlowGroup's flows in proportion to their remaining bytes
    (`split_by_remaining`). The simulator calls it instead of `allocate`. A coflow's volumes
    dict is read only once handed in: a caller hands a new dict when the volumes change, and
    may hand the same one again when they did not (the round then skips its checks)."""

    def group_rates(
        self, now: float, volumes: dict[str, dict[tuple[str, str], float]]
    ) -> dict[str, dict[tuple[str, str], list[tuple[Path, float]]]]:
        """{coflow id: {(src DC, dst DC): remaining bytes}} -> {coflow id: {(src DC, dst DC):
        [(path, bytes/s), ...]}} (shapes: TerraPolicy.group_rates)."""
        ...
