"""Keyed integrity of a flow's bytes: leaf MACs and the flow digest.

Two leaf-MAC constructions; the controller names one per flow attempt in its descriptor
("digest_alg", terra-controller --leaf-mac: the fastest on the deployment's CPUs) and both ends
use it:

"gmac-aes256-v1" (GMAC_ALGORITHM; the default where the CPU has AES-NI and carry-less multiply):

    K_gmac, K_wrap, K_digest  = HKDF-SHA256(K, salt none, info LABEL), 32 bytes each (RFC 5869)
    MAC_i      = AES-256_{K_wrap}( GMAC_{K_gmac}(nonce = u64be(i) || u32be(len(leaf i)),
                                                 aad = leaf i) )
    digest     = BLAKE3-keyed(K_digest, MAC_0 || MAC_1 || ... || MAC_last), 32 bytes, hex

  GMAC is AES-GCM with an empty plaintext (NIST SP 800-38D, section 3; `cryptography`'s AESGCM,
  OpenSSL with AES-NI and PCLMULQDQ: about twice keyed BLAKE3's speed per core here). GMAC alone
  must never see two different messages under one nonce (the GHASH key would leak), and a
  resent leaf is read again from its source, which may have changed. The extra AES block makes
  the MAC a deterministic PRF of (i, len, leaf) whatever is MACed: GMAC's output under distinct
  (nonce, message) pairs is almost-universal, and a PRP over an almost-universal hash is a
  PRF (Wegman-Carter-Shoup hash-then-encrypt; the same shape as AES-GCM-SIV's tag, RFC 8452
  section 4). Cost: one AES-ECB call per chunk over its 16-byte tags.

"blake3-keyed-v1" (BLAKE3_ALGORITHM, ALGORITHM; the default without AES-NI):

    K_leaf     = BLAKE3-derive_key(LEAF_CONTEXT, K)
    K_digest   = BLAKE3-derive_key(DIGEST_CONTEXT, K)
    MAC_i      = first 16 bytes of BLAKE3-keyed(K_leaf, u64be(i) || u64be(len(leaf i)) || leaf i)
    digest     = BLAKE3-keyed(K_digest, MAC_0 || MAC_1 || ... || MAC_last), 32 bytes, hex

Common to both (docs/design.md section 5, "Integrity"):

    K          the flow's 32-byte key, made by the controller for each attempt of a flow and
               handed to the sending and the receiving agent in the flow descriptor (over the
               authenticated control channel); never sent on a data connection.
    leaves     the flow's bytes cut at multiples of LEAF_BYTES (64 KiB; the last leaf may be
               shorter): leaf i = bytes [i * LEAF_BYTES, min(size, (i + 1) * LEAF_BYTES))

A chunk starts on a leaf boundary and holds whole leaves (but for the flow's last leaf); its
frame carries the MACs of its leaves ("m"). The receiver recomputes them before the chunk
reaches the reorder buffer, the spill directory or the sink, and drops a chunk whose MACs
differ. Both ends then get the flow digest from the MACs alone: the sender from the MACs it
made, the receiver from the verified MACs of the leaves it delivers in order (FlowDigest), so
each end makes one keyed pass over every byte instead of a checksum pass and a digest
pass. The leaf index and length are inside the MAC, so a valid leaf cannot be replayed at
another place of the flow; the key is per flow attempt, so not into another flow or attempt.
Without K nobody (a peer agent that is not this flow's endpoint, an on-path attacker) can make
a MAC or a digest that matches.

Sources: BLAKE3 specification (O'Connor, Aumasson, Neves, Wilcox-O'Hearn, 2020), sections 2.3
(keyed_hash) and 2.4 (derive_key), the `blake3` package (Rust, SIMD); GMAC: NIST SP 800-38D;
HKDF: RFC 5869. The MAC-list-then-hash shape is a two-level hash list (as in Merkle, "A
certified digital signature", 1989, with one level of inner nodes).
"""

from __future__ import annotations

import functools
import hmac
import secrets
import struct
from typing import TYPE_CHECKING, Final

import blake3
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers import Cipher, CipherContext, algorithms, modes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

if TYPE_CHECKING:
    from typing_extensions import Buffer  # collections.abc.Buffer from Python 3.12

