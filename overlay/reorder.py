"""Per-flow reorder buffer: in-order delivery with bounded memory and disk spill.

docs/design.md section 5 ("Reordering", "No loss"): chunks of one flow arrive out
of order over paths of different latency and rate. The receiver delivers the
flow's bytes in order; out-of-order bytes are held in memory up to a bound and
spilled to a file in a spill directory beyond it. Duplicate and overlapping
bytes (resends after a path failure) are dropped, so every byte is delivered
exactly once.

Held bytes are kept as non-overlapping segments sorted by offset. A MemoryBudget
shared by several buffers bounds their total resident memory as well. When a new
segment does not fit under the memory bound, the held in-memory segments that
lie farthest ahead (beyond the new one) are written to the spill file first;
if that is still not enough, the new segment itself is spilled. So memory
holds the bytes needed soonest.

Spilled bytes come back in bounded pieces: when a chunk fills the gap at the
delivery point, add() returns the held in-memory segments that follow but reads
spilled ones back only up to max_read_bytes per call. The held bytes contiguous
with the delivery point that add() did not return stay held as "ready"
(ready_bytes); the caller takes them with take_ready() as it makes room. So a
gap fill after a long spill never brings all of the spill file into memory.
"""

from __future__ import annotations

import bisect
import glob
import os
import tempfile
from dataclasses import dataclass

SPILL_SUFFIX = ".spill"


class MemoryBudget:
    """A memory bound shared by several ReorderBuffers (e.g. all flows of one agent).

    MemoryBudget(limit_bytes: int >= 0). Buffers created with ``budget=`` keep
    out-of-order bytes in memory only while the budget's total stays within
    limit_bytes (and within their own memory_limit_bytes); the rest spills.

    Attributes:
        limit_bytes: the bound; used_bytes: bytes held in memory now by all
            buffers on this budget; peak_bytes: the largest used_bytes seen.

    Raises:
        ValueError: limit_bytes not an int >= 0.
    """

    def __init__(self, limit_bytes: int) -> None:
        if isinstance(limit_bytes, bool) or not isinstance(limit_bytes, int) or limit_bytes < 0:
            raise ValueError(f"limit_bytes must be an int >= 0, got {limit_bytes!r}")
        self.limit_bytes = limit_bytes
        self.used_bytes = 0
        self.peak_bytes = 0

    def _change(self, delta: int) -> None:
        self.used_bytes += delta
        self.peak_bytes = max(self.peak_bytes, self.used_bytes)


@dataclass
class _Segment:
    """Held bytes [start, end): in memory (data) or in the spill file (file_offset)."""

    start: int
    end: int
    data: bytes | memoryview | None = None
    file_offset: int = -1


DEFAULT_MAX_READ_BYTES = 4 << 20  # spilled bytes one add() reads back, at most


