"""The controller's coflow journal: ids issued, every coflow's request, attempts and end.

A controller started with a state directory (terra-controller --state-dir, by default
~/.local/state/terra-controller) appends one JSON line per event to STATE_DIR/coflows.jsonl:

    {"c": id, "o": owner or null, "s": secret hex,   a coflow was admitted (with its name
     "nm": name?, "tg": [tags]?,                      and tags, when it has them), its flows
     "fl": [[flow id, src agent, dst agent, bytes,    [id, src, dst, bytes, src_path,
             src_path, dst_path], ...]?,               dst_path], its deadline (s after its
     "dl": deadline s or null?, "at": arrival?}       arrival) and its arrival (Unix time, s)
    {"u": id, "fl": [[...], ...]}                     flows added to it (updateCoflow)
    {"a": id, "fid": flow id, "n": attempt}           a flow restarted from byte 0
    {"e": id, "st": state, "why": reason or null,     it ended: done, failed or cancelled,
     "cct": CCT s or null, "bt": bytes, "bd": bytes}  its CCT and bytes (total, delivered)
    {"n": id}                                         ids below this were used (a rejected
                                                      submit burns its id)
    {"f": id}                                         a finished coflow was forgotten
    {"l": [A, B], "up": bool, "cap": bytes/s or null} the operator's state of link A-B
                                                      (ctl link-down / link-up / capacity;
                                                      A < B, the whole state each time)
    {"t": {"src", "tenants", "owners"}}               the live tenants (terra_controller/
                                                      tenants.py TenantBook.record; the
                                                      last line wins)

On start-up the journal is replayed: new ids continue above every id ever used (ids are never
reused, whatever the restarts); the coflows not forgotten keep their owner (only that job
client may resubmit or see them), their secret (the flows' attempt keys derive from it, so
the agents' reports about a resubmitted coflow still match) and their name and tags (a
resubmission without them gets them back). A coflow that had not ended is `resumable`: the
controller admits it again by itself, with its flows, attempts, arrival and deadline
(terra_controller/resume.py), so no client resubmits anything after a restart; an ended one
answers status requests with its final state. The operator's link states and capacities
(`links`) are replayed too: the controller applies them before its first round
(terra_controller/operator_links.py). A line cut short by a crash is skipped. Lines
are written and flushed, not fsynced: a power loss may lose the last ones (a kill -9 of the
controller loses none). When the file holds more than twice the live entries (plus
COMPACT_SLACK lines) it is rewritten with the live entries only (write, then rename), so its
size stays bounded by the coflows kept. At most MAX_LIVE coflows are remembered (the oldest
are forgotten first).

The directory is created 0700 and the file 0600 (whatever the umask): the secrets are in it.
One controller at a time uses a state directory (an exclusive flock on LOCK_NAME; a second
one gets JournalError).
Without a state directory (`CoflowJournal(None)`, in-process controllers) the same
bookkeeping lives in memory only. With a shared store instead (`CoflowJournal(None,
store=EtcdState)`, the controllers of `terra-controller --etcd`), each coflow's records are
one etcd key, rewritten whole on every change, and the operator's links are one key
(etcd_state.py). Changes are queued by the journal's owner (no I/O there) as messages to
one writer thread (store_writer.py), which sends what is queued as one transaction (group
commit), so concurrent submits share etcd round trips; `wait_durable` waits until the store
has taken everything queued so far. A write the store refuses or cannot take stays queued
(`failing` says why) and is sent again.
"""

from __future__ import annotations

import fcntl
import logging
import os
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path

import msgspec

from terra_controller.store_writer import StoreWriter

LOG = logging.getLogger("terra.journal")

FILE_NAME = "coflows.jsonl"
LOCK_NAME = "coflows.lock"  # held (flock) by the controller using the directory
STORE_WAIT_S = 2.0  # how long a change waits for the shared store before the caller moves on
COMPACT_SLACK = 10_000  # lines beyond 2 x live entries before the file is rewritten
MAX_LIVE = 1_000_000  # coflows remembered (owner and secret) at most


class JournalError(Exception):
    """The state directory or its journal cannot be created, opened or written."""


# One flow as the journal keeps it: [flow id, src agent, dst agent, bytes, src_path, dst_path].
FlowRow = list


