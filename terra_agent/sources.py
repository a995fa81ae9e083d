"""Where a flow's bytes come from (sender side) and where they go (receiver side).

Sources (re-readable, so unacknowledged chunks can be re-read and resent, docs/design.md section 5):
    "synthetic"  deterministic bytes from the flow key and size: a block of SYNTHETIC_PERIOD bytes
                 of BLAKE3 extended output of BLAKE2b(flow key), repeated; reads are
                 zero-copy slices.
    "file:PATH"  bytes of a file on the sending host (os.pread).
Sinks:
    "digest"     keep nothing (the receiver computes the flow digest of the bytes anyway).
    "file:PATH"  write the delivered bytes, in order, to PATH.terra-part beside the destination
                 on the receiving host; the part file's length is the durable delivered offset, so
                 a restarted receiver resumes from it; the sender's flow digest is kept in
                 PATH.terra-part.digest ("<algorithm> <hex>") while the part file waits for
                 more bytes (InFlow._consume: not when the last bytes, written in the same
                 step as the commit, complete the part file). Only when
                 every byte is in and the digest matched is the part file renamed over PATH
                 (FileSink.commit): an existing PATH is untouched by a flow that never completes.

File paths: PATH is relative to the agent's data root (terra-agent
--data-root); resolve_data_path() resolves it (symlinks, "..") and refuses absolute paths and
anything that resolves outside the root; files are opened with O_NOFOLLOW. An agent without a
data root refuses every file source and sink.
"""

from __future__ import annotations

import hashlib
import os
import stat

import blake3

from terra_security.integrity import ALGORITHM, FlowDigest, FlowKeys

SYNTHETIC_PERIOD = 1_052_673  # odd: chunk-aligned pieces at different offsets differ
MAX_CHUNK_BYTES = 4 << 20  # = framing.MAX_PAYLOAD_BYTES: fewer frames, system calls, acks per GB
_REHASH_BYTES = 4 << 20
PART_SUFFIX = ".terra-part"  # FileSink writes PATH + PART_SUFFIX, renamed over PATH when done
DIGEST_SUFFIX = ".digest"  # the sender's flow digest of a part file: PATH + PART_SUFFIX + this
_NOFOLLOW = os.O_NOFOLLOW | os.O_CLOEXEC


class SourceError(ValueError):
    """A flow's source or sink cannot be opened or is too short; the message says why."""


def flow_key(coflow: str, flow: str) -> str:
    """The string that identifies a flow in digests and synthetic data: "coflow/flow"."""
    return f"{coflow}/{flow}"


def resolve_data_path(data_root: str | None, path: str, role: str) -> str:
    """The real absolute path of a flow's file `path` under the agent's data root.

    Args:
        data_root: the agent's data root directory (terra-agent --data-root), or None when the
            agent serves no files.
        path: the flow's path, relative to the data root ("data/part-0"); symlinks and ".."
            are resolved (os.path.realpath) before the containment check.
        role: "source" or "sink", for the messages.

    Returns:
        os.path.realpath(data_root/path): absolute, no symlinks, inside realpath(data_root).

    Raises:
        SourceError: no data root, an empty path, a NUL byte, an absolute path, or a path that
            resolves outside the data root (os.path.commonpath); the message names the path as
            given, never where it resolved to.
    """
    if data_root is None:
        raise SourceError(
            f"{role} file {path!r} refused: this agent serves no files (start it with --data-root)"
        )
    if not path or "\0" in path:
        raise SourceError(f"{role} path {path!r} refused: empty or contains a NUL byte")
    if os.path.isabs(path):
        raise SourceError(
            f"{role} path {path!r} refused: absolute (paths are relative to the data root)"
        )
    root = os.path.realpath(data_root)
    real = os.path.realpath(os.path.join(root, path))
    if os.path.commonpath([root, real]) != root:
        raise SourceError(f"{role} path {path!r} refused: it resolves outside the data root")
    return real


