"""The Γ cache's bounds (terra_core/gamma_cache.py) against the scalar formulas of
docs/design.md 4.3, float for float: UB = Γ · max_k d'_k / d_k, LB = DualBound.gamma."""

import math
import operator
import random

import pytest

from terra_core.gamma_cache import TIGHT, GammaEntry
from terra_core.min_cct import DualBound

SPECIAL = [0.0, -0.0, math.nan, math.inf, -1.0, 5e-324, 1e308]


def scalar_hint(volumes, old, gamma_s, bound):
    """The hint as Python loops compute it (no hint for no FlowGroup)."""
    if not volumes or not volumes.keys() <= old.keys() or math.isinf(gamma_s):
        return None
    try:
        upper = gamma_s * max(map(operator.truediv, volumes.values(), map(old.get, volumes)))
    except ZeroDivisionError:
        return None
    lower = bound.gamma(volumes)
    return (upper, True) if upper <= lower * (1 + TIGHT) else (lower, False)


def same(a, b):
    """Equal floats, NaNs equal and the sign of a zero counted."""
    if isinstance(a, tuple) and isinstance(b, tuple):
        return len(a) == len(b) and all(map(same, a, b))
    if isinstance(a, float) and isinstance(b, float):
        return (a != a and b != b) or (a == b and math.copysign(1, a) == math.copysign(1, b))
    return a == b


def value(rng, base):
    return rng.choice(SPECIAL) if rng.random() < 0.05 else base * rng.choice([rng.random(), 0.5])


@pytest.mark.parametrize("seed", range(60))
def test_hint_equals_the_scalar_bounds_to_the_bit(seed):
    rng = random.Random(seed)
    pairs = [(f"A{i}", f"B{i}") for i in range(rng.randint(1, 150))]  # both sides of 64
    old = {pair: value(rng, 1e9) for pair in pairs}
    price = {pair: rng.choice([0.0, 0.0, rng.random(), rng.choice(SPECIAL)]) for pair in pairs}
    bound = DualBound(price, rng.choice([0.0, rng.random() * 1e3, math.nan]))
    entry = GammaEntry(old, rng.choice([rng.random() * 100, math.inf]), bound)
    for _ in range(5):  # the FlowGroups shrink, some end, sometimes in proportion
        keep = [pair for pair in pairs if rng.random() < 0.9] or pairs[:1]
        volumes = {pair: value(rng, old[pair] if old[pair] == old[pair] else 1.0) for pair in keep}
        if rng.random() < 0.1:
            volumes = dict.fromkeys(keep, rng.choice([0.0, -0.0]))
        if rng.random() < 0.1:
            volumes[("X", "Y")] = 1.0  # a pair the entry has not
        want = scalar_hint(volumes, old, entry.gamma_s, bound)
        assert same(entry.hint(volumes), want)
        assert same(entry.hint(dict(volumes)), want)


def test_no_hint_without_flowgroups_or_from_a_zero_byte_flowgroup():
    prices = DualBound(dict.fromkeys([("A", "B"), ("A", "C")], 0.0), 0.0)
    entry = GammaEntry({("A", "B"): 0.0, ("A", "C"): 5.0}, 2.0, prices)
    assert entry.hint({("A", "B"): 0.0, ("A", "C"): 4.0}) is None
    assert entry.hint({("A", "C"): 4.0}) is not None
    assert entry.hint({}) is None
