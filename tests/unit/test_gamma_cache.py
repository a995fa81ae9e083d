"""The Γ cache's bounds (terra_core/gamma_cache.py) against the scalar formulas of
docs/design.md 4.3, float for float: UB = Γ · max_k d'_k / d_k, LB = DualBound.gamma."""

import math
import random

import pytest

from terra_core.gamma_cache import TIGHT, GammaEntry
from terra_core.min_cct import DualBound


def scalar_hint(volumes, old, gamma_s, bound):
    if not volumes or not volumes.keys() <= old.keys() or math.isinf(gamma_s):
        return None
    if any(old[pair] == 0 for pair in volumes):
        return None
    upper = gamma_s * max(d / old[pair] for pair, d in volumes.items())
    lower = bound.gamma(volumes)
    return (upper, True) if upper <= lower * (1 + TIGHT) else (lower, False)


@pytest.mark.parametrize("seed", range(40))
def test_hint_equals_the_scalar_bounds_to_the_bit(seed):
    rng = random.Random(seed)
    pairs = [(f"A{i}", f"B{i}") for i in range(rng.randint(1, 150))]
    old = {pair: rng.choice([rng.random() * 1e9, 1e6, 3.0]) for pair in pairs}
    price = {pair: rng.choice([0.0, 0.0, rng.random()]) for pair in pairs}
    bound = DualBound(price, rng.choice([0.0, rng.random() * 1e3]))
    entry = GammaEntry(old, rng.choice([rng.random() * 100, math.inf]), bound)
    for _ in range(5):  # the FlowGroups shrink, some end, sometimes in proportion
        keep = [pair for pair in pairs if rng.random() < 0.9] or pairs[:1]
        f = rng.random()
        volumes = {pair: old[pair] * (f if rng.random() < 0.5 else rng.random()) for pair in keep}
        if rng.random() < 0.2:
            volumes[keep[0]] = rng.choice([0.0, -1.0])
        if rng.random() < 0.1:
            volumes[("X", "Y")] = 1.0  # a pair the entry has not
        assert entry.hint(volumes) == scalar_hint(volumes, old, entry.gamma_s, bound)
        assert entry.hint(dict(volumes)) == scalar_hint(volumes, old, entry.gamma_s, bound)


def test_a_flowgroup_of_zero_bytes_then_gives_no_hint():
    entry = GammaEntry(
        {("A", "B"): 0.0, ("A", "C"): 5.0},
        2.0,
        DualBound(dict.fromkeys([("A", "B"), ("A", "C")], 0.0), 0.0),
    )
    assert entry.hint({("A", "B"): 0.0, ("A", "C"): 4.0}) is None
    assert entry.hint({("A", "C"): 4.0}) is not None
    assert entry.hint({}) is None