class ReorderBuffer:
    """Delivers one flow's bytes in order from chunks arriving in any order.

    ReorderBuffer(size_bytes, memory_limit_bytes, spill_dir, budget=None,
                  max_read_bytes=DEFAULT_MAX_READ_BYTES):
        size_bytes: the flow's size in bytes (int >= 0).
        memory_limit_bytes: most out-of-order bytes held in memory (int >= 0).
        spill_dir: directory for the spill file (created lazily on the first
            spill, removed by close()); None = the system temp directory.
        budget: optional MemoryBudget shared with other buffers; memory is then
            also bounded by the budget (spilling this buffer's own segments).
        max_read_bytes: most spilled bytes one add() reads back from the spill
            file (int >= 1; at least one whole segment is read whatever the bound,
            so a segment larger than it still comes back).
        spill_prefix: name prefix of the spill file (PREFIX + random + SPILL_SUFFIX);
            remove_spill_files() finds a crashed owner's files by it.

    Attributes:
        delivered: bytes returned to the caller in order so far (by add() and
            take_ready()).
        resident_bytes: bytes held in memory now (<= memory_limit_bytes).
        peak_resident_bytes: the largest resident_bytes seen.
        spilled_bytes: total bytes ever written to the spill file.
        held_bytes: bytes held now (out of order, or ready), in memory or on disk.
        ready_bytes: held bytes contiguous with `delivered` (see take_ready()).

    Raises:
        ValueError: sizes that are not ints >= 0, max_read_bytes not an int >= 1.
    """

    def __init__(
        self,
        size_bytes: int,
        memory_limit_bytes: int,
        spill_dir: str | None,
        budget: MemoryBudget | None = None,
        max_read_bytes: int = DEFAULT_MAX_READ_BYTES,
        spill_prefix: str = "reorder-",
    ) -> None:
        self.spill_prefix = spill_prefix
        for name, value in (("size_bytes", size_bytes), ("memory_limit_bytes", memory_limit_bytes)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"{name} must be an int >= 0, got {value!r}")
        _check_read_bound("max_read_bytes", max_read_bytes)
        self.max_read_bytes = max_read_bytes
        self.size_bytes = size_bytes
        self.memory_limit_bytes = memory_limit_bytes
        self.spill_dir = spill_dir
        self.budget = budget
        self.delivered = 0
        self._ready_end = 0  # held segments cover [delivered, _ready_end) without a gap
        self.resident_bytes = 0
        self.peak_resident_bytes = 0
        self.spilled_bytes = 0
        self.held_bytes = 0
        self._starts: list[int] = []
        self._segments: dict[int, _Segment] = {}
        self._spill_fd: int | None = None
        self._spill_path: str | None = None
        self._spill_end = 0
        self._on_disk = 0  # held bytes now in the spill file
        self._closed = False

    @property
    def complete(self) -> bool:
        """True when all size_bytes bytes have been delivered (returned to the caller)."""
        return self.delivered == self.size_bytes

    @property
    def ready_bytes(self) -> int:
        """Held bytes contiguous with `delivered` (in memory or spilled), not returned yet:
        take_ready() returns them. 0 after close()."""
        return self._ready_end - self.delivered

    @property
    def spill_path(self) -> str | None:
        """Path of the spill file, or None if nothing was spilled yet."""
        return self._spill_path

    def add(self, offset: int, data) -> list:
        """Take a chunk of `data` (bytes-like) starting at flow byte `offset`.

        `data` must not be modified afterwards: it is delivered or held without a copy.

        Returns:
            The bytes now deliverable in order, as a list of bytes-like pieces
            (bytes, or memoryview slices of `data` when it arrived in order; no
            copy is made on that path). Empty if the chunk filled no gap at the
            delivery point. Bytes already delivered or already held are dropped.
            Held segments that now follow in order are returned while in memory;
            spilled ones are read back up to max_read_bytes (at least one
            segment), and whatever follows stays held as ready_bytes (see
            take_ready()).

        Raises:
            ValueError: offset not an int >= 0, chunk reaching beyond size_bytes,
                data not bytes-like, or the buffer is closed.
            OSError: the spill file cannot be written or read.
        """
        if self._closed:
            raise ValueError("reorder buffer is closed")
        if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
            raise ValueError(f"chunk offset must be an int >= 0, got {offset!r}")
        try:
            view = memoryview(data).cast("B")
        except TypeError as exc:
            raise ValueError(f"chunk data must be bytes-like, got {type(data).__name__}") from exc
        end = offset + len(view)
        if end > self.size_bytes:
            raise ValueError(
                f"chunk [{offset}, {end}) reaches beyond the flow size {self.size_bytes}"
            )
        if end <= self.delivered:
            return []  # duplicate of delivered bytes
        if offset < self.delivered:
            view = view[self.delivered - offset :]
            offset = self.delivered
        if offset == self.delivered:
            out = [_whole(data, view)]
            self._skip_held_until(end)
            self.delivered = end
            self._pop_contiguous(out, None, self.max_read_bytes)
            self._extend_ready()
            return out
        gaps = self._gaps(offset, end)
        if gaps == [(offset, end)]:  # nothing of it held yet: keep it as it is, no copy
            self._hold(offset, _whole(data, view))
        else:
            for start, stop in gaps:  # copies: a slice must not pin the whole chunk in memory
                self._hold(start, bytes(view[start - offset : stop - offset]))
        self._extend_ready()
        return []

    def take_ready(self, max_bytes: int | None = None) -> list:
        """Return the next ready held bytes in order (see ready_bytes), advancing `delivered`.

        Args:
            max_bytes: most bytes to return (int >= 1; None = max_read_bytes). At least
                one whole segment is returned when any is ready, even if larger.

        Returns:
            A list of bytes-like pieces continuing the in-order stream (spilled
            ones read back from the spill file); empty when ready_bytes is 0.

        Raises:
            ValueError: max_bytes not an int >= 1, or the buffer is closed.
            OSError: the spill file cannot be read.
        """
        if self._closed:
            raise ValueError("reorder buffer is closed")
        if max_bytes is None:
            max_bytes = self.max_read_bytes
        _check_read_bound("max_bytes", max_bytes)
        out: list = []
        self._pop_contiguous(out, max_bytes, max_bytes)
        return out

    def close(self) -> None:
        """Drop held bytes and remove the spill file. Safe to call twice."""
        self._closed = True
        self._ready_end = self.delivered
        self._starts.clear()
        self._segments.clear()
        self._resident_change(-self.resident_bytes)
        self.held_bytes = self._on_disk = 0
        if self._spill_fd is not None:
            os.close(self._spill_fd)
            self._spill_fd = None
        if self._spill_path is not None:
            try:
                os.unlink(self._spill_path)
            except FileNotFoundError:
                pass
            self._spill_path = None

    def __enter__(self) -> ReorderBuffer:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- held segments ---------------------------------------------------------

    def _gaps(self, start: int, end: int) -> list[tuple[int, int]]:
        """Sub-ranges of [start, end) not covered by held segments."""
        gaps = []
        i = bisect.bisect_right(self._starts, start) - 1
        if i < 0:
            i = 0
        cursor = start
        while i < len(self._starts) and cursor < end:
            seg = self._segments[self._starts[i]]
            if seg.end <= cursor:
                i += 1
                continue
            if seg.start >= end:
                break
            if seg.start > cursor:
                gaps.append((cursor, seg.start))
            cursor = max(cursor, seg.end)
            i += 1
        if cursor < end:
            gaps.append((cursor, end))
        return gaps

    def _skip_held_until(self, end: int) -> None:
        """Delivering [delivered, end) in-line: drop held bytes below end (duplicates).

        A held segment straddling `end` keeps its part above `end`.
        """
        while self._starts and self._starts[0] < end:
            seg = self._take_first()
            if seg.end > end:
                data = self._load(seg)
                self._hold(end, bytes(data[end - seg.start :]))  # a copy: see add()

    def _pop_contiguous(self, out: list, max_bytes: int | None, max_read: int) -> None:
        """Append held segments that now continue the in-order stream, advancing `delivered`:
        at most `max_bytes` bytes in all (None: no bound) and `max_read` bytes read back from
        the spill file, but at least one segment. The rest stays held (ready)."""
        taken = read = 0
        while self._starts and self._starts[0] == self.delivered:
            seg = self._segments[self.delivered]
            size = seg.end - seg.start
            spilled = size if seg.data is None else 0
            over_all = max_bytes is not None and taken + size > max_bytes
            if taken and (over_all or read + spilled > max_read):
                break
            self._take_first()
            out.append(self._load(seg))
            self.delivered = seg.end
            taken += size
            read += spilled

    def _extend_ready(self) -> None:
        """Move _ready_end past held segments that continue [delivered, _ready_end)."""
        self._ready_end = max(self._ready_end, self.delivered)
        while self._ready_end in self._segments:
            self._ready_end = self._segments[self._ready_end].end

    def _take_first(self) -> _Segment:
        start = self._starts.pop(0)
        seg = self._segments.pop(start)
        size = seg.end - seg.start
        self.held_bytes -= size
        if seg.data is not None:
            self._resident_change(-size)
        else:
            self._on_disk -= size
        return seg

    def _load(self, seg: _Segment) -> bytes | memoryview:
        if seg.data is not None:
            return seg.data
        data = os.pread(self._spill_fd, seg.end - seg.start, seg.file_offset)
        if len(data) != seg.end - seg.start:
            raise OSError(f"spill file {self._spill_path} is short at offset {seg.file_offset}")
        if self._on_disk == 0:
            self._reset_spill_file()
        return data

    def _hold(self, start: int, data) -> None:
        size = len(data)
        seg = _Segment(start, start + size)
        over = self._over_by(size)
        if over > 0:
            self._evict_beyond(start, over)
        if self._over_by(size) <= 0:
            seg.data = data
            self._resident_change(size)
        else:
            seg.file_offset = self._spill(data)
            self._on_disk += size
        bisect.insort(self._starts, start)
        self._segments[start] = seg
        self.held_bytes += size

    def _over_by(self, size: int) -> int:
        """How many bytes over the memory bounds (own and budget) holding `size` more would be."""
        over = self.resident_bytes + size - self.memory_limit_bytes
        if self.budget is not None:
            over = max(over, self.budget.used_bytes + size - self.budget.limit_bytes)
        return over

    def _resident_change(self, delta: int) -> None:
        self.resident_bytes += delta
        self.peak_resident_bytes = max(self.peak_resident_bytes, self.resident_bytes)
        if self.budget is not None:
            self.budget._change(delta)

    def _evict_beyond(self, start: int, need: int) -> None:
        """Spill in-memory segments after `start`, farthest first, to free `need` bytes."""
        freed = 0
        for s in reversed(self._starts):
            if s <= start or freed >= need:
                break
            seg = self._segments[s]
            if seg.data is None:
                continue
            size = seg.end - seg.start
            seg.file_offset = self._spill(seg.data)
            seg.data = None
            self._resident_change(-size)
            self._on_disk += size
            freed += size

    def _spill(self, data: bytes) -> int:
        if self._spill_fd is None:
            fd, path = tempfile.mkstemp(
                prefix=self.spill_prefix, suffix=SPILL_SUFFIX, dir=self.spill_dir
            )
            self._spill_fd, self._spill_path = fd, path
        offset = self._spill_end
        written = 0
        with memoryview(data) as view:
            while written < len(view):
                written += os.pwrite(self._spill_fd, view[written:], offset + written)
        self._spill_end += len(data)
        self.spilled_bytes += len(data)
        return offset

    def _reset_spill_file(self) -> None:
        """Nothing left on disk: truncate the spill file so it does not grow forever."""
        os.ftruncate(self._spill_fd, 0)
        self._spill_end = 0


def remove_spill_files(spill_dir: str, prefix: str) -> list[str]:
    """Remove the spill files PREFIX*SPILL_SUFFIX in `spill_dir` (regular files only) and
    return their paths. An agent calls it at start-up with its own prefix: it holds no flow
    yet, so every such file was left by an earlier run of it (a crash) and belongs to no live
    flow. Files that vanish meanwhile or cannot be removed are skipped."""
    removed = []
    pattern = os.path.join(glob.escape(spill_dir), glob.escape(prefix) + "*" + SPILL_SUFFIX)
    for path in glob.glob(pattern):
        try:
            if os.path.isfile(path) and not os.path.islink(path):
                os.unlink(path)
                removed.append(path)
        except OSError:
            pass
    return removed


def _check_read_bound(name: str, value) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be an int >= 1, got {value!r}")


def _whole(data, view: memoryview):
    """Return `data` itself when `view` covers all of it, else the view slice."""
    if isinstance(data, bytes) and len(view) == len(data):
        return data
    return view
