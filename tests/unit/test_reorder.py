"""ReorderBuffer: in-order delivery from any arrival order, bounded memory, disk spill."""

import os
import tempfile
import tracemalloc

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from overlay.reorder import MemoryBudget, ReorderBuffer


def flow_bytes(n: int) -> bytes:
    return bytes((i * 37 + (i >> 8) * 11) & 0xFF for i in range(n))


def chunks_of(data: bytes, size: int) -> list[tuple[int, bytes]]:
    return [(o, data[o : o + size]) for o in range(0, len(data), size)]


def feed(buf: ReorderBuffer, chunks) -> bytes:
    out = []
    for offset, chunk in chunks:
        out.extend(buf.add(offset, chunk))
        assert buf.resident_bytes <= buf.memory_limit_bytes
    return b"".join(out)


def test_in_order_chunks_are_delivered_at_once_without_copy():
    data = flow_bytes(1000)
    with ReorderBuffer(1000, 0, None) as buf:
        chunk = data[:400]
        assert buf.add(0, chunk)[0] is chunk  # the caller's object, not a copy
        assert buf.delivered == 400 and not buf.complete
        assert b"".join(buf.add(400, data[400:])) == data[400:]
        assert buf.complete and buf.spilled_bytes == 0


def test_hand_computed_gap_fill_and_duplicates(tmp_path):
    data = flow_bytes(100)
    with ReorderBuffer(100, 1000, str(tmp_path)) as buf:
        assert buf.add(50, data[50:100]) == []  # held: [50,100)
        assert buf.add(20, data[20:60]) == []  # only [20,50) is new; held 80 bytes
        assert buf.held_bytes == 80 and buf.resident_bytes == 80
        out = buf.add(0, data[0:30])  # delivers [0,30), then the held [30,50) tail and [50,100)
        assert b"".join(out) == data and buf.complete
        assert buf.add(10, data[10:20]) == []  # duplicate after completion
        assert buf.resident_bytes == 0 and buf.peak_resident_bytes == 80


def test_in_order_chunk_overlapping_held_bytes_keeps_the_tail():
    data = flow_bytes(100)
    with ReorderBuffer(100, 1000, None) as buf:
        buf.add(40, data[40:70])  # held [40,70)
        out = buf.add(0, data[0:50])  # delivers [0,50); held part [50,70) follows
        assert b"".join(out) == data[:70] and buf.delivered == 70
        assert buf.held_bytes == 0


def test_spills_beyond_the_memory_limit_and_cleans_up(tmp_path):
    data = flow_bytes(10_000)
    chunks = chunks_of(data, 1000)
    buf = ReorderBuffer(10_000, 2500, str(tmp_path))
    # Everything except chunk 0 arrives first: 9000 out-of-order bytes, 2500 allowed in memory.
    # Nearest-first policy: [1000,2000) and [2000,3000) stay resident (2000 bytes), the rest spill.
    assert feed(buf, chunks[1:]) == b""
    assert buf.resident_bytes == 2000 and buf.peak_resident_bytes <= 2500
    assert buf.held_bytes == 9000 and buf.spilled_bytes >= 7000
    assert buf.spill_path is not None and os.path.exists(buf.spill_path)
    assert feed(buf, chunks[:1]) == data
    assert buf.complete
    spill = buf.spill_path
    buf.close()
    assert not os.path.exists(spill) and os.listdir(tmp_path) == []
    buf.close()  # twice is fine
    with pytest.raises(ValueError, match="closed"):
        buf.add(0, b"x")


def test_nearer_chunk_evicts_farther_resident_chunks(tmp_path):
    data = flow_bytes(4000)
    with ReorderBuffer(4000, 1000, str(tmp_path)) as buf:
        buf.add(3000, data[3000:4000])  # resident 1000 (at the limit)
        buf.add(1000, data[1000:2000])  # nearer: [3000,4000) goes to disk, this stays
        assert buf.resident_bytes == 1000 and buf.spilled_bytes == 1000
        buf.add(2000, data[2000:3000])  # farther than the resident one: spilled itself
        assert buf.spilled_bytes == 2000
        assert b"".join(buf.add(0, data[:1000])) == data


def test_zero_memory_limit_spills_everything_out_of_order(tmp_path):
    data = flow_bytes(3000)
    with ReorderBuffer(3000, 0, str(tmp_path)) as buf:
        out = feed(buf, reversed(chunks_of(data, 500)))
        assert out == data and buf.peak_resident_bytes == 0 and buf.spilled_bytes == 2500


def test_empty_flow_is_complete_at_once():
    with ReorderBuffer(0, 10, None) as buf:
        assert buf.complete and buf.add(0, b"") == []