@dataclass
class JournalEntry:
    """What the journal remembers of one coflow.

    Attributes:
        owner: the submitting job client's name (None: in-process). secret: its secret bytes.
        name, tags: its label and tags.
        flows: its flows as FlowRow lists (empty once it ended, or for an entry written
            before flows were journaled).
        deadline_s: deadline in seconds after its arrival, or None.
        arrival_unix: its first submission's arrival (Unix time, s), or None.
        attempts: {flow id: attempt} for flows restarted from byte 0.
        ended: None while it runs; else {"state", "reason", "cct_s", "bytes_total",
            "bytes_delivered"}.
        ref: the client's retry reference of the submit that made it (a resent submit with
            the same reference gets this coflow back, also after a restart or failover).
    """

    owner: str | None
    secret: bytes
    name: str | None = None
    tags: tuple[str, ...] = ()
    flows: list[FlowRow] = field(default_factory=list)
    deadline_s: float | None = None
    arrival_unix: float | None = None
    attempts: dict[str, int] = field(default_factory=dict)
    ended: dict | None = None
    ref: str | None = None

    @property
    def resumable(self) -> bool:
        """True when the coflow had not ended and its flows and arrival are known."""
        return self.ended is None and bool(self.flows) and self.arrival_unix is not None


class CoflowJournal:
    """Coflow ids issued, and every coflow not yet forgotten: owner, secret, labels, flows,
    arrival, deadline, restarted attempts and end.

    Args:
        state_dir: directory for the journal (created 0700 if missing), or None: memory only.
        store: an EtcdState (terra_controller/etcd_state.py) to keep the entries in instead
            of a file (state_dir is then None); it is read once here.

    Attributes:
        next_id: the lowest id never used (0 for a new journal).
        live: {coflow id: JournalEntry}, oldest first.
        failing: why the store could not take the last writes (None: all written).
        version: changes recorded so far (the store's revision with a store).
        links: {(A, B) with A < B: {"up": bool, "cap": bytes/s or None}}: the operator's
            state of each link it changed (ctl link-down / link-up / capacity).
        tenants: the last tenants record (tenants.py), or None; kept with the links (the
            store's `links` key).

    Raises (constructor):
        JournalError: the directory or the file cannot be created or opened, or another
            controller uses it (the message names the path).
    """

    def __init__(self, state_dir: str | os.PathLike | None, store=None) -> None:
        self.next_id = 0
        self.live: OrderedDict[int, JournalEntry] = OrderedDict()
        self.path: Path | None = None
        self._file = None
        self._lines = 0
        self._encode = msgspec.json.Encoder().encode
        self._lock_fd: int | None = None
        self.store = store
        self._changes = 0
        self._writer = StoreWriter(store) if store is not None else None
        self._refs: dict[tuple[str | None, str], int] = {}  # (owner, ref) -> coflow id
        self.links: dict[tuple[str, str], dict] = {}
        self.tenants: dict | None = None
        if store is not None:
            self._load_store()
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

    @property
    def version(self) -> int:
        """Changes recorded so far (with a store: its revision after our last write)."""
        return self.store.revision if self.store is not None else self._changes

    def owner(self, coflow_id: int) -> tuple[bool, str | None]:
        """(known, owner): whether the id belongs to a coflow not forgotten, and its owner."""
        entry = self.live.get(coflow_id)
        return (False, None) if entry is None else (True, entry.owner)

    def secret(self, coflow_id: int) -> bytes | None:
        """The remembered secret of a coflow (None: not known)."""
        entry = self.live.get(coflow_id)
        return None if entry is None else entry.secret

    def by_ref(self, owner: str | None, ref: str) -> int | None:
        """The id of the coflow `owner` submitted with retry reference `ref`, if remembered."""
        cid = self._refs.get((owner, ref))
        entry = self.live.get(cid) if cid is not None else None
        return cid if entry is not None and entry.ref == ref else None

    def labels(self, coflow_id: int) -> tuple[str | None, tuple[str, ...]]:
        """The remembered (name, tags) of a coflow ((None, ()) when not known)."""
        entry = self.live.get(coflow_id)
        return (None, ()) if entry is None else (entry.name, entry.tags)

    def admitted(
        self,
        coflow_id: int,
        owner: str | None,
        secret: bytes,
        labels: tuple[str | None, tuple[str, ...]] = (None, ()),
        flows: list[FlowRow] | None = None,
        deadline_s: float | None = None,
        arrival_unix: float | None = None,
        ref: str | None = None,
    ) -> None:
        """Record an admitted coflow (its id is used from now on) with its (name, tags), and,
        to resume it after a restart, its flows (FlowRow lists), deadline (s after arrival)
        and arrival (Unix time, s), and the retry reference of its submit. Attempts (and a
        reference) recorded for it before are kept."""
        old = self.live.get(coflow_id)
        entry = JournalEntry(owner, secret, *labels, list(flows or []), deadline_s, arrival_unix)
        entry.ref = ref
        if old is not None and old.ended is None:
            entry.attempts = old.attempts
        if old is not None and ref is None:
            entry.ref = old.ref
        if entry.ref is not None:
            self._refs[(owner, entry.ref)] = coflow_id
        self.live[coflow_id] = entry
        self.live.move_to_end(coflow_id)
        self.next_id = max(self.next_id, coflow_id + 1)
        self._write_entry(coflow_id, entry)
        while len(self.live) > MAX_LIVE:
            evicted = self.live.popitem(last=False)[0]
            if self.store is not None:
                self._queue(evicted)
        self._save(coflow_id)

    def added(self, coflow_id: int, flows: list[FlowRow]) -> None:
        """Record flows added to a running coflow (updateCoflow)."""
        entry = self.live.get(coflow_id)
        if entry is not None and entry.ended is None:
            entry.flows.extend(flows)
            self._append({"u": coflow_id, "fl": flows})
            self._save(coflow_id)

    def attempt(self, coflow_id: int, flow_id: str, attempt: int) -> None:
        """Record that a flow restarted from byte 0 as attempt `attempt` (its keys change)."""
        entry = self.live.get(coflow_id)
        if entry is not None and entry.ended is None:
            entry.attempts[flow_id] = attempt
            self._append({"a": coflow_id, "fid": flow_id, "n": attempt})
            self._save(coflow_id)

    def ended(self, coflow_id: int, summary: dict) -> None:
        """Record that a coflow ended. `summary` has "state", "reason", "cct_s",
        "bytes_total" and "bytes_delivered" (its flows are no longer kept)."""
        entry = self.live.get(coflow_id)
        if entry is not None and entry.ended is None:
            entry.ended = {k: summary[k] for k in ENDED_KEYS}
            entry.flows, entry.attempts = [], {}
            self._append(_ended_record(coflow_id, entry.ended))
            self._save(coflow_id)

    def burned(self, coflow_id: int) -> None:
        """Record that an id was used without a coflow (a rejected submit)."""
        if coflow_id >= self.next_id:
            self.next_id = coflow_id + 1
            self._append({"n": self.next_id})
            self._save(None)

    def forgotten(self, coflow_id: int) -> None:
        """Record that a finished coflow was dropped from memory (its owner goes too)."""
        entry = self.live.pop(coflow_id, None)
        if entry is not None:
            self._refs.pop((entry.owner, entry.ref), None)
            self._append({"f": coflow_id})
            self._save(coflow_id)

    def link_set(self, a: str, b: str, up: bool | None = None, cap: float | None = None) -> dict:
        """Record the operator's state of the undirected link a-b: `up` (None: unchanged)
        and capacity `cap` in bytes/s (None: unchanged). Returns the link's whole state
        {"up": bool, "cap": bytes/s or None (the topology's own)}."""
        key = (a, b) if a <= b else (b, a)
        state = self.links.setdefault(key, {"up": True, "cap": None})
        if up is not None:
            state["up"] = up
        if cap is not None:
            state["cap"] = float(cap)
        self._append(_link_record(key, state))
        self._changes += 1
        if self._writer is not None:
            self._writer.links(self._link_records(), self.next_id)
        return dict(state)

    def tenants_set(self, record: dict) -> None:
        """Record the live tenants (a JSON-able map; tenants.py), replacing the last."""
        self.tenants = record
        self._append({"t": record})
        self._changes += 1
        if self._writer is not None:
            self._writer.links(self._link_records(), self.next_id)

    def _link_records(self) -> list[dict]:
        tenants = [] if self.tenants is None else [{"t": self.tenants}]
        return [_link_record(key, state) for key, state in self.links.items()] + tenants

    def close(self) -> None:
        """Close the file and release the directory (memory-only journals: nothing)."""
        if self._file is not None:
            self._file.close()
            self._file = None
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

    # -- the shared store

    def _load_store(self) -> None:
        """Read every entry from the store (StateStoreError: it cannot be reached)."""
        next_id, entries = self.store.load()
        for records in entries:
            try:
                for record in records:
                    self._apply(record)
            except (ValueError, TypeError, KeyError, AttributeError):
                LOG.warning("shared state: an unreadable coflow entry skipped")
        self.next_id = max(self.next_id, next_id)
        for record in self.store.load_links():
            try:
                self._apply(record)
            except (ValueError, TypeError, KeyError):
                LOG.warning("shared state: an unreadable link state skipped")

    def _save(self, coflow_id: int | None) -> None:
        """Queue a changed entry (None: the id counter only) for the store, if any."""
        self._changes += 1
        if self.store is not None:
            self._queue(coflow_id)

    def _queue(self, coflow_id: int | None) -> None:
        entry = self.live.get(coflow_id) if coflow_id is not None else None
        records = _records(coflow_id, entry) if entry is not None else None
        if self._writer is not None:
            self._writer.change(coflow_id, records, self.next_id)

    @property
    def failing(self) -> str | None:
        """Why the store could not take the last writes (None: all written, or no store)."""
        return None if self._writer is None else self._writer.failing

    def wait_durable(self, timeout_s: float = STORE_WAIT_S) -> bool:
        """Wait until the store took every change queued so far (True; always without a
        store), or `timeout_s` passed or a write failed meanwhile (False)."""
        return self._writer is None or self._writer.wait(timeout_s)

    def flush(self) -> bool:
        """Whether the store takes writes again: write the id counter and wait briefly for
        it and what is queued.

        Returns:
            True when everything queued is written (always, without a store); else False
            and `failing` says why.
        """
        if self._writer is None:
            return True
        self._writer.probe(self.next_id)
        return self._writer.wait(STORE_WAIT_S)

    # -- file

    def _write_entry(self, coflow_id: int, entry: JournalEntry) -> None:
        for record in _records(coflow_id, entry):
            self._append(record)

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
        if self._lines > 2 * (len(self.live) + len(self.links)) + COMPACT_SLACK:
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
            except (msgspec.DecodeError, ValueError, TypeError, KeyError, AttributeError):
                bad += 1
        if bad:
            LOG.warning("coflow journal %s: %d unreadable lines skipped", self.path, bad)

    def _apply(self, record: dict) -> None:
        if "c" in record:
            cid = record["c"]
            if not isinstance(cid, int):
                raise ValueError("bad record")
            entry = _entry_of(record)
            old = self.live.get(cid)
            if old is not None and old.ended is None and entry.ended is None:
                entry.attempts = old.attempts
            if old is not None and entry.ref is None:
                entry.ref = old.ref
            if entry.ref is not None:
                self._refs[(entry.owner, entry.ref)] = cid
            self.live[cid] = entry
            self.live.move_to_end(cid)  # as `admitted`: a resubmission is the newest
            self.next_id = max(self.next_id, cid + 1)
        elif "u" in record:
            self._entry(record["u"]).flows.extend(_rows(record["fl"]))
        elif "a" in record:
            self._entry(record["a"]).attempts[str(record["fid"])] = int(record["n"])
        elif "e" in record:
            entry = self._entry(record["e"])
            entry.ended = {k: record[short] for k, short in ENDED_KEYS.items()}
            entry.flows, entry.attempts = [], {}
        elif "n" in record:
            self.next_id = max(self.next_id, int(record["n"]))
        elif "f" in record:
            self.live.pop(record["f"], None)
        elif "l" in record:
            key, state = _link_of(record)
            self.links[key] = state
        elif "t" in record:
            if not isinstance(record["t"], dict):
                raise ValueError("bad record")
            self.tenants = record["t"]
        while len(self.live) > MAX_LIVE:
            self.live.popitem(last=False)

    def _entry(self, coflow_id: object) -> JournalEntry:
        """The live entry a replayed record is about (KeyError: none, the line is skipped)."""
        return self.live[coflow_id]  # type: ignore[index]

    def _rewrite(self) -> None:
        """Write the live entries to a new file and put it in place of the old one."""
        tmp = self.path.with_name(FILE_NAME + ".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        os.fchmod(fd, 0o600)
        lines = 1
        with os.fdopen(fd, "wb") as f:
            f.write(self._encode({"n": self.next_id}) + b"\n")
            for record in self._link_records():
                f.write(self._encode(record) + b"\n")
                lines += 1
            for cid, entry in self.live.items():
                for record in _records(cid, entry):
                    f.write(self._encode(record) + b"\n")
                    lines += 1
        os.replace(tmp, self.path)
        if self._file is not None:
            self._file.close()
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_NOFOLLOW, 0o600)
        self._file = os.fdopen(fd, "ab")
        self._lines = lines


