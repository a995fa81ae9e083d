"""The thread that sends the journal's changes to the shared store (etcd), and tells those
who wait when their changes are durable.

Its state (what is queued, what the store took, who waits) belongs to its thread alone:
the journal's owner (the controller's loop) and the threads that wait talk to it only by
messages on one channel, so no lock is shared. Group commit: everything queued when it sends
goes as one transaction (etcd_state.EtcdState.write), so concurrent submits share round
trips. A change nobody waits for (a coflow's end, a flow's attempt) waits up to LAZY_S for
one somebody waits for, and goes in its transaction. What the store refuses or cannot take
stays queued and is sent again every STORE_RETRY_S seconds; `failing` says why meanwhile.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from dataclasses import dataclass, field

LOG = logging.getLogger("terra.journal")

STORE_RETRY_S = 0.2  # pause before sending again what the store did not take
LAZY_S = 0.05  # how long a change nobody waits for waits to share a later transaction


@dataclass
class _Queued:
    """The writer thread's own state."""

    changes: dict[int, list[dict] | None] = field(default_factory=dict)  # id -> records
    links: list[dict] | None = None  # the links' (and tenants') records, when changed
    next_id: int = 0
    received: int = 0  # changes received
    durable: int = 0  # changes the store took
    waiters: list[tuple[int, queue.SimpleQueue]] = field(default_factory=list)


class StoreWriter:
    """Sends queued changes to `store` from a thread of its own (started here).

    Args:
        store: an etcd_state.EtcdState (or anything with its `write(next_id, {coflow id:
            records or None}, links records or None)` raising StateStoreError).

    Attributes:
        failing: why the store could not take the last writes (None: all written); set by
            the writer's thread only.
    """

    def __init__(self, store) -> None:
        self.store = store
        self.failing: str | None = None
        self._inbox: queue.SimpleQueue = queue.SimpleQueue()
        threading.Thread(target=self._run, daemon=True, name="terra-journal-store").start()

    def change(self, coflow_id: int | None, records: list[dict] | None, next_id: int) -> None:
        """Queue a coflow's records (None: delete its key; coflow_id None: the id counter
        only), with the lowest id never used now. Never blocks."""
        self._inbox.put(("change", coflow_id, records, next_id))

    def links(self, records: list[dict], next_id: int) -> None:
        """Queue the links' and tenants' records (replacing any queued). Never blocks."""
        self._inbox.put(("links", records, next_id))

    def probe(self, next_id: int) -> None:
        """Write the id counter again, whether or not anything is queued, forgetting why the
        last write failed: `wait` then says whether the store takes writes again."""
        self._inbox.put(("probe", None, None, next_id))

    def wait(self, timeout_s: float) -> bool:
        """Wait until the store took every change queued before this call: True; False
        after `timeout_s` seconds, or as soon as a write fails meanwhile (or failed, with
        changes still queued)."""
        reply: queue.SimpleQueue = queue.SimpleQueue()
        self._inbox.put(("wait", reply))
        try:
            return reply.get(timeout=timeout_s)
        except queue.Empty:
            return False

    def _run(self) -> None:
        q = _Queued()
        while True:
            if q.received == q.durable:
                self._take(q, None)  # nothing to send: wait for a message
            if not q.waiters:  # let changes nobody waits for share a later transaction
                until = time.monotonic() + LAZY_S
                while not q.waiters and (left := until - time.monotonic()) > 0:
                    self._take(q, left)
            self._take_all(q)
            if q.received > q.durable and not self._send(q):
                time.sleep(STORE_RETRY_S)

    def _take(self, q: _Queued, timeout: float | None) -> None:
        try:
            message = self._inbox.get(timeout=timeout)
        except queue.Empty:
            return
        self._apply(q, message)

    def _take_all(self, q: _Queued) -> None:
        while True:
            try:
                message = self._inbox.get_nowait()
            except queue.Empty:
                return
            self._apply(q, message)

    def _apply(self, q: _Queued, message: tuple) -> None:
        kind = message[0]
        if kind == "wait":
            reply = message[1]
            if q.durable >= q.received:
                reply.put(True)
            elif self.failing is not None:
                reply.put(False)
            else:
                q.waiters.append((q.received, reply))
            return
        if kind == "change" and message[1] is not None:
            q.changes[message[1]] = message[2]
        elif kind == "links":
            q.links = message[1]
        elif kind == "probe":
            self.failing = None
        q.next_id = max(q.next_id, message[-1])
        q.received += 1

    def _send(self, q: _Queued) -> bool:
        from terra_controller.etcd_state import StateStoreError

        batch, links, target = q.changes, q.links, q.received
        q.changes, q.links = {}, None
        try:
            self.store.write(q.next_id, batch, links)
        except StateStoreError as exc:
            for cid, records in batch.items():  # newer changes queued meanwhile win
                q.changes.setdefault(cid, records)
            if q.links is None:
                q.links = links
            if self.failing is None:
                LOG.error("shared state: %s; writes are kept until it answers", exc)
            self.failing = str(exc)
            self._answer(q, False)
            return False
        q.durable = target
        self.failing = None
        self._answer(q, True)
        return True

    def _answer(self, q: _Queued, durable: bool) -> None:
        """Answer the waiters: all of them after a failure, those now durable after a write."""
        keep = []
        for target, reply in q.waiters:
            if durable and target > q.durable:
                keep.append((target, reply))
            else:
                reply.put(durable)
        q.waiters = keep
