"""What the controller's runtime would pay for one owner of its state, against its locks.

The controller's state is guarded by locks and touched by the threads of its
connections (docs/runtime.md). The alternative, one event loop owning the state, costs
either a hand-off per access (when the connections stay threads) or a move of the
connections onto the loop. This script prints both sides, medians of `--repeats` runs:

1. one access to the state: an uncontended `threading.RLock` acquire and release, a
   hand-off of a call to an owner thread and back (a queue and a lock), and a hand-off
   into a trio loop running in a thread (`trio.from_thread.run_sync`), in microseconds;
2. request/reply round trips per second over TLS on loopback (200-byte requests with
   the API's u32-length framing, one client, the server in a process of its own):
   a blocking thread-per-connection server (today's API server), a trio server
   (`trio.SSLListener`) and an asyncio server.

Run: python -m benchmarks.runtime_handoff [--calls 5000] [--requests 3000] [--repeats 3]
"""

from __future__ import annotations

import _thread
import argparse
import asyncio
import os
import queue
import socket
import ssl
import statistics
import struct
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import trio

LEN = struct.Struct(">I")
SERVERS = ("thread", "trio", "asyncio")


# ---- 1. one access ----------------------------------------------------------------------------


def lock_us(calls: int) -> float:
    """Microseconds per uncontended RLock acquire + release."""
    lock = threading.RLock()
    start = time.perf_counter()
    for _ in range(calls):
        with lock:
            pass
    return (time.perf_counter() - start) / calls * 1e6


def owner_thread_us(calls: int) -> float:
    """Microseconds per call handed to an owner thread and answered."""
    work: queue.SimpleQueue = queue.SimpleQueue()

    def owner() -> None:
        while (item := work.get()) is not None:
            fn, done, box = item
            box.append(fn())
            done.release()

    thread = threading.Thread(target=owner, daemon=True)
    thread.start()

    def call(fn):
        done = _thread.allocate_lock()
        done.acquire()
        box: list = []
        work.put((fn, done, box))
        done.acquire()
        return box[0]

    start = time.perf_counter()
    for _ in range(calls):
        call(lambda: None)
    elapsed = time.perf_counter() - start
    work.put(None)
    thread.join()
    return elapsed / calls * 1e6


def trio_loop_us(calls: int) -> float:
    """Microseconds per `trio.from_thread.run_sync` into a trio loop in another thread."""
    ready, stop = threading.Event(), threading.Event()
    token: list = []

    async def main() -> None:
        token.append(trio.lowlevel.current_trio_token())
        ready.set()
        while not stop.is_set():
            await trio.sleep(0.05)

    thread = threading.Thread(target=trio.run, args=(main,), daemon=True)
    thread.start()
    ready.wait()
    start = time.perf_counter()
    for _ in range(calls):
        trio.from_thread.run_sync(lambda: None, trio_token=token[0])
    elapsed = time.perf_counter() - start
    stop.set()
    thread.join()
    return elapsed / calls * 1e6


# ---- 2. TLS request/reply servers -------------------------------------------------------------


def _server_context(cert: str, key: str) -> ssl.SSLContext:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(cert, key)
    return ctx