@pytest.mark.parametrize(
    ("offset", "data", "match"),
    [
        (-1, b"x", "offset"),
        (1.0, b"x", "offset"),
        (True, b"x", "offset"),
        (95, b"x" * 10, "beyond"),
        (0, "text", "bytes-like"),
        (0, 5, "bytes-like"),
    ],
)
def test_bad_chunks_raise_value_error(offset, data, match):
    with ReorderBuffer(100, 10, None) as buf:
        with pytest.raises(ValueError, match=match):
            buf.add(offset, data)
        assert buf.delivered == 0  # the buffer is still usable
        assert b"".join(buf.add(0, b"a" * 100)) == b"a" * 100


@pytest.mark.parametrize(("size", "limit"), [(-1, 0), (0, -1), (1.5, 0), (10, None)])
def test_bad_sizes_raise_value_error(size, limit):
    with pytest.raises(ValueError):
        ReorderBuffer(size, limit, None)


@pytest.mark.parametrize("bound", [0, -1, 1.5, True, None])
def test_bad_read_bounds_raise_value_error(bound):
    with pytest.raises(ValueError, match="max_read_bytes"):
        ReorderBuffer(10, 10, None, max_read_bytes=bound)
    with ReorderBuffer(10, 10, None) as buf:
        if bound is not None:  # None = the buffer's own max_read_bytes
            with pytest.raises(ValueError, match="max_bytes"):
                buf.take_ready(bound)
    with pytest.raises(ValueError, match="closed"):
        buf.take_ready()


def test_hand_computed_bounded_read_back_of_spilled_segments(tmp_path):
    data = flow_bytes(4000)
    with ReorderBuffer(4000, 1000, str(tmp_path), max_read_bytes=1500) as buf:
        # Nearest first: [1000,2000) stays in memory, [2000,3000) and [3000,4000) spill.
        feed(buf, chunks_of(data, 1000)[1:])
        assert buf.resident_bytes == 1000 and buf.spilled_bytes == 2000 and buf.ready_bytes == 0
        # The gap fill returns chunk 0, the in-memory [1000,2000) and the spilled [2000,3000)
        # (1000 read <= 1500); [3000,4000) would make 2000 read > 1500: it stays, ready.
        out = buf.add(0, data[:1000])
        assert b"".join(out) == data[:3000] and buf.delivered == 3000
        assert buf.ready_bytes == 1000 and buf.held_bytes == 1000 and not buf.complete
        assert buf.add(3200, data[3200:3500]) == []  # a resend of ready bytes is dropped
        # take_ready(500) still returns one whole segment (1000 > 500): progress is always made
        assert b"".join(buf.take_ready(500)) == data[3000:]
        assert buf.complete and buf.ready_bytes == 0 and buf.take_ready() == []
        assert os.path.getsize(buf.spill_path) == 0  # nothing left on disk: truncated


def test_gap_fill_after_a_long_spill_reads_back_in_bounded_pieces(tmp_path):
    """256 chunks of 16 KiB; chunks 1..255 arrive first with no memory allowed, so 255 x 16 KiB
    = 4080 KiB spill. Filling the gap returns chunk 0 plus at most max_read_bytes = 64 KiB (4
    segments) of spilled bytes; take_ready() returns the other 4080 - 64 = 4016 KiB, 64 KiB at a
    time. Python allocations during the gap fill and drain stay far below the 4 MiB spilled."""
    seg, count, bound = 16 * 1024, 256, 64 * 1024
    data = os.urandom(seg * count)
    chunks = chunks_of(data, seg)
    buf = ReorderBuffer(len(data), 0, str(tmp_path), max_read_bytes=bound)
    assert feed(buf, chunks[1:]) == b""
    assert buf.spilled_bytes == (count - 1) * seg and buf.resident_bytes == 0
    spill = buf.spill_path
    original = memoryview(data)
    position = 0

    def check(pieces) -> int:
        nonlocal position
        for piece in pieces:
            assert original[position : position + len(piece)] == piece
            position += len(piece)
        return sum(len(p) for p in pieces)

    tracemalloc.start()
    try:
        first = buf.add(0, chunks[0][1])
        assert check(first) == seg + bound  # chunk 0 + 4 spilled segments
        first = None
        assert buf.ready_bytes == (count - 1) * seg - bound == 4016 * 1024
        batches = []
        while buf.ready_bytes:
            before = buf.ready_bytes
            batches.append(check(buf.take_ready()))
            assert buf.ready_bytes == before - batches[-1]
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert position == len(data) and buf.complete and buf.delivered == len(data)
    assert max(batches) == bound and sum(batches) == 4016 * 1024
    assert peak < 4 * bound  # one 64 KiB batch at a time and small objects; 4080 KiB spilled
    assert os.path.getsize(spill) == 0  # reset once nothing was left on disk
    buf.close()
    assert not os.path.exists(spill) and os.listdir(tmp_path) == []


