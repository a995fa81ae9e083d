"""Striper: bytes per path follow the rates (weighted fair queueing by virtual finish time)."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from overlay.striping import Striper


def stripe(striper: Striper, sizes) -> dict:
    sent: dict = {}
    for n in sizes:
        path = striper.next_path(n)
        sent[path] = sent.get(path, 0) + n
    return sent


def test_rates_3_to_1_give_bytes_within_5_percent_of_3_to_1():
    striper = Striper({"t0": 300e6, "t1": 100e6})
    sent = stripe(striper, [256 * 1024] * 1000)
    ratio = sent["t0"] / sent["t1"]
    # 1000 equal chunks at 3:1 -> 750 and 250 chunks, ratio 3.0
    assert abs(ratio - 3.0) / 3.0 < 0.05
    assert sent["t0"] + sent["t1"] == 1000 * 256 * 1024
    assert striper.assigned_bytes == sent


def test_rates_3_to_1_with_uneven_chunk_sizes():
    striper = Striper({0: 3.0, 1: 1.0})
    sizes = [1000 + (i * 7919) % 60_000 for i in range(5000)]
    sent = stripe(striper, sizes)
    assert abs(sent[0] / sent[1] - 3.0) / 3.0 < 0.05


def test_small_hand_computed_sequence():
    # rates 2:1, chunk 1 byte: finish times a: 0.5, 1.0, 1.5, ...; b: 1, 2, ...
    # order: a(0.5), then a(1.0) vs b(1.0) tie -> a (first in mapping), b(1.0), a(1.5), a(2.0)...
    striper = Striper({"a": 2, "b": 1})
    order = [striper.next_path(1) for _ in range(6)]
    assert order == ["a", "a", "b", "a", "a", "b"]


def test_zero_rate_paths_are_skipped_and_all_zero_gives_none():
    striper = Striper({"a": 0, "b": 5})
    assert {striper.next_path(10) for _ in range(20)} == {"b"}
    striper.set_rates({"a": 0, "b": 0})
    assert striper.next_path(10) is None
    assert Striper({}).next_path(10) is None


def test_set_rates_switches_proportions_from_now_on():
    striper = Striper({"a": 1, "b": 1})
    first = stripe(striper, [100] * 100)
    assert first == {"a": 5000, "b": 5000}
    striper.set_rates({"a": 1, "b": 4})
    second = stripe(striper, [100] * 100)
    assert second == {"a": 2000, "b": 8000}  # 1:4 of 10,000 bytes
    assert striper.assigned_bytes == {"a": 7000, "b": 13000}
    striper.set_rates({"c": 1})
    assert striper.next_path(1) == "c" and striper.rates == {"c": 1.0}


@pytest.mark.parametrize(
    "rates", [{"a": -1}, {"a": float("nan")}, {"a": float("inf")}, {"a": "1"}, [1, 2], {"a": True}]
)
def test_bad_rates_raise_value_error(rates):
    with pytest.raises(ValueError):
        Striper(rates)


@pytest.mark.parametrize("n", [-1, 1.5, "3", True])
def test_bad_chunk_size_raises_value_error(n):
    with pytest.raises(ValueError):
        Striper({"a": 1}).next_path(n)


@given(
    rates=st.lists(st.integers(min_value=1, max_value=1000), min_size=1, max_size=6),
    chunk=st.integers(min_value=1, max_value=10_000),
    count=st.integers(min_value=1, max_value=400),
)
def test_bytes_per_path_within_one_chunk_of_fair_share(rates, chunk, count):
    striper = Striper(dict(enumerate(rates)))
    sent = stripe(striper, [chunk] * count)
    total = chunk * count
    for path, rate in enumerate(rates):
        share = total * rate / sum(rates)
        assert abs(sent.get(path, 0) - share) <= chunk * len(rates)