# the keys of JournalEntry.ended and their short names on an "e" line
ENDED_KEYS = {"state": "st", "reason": "why", "cct_s": "cct", "bytes_total": "bt",
              "bytes_delivered": "bd"}  # fmt: skip


def _records(coflow_id: int, entry: JournalEntry) -> list[dict]:
    """The journal lines that rebuild `entry`: its "c" line, then its attempts or its end."""
    record: dict = {"c": coflow_id, "o": entry.owner, "s": entry.secret.hex()}
    if entry.name is not None:
        record["nm"] = entry.name
    if entry.tags:
        record["tg"] = list(entry.tags)
    if entry.ref is not None:
        record["rf"] = entry.ref
    if entry.flows:
        record["fl"] = [list(row) for row in entry.flows]  # a copy: the writer reads it later
    if entry.deadline_s is not None:
        record["dl"] = entry.deadline_s
    if entry.arrival_unix is not None:
        record["at"] = entry.arrival_unix
    out = [record]
    out += [{"a": coflow_id, "fid": fid, "n": n} for fid, n in entry.attempts.items()]
    if entry.ended is not None:
        out.append(_ended_record(coflow_id, entry.ended))
    return out


def _ended_record(coflow_id: int, ended: dict) -> dict:
    return {"e": coflow_id} | {short: ended[k] for k, short in ENDED_KEYS.items()}


