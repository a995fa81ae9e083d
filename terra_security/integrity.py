"""Keyed integrity of a flow's bytes: leaf MACs and the flow digest.

Construction "blake3-keyed-v1" (docs/design.md section 5, "Integrity"):

    K          the flow's 32-byte key, made by the controller for each attempt of a flow and
               handed to the sending and the receiving agent in the flow descriptor (over the
               authenticated control channel); never sent on a data connection.
    K_leaf     = BLAKE3-derive_key(LEAF_CONTEXT, K)
    K_digest   = BLAKE3-derive_key(DIGEST_CONTEXT, K)
    leaves     the flow's bytes cut at multiples of LEAF_BYTES (64 KiB; the last leaf may be
               shorter): leaf i = bytes [i * LEAF_BYTES, min(size, (i + 1) * LEAF_BYTES))
    MAC_i      = first 16 bytes of BLAKE3-keyed(K_leaf, u64be(i) || u64be(len(leaf i)) || leaf i)
    digest     = BLAKE3-keyed(K_digest, MAC_0 || MAC_1 || ... || MAC_last), 32 bytes, hex

A chunk starts on a leaf boundary and holds whole leaves (but for the flow's last leaf); its
frame carries the MACs of its leaves ("m"). The receiver recomputes them before the chunk
reaches the reorder buffer, the spill directory or the sink, and drops a chunk whose MACs
differ. Both ends then get the flow digest from the MACs alone: the sender from the MACs it
made, the receiver from the verified MACs of the leaves it delivers in order (FlowDigest), so
each end makes one keyed-BLAKE3 pass over every byte instead of a checksum pass and a digest
pass. The leaf index and length are inside the MAC, so a valid leaf cannot be replayed at
another place of the flow; the key is per flow attempt, so not into another flow or attempt.
Without K nobody (a peer agent that is not this flow's endpoint, an on-path attacker) can make
a MAC or a digest that matches.

Source: BLAKE3 specification (O'Connor, Aumasson, Neves, Wilcox-O'Hearn, 2020), sections 2.3
(keyed_hash) and 2.4 (derive_key); implementation: the `blake3` package (Rust, SIMD). The
MAC-list-then-hash shape is a two-level hash list (as in Merkle, "A certified digital
signature", 1989, with one level of inner nodes).
"""

from __future__ import annotations

import hmac
import secrets
import struct
from typing import TYPE_CHECKING, Final

import blake3

if TYPE_CHECKING:
    from typing_extensions import Buffer  # collections.abc.Buffer from Python 3.12

ALGORITHM: Final = "blake3-keyed-v1"  # the "digest_alg" of flow descriptors
KEY_BYTES = 32
MAC_BYTES = 16
LEAF_BYTES = 64 << 10
LEAF_CONTEXT = "terra 2026-11 leaf MAC v1"
DIGEST_CONTEXT = "terra 2026-11 flow digest v1"
_PREFIX = struct.Struct(">QQ")


class IntegrityError(ValueError):
    """A key that is not KEY_BYTES bytes of hex, an unknown algorithm name, or leaf MACs asked
    for bytes that do not start on a leaf boundary."""


def new_flow_key() -> str:
    """A fresh random flow key: KEY_BYTES bytes from the OS CSPRNG, as lowercase hex (64 chars)."""
    return secrets.token_hex(KEY_BYTES)


