"""Leaf MACs inline vs in a trio worker thread (is the hand-off worth it?).

For chunks of 64 KiB, 1 MiB and 4 MiB: CPU and wall time per chunk of
terra_security.integrity.FlowKeys.leaf_macs called inline, the same through
trio.to_thread.run_sync, and an empty hand-off (trio.to_thread.run_sync(int)).

    uv run python benchmarks/mac_handoff.py
"""

from __future__ import annotations

import os
import time

import trio

from terra_security.integrity import FlowKeys, new_flow_key


async def measure(keys: FlowKeys, size: int) -> dict:
    """Per-chunk microseconds: inline CPU/wall, threaded CPU/wall, empty hand-off CPU."""
    buf = os.urandom(size)
    n = max(20, (256 << 20) // size)
    c0, w0 = time.process_time(), time.perf_counter()
    for _ in range(n):
        keys.leaf_macs(0, buf)
    inline = ((time.process_time() - c0) / n, (time.perf_counter() - w0) / n)
    c0, w0 = time.process_time(), time.perf_counter()
    for _ in range(n):
        await trio.to_thread.run_sync(keys.leaf_macs, 0, buf)
    thread = ((time.process_time() - c0) / n, (time.perf_counter() - w0) / n)
    c0 = time.process_time()
    for _ in range(n):
        await trio.to_thread.run_sync(int)
    empty = (time.process_time() - c0) / n
    return {"inline": inline, "thread": thread, "handoff_cpu": empty}


async def main() -> None:
    """Print one line per chunk size, and the load average."""
    keys = FlowKeys(new_flow_key())
    for size in (64 << 10, 1 << 20, 4 << 20):
        r = await measure(keys, size)
        print(
            f"{size >> 10} KiB: inline {r['inline'][0] * 1e6:.0f} us CPU "
            f"{r['inline'][1] * 1e6:.0f} us wall | thread {r['thread'][0] * 1e6:.0f} us CPU "
            f"{r['thread'][1] * 1e6:.0f} us wall | empty hand-off "
            f"{r['handoff_cpu'] * 1e6:.0f} us CPU"
        )
    print(f"1-min load average {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    trio.run(main)