BLAKE3_ALGORITHM: Final = "blake3-keyed-v1"
GMAC_ALGORITHM: Final = "gmac-aes256-v1"
ALGORITHM: Final = BLAKE3_ALGORITHM  # a descriptor without "digest_alg" means this one
ALGORITHMS: Final = (GMAC_ALGORITHM, BLAKE3_ALGORITHM)
KEY_BYTES = 32
MAC_BYTES = 16
LEAF_BYTES = 64 << 10
LEAF_CONTEXT = "terra 2026-11 leaf MAC v1"
DIGEST_CONTEXT = "terra 2026-11 flow digest v1"
GMAC_LABEL = b"terra 2026-11 leaf GMAC v1"
WRAP_LABEL = b"terra 2026-11 leaf tag wrap v1"
GMAC_DIGEST_LABEL = b"terra 2026-11 flow digest (GMAC leaves) v1"
_PREFIX = struct.Struct(">QQ")
_NONCE = struct.Struct(">QI")  # GMAC nonce: leaf index, leaf length (96 bits)


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


@functools.cache
def has_aes_instructions() -> bool:
    """True when this CPU has AES and carry-less multiply instructions (x86 "aes" and
    "pclmulqdq", ARMv8 "aes" and "pmull" in /proc/cpuinfo), i.e. OpenSSL's GMAC runs at its
    hardware speed; False when they are missing or /proc/cpuinfo cannot be read."""
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as f:
            for line in f:
                name, _, value = line.partition(":")
                if name.strip() in ("flags", "Features"):
                    flags = set(value.split())
                    return "aes" in flags and bool(flags & {"pclmulqdq", "pmull"})
    except OSError:
        pass
    return False


def default_algorithm() -> str:
    """The leaf-MAC construction for this host: GMAC_ALGORITHM with AES instructions (about
    twice keyed BLAKE3's speed, docs/results.md 5.1), else BLAKE3_ALGORITHM."""
    return GMAC_ALGORITHM if has_aes_instructions() else BLAKE3_ALGORITHM


def _hkdf(key: bytes, label: bytes) -> bytes:
    """HKDF-SHA256(key, no salt, info=label), KEY_BYTES bytes (RFC 5869)."""
    return HKDF(hashes.SHA256(), KEY_BYTES, None, label).derive(key)


class _GmacLeaf:
    """Streaming MAC of one leaf (GMAC_ALGORITHM): update(bytes)..., digest(length) -> MAC."""

    __slots__ = ("_gcm", "_wrap_key")

    def __init__(self, gmac_key: bytes, wrap_key: bytes, nonce: bytes) -> None:
        self._gcm = Cipher(algorithms.AES(gmac_key), modes.GCM(nonce)).encryptor()
        self._wrap_key = wrap_key

    def update(self, data: Buffer) -> None:
        self._gcm.authenticate_additional_data(bytes(data))

    def digest(self, length: int = MAC_BYTES) -> bytes:
        self._gcm.finalize()
        wrap = Cipher(algorithms.AES(self._wrap_key), modes.ECB()).encryptor()
        return (wrap.update(self._gcm.tag) + wrap.finalize())[:length]


