"""Receiving side of a flow: reorder, hash, write to the sink, decide completion (docs/design.md 5).

A flow is complete when all `size` bytes have been delivered in order and the keyed flow digest
of the delivered bytes (terra_security/integrity.py) equals the sender's (carried as "d" by the
chunk
that ends the flow). Before a chunk is taken at all, admit() checks that it lies on the leaf
grid, ends at most max_ahead bytes past the in-order point (the spill bound) and that its leaf
MACs are the flow key's (the one keyed pass over its bytes; a chunk that came as an AEAD record
of its flow's key, overlay/sealed.py, is decrypted instead and its MACs taken from the record);
the verified MACs then make the digest as consume() delivers the leaves in order (FlowDigest:
no second pass).

Connection tasks only reorder (InFlow.receive); one consumer task per flow (InFlow.consume, run by
the agent) folds the in-order leaves into the digest and writes the bytes to the sink, large
batches to a file sink in a worker thread. The acknowledged offset covers only bytes digested
and written to the sink.

Bytes the reorder buffer spilled to disk come back in bounded batches: a chunk that fills the gap
queues at most READY_BATCH_BYTES of spilled bytes; the rest stays "ready" in the reorder buffer
and consume() queues the next batch whenever its flow's queue is empty and the HashQueue is not
full. So a gap filled after gigabytes spilled never brings them all into memory at once.
"""

from __future__ import annotations

import hashlib
import logging

import trio

from overlay.reorder import MemoryBudget, ReorderBuffer
from terra_security.data_records import RecordError
from terra_security.integrity import LEAF_BYTES, FlowDigest, FlowKeys
from terra_wire.control import FlowSpec, ProtocolError

from .sources import DigestSink, open_sink

log = logging.getLogger(__name__)

THREAD_HASH_BYTES = 256 * 1024  # consume(): batches at least this large for a file sink are
# digested and written in one worker-thread call (os.write releases the GIL); a
# digest-only sink's batch is folded inline (leaves with verified MACs cost no hashing)
WRITER_THREADS = 8  # HashQueue.threads: worker threads of consume() at once, all flows
MAX_QUEUED_BYTES = 16 << 20  # default HashQueue bound of a flow that has no shared one
READY_BATCH_BYTES = 4 << 20  # spilled (ready) bytes read back and queued at a time, at most
# (at least one held segment, i.e. one chunk, whatever its size)
MAX_AHEAD_BYTES = 1 << 30  # default spill bound: a chunk may end this far past the in-order point


class ChunkRejected(ProtocolError):
    """A chunk refused before it reached the flow: bad MAC, or too far ahead (InFlow.admit).
    Its connection is closed; the sender requeues what was unacknowledged on it."""


class HashQueue:
    """A bound on in-order bytes received but not hashed and written yet, shared by flows.

    HashQueue(limit_bytes: int >= 0). InFlow.receive() waits while more than limit_bytes are
    queued by all flows on this queue together (backpressure on every connection); each flow's
    consume() takes its bytes out and wakes the waiters. An agent shares one between all its
    receiving flows, so memory stays bounded however many flows arrive at once.

    Attributes: limit_bytes, queued_bytes (now), peak_bytes (largest queued_bytes seen),
    threads (trio.CapacityLimiter of WRITER_THREADS: the flows' consume() worker threads).

    Raises:
        ValueError: limit_bytes not an int >= 0.
    """

    def __init__(self, limit_bytes: int) -> None:
        if isinstance(limit_bytes, bool) or not isinstance(limit_bytes, int) or limit_bytes < 0:
            raise ValueError(f"limit_bytes must be an int >= 0, got {limit_bytes!r}")
        self.limit_bytes = limit_bytes
        # worker threads writing the flows' batches at once, at most: more only contend for
        # the GIL (each write, hash and fsync hands it back and forth) and the journal
        self.threads = trio.CapacityLimiter(WRITER_THREADS)
        self.queued_bytes = 0
        self.peak_bytes = 0
        self._taken = trio.Event()

    @property
    def full(self) -> bool:
        """True while more than limit_bytes are queued."""
        return self.queued_bytes > self.limit_bytes

    async def wait_taken(self) -> None:
        """Wait until some flow takes bytes out (or fails)."""
        taken = self._taken
        await taken.wait()

    def _add(self, nbytes: int) -> None:
        self.queued_bytes += nbytes
        self.peak_bytes = max(self.peak_bytes, self.queued_bytes)

    def _take(self, nbytes: int) -> None:
        self.queued_bytes -= nbytes
        self._taken.set()
        self._taken = trio.Event()


