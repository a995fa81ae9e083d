"""AEAD records of encrypted data connections (terra-agent --encrypt-data, docs/security.md).

After a data connection is authenticated (terra_security/data_auth.py: the pair-key proof or
the mutual TLS handshake), both ends hold a 32-byte connection secret S that nobody else has
(pair key: HKDF of K(a, b) over both fresh nonces; TLS: HKDF of 32 random bytes from each end,
exchanged inside the TLS session before it is unwrapped). The connection then carries records
in clear TCP, sealed with AES-256-GCM (NIST SP 800-38D, `cryptography`'s AESGCM):

    direction  d = "s->r" (sender to receiver: "hello" and chunks) or "r->s" (acks)
    control    K_ctl,d || IV_ctl,d  = HKDF-SHA256(IKM = S, info = CONTROL_LABEL | d), 32 + 12 bytes
    chunks     K_f,d || IV_f,d      = HKDF-SHA256(IKM = flow key, salt = S, info = CHUNK_LABEL | d)
               for each flow attempt f (its 32-byte key from the controller, integrity.py)
    sequence   seq = the record's number among the records sent in direction d on this
               connection (0, 1, 2, ...; u64), carried in the clear record header
    nonce      IV XOR (0^32 || u64be(seq))        (TLS 1.3's per-record nonce, RFC 8446 5.3)
    record     AES-256-GCM(K, nonce, plaintext, aad = the record's frame header as sent)

Why a nonce can never repeat under one key: a key belongs to one connection secret (fresh
random input from both ends per connection), one direction and, for chunks, one flow attempt;
under it every record takes the next value of the direction's one counter, handed out once
(Sealer.reserve: a RecordSeal seals one record and refuses a second), and the counter never
goes back or past 2**64 - 1 (RecordError). Chunk keys of many flows share the direction's
counter, so their per-flow key cache can forget keys freely.

The receiving end (Opener) refuses a record whose seq is not above the last one it took in
that direction (replays and reordering: TCP delivers in order, so only an attacker reorders),
whose tag does not verify (tampered, truncated, made without the key, or reflected: the other
direction's keys differ), or of a flow attempt whose key it does not hold. Each refusal is a
RecordError; the agent closes that connection, and the sender resends what was not
acknowledged on it.
"""

from __future__ import annotations

from collections import OrderedDict

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

Buffer = bytes | bytearray | memoryview  # what AESGCM's *_into methods take

SECRET_BYTES = 32
RANDOM_BYTES = 32  # each end's contribution to S on a TLS-authenticated connection
TAG_BYTES = 16  # AES-GCM tag appended to each record's ciphertext
NONCE_BYTES = 12
MAX_SEQ = (1 << 64) - 1
TO_RECEIVER = b"s->r"
TO_SENDER = b"r->s"
PAIR_LABEL = b"terra data connection (pair key) v1"
TLS_LABEL = b"terra data connection (TLS) v1"
CONTROL_LABEL = b"terra data control records v1 "
CHUNK_LABEL = b"terra data chunk records v1 "
KEY_CACHE = 256  # flow keys a Sealer / Opener keeps expanded (more are derived again)


class RecordError(Exception):
    """A record was refused (bad tag, replayed or out-of-order seq, no key) or cannot be sealed
    (its seal already used, the sequence exhausted). The connection must be closed."""


def _names(sender: str, receiver: str) -> bytes:
    out = b""
    for name in (sender, receiver):
        raw = name.encode()
        out += bytes([len(raw)]) + raw
    return out


def _hkdf(ikm: bytes, salt: bytes | None, info: bytes, length: int) -> bytes:
    return HKDF(hashes.SHA256(), length, salt, info).derive(ikm)


def pair_secret(key: bytes, sender: str, receiver: str, nonce_s: bytes, nonce_r: bytes) -> bytes:
    """S of a pair-key authenticated connection: HKDF-SHA256(IKM = K(sender, receiver),
    salt = nonce_s || nonce_r, info = PAIR_LABEL | names), SECRET_BYTES bytes (RFC 5869)."""
    return _hkdf(key, nonce_s + nonce_r, PAIR_LABEL + _names(sender, receiver), SECRET_BYTES)


def tls_secret(random_s: bytes, random_r: bytes) -> bytes:
    """S of a TLS-authenticated connection: HKDF-SHA256(IKM = random_s || random_r, the two
    ends' RANDOM_BYTES exchanged inside the TLS session, info = TLS_LABEL). ValueError for
    another length."""
    if len(random_s) != RANDOM_BYTES or len(random_r) != RANDOM_BYTES:
        raise ValueError(f"each end contributes {RANDOM_BYTES} random bytes")
    return _hkdf(random_s + random_r, None, TLS_LABEL, SECRET_BYTES)


def nonce(iv: bytes, seq: int) -> bytes:
    """The per-record nonce: iv XOR the left-padded big-endian seq (RFC 8446 section 5.3)."""
    return (int.from_bytes(iv, "big") ^ seq).to_bytes(NONCE_BYTES, "big")


