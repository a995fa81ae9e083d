"""Raw framing throughput: chunk frames over loopback TCP, sender and receiver in two processes.

The sender process writes chunk frames (terra_wire.frames.chunk_header + send_frame, CRC-32 per
chunk) of one pre-made payload as fast as it can over N connections; the receiver process
reads them with FrameReader (checksum verified) and counts payload bytes. No data source, no
digest, no rate limit: this is the ceiling the framing puts on an agent.

Usage:
    uv run python benchmarks/framing_throughput.py [--connections 1 4] [--chunk BYTES]
        [--seconds 3] [--json OUT]
Prints GB/s (1e9 bytes/s of payload, measured at the receiver) and CPU seconds per GB for each
side; --json OUT writes {"runs": [{"connections", "gbytes_per_s", "sender_cpu_s_per_gb",
"receiver_cpu_s_per_gb", ...}, ...]}.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import time

import trio

from overlay.framing import FrameReader, send_frame
from terra_security.integrity import mac_bytes
from terra_wire.frames import chunk_header


async def _receive(port_q, result_q, connections: int, warmup: float, seconds: float) -> None:
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    port_q.put(listeners[0].socket.getsockname()[1])
    streams = [await listeners[0].accept() for _ in range(connections)]
    counted = {"bytes": 0, "on": False}

    async def read_all(stream):
        async with stream:
            reader = FrameReader(stream)
            while (frame := await reader.read()) is not None:
                if counted["on"]:
                    counted["bytes"] += len(frame[1])

    async with trio.open_nursery() as nursery:
        for s in streams:
            nursery.start_soon(read_all, s)
        await trio.sleep(warmup)
        counted["on"] = True
        t0, c0 = trio.current_time(), time.process_time()
        await trio.sleep(seconds)
        counted["on"] = False
        wall, cpu = trio.current_time() - t0, time.process_time() - c0
        result_q.put({"bytes": counted["bytes"], "seconds": wall, "cpu_s": cpu})
        # keep reading until the sender closes


def _receiver_main(port_q, result_q, connections, warmup, seconds) -> None:
    trio.run(_receive, port_q, result_q, connections, warmup, seconds)


async def _send(port: int, connections: int, chunk: int, duration: float) -> float:
    """Send for `duration` s over `connections` streams; returns sender CPU seconds."""
    payload = memoryview(bytes(range(256)) * (chunk // 256 + 1))[:chunk]
    no_macs = bytes(mac_bytes(chunk))  # framing only: the leaf MACs' room, never checked here
    c0 = time.process_time()

    async def send_all(i):
        async with await trio.open_tcp_stream("127.0.0.1", port) as stream:
            offset = 0
            flow = f"f{i}"
            end = trio.current_time() + duration
            while trio.current_time() < end:
                header = chunk_header("bench", flow, offset, payload, no_macs)
                await send_frame(stream, header, payload)
                offset += chunk

    async with trio.open_nursery() as nursery:
        for i in range(connections):
            nursery.start_soon(send_all, i)
    return time.process_time() - c0


def run_once(connections: int, chunk: int, seconds: float, warmup: float = 0.5) -> dict:
    """One measurement; returns {"connections", "chunk_bytes", "gbytes_per_s",
    "sender_cpu_s_per_gb", "receiver_cpu_s_per_gb"}."""
    ctx = mp.get_context("spawn")
    port_q, result_q = ctx.Queue(), ctx.Queue()
    proc = ctx.Process(target=_receiver_main, args=(port_q, result_q, connections, warmup, seconds))
    proc.start()
    try:
        port = port_q.get(timeout=30)
        sender_cpu = trio.run(_send, port, connections, chunk, warmup + seconds + 0.3)
        res = result_q.get(timeout=30)
    finally:
        proc.join(timeout=30)
        if proc.is_alive():
            proc.kill()
    gb = res["bytes"] / 1e9
    total_s = warmup + seconds + 0.3
    return {
        "connections": connections,
        "chunk_bytes": chunk,
        "gbytes_per_s": gb / res["seconds"],
        "receiver_cpu_s_per_gb": res["cpu_s"] / gb,
        # the sender's CPU over its whole run, per GB it sent at the measured rate
        "sender_cpu_s_per_gb": sender_cpu / (gb / res["seconds"] * total_s),
    }


def main(argv: list[str] | None = None) -> None:
    """CLI entry point; see the module docstring."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--connections", type=int, nargs="+", default=[1, 4])
    parser.add_argument("--chunk", type=int, default=1 << 20, help="payload bytes per frame")
    parser.add_argument("--seconds", type=float, default=3.0, help="measured seconds per run")
    parser.add_argument("--json", metavar="OUT", help="write the figures as JSON here")
    args = parser.parse_args(argv)
    if args.seconds <= 0 or args.chunk <= 0 or any(c <= 0 for c in args.connections):
        parser.error("--seconds, --chunk and --connections must be > 0")

    runs = [run_once(c, args.chunk, args.seconds) for c in args.connections]
    print(f"{'conns':>5} {'chunk B':>9} {'GB/s':>7} {'send cpu s/GB':>14} {'recv cpu s/GB':>14}")
    for r in runs:
        print(
            f"{r['connections']:>5} {r['chunk_bytes']:>9} {r['gbytes_per_s']:>7.3f} "
            f"{r['sender_cpu_s_per_gb']:>14.3f} {r['receiver_cpu_s_per_gb']:>14.3f}"
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"runs": runs}, f, indent=2)


if __name__ == "__main__":
    main()
