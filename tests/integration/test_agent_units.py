"""Unit tests of the agent's parts: sources/sinks, OutFlow (resend, rewind), InFlow, CLI parsing."""

import os
import random
import shutil
import socket

import pytest
import trio
import trio.testing

from terra_agent.cli import build_parser, main
from terra_agent.config import parse_memory
from terra_agent.pending import HeldChunk, PendingChunks
from terra_agent.receiver import READY_BATCH_BYTES, HashQueue, InFlow
from terra_agent.sender import (
    MIN_CHUNK_BYTES,
    MIN_UNSENT_BYTES,
    FlowGroupSender,
    OutFlow,
    chunk_bytes,
)
from terra_agent.sources import (
    MAX_CHUNK_BYTES,
    SYNTHETIC_PERIOD,
    FileSink,
    SourceError,
    SyntheticSource,
    open_sink,
    open_source,
    synthetic_digest,
)
from terra_agent.tcp_options import allow_unsent_bytes, detect_dead_peers
from terra_security.integrity import LEAF_BYTES, FlowDigest, FlowKeys, flow_digest
from terra_wire.control import FlowSpec, ProtocolError

KEY = "5a" * 32  # the flow key of spec()'s flows


def spec(size, **kw):
    return FlowSpec("c1", "f1", "a", "b", "LA", size, digest_key=KEY, **kw)


def whole(source, size):
    return b"".join(
        bytes(source.read(o, min(MAX_CHUNK_BYTES, size - o)))
        for o in range(0, size, MAX_CHUNK_BYTES)
    )


def test_synthetic_source_is_deterministic_and_aperiodic_at_chunk_scale():
    size = 3 * MAX_CHUNK_BYTES
    a, b = SyntheticSource("c1/f1", size), SyntheticSource("c1/f1", size)
    assert whole(a, size) == whole(b, size)
    assert bytes(a.read(0, 64)) != bytes(SyntheticSource("c1/f2", size).read(0, 64))
    # chunk-aligned pieces differ: the period (odd) is not a multiple of the chunk size
    assert bytes(a.read(0, 4096)) != bytes(a.read(MAX_CHUNK_BYTES, 4096))
    # byte i is block[i % period]
    assert bytes(a.read(SYNTHETIC_PERIOD + 5, 10)) == bytes(a.read(5, 10))
    big = bytes(a.read(7, MAX_CHUNK_BYTES))  # one read spans ~4 periods
    assert big[: 2 * SYNTHETIC_PERIOD] == bytes(a.read(7, 2 * SYNTHETIC_PERIOD))
    assert big[3 * SYNTHETIC_PERIOD :][:100] == big[:100] == bytes(a.read(7, 100))
    assert bytes(SyntheticSource("c1/f0", 0).read(0, 0)) == b""
    a.close()  # dropping the block does not change the bytes
    assert bytes(a.read(5, 10)) == bytes(b.read(5, 10))
    with pytest.raises(ValueError):
        a.read(size - 1, 2)


def test_file_source_checks_and_reads(tmp_path):
    path = tmp_path / "s"
    path.write_bytes(b"0123456789")
    root = str(tmp_path)
    src = open_source("file:s", "k", 10, data_root=root)
    assert src.read(3, 4) == b"3456"
    with pytest.raises(SourceError, match="has 10 bytes"):
        open_source("file:s", "k", 11, data_root=root)
    with pytest.raises(SourceError, match="cannot open"):
        open_source("file:missing", "k", 1, data_root=root)
    with pytest.raises(SourceError, match="unknown source"):
        open_source("ftp:x", "k", 1)


