"""Reorder memory with one path ten times slower than the other.

Two real TCP connections on loopback carry one flow's chunks (overlay.framing); each path is
paced by its own overlay.rate_limit.TokenBucket, the slow one at 1/ratio of the fast one's
rate, and the chunks are striped over both in proportion to the rates (overlay.striping).
Each path behaves like a link of its rate: a frame's bytes leave in --slice-byte pieces, each
after taking tokens from a bucket only 5 ms deep (at least one slice; shallower buckets lose
tokens to the ~1 ms wake-up granularity of trio's timers), so a chunk takes about chunk/rate
seconds to cross (on loopback an unpaced
chunk would arrive at once and hardly anything would be out of order). Each path has a send
queue of --queue chunks, so the slow path's chunks lag the fast path's by about
queue x ratio chunks.
The receiver feeds both connections into one overlay.reorder.ReorderBuffer with a memory
limit, and checks the in-order output against the sender's stream with a running CRC-32
(ISA-L, ~20 GB/s, so checking costs next to nothing; the agent's BLAKE2b is not the subject
here).

Second figure (--gap-fill-mib N, no network): the peak in-memory bytes when a gap fills after
N MiB spilled. Every chunk but the first of an N MiB flow arrives first with a memory limit of 0
(all spill); then the first chunk arrives and the in-order bytes are taken out as a consumer
would (add(), then take_ready() until nothing is ready). The peak is tracemalloc's peak of
Python allocations meanwhile (the pieces read back from the spill file and the small objects
around them); spilled bytes come back at most max_read_bytes per call.

Usage:
    uv run python benchmarks/reorder_memory.py [--size BYTES] [--fast-mbit 1600] [--ratio 10]
        [--chunk BYTES] [--slice BYTES] [--queue N] [--memory-limit BYTES] [--spill-dir DIR]
        [--gap-fill-mib N] [--json OUT]
Prints the figures; --json OUT writes {"peak_reorder_bytes": n, "memory_limit_bytes": n,
"spilled_bytes": n, ..., "gap_fill": {"spilled_bytes": n, "peak_bytes": n,
"max_read_bytes": n, "largest_call_bytes": n, "crc_ok": bool}} (peak_reorder_bytes = peak
resident out-of-order bytes in memory; gap_fill = the second figure, absent with
--gap-fill-mib 0).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import tempfile
import tracemalloc

import trio
from isal.isal_zlib import crc32

from overlay.framing import FrameReader
from overlay.rate_limit import TokenBucket
from overlay.reorder import ReorderBuffer
from overlay.striping import Striper
from terra_security.integrity import mac_bytes
from terra_wire.frames import chunk_header, encode_frame

MBIT = 1e6 / 8
LINK_BURST_S = 0.005  # bucket depth of a paced path, seconds of its rate
PATTERN_PERIOD = 1_000_003  # prime: chunks at different offsets carry different bytes


def make_pattern(chunk: int) -> bytes:
    """Deterministic pseudo-random bytes, PATTERN_PERIOD + chunk long."""
    return hashlib.shake_256(b"reorder-bench").digest(PATTERN_PERIOD + chunk)


def payload_at(pattern: bytes, offset: int, n: int) -> memoryview:
    """The flow's bytes [offset, offset + n) (the flow repeats the pattern's first period)."""
    start = offset % PATTERN_PERIOD
    return memoryview(pattern)[start : start + n]


async def run(args) -> dict:
    """One transfer; returns the figures (see the module docstring)."""
    fast = args.fast_mbit * MBIT
    rates = {"fast": fast, "slow": fast / args.ratio}
    pattern = make_pattern(args.chunk)
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    port = listeners[0].socket.getsockname()[1]
    buf = ReorderBuffer(args.size, args.memory_limit, args.spill_dir)
    crcs = {"send": 0, "recv": 0}
    stats = {"peak_held_bytes": 0, "chunks": {"fast": 0, "slow": 0}}
    done = trio.Event()

    async def read_path(stream):
        async with stream:
            reader = FrameReader(stream)
            while (frame := await reader.read()) is not None:
                header, payload = frame
                for piece in buf.add(header["o"], payload):
                    crcs["recv"] = crc32(piece, crcs["recv"])
                stats["peak_held_bytes"] = max(stats["peak_held_bytes"], buf.held_bytes)
                if buf.complete:
                    done.set()

    async def receiver(nursery):
        for _ in rates:
            nursery.start_soon(read_path, await listeners[0].accept())
        await listeners[0].aclose()

    async def send_path(name, chunks):
        bucket = TokenBucket(rates[name], burst_bytes=max(args.slice, rates[name] * LINK_BURST_S))
        async with await trio.open_tcp_stream("127.0.0.1", port) as stream:
            async for offset, n in chunks:
                data = payload_at(pattern, offset, n)
                macs = bytes(mac_bytes(n))  # room for the leaf MACs, never checked here
                for part in encode_frame(chunk_header("bench", "flow", offset, data, macs), data):
                    await send_paced(stream, bucket, memoryview(part), args.slice)
                stats["chunks"][name] += 1
            await done.wait()

    async def dispatcher(channels):
        striper = Striper(rates)
        for offset in range(0, args.size, args.chunk):
            n = min(args.chunk, args.size - offset)
            crcs["send"] = crc32(payload_at(pattern, offset, n), crcs["send"])
            await channels[striper.next_path(n)].send((offset, n))
        for ch in channels.values():
            await ch.aclose()

    t0 = trio.current_time()
    with trio.fail_after(args.timeout):
        await _transfer(receiver, send_path, dispatcher, args.queue)
    elapsed = trio.current_time() - t0
    figures = {
        "peak_reorder_bytes": buf.peak_resident_bytes,
        "memory_limit_bytes": args.memory_limit,
        "spilled_bytes": buf.spilled_bytes,
        "peak_held_bytes": stats["peak_held_bytes"],
        "flow_bytes": args.size,
        "chunk_bytes": args.chunk,
        "rates_bytes_per_s": rates,
        "chunks_per_path": stats["chunks"],
        "seconds": elapsed,
        "digest_ok": buf.complete and crcs["recv"] == crcs["send"],
    }
    buf.close()
    return figures


def gap_fill(spill_mib: int, chunk: int, spill_dir: str) -> dict:
    """Peak in-memory bytes when a gap fills after spill_mib MiB spilled (module docstring).

    Returns {"spilled_bytes", "peak_bytes" (tracemalloc peak, bytes), "max_read_bytes",
    "largest_call_bytes" (most bytes one add() / take_ready() returned), "crc_ok"}.
    """
    size = spill_mib << 20
    pattern = make_pattern(chunk)
    buf = ReorderBuffer(size, 0, spill_dir)
    expected = 0
    for offset in range(0, size, chunk):
        n = min(chunk, size - offset)
        expected = crc32(payload_at(pattern, offset, n), expected)
        if offset:
            buf.add(offset, bytes(payload_at(pattern, offset, n)))
    first = bytes(payload_at(pattern, 0, min(chunk, size)))
    crc, largest = 0, 0
    tracemalloc.start()
    try:
        pieces = buf.add(0, first)
        while pieces:
            largest = max(largest, sum(len(p) for p in pieces))
            for piece in pieces:
                crc = crc32(piece, crc)
            pieces = piece = None  # the consumer is done with them before it takes more
            pieces = buf.take_ready()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    figures = {
        "spilled_bytes": buf.spilled_bytes,
        "peak_bytes": peak,
        "max_read_bytes": buf.max_read_bytes,
        "largest_call_bytes": largest,
        "crc_ok": buf.complete and crc == expected,
    }
    buf.close()
    return figures


async def send_paced(stream, bucket: TokenBucket, data: memoryview, slice_bytes: int) -> None:
    """Send `data` in `slice_bytes` pieces, each after taking its tokens (a link's pacing)."""
    for start in range(0, len(data), slice_bytes):
        piece = data[start : start + slice_bytes]
        await bucket.acquire(len(piece))
        await stream.send_all(piece)


async def _transfer(receiver, send_path, dispatcher, queue: int) -> None:
    """Start the receiver, one sender task per path, and the dispatcher; wait for all."""
    async with trio.open_nursery() as nursery:
        nursery.start_soon(receiver, nursery)
        channels = {}
        for name in ("fast", "slow"):
            send_ch, recv_ch = trio.open_memory_channel(queue)
            channels[name] = send_ch
            nursery.start_soon(send_path, name, recv_ch)
        nursery.start_soon(dispatcher, channels)


def main(argv: list[str] | None = None) -> None:
    """CLI entry point; see the module docstring."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=200_000_000, help="flow bytes")
    parser.add_argument("--fast-mbit", type=float, default=1600, help="fast path rate, Mbit/s")
    parser.add_argument("--ratio", type=float, default=10, help="fast rate / slow rate")
    parser.add_argument("--chunk", type=int, default=1 << 20, help="chunk bytes")
    parser.add_argument("--slice", type=int, default=64 * 1024, help="pacing slice bytes")
    parser.add_argument("--queue", type=int, default=2, help="per-path send queue, chunks")
    parser.add_argument("--memory-limit", type=int, default=4 << 20, help="reorder memory bound")
    parser.add_argument("--spill-dir", default=None, help="spill directory (default: a temp dir)")
    parser.add_argument("--timeout", type=float, default=600, help="give up after seconds")
    parser.add_argument(
        "--gap-fill-mib", type=int, default=256, help="MiB spilled before a gap fills (0: skip)"
    )
    parser.add_argument("--json", metavar="OUT", help="write the figures as JSON here")
    args = parser.parse_args(argv)
    if min(args.size, args.chunk, args.slice) <= 0 or args.memory_limit < 0 or args.queue < 0:
        parser.error("--size, --chunk, --slice must be > 0; --memory-limit, --queue >= 0")
    if args.gap_fill_mib < 0:
        parser.error("--gap-fill-mib must be >= 0")
    if args.fast_mbit <= 0 or args.ratio <= 0:
        parser.error("--fast-mbit and --ratio must be > 0")

    with tempfile.TemporaryDirectory(prefix="reorder-bench-") as tmp:
        if args.spill_dir is None:
            args.spill_dir = tmp
        os.makedirs(args.spill_dir, exist_ok=True)
        figures = trio.run(run, args)
        if args.gap_fill_mib:
            figures["gap_fill"] = gap_fill(args.gap_fill_mib, args.chunk, args.spill_dir)

    rates = figures["rates_bytes_per_s"]
    print(
        f"flow {figures['flow_bytes']:,} B in {figures['chunk_bytes']:,} B chunks; "
        f"fast {rates['fast'] / 1e6:.1f} MB/s, slow {rates['slow'] / 1e6:.1f} MB/s; "
        f"chunks fast/slow {figures['chunks_per_path']['fast']}/"
        f"{figures['chunks_per_path']['slow']}; {figures['seconds']:.2f} s"
    )
    print(f"memory limit       {figures['memory_limit_bytes']:>14,} B")
    print(f"peak resident      {figures['peak_reorder_bytes']:>14,} B")
    print(f"peak held (mem+disk){figures['peak_held_bytes']:>13,} B")
    print(f"spilled            {figures['spilled_bytes']:>14,} B")
    print(f"digest ok          {figures['digest_ok']}")
    within = figures["peak_reorder_bytes"] <= figures["memory_limit_bytes"]
    print(f"peak within limit  {within}")
    if "gap_fill" in figures:
        fill = figures["gap_fill"]
        print(
            f"gap fill after {fill['spilled_bytes']:,} B spilled: peak in-memory "
            f"{fill['peak_bytes']:,} B (read back <= {fill['max_read_bytes']:,} B per call, "
            f"largest call {fill['largest_call_bytes']:,} B), crc ok {fill['crc_ok']}"
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(figures, f, indent=2)


if __name__ == "__main__":
    main()