def _recv_exact(sock, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        part = sock.recv(n - len(buf))
        if not part:
            raise EOFError
        buf += part
    return bytes(buf)


def serve_thread(port: int, ctx: ssl.SSLContext) -> None:
    """A thread per connection, blocking TLS sockets; each reply under a lock."""
    listener = socket.create_server(("127.0.0.1", port))
    lock = threading.RLock()

    def handle(conn: socket.socket) -> None:
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        conn = ctx.wrap_socket(conn, server_side=True)
        try:
            while True:
                (n,) = LEN.unpack(_recv_exact(conn, 4))
                body = _recv_exact(conn, n)
                with lock:
                    out = body[::-1]
                conn.sendall(LEN.pack(len(out)) + out)
        except (EOFError, OSError):
            conn.close()

    while True:
        conn, _ = listener.accept()
        threading.Thread(target=handle, args=(conn,), daemon=True).start()


async def serve_trio(port: int, ctx: ssl.SSLContext) -> None:
    """trio.SSLListener over trio's TCP listeners, a task per connection."""

    async def handle(stream: trio.SSLStream) -> None:
        buf = bytearray()
        try:
            while True:
                while len(buf) < 4 or len(buf) < 4 + LEN.unpack(buf[:4])[0]:
                    data = await stream.receive_some(65536)
                    if not data:
                        return
                    buf += data
                (n,) = LEN.unpack(buf[:4])
                out = bytes(buf[4 : 4 + n])[::-1]
                del buf[: 4 + n]
                await stream.send_all(LEN.pack(len(out)) + out)
        except trio.BrokenResourceError:
            return

    listeners = await trio.open_tcp_listeners(port, host="127.0.0.1")
    await trio.serve_listeners(handle, [trio.SSLListener(x, ctx) for x in listeners])


def serve_asyncio(port: int, ctx: ssl.SSLContext) -> None:
    """asyncio.start_server with TLS, a coroutine per connection."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                (n,) = LEN.unpack(await reader.readexactly(4))
                out = (await reader.readexactly(n))[::-1]
                writer.write(LEN.pack(len(out)) + out)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()

    async def main() -> None:
        server = await asyncio.start_server(handle, "127.0.0.1", port, ssl=ctx)
        await server.serve_forever()

    asyncio.run(main())


def run_server(kind: str, port: int, cert: str, key: str) -> None:
    """Entry point of the server process (`--serve KIND PORT CERT KEY`)."""
    ctx = _server_context(cert, key)
    if kind == "thread":
        serve_thread(port, ctx)
    elif kind == "trio":
        trio.run(serve_trio, port, ctx)
    else:
        serve_asyncio(port, ctx)


def round_trips_per_s(port: int, cert: str, requests: int) -> float:
    """One client's request/reply round trips per second against the server on `port`."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.load_verify_locations(cert)
    deadline = time.monotonic() + 20.0
    while True:
        try:
            raw = socket.create_connection(("127.0.0.1", port), timeout=10)
            break
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)
    raw.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    with ctx.wrap_socket(raw, server_hostname="localhost") as sock:
        message = LEN.pack(200) + b"x" * 200
        for i in range(requests + 200):  # the first 200 warm up
            if i == 200:
                start = time.perf_counter()
            sock.sendall(message)
            (n,) = LEN.unpack(_recv_exact(sock, 4))
            _recv_exact(sock, n)
        return requests / (time.perf_counter() - start)


def tls_figures(requests: int, repeats: int) -> dict[str, float]:
    """{server kind: median round trips/s}, the kinds interleaved repeat by repeat."""
    with tempfile.TemporaryDirectory() as tmp:
        cert, key = str(Path(tmp, "cert.pem")), str(Path(tmp, "key.pem"))
        subprocess.run(
            ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt",
             "ec_paramgen_curve:prime256v1", "-keyout", key, "-out", cert, "-days", "1",
             "-nodes", "-subj", "/CN=localhost"],
            check=True, capture_output=True,
        )  # fmt: skip
        got: dict[str, list[float]] = {k: [] for k in SERVERS}
        for _ in range(repeats):
            for kind in SERVERS:
                with socket.socket() as probe:
                    probe.bind(("127.0.0.1", 0))
                    port = probe.getsockname()[1]
                args = [sys.executable, "-m", "benchmarks.runtime_handoff", "--serve", kind]
                server = subprocess.Popen([*args, str(port), cert, key])
                try:
                    got[kind].append(round_trips_per_s(port, cert, requests))
                finally:
                    server.kill()
                    server.wait()
        return {k: statistics.median(v) for k, v in got.items()}


def main(argv: list[str] | None = None) -> int:
    """Print the figures (module docstring)."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--calls", type=int, default=5000, help="accesses timed per repeat")
    p.add_argument("--requests", type=int, default=3000, help="TLS round trips per repeat")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--serve", nargs=4, metavar=("KIND", "PORT", "CERT", "KEY"),
                   help=argparse.SUPPRESS)  # fmt: skip
    args = p.parse_args(argv)
    if args.serve:
        kind, port, cert, key = args.serve
        run_server(kind, int(port), cert, key)
        return 0
    cpu = time.process_time()
    access = {"RLock": [], "owner thread": [], "trio loop": []}
    for _ in range(args.repeats):
        access["RLock"].append(lock_us(args.calls))
        access["owner thread"].append(owner_thread_us(args.calls))
        access["trio loop"].append(trio_loop_us(args.calls))
    for name, values in access.items():
        print(f"one access, {name}: {statistics.median(values):.2f} us")
    for kind, rate in tls_figures(args.requests, args.repeats).items():
        print(f"TLS request/reply, {kind} server: {rate:,.0f} round trips/s")
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"load average {load}; this process {time.process_time() - cpu:.1f} CPU s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