def test_file_sink_resume_and_truncate(tmp_path):
    """Bytes go to PATH.terra-part (resumed from its length), PATH appears only on commit();
    a fresh (resume=False) sink truncates the part file, never the destination."""
    path = tmp_path / "d"
    part = tmp_path / "d.terra-part"
    part.write_bytes(b"abcdef")
    sink = FileSink(str(path), 100, resume=True)
    assert sink.resume_offset == 6
    h = FlowDigest(FlowKeys(KEY), 6)
    sink.prefix_hash(h)
    assert h.hexdigest() == flow_digest(KEY, b"abcdef")
    sink.write(b"gh")
    sink.close()
    assert part.read_bytes() == b"abcdefgh" and not path.exists()
    sink.commit()
    assert path.read_bytes() == b"abcdefgh" and not part.exists()
    assert open_sink("file:d", 100, resume=False, data_root=str(tmp_path)).resume_offset == 0
    assert path.read_bytes() == b"abcdefgh" and part.read_bytes() == b""


def test_outflow_sends_every_byte_and_digest_on_last_chunk():
    size = 2 * MAX_CHUNK_BYTES + 7
    flow = OutFlow(spec(size), SyntheticSource("c1/f1", size))
    keys = FlowKeys(KEY)
    chunks = []
    while (item := flow.take(MAX_CHUNK_BYTES)) is not None:
        chunks.append(item)
    assert [(o, len(d)) for o, d, _, _ in chunks] == [
        (0, MAX_CHUNK_BYTES),
        (MAX_CHUNK_BYTES, MAX_CHUNK_BYTES),
        (2 * MAX_CHUNK_BYTES, 7),
    ]
    assert all(m == keys.leaf_macs(o, d) for o, d, m, _ in chunks)  # each chunk's leaf MACs
    assert [dig is not None for _, _, _, dig in chunks] == [False, False, True]
    assert chunks[-1][3] == synthetic_digest("c1", "f1", size, KEY)


L = LEAF_BYTES


def test_outflow_requeue_resends_only_unacked_bytes():
    size = 8 * L
    flow = OutFlow(spec(size), SyntheticSource("c1/f1", size))
    for _ in range(4):
        flow.take(2 * L)  # everything sent
    assert flow.take(2 * L) is None
    flow.on_ack(3 * L, epoch=1)
    assert not flow.requeue(0, 2 * L)  # fully acknowledged: nothing to resend
    assert flow.requeue(2 * L, 2 * L)  # 3 L..4 L still unacknowledged
    offset, data, macs, digest = flow.take(2 * L)
    assert (offset, len(data), digest) == (3 * L, L, None)
    assert bytes(data) == bytes(SyntheticSource("c1/f1", size).read(3 * L, L))
    assert macs == FlowKeys(KEY).leaf_macs(3 * L, data)


def test_outflow_acks_epochs_rewind_and_ignore_stale():
    size = 8 * L + 5
    flow = OutFlow(spec(size), SyntheticSource("c1/f1", size))
    while flow.take(2 * L) is not None:
        pass
    flow.on_ack(6 * L, epoch=5)
    assert not flow.on_ack(4 * L, epoch=5)  # reordered old ack of the same receiver: ignored
    assert flow.acked == 6 * L
    assert not flow.on_ack(7 * L, epoch=4)  # an older incarnation: ignored
    assert flow.acked == 6 * L
    assert flow.on_ack(L + 100, epoch=6)  # receiver restarted and kept L + 100: rewind
    assert flow.acked == L + 100
    resent = []
    while (item := flow.take(4 * L)) is not None:
        resent.append((item[0], len(item[1]), item[3]))
    # from the leaf boundary at or below L + 100 again; the last chunk carries the digest
    assert resent == [
        (L, 4 * L, None),
        (5 * L, 3 * L + 5, synthetic_digest("c1", "f1", size, KEY)),
    ]


def test_outflow_resumed_sender_jumps_forward_with_correct_digest():
    size = 8 * L + 5
    flow = OutFlow(spec(size, offset=2 * L + 9), SyntheticSource("c1/f1", size))
    assert flow.next_offset == 2 * L  # bytes before the offset's leaf were MACed, not sent
    flow.on_ack(6 * L, epoch=1)  # the receiver holds more than the controller knew
    offset, data, macs, digest = flow.take(MAX_CHUNK_BYTES)
    assert (offset, len(data)) == (6 * L, 2 * L + 5)
    assert digest == synthetic_digest("c1", "f1", size, KEY)