class _Keys:
    """AES-GCM keys of one connection and direction: the control key and a bounded cache of
    chunk keys per flow key."""

    def __init__(self, secret: bytes, direction: bytes) -> None:
        if len(secret) != SECRET_BYTES:
            raise ValueError(f"a connection secret has {SECRET_BYTES} bytes")
        self._secret = secret
        self._direction = direction
        material = _hkdf(secret, None, CONTROL_LABEL + direction, 32 + NONCE_BYTES)
        self.control = (AESGCM(material[:32]), material[32:])
        self._chunk: OrderedDict[str, tuple[AESGCM, bytes]] = OrderedDict()

    def chunk(self, flow_key_hex: str) -> tuple[AESGCM, bytes]:
        """(AESGCM, iv) of the flow attempt whose key is `flow_key_hex` (64 hex chars)."""
        keys = self._chunk.get(flow_key_hex)
        if keys is not None:
            self._chunk.move_to_end(flow_key_hex)
            return keys
        try:
            ikm = bytes.fromhex(flow_key_hex)
        except (TypeError, ValueError):
            ikm = b""
        if len(ikm) != 32:
            raise RecordError("a flow key has 32 bytes of hex")
        info = CHUNK_LABEL + self._direction
        material = _hkdf(ikm, self._secret, info, 32 + NONCE_BYTES)
        keys = (AESGCM(material[:32]), material[32:])
        self._chunk[flow_key_hex] = keys
        if len(self._chunk) > KEY_CACHE:
            self._chunk.popitem(last=False)
        return keys


class RecordSeal:
    """One record's sequence number and key: seal_into() once (a second call: RecordError)."""

    __slots__ = ("seq", "_aead", "_nonce")

    def __init__(self, seq: int, aead: AESGCM, iv: bytes) -> None:
        self.seq = seq
        self._aead: AESGCM | None = aead
        self._nonce = nonce(iv, seq)

    def seal_into(self, aad: bytes, plaintext: Buffer, out: Buffer) -> int:
        """Encrypt `plaintext` into `out` (a writable buffer of len(plaintext) + TAG_BYTES):
        ciphertext then tag; returns the bytes written. RecordError when already used."""
        aead, self._aead = self._aead, None
        if aead is None:
            raise RecordError(f"record {self.seq} was already sealed (a nonce is used once)")
        return aead.encrypt_into(self._nonce, plaintext, aad, out)

    def seal(self, aad: bytes, plaintext: bytes) -> bytes:
        """Encrypt a small `plaintext`: ciphertext || tag (bytes). RecordError when used."""
        out = bytearray(len(plaintext) + TAG_BYTES)
        self.seal_into(aad, plaintext, out)
        return bytes(out)


class Sealer:
    """The sending side of one direction of a connection.

    Sealer(secret: S, direction: TO_RECEIVER or TO_SENDER). reserve(flow_key_hex=None) -> the
    RecordSeal of the next record (a chunk of that flow attempt, or a control record); `sent`:
    the records reserved so far.

    Raises:
        ValueError: a secret of another length. RecordError (reserve): the sequence is
            exhausted, or a malformed flow key.
    """

    def __init__(self, secret: bytes, direction: bytes) -> None:
        self._keys = _Keys(secret, direction)
        self.sent = 0

    def reserve(self, flow_key_hex: str | None = None) -> RecordSeal:
        """The next record's seal: its seq is used by no other record in this direction."""
        seq = self.sent
        if seq > MAX_SEQ:
            raise RecordError("record sequence exhausted: reconnect")
        aead, iv = self._keys.control if flow_key_hex is None else self._keys.chunk(flow_key_hex)
        self.sent = seq + 1
        return RecordSeal(seq, aead, iv)


class Opener:
    """The receiving side of one direction of a connection.

    Opener(secret: S, direction: the direction it receives). take(seq) checks a record's seq
    on arrival (above every seq taken before: RecordError otherwise) and records it;
    open_into(seq, aad, record, out, flow_key_hex=None) decrypts a taken record (ciphertext ||
    tag) into `out` (len(record) - TAG_BYTES bytes; may be the record's own buffer: in place)
    and returns the plaintext's length; open(seq, aad, record) -> plaintext bytes (small
    control records).

    Raises:
        RecordError: a seq not above the last taken (take), a tag that does not verify or a
            record shorter than a tag (open_into / open).
    """

    def __init__(self, secret: bytes, direction: bytes) -> None:
        self._keys = _Keys(secret, direction)
        self.last_seq = -1

    def take(self, seq: object) -> int:
        """Check and record the seq of an arriving record; returns it."""
        if isinstance(seq, bool) or not isinstance(seq, int) or not 0 <= seq <= MAX_SEQ:
            raise RecordError(f"record sequence number {seq!r} is not a u64")
        if seq <= self.last_seq:
            raise RecordError(
                f"record {seq} after record {self.last_seq}: replayed or reordered; refused"
            )
        self.last_seq = seq
        return seq

    def open_into(
        self, seq: int, aad: bytes, record: Buffer, out: Buffer, flow_key_hex: str | None = None
    ) -> int:
        """Decrypt and verify one record (see the class docstring)."""
        n = memoryview(record).nbytes - TAG_BYTES
        if n < 0:
            raise RecordError(f"a record of {n + TAG_BYTES} bytes is shorter than its tag")
        aead, iv = self._keys.control if flow_key_hex is None else self._keys.chunk(flow_key_hex)
        try:
            aead.decrypt_into(nonce(iv, seq), record, aad, out)
        except InvalidTag:
            raise RecordError(
                f"record {seq} does not verify (tampered, truncated, replayed from another "
                "connection, reflected, or sealed without the key); refused"
            ) from None
        return n

    def open(self, seq: int, aad: bytes, record: bytes, flow_key_hex: str | None = None) -> bytes:
        """Decrypt a small record; the plaintext as bytes."""
        out = bytearray(max(0, len(record) - TAG_BYTES))
        self.open_into(seq, aad, record, out, flow_key_hex)
        return bytes(out)
