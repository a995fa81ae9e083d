"""A new client's latency while idle and slowloris connections hold the coflow API.

Setup: terra-controller --no-openflow on SWAN with mutual TLS (fresh PKI). Then
--idle TCP connections that send nothing and --slow connections that send one
byte of a TLS record every second (each from 127.0.0.2-127.0.0.9, so the
per-address cap of 256 is not what protects the server), all opened before the
client. Then, --repeats times, a new job client connects (TLS handshake),
submits a one-flow coflow and gets its reply; the script prints the median and
maximum of connect + submit (seconds). Target: answered within 1 s
with 1000 such connections open.

Run: uv run python benchmarks/idle_connections.py [--idle 500] [--slow 500] [--repeats 10]
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import threading
import time

from benchmarks.api_throughput import fake_agents
from benchmarks.loopback_system import ControllerProcess
from terra_security.pki import Role


def open_connections(addr: tuple[str, int], n: int, first_host: int) -> list[socket.socket]:
    """n TCP connections to addr from 127.0.0.<first_host..first_host+3>."""
    out = []
    for i in range(n):
        s = socket.socket()
        s.bind((f"127.0.0.{first_host + i % 4}", 0))
        s.connect(addr)
        out.append(s)
    return out


def trickle(socks: list[socket.socket], stop: threading.Event) -> None:
    """Send one byte of a TLS handshake record on every socket each second."""
    record = b"\x16\x03\x01\x02\x00" + b"\x01" * 512
    i = 0
    while not stop.wait(1.0):
        for s in socks:
            try:
                s.send(record[i % len(record) : i % len(record) + 1])
            except OSError:
                pass
        i += 1


def main() -> None:
    """Command-line entry point."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--idle", type=int, default=500)
    p.add_argument("--slow", type=int, default=500)
    p.add_argument("--repeats", type=int, default=10)
    args = p.parse_args()
    ctl = ControllerProcess("swan")
    agents = fake_agents(ctl, complete=True)
    stop = threading.Event()
    held: list[socket.socket] = []
    try:
        held += open_connections(ctl.api_addr, args.idle, 2)
        slow = open_connections(ctl.api_addr, args.slow, 6)
        held += slow
        threading.Thread(target=trickle, args=(slow, stop), daemon=True).start()
        time.sleep(2.0)  # the slow ones have started their handshakes
        job = ctl.identity(Role.JOB, "bench-job")
        times = []
        for _ in range(args.repeats):
            start = time.monotonic()
            with ctl.client(timeout=10, name=job) as client:
                client.submit_coflow([{"id": "f", "src": "hk", "dst": "ba", "bytes": 1_000_000}])
            times.append(time.monotonic() - start)
            time.sleep(0.2)
        alive = sum(1 for s in held if _open(s))
        load = os.getloadavg()[0]
        print(f"{args.idle} idle + {args.slow} slowloris connections ({alive} still open at "
              f"the end): new client connect+submit median {statistics.median(times):.3f} s, "
              f"max {max(times):.3f} s (target <= 1 s); load average {load:.2f}")  # fmt: skip
    finally:
        stop.set()
        for s in held:
            s.close()
        for a in agents:
            a.close()
        ctl.stop()


def _open(s: socket.socket) -> bool:
    s.setblocking(False)
    try:
        return s.recv(1, socket.MSG_PEEK) != b""
    except BlockingIOError:
        return True
    except OSError:
        return False


if __name__ == "__main__":
    main()
