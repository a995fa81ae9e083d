"""What files a path names under the agent's data root, and whether destination files match.

`list_files` answers the controller's "list" (terra_wire/file_messages.py): the regular files
a path names, as [path relative to the data root, size bytes, SHA-256 hex or None]:

    "data/part-0"        that file;
    "logs/" or "logs"    every regular file below the directory, recursively;
    "logs/2026-11-*/"    every match of the glob (fnmatch rules per component: "*", "?",
                         "[...]"; a leading "." is matched only explicitly), files as they
                         are and directories walked recursively.

Containment (the same rule as sources.resolve_data_path, applied to every file listed): a path
that is absolute, has a ".." component or a NUL byte is refused; every match and every file
met on the walk is resolved (os.path.realpath: symlinks, "..") and must stay inside the data
root, else the whole listing is refused naming the path as given. Symlinked directories are
not descended into (no loops), but one pointing out of the root is still refused. Part files
of flows being received (sources.PART_SUFFIX) and anything not a regular file (sockets,
FIFOs, devices) are left out. A file that cannot be opened for reading refuses the listing.

`check_files` answers "check": the rows whose file exists under the root with that size and
SHA-256 (read once; files of another size are not read).
"""

from __future__ import annotations

import glob
import hashlib
import os
import posixpath
import stat

from terra_agent.sources import DIGEST_SUFFIX, PART_SUFFIX, SourceError, resolve_data_path
from terra_wire.file_messages import listing_messages

MAX_FILES = 100_000  # files one listing may name (the controller's flows per request)
_READ_BYTES = 1 << 20

FileRow = tuple[str, int, "str | None"]


def list_files(data_root: str | None, path: str, sha256: bool = False) -> list[FileRow]:
    """The regular files `path` names under `data_root` (see the module docstring).

    Args:
        data_root: the agent's data root (terra-agent --data-root) or None (refused).
        path: a file, a directory or a glob, relative to the data root.
        sha256: also read every file and give its SHA-256 (hex); else None per row.

    Returns:
        [(path relative to the data root, normalized, size bytes, sha256 hex or None)],
        sorted by path, no path twice.

    Raises:
        SourceError: no data root; a bad path (absolute, "..", NUL); nothing matches or the
            path is missing; a match or a file resolving outside the data root; a file that
            cannot be read; more than MAX_FILES files. One line naming the path as given.
    """
    _check_pattern(data_root, path)
    if glob.has_magic(path):
        matches = glob.glob(path, root_dir=os.path.realpath(data_root))
        if not matches:
            raise SourceError(f"source {path!r}: no file matches at the sender")
    else:
        matches = [path]
    found: dict[str, int] = {}
    for match in sorted(matches):
        _collect(data_root, posixpath.normpath(match), found)
        if len(found) > MAX_FILES:
            raise SourceError(f"source {path!r}: more than {MAX_FILES} files")
    rows = []
    for name in sorted(found):
        digest = file_sha256(resolve_data_path(data_root, name, "source")) if sha256 else None
        rows.append((name, found[name], digest))
    return rows


def _check_pattern(data_root: str | None, path: str) -> None:
    if data_root is None:
        raise SourceError(f"source {path!r} refused: this agent serves no files (--data-root)")
    if not path or "\0" in path:
        raise SourceError(f"source path {path!r} refused: empty or a NUL byte")
    if path.startswith("/"):
        raise SourceError(
            f"source path {path!r} refused: absolute (paths are relative to the data root)"
        )
    if ".." in path.split("/"):
        raise SourceError(f"source path {path!r} refused: a '..' component")


def _collect(data_root: str, name: str, found: dict[str, int]) -> None:
    """Add the file `name` (relative to the root) or the files below directory `name`."""
    real = resolve_data_path(data_root, name, "source")
    st = _stat(real, name)
    if stat.S_ISDIR(st.st_mode):
        _walk(data_root, name, real, found)
    elif stat.S_ISREG(st.st_mode):
        _readable(real, name)
        found[name] = st.st_size
    else:
        raise SourceError(f"source {name!r} at the sender is not a regular file or directory")


def _walk(data_root: str, name: str, real: str, found: dict[str, int]) -> None:
    """Add every regular file below directory `real` (given as `name`); symlinks checked."""

    def fail(exc: OSError) -> None:
        raise SourceError(f"source {name!r} at the sender: {exc.strerror}: {exc.filename}")

    for dirpath, dirnames, filenames in os.walk(real, onerror=fail):
        rel = os.path.relpath(dirpath, real)
        base = name if rel == "." else posixpath.join(name, rel.replace(os.sep, "/"))
        for d in dirnames:
            if os.path.islink(os.path.join(dirpath, d)):
                resolve_data_path(data_root, posixpath.join(base, d), "source")  # refuse escapes
        for f in filenames:
            if f.endswith((PART_SUFFIX, PART_SUFFIX + DIGEST_SUFFIX)):
                continue
            child = posixpath.join(base, f)
            target = resolve_data_path(data_root, child, "source")
            st = _stat(target, child)
            if stat.S_ISREG(st.st_mode):
                _readable(target, child)
                found[child] = st.st_size
                if len(found) > MAX_FILES:
                    raise SourceError(f"source {name!r}: more than {MAX_FILES} files")


def _stat(real: str, name: str) -> os.stat_result:
    """os.stat of `real` (given as `name`); SourceError naming it when that fails."""
    try:
        return os.stat(real)
    except OSError as exc:
        raise SourceError(f"source {name!r} at the sender: {exc.strerror}") from exc


def _readable(real: str, name: str) -> None:
    """Refuse a file this agent cannot open for reading (SourceError naming it)."""
    try:
        os.close(os.open(real, os.O_RDONLY | os.O_CLOEXEC))
    except OSError as exc:
        raise SourceError(f"source {name!r} at the sender: {exc.strerror}") from exc


def file_sha256(real: str) -> str:
    """Hex SHA-256 of the file at `real` (read once, 1 MiB at a time). OSError if unreadable."""
    h = hashlib.sha256()
    with open(real, "rb", buffering=0) as f:
        while data := f.read(_READ_BYTES):
            h.update(data)
    return h.hexdigest()


def check_files(data_root: str | None, rows: list[FileRow]) -> list[FileRow]:
    """The rows whose file exists under `data_root` with that size and SHA-256.

    A path that is refused (outside the root, no data root), missing, not a regular file or
    unreadable simply does not match (the flow is then sent as usual, and its sink reports
    any real problem).
    """
    same = []
    for name, size, digest in rows:
        if digest is None:
            continue
        try:
            real = resolve_data_path(data_root, name, "sink")
            st = os.stat(real)
            if stat.S_ISREG(st.st_mode) and st.st_size == size and file_sha256(real) == digest:
                same.append((name, size, digest))
        except (SourceError, OSError):
            continue
    return same


def answer_files(header: dict, data_root: str | None) -> list[dict]:
    """The "listing" replies to a validated "list" or "check" request `header` (blocking:
    walks and reads files; the agent runs it in a worker thread)."""
    msg_id = header["id"]
    try:
        if header["t"] == "list":
            rows = list_files(data_root, header["path"], header.get("sha256", False))
        else:
            rows = check_files(data_root, [tuple(r) for r in header["files"]])
    except SourceError as exc:
        return listing_messages(msg_id, [], str(exc))
    return listing_messages(msg_id, rows)
