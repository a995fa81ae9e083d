"""The coflow API's messages, without I/O (docs/api.md): ``u32 length | msgpack map``.

Requests decode straight into typed Structs, so a malformed body is refused at its first wrong
value; replies are plain maps. Shared by the controller's API server and the client.
"""

from __future__ import annotations

import struct
from typing import Any

import msgpack
import msgspec

API_VERSION = 1
MAX_MESSAGE_BYTES = 64 * 1024 * 1024
_LEN = struct.Struct(">I")
Message = dict[str, Any]  # a request or reply map: str keys, msgpack values


class WireError(Exception):
    """A message on the coflow API connection is malformed (the connection is closed)."""


# ---- typed requests (msgspec) ----------------------------------------------------------------
#
# A request is decoded straight into these Structs: only the shapes below are built, so a
# message of nested maps or lists where a scalar belongs fails at its first wrong value
# instead of being materialised (a 1 MiB msgpack body of empty maps would otherwise cost
# ~70 MiB). The values' meaning (agent ids, sizes, ...) is checked by the registry.

Scalar = str | int | float | bool | None


class FlowRequest(msgspec.Struct, forbid_unknown_fields=True, omit_defaults=True):
    """One flow of a submit/update request (the registry checks the values)."""

    id: Scalar
    src: Scalar
    dst: Scalar
    bytes: Scalar | msgspec.UnsetType = msgspec.UNSET
    src_path: Scalar | msgspec.UnsetType = msgspec.UNSET
    dst_path: Scalar | msgspec.UnsetType = msgspec.UNSET


class ApiRequest(msgspec.Struct, forbid_unknown_fields=True, omit_defaults=True):
    """Every field any op may carry; which ones an op accepts is checked by its handler."""

    v: Scalar | msgspec.UnsetType = msgspec.UNSET
    op: Scalar | msgspec.UnsetType = msgspec.UNSET
    req: Scalar | msgspec.UnsetType = msgspec.UNSET
    ref: Scalar | msgspec.UnsetType = msgspec.UNSET
    flows: list[FlowRequest] | Scalar | msgspec.UnsetType = msgspec.UNSET
    deadline: Scalar | msgspec.UnsetType = msgspec.UNSET
    coflow: Scalar | msgspec.UnsetType = msgspec.UNSET
    age_s: Scalar | msgspec.UnsetType = msgspec.UNSET
    a: Scalar | msgspec.UnsetType = msgspec.UNSET
    b: Scalar | msgspec.UnsetType = msgspec.UNSET
    up: Scalar | msgspec.UnsetType = msgspec.UNSET
    bytes_per_s: Scalar | msgspec.UnsetType = msgspec.UNSET
    name: Scalar | msgspec.UnsetType = msgspec.UNSET
    tags: list[Scalar] | Scalar | msgspec.UnsetType = msgspec.UNSET
    sync: Scalar | msgspec.UnsetType = msgspec.UNSET
    weight: Scalar | msgspec.UnsetType = msgspec.UNSET  # tenant_set (tenant_api.py)
    max_coflows: Scalar | msgspec.UnsetType = msgspec.UNSET
    max_bytes: Scalar | msgspec.UnsetType = msgspec.UNSET
    max_reserved_bytes_per_s: Scalar | msgspec.UnsetType = msgspec.UNSET
    src: Scalar | msgspec.UnsetType = msgspec.UNSET  # tenant_reserve / tenant_unreserve
    dst: Scalar | msgspec.UnsetType = msgspec.UNSET
    rate_bytes_per_s: Scalar | msgspec.UnsetType = msgspec.UNSET
    ceil_bytes_per_s: Scalar | msgspec.UnsetType = msgspec.UNSET
    start_s: Scalar | msgspec.UnsetType = msgspec.UNSET
    end_s: Scalar | msgspec.UnsetType = msgspec.UNSET


_REQUEST_DECODER = msgspec.msgpack.Decoder(ApiRequest)
_MSGPACK_MAP_FIRST_BYTES = frozenset([*range(0x80, 0x90), 0xDE, 0xDF])
INVALID = "_invalid"  # key of the map decode_request returns for a map of the wrong shape


def decode_request(body: bytes | bytearray | memoryview) -> Message:
    """Decode one API request body into a plain map of the ApiRequest shape.

    Returns:
        the request's fields (absent ones left out); for a msgpack map whose fields do not
        fit ApiRequest, {INVALID: what is wrong} (answered "bad_request", the connection
        stays open).

    Raises:
        WireError: not msgpack, or not a map (the connection is closed).
    """
    try:
        request: Message = msgspec.to_builtins(_REQUEST_DECODER.decode(body))
    except msgspec.ValidationError as exc:
        if bytes(body[:1]) and body[0] in _MSGPACK_MAP_FIRST_BYTES:
            return {INVALID: str(exc)[:200]}
        raise WireError(f"a message must be a msgpack map ({exc})") from exc
    except (msgspec.DecodeError, UnicodeDecodeError) as exc:  # a str that is not UTF-8
        raise WireError(f"malformed msgpack: {exc}") from exc
    return request


def pack_message(message: Message) -> bytes:
    """Encode a message map as ``u32 length | msgpack``.

    Raises:
        WireError: the encoded message exceeds MAX_MESSAGE_BYTES.
    """
    body: bytes = msgpack.packb(message, use_bin_type=True)
    if len(body) > MAX_MESSAGE_BYTES:
        raise WireError(f"message of {len(body)} bytes exceeds {MAX_MESSAGE_BYTES}")
    return _LEN.pack(len(body)) + body