def _link_record(key: tuple[str, str], state: dict) -> dict:
    return {"l": list(key), "up": state["up"], "cap": state["cap"]}


def _link_of(record: dict) -> tuple[tuple[str, str], dict]:
    """((A, B), {"up", "cap"}) of a replayed "l" line (ValueError: a bad line)."""
    link, up, cap = record["l"], record["up"], record.get("cap")
    if not (isinstance(link, list) and len(link) == 2 and all(isinstance(x, str) for x in link)):
        raise ValueError("bad record")
    if not isinstance(up, bool) or not (cap is None or (isinstance(cap, int | float) and cap > 0)):
        raise ValueError("bad record")
    a, b = link
    return ((a, b) if a <= b else (b, a)), {"up": up, "cap": None if cap is None else float(cap)}


def _entry_of(record: dict) -> JournalEntry:
    """The JournalEntry of a replayed "c" line (ValueError / TypeError: a bad line)."""
    owner, name, tags = record["o"], record.get("nm"), record.get("tg", [])
    if not (owner is None or isinstance(owner, str)):
        raise ValueError("bad record")
    if not (name is None or isinstance(name, str)) or not isinstance(tags, list):
        raise ValueError("bad record")
    deadline, arrival = record.get("dl"), record.get("at")
    for value in (deadline, arrival):
        if not (value is None or isinstance(value, int | float)):
            raise ValueError("bad record")
    secret = bytes.fromhex(record["s"])
    flows = _rows(record.get("fl", []))
    ref = record.get("rf")
    if not (ref is None or isinstance(ref, str)):
        raise ValueError("bad record")
    entry = JournalEntry(owner, secret, name, tuple(map(str, tags)), flows, deadline, arrival)
    entry.ref = ref
    return entry


def _rows(flows: object) -> list[FlowRow]:
    """Check replayed flow rows: [id, src, dst, bytes, src_path, dst_path] each."""
    if not isinstance(flows, list):
        raise ValueError("bad record")
    for row in flows:
        if not (isinstance(row, list) and len(row) == 6 and isinstance(row[3], int)):
            raise ValueError("bad record")
        if not all(isinstance(v, str) for v in row[:3]):
            raise ValueError("bad record")
    return flows
