"""The controller's coflow journal: ids issued, and the owner and secret of each coflow kept.

A controller started with a state directory (terra-controller --state-dir) appends one JSON
line per event to STATE_DIR/coflows.jsonl:

    {"c": id, "o": owner or null, "s": secret hex,   a coflow was admitted (with its name
     "nm": name?, "tg": [tags]?}                      and tags, when it has them)
    {"n": id}                                         ids below this were used (a rejected
                                                      submit burns its id)
    {"f": id}                                         a finished coflow was forgotten

On start-up the journal is replayed: new ids continue above every id ever used (ids are never
reused, whatever the restarts), and the coflows not forgotten keep their owner (only that job
client may resubmit or see them), their secret (the flows' attempt keys derive from it, so
the agents' reports about a resubmitted coflow still match) and their name and tags (a
resubmission without them gets them back). A line cut short by a crash is
skipped. Lines are written and flushed, not fsynced: a power loss may lose the last ones (a
kill -9 of the controller loses none). When the file holds more than twice the live entries
(plus COMPACT_SLACK lines) it is rewritten with the live entries only (write, then rename),
so its size stays bounded by the coflows kept. At most MAX_LIVE coflows are remembered (the
oldest are forgotten first).

The directory is created 0700 and the file 0600 (whatever the umask): the secrets are in it.
One controller at a time uses a state directory (an exclusive flock on LOCK_NAME; a second
one gets JournalError).
Without a state directory (`CoflowJournal(None)`, in-process controllers) the same bookkeeping
lives in memory only.
"""

from __future__ import annotations

import fcntl
import logging
import os
from collections import OrderedDict
from pathlib import Path

import msgspec

LOG = logging.getLogger("terra.journal")

FILE_NAME = "coflows.jsonl"
LOCK_NAME = "coflows.lock"  # held (flock) by the controller using the directory
COMPACT_SLACK = 10_000  # lines beyond 2 x live entries before the file is rewritten
MAX_LIVE = 1_000_000  # coflows remembered (owner and secret) at most


class JournalError(Exception):
    """The state directory or its journal cannot be created, opened or written."""