class SyntheticSource:
    """Deterministic bytes of one flow; read(offset, n) returns a memoryview (no copy).

    SyntheticSource(key: str, size: int bytes). Byte i of the flow is period[i % len(period)] where
    period = the first min(size, SYNTHETIC_PERIOD) bytes of the BLAKE3 extended output of
    BLAKE2b(key) (16-byte digest). The block behind reads is the period repeated over
    SYNTHETIC_PERIOD + MAX_CHUNK_BYTES bytes (~5.2 MB; the flow's size if smaller), so any read
    of up to MAX_CHUNK_BYTES is one slice.
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
            period = blake3.blake3(digest).digest(length=min(self.size, SYNTHETIC_PERIOD))
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
    """Bytes of a file: FileSource(path, size, name=None); read(offset, n) -> bytes (os.pread).

    `path` is the resolved absolute path (resolve_data_path), `name` the flow's path as given
    (for messages; default `path`). The file is checked at once (opened O_NOFOLLOW | O_NONBLOCK:
    a regular file of exactly `size` bytes that this process can read: a flow never copies a
    file in part) but held open only from
    the first read to close() (reopened if read again, O_NOFOLLOW, and refused if it is no
    longer the same file), so many idle flows hold no descriptors.

    Raises:
        SourceError: the file is missing, unreadable, a symlink, not a regular file or not
            `size` bytes long (at creation; the message names both sizes); it cannot be opened,
            was replaced or shrank (at read).
    """

    def __init__(self, path: str, size: int, name: str | None = None) -> None:
        self.path = path
        self.name = name if name is not None else path
        self.size = size
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | _NOFOLLOW)
        except OSError as exc:
            raise SourceError(f"cannot open source file {self.name!r}: {exc.strerror}") from exc
        try:
            st = os.fstat(fd)
        finally:
            os.close(fd)
        if not stat.S_ISREG(st.st_mode):
            raise SourceError(f"source file {self.name!r} is not a regular file")
        if st.st_size != size:
            raise SourceError(
                f"source file {self.name!r} has {st.st_size} bytes, flow needs {size}"
            )
        self._identity = (st.st_dev, st.st_ino)
        self._fd = -1

    def read(self, offset: int, n: int) -> bytes:
        """Bytes [offset, offset + n) of the file; ValueError beyond the flow's size."""
        if offset < 0 or n < 0 or offset + n > self.size:
            raise ValueError(f"read [{offset}, {offset + n}) outside flow of {self.size} bytes")
        if self._fd < 0:
            try:
                fd = os.open(self.path, os.O_RDONLY | _NOFOLLOW)
            except OSError as exc:
                raise SourceError(f"cannot open source file {self.name!r}: {exc.strerror}") from exc
            st = os.fstat(fd)
            if (st.st_dev, st.st_ino) != self._identity:
                os.close(fd)
                raise SourceError(f"source file {self.name!r} was replaced since the flow started")
            self._fd = fd
        data = os.pread(self._fd, n, offset)
        if len(data) != n:
            raise SourceError(f"source file {self.name!r} shrank: short read at {offset}")
        return data

    def close(self) -> None:
        """Close the file (if open)."""
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


def open_source(spec: str, key: str, size: int, data_root: str | None = None):
    """Open a flow's source from its descriptor string ("synthetic" or "file:PATH").

    Args:
        spec: the descriptor; PATH is relative to `data_root` (resolve_data_path).
        key: flow_key(coflow, flow) (seeds synthetic bytes); size: the flow's bytes.
        data_root: the agent's data root, or None: every "file:" source is refused.

    Returns SyntheticSource or FileSource (both have .read(offset, n) and .close()).
    Raises SourceError for an unknown spec, a refused path or an unusable file.
    """
    if spec == "synthetic":
        return SyntheticSource(key, size)
    if spec.startswith("file:"):
        name = spec[5:]
        return FileSource(resolve_data_path(data_root, name, "source"), size, name)
    raise SourceError(f"unknown source {spec!r}")


class DigestSink:
    """Sink that keeps nothing; resume_offset is always 0 (nothing survives a restart)."""

    resume_offset = 0

    def save_digest(self, digest: str, algorithm: str = ALGORITHM) -> None:
        """Nothing is kept."""

    def load_digest(self, algorithm: str = ALGORITHM) -> None:
        """Nothing was kept: None."""

    def write(self, data) -> None:
        """Discard `data` (it has already been hashed)."""

    def sync(self) -> None:
        """Nothing to sync."""

    def commit(self) -> None:
        """Nothing to move into place."""

    def remove_part(self) -> None:
        """Nothing was written."""

    def close(self) -> None:
        """Nothing to release."""