def test_inflow_out_of_order_duplicates_and_digest(tmp_path):
    size = 1000
    data = os.urandom(size)
    flow = InFlow(spec(size), memory_limit=300, spill_dir=str(tmp_path))
    digest = flow_digest(KEY, data)
    order = [(600, 1000), (200, 600), (200, 400), (0, 300), (900, 1000)]
    for start, end in order:
        flow.add(start, data[start:end], digest if end == size else None)
    assert flow.delivered == size and flow.check_digest() and flow.digest == digest


def test_inflow_digest_mismatch_and_bad_chunks(tmp_path):
    flow = InFlow(spec(10), memory_limit=100, spill_dir=str(tmp_path))
    with pytest.raises(ProtocolError, match="runs past"):
        flow.add(5, b"x" * 6)
    flow.add(0, b"x" * 10, "00" * 64)
    assert not flow.check_digest() and "digest mismatch" in flow.failed
    with pytest.raises(ProtocolError, match="digest changed"):
        flow.add(0, b"x" * 10, "11" * 64)


def test_inflow_file_sink_resume(tmp_path):
    data = os.urandom(3 * L)
    path = tmp_path / "out"
    (tmp_path / "out.terra-part").write_bytes(data[: L + 200])
    digest = flow_digest(KEY, data)
    flow = InFlow(
        spec(3 * L, offset=150, sink="file:out"), 100, str(tmp_path), data_root=str(tmp_path)
    )
    assert flow.base == L  # the file holds more than the controller's offset (cut to a leaf)
    assert (tmp_path / "out.terra-part").stat().st_size == L
    flow.add(100, data[100:], digest)  # overlapping resend: the first L - 100 bytes are dropped
    assert flow.check_digest()
    assert path.read_bytes() == data


def test_chunk_bytes_clamped():
    assert chunk_bytes(0) == MIN_CHUNK_BYTES == LEAF_BYTES
    assert chunk_bytes(10e6) == LEAF_BYTES  # 10 MB/s x 10 ms = 100 KB: one whole leaf
    assert chunk_bytes(40e6) == 6 * LEAF_BYTES  # 400 KB: six whole leaves
    assert chunk_bytes(1e12) == MAX_CHUNK_BYTES


def test_parse_memory():
    assert parse_memory("64M") == 64 << 20
    assert parse_memory("1.5K") == 1536
    assert parse_memory("123") == 123
    for bad in ("-1", "x", "inf"):
        with pytest.raises(ValueError):
            parse_memory(bad)


def test_cli_parsing_and_errors(tmp_path, capsys):
    args = build_parser().parse_args(
        [
            "--controller",
            "127.0.0.1:7000",
            "--dc",
            "HK",
            "--id",
            "a",
            "--data-addr",
            "127.0.0.2:9000",
            "--insecure",
        ]
    )
    assert args.controller == [("127.0.0.1", 7000)] and args.data_addr == ("127.0.0.2", 9000)
    several = ["--controller", "127.0.0.1:7000,[::1]:7001,127.0.0.1:7000", "--dc", "HK",
               "--id", "a", "--data-addr", "h:1", "--insecure"]  # fmt: skip
    assert build_parser().parse_args(several).controller == [("127.0.0.1", 7000), ("::1", 7001)]
    with pytest.raises(SystemExit) as exc:
        main(["--controller", "nohost", "--dc", "HK", "--id", "a", "--data-addr", "h:1",
              "--insecure"])  # fmt: skip
    assert exc.value.code == 2 and "host:port" in capsys.readouterr().err
    base = ["--controller", "h:1", "--dc", "HK", "--id", "a", "--data-addr", "h:1"]
    assert main(base + ["--pki", str(tmp_path / "nopki")]) == 2  # no certificate there
    with pytest.raises(SystemExit) as exc:
        main(base)  # neither --pki nor --insecure
    assert exc.value.code == 2
    (tmp_path / "file").write_text("")  # a spill dir that cannot be created
    assert main(base + ["--insecure", "--spill-dir", str(tmp_path / "file" / "d")]) == 1


