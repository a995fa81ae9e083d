"""Free TCP ports for the processes a test, benchmark or testbed run starts.

Ports are picked below the kernel's ephemeral range, so no outgoing connection made between
the pick and the server's bind can take one, and under pytest-xdist each worker picks from
its own slice, so two workers' servers never pick the same port. A process is never handed
the same port twice (a port picked is usually bound only later, so a second pick could
find it still free).
"""

from __future__ import annotations

import os
import random
import socket
from pathlib import Path


def ephemeral_port_range() -> tuple[int, int]:
    """(low, high) of the kernel's ephemeral ports (`ip_local_port_range`; Linux's
    default 32768-60999 if unreadable): outgoing connections take their local ports here."""
    try:
        low, high = map(int, Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    except (OSError, ValueError):
        return (32768, 60999)
    return (low, high)


def worker_port_slice(low: int, top: int, count: int) -> tuple[int, int]:
    """[low, top) cut to this pytest-xdist worker's own slice (PYTEST_XDIST_WORKER "gwN" of
    PYTEST_XDIST_WORKER_COUNT), so parallel workers' servers never pick the same port; the
    whole range outside xdist or when a slice would hold fewer than 2 * count ports."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    try:
        index = int(worker.removeprefix("gw"))
        workers = int(os.environ["PYTEST_XDIST_WORKER_COUNT"])
    except (KeyError, ValueError):
        return low, top
    size = (top - low) // max(workers, 1)
    if workers <= 1 or size < 2 * count or not 0 <= index < workers:
        return low, top
    return low + index * size, low + (index + 1) * size


_HANDED_OUT: set[int] = set()  # every port this process's picks returned


def free_port_block(host: str, count: int) -> int:
    """A base port such that base .. base+count-1 are free on `host` now (TCP).

    The block lies below the ephemeral range, so no outgoing connection made between
    this call and the caller's bind can take one of its ports, and it holds no port this
    process was handed before.

    Raises:
        OSError: no free block found after 200 tries.
    """
    top = min(ephemeral_port_range()[0], 65536)
    low = 10000 if top > 10000 + 2 * count else 1024
    low, top = worker_port_slice(low, top, count)
    for _ in range(200):
        base = random.randrange(low, max(low + 1, top - count))
        if not _HANDED_OUT.isdisjoint(range(base, base + count)):
            continue
        socks = []
        try:
            for port in range(base, base + count):
                s = socket.socket()
                socks.append(s)
                s.bind((host, port))
            _HANDED_OUT.update(range(base, base + count))
            return base
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise OSError(f"no block of {count} free ports on {host}")


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on `host` now, below the ephemeral range (see `free_port_block`).

    Raises:
        OSError: no free port found after 200 tries.
    """
    return free_port_block(host, 1)
