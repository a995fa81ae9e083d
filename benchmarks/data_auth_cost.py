"""CPU per data-connection authentication: plain TCP vs pair key vs mutual TLS.

Both ends run in this process (trio, loopback): a receiver serving terra_security.data_auth.accept
and a sender connecting N times, authenticating (none / key_authenticate_sender / authenticate
with the TLS client context, then unwrap), reading one byte and closing. The figure is the
process CPU time per connection in ms, both ends together, TCP set-up included: what an agent
pair spends when a revived tunnel reconnects (docs/results.md 5.3).

Run: uv run python benchmarks/data_auth_cost.py [--connections 300] [--repeats 3]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import trio

from terra_security.data_auth import accept, authenticate, key_authenticate_sender
from terra_security.data_keys import DataKeys
from terra_security.pki import Role, data_client_context, data_server_context, init_ca, issue

MODES = ("plain", "key", "tls")


async def cpu_per_connection(mode: str, n: int, pki: Path, key: bytes) -> float:
    """CPU ms per connection (both ends) of `n` connections authenticated by `mode`."""
    server_ctx, client_ctx = data_server_context(pki, "b"), data_client_context(pki, "a")

    async def handler(stream: trio.SocketStream) -> None:
        async with stream:
            if mode != "plain":
                await accept(stream, server_ctx, "b", {"a": key}.get)
            await stream.send_all(b"x")

    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(trio.serve_tcp, handler, 0)
        port = listeners[0].socket.getsockname()[1]
        start = time.process_time()
        for _ in range(n):
            stream = await trio.open_tcp_stream("127.0.0.1", port)
            if mode == "tls":
                await authenticate(stream, client_ctx, server_side=False, expected_peer="b")
            elif mode == "key":
                await key_authenticate_sender(stream, "a", "b", key)
            await stream.receive_some(16)
            await stream.aclose()
        nursery.cancel_scope.cancel()
    return (time.process_time() - start) / n * 1e3


def main(argv: list[str] | None = None) -> int:
    """Print the median CPU ms per connection of each mode over --repeats runs."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--connections", type=int, default=300)
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args(argv)
    pki = Path(tempfile.mkdtemp(prefix="terra-auth-cost-"))
    try:
        init_ca(pki)
        for name in ("a", "b"):
            issue(pki, Role.AGENT, name)
        key = DataKeys().pair_key("a", "b")
        runs: dict[str, list[float]] = {m: [] for m in MODES}
        for _ in range(args.repeats):  # interleaved: the machine's load hits every mode alike
            for mode in MODES:
                runs[mode].append(trio.run(cpu_per_connection, mode, args.connections, pki, key))
    finally:
        shutil.rmtree(pki, ignore_errors=True)
    for mode in MODES:
        print(f"{mode:5s}: {statistics.median(runs[mode]):.3f} ms CPU per connection "
              f"(runs: {', '.join(f'{v:.3f}' for v in runs[mode])})")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
