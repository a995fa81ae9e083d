"""Keyed integrity of a flow's bytes: per-chunk MACs and the flow digest (issue 11 items 1-2).

Construction "blake3-keyed-v1" (docs/design.md section 5, "Integrity"):

    K          = the flow's 32-byte key, made by the controller for each attempt of a flow and
                 handed to the sending and the receiving agent in the flow descriptor (over the
                 authenticated control channel); never sent on a data connection.
    K_chunk    = BLAKE3-derive_key(CHUNK_CONTEXT, K)
    K_digest   = BLAKE3-derive_key(DIGEST_CONTEXT, K)
    chunk MAC  = BLAKE3-keyed(K_chunk, u64be(offset) || u64be(len) || payload), first 16 bytes
    flow digest= BLAKE3-keyed(K_digest, the flow's bytes in order), 32 bytes, hex

The chunk MAC (frame field "m") replaces the frame checksum: the receiver checks it before a
chunk reaches the reorder buffer, the spill directory or the sink, and drops a chunk whose MAC
is wrong. The offset and length are inside the MAC, so a valid chunk cannot be replayed at
another place of the flow; the key is per flow and attempt, so it cannot be replayed into
another flow or attempt. The flow digest is what both ends compare at the end ("d" on the last
chunk, "digest" in "complete"); without K nobody (not even a peer agent that is not this
flow's endpoint) can compute a digest or a MAC that matches.

Source: BLAKE3 specification (O'Connor, Aumasson, Neves, Wilcox-O'Hearn, 2020), sections 2.3
(keyed_hash) and 2.4 (derive_key); implementation: the `blake3` package (Rust, SIMD).
"""

from __future__ import annotations

import hmac
import secrets
import struct

import blake3

ALGORITHM = "blake3-keyed-v1"  # the "digest_alg" of flow descriptors
KEY_BYTES = 32
MAC_BYTES = 16
CHUNK_CONTEXT = "terra 2026-11 chunk MAC v1"
DIGEST_CONTEXT = "terra 2026-11 flow digest v1"
_PREFIX = struct.Struct(">QQ")


class IntegrityError(ValueError):
    """A key that is not KEY_BYTES bytes of hex, or an unknown algorithm name."""


def new_flow_key() -> str:
    """A fresh random flow key: KEY_BYTES bytes from the OS CSPRNG, as lowercase hex (64 chars)."""
    return secrets.token_hex(KEY_BYTES)


class FlowKeys:
    """The keys of one flow (attempt), derived from its descriptor's key.

    FlowKeys(key_hex: 64 hex chars, algorithm: ALGORITHM). mac(offset, payload) -> 16 bytes;
    check(offset, payload, mac) -> bool; digest_hasher() -> a keyed BLAKE3 hasher (update(data),
    hexdigest()) for the flow digest.

    Raises:
        IntegrityError: the key is not 32 bytes of hex, or the algorithm is not ALGORITHM.
    """

    __slots__ = ("_chunk_key", "_digest_key")

    def __init__(self, key_hex: str, algorithm: str = ALGORITHM) -> None:
        if algorithm != ALGORITHM:
            raise IntegrityError(f"unknown digest algorithm {algorithm!r} (know {ALGORITHM!r})")
        try:
            key = bytes.fromhex(key_hex)
        except (TypeError, ValueError):
            key = b""
        if len(key) != KEY_BYTES:
            raise IntegrityError(f"flow key must be {KEY_BYTES} bytes of hex")
        self._chunk_key = blake3.blake3(key, derive_key_context=CHUNK_CONTEXT).digest()
        self._digest_key = blake3.blake3(key, derive_key_context=DIGEST_CONTEXT).digest()

    def mac(self, offset: int, payload) -> bytes:
        """The MAC_BYTES-byte MAC of `payload` (bytes-like) placed at byte `offset` of the flow."""
        hasher = blake3.blake3(_PREFIX.pack(offset, len(payload)), key=self._chunk_key)
        hasher.update(payload)
        return hasher.digest(length=MAC_BYTES)

    def check(self, offset: int, payload, mac) -> bool:
        """True when `mac` (bytes) is the MAC of `payload` at `offset` (constant-time compare)."""
        return isinstance(mac, bytes) and hmac.compare_digest(self.mac(offset, payload), mac)

    def digest_hasher(self):
        """A new keyed BLAKE3 hasher for the flow digest (feed the flow's bytes in order)."""
        return blake3.blake3(key=self._digest_key)


def flow_digest(key_hex: str, data) -> str:
    """The hex flow digest of `data` (all of a flow's bytes) under `key_hex` (tests, checks)."""
    hasher = FlowKeys(key_hex).digest_hasher()
    hasher.update(data)
    return hasher.hexdigest()
