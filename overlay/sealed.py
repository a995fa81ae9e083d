"""Frames as AEAD records: the readers and writers of encrypted data connections.

terra-agent --encrypt-data (docs/security.md): after authentication both ends of a data
connection hold its secret; the keys, nonces and refusals are terra_security/data_records.py,
the two frame types terra_wire/frames.py ("sealed": a "hello" or "ack" header map as an AEAD
record; "schunk": a chunk's fields in clear, its bytes as an AEAD record under the flow
attempt's key). Each record's associated data is its own encoded frame header, so no field of
it (ids, offset, leaf MACs, digest, sequence number) can be changed either.

A SealedWriter encrypts a chunk into one reused send buffer (encrypt_into: one pass, no
allocation) and writes header and record with one vectored send; a SealedReader checks each
record's sequence number on arrival and opens control records at once, while a chunk's record
is opened (in place, in its receive buffer) only by the agent that holds the flow's key
(SealedPayload.open), before any of it is kept. A frame in clear on such a connection is
refused (FrameError): neither end can be talked into plain frames.
"""

from __future__ import annotations

import msgpack
import trio

from overlay.framing import FrameReader, send_encoded
from terra_security.data_records import TAG_BYTES, Opener, RecordError, Sealer
from terra_wire.frames import (
    CHUNK_TYPE,
    SEALED_CHUNK_TYPE,
    SEALED_TYPE,
    FrameError,
    encode_head,
    unpack_map,
)


class SealedWriter:
    """Writes frames as AEAD records on one stream, one frame at a time (a trio.Lock).

    SealedWriter(stream: trio SendStream, sealer: Sealer of the direction it sends).
    ``await send(header, payload=b"", key=None)``: a chunk header ("t": "chunk") with its
    payload and its flow attempt's key (64 hex chars) goes as a "schunk" record; any other
    header (payload empty) as a "sealed" record of the control key.

    Raises:
        FrameError: a chunk without a key, a control frame with a payload, a header that
            cannot be encoded. RecordError: the record sequence is exhausted. The stream's
            errors, as FrameWriter.
    """

    def __init__(self, stream: trio.abc.SendStream, sealer: Sealer) -> None:
        self.stream = stream
        self._sealer = sealer
        self._lock = trio.Lock()
        self._out = bytearray()  # the reused ciphertext buffer of chunks

    async def send(self, header: dict, payload=b"", key: str | None = None) -> None:
        """Seal and send one frame (class docstring); waits while another task is sending."""
        async with self._lock:
            if header.get("t") == CHUNK_TYPE:
                head, body = self._seal_chunk(header, payload, key)
            else:
                head, body = self._seal_control(header, payload)
            await send_encoded(self.stream, head, body)

    def _seal_chunk(self, header: dict, payload, key: str | None) -> tuple[bytes, memoryview]:
        if key is None:
            raise FrameError("a sealed chunk needs its flow's key")
        seal = self._sealer.reserve(key)
        n = memoryview(payload).nbytes
        fields = dict(header)
        fields["t"], fields["s"] = SEALED_CHUNK_TYPE, seal.seq
        head = encode_head(fields, n + TAG_BYTES)
        if len(self._out) < n + TAG_BYTES:
            self._out = bytearray(n + TAG_BYTES)
        out = memoryview(self._out)[: n + TAG_BYTES]
        seal.seal_into(head, payload, out)
        return head, out

    def _seal_control(self, header: dict, payload) -> tuple[bytes, bytes]:
        if len(payload):
            raise FrameError(f"a sealed {header.get('t')!r} frame carries no payload")
        try:
            plain = msgpack.packb(header, use_bin_type=True)
        except (TypeError, ValueError, OverflowError) as exc:
            raise FrameError(f"frame header cannot be packed: {exc}") from exc
        seal = self._sealer.reserve()
        head = encode_head({"t": SEALED_TYPE, "s": seal.seq}, len(plain) + TAG_BYTES)
        return head, seal.seal(head, plain)


class SealedPayload:
    """A received chunk's record, not opened yet: len() is the chunk's byte count;
    open(flow_key_hex) decrypts and verifies it in place and returns the chunk's bytes (a
    memoryview of its receive buffer). RecordError when it does not verify (or was opened
    before: the plaintext replaced the record)."""

    __slots__ = ("_opener", "_seq", "_aad", "_record", "_opened")

    def __init__(self, opener: Opener, seq: int, aad: bytes, record) -> None:
        self._opener, self._seq, self._aad = opener, seq, aad
        view = memoryview(record).cast("B")
        self._record = memoryview(bytearray(view)) if view.readonly else view  # small: copied
        self._opened = False

    def __len__(self) -> int:
        return len(self._record) - TAG_BYTES

    def open(self, flow_key_hex: str) -> memoryview:
        """The chunk's bytes, verified (see the class docstring)."""
        if self._opened:
            raise RecordError(f"record {self._seq} was already opened")
        self._opened = True
        out = self._record[: len(self)]
        self._opener.open_into(self._seq, self._aad, self._record, out, flow_key_hex)
        return out


class SealedReader:
    """Reads AEAD records from a FrameReader made with keep_raw=True.

    SealedReader(reader, opener: Opener of the direction it receives). ``await read()`` ->
    (header, payload) or None on a clean EOF: a "sealed" record gives the header map inside
    it (payload b""); an "schunk" gives its header as a "chunk" ("n": the chunk's bytes) and
    a SealedPayload. Anything else is refused.

    Raises:
        FrameError: a frame in clear, a record whose plaintext is not a header map, and what
            FrameReader.read raises. RecordError: a sequence number not above the last one,
            a control record that does not verify.
    """

    def __init__(self, reader: FrameReader, opener: Opener) -> None:
        if not reader.keep_raw:
            raise ValueError("a SealedReader needs a FrameReader with keep_raw=True")
        self.reader = reader
        self._opener = opener

    async def read(self) -> tuple[dict, object] | None:
        """The next frame, opened (class docstring)."""
        frame = await self.reader.read()
        if frame is None:
            return None
        header, payload = frame
        kind = header["t"]
        if kind not in (SEALED_TYPE, SEALED_CHUNK_TYPE):
            raise FrameError(f"{kind!r} frame in clear on an encrypted data connection")
        seq = self._opener.take(header["s"])
        aad = self.reader.raw_header
        if kind == SEALED_TYPE:
            inner = unpack_map(self._opener.open(seq, aad, bytes(payload)))
            if inner.get("t") in (SEALED_TYPE, SEALED_CHUNK_TYPE, CHUNK_TYPE):
                raise FrameError(f"a sealed record holds a {inner.get('t')!r} frame")
            return inner, b""
        sealed = SealedPayload(self._opener, seq, aad, payload)
        fields = dict(header)
        fields["t"], fields["n"] = CHUNK_TYPE, len(sealed)
        return fields, sealed
