"""The swan-mcf baseline: application-agnostic SWAN, max-min fair MCF over DC-pair demands
(docs/design.md section 4.4).
"""

from __future__ import annotations

import numpy as np

from terra_core.mcf import McfWarmStart, Rates, maxmin_mcf
from terra_core.pair_policy import PairPolicy
from terra_core.policy import PairLevels, PathSource
from topologies import Path, Topology

_MCF_CACHE_SIZE = 256  # cached swan-mcf answers kept before the cache is emptied
Pair = tuple[str, str]  # (src DC, dst DC)


class SwanMcfPolicy(PairPolicy):
    """Application-agnostic SWAN: max-min fair multi-commodity flow over DC-pair demands on
    K paths (Hong et al., "Achieving high utilization with software-driven WAN", SIGCOMM
    2013; the "swan-mcf" baseline of docs/design.md section 4.4), via mcf.maxmin_mcf. Demands
    are unbounded (flows are backlogged); a DC pair's rate on each path is shared by its
    flows in proportion to their member counts (flows in one tunnel share it fairly).

    Args:
        topology: the shared WAN view.  k: paths per DC pair.
    """

    name = "swan-mcf"

    def __init__(
        self, topology: Topology, k: int = 4, path_source: PathSource | None = None
    ) -> None:
        super().__init__(topology, k, path_source)
        self._mcf_cache: dict[
            tuple[tuple[Pair, ...], tuple[float, ...]], tuple[list[Path], np.ndarray, np.ndarray]
        ] = {}
        self._mcf_rates: dict[
            tuple[frozenset[Pair], tuple[float, ...]], Rates[Pair]
        ] = {}  # maxmin_mcf answers by set of pairs
        self._warm = McfWarmStart()  # the last MCF's first basis, to start the next from

    def pair_levels(
        self, now: float, pairs: tuple[tuple[str, str], ...], members: np.ndarray
    ) -> PairLevels:
        """Per-member rates: each pair's max-min MCF rate on a path over its members.

        The MCF depends only on the set of active pairs and the link capacities, so its
        answer is cached under those (events that change neither, such as most flow
        completions, or only the pairs' order, reuse it) and laid out in the pairs' order
        (cached too, under the order). It is solved in its compact form, its first LP
        started from the previous solve's basis (mcf.maxmin_mcf `compact`, `warm`): the
        pairs' total rates are the unique max-min fair ones whatever the order or form;
        only their split over paths may differ, which no flow's rate depends on.
        """
        capacity = tuple(self._capacity().tolist())
        cached = self._mcf_cache.get((pairs, capacity))
        if cached is None:
            if len(self._mcf_cache) >= _MCF_CACHE_SIZE:
                self._mcf_cache.clear()
            rates = self._mcf(pairs, capacity)
            found = [(p, i, r) for i, pair in enumerate(pairs) for p, r in rates[pair]]
            cached = (
                [p for p, _, _ in found],
                np.array([i for _, i, _ in found], dtype=np.intp),
                np.array([r for _, _, r in found], dtype=float),
            )
            self._mcf_cache[(pairs, capacity)] = cached
        paths, pair, total = cached
        return PairLevels(paths, pair, total / members[pair])

    def _mcf(self, pairs: tuple[Pair, ...], capacity: tuple[float, ...]) -> Rates[Pair]:
        """maxmin_mcf's {pair: [(path, bytes/s), ...]} for the set of `pairs` on the link
        capacities `capacity` (in self._rows order), from the cache when it has the set."""
        key = (frozenset(pairs), capacity)
        rates = self._mcf_rates.get(key)
        if rates is None:
            if len(self._mcf_rates) >= _MCF_CACHE_SIZE:
                self._mcf_rates.clear()
            demands = {pair: (self._paths.get(pair, []), None) for pair in pairs}
            capacities = dict(zip(self._rows, capacity, strict=True))
            rates = maxmin_mcf(demands, capacities, compact=True, warm=self._warm)
            self._mcf_rates[key] = rates
        return rates

    def _clear_caches(self) -> None:
        self._mcf_cache.clear()
        self._mcf_rates.clear()