class FlowKeys:
    """The keys of one flow (attempt), derived from its descriptor's key.

    FlowKeys(key_hex: 64 hex chars, algorithm: one of ALGORITHMS, None = default_algorithm()).
    leaf_macs(offset, data) -> the MAC list of whole leaves; check(offset, data, macs) ->
    bool; leaf_hasher(index, length) -> a hasher to feed one leaf's bytes; fold_hasher() ->
    the keyed hasher of the MAC list. leaf_macs and check are not thread-safe (one AES-ECB
    context per FlowKeys); leaf_hasher's hashers are independent.

    Raises:
        IntegrityError: the key is not 32 bytes of hex, or the algorithm is unknown.
    """

    __slots__ = ("algorithm", "_leaf_key", "_digest_key", "_gmac", "_wrap", "_wrap_key")

    def __init__(self, key_hex: str, algorithm: str | None = None) -> None:
        if algorithm is None:
            algorithm = default_algorithm()
        if algorithm not in ALGORITHMS:
            raise IntegrityError(f"unknown digest algorithm {algorithm!r} (know {ALGORITHMS})")
        try:
            key = bytes.fromhex(key_hex)
        except (TypeError, ValueError):
            key = b""
        if len(key) != KEY_BYTES:
            raise IntegrityError(f"flow key must be {KEY_BYTES} bytes of hex")
        self.algorithm = algorithm
        self._gmac: AESGCM | None = None
        self._wrap: CipherContext | None = None
        self._wrap_key = b""
        if algorithm == BLAKE3_ALGORITHM:
            self._leaf_key = blake3.blake3(key, derive_key_context=LEAF_CONTEXT).digest()
            self._digest_key = blake3.blake3(key, derive_key_context=DIGEST_CONTEXT).digest()
        else:
            self._leaf_key = _hkdf(key, GMAC_LABEL)
            self._wrap_key = _hkdf(key, WRAP_LABEL)
            self._digest_key = _hkdf(key, GMAC_DIGEST_LABEL)
            self._gmac = AESGCM(self._leaf_key)
            self._wrap = Cipher(algorithms.AES(self._wrap_key), modes.ECB()).encryptor()

    def leaf_hasher(self, index: int, length: int) -> blake3.blake3 | _GmacLeaf:
        """A hasher for leaf `index` of `length` bytes: update() it with the leaf's bytes,
        then .digest(length=MAC_BYTES) is MAC_index."""
        if self._gmac is None:
            return blake3.blake3(_PREFIX.pack(index, length), key=self._leaf_key)
        return _GmacLeaf(self._leaf_key, self._wrap_key, _NONCE.pack(index, length))

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
        size = len(view)
        gmac, wrap = self._gmac, self._wrap
        if gmac is not None and wrap is not None:  # a GMAC call per leaf, one AES-ECB for all
            pack, seal = _NONCE.pack, gmac.encrypt
            tags = [
                seal(
                    pack(first + k, min(LEAF_BYTES, size - start)),
                    b"",
                    view[start : start + LEAF_BYTES],
                )
                for k, start in enumerate(range(0, size, LEAF_BYTES))
            ]
            return wrap.update(b"".join(tags))
        macs = []
        for start in range(0, size, LEAF_BYTES):
            leaf = view[start : start + LEAF_BYTES]
            hasher = blake3.blake3(
                _PREFIX.pack(first + start // LEAF_BYTES, len(leaf)), key=self._leaf_key
            )
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
        self._leaf: blake3.blake3 | _GmacLeaf | None = None  # the current leaf's hasher (bytes)
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
        known = self._known
        for i in range(max(0, started - first), len(macs) // MAC_BYTES):
            if first + i not in known:
                known[first + i] = macs[i * MAC_BYTES : (i + 1) * MAC_BYTES]

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
            if self._leaf is None and self._leaf_mac is None and not self.position % LEAF_BYTES:
                done += self._fold_known(len(view) - done)  # whole leaves with known MACs
                if done >= len(view):
                    break
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

    def _fold_known(self, avail: int) -> int:
        """Fold the known MACs of the whole leaves that start at `position` and lie within the
        next `avail` bytes, in one update; returns the bytes they cover (0: the first leaf's
        MAC is not known or the leaf is not whole in `avail`)."""
        index = self.position // LEAF_BYTES
        known, macs, taken = self._known, [], 0
        while True:
            length = min(LEAF_BYTES, self.size - index * LEAF_BYTES)
            if length <= 0 or taken + length > avail or index not in known:
                break
            macs.append(known.pop(index))
            taken += length
            index += 1
        if macs:
            self._fold.update(b"".join(macs))
            self.position += taken
        return taken

    def hexdigest(self) -> str:
        """The flow digest (64 hex chars); IntegrityError before all `size` bytes are in."""
        if self.position != self.size:
            raise IntegrityError(f"digest of {self.size} bytes asked at {self.position}")
        return self._fold.hexdigest()


def flow_digest(
    key_hex: str, data: bytes | bytearray | memoryview, algorithm: str | None = None
) -> str:
    """The hex flow digest of `data` (all of a flow's bytes) under `key_hex` and `algorithm`
    (None: default_algorithm()) (tests, checks)."""
    digest = FlowDigest(FlowKeys(key_hex, algorithm), len(data))
    digest.update(data)
    return digest.hexdigest()