def test_inflow_restarted_after_all_bytes_still_verifies(tmp_path):
    """The receiver wrote every byte, then restarted before reporting: the sender's digest was
    kept next to the file, so the new incarnation verifies without any chunk arriving."""
    data = os.urandom(300)
    path = tmp_path / "out"
    digest = flow_digest(KEY, data)
    root = str(tmp_path)
    first = InFlow(spec(300, sink="file:out"), 100, root, data_root=root)
    first.add(0, data, digest)
    first.close()  # "crash" before check_digest/report
    assert not path.exists()  # not moved into place before the digest was checked
    again = InFlow(spec(300, offset=300, sink="file:out"), 100, root, data_root=root)
    assert again.base == 300 and again.check_digest() and again.digest == digest
    assert path.read_bytes() == data
    fresh = InFlow(spec(300, sink="file:out"), 100, root, data_root=root)  # offset 0: start over
    assert fresh.base == 0 and fresh.expected_digest is None


async def test_detect_dead_peers_sets_user_timeout_and_keepalive():
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    port = listeners[0].socket.getsockname()[1]
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    detect_dead_peers(stream, timeout_s=6)
    sock = stream.socket
    assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) == 1
    assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT) == 6000
    assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE) == 3
    await stream.aclose()
    for listener in listeners:
        await listener.aclose()


async def test_allow_unsent_bytes_sets_notsent_lowat():
    """trio's SocketStream queues at most 16 KiB of unsent bytes; data links raise it to one
    chunk (TCP_NOTSENT_LOWAT, read back from the kernel)."""
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    port = listeners[0].socket.getsockname()[1]
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    lowat = socket.TCP_NOTSENT_LOWAT
    assert stream.socket.getsockopt(socket.IPPROTO_TCP, lowat) == MIN_UNSENT_BYTES == 16384
    allow_unsent_bytes(stream, MAX_CHUNK_BYTES)
    assert stream.socket.getsockopt(socket.IPPROTO_TCP, lowat) == MAX_CHUNK_BYTES
    await stream.aclose()
    for listener in listeners:
        await listener.aclose()


def test_outflow_jumps_and_resends_keep_the_digest():
    """Chunks of two leaves, an ack jumping the frontier forward (MACs made from the source
    for the skipped bytes), a rewind: the digest is the flow's."""
    size = 20 * L + 5
    flow = OutFlow(spec(size), SyntheticSource("c1/f1", size))
    for _ in range(3):
        flow.take(2 * L)
    flow.on_ack(12 * L + 7, epoch=1)  # receiver holds more: frontier jumps to a leaf boundary
    assert flow.next_offset == 12 * L
    last = None
    while (item := flow.take(2 * L)) is not None:
        last = item
    assert last[0] + len(last[1]) == size
    assert last[3] == flow.digest == synthetic_digest("c1", "f1", size, KEY)