class FileSink:
    """Sink writing the delivered bytes in order to a part file, moved over PATH when complete.

    FileSink(path, size, resume, name=None): `path` is the resolved absolute destination
    (resolve_data_path), `name` the flow's path as given (for messages). Bytes go to
    part_path = path + PART_SUFFIX; the destination itself is not touched until commit()
    renames the complete part file over it (the receiver calls it once the digest matched), so
    an existing destination survives a flow that never completes. With resume=True an existing
    part file is kept and its length (at most `size`) is the resume offset; otherwise the part
    file is truncated and a stale saved digest removed; align: the resume offset is cut down
    to a multiple of it (unless the part file is complete). prefix_hash(hasher) feeds the kept
    prefix to a hasher (integrity.FlowDigest) so the receiver's digest covers it. The part
    file is created at once (O_NOFOLLOW) but held open only from the first write to close().

    Raises:
        SourceError: the destination is a directory, or the part file cannot be created or
            truncated (missing directory, permissions, a symlink in its place).
    """

    def __init__(
        self, path: str, size: int, resume: bool, name: str | None = None, align: int = 1
    ) -> None:
        self.path = path
        self.name = name if name is not None else path
        self.part_path = path + PART_SUFFIX
        self.digest_path = self.part_path + DIGEST_SUFFIX
        self.committed = False
        self.synced = False  # the part file is complete and on disk (sync)
        self.digest_saved = resume  # a digest file may be there (resume) or was written
        if os.path.isdir(path):
            raise SourceError(f"sink {self.name!r} is a directory")
        try:
            if not resume:
                _unlink_if_present(self.digest_path)
            fd = os.open(self.part_path, os.O_RDWR | os.O_CREAT | _NOFOLLOW, 0o644)
            try:
                st = os.fstat(fd)
                if not stat.S_ISREG(st.st_mode):
                    raise SourceError(f"part file of sink {self.name!r} is not a regular file")
                length = st.st_size if resume else 0
                self.resume_offset = min(length, size)
                if self.resume_offset < size:  # resume on a leaf boundary (align)
                    self.resume_offset -= self.resume_offset % align
                os.ftruncate(fd, self.resume_offset)
            finally:
                os.close(fd)
        except OSError as exc:
            raise SourceError(f"cannot open sink file {self.name!r}: {exc.strerror}") from exc
        self._fd = -1

    def prefix_hash(self, *hashers) -> None:
        """hasher.update() of every hasher with bytes [0, resume_offset) of the part file."""
        fd = os.open(self.part_path, os.O_RDONLY | _NOFOLLOW)
        with open(fd, "rb") as f:
            left = self.resume_offset
            while left > 0:
                data = f.read(min(_REHASH_BYTES, left))
                if not data:
                    raise SourceError(f"sink file {self.name!r} shrank while re-hashing")
                for hasher in hashers:
                    hasher.update(data)
                left -= len(data)

    def save_digest(self, digest: str, algorithm: str = ALGORITHM) -> None:
        """Keep the sender's flow digest (hex str) beside the part file as "<algorithm> <hex>"
        (the flow's leaf-MAC construction, integrity.ALGORITHMS), so a restarted receiver can
        still verify; OSError if it cannot be written."""
        self.digest_saved = True
        fd = os.open(self.digest_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | _NOFOLLOW, 0o644)
        with open(fd, "w") as f:
            f.write(f"{algorithm} {digest}\n")

    def load_digest(self, algorithm: str = ALGORITHM) -> str | None:
        """The sender's digest saved by save_digest, or None (none saved, unreadable, or made
        by another algorithm than `algorithm`)."""
        try:
            fd = os.open(self.digest_path, os.O_RDONLY | _NOFOLLOW)
            with open(fd) as f:
                saved, _, digest = f.read().strip().partition(" ")
        except (OSError, UnicodeDecodeError):
            return None
        return digest if saved == algorithm and digest else None

    def write(self, data) -> None:
        """Append `data` (bytes-like) to the part file (opened on the first write)."""
        if self._fd < 0:
            self._fd = os.open(self.part_path, os.O_WRONLY | os.O_APPEND | _NOFOLLOW)
        view = memoryview(data)
        while len(view):
            view = view[os.write(self._fd, view) :]

    def sync(self) -> None:
        """The part file holds every byte: fsync and close it, so that commit() only renames
        (the receiver calls it in a worker thread). OSError if it cannot be synced."""
        if self._fd >= 0:
            os.fsync(self._fd)
            self.close()
            self.synced = True

    def commit(self) -> None:
        """Make the complete part file the destination: fsync it, rename it over `path`
        (os.replace: atomic; a symlink at the destination was resolved when the flow started,
        so its target inside the data root is replaced), drop the saved digest. Called once
        every byte is in and the digest matched; a second call does nothing. The fsync is
        skipped when sync() did it already.

        Raises:
            OSError: the part file cannot be synced or renamed (e.g. the destination became a
                directory).
        """
        if self.committed:
            return
        self.close()
        if not self.synced:
            fd = os.open(self.part_path, os.O_RDONLY | _NOFOLLOW)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        os.replace(self.part_path, self.path)
        self.committed = True
        if self.digest_saved:
            _unlink_if_present(self.digest_path)

    def remove_part(self) -> None:
        """The flow will never complete (dropped: cancelled, failed, restarting from byte 0):
        unlink the part file and the saved digest now, unless committed. A write in progress
        ends in the unlinked file; close() still closes it. OSError other than a missing file
        is logged by the caller's choice: it is raised."""
        if not self.committed:
            _unlink_if_present(self.part_path)
            _unlink_if_present(self.digest_path)

    def close(self) -> None:
        """Close the part file (it stays, for a resume)."""
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


