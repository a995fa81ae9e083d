"""Frame format: round trips over real loopback TCP and every kind of bad frame."""

import hashlib
import socket
import struct
import zlib

import msgpack
import pytest
import trio
import trio.testing
from hypothesis import given, settings
from hypothesis import strategies as st

from overlay.framing import FrameReader, FrameWriter, PayloadBuffers, send_frame
from terra_security.integrity import MAC_BYTES, mac_bytes
from terra_wire.frames import (
    MAX_HEADER_BYTES,
    MAX_PAYLOAD_BYTES,
    VERSION,
    FrameError,
    chunk_header,
    encode_frame,
)

MAC = bytes(range(MAC_BYTES))  # framing only checks the MACs' type and length


def macs(payload) -> bytes:
    """A MAC list of the right length for `payload` (its value is the agent's business)."""
    return bytes(mac_bytes(len(payload)))


async def tcp_pair():
    """A connected (client, server) pair of trio.SocketStreams on 127.0.0.1."""
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    port = listeners[0].socket.getsockname()[1]
    client = await trio.open_tcp_stream("127.0.0.1", port)
    server = await listeners[0].accept()
    await listeners[0].aclose()
    return client, server


def pattern(n: int, seed: int = 0) -> bytes:
    """n deterministic pseudo-random bytes (different for each seed)."""
    return hashlib.shake_256(seed.to_bytes(4, "big")).digest(n)


def raw_frame(header_bytes: bytes, payload: bytes = b"") -> bytes:
    return struct.pack(">I", len(header_bytes)) + header_bytes + payload


async def read_raw(data: bytes, max_payload: int = MAX_PAYLOAD_BYTES):
    """Send raw bytes over real TCP, close, and read one frame from the other side."""
    client, server = await tcp_pair()
    result = []

    async def send_and_close():
        try:
            await client.send_all(data)
        except trio.BrokenResourceError:
            pass  # the reader gave up on a bad frame and closed its side
        await client.aclose()

    async def read_one():
        try:
            result.append(await FrameReader(server, max_payload=max_payload).read())
        except FrameError as exc:
            result.append(exc)
        finally:
            await server.aclose()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(send_and_close)
        nursery.start_soon(read_one)
    if isinstance(result[0], FrameError):
        raise result[0]
    return result[0]


SIZES = [0, 1, 1000, 16 * 1024, 16 * 1024 + 1, 300_000, 1 << 20, MAX_PAYLOAD_BYTES]


async def test_chunk_round_trip_over_tcp_all_sizes():
    client, server = await tcp_pair()
    payloads = [pattern(n, seed=i) for i, n in enumerate(SIZES)]
    received = []

    async def sender():
        offset = 0
        for p in payloads:
            await send_frame(client, chunk_header("cf1", "f1", offset, p, macs(p)), p)
            offset += len(p)
        await client.aclose()

    async def receiver():
        reader = FrameReader(server)
        while (frame := await reader.read()) is not None:
            received.append(frame)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(sender)
        nursery.start_soon(receiver)
    await server.aclose()

    assert len(received) == len(payloads)
    offset = 0
    for (header, payload), sent in zip(received, payloads, strict=True):
        assert header["v"] == VERSION and header["t"] == "chunk"
        assert (header["c"], header["f"], header["o"]) == ("cf1", "f1", offset)
        assert header["n"] == len(sent) == len(payload)
        assert header["m"] == macs(sent)  # framing carries the MACs; the agent checks them
        assert bytes(payload) == sent
        offset += len(sent)