async def test_inflow_receive_from_concurrent_tasks_hashes_in_delivery_order(tmp_path):
    """Chunks of 64 KiB from four tasks in a shuffled order, some duplicated: receive() queues
    the in-order bytes, a consume() task hashes and writes them (in worker threads for batches
    >= THREAD_HASH_BYTES) in order; acknowledged follows what consume() finished."""
    size = 4 * MAX_CHUNK_BYTES + 3
    data = os.urandom(size)
    sink = tmp_path / "out"
    flow = InFlow(
        spec(size, sink="file:out"),
        memory_limit=1 << 20,
        spill_dir=str(tmp_path),
        data_root=str(tmp_path),
    )
    digest = flow_digest(KEY, data)
    step = 64 * 1024
    chunks = [(o, data[o : o + step]) for o in range(0, size, step)]
    rng = random.Random(7)
    rng.shuffle(chunks)
    chunks += chunks[:5]  # duplicates
    consumed, added = [], []

    async def consume():
        while n := await flow.consume():
            consumed.append(n)
            assert flow.acknowledged == sum(consumed) <= flow.delivered

    async with trio.open_nursery() as nursery:
        nursery.start_soon(consume)
        for k in range(4):
            mine = chunks[k::4]

            async def feed(mine=mine):
                for offset, piece in mine:
                    end = offset + len(piece)
                    added.append(await flow.receive(offset, piece, digest if end == size else None))
                    await trio.sleep(0)

            nursery.start_soon(feed)
    assert flow.complete and flow.check_digest() and flow.digest == digest
    assert flow.acknowledged == size and sum(consumed) == size
    # receive() returns the in-order bytes it queued (duplicates: 0); spilled bytes a gap fill
    # left ready beyond READY_BATCH_BYTES were queued by consume() instead, so <= size
    assert 0 < sum(added) <= size and added.count(0) >= 5
    assert sink.read_bytes() == data


async def test_inflow_sink_write_failure_fails_the_flow_and_frees_waiters(tmp_path):
    """A file sink that cannot be written (its directory is gone before the first write opens
    the file): consume() fails the flow with a clear message, nothing is acknowledged, and
    receive() neither queues more bytes nor waits for a consumer."""
    gone = tmp_path / "gone"
    gone.mkdir()
    flow = InFlow(spec(1000, sink="file:gone/out"), 1 << 20, str(tmp_path), data_root=str(tmp_path))
    shutil.rmtree(gone)
    await flow.receive(0, b"x" * 500)
    assert await flow.consume() == 0
    assert "sink write failed" in flow.failed and flow.acknowledged == 0
    await flow.receive(500, b"y" * 500)
    assert await flow.consume() == 0
    assert not flow.check_digest() and not flow.done


async def test_hash_queue_bounds_unhashed_bytes_of_all_flows_together(tmp_path):
    """Two flows share a HashQueue of 100 bytes: a receive() that leaves more than 100 queued
    waits until a consumer takes bytes out, whichever flow's (80 + 50 = 130 > 100)."""
    queue = HashQueue(100)
    a = InFlow(FlowSpec("c1", "fa", "a", "b", "LA", 1000), 1 << 20, str(tmp_path), queue=queue)
    b = InFlow(FlowSpec("c1", "fb", "a", "b", "LA", 1000), 1 << 20, str(tmp_path), queue=queue)
    assert await a.receive(0, b"a" * 80) == 80  # 80 queued: returns at once
    returned = []

    async def receive_b():
        await b.receive(0, b"b" * 50)
        returned.append(queue.queued_bytes)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(receive_b)
        await trio.testing.wait_all_tasks_blocked()
        assert not returned and queue.queued_bytes == 130 == queue.peak_bytes
        assert await a.consume() == 80  # flow a's consumer frees 80: b's receive returns
    assert returned == [50]
    assert await b.consume() == 50 and queue.queued_bytes == 0 and b.acknowledged == 50


