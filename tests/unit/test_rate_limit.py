"""TokenBucket on trio's virtual clock (MockClock with autojump): exact hand-computed pacing.

These run on virtual time, so they check the bucket's arithmetic, not the machine's timing;
benchmarks/rate_limit_accuracy.py measures real rates over real TCP.
"""

import math

import pytest
import trio

from overlay.rate_limit import TokenBucket


async def test_backlogged_sender_gets_exactly_the_rate(autojump_clock):
    bucket = TokenBucket(1000.0)  # 1000 bytes/s, starts empty
    t0 = trio.current_time()
    for _ in range(10):
        await bucket.acquire(500)
    # The first acquire goes at once (bucket not in debt); each of the other 9 waits for the
    # previous 500-byte debt: 9 * 500 / 1000 = 4.5 s.
    assert trio.current_time() - t0 == pytest.approx(4.5)
    assert bucket.acquired_bytes == 5000


async def test_chunk_larger_than_burst_goes_into_debt(autojump_clock):
    bucket = TokenBucket(100.0, burst_bytes=10)
    t0 = trio.current_time()
    await bucket.acquire(1000)  # at once: tokens 0 -> -1000
    await bucket.acquire(1)  # waits 1000 / 100 = 10 s
    assert trio.current_time() - t0 == pytest.approx(10.0)


async def test_idle_time_earns_at_most_the_burst(autojump_clock):
    bucket = TokenBucket(100.0, burst_bytes=50)
    await bucket.acquire(100)  # tokens -100
    await trio.sleep(100)  # would earn 10,000 tokens but the bucket holds 50
    t0 = trio.current_time()
    await bucket.acquire(50)  # tokens 50 -> 0, at once
    await bucket.acquire(50)  # tokens 0 -> -50, at once (not in debt)
    await bucket.acquire(1)  # waits 50 / 100 = 0.5 s
    assert trio.current_time() - t0 == pytest.approx(0.5)


async def test_rate_zero_pauses_until_set_rate_wakes_the_waiter(autojump_clock):
    bucket = TokenBucket(0.0)
    done = []

    async def sender():
        await bucket.acquire(10)
        done.append(trio.current_time())

    async with trio.open_nursery() as nursery:
        nursery.start_soon(sender)
        await trio.sleep(30)
        assert done == []  # 30 s at rate 0: still paused
        t_set = trio.current_time()
        bucket.set_rate(5.0)
    # A bucket not in debt lets the first acquire through as soon as the rate is positive.
    assert done == [pytest.approx(t_set)]


async def test_set_rate_applies_to_a_waiting_acquire_immediately(autojump_clock):
    bucket = TokenBucket(10.0)
    await bucket.acquire(1000)  # debt 1000 bytes: 100 s at 10 B/s
    t0 = trio.current_time()
    finished = []

    async def waiter():
        await bucket.acquire(1)
        finished.append(trio.current_time() - t0)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(waiter)
        await trio.sleep(10)  # 10 s at 10 B/s pays 100: debt 900
        bucket.set_rate(100.0)  # 900 / 100 = 9 s more
    assert finished == [pytest.approx(19.0)]


async def test_rate_change_to_zero_mid_wait_pauses(autojump_clock):
    bucket = TokenBucket(10.0)
    await bucket.acquire(100)  # debt 100: 10 s
    t0 = trio.current_time()
    finished = []

    async def waiter():
        await bucket.acquire(1)
        finished.append(trio.current_time() - t0)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(waiter)
        await trio.sleep(5)  # debt 50
        bucket.set_rate(0)
        await trio.sleep(1000)
        assert finished == []
        bucket.set_rate(10.0)  # 50 / 10 = 5 s more
    assert finished == [pytest.approx(1010.0)]


async def test_concurrent_acquirers_share_the_rate(autojump_clock):
    bucket = TokenBucket(1000.0)
    counts = {"a": 0, "b": 0}

    async def sender(name):
        while True:
            await bucket.acquire(100)
            counts[name] += 100

    with trio.move_on_after(60):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(sender, "a")
            nursery.start_soon(sender, "b")
    # 60 s at 1000 B/s = 60,000 bytes (+ the first 100-byte chunk that goes without waiting)
    assert counts["a"] + counts["b"] == pytest.approx(60_100, abs=100)
    assert abs(counts["a"] - counts["b"]) <= 100  # FIFO lock alternates the two


async def test_unlimited_rate_never_waits(autojump_clock):
    bucket = TokenBucket(math.inf)
    t0 = trio.current_time()
    for _ in range(100):
        await bucket.acquire(1 << 20)
    assert trio.current_time() == t0
    bucket.set_rate(1 << 20)  # 1 MiB/s from now on
    await bucket.acquire(1 << 20)
    await bucket.acquire(1)
    assert trio.current_time() - t0 == pytest.approx(1.0)


async def test_cancelled_acquire_takes_no_tokens(autojump_clock):
    bucket = TokenBucket(100.0)
    await bucket.acquire(100)  # debt 100: 1 s
    with trio.move_on_after(0.5):
        await bucket.acquire(10_000)
    t0 = trio.current_time()
    await bucket.acquire(1)  # only the remaining 0.5 s of the first debt
    assert trio.current_time() - t0 == pytest.approx(0.5)
    assert bucket.acquired_bytes == 101


async def test_default_burst_follows_rate():
    assert TokenBucket(1e6).burst_bytes == pytest.approx(50_000)  # 50 ms of 1 MB/s
    assert TokenBucket(100).burst_bytes == 1500  # floor of one MTU
    assert TokenBucket(1e6, burst_bytes=7).burst_bytes == 7


@pytest.mark.parametrize("rate", [-1, float("nan"), "5", None, True])
async def test_bad_rates_raise_value_error(rate):
    with pytest.raises(ValueError):
        TokenBucket(rate)
    bucket = TokenBucket(1.0)
    with pytest.raises(ValueError):
        bucket.set_rate(rate)


@pytest.mark.parametrize("burst", [0, -5, float("inf"), "x"])
async def test_bad_burst_raises_value_error(burst):
    with pytest.raises(ValueError):
        TokenBucket(1.0, burst_bytes=burst)


@pytest.mark.parametrize("n", [-1, 2.5, "4", True])
async def test_bad_acquire_size_raises_value_error(n):
    with pytest.raises(ValueError):
        await TokenBucket(1.0).acquire(n)


async def test_refunded_bytes_do_not_cost_their_time(autojump_clock):
    bucket = TokenBucket(1000.0, burst_bytes=2000)
    t0 = trio.current_time()
    for _ in range(10):  # each acquires a 500-byte chunk but sends 100 (a small flow's bytes)
        await bucket.acquire(500)
        bucket.refund(400)
    # 10 * 100 bytes at 1000 bytes/s: the first goes at once, 9 wait 0.1 s each
    assert trio.current_time() - t0 == pytest.approx(0.9)
    assert bucket.acquired_bytes == 1000
    await trio.sleep(10)
    bucket.refund(10_000)  # never past the burst
    t0 = trio.current_time()
    await bucket.acquire(2000)
    await bucket.acquire(1)
    assert trio.current_time() - t0 == pytest.approx(0.0)
    await bucket.acquire(1)  # now 1 byte in debt after the 2000 + 1: waits 1 ms
    assert trio.current_time() - t0 == pytest.approx(0.001)
