"""Where a flow's bytes come from (sender side) and where they go (receiver side).

Sources (re-readable, so unacknowledged chunks can be re-read and resent, DESIGN.md section 5):
    "synthetic"  deterministic bytes from the flow key and size: a block of SYNTHETIC_PERIOD bytes
                 from a generator seeded by BLAKE2b(flow key), repeated; reads are zero-copy slices.
    "file:PATH"  bytes of a file on the sending host (os.pread).
Sinks:
    "digest"     keep nothing (the receiver hashes the delivered bytes anyway).
    "file:PATH"  write the delivered bytes, in order, to a file on the receiving host; the file's
                 length is the durable delivered offset, so a restarted receiver resumes from it;
                 the sender's digest is kept next to it in PATH.blake2b once it has arrived.
"""

from __future__ import annotations

import hashlib
import os

import numpy as np

SYNTHETIC_PERIOD = 1_052_673  # odd: chunk-aligned pieces at different offsets differ
MAX_CHUNK_BYTES = 4 << 20  # = framing.MAX_PAYLOAD_BYTES: fewer frames, system calls, acks per GB
_REHASH_BYTES = 4 << 20


class SourceError(ValueError):
    """A flow's source or sink cannot be opened or is too short; the message says why."""


def flow_key(coflow: str, flow: str) -> str:
    """The string that identifies a flow in digests and synthetic data: "coflow/flow"."""
    return f"{coflow}/{flow}"