async def test_gap_fill_after_a_long_spill_is_queued_in_bounded_batches(tmp_path):
    """A 24 MiB + 5 flow in 256 KiB chunks, memory limit 0: chunks 1.. arrive first and all
    spill (24 MiB + 5 - 256 KiB). Filling the gap queues chunk 0 + READY_BATCH_BYTES (4 MiB =
    16 spilled chunks) only; consume() queues the rest in batches of at most 4 MiB, each once
    the HashQueue (limit 1 MiB) is not full, so its peak is 256 KiB + 4 MiB <= 1 MiB + 4 MiB,
    not the 24 MiB that spilled. The sync add() path drains everything at once, in batches."""
    step, size, limit = 256 * 1024, (24 << 20) + 5, 1 << 20
    data = os.urandom(size)
    digest = flow_digest(KEY, data)
    chunks = [(o, data[o : o + step]) for o in range(0, size, step)]
    spill_dir = tmp_path / "spill"
    spill_dir.mkdir()
    sink = tmp_path / "out"
    queue = HashQueue(limit)
    flow = InFlow(
        spec(size, sink="file:out"), 0, str(spill_dir), queue=queue, data_root=str(tmp_path)
    )
    for offset, piece in chunks[1:]:
        end = offset + len(piece)
        assert await flow.receive(offset, piece, digest if end == size else None) == 0
    assert flow.reorder_stats() == (0, size - step) and queue.queued_bytes == 0
    made, batches = [], []

    async def fill_the_gap():  # waits in receive() until consume() takes what it queued
        made.append(await flow.receive(0, chunks[0][1]))

    with trio.fail_after(60):  # a hang guard, not a timing assertion
        async with trio.open_nursery() as nursery:
            nursery.start_soon(fill_the_gap)
            await trio.testing.wait_all_tasks_blocked()
            assert flow.delivered == queue.queued_bytes == step + READY_BATCH_BYTES
            assert flow.ready_bytes == size - flow.delivered and not flow.complete
            while n := await flow.consume():
                batches.append(n)
                assert flow.acknowledged == sum(batches) <= flow.delivered
                assert flow.complete == (sum(batches) == size)
    assert made == [step + READY_BATCH_BYTES]
    assert batches[0] == made[0] and max(batches[1:]) <= READY_BATCH_BYTES and sum(batches) == size
    assert queue.peak_bytes <= limit + READY_BATCH_BYTES and queue.queued_bytes == 0
    assert flow.check_digest() and flow.digest == digest and sink.read_bytes() == data
    assert os.listdir(spill_dir) == []  # the spill file went with the reorder buffer

    inline = InFlow(spec(size), 0, str(spill_dir))
    for offset, piece in reversed(chunks):
        inline.add(offset, piece, digest if offset + len(piece) == size else None)
    assert inline.delivered == inline.acknowledged == size and inline.ready_bytes == 0
    assert inline.check_digest() and os.listdir(spill_dir) == []


async def test_ready_bytes_wait_while_the_shared_hash_queue_is_full(tmp_path):
    """Flows a (6 MiB, 1 MiB chunks, all but the first spilled) and b share a 1 MiB HashQueue.
    a's gap fill queues 1 + 4 MiB (READY_BATCH_BYTES); a consumes them, then its last 1 MiB is
    ready, but b has 2 MiB queued (> 1 MiB): a's consume() waits until b's takes them."""
    mib = 1 << 20
    queue = HashQueue(mib)
    a_data, b_data = os.urandom(6 * mib), os.urandom(2 * mib)
    a = InFlow(FlowSpec("c1", "fa", "a", "b", "LA", 6 * mib), 0, str(tmp_path), queue=queue)
    b = InFlow(FlowSpec("c1", "fb", "a", "b", "LA", 2 * mib), 0, str(tmp_path), queue=queue)
    for offset in range(mib, 6 * mib, mib):
        assert await a.receive(offset, a_data[offset : offset + mib]) == 0
    consumed = []

    async def consume_a():
        consumed.append(await a.consume())

    with trio.fail_after(60):  # a hang guard, not a timing assertion
        async with trio.open_nursery() as nursery:
            nursery.start_soon(b.receive, 0, b_data)  # 2 MiB > 1 MiB queued: waits
            nursery.start_soon(a.receive, 0, a_data[:mib])  # queues 1 + 4 MiB: waits
            await trio.testing.wait_all_tasks_blocked()
            assert queue.queued_bytes == 7 * mib and a.ready_bytes == mib
            assert await a.consume() == 5 * mib  # 2 MiB (b's) still queued: full
            nursery.start_soon(consume_a)
            await trio.testing.wait_all_tasks_blocked()
            assert consumed == [] and a.delivered == 5 * mib and a.ready_bytes == mib
            assert await b.consume() == 2 * mib  # room again: a queues, consumes its last 1 MiB
    assert consumed == [mib] and a.complete and b.complete
    assert a.hasher.hexdigest() == flow_digest(a.spec.digest_key, a_data)
    assert queue.peak_bytes == 7 * mib and queue.queued_bytes == 0
    a.close()
    b.close()
    assert os.listdir(tmp_path) == []