def mac_bytes(nbytes: int) -> int:
    """Length of the MAC list ("m") of a chunk of `nbytes` bytes: MAC_BYTES per leaf."""
    return MAC_BYTES * -(-nbytes // LEAF_BYTES)


def align_down(offset: int) -> int:
    """The leaf boundary at or below byte `offset`."""
    return offset - offset % LEAF_BYTES


class FlowKeys:
    """The keys of one flow (attempt), derived from its descriptor's key.

    FlowKeys(key_hex: 64 hex chars, algorithm: ALGORITHM). leaf_macs(offset, data) -> the MAC
    list of whole leaves; check(offset, data, macs) -> bool; leaf_hasher(index, length) -> a
    hasher to feed one leaf's bytes; fold_hasher() -> the keyed hasher of the MAC list.

    Raises:
        IntegrityError: the key is not 32 bytes of hex, or the algorithm is not ALGORITHM.
    """

    __slots__ = ("_leaf_key", "_digest_key")

    def __init__(self, key_hex: str, algorithm: str = ALGORITHM) -> None:
        if algorithm != ALGORITHM:
            raise IntegrityError(f"unknown digest algorithm {algorithm!r} (know {ALGORITHM!r})")
        try:
            key = bytes.fromhex(key_hex)
        except (TypeError, ValueError):
            key = b""
        if len(key) != KEY_BYTES:
            raise IntegrityError(f"flow key must be {KEY_BYTES} bytes of hex")
        self._leaf_key = blake3.blake3(key, derive_key_context=LEAF_CONTEXT).digest()
        self._digest_key = blake3.blake3(key, derive_key_context=DIGEST_CONTEXT).digest()

    def leaf_hasher(self, index: int, length: int) -> blake3.blake3:
        """A keyed BLAKE3 hasher for leaf `index` of `length` bytes: update() it with the
        leaf's bytes, then .digest(length=MAC_BYTES) is MAC_index."""
        return blake3.blake3(_PREFIX.pack(index, length), key=self._leaf_key)

    def leaf_macs(self, offset: int, data: Buffer) -> bytes:
        """The MAC list of `data` (bytes-like) at flow byte `offset` (a leaf boundary): one
        MAC per LEAF_BYTES of data, the last one for what is left.

        Raises:
            IntegrityError: offset is not a multiple of LEAF_BYTES.
        """
        if offset % LEAF_BYTES:
            raise IntegrityError(f"offset {offset} is not on a leaf boundary ({LEAF_BYTES})")
        view = memoryview(data).cast("B")
        first = offset // LEAF_BYTES
        macs = []
        for start in range(0, len(view), LEAF_BYTES):
            leaf = view[start : start + LEAF_BYTES]
            hasher = self.leaf_hasher(first + start // LEAF_BYTES, len(leaf))
            hasher.update(leaf)
            macs.append(hasher.digest(length=MAC_BYTES))
        return b"".join(macs)

    def check(self, offset: int, data: Buffer, macs: object) -> bool:
        """True when `macs` (bytes) is the MAC list of `data` at `offset` (constant-time
        compare); False also for an offset off the leaf grid."""
        if not isinstance(macs, bytes) or offset % LEAF_BYTES:
            return False
        return hmac.compare_digest(self.leaf_macs(offset, data), macs)

    def fold_hasher(self) -> blake3.blake3:
        """A new keyed BLAKE3 hasher for the flow digest (feed it the MAC list in order)."""
        return blake3.blake3(key=self._digest_key)


class FlowDigest:
    """The flow digest of `size` bytes, built in flow order from leaf MACs and / or bytes.

    FlowDigest(keys: FlowKeys, size: int bytes). add_macs(offset, macs, nbytes): the MACs of
    [offset, offset + nbytes) when that range continues the digest (the sender: its own MACs).
    know(offset, macs): verified MACs of leaves not reached yet (the receiver: of admitted
    chunks; the first MAC known for a leaf is kept). update(data): the next in-order bytes; a
    leaf whose MAC is known is skipped (not hashed), any other leaf is hashed from its bytes,
    so bytes that arrived without MACs still count. position: bytes covered so far;
    hexdigest(): the digest once position == size.

    Raises:
        IntegrityError: add_macs off the current position, hexdigest before the end.
    """

    def __init__(self, keys: FlowKeys, size: int) -> None:
        self.keys = keys
        self.size = size
        self.position = 0
        self._fold = keys.fold_hasher()
        self._known: dict[int, bytes] = {}
        self._leaf: blake3.blake3 | None = None  # hasher of the current leaf, fed from bytes
        self._leaf_mac: bytes | None = None  # known MAC of the current leaf, being skipped

    def add_macs(self, offset: int, macs: bytes, nbytes: int) -> None:
        """Fold the MAC list of the next `nbytes` bytes (offset must be `position`)."""
        if offset != self.position or self._leaf is not None or self._leaf_mac is not None:
            raise IntegrityError(f"MACs at {offset}, digest at {self.position}")
        self._fold.update(macs)
        self.position += nbytes

    def know(self, offset: int, macs: bytes) -> None:
        """Remember verified MACs of the leaves from `offset` (a leaf boundary) on, for the
        leaves update() has not started yet."""
        first = offset // LEAF_BYTES
        started = -(-self.position // LEAF_BYTES)  # leaves before this one are begun or done
        for i in range(len(macs) // MAC_BYTES):
            if first + i >= started:
                self._known.setdefault(first + i, macs[i * MAC_BYTES : (i + 1) * MAC_BYTES])

    def update(self, data: Buffer) -> None:
        """Account for the next in-order bytes of the flow.

        Raises:
            IntegrityError: the bytes run past `size`, or start inside a leaf that add_macs
                folded (nothing is accounted then).
        """
        view = memoryview(data).cast("B")
        if self.position + len(view) > self.size:
            raise IntegrityError(f"{len(view)} bytes at {self.position} run past {self.size}")
        done = 0
        while done < len(view):
            index, within = divmod(self.position, LEAF_BYTES)
            length = min(LEAF_BYTES, self.size - index * LEAF_BYTES)
            if within == 0 and self._leaf is None and self._leaf_mac is None:
                self._leaf_mac = self._known.pop(index, None)
                if self._leaf_mac is None:
                    self._leaf = self.keys.leaf_hasher(index, length)
            leaf = self._leaf if self._leaf is not None else self._leaf_mac  # hasher or MAC
            if leaf is None:
                raise IntegrityError(f"bytes at {self.position} inside a leaf add_macs folded")
            step = min(len(view) - done, length - within)
            if not isinstance(leaf, bytes):
                leaf.update(view[done : done + step])
            done += step
            self.position += step
            if within + step == length:
                self._fold.update(leaf if isinstance(leaf, bytes) else leaf.digest(MAC_BYTES))
                self._leaf = self._leaf_mac = None

    def hexdigest(self) -> str:
        """The flow digest (64 hex chars); IntegrityError before all `size` bytes are in."""
        if self.position != self.size:
            raise IntegrityError(f"digest of {self.size} bytes asked at {self.position}")
        return self._fold.hexdigest()


def flow_digest(key_hex: str, data: bytes | bytearray | memoryview) -> str:
    """The hex flow digest of `data` (all of a flow's bytes) under `key_hex` (tests, checks)."""
    digest = FlowDigest(FlowKeys(key_hex), len(data))
    digest.update(data)
    return digest.hexdigest()
