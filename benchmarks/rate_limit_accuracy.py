"""Rate-limiter accuracy: per-path rate measured at a real TCP receiver vs the set rate.

Target: within 2% of the set rate over 5 s, for 1 to 200 Mbit/s.

For each rate, a sender sends chunk frames (overlay.framing) over its own loopback TCP
connection (chunks of ~10 ms of the rate, 1 KiB .. 256 KiB), rate-limited by one of the
agent's two backends (terra-agent --rate-limiter):
- bucket: overlay.rate_limit.TokenBucket, acquire(chunk) before each frame (payload bytes);
- pacing: no bucket; the socket's kernel TCP pacing (SO_MAX_PACING_RATE) is set to the rate
  plus the frame headers (overlay.rate_limit.stream_rate) and the sender writes whenever the
  socket takes more, with ~100 ms of unsent bytes (at least a chunk) allowed in the kernel
  (terra_agent.sender.paced_unsent_bytes, as PeerLink does).
The sender's MSS is clamped to --mss (default 1448, an Ethernet path's; 0 = loopback's own
65483): the pacer releases whole segments, and a 64 KiB loopback segment is half a second at
1 Mbit/s, which no WAN path has (docs/design.md section 5).

The receiver timestamps every frame on arrival; the measured rate is (bytes after the first
measured frame) / (last arrival - first measured arrival) over a
`duration`-second window that starts after a --warmup (default 0.5 s: connection set-up and
start-up bunching are not the limiter's doing). All rates run at the same time by default
(--sequential runs them one after another).

Usage:
    uv run python benchmarks/rate_limit_accuracy.py [--backend {bucket,pacing}]
        [--rates 1 2 5 10 20 50 100 200] [--duration 5] [--warmup 0.5] [--chunk BYTES]
        [--mss BYTES] [--no-header-accounting] [--sequential] [--json OUT]
Prints a table (with the process's CPU seconds per GB sent); --json OUT writes
{"backend", "max_error_fraction": x, "cpu_s_per_gb", "loadavg", "per_rate": [...]}.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import time

import trio

from overlay.framing import FrameReader, send_frame
from overlay.rate_limit import (
    RATE_LIMITERS,
    TokenBucket,
    chunk_frame_overhead,
    set_pacing_rate,
    stream_rate,
)
from terra_agent.sender import paced_unsent_bytes
from terra_agent.tcp_options import allow_unsent_bytes
from terra_security.integrity import mac_bytes
from terra_wire.frames import chunk_header

MBIT = 1e6 / 8  # bytes/s per Mbit/s
DEFAULT_RATES_MBIT = [1, 2, 5, 10, 20, 50, 100, 200]
ETHERNET_MSS = 1448  # 1500-byte MTU minus IPv4, TCP and timestamp option headers


def chunk_size(rate: float, fixed: int | None = None) -> int:
    """`fixed` if given, else about 10 ms of `rate` bytes/s, clamped to 1 KiB .. 256 KiB."""
    if fixed:
        return fixed
    return int(min(256 * 1024, max(1024, rate * 0.01)))


async def open_sender(port: int, mss: int) -> trio.SocketStream:
    """A loopback TCP connection to `port` whose MSS is clamped to `mss` bytes (0: unclamped).

    Raises OSError if the connection fails.
    """
    sock = trio.socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    if mss:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_MAXSEG, mss)
    await sock.connect(("127.0.0.1", port))
    return trio.SocketStream(sock)


async def measure_one(
    rate_mbit: float,
    duration: float,
    warmup: float,
    chunk: int | None = None,
    backend: str = "bucket",
    mss: int = ETHERNET_MSS,
    headers: bool = True,
) -> dict:
    """Send rate-limited chunks over one loopback TCP connection for `warmup` + `duration` s.

    backend: "bucket" or "pacing" (module docstring); mss: sender MSS clamp in bytes (0: none);
    headers: pacing only: add the frame headers to the pacing rate (False: pace at the payload
    rate, to show what that accounting corrects).
    Returns {"rate_mbit", "set_bytes_per_s", "measured_bytes_per_s" (payload at the receiver,
    over the last `duration` s), "error_fraction", "bytes", "chunks", "window_s",
    "chunk_bytes", "backend", "sent_bytes"}.
    Raises ValueError for an unknown backend.
    """
    if backend not in RATE_LIMITERS:
        raise ValueError(f"backend must be one of {RATE_LIMITERS}, got {backend!r}")
    rate = rate_mbit * MBIT
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    port = listeners[0].socket.getsockname()[1]
    arrivals: list[tuple[float, int]] = []

    async def receiver():
        stream = await listeners[0].accept()
        await listeners[0].aclose()
        async with stream:
            reader = FrameReader(stream)
            while (frame := await reader.read()) is not None:
                arrivals.append((trio.current_time(), len(frame[1])))

    sent = [0]

    async def sender():
        payload = bytes(chunk_size(rate, chunk))
        n = len(payload)
        macs = bytes(mac_bytes(n))  # the agents' leaf MACs, not computed: all zero here
        bucket = TokenBucket(rate)
        async with await open_sender(port, mss) as stream:
            if backend == "pacing":
                head = chunk_frame_overhead("b", "f", n) if headers else 0
                paced = stream_rate(rate, n, head)
                set_pacing_rate(stream.socket, paced)
                allow_unsent_bytes(stream, paced_unsent_bytes(n, paced))
            offset = 0
            end = trio.current_time() + warmup + duration
            while trio.current_time() < end:
                if backend == "bucket":
                    await bucket.acquire(n)
                await send_frame(stream, chunk_header("b", "f", offset, payload, macs), payload)
                offset += n
            sent[0] = offset

    async with trio.open_nursery() as nursery:
        nursery.start_soon(receiver)
        nursery.start_soon(sender)

    start = arrivals[0][0] + warmup
    window = [(t, n) for t, n in arrivals if t >= start]
    total = sum(n for _, n in window)
    span = window[-1][0] - window[0][0]
    measured = (total - window[0][1]) / span
    return {
        "rate_mbit": rate_mbit,
        "set_bytes_per_s": rate,
        "measured_bytes_per_s": measured,
        "error_fraction": abs(measured - rate) / rate,
        "bytes": total,
        "chunks": len(window),
        "window_s": span,
        "chunk_bytes": chunk_size(rate, chunk),
        "backend": backend,
        "sent_bytes": sent[0],
    }


async def run(
    rates_mbit: list[float],
    duration: float,
    warmup: float,
    sequential: bool,
    chunk: int | None,
    backend: str = "bucket",
    mss: int = ETHERNET_MSS,
    headers: bool = True,
) -> list[dict]:
    """Measure every rate (concurrently unless `sequential`); results in the order given."""
    results: dict[float, dict] = {}

    async def one(r):
        results[r] = await measure_one(r, duration, warmup, chunk, backend, mss, headers)

    if sequential:
        for r in rates_mbit:
            await one(r)
    else:
        async with trio.open_nursery() as nursery:
            for r in rates_mbit:
                nursery.start_soon(one, r)
    return [results[r] for r in rates_mbit]


def main(argv: list[str] | None = None) -> None:
    """CLI entry point; see the module docstring."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", choices=RATE_LIMITERS, default="bucket")
    parser.add_argument(
        "--mss", type=int, default=ETHERNET_MSS, help="sender MSS clamp in bytes (0: loopback's)"
    )
    parser.add_argument(
        "--rates", type=float, nargs="+", default=DEFAULT_RATES_MBIT, help="rates in Mbit/s"
    )
    parser.add_argument("--duration", type=float, default=5.0, help="seconds per rate")
    parser.add_argument("--warmup", type=float, default=0.5, help="seconds not measured")
    parser.add_argument("--chunk", type=int, default=None, help="fixed chunk bytes")
    parser.add_argument(
        "--no-header-accounting",
        action="store_true",
        help="pacing: pace at the payload rate, frame headers not added",
    )
    parser.add_argument("--sequential", action="store_true", help="one rate at a time")
    parser.add_argument("--json", metavar="OUT", help="write the figures as JSON here")
    args = parser.parse_args(argv)
    if args.duration <= 0 or args.warmup < 0 or any(r <= 0 for r in args.rates):
        parser.error("--duration and --rates must be > 0, --warmup >= 0")
    for r in args.rates:
        if chunk_size(r * MBIT, args.chunk) * 10 > r * MBIT * args.duration:
            parser.error(
                f"fewer than 10 chunks in {args.duration:g} s at {r:g} Mbit/s: "
                "use a smaller --chunk or a longer --duration"
            )

    cpu0 = time.process_time()
    results = trio.run(
        run,
        args.rates,
        args.duration,
        args.warmup,
        args.sequential,
        args.chunk,
        args.backend,
        args.mss,
        not args.no_header_accounting,
    )
    cpu = time.process_time() - cpu0  # sender and receiver together (one process)
    sent = sum(r["sent_bytes"] for r in results)
    cpu_per_gb = cpu / (sent / 1e9)
    load = os.getloadavg()
    print(f"backend {args.backend}, mss {args.mss or 'loopback'}, load average {load[0]:.2f}")
    print(f"{'Mbit/s':>8} {'chunk B':>8} {'set B/s':>12} {'measured B/s':>14} {'error %':>8}")
    for r in results:
        print(
            f"{r['rate_mbit']:>8g} {r['chunk_bytes']:>8d} "
            f"{r['set_bytes_per_s']:>12.0f} {r['measured_bytes_per_s']:>14.0f} "
            f"{100 * r['error_fraction']:>8.3f}"
        )
    worst = max(r["error_fraction"] for r in results)
    print(f"max error: {100 * worst:.3f}% over {args.duration:g} s per rate (target < 2%)")
    print(f"CPU: {cpu:.2f} s for {sent / 1e9:.3f} GB = {cpu_per_gb:.2f} CPU s/GB (both ends)")
    if args.json:
        with open(args.json, "w") as f:
            out = {"backend": args.backend, "max_error_fraction": worst, "cpu_s_per_gb": cpu_per_gb}
            out.update({"loadavg": load[0], "mss": args.mss, "per_rate": results})
            out["header_accounting"] = not args.no_header_accounting
            json.dump(out, f, indent=2)


if __name__ == "__main__":
    main()