def held(n, stream):
    return HeldChunk(0, b"x" * n, None, stream, None, "a")


def test_pending_chunks_bound_pop_and_drop_stream():
    s1, s2 = object(), object()  # connection identities only
    store = PendingChunks(limit_bytes=100)
    assert store.add(("c", "f"), held(60, s1)) is True  # first chunk of the flow
    assert store.add(("c", "f"), held(30, s2)) is False  # 90 held
    assert store.add(("c", "g"), held(11, s1)) is None  # 90 + 11 > 100: refused, not held
    assert store.add(("c", "g"), held(10, s1)) is True  # exactly 100
    assert store.held_bytes == store.peak_bytes == 100
    assert store.drop_stream(s1) == 70  # 60 of f, 10 of g
    assert list(store.held) == [("c", "f")] and store.held_bytes == 30
    assert [len(c.payload) for c in store.pop(("c", "f"))] == [30]
    assert store.held_bytes == 0 and store.dropped_bytes == 70 and store.pop(("c", "x")) == []
    with pytest.raises(ValueError):
        PendingChunks(-1)


async def test_path_idle_through_a_rate_drop_sends_chunks_of_the_new_rate():
    """A path task that went idle at an unlimited rate (4 MiB chunks, no tokens charged: its
    first flow is sent and waits for acks) and wakes after its rate fell to 10 Mbit/s
    (20e6 bytes/s) for a new flow sends chunks of the new rate's size: 20e6 x 10 ms = 200 KB,
    3 whole leaves = 196,608 bytes, not the new flow's 1,000,000 bytes in one burst outside
    the new limit."""
    sent = []
    changed = trio.Event()

    class RecordingLink:  # stands for a PeerLink: records what the path task sends
        up = True

        async def send_chunk(self, flow, offset, data, macs, digest, n):
            sent.append((flow.spec.flow, len(data)))
            changed.set()
            return True

    link = RecordingLink()
    async with trio.open_nursery() as nursery:
        group = FlowGroupSender(
            ("c1", "LA"), lambda peer, tunnel: link, nursery.start_soon, lambda f, m: None
        )
        group.set_rates({"t1": float("inf")})
        group.add_flow(OutFlow(spec(10_000), SyntheticSource("c1/f1", 10_000)))
        await changed.wait()
        await trio.testing.wait_all_tasks_blocked()  # f1 sent, unacked: the path task idles
        changed = trio.Event()
        group.set_rates({"t1": 20e6})
        group.add_flow(
            OutFlow(FlowSpec("c1", "f2", "a", "b", "LA", 10**6), SyntheticSource("c1/f2", 10**6))
        )
        await changed.wait()
        nursery.cancel_scope.cancel()
    assert sent[0] == ("f1", 10_000)
    assert sent[1] == ("f2", chunk_bytes(20e6)) == ("f2", 196_608)


def test_outflow_of_a_finished_flow_stays_done_with_its_digest():
    size = 3 * L + 5  # the last leaf is short: the offset is the size, not a leaf boundary
    flow = OutFlow(spec(size, offset=size), SyntheticSource("c1/f1", size))
    assert flow.done and flow.take(4 * L) is None
    assert flow.digest == synthetic_digest("c1", "f1", size, KEY)