def _unlink_if_present(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def make_parent_dirs(data_root: str, path: str) -> None:
    """Create the missing directories between the data root and `path`'s parent.

    Args:
        data_root: the agent's data root (any form; resolved here).
        path: a resolved absolute path inside it (resolve_data_path).

    Each directory is made with mode 0755 less the umask (0700 under umask 077) and opened
    with O_NOFOLLOW relative to its parent's descriptor, so nothing is created through a
    symlink, whatever replaced a component meanwhile.

    Raises:
        SourceError: a component exists and is not a directory (or a symlink), or a
            directory cannot be made (permissions, read-only file system).
    """
    root = os.path.realpath(data_root)
    parts = os.path.relpath(os.path.dirname(path), root).split(os.sep)
    if parts == ["."]:
        return
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for part in parts:
            try:
                os.mkdir(part, 0o755, dir_fd=fd)
            except FileExistsError:
                pass
            child = os.open(part, os.O_RDONLY | os.O_DIRECTORY | _NOFOLLOW, dir_fd=fd)
            os.close(fd)
            fd = child
    except OSError as exc:
        raise SourceError(
            f"cannot create the directory {part!r} of a sink: {exc.strerror}"
        ) from exc
    finally:
        os.close(fd)


def open_sink(
    spec: str,
    size: int,
    resume: bool,
    data_root: str | None = None,
    align: int = 1,
    resolved: str | None = None,
):
    """Open a flow's sink from its descriptor string ("digest" or "file:PATH").

    Args:
        spec: the descriptor; PATH is relative to `data_root` (resolve_data_path) and must not
            end in PART_SUFFIX or PART_SUFFIX + DIGEST_SUFFIX (another flow's working files).
        size: the flow's bytes; resume: keep what an existing part file holds (FileSink),
        cut down to a multiple of `align` bytes unless it is complete.
        data_root: the agent's data root, or None: every "file:" sink is refused. Missing
            directories of PATH inside it are created (make_parent_dirs; PATH is then resolved
            again below the new directories).
        resolved: resolve_data_path(data_root, PATH, "sink") when the caller has it already
            (it is not resolved a second time); None: resolved here.

    Returns DigestSink or FileSink (both have .resume_offset, .write(data), .commit(),
    .remove_part(), .close()).
    Raises SourceError for an unknown spec, a refused path or an unusable file.
    """
    if spec == "digest":
        return DigestSink()
    if spec.startswith("file:"):
        name = spec[5:]
        if name.endswith((PART_SUFFIX, PART_SUFFIX + DIGEST_SUFFIX)):
            raise SourceError(f"sink path {name!r} refused: {PART_SUFFIX} names are reserved")
        path = resolved if resolved is not None else resolve_data_path(data_root, name, "sink")
        if not os.path.isdir(os.path.dirname(path)):
            make_parent_dirs(data_root, path)
            path = resolve_data_path(data_root, name, "sink")
        return FileSink(path, size, resume, name, align)
    raise SourceError(f"unknown sink {spec!r}")


def synthetic_digest(
    coflow: str, flow: str, size: int, key_hex: str, algorithm: str | None = None
) -> str:
    """Flow digest (terra_security/integrity.py) of a synthetic flow's bytes under the flow key
    `key_hex` and leaf-MAC construction `algorithm` (None: integrity.default_algorithm())
    (for tests and checks)."""
    source = SyntheticSource(flow_key(coflow, flow), size)
    hasher = FlowDigest(FlowKeys(key_hex, algorithm), size)
    offset = 0
    while offset < size:
        n = min(MAX_CHUNK_BYTES, size - offset)
        hasher.update(source.read(offset, n))
        offset += n
    return hasher.hexdigest()
