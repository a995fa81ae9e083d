"""The per-flow TCP baseline of the testbed: plain TCP, one connection per flow.

The same coflows as the Terra run (same flows, same bytes, same arrival times),
moved without any Terra scheduling: each flow is one TCP connection from its
source host to a server on its destination host, port `BASELINE_PORT`. That port
is not a tunnel port (tunnels use base port 20000 + path index), so the
switches' default rule for "other IPv4 between agents" carries it: the DC pair's
first working tunnel, i.e. path index 0 of `all_pairs_paths` = the shortest path
(terra_controller/tunnels.py, docs/design.md section 5). TCP's own congestion control
shares the links; there are no rate limits.

A flow's bytes are the Terra agents' synthetic bytes (terra_agent.sources
.SyntheticSource with key "coflow/flow"), so the receiver's BLAKE2b digest of
what it received can be checked against the expected one.

One process per Mininet host runs `node` (module CLI, below): it serves
incoming flows and sends its own at their arrival times:

    python -m mininet_scenarios.tcp_baseline node --listen IP:PORT --schedule FILE
        --start-file FILE --out FILE

schedule FILE: JSON list of {"coflow", "flow", "dst_ip", "bytes", "arrival_s"} (flows this host
sends). Once listening, the node creates OUT.ready and waits for start FILE to appear; it
holds the wall-clock time T of t = 0 (arrivals are relative to T). Every node is listening
before anyone sends, however slowly the nodes start. out FILE: one JSON line per flow
received: {"coflow", "flow", "bytes", "received", "digest", "end_wall"} (wall-clock seconds).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import socket
import sys
import threading
import time
from pathlib import Path

from terra_agent.sources import SYNTHETIC_PERIOD, SyntheticSource, flow_key

BASELINE_PORT = 5001
CHUNK = 256 * 1024  # bytes per send / recv call
HEADER_MAX = 4096


def send_flow(dst_ip: str, port: int, coflow: str, flow: str, size: int) -> None:
    """Send one flow's synthetic bytes over a fresh TCP connection.

    Wire format: one JSON line {"coflow", "flow", "bytes"} then exactly `size` bytes.

    Args:
        dst_ip, port: the receiving node. coflow, flow: ids (the digest key is "coflow/flow").
        size: bytes, > 0.

    Raises:
        OSError: connection refused/reset (the caller logs it; the flow then counts as lost).
    """
    source = SyntheticSource(flow_key(coflow, flow), size)
    header = json.dumps({"coflow": coflow, "flow": flow, "bytes": size}).encode() + b"\n"
    with socket.create_connection((dst_ip, port), timeout=30) as sock:
        sock.settimeout(None)
        sock.sendall(header)
        offset = 0
        while offset < size:
            n = min(CHUNK, size - offset, SYNTHETIC_PERIOD)
            sock.sendall(source.read(offset, n))
            offset += n
        sock.shutdown(socket.SHUT_WR)
        sock.recv(1)  # wait for the receiver to close: every byte has been read
    source.close()


def receive_flow(conn: socket.socket, out, lock: threading.Lock) -> None:
    """Read one flow (header line + bytes) from `conn`, hash it, append a JSON line to `out`.

    A malformed header closes the connection and writes nothing.
    """
    with conn:
        buf = b""
        while b"\n" not in buf:
            data = conn.recv(HEADER_MAX)
            if not data or len(buf) > HEADER_MAX:
                return
            buf += data
        line, rest = buf.split(b"\n", 1)
        try:
            header = json.loads(line)
            size = int(header["bytes"])
        except (ValueError, KeyError, TypeError):
            return
        h = hashlib.blake2b()
        h.update(rest)
        received = len(rest)
        block = bytearray(CHUNK)
        view = memoryview(block)
        while True:
            n = conn.recv_into(view)
            if n == 0:
                break
            h.update(view[:n])
            received += n
        record = {
            "coflow": header.get("coflow"),
            "flow": header.get("flow"),
            "bytes": size,
            "received": received,
            "digest": h.hexdigest(),
            "end_wall": time.time(),
        }
    with lock:
        out.write(json.dumps(record) + "\n")
        out.flush()


def serve(listen: tuple[str, int], out_path: Path) -> threading.Thread:
    """Accept flows on `listen` in a daemon thread (one thread per connection).

    Returns:
        The accept thread. Raises OSError when the address cannot be bound.
    """
    server = socket.create_server(listen, backlog=128)
    out = open(out_path, "a")  # noqa: SIM115 (kept open for the life of the node)
    lock = threading.Lock()

    def accept_loop() -> None:
        while True:
            conn, _ = server.accept()
            threading.Thread(target=receive_flow, args=(conn, out, lock), daemon=True).start()

    thread = threading.Thread(target=accept_loop, daemon=True)
    thread.start()
    return thread


def run_schedule(schedule: list[dict], start_wall: float, port: int) -> None:
    """Start every flow of `schedule` at start_wall + arrival_s, each in its own thread.

    Failures (refused, reset) are printed to stderr; the flow then never completes.
    """

    def one(item: dict) -> None:
        try:
            send_flow(item["dst_ip"], port, str(item["coflow"]), str(item["flow"]), item["bytes"])
        except OSError as exc:
            print(f"tcp_baseline: flow {item['coflow']}/{item['flow']}: {exc}", file=sys.stderr)

    for item in sorted(schedule, key=lambda x: x["arrival_s"]):
        delay = start_wall + item["arrival_s"] - time.time()
        if delay > 0:
            time.sleep(delay)
        threading.Thread(target=one, args=(item,), daemon=True).start()


def wait_start(path: Path, poll_s: float = 0.01) -> float:
    """Wait until `path` exists and holds a wall-clock time; return it (seconds)."""
    while True:
        try:
            return float(path.read_text())
        except (OSError, ValueError):  # not there yet, or half written
            time.sleep(poll_s)


def main(argv: list[str] | None = None) -> int:
    """`python -m mininet_scenarios.tcp_baseline node ...` (module docstring); runs until killed."""
    p = argparse.ArgumentParser(prog="tcp_baseline", description="per-flow TCP baseline node")
    p.add_argument("mode", choices=["node"])
    p.add_argument("--listen", required=True, help="IP:PORT to receive flows on")
    p.add_argument("--schedule", required=True, type=Path, help="JSON list of flows to send")
    p.add_argument("--start-file", required=True, type=Path, help="file holding t=0 (wall)")
    p.add_argument("--out", required=True, type=Path, help="JSON lines of received flows")
    args = p.parse_args(argv)
    host, _, port = args.listen.rpartition(":")
    try:
        serve((host, int(port)), args.out)
        schedule = json.loads(args.schedule.read_text())
    except (OSError, ValueError) as exc:
        print(f"tcp_baseline: {exc}", file=sys.stderr)
        return 1
    Path(f"{args.out}.ready").touch()
    try:
        start_wall = wait_start(args.start_file)
        run_schedule(schedule, start_wall, int(port))
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        return 0


if __name__ == "__main__":
    sys.exit(main())