class InFlow:
    """Receiver state of one flow.

    InFlow(spec: FlowSpec, memory_limit: bytes held in memory out of order, spill_dir: str,
    budget: MemoryBudget shared with the agent's other flows or None, queue: HashQueue shared
    with them or None = a HashQueue of MAX_QUEUED_BYTES for this flow alone, data_root: the
    agent's data root (a "file:PATH" sink's PATH is relative to it) or None = file sinks refused,
    max_ahead: bytes a chunk may end past the in-order point (the spill bound), spill_prefix:
    the name prefix of this agent's spill files (overlay/reorder.py remove_spill_files),
    sink_path: a file sink's path as resolve_data_path gave it to the caller, or None; sink:
    the flow's sink opened by the caller for byte 0 (open_sink), or None: opened here).
    The sink is opened with resume when spec.offset > 0: a file sink then keeps what its part
    file (PATH.terra-part) holds, cut to a leaf boundary, and the receiver continues from there
    (bytes before it are re-hashed into leaf MACs; the sender's digest, if it had arrived, is
    read back from beside the part file);
    else it starts at 0. A file sink's part file is renamed over PATH only when the digest
    matched (check_digest).

    Attributes: delivered (contiguous bytes handed in order to consume(); bytes the reorder
    buffer holds ready beyond it are handed over in batches as consume() makes room),
    acknowledged (contiguous bytes hashed and written to the sink: the offset acknowledged to the
    sender, <= delivered; the bytes between wait for consume()), expected_digest (sender's hex
    digest once seen), digest (own hex digest once all bytes are in), done (digest matched),
    failed (digest mismatch or sink write failure message, or None), digest_mismatch (True
    when failed because the digests differ: the controller may restart the flow), reported and
    ack_writer (set by the agent: it told the controller about done / failed; the connection of
    the latest chunk, where consume()'s progress is acked), keys (FlowKeys of spec.digest_key),
    rejected_macs / rejected_ahead (chunks admit() refused).

    Raises:
        SourceError: the sink cannot be opened or its path is refused (no data root, absolute,
            outside the data root).
    """

    def __init__(
        self,
        spec: FlowSpec,
        memory_limit: int,
        spill_dir: str,
        budget: MemoryBudget | None = None,
        queue: HashQueue | None = None,
        data_root: str | None = None,
        max_ahead: int = MAX_AHEAD_BYTES,
        spill_prefix: str = "reorder-",
        sink_path: str | None = None,
        sink=None,
    ) -> None:
        self.spec = spec
        self.keys = FlowKeys(spec.digest_key, spec.digest_alg)
        self.max_ahead = max_ahead
        self.rejected_macs = 0
        self.rejected_ahead = 0
        self.sink = sink or open_sink(
            spec.sink,
            spec.size,
            resume=spec.offset > 0,
            data_root=data_root,
            align=LEAF_BYTES,
            resolved=sink_path,
        )
        self.hasher = FlowDigest(self.keys, spec.size)
        # SHA-256 of a file sink's bytes, fed as they pass (status shows it; sync compares it)
        self._sha = hashlib.sha256() if spec.sink.startswith("file:") else None
        self.sha256: str | None = None
        self.base = self.sink.resume_offset
        if self.base:
            self.sink.prefix_hash(self.hasher, *([self._sha] if self._sha else []))
        self.delivered = self.base
        self.acknowledged = self.base
        self.expected_digest: str | None = (
            self.sink.load_digest(spec.digest_alg) if self.base else None
        )
        self._digest_saved = self.expected_digest is not None
        self.digest: str | None = None
        self.done = False
        self.failed: str | None = None
        self.digest_mismatch = False
        self._aborted = False
        self.reported = False  # the agent reported done / failed to the controller
        self._reorder = None
        self._pending: list = []  # in-order pieces not yet hashed / written
        self._pending_bytes = 0
        self._busy = False  # consume() is hashing / writing pieces (maybe in a thread)
        self._queued = trio.Event()  # set when receive() queues in-order bytes
        self._queue = queue if queue is not None else HashQueue(MAX_QUEUED_BYTES)
        self.ack_writer = None  # set by the agent: where to acknowledge consume()'s progress
        self.peak_resident_bytes = 0
        self.spilled_bytes = 0
        if self.base < spec.size:
            self._reorder = ReorderBuffer(
                spec.size - self.base,
                memory_limit,
                spill_dir,
                budget=budget,
                max_read_bytes=READY_BATCH_BYTES,
                spill_prefix=spill_prefix,
            )

    @property
    def complete(self) -> bool:
        """True once every byte has been delivered in order, hashed and written (digest not yet
        compared)."""
        return self.delivered >= self.spec.size and not self._pending and not self._busy

    def open_record(self, offset: int, record) -> memoryview:
        """The bytes of a chunk that arrived as an AEAD record (overlay/sealed.SealedPayload),
        decrypted in place with this flow attempt's key; ChunkRejected (counted in
        rejected_macs) when the record does not verify."""
        try:
            return record.open(self.spec.digest_key)
        except RecordError as exc:
            self.rejected_macs += 1
            raise ChunkRejected(
                f"chunk at {offset} of flow {self.spec.coflow}/{self.spec.flow}: {exc}"
            ) from exc

    def admit(self, offset: int, data, macs: bytes, verified: bool = False) -> None:
        """Refuse a chunk (ChunkRejected) before anything of it is kept: when it is off the
        leaf grid (starts off a LEAF_BYTES boundary, or ends off one before the flow's end),
        ends more than max_ahead bytes past the in-order point (`delivered`), or `macs` is not
        the flow key's MAC list of `data` at `offset`. One keyed pass over `data`, inline
        (cheaper than a worker-thread hand-off, docs/results.md 5.2). verified=True (the chunk
        and its MACs came in an AEAD record of this flow's key, open_record): the MACs are
        not computed again."""
        name = f"{self.spec.coflow}/{self.spec.flow}"
        end = offset + len(data)
        if offset % LEAF_BYTES or (end % LEAF_BYTES and end != self.spec.size):
            raise ChunkRejected(f"chunk [{offset}, {end}) of flow {name} is off the leaf grid")
        if end > self.delivered + self.max_ahead:
            self.rejected_ahead += 1
            raise ChunkRejected(
                f"chunk [{offset}, {end}) of flow {name} ends more than {self.max_ahead} bytes "
                f"past its in-order point {self.delivered}; closing so the sender resends"
            )
        if not verified and not self.keys.check(offset, data, macs):
            self.rejected_macs += 1
            raise ChunkRejected(
                f"chunk [{offset}, {end}) of flow {name}: MAC does not match (tampered, or not "
                "made with the flow's key); dropped, closing so the sender resends"
            )

    def add(self, offset: int, data, digest: str | None = None, macs: bytes | None = None) -> None:
        """Take a chunk of `data` at byte `offset`; deliver what is now in order to the sink.

        Bytes before `delivered` (duplicates) are dropped; `digest` is the sender's flow digest
        when the chunk ends the flow; `macs`: its leaf MACs once admit() verified them (None:
        its leaves are hashed from the bytes). Digests and writes inline, every byte now in
        order (spilled bytes in batches of READY_BATCH_BYTES); do not mix with receive().

        Raises:
            ProtocolError: the chunk runs past the flow's size, or a different sender digest.
            OSError: the sink or the spill file cannot be written or read.
        """
        self._accept(offset, data, digest, macs)
        while True:
            pieces, nbytes = self._take_pending()
            self._consume(pieces)
            self.acknowledged += nbytes
            if self.failed is not None or not self._queue_ready():
                break
        if self.complete:
            self._finish_data()

    async def receive(
        self, offset: int, data, digest: str | None = None, macs: bytes | None = None
    ) -> int:
        """Take a chunk (as add()) from a connection's task without hashing it: the bytes now in
        order are queued for consume(), which runs in its own task. `delivered` moves at once,
        `acknowledged` once consume() has hashed and written the bytes. Waits while more than
        its HashQueue's limit are queued (backpressure on every connection alike), so a consume()
        task must run for every flow on that queue.

        Returns:
            bytes this chunk made deliverable in order now, i.e. queued for consume() (0: a
            duplicate or out-of-order chunk). A chunk that fills a gap queues at most
            READY_BATCH_BYTES of spilled bytes; consume() queues the rest later.

        Raises:
            ProtocolError: as add().
        """
        before = self.delivered
        self._accept(offset, data, digest, macs)
        made = self.delivered - before  # before waiting: other chunks may deliver meanwhile
        if self._pending or self.ready_bytes:
            self._queued.set()
        while self._queue.full and self.failed is None:
            await self._queue.wait_taken()
        return made

    async def consume(self) -> int:
        """Hash and write every in-order byte queued by receive(), in delivery order; waits for
        some when none are queued. One task per flow calls it in a loop.

        Batches of THREAD_HASH_BYTES or more for a file sink go to a worker thread in one
        call (digest-only sinks: inline, folding verified leaf MACs costs ~nothing); a batch is what
        arrived while the previous one was hashed, so thread calls per byte fall as the load
        rises and connections never wait for the hash. When nothing is queued but the reorder
        buffer holds ready bytes (spilled bytes after a gap was filled), the next batch of
        READY_BATCH_BYTES is read back and queued once the HashQueue is not full, so its
        queued bytes stay within its limit + one batch on this path. `acknowledged` moves past
        the batch afterwards; once the last byte is consumed the flow's digest is computed
        (`complete`).

        Returns:
            bytes consumed; 0 once the flow is complete or failed (nothing more will come).
            A sink that cannot be written or a spill file that cannot be read fails the flow
            (`failed` says why).
        """
        while not self._pending:
            if self.failed is not None:
                return 0
            if self.ready_bytes:
                if self._queue.full:
                    await self._queue.wait_taken()
                    continue
                try:
                    self._queue_ready()
                except OSError as exc:
                    self.fail(f"flow {self.spec.coflow}/{self.spec.flow}: spill read failed: {exc}")
                    return 0
                continue
            if self.complete:
                self._finish_data()
                return 0
            queued = self._queued = trio.Event()
            await queued.wait()
        pieces, nbytes = self._take_pending()
        self._busy = True
        try:
            last = self.delivered >= self.spec.size and not self._pending
            if isinstance(self.sink, DigestSink):
                self._consume(pieces)
            elif nbytes >= THREAD_HASH_BYTES or last:  # the last one: fsync off the loop too
                await trio.to_thread.run_sync(
                    self._consume, pieces, last, limiter=self._queue.threads
                )
            else:
                self._consume(pieces)
        except OSError as exc:
            self.fail(f"flow {self.spec.coflow}/{self.spec.flow}: sink write failed: {exc}")
            return 0
        finally:
            self._busy = False
            if self._aborted:  # abort() came while a thread wrote: remove what it left
                self._remove_part()
                self.close()
        self.acknowledged += nbytes
        if self.complete:
            self._finish_data()
        return nbytes

    def fail(self, message: str) -> None:
        """Mark the flow failed (`message` says why): it takes no more bytes, nothing waits in
        receive() any longer, and it is never done."""
        self.failed = message
        log.error(message)
        self._take_pending()

    def abort(self, message: str) -> None:
        """Stop the flow for good without reporting it (the controller dropped it): it takes
        no more bytes, is marked failed (`message`) and reported, its consume() task returns,
        its sink's part file is removed at once (sink.remove_part: a later attempt of the
        flow starts a new one), and its reorder buffer and sink are closed (once a write in
        progress has ended)."""
        self._remove_part()
        self.reported = True
        if self.failed is None:
            self.failed = message
            self._take_pending()
        self._aborted = True
        if not self._busy:
            self.close()
        self._queued.set()

    def _remove_part(self) -> None:
        try:
            self.sink.remove_part()
        except OSError as exc:
            log.warning("flow %s/%s: cannot remove its part file: %s", *self.spec.key, exc)

    def _take_pending(self) -> tuple[list, int]:
        pieces, nbytes = self._pending, self._pending_bytes
        self._pending, self._pending_bytes = [], 0
        self._queue._take(nbytes)
        return pieces, nbytes

    def _accept(self, offset: int, data, digest: str | None, macs: bytes | None = None) -> None:
        """Check a chunk, keep the sender's digest, queue the bytes now in order in _pending,
        remember its verified leaf MACs for the digest. A failed flow queues nothing more."""
        start, end = offset, offset + len(data)
        if end > self.spec.size:
            raise ProtocolError(
                f"chunk [{offset}, {end}) runs past flow {self.spec.coflow}/{self.spec.flow} "
                f"of {self.spec.size} bytes"
            )
        if digest is not None:
            if self.expected_digest not in (None, digest):
                raise ProtocolError(f"flow {self.spec.coflow}/{self.spec.flow}: digest changed")
            if self.expected_digest is None:
                self.expected_digest = digest  # saved beside the part file by _consume
        if self._reorder is None or end <= self.delivered or self.failed is not None:
            return
        if offset < self.base:
            data = memoryview(data)[self.base - offset :]
            offset = self.base
        before = self._reorder.delivered
        pieces = self._reorder.add(offset - self.base, data)
        if macs:
            self.hasher.know(start, macs)  # the chunk's own (leaf-aligned) offset
        self._queue_pieces(pieces, before)

    def _queue_ready(self) -> int:
        """Queue the next batch (READY_BATCH_BYTES) of the reorder buffer's ready bytes in
        _pending; returns the bytes queued (0: none ready)."""
        if not self.ready_bytes:
            return 0
        before = self._reorder.delivered
        self._queue_pieces(self._reorder.take_ready(READY_BATCH_BYTES), before)
        return self._reorder.delivered - before

    def _queue_pieces(self, pieces: list, before: int) -> None:
        """Append in-order pieces to _pending; `before` = the reorder buffer's delivered offset
        before they were taken out of it."""
        nbytes = self._reorder.delivered - before
        self._pending.extend(pieces)
        self._pending_bytes += nbytes
        self._queue._add(nbytes)
        self.delivered = self.base + self._reorder.delivered

    def _consume(self, pieces: list, last: bool = False) -> None:
        """Hash and write in-order pieces (runs in a worker thread for large batches and for a
        file sink's last one, which then syncs the part file (FileSink.sync) and settles the
        flow: _settle).

        The sender's digest, once known, is saved beside the part file (sink.save_digest)
        before more bytes are written, but for the last batch, which commits in the same call:
        a part file holding every byte without a saved digest exists only until that commit,
        and since the receiver acknowledges the last bytes only after it, a receiver that
        stops in between gets the last chunk, with its digest, again."""
        if self.expected_digest is not None and not self._digest_saved and not last:
            self.sink.save_digest(self.expected_digest, self.spec.digest_alg)
            self._digest_saved = True
        sha = self._sha
        for piece in pieces:
            self.hasher.update(piece)
            if sha is not None:
                sha.update(piece)
            self.sink.write(piece)
        if last:
            self.sink.sync()
            self._settle()

    def _settle(self) -> None:
        """Once the last bytes are written and synced (a worker thread): the flow's digest and
        SHA-256, and the commit (the part file renamed over the destination) when the digest
        is the sender's. A commit that fails is left to check_digest, which tries again and
        fails the flow with the reason; a flow aborted meanwhile is not committed."""
        self.digest = self.hasher.hexdigest()
        if self._sha is not None:
            self.sha256 = self._sha.hexdigest()
        if self.digest == self.expected_digest and not self._aborted:
            try:
                self.sink.commit()
            except OSError:
                pass  # check_digest reports it

    def _finish_data(self) -> None:
        self._drop_reorder()
        if self.digest is None:
            self.digest = self.hasher.hexdigest()
            if self._sha is not None:
                self.sha256 = self._sha.hexdigest()
            self.sink.close()

    def check_digest(self) -> bool:
        """Once complete and the sender's digest is known, compare; True when it matches.

        On a match the sink is committed (a file sink's part file renamed over its destination)
        and done is set; a mismatch or a commit that fails (OSError) sets failed (message).
        False while either digest is still missing.
        """
        if self.done or self.failed or not self.complete:
            return self.done
        self._finish_data()
        if self.expected_digest is None:
            return False
        if self.digest == self.expected_digest:
            try:
                self.sink.commit()
            except OSError as exc:
                self.failed = (
                    f"flow {self.spec.coflow}/{self.spec.flow}: cannot move the received file "
                    f"into place: {exc.strerror}"
                )
                log.error(self.failed)
                return False
            self.done = True
        else:
            self.digest_mismatch = True
            self.failed = (
                f"flow {self.spec.coflow}/{self.spec.flow}: digest mismatch "
                f"(received {self.digest[:16]}..., sender {self.expected_digest[:16]}...)"
            )
            log.error(self.failed)
        return self.done

    @property
    def ready_bytes(self) -> int:
        """Bytes in order held by the reorder buffer (mostly spilled), not handed to consume()
        yet; they follow `delivered`."""
        return self._reorder.ready_bytes if self._reorder is not None else 0

    @property
    def resident_bytes(self) -> int:
        """Out-of-order bytes held in memory now."""
        return self._reorder.resident_bytes if self._reorder is not None else 0

    def reorder_stats(self) -> tuple[int, int]:
        """(peak out-of-order bytes resident in memory, bytes spilled to disk) so far."""
        if self._reorder is not None:
            return self._reorder.peak_resident_bytes, self._reorder.spilled_bytes
        return self.peak_resident_bytes, self.spilled_bytes

    def close(self) -> None:
        """Release the reorder buffer (and its spill files), the queued bytes and the sink."""
        self._take_pending()
        self._drop_reorder()
        self.sink.close()

    def _drop_reorder(self) -> None:
        if self._reorder is not None:
            self.peak_resident_bytes = self._reorder.peak_resident_bytes
            self.spilled_bytes = self._reorder.spilled_bytes
            self._reorder.close()
            self._reorder = None