class CoflowJournal:
    """Coflow ids issued, and the owner and secret of every coflow not yet forgotten.

    Args:
        state_dir: directory for the journal (created 0700 if missing), or None: memory only.

    Attributes:
        next_id: the lowest id never used (0 for a new journal).
        live: {coflow id: (owner or None, secret bytes, name or None, tags tuple)}, oldest
            first.

    Raises (constructor):
        JournalError: the directory or the file cannot be created or opened, or another
            controller uses it (the message names the path).
    """

    def __init__(self, state_dir: str | os.PathLike | None) -> None:
        self.next_id = 0
        self.live: OrderedDict[int, tuple[str | None, bytes, str | None, tuple[str, ...]]] = (
            OrderedDict()
        )
        self.path: Path | None = None
        self._file = None
        self._lines = 0
        self._encode = msgspec.json.Encoder().encode
        self._lock_fd: int | None = None
        if state_dir is None:
            return
        directory = Path(state_dir)
        try:
            directory.mkdir(mode=0o700, parents=True, exist_ok=True)
            os.chmod(directory, 0o700)
            self._lock(directory / LOCK_NAME)
            self.path = directory / FILE_NAME
            self._replay()
            self._rewrite()
        except OSError as exc:
            self.close()
            raise JournalError(f"coflow journal in {directory}: {exc}") from exc

    def _lock(self, path: Path) -> None:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise JournalError(f"{path.parent} is used by another controller") from None
        self._lock_fd = fd

    def owner(self, coflow_id: int) -> tuple[bool, str | None]:
        """(known, owner): whether the id belongs to a coflow not forgotten, and its owner."""
        entry = self.live.get(coflow_id)
        return (False, None) if entry is None else (True, entry[0])

    def secret(self, coflow_id: int) -> bytes | None:
        """The remembered secret of a coflow (None: not known)."""
        entry = self.live.get(coflow_id)
        return None if entry is None else entry[1]

    def labels(self, coflow_id: int) -> tuple[str | None, tuple[str, ...]]:
        """The remembered (name, tags) of a coflow ((None, ()) when not known)."""
        entry = self.live.get(coflow_id)
        return (None, ()) if entry is None else (entry[2], entry[3])

    def admitted(
        self,
        coflow_id: int,
        owner: str | None,
        secret: bytes,
        labels: tuple[str | None, tuple[str, ...]] = (None, ()),
    ) -> None:
        """Record an admitted coflow (its id is used from now on) with its (name, tags)."""
        self.live[coflow_id] = (owner, secret, *labels)
        self.live.move_to_end(coflow_id)
        self.next_id = max(self.next_id, coflow_id + 1)
        self._append(_record(coflow_id, self.live[coflow_id]))
        while len(self.live) > MAX_LIVE:
            self.live.popitem(last=False)

    def burned(self, coflow_id: int) -> None:
        """Record that an id was used without a coflow (a rejected submit)."""
        if coflow_id >= self.next_id:
            self.next_id = coflow_id + 1
            self._append({"n": self.next_id})

    def forgotten(self, coflow_id: int) -> None:
        """Record that a finished coflow was dropped from memory (its owner goes too)."""
        if self.live.pop(coflow_id, None) is not None:
            self._append({"f": coflow_id})

    def close(self) -> None:
        """Close the file and release the directory (memory-only journals: nothing)."""
        if self._file is not None:
            self._file.close()
            self._file = None
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

    # -- file

    def _append(self, record: dict) -> None:
        if self._file is None:
            return
        try:
            self._file.write(self._encode(record) + b"\n")
            self._file.flush()
        except OSError as exc:
            LOG.error("coflow journal %s: cannot write: %s", self.path, exc)
            return
        self._lines += 1
        if self._lines > 2 * len(self.live) + COMPACT_SLACK:
            try:
                self._rewrite()
            except OSError as exc:
                LOG.error("coflow journal %s: cannot compact: %s", self.path, exc)

    def _replay(self) -> None:
        try:
            with open(self.path, "rb") as f:
                lines = f.read().splitlines()
        except FileNotFoundError:
            return
        bad = 0
        for line in lines:
            try:
                self._apply(msgspec.json.decode(line))
            except (msgspec.DecodeError, ValueError, TypeError, KeyError):
                bad += 1
        if bad:
            LOG.warning("coflow journal %s: %d unreadable lines skipped", self.path, bad)

    def _apply(self, record: dict) -> None:
        if "c" in record:
            cid, owner = record["c"], record["o"]
            name, tags = record.get("nm"), record.get("tg", [])
            if not isinstance(cid, int) or not (owner is None or isinstance(owner, str)):
                raise ValueError("bad record")
            if not (name is None or isinstance(name, str)) or not isinstance(tags, list):
                raise ValueError("bad record")
            self.live[cid] = (owner, bytes.fromhex(record["s"]), name, tuple(map(str, tags)))
            self.live.move_to_end(cid)  # as `admitted`: a resubmission is the newest
            self.next_id = max(self.next_id, cid + 1)
        elif "n" in record:
            self.next_id = max(self.next_id, int(record["n"]))
        elif "f" in record:
            self.live.pop(record["f"], None)
        while len(self.live) > MAX_LIVE:
            self.live.popitem(last=False)

    def _rewrite(self) -> None:
        """Write the live entries to a new file and put it in place of the old one."""
        tmp = self.path.with_name(FILE_NAME + ".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        os.fchmod(fd, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(self._encode({"n": self.next_id}) + b"\n")
            for cid, entry in self.live.items():
                f.write(self._encode(_record(cid, entry)) + b"\n")
        os.replace(tmp, self.path)
        if self._file is not None:
            self._file.close()
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_NOFOLLOW, 0o600)
        self._file = os.fdopen(fd, "ab")
        self._lines = len(self.live) + 1


def _record(coflow_id: int, entry: tuple) -> dict:
    """The journal line of an admitted coflow: {"c", "o", "s"} and "nm" / "tg" when set."""
    owner, secret, name, tags = entry
    record = {"c": coflow_id, "o": owner, "s": secret.hex()}
    if name is not None:
        record["nm"] = name
    if tags:
        record["tg"] = list(tags)
    return record