@st.composite
def arrivals(draw):
    """A flow, chunks that cover it (random cut points, some overlapping resends),
    shuffled with duplicates, plus a memory limit."""
    size = draw(st.integers(min_value=0, max_value=3000))
    cuts = sorted(
        set(draw(st.lists(st.integers(min_value=1, max_value=max(size - 1, 1)), max_size=40)))
    )
    bounds = [0] + [c for c in cuts if 0 < c < size] + [size]
    pieces = [(a, b) for a, b in zip(bounds, bounds[1:], strict=False) if b > a]
    extra = draw(st.lists(st.tuples(st.integers(0, size), st.integers(0, 400)), max_size=10))
    pieces += [(a, min(size, a + n)) for a, n in extra]  # overlapping resends
    pieces += draw(st.lists(st.sampled_from(pieces), max_size=10)) if pieces else []
    order = draw(st.permutations(pieces))
    limit = draw(st.integers(min_value=0, max_value=4000))
    return size, order, limit


@settings(max_examples=300)
@given(case=arrivals(), max_read=st.integers(1, 2000), draws=st.data())
def test_any_arrival_order_and_duplication_yields_the_original_stream(case, max_read, draws):
    with tempfile.TemporaryDirectory() as tmp:
        check_one_arrival_order(case, tmp, max_read, draws)


def check_one_arrival_order(case, tmp_path, max_read, draws):
    """Feed the chunks with spilled bytes read back at most `max_read` per add(); after some
    adds take one batch of ready bytes, and at the end take all that is still ready."""
    size, order, limit = case
    data = flow_bytes(size)
    with ReorderBuffer(size, limit, str(tmp_path), max_read_bytes=max_read) as buf:
        out = []
        for a, b in order:
            out.extend(buf.add(a, memoryview(data)[a:b]))
            if buf.ready_bytes and draws.draw(st.booleans()):
                out.extend(buf.take_ready(draws.draw(st.integers(1, 2000))))
            assert buf.resident_bytes <= limit
            assert buf.delivered == sum(len(p) for p in out)
            assert 0 <= buf.ready_bytes <= buf.held_bytes
        while buf.ready_bytes:
            out.extend(buf.take_ready())
        assert b"".join(out) == data
        assert buf.complete and buf.held_bytes == 0 and buf.resident_bytes == 0
        assert buf.peak_resident_bytes <= limit
    assert os.listdir(tmp_path) == []


def test_shared_budget_bounds_the_total_of_several_buffers(tmp_path):
    budget = MemoryBudget(1500)
    data = flow_bytes(3000)
    a = ReorderBuffer(3000, 1000, str(tmp_path), budget=budget)
    b = ReorderBuffer(3000, 1000, str(tmp_path), budget=budget)
    a.add(1000, data[1000:2000])  # a holds 1000 (its own limit), budget 1000
    b.add(1000, data[1000:1500])  # b holds 500, budget 1500 = limit
    b.add(2000, data[2000:2500])  # budget full: spilled although b's own limit allows it
    assert (a.resident_bytes, b.resident_bytes, budget.used_bytes) == (1000, 500, 1500)
    assert b.spilled_bytes == 500
    assert b"".join(a.add(0, data[:1000])) == data[:2000]  # frees a's 1000 bytes
    assert budget.used_bytes == 500
    b.add(2500, data[2500:3000])  # fits again: budget 1000
    assert budget.used_bytes == 1000 and b.resident_bytes == 1000
    b.close()  # releases b's resident bytes from the budget
    assert budget.used_bytes == 0 and budget.peak_bytes == 1500
    a.close()


@settings(max_examples=150)
@given(
    cases=st.lists(arrivals(), min_size=2, max_size=3), shared=st.integers(0, 5000), data=st.data()
)
def test_shared_budget_holds_under_any_interleaving(cases, shared, data):
    with tempfile.TemporaryDirectory() as tmp:
        check_interleaving(cases, shared, data, tmp)


def check_interleaving(cases, shared, data, tmp_path):
    budget = MemoryBudget(shared)
    flows = [flow_bytes(size) for size, _, _ in cases]
    bufs = [ReorderBuffer(size, limit, str(tmp_path), budget=budget) for size, _, limit in cases]
    queues = [list(order) for _, order, _ in cases]
    outs: list[list] = [[] for _ in cases]
    while any(queues):
        i = data.draw(st.sampled_from([k for k, q in enumerate(queues) if q]))
        a, b = queues[i].pop(0)
        outs[i].extend(bufs[i].add(a, memoryview(flows[i])[a:b]))
        assert budget.used_bytes == sum(buf.resident_bytes for buf in bufs) <= shared
    for buf, out, flow in zip(bufs, outs, flows, strict=True):
        assert b"".join(out) == flow and buf.complete
        buf.close()
    assert budget.peak_bytes <= shared and budget.used_bytes == 0
    assert os.listdir(tmp_path) == []


def test_bad_budget_raises_value_error():
    with pytest.raises(ValueError):
        MemoryBudget(-1)
