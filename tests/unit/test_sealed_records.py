"""AEAD records of encrypted data connections (terra_security/data_records.py, overlay/sealed.py):
nonces never repeat under a key, and tampered, truncated, replayed, reflected and plain frames
are refused. Over in-memory trio streams: the frames are the agents' real ones."""

from __future__ import annotations

import os

import pytest
import trio
import trio.testing

from overlay.framing import FrameReader
from overlay.sealed import SealedPayload, SealedReader, SealedWriter
from terra_security.data_records import (
    MAX_SEQ,
    TAG_BYTES,
    TO_RECEIVER,
    TO_SENDER,
    Opener,
    RecordError,
    Sealer,
    nonce,
    pair_secret,
    tls_secret,
)
from terra_security.integrity import FlowKeys, mac_bytes, new_flow_key
from terra_wire.frames import FrameError, chunk_header, encode_frame

SECRET = bytes(range(32))
FLOW = new_flow_key()


def test_every_record_of_a_connection_gets_its_own_nonce_and_a_seal_works_once():
    """Under one key (connection secret, direction, flow attempt or control) the sequence
    numbers, hence the nonces, never repeat: one counter per direction, each value handed out
    once; a seal refuses a second use; the counter stops at 2**64 - 1."""
    sealer = Sealer(SECRET, TO_RECEIVER)
    flows = [new_flow_key() for _ in range(3)]
    seen: set[tuple[str | None, bytes]] = set()
    for i in range(3000):
        key = flows[i % 4] if i % 4 < 3 else None
        seal = sealer.reserve(key)
        iv = sealer._keys.control[1] if key is None else sealer._keys.chunk(key)[1]
        assert seal.seq == i
        pair = (key, nonce(iv, seal.seq))
        assert pair not in seen
        seen.add(pair)
    seal = sealer.reserve(FLOW)
    out = bytearray(10 + TAG_BYTES)
    assert seal.seal_into(b"aad", b"0123456789", out) == 10 + TAG_BYTES
    with pytest.raises(RecordError, match="already sealed"):
        seal.seal_into(b"aad", b"0123456789", out)
    sealer.sent = MAX_SEQ + 1
    with pytest.raises(RecordError, match="exhausted"):
        sealer.reserve(FLOW)
    ivs = {nonce(bytes(12), seq) for seq in (0, 1, 2, 255, 256, 1 << 32, MAX_SEQ)}
    assert len(ivs) == 7  # the nonce is injective in the sequence number


def test_keys_differ_per_connection_direction_and_flow():
    """The same plaintext at the same sequence number: a different ciphertext for another
    connection secret, the other direction or another flow attempt; and the connection
    secrets of both authentications depend on every input."""

    def first_record(secret, direction, key):
        return Sealer(secret, direction).reserve(key).seal(b"h", b"same bytes")

    base = first_record(SECRET, TO_RECEIVER, FLOW)
    assert base != first_record(os.urandom(32), TO_RECEIVER, FLOW)
    assert base != first_record(SECRET, TO_SENDER, FLOW)
    assert base != first_record(SECRET, TO_RECEIVER, new_flow_key())
    assert base != first_record(SECRET, TO_RECEIVER, None)
    k, n1, n2 = os.urandom(32), os.urandom(16), os.urandom(16)
    s = pair_secret(k, "a", "b", n1, n2)
    assert len(s) == 32 and s != pair_secret(k, "a", "b", n2, n1)
    assert s != pair_secret(k, "ab", "", n1, n2) and s != pair_secret(
        os.urandom(32), "a", "b", n1, n2
    )
    r1, r2 = os.urandom(32), os.urandom(32)
    assert tls_secret(r1, r2) != tls_secret(r2, r1)
    with pytest.raises(ValueError):
        tls_secret(r1, r2[:16])


async def sealed_pair(secret=SECRET):
    """(SealedWriter of a sender, SealedReader of its receiver, raw receiving stream)."""
    send, receive = trio.testing.memory_stream_one_way_pair()
    writer = SealedWriter(send, Sealer(secret, TO_RECEIVER))
    reader = SealedReader(FrameReader(receive, keep_raw=True), Opener(secret, TO_RECEIVER))
    return writer, reader, send, receive


def chunk(offset: int, data: bytes, key: str = FLOW) -> dict:
    return chunk_header("c", "f", offset, data, FlowKeys(key).leaf_macs(offset, data))


async def capture(frames) -> bytes:
    """The bytes a SealedWriter puts on the wire for [(header, payload, key)]."""
    send, receive = trio.testing.memory_stream_one_way_pair()
    writer = SealedWriter(send, Sealer(SECRET, TO_RECEIVER))
    out = bytearray()
    for header, payload, key in frames:
        await writer.send(header, payload, key)
        out += await receive.receive_some(1 << 22)
    return bytes(out)