class SyntheticSource:
    """Deterministic bytes of one flow; read(offset, n) returns a memoryview (no copy).

    SyntheticSource(key: str, size: int bytes). Byte i of the flow is period[i % len(period)] where
    period = numpy PCG64 bytes seeded by BLAKE2b(key) (16-byte digest), min(size, SYNTHETIC_PERIOD)
    of them. The block behind reads is the period repeated over SYNTHETIC_PERIOD + MAX_CHUNK_BYTES
    bytes (~5.2 MB; the flow's size if smaller), so any read of up to MAX_CHUNK_BYTES is one slice.
    It is built on the first read and dropped by close(); a later read builds it again, so idle
    and finished flows cost no memory.
    """

    def __init__(self, key: str, size: int) -> None:
        self.key = key
        self.size = size
        self._view: memoryview | None = None

    def _block(self) -> memoryview:
        if self._view is None:
            digest = hashlib.blake2b(self.key.encode(), digest_size=16).digest()
            rng = np.random.default_rng(int.from_bytes(digest, "big"))
            period = rng.bytes(min(self.size, SYNTHETIC_PERIOD))
            span = min(self.size, SYNTHETIC_PERIOD + MAX_CHUNK_BYTES)
            repeats = -(-span // len(period)) if period else 0
            self._view = memoryview((period * repeats)[:span])
        return self._view

    def read(self, offset: int, n: int) -> memoryview:
        """Bytes [offset, offset + n) of the flow, n <= MAX_CHUNK_BYTES; ValueError beyond size."""
        if offset < 0 or n < 0 or offset + n > self.size or n > MAX_CHUNK_BYTES:
            raise ValueError(f"read [{offset}, {offset + n}) outside flow of {self.size} bytes")
        start = offset % SYNTHETIC_PERIOD
        return self._block()[start : start + n]

    def close(self) -> None:
        """Drop the block (chunks already handed out keep their own reference)."""
        self._view = None


class FileSource:
    """Bytes of a file: FileSource(path, size); read(offset, n) -> bytes (os.pread).

    The file is checked at once but opened on the first read and closed by close() (reopened if
    read again), so many idle flows hold no descriptors.

    Raises:
        SourceError: the file is missing, unreadable or shorter than `size` bytes (at creation);
            it cannot be opened or shrank (at read).
    """

    def __init__(self, path: str, size: int) -> None:
        try:
            length = os.stat(path).st_size
        except OSError as exc:
            raise SourceError(f"cannot open source file {path!r}: {exc}") from exc
        if length < size:
            raise SourceError(f"source file {path!r} has {length} bytes, flow needs {size}")
        if not os.access(path, os.R_OK):
            raise SourceError(f"source file {path!r} is not readable")
        self.path = path
        self.size = size
        self._fd = -1

    def read(self, offset: int, n: int) -> bytes:
        """Bytes [offset, offset + n) of the file; ValueError beyond the flow's size."""
        if offset < 0 or n < 0 or offset + n > self.size:
            raise ValueError(f"read [{offset}, {offset + n}) outside flow of {self.size} bytes")
        if self._fd < 0:
            try:
                self._fd = os.open(self.path, os.O_RDONLY)
            except OSError as exc:
                raise SourceError(f"cannot open source file {self.path!r}: {exc}") from exc
        data = os.pread(self._fd, n, offset)
        if len(data) != n:
            raise SourceError(f"source file {self.path!r} shrank: short read at {offset}")
        return data

    def close(self) -> None:
        """Close the file (if open)."""
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


def open_source(spec: str, key: str, size: int):
    """Open a flow's source from its descriptor string ("synthetic" or "file:PATH").

    Returns SyntheticSource or FileSource (both have .read(offset, n) and .close()).
    Raises SourceError for an unknown spec or an unusable file.
    """
    if spec == "synthetic":
        return SyntheticSource(key, size)
    if spec.startswith("file:"):
        return FileSource(spec[5:], size)
    raise SourceError(f"unknown source {spec!r}")


class DigestSink:
    """Sink that keeps nothing; resume_offset is always 0 (nothing survives a restart)."""

    resume_offset = 0

    def save_digest(self, digest: str) -> None:
        """Nothing is kept."""

    def load_digest(self) -> None:
        """Nothing was kept: None."""

    def write(self, data) -> None:
        """Discard `data` (it has already been hashed)."""

    def close(self) -> None:
        """Nothing to release."""


class FileSink:
    """Sink writing the delivered bytes in order to PATH.

    FileSink(path, size, resume): with resume=True an existing file is kept and its length (at
    most `size`) is the resume offset; otherwise the file is truncated. prefix_hash(hasher) feeds
    the kept prefix to a hasher so the receiver's digest covers it. The file is created at once but
    held open only from the first write to close().

    Raises:
        SourceError: the file cannot be created or truncated.
    """

    def __init__(self, path: str, size: int, resume: bool) -> None:
        try:
            if not resume and os.path.exists(path + ".blake2b"):
                os.unlink(path + ".blake2b")
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                length = os.fstat(fd).st_size if resume else 0
                self.resume_offset = min(length, size)
                os.ftruncate(fd, self.resume_offset)
            finally:
                os.close(fd)
        except OSError as exc:
            raise SourceError(f"cannot open sink file {path!r}: {exc}") from exc
        self.path = path
        self._fd = -1

    def prefix_hash(self, hasher) -> None:
        """hasher.update() with bytes [0, resume_offset) of the file."""
        with open(self.path, "rb") as f:
            left = self.resume_offset
            while left > 0:
                data = f.read(min(_REHASH_BYTES, left))
                if not data:
                    raise SourceError(f"sink file {self.path!r} shrank while re-hashing")
                hasher.update(data)
                left -= len(data)

    def save_digest(self, digest: str) -> None:
        """Keep the sender's digest in PATH.blake2b, so a restarted receiver can still verify."""
        with open(self.path + ".blake2b", "w") as f:
            f.write(digest + "\n")

    def load_digest(self) -> str | None:
        """The sender's digest saved by save_digest, or None."""
        try:
            with open(self.path + ".blake2b") as f:
                return f.read().strip() or None
        except OSError:
            return None

    def write(self, data) -> None:
        """Append `data` (bytes-like) to the file (opened on the first write)."""
        if self._fd < 0:
            self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND)
        view = memoryview(data)
        while len(view):
            view = view[os.write(self._fd, view) :]

    def close(self) -> None:
        """Close the file."""
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


def open_sink(spec: str, size: int, resume: bool):
    """Open a flow's sink from its descriptor string ("digest" or "file:PATH").

    Returns DigestSink or FileSink (both have .resume_offset, .write(data), .close()).
    Raises SourceError for an unknown spec or an unusable file.
    """
    if spec == "digest":
        return DigestSink()
    if spec.startswith("file:"):
        return FileSink(spec[5:], size, resume)
    raise SourceError(f"unknown sink {spec!r}")


def new_hasher():
    """The flow digest: hashlib.blake2b (64-byte digest); .hexdigest() is what is compared."""
    return hashlib.blake2b()


def synthetic_digest(coflow: str, flow: str, size: int) -> str:
    """BLAKE2b hex digest of a synthetic flow's bytes (for tests and checks)."""
    source = SyntheticSource(flow_key(coflow, flow), size)
    hasher = new_hasher()
    offset = 0
    while offset < size:
        n = min(MAX_CHUNK_BYTES, size - offset)
        hasher.update(source.read(offset, n))
        offset += n
    return hasher.hexdigest()