def test_payload_buffers_reuse_only_unreferenced_buffers():
    pool = PayloadBuffers(size=1000, count=2)
    a = pool.take(600)
    assert len(a) == 600
    a[:] = b"a" * 600
    part = a[100:200]  # a slice keeps the buffer in use after the view itself is gone
    del a
    b = pool.take(1000)  # the first buffer is still referenced: a second one
    b[:] = b"b" * 1000
    assert bytes(part) == b"a" * 100
    c = pool.take(10)  # both kept buffers in use, count reached: a fresh, unkept one
    c[:] = b"c" * 10
    assert bytes(part) == b"a" * 100 and bytes(b[:3]) == b"bbb"
    del part
    d = pool.take(5)  # the first buffer is free again: reused (its old bytes show through)
    assert bytes(d) == b"a" * 5
    with pytest.raises(ValueError, match="limit 1000"):
        pool.take(1001)
    with pytest.raises(ValueError, match="count"):
        PayloadBuffers(size=10, count=0)


async def test_reader_with_payload_buffers_keeps_held_payloads_intact():
    """Payloads of the pool's buffer size are read into reused buffers: payloads still held by
    the caller are never overwritten by later frames, released ones are reused (2 buffers for
    12 frames)."""
    client, server = await tcp_pair()
    size = 300_000  # == the pool's buffer size: received into the pool
    payloads = [pattern(size, seed=i) for i in range(12)]
    pool = PayloadBuffers(size=size, count=2)
    held = []

    async def sender():
        for i, p in enumerate(payloads):
            await send_frame(client, chunk_header("c", "f", i * size, p, macs(p)), p)
        await client.aclose()

    async def receiver():
        reader = FrameReader(server, buffers=pool)
        i = 0
        while (frame := await reader.read()) is not None:
            header, payload = frame
            assert bytes(payload) == payloads[i]
            if i % 4 == 0:
                held.append((i, payload))  # kept: its buffer must not be reused
            i += 1

    async with trio.open_nursery() as nursery:
        nursery.start_soon(sender)
        nursery.start_soon(receiver)
    await server.aclose()
    assert [i for i, _ in held] == [0, 4, 8]
    for i, payload in held:
        assert bytes(payload) == payloads[i]
    assert len(pool._kept) == 2


async def test_many_small_frames_and_control_frames_keep_order():
    client, server = await tcp_pair()
    async with client, server:

        async def sender():
            for i in range(500):
                if i % 3 == 0:
                    await send_frame(client, {"t": "heartbeat", "seq": i})
                else:
                    p = pattern(i, seed=i)
                    await send_frame(client, chunk_header("c", str(i), i, p, macs(p)), p)
            await client.aclose()

        got = []

        async def receiver():
            reader = FrameReader(server)
            while (frame := await reader.read()) is not None:
                got.append(frame)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(sender)
            nursery.start_soon(receiver)
    assert len(got) == 500
    for i, (header, payload) in enumerate(got):
        if i % 3 == 0:
            assert header == {"t": "heartbeat", "seq": i, "v": 1, "n": 0}
            assert len(payload) == 0
        else:
            assert header["f"] == str(i) and bytes(payload) == pattern(i, seed=i)


class Dribble(trio.abc.ReceiveStream):
    """Hands over a byte string in pieces of the given sizes (cycled): exercises the
    non-socket path and every partial-read boundary of the reader."""

    def __init__(self, data: bytes, sizes: list[int]):
        self.data, self.sizes, self.pos, self.i = data, sizes, 0, 0

    async def receive_some(self, max_bytes=None):
        await trio.lowlevel.checkpoint()
        n = min(self.sizes[self.i % len(self.sizes)], max_bytes or 1 << 30)
        self.i += 1
        piece = self.data[self.pos : self.pos + n]
        self.pos += len(piece)
        return piece

    async def aclose(self):
        pass


async def read_frames(stream) -> list:
    reader = FrameReader(stream)
    out = []
    while (frame := await reader.read()) is not None:
        out.append((frame[0], bytes(frame[1])))
    return out


def frames_bytes(frames) -> bytes:
    return b"".join(b"".join(encode_frame(h, p)) for h, p in frames)