async def read_all(wire: bytes, opener: Opener | None = None) -> list:
    """Frames a SealedReader gets from `wire`, chunks opened with FLOW."""
    send, receive = trio.testing.memory_stream_one_way_pair()
    opener = opener or Opener(SECRET, TO_RECEIVER)
    reader = SealedReader(FrameReader(receive, keep_raw=True), opener)
    await send.send_all(wire)
    await send.aclose()
    got = []
    while (frame := await reader.read()) is not None:
        header, payload = frame
        if isinstance(payload, SealedPayload):
            payload = bytes(payload.open(FLOW))
        got.append((header, payload))
    return got


async def test_records_round_trip_and_chunks_open_in_place():
    data = os.urandom(3 * 65536 + 100)
    hello = {"t": "hello", "agent": "a", "tunnel": "tunnel-name-0"}
    wire = await capture([(hello, b"", None), (chunk(0, data), data, FLOW)])
    assert data[:64] not in wire and b"tunnel-name-0" not in wire  # bytes, control fields hidden
    (h, _), (c, body) = await read_all(wire)
    assert h == hello
    assert c["t"] == "chunk" and c["n"] == len(data) and c["o"] == 0 and body == data
    assert c["m"] == FlowKeys(FLOW).leaf_macs(0, data)  # authenticated with the record


@pytest.mark.parametrize("where", ["ciphertext", "tag", "offset field", "mac field"])
async def test_a_tampered_record_is_refused(where):
    data = os.urandom(70_000)
    wire = bytearray(await capture([(chunk(0, data), data, FLOW)]))
    at = {
        "ciphertext": len(wire) - TAG_BYTES - 1000,
        "tag": len(wire) - 3,
        "offset field": wire.index(b"\xa1o") + 2,  # the "o" value (0 -> 1)
        "mac field": wire.index(b"\xa1m") + 5,
    }[where]
    wire[at] ^= 1
    with pytest.raises((RecordError, FrameError)):
        await read_all(bytes(wire))


async def test_a_truncated_record_and_a_record_without_its_tag_are_refused():
    data = os.urandom(70_000)
    wire = await capture([(chunk(0, data), data, FLOW)])
    with pytest.raises(FrameError, match="closed mid-frame"):
        await read_all(wire[:-1])
    header = {**chunk(0, data), "t": "schunk", "s": 0}
    for cut in (data, data[:-1]):  # the chunk without its tag (or its record's end) alone
        untagged = encode_frame(header, cut)
        with pytest.raises(RecordError, match="does not verify"):
            await read_all(b"".join(bytes(p) for p in untagged))


async def test_replayed_records_are_refused_on_the_same_and_on_another_connection():
    data = os.urandom(65536)
    one = await capture([(chunk(0, data), data, FLOW)])
    with pytest.raises(RecordError, match="replayed or reordered"):
        await read_all(one + one)  # the same record twice: its seq is not above the last
    two = await capture([(chunk(0, data), data, FLOW), (chunk(65536, data), data, FLOW)])
    first_len = len(one)
    with pytest.raises(RecordError, match="replayed or reordered"):
        await read_all(two[first_len:] + two[:first_len])  # reordered
    with pytest.raises(RecordError, match="does not verify"):  # another connection's secret
        await read_all(one, Opener(os.urandom(32), TO_RECEIVER))


async def test_a_reflected_record_and_a_record_of_another_flow_are_refused():
    """A sender's own record sent back to it (the other direction's keys), a chunk record
    opened with another flow attempt's key, a control record offered as a chunk's."""
    data = os.urandom(65536)
    wire = await capture([(chunk(0, data), data, FLOW)])
    with pytest.raises(RecordError, match="does not verify"):
        await read_all(wire, Opener(SECRET, TO_SENDER))
    send, receive = trio.testing.memory_stream_one_way_pair()
    reader = SealedReader(FrameReader(receive, keep_raw=True), Opener(SECRET, TO_RECEIVER))
    await send.send_all(wire)
    _, payload = await reader.read()
    with pytest.raises(RecordError, match="does not verify"):
        payload.open(new_flow_key())
    ack = {"t": "ack", "c": "c", "f": "f", "o": 1, "e": 2}
    control = await capture([(ack, b"", None)])
    with pytest.raises(RecordError, match="does not verify"):
        Opener(SECRET, TO_RECEIVER).open_into(
            0, b"", control[-TAG_BYTES - 30 :], bytearray(30), FLOW
        )


async def test_plain_frames_are_refused_on_a_sealed_connection():
    """Nobody can talk a sealed end into plain frames: a clear "hello" or chunk is refused."""
    data = os.urandom(1000)
    for header, payload in (
        ({"t": "hello", "agent": "a", "tunnel": "t0"}, b""),
        (chunk_header("c", "f", 0, data, bytes(mac_bytes(len(data)))), data),
    ):
        wire = b"".join(bytes(p) for p in encode_frame(header, payload))
        with pytest.raises(FrameError, match="in clear"):
            await read_all(wire)
    writer, *_ = await sealed_pair()
    with pytest.raises(FrameError, match="needs its flow's key"):
        await writer.send(chunk(0, data), data)
