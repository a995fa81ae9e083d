"""The overlay's frame format, without I/O: encode, decode and check frames.

Wire format (docs/design.md sections 5 "Chunks" and 6 "Messages"):

    frame = u32 big-endian header_len | msgpack(header map) | payload

The header map always carries ``"v": VERSION``, ``"t": <type str>`` and
``"n": <payload length in bytes>``. Chunk frames (``"t": "chunk"``) also carry
``"c"`` (coflow id, str), ``"f"`` (flow id, str), ``"o"`` (byte offset in the
flow, int) and ``"m"`` (the MACs of the chunk's 64 KiB leaves, MAC_BYTES each,
terra_security/integrity.py: the receiving agent checks them with the flow's key; this module
only checks their type and length). Any other frame whose header has ``"x"`` (``zlib.crc32`` of
the payload) gets that checksum verified on reading.

Encrypted data connections (terra-agent --encrypt-data, terra_security/data_records.py) carry
only two frame types, both with ``"s"`` (the record's sequence number, a u64) and authenticated
as a whole (the encoded header is the AEAD's associated data):
``"sealed"`` (the payload is an AEAD record whose plaintext is the msgpack header map of a
"hello" or an "ack") and ``"schunk"`` (a chunk frame's fields; its payload is the chunk's
ciphertext followed by the TAG_BYTES tag, so "n" = chunk bytes + TAG_BYTES and "m" holds
mac_bytes(n - TAG_BYTES)).

Limits: headers up to MAX_HEADER_BYTES (64 KiB), payloads up to MAX_PAYLOAD_BYTES (4 MiB; a
sealed chunk's record up to MAX_PAYLOAD_BYTES + TAG_BYTES).
Everything wrong with a frame raises FrameError; the caller closes that connection.
The readers and writers over trio streams are in overlay/framing.py; the controller's blocking
readers in terra_controller/transport.py.
"""

from __future__ import annotations

import struct
from typing import TYPE_CHECKING, Any

import msgpack

from terra_security.data_records import TAG_BYTES
from terra_security.integrity import mac_bytes

if TYPE_CHECKING:
    from typing_extensions import Buffer  # collections.abc.Buffer from Python 3.12

_LEN = struct.Struct(">I")
_U32_MAX = 0xFFFFFFFF

VERSION = 1
MAX_HEADER_BYTES = 64 * 1024
MAX_PAYLOAD_BYTES = 4 * 1024 * 1024
CHUNK_TYPE = "chunk"
SEALED_TYPE = "sealed"  # an AEAD record of a control frame (hello, ack)
SEALED_CHUNK_TYPE = "schunk"  # a chunk whose payload is an AEAD record
_U64_MAX = (1 << 64) - 1
Header = dict[str, Any]  # a frame header map: str keys, msgpack values
Payload = bytes | bytearray | memoryview  # what encode_frame hands to a stream's send_all


class FrameError(Exception):
    """A frame could not be encoded or decoded; the message says why.

    Raised for malformed msgpack, a header that is not a map, a wrong or
    missing version, a missing/non-string type, oversized header or payload
    lengths, chunk fields of the wrong type, a checksum mismatch, and EOF in
    the middle of a frame. The connection that produced it should be closed.
    """


def chunk_header(coflow_id: str, flow_id: str, offset: int, payload: Buffer, macs: bytes) -> Header:
    """Build the header of a chunk frame carrying `payload`.

    Args:
        coflow_id: coflow id (str).
        flow_id: flow id (str), unique within the coflow.
        offset: byte offset of the payload's first byte within the flow (int >= 0).
        payload: the chunk's bytes (bytes, bytearray or memoryview).
        macs: the MACs of the chunk's leaves (terra_security.integrity.FlowKeys.leaf_macs,
            integrity.mac_bytes(len(payload)) bytes).

    Returns:
        {"t": "chunk", "c": coflow_id, "f": flow_id, "o": offset, "n": len(payload),
        "m": macs} — pass it to send_frame/encode_frame with the payload.

    Raises:
        FrameError: wrong argument types, negative offset, payload > MAX_PAYLOAD_BYTES, macs
            that are not bytes of the length for the payload.
    """
    if not isinstance(coflow_id, str) or not isinstance(flow_id, str):
        raise FrameError(
            f"chunk ids must be str, got coflow {type(coflow_id).__name__}, "
            f"flow {type(flow_id).__name__}"
        )
    if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
        raise FrameError(f"chunk offset must be an int >= 0, got {offset!r}")
    n = _payload_len(payload)
    if not isinstance(macs, bytes) or len(macs) != mac_bytes(n):
        raise FrameError(f"chunk MACs must be {mac_bytes(n)} bytes for {n} payload bytes")
    return {"t": CHUNK_TYPE, "c": coflow_id, "f": flow_id, "o": offset, "n": n, "m": macs}