async def test_generic_stream_path_with_tiny_receives():
    payloads = [pattern(n, seed=n) for n in (0, 5, 20_000, 70_000, 300_000)]
    frames = [(chunk_header("c", "f", i, p, macs(p)), p) for i, p in enumerate(payloads)]
    frames.append(({"t": "big-header", "pad": "z" * 60_000}, b""))  # header near 64 KiB
    got = await read_frames(Dribble(frames_bytes(frames), [1, 3, 7, 4096, 2]))
    assert [p for _, p in got] == payloads + [b""]
    assert got[-1][0]["pad"] == "z" * 60_000


RECEIVES = 10_000  # at most about this many receives per example (each some 10 µs)


@st.composite
def frames_and_pieces(draw):
    """Payload sizes up to past the reader's 256 KiB buffer, and receive sizes (cycled) of
    1 byte up when the frames are small; with large frames the smallest receive grows so that
    an example takes at most about RECEIVES receives (1-byte receives of 2 MB would take
    2 million, some 20 s, and split no more boundaries than they do in a small example)."""
    sizes = draw(st.lists(st.integers(min_value=0, max_value=300_000), min_size=1, max_size=8))
    smallest = max(1, (sum(sizes) + 200 * len(sizes)) // RECEIVES)  # ~200 B of header each
    pieces = draw(st.lists(st.integers(smallest, 400_000), min_size=1, max_size=5))
    return sizes, pieces


@settings(max_examples=60, deadline=None)
@given(frames_and_pieces())
async def test_any_receive_boundaries_give_the_same_frames(sizes_and_pieces):
    sizes, pieces = sizes_and_pieces
    frames = [
        (chunk_header("c", str(i), i, pattern(n, i), macs(pattern(n, i))), pattern(n, i))
        for i, n in enumerate(sizes)
    ]
    got = await read_frames(Dribble(frames_bytes(frames), pieces))
    assert [(h["f"], p) for h, p in got] == [(str(i), p) for i, (_, p) in enumerate(frames)]


def test_encode_frame_sets_version_and_length_and_does_not_copy_payload():
    header = {"t": "chunk", "c": "a", "f": "b", "o": 7, "m": MAC}
    payload = bytearray(b"x" * 100_000)
    parts = encode_frame(header, payload)
    assert parts[1] is payload  # the payload object itself, not a copy
    assert "v" not in header and "n" not in header  # caller's dict untouched
    (hlen,) = struct.unpack(">I", parts[0][:4])
    decoded = msgpack.unpackb(parts[0][4 : 4 + hlen])
    assert decoded["v"] == 1 and decoded["n"] == 100_000 and len(parts[0]) == 4 + hlen
    assert len(encode_frame({"t": "heartbeat"})) == 1  # no payload part when empty


def test_encode_frame_rejects_bad_input():
    with pytest.raises(FrameError, match="dict"):
        encode_frame(["t", "x"])
    with pytest.raises(FrameError, match="'t'"):
        encode_frame({"type": "x"})
    with pytest.raises(FrameError, match="packed"):
        encode_frame({"t": "x", "obj": object()})
    with pytest.raises(FrameError, match="header is"):
        encode_frame({"t": "x", "big": "y" * MAX_HEADER_BYTES})
    with pytest.raises(FrameError, match="limit"):
        encode_frame({"t": "x"}, bytes(MAX_PAYLOAD_BYTES + 1))
    with pytest.raises(FrameError, match="bytes-like"):
        encode_frame({"t": "x"}, "text")


def test_chunk_header_fields_and_errors():
    h = chunk_header("c", "f", 10, b"abc", MAC)
    assert h == {"t": "chunk", "c": "c", "f": "f", "o": 10, "n": 3, "m": MAC}
    for bad in (b"short", MAC + b"x", "0" * 16, None):
        with pytest.raises(FrameError, match="MAC"):
            chunk_header("c", "f", 0, b"", bad)
    with pytest.raises(FrameError):
        chunk_header(1, "f", 0, b"", b"")
    with pytest.raises(FrameError):
        chunk_header("c", "f", -1, b"", b"")
    with pytest.raises(FrameError):
        chunk_header("c", "f", True, b"", b"")


async def test_clean_eof_returns_none_and_truncation_raises():
    assert await read_raw(b"") is None
    good = b"".join(encode_frame(chunk_header("c", "f", 0, b"hello", MAC), b"hello"))
    for cut in (1, 3, 4, 10, len(good) - 1):  # mid length prefix, mid header, mid payload
        with pytest.raises(FrameError, match="closed mid-frame"):
            await read_raw(good[:cut])


async def test_truncated_large_payload_over_socket_raises():
    p = pattern(1 << 20)
    good = b"".join(encode_frame(chunk_header("c", "f", 0, p, macs(p)), p))
    with pytest.raises(FrameError, match="closed mid-frame"):
        await read_raw(good[: len(good) // 2])


def packed(fields: dict) -> bytes:
    return msgpack.packb(fields, use_bin_type=True)


BAD_FRAMES = [
    (raw_frame(b"\xc1\xc1\xc1"), "malformed"),  # 0xc1 is never valid msgpack
    (raw_frame(packed({"v": 1, "t": "x"})[:-1] + b""), "malformed"),
    (raw_frame(packed([1, 2, 3])), "map"),
    (raw_frame(packed({"v": 2, "t": "x", "n": 0})), "version"),
    (raw_frame(packed({"t": "x", "n": 0})), "version"),
    (raw_frame(packed({"v": True, "t": "x", "n": 0})), "version"),
    (raw_frame(packed({"v": 1, "t": 5, "n": 0})), "'t'"),
    (raw_frame(packed({"v": 1, "t": "x", "n": -1})), "payload length"),
    (raw_frame(packed({"v": 1, "t": "x", "n": "3"})), "payload length"),
    (raw_frame(packed({"v": 1, "t": "x", "n": MAX_PAYLOAD_BYTES + 1})), "payload length"),
    (struct.pack(">I", MAX_HEADER_BYTES + 1) + b"\x80", "header length"),
    (struct.pack(">I", 0), "header length"),
    (struct.pack(">I", 0xFFFFFFFF), "header length"),
    (raw_frame(packed({"v": 1, "t": "chunk", "n": 0, "c": 1, "f": "f", "o": 0, "m": MAC})), "'c'"),
    (
        raw_frame(packed({"v": 1, "t": "chunk", "n": 0, "c": "c", "f": "f", "o": -5, "m": MAC})),
        "offset",
    ),
    (raw_frame(packed({"v": 1, "t": "chunk", "n": 0, "c": "c", "f": "f", "o": 0})), "MAC"),
    (
        raw_frame(packed({"v": 1, "t": "chunk", "n": 0, "c": "c", "f": "f", "o": 0, "m": b"1"})),
        "MAC",
    ),
    (raw_frame(packed({"v": 1, "t": "blob", "n": 0, "x": -1})), "u32"),
    (raw_frame(packed({1: 1})), "malformed"),  # non-str map key
]


@pytest.mark.parametrize(("data", "match"), BAD_FRAMES)
async def test_bad_frames_raise_clear_frame_error(data, match):
    with pytest.raises(FrameError, match=match):
        await read_raw(data)


async def test_checksum_mismatch_is_detected():
    """Frames other than chunks may carry an "x" crc32; framing checks it."""
    header = {"t": "blob", "x": zlib.crc32(b"hello")}
    head = encode_frame(header, b"hello")[0]
    with pytest.raises(FrameError, match="checksum mismatch"):
        await read_raw(head + b"hellO")


async def test_reader_max_payload_is_enforced():
    data = b"".join(encode_frame({"t": "blob"}, b"x" * 100))
    with pytest.raises(FrameError, match="payload length"):
        await read_raw(data, max_payload=99)
    header, payload = await read_raw(data, max_payload=100)
    assert bytes(payload) == b"x" * 100


async def test_frame_writer_does_not_interleave_concurrent_frames():
    client, server = await tcp_pair()
    writer = FrameWriter(client)
    size = 200_000  # large enough that one frame takes several socket writes

    async def send_many(name):
        for i in range(20):
            p = pattern(size, seed=i)
            await writer.send(chunk_header("c", name, i * size, p, macs(p)), p)

    got = []

    async def receiver():
        reader = FrameReader(server)
        while (frame := await reader.read()) is not None:
            got.append((frame[0]["f"], frame[0]["o"]))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(receiver)
        async with trio.open_nursery() as senders:
            for name in ("a", "b", "c"):
                senders.start_soon(send_many, name)
        await client.aclose()
    await server.aclose()
    assert sorted(got) == sorted((n, i * size) for n in "abc" for i in range(20))


async def test_send_on_closed_peer_raises_broken_resource():
    client, server = await tcp_pair()
    await server.aclose()
    p = bytes(1 << 20)
    with pytest.raises(trio.BrokenResourceError):
        for i in range(100):
            await send_frame(client, chunk_header("c", "f", i, p, macs(p)), p)
    await client.aclose()


async def test_stream_errors_match_trio_streams():
    client, server = await tcp_pair()
    reader = FrameReader(server)
    first = []

    async def first_reader():
        try:
            await reader.read()
        except trio.ClosedResourceError as exc:
            first.append(exc)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(first_reader)
        await trio.testing.wait_all_tasks_blocked()
        with pytest.raises(trio.BusyResourceError):
            await reader.read()  # a second concurrent reader
        await server.aclose()  # wakes the first read with ClosedResourceError ...
    assert len(first) == 1
    with pytest.raises(trio.ClosedResourceError):
        await reader.read()  # ... and later reads say closed, too
    with pytest.raises(trio.ClosedResourceError):
        await send_frame(server, {"t": "x"}, bytes(100_000))
    await client.aclose()


async def test_connection_reset_mid_frame_is_broken_resource():
    client, server = await tcp_pair()
    head = encode_frame(chunk_header("c", "f", 0, bytes(1000), MAC), bytes(1000))[0]
    await client.send_all(head + bytes(10))
    client.socket.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    await client.aclose()  # RST instead of FIN
    with pytest.raises(trio.BrokenResourceError):
        await FrameReader(server).read()
    await server.aclose()


async def test_concurrent_send_frame_without_writer_is_busy():
    client, server = await tcp_pair()  # nobody reads: the first large send blocks
    big = bytes(MAX_PAYLOAD_BYTES)

    async def fill():  # 80 MiB: more than any socket buffers hold, so it blocks
        for _ in range(20):
            await send_frame(client, {"t": "blob"}, big)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(fill)
        await trio.testing.wait_all_tasks_blocked()
        with pytest.raises(trio.BusyResourceError):
            await send_frame(client, {"t": "blob"}, big)
        nursery.cancel_scope.cancel()
    await client.aclose()
    await server.aclose()


async def test_reader_keeps_short_payloads_out_of_the_pool():
    """A payload shorter than the pool's buffers gets a buffer of its own length, so holding it
    pins exactly len(payload) bytes (what the reorder and hashing bounds count), not a whole
    pooled buffer: 300,000 bytes against 1,000,000-byte buffers."""
    client, server = await tcp_pair()
    pool = PayloadBuffers(size=1_000_000, count=2)
    data = pattern(300_000, seed=7)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(send_frame, client, chunk_header("c", "f", 0, data, macs(data)), data)
        header, payload = await FrameReader(server, buffers=pool).read()
    await client.aclose()
    await server.aclose()
    assert bytes(payload) == data
    assert memoryview(payload).obj is not None and len(memoryview(payload).obj) == 300_000