def encode_frame(header: Header, payload: Payload = b"") -> list[Payload]:
    """Encode one frame as the list of parts to write, in order.

    Args:
        header: the header map (str keys); must contain "t" (str). It is not
            modified: a copy gets "v" = VERSION and "n" = len(payload).
        payload: bytes-like payload, possibly empty; it is not copied.

    Returns:
        [prefix_and_header: bytes] when the payload is empty, otherwise
        [prefix_and_header: bytes, payload] (payload object as given).

    Raises:
        FrameError: header not a dict, missing/non-str "t", header cannot be
            packed, header > MAX_HEADER_BYTES, payload > MAX_PAYLOAD_BYTES.
    """
    if not isinstance(header, dict):
        raise FrameError(f"frame header must be a dict, got {type(header).__name__}")
    if not isinstance(header.get("t"), str):
        raise FrameError(f"frame header needs a str 't' (type), got {header.get('t')!r}")
    n = _payload_len(payload)
    head = encode_head(header, n)
    if n == 0:
        return [head]
    return [head, payload]


def encode_head(header: Header, nbytes: int) -> bytes:
    """The length prefix and header of a frame whose payload has `nbytes` bytes (the bytes a
    sealed record authenticates as its associated data); the header map gets "v" and "n".

    Raises:
        FrameError: as encode_frame (header not packable or too large).
    """
    fields = dict(header)
    fields["v"] = VERSION
    fields["n"] = nbytes
    try:
        packed: bytes = msgpack.packb(fields, use_bin_type=True)
    except (TypeError, ValueError, OverflowError) as exc:
        raise FrameError(f"frame header cannot be packed: {exc}") from exc
    if len(packed) > MAX_HEADER_BYTES:
        raise FrameError(f"frame header is {len(packed)} bytes, limit {MAX_HEADER_BYTES}")
    return _LEN.pack(len(packed)) + packed


def unpack_map(raw: Buffer) -> Header:
    """Decode one msgpack map (a frame header, or a whole coflow API message).

    Raises:
        FrameError: malformed msgpack, non-str map keys, or not a map.
    """
    try:
        value: object = msgpack.unpackb(raw, raw=False, strict_map_key=True)
    except Exception as exc:  # msgpack raises many types for garbage input
        raise FrameError(f"malformed msgpack: {type(exc).__name__}: {exc}") from exc
    if not isinstance(value, dict):
        raise FrameError(f"a message must be a msgpack map, got {type(value).__name__}")
    return value


def check_header(header: Header, max_payload: int = MAX_PAYLOAD_BYTES) -> Header:
    """Validate a decoded frame header; returns it.

    Checks: "v" == VERSION, "t" a str, "n" an int in [0, max_payload] (0 for control
    frames; a sealed chunk's up to max_payload + TAG_BYTES), "x" a u32 when present, chunk
    fields (see chunk_header: "m" of mac_bytes(n) bytes, of a sealed chunk mac_bytes(n -
    TAG_BYTES)), "s" a u64 on sealed frames.

    Raises:
        FrameError: the first check that fails, named.
    """
    version = header.get("v")
    if version != VERSION or isinstance(version, bool):
        raise FrameError(f"unsupported frame version {version!r} (expected {VERSION})")
    if not isinstance(header.get("t"), str):
        raise FrameError(f"frame header needs a str 't', got {header.get('t')!r}")
    kind = header["t"]
    sealed = kind in (SEALED_TYPE, SEALED_CHUNK_TYPE)
    low, high = (TAG_BYTES, max_payload + TAG_BYTES) if sealed else (0, max_payload)
    n = header.get("n")
    if isinstance(n, bool) or not isinstance(n, int) or not low <= n <= high:
        raise FrameError(f"frame payload length {n!r} out of range {low}..{high}")
    if "x" in header and not _is_u32(header["x"]):
        raise FrameError(f"frame checksum must be a u32, got {header['x']!r}")
    if sealed:
        seq = header.get("s")
        if isinstance(seq, bool) or not isinstance(seq, int) or not 0 <= seq <= _U64_MAX:
            raise FrameError(f"record sequence 's' must be a u64, got {seq!r}")
    if kind == CHUNK_TYPE:
        _check_chunk_fields(header, n)
    elif kind == SEALED_CHUNK_TYPE:
        _check_chunk_fields(header, n - TAG_BYTES)
    elif kind == SEALED_TYPE and n > max_payload:
        raise FrameError(f"sealed control record of {n} bytes, limit {max_payload}")
    return header


def _payload_len(payload: Buffer) -> int:
    try:
        with memoryview(payload) as view:
            n = view.nbytes
    except TypeError as exc:
        raise FrameError(f"payload must be bytes-like, got {type(payload).__name__}") from exc
    if n > MAX_PAYLOAD_BYTES:
        raise FrameError(f"payload is {n} bytes, limit {MAX_PAYLOAD_BYTES}")
    return n


def _is_u32(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= _U32_MAX


def _check_chunk_fields(header: Header, n: int) -> None:
    for key in ("c", "f"):
        if not isinstance(header.get(key), str):
            raise FrameError(f"chunk field {key!r} must be a str, got {header.get(key)!r}")
    offset = header.get("o")
    if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
        raise FrameError(f"chunk offset 'o' must be an int >= 0, got {offset!r}")
    macs = header.get("m")
    if not isinstance(macs, bytes) or len(macs) != mac_bytes(n):
        raise FrameError(f"chunk MACs 'm' must be {mac_bytes(n)} bytes for n={n}, got {macs!r}")
