"""Every listening port under a flood of unauthenticated connections, at a 1,024 file limit.

Setup: terra-controller --no-openflow on SWAN with mutual TLS (a fresh PKI, `pki init` /
`pki issue`) and two real terra-agent processes (hk1 in HK, ba1 in BA, each with
`--metrics`), all started with RLIMIT_NOFILE = --child-nofile (1,024, systemd's default):
the benchmark lowers its own soft limit while it starts them (children inherit it), then
raises it to the hard limit for the flood.

Then, for each port of --ports (api: the coflow API; agents: the agent channel; rest: REST;
data: hk1's data port; metrics: hk1's --metrics port), one at a time:

1. flood: --connections TCP connections to the port from 127.0.0.1 (and from
   --flood-sources - 1 more loopback addresses 127.1.x.y when asked: a flood that gets
   past per-address caps, e.g. 20 addresses), opened as fast as the
   kernel takes them (non-blocking connects); one in four sends a partial TLS ClientHello
   (a partial HTTP request on the metrics port), one in four 64 random bytes, on the data
   port one in four the start of a pair-key handshake naming ba1, the rest nothing; all
   are held idle for --hold seconds;
2. during the flood, --probes times from 127.0.0.2: the time a new *authenticated* client
   takes to be served: api: TLS with a job certificate, "hello" + "list" over the coflow
   API's wire protocol; agents: the mutual-TLS handshake with an agent certificate (no
   register, which would change the controller's agent set); rest: GET /status with the
   operator certificate; data: the mutual-TLS handshake of a data connection with the
   certificate of hk1's peer agent ba1; metrics: GET /metrics;
3. the flood is closed (RST) and the same probe runs from 127.0.0.1, the flooding address,
   timed from the close.

Printed per port: connections the flood saw established (client side), how many the
server still held when probed, probe times during (the largest) and after the flood (s,
or FAIL with the reason; a probe gives up after --probe-timeout s), the peak open file
descriptors and threads of the process behind the port, and whether the listener
survived (every port is probed once more after all floods, and the processes must still
run). Then a real one-flow coflow ba1 -> hk1 (synthetic bytes) must finish, and the load
average. One controller and pair of agents take every flood in turn (--fresh: new ones
per port).

Target: every listener serves a new authenticated client within 1 s during the flood
(from another address) and within 1 s after it stops, under a 1,024 file limit.

Run: uv run python benchmarks/connection_flood.py [--connections 5000]
     [--ports api agents rest data metrics] [--hold 5] [--json OUT]
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import http.client
import json
import os
import resource
import select
import shutil
import signal
import socket
import ssl
import statistics
import struct
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from benchmarks.harness import free_port_block
from benchmarks.loopback_system import (
    OPERATOR,
    ControllerProcess,
    start_agents,
    stop_all,
)
from terra_controller.transport import read_message
from terra_security.pki import (
    CONTROLLER_HOSTNAME,
    Role,
    client_context,
    data_client_context,
)
from terra_wire.api import API_VERSION, pack_message

PORTS = ("api", "agents", "rest", "data", "metrics")
FLOOD_ADDR = "127.0.0.1"
PROBE_ADDR = "127.0.0.2"
AGENTS = [("hk1", "HK", "127.0.0.1"), ("ba1", "BA", "127.0.0.1")]  # data_addr = own address
FLOODED_AGENT = "hk1"
DATA_PEER = "ba1"  # the agent whose certificate the data-port probe presents
JOB = "bench-flood-job"
PROBE_AGENT = "bench-flood-probe"
IP_BIND_ADDRESS_NO_PORT = 24  # Linux: pick the source port at connect (4-tuple unique)
TLS_HELLO_START = b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + bytes(21)
HTTP_START = b"GET /metrics HTTP/1.1\r\nHost: flood\r\n"
KEY_START = b"\x4b\x03ba1" + bytes(8)  # pair-key tag, sender name, half a nonce


# ---- processes -------------------------------------------------------------------------------


@contextlib.contextmanager
def soft_nofile(limit: int):
    """Set this process's soft RLIMIT_NOFILE to `limit` inside the block (children started
    meanwhile inherit it), then restore it."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(limit, hard), hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def raise_nofile() -> int:
    """Raise this process's soft RLIMIT_NOFILE to its hard limit; returns the new soft limit."""
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return hard


@dataclass
class System:
    """The running controller and agents, and the address of every port under test.

    Attributes:
        ctl: the ControllerProcess. agents: terra-agent Popen objects (AGENTS order).
        addrs: {port name: (host, port)}. pids: {port name: pid of the process behind it}.
        workdir: the agents' spill/data directory.
    """

    ctl: ControllerProcess
    agents: list
    workdir: Path
    addrs: dict[str, tuple[str, int]] = field(default_factory=dict)
    pids: dict[str, int] = field(default_factory=dict)

    def stop(self) -> None:
        """Stop the agents and the controller, remove the work directory."""
        stop_all(self.agents)
        self.ctl.stop()
        shutil.rmtree(self.workdir, ignore_errors=True)


def _addr(text: str) -> tuple[str, int]:
    host, port = text.rsplit(":", 1)
    return host, int(port)


def start_system(child_nofile: int) -> System:
    """Controller + two agents with RLIMIT_NOFILE = child_nofile; waits until both registered."""
    workdir = Path(tempfile.mkdtemp(prefix="terra-bench-flood-"))
    ctl = None
    agents: list = []
    try:
        with soft_nofile(child_nofile):
            ctl = ControllerProcess("swan")
            metrics = {a: free_port_block(host, 1) for a, _, host in AGENTS}
            extra = {a: ["--metrics", f"{host}:{metrics[a]}", "--data-root", str(workdir)]
                     for a, _, host in AGENTS}  # fmt: skip
            agents = start_agents(ctl, AGENTS, workdir, extra=extra)
        system = System(ctl, agents, workdir)
        ctl.wait_agents(len(AGENTS))
    except BaseException:
        stop_all(agents)
        if ctl is not None:
            ctl.stop()
        shutil.rmtree(workdir, ignore_errors=True)
        raise
    ctl.identity(Role.JOB, JOB)
    ctl.identity(Role.AGENT, PROBE_AGENT)
    index = [a for a, _, _ in AGENTS].index(FLOODED_AGENT)
    proc = agents[index]
    args = list(proc.args)
    host = AGENTS[index][2]
    system.addrs = {
        "api": _addr(ctl.api),
        "agents": _addr(ctl.agents),
        "rest": _addr(ctl.rest.split("://", 1)[1]),
        "data": _addr(args[args.index("--data-addr") + 1]),
        "metrics": (host, metrics[FLOODED_AGENT]),
    }
    system.pids = {"api": ctl.proc.pid, "agents": ctl.proc.pid, "rest": ctl.proc.pid,
                   "data": proc.pid, "metrics": proc.pid}  # fmt: skip
    return system


# ---- probes: a new authenticated client served -------------------------------------------------


def _tcp(addr: tuple[str, int], source: str, timeout: float) -> socket.socket:
    return socket.create_connection(addr, timeout=timeout, source_address=(source, 0))


def probe_api(system: System, source: str, timeout: float) -> None:
    """hello + list over the coflow API with a job certificate."""
    context = client_context(system.ctl.pki, JOB)
    with context.wrap_socket(_tcp(system.addrs["api"], source, timeout),
                             server_hostname=CONTROLLER_HOSTNAME) as sock:  # fmt: skip
        for op in ("hello", "list"):
            sock.sendall(pack_message({"v": API_VERSION, "op": op}))
            reply = read_message(sock, frame_timeout=timeout)
            if reply is None or not reply.get("ok"):
                raise RuntimeError(f"{op}: {reply!r}")


def probe_agents(system: System, source: str, timeout: float) -> None:
    """The agent channel's mutual-TLS handshake with an agent certificate."""
    context = client_context(system.ctl.pki, PROBE_AGENT)
    sock = context.wrap_socket(_tcp(system.addrs["agents"], source, timeout),
                               server_hostname=CONTROLLER_HOSTNAME)  # fmt: skip
    sock.close()


def probe_rest(system: System, source: str, timeout: float) -> None:
    """GET /status with the operator certificate."""
    context = client_context(system.ctl.pki, OPERATOR)
    context.check_hostname = False  # dials an address; the CA is still verified
    host, port = system.addrs["rest"]
    conn = http.client.HTTPSConnection(host, port, timeout=timeout, context=context,
                                       source_address=(source, 0))  # fmt: skip
    try:
        _get(conn, "/status")
    finally:
        conn.close()


def probe_data(system: System, source: str, timeout: float) -> None:
    """A data connection's mutual-TLS handshake with the peer agent's certificate (ba1)."""
    context = data_client_context(system.ctl.pki, DATA_PEER)
    sock = context.wrap_socket(_tcp(system.addrs["data"], source, timeout))
    sock.close()


def probe_metrics(system: System, source: str, timeout: float) -> None:
    """GET /metrics (plain HTTP)."""
    host, port = system.addrs["metrics"]
    conn = http.client.HTTPConnection(host, port, timeout=timeout, source_address=(source, 0))
    try:
        _get(conn, "/metrics")
    finally:
        conn.close()


def _get(conn: http.client.HTTPConnection, path: str) -> None:
    conn.request("GET", path)
    reply = conn.getresponse()
    reply.read()
    if reply.status != 200:
        raise RuntimeError(f"GET {path}: HTTP {reply.status}")


PROBES = {"api": probe_api, "agents": probe_agents, "rest": probe_rest, "data": probe_data,
          "metrics": probe_metrics}  # fmt: skip


def timed_probe(system: System, port: str, source: str, timeout: float, since=None) -> dict:
    """Run one probe; {"s": seconds from `since` (default: the probe's start)} or
    {"error": reason, "s": seconds until it failed}."""
    start = time.monotonic() if since is None else since
    try:
        PROBES[port](system, source, timeout)
    except (OSError, ssl.SSLError, RuntimeError, http.client.HTTPException) as exc:
        return {"s": time.monotonic() - start, "error": f"{type(exc).__name__}: {exc}"[:160]}
    return {"s": time.monotonic() - start}


# ---- the flood -------------------------------------------------------------------------------


def flood_sources(n: int) -> list[str]:
    """127.0.0.1, then n - 1 more loopback addresses 127.1.x.y."""
    return [FLOOD_ADDR] + [f"127.1.{j // 250}.{j % 250 + 1}" for j in range(n - 1)]


def open_flood(addr: tuple[str, int], n: int, sources: list[str], port: str,
               settle_s: float) -> tuple[list[socket.socket], dict]:  # fmt: skip
    """Open n non-blocking connections to addr (the port named `port`), send each one's
    opening bytes once connected.

    Returns (the sockets, {"opened": connected within settle_s, "pending": still connecting,
    "refused": failed at once or while connecting, "open_s": seconds to issue all connects}).
    """
    start = time.monotonic()
    socks: list[socket.socket] = []
    refused = 0
    for i in range(n):
        s = socket.socket()
        s.setblocking(False)
        s.setsockopt(socket.SOL_IP, IP_BIND_ADDRESS_NO_PORT, 1)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # close: RST
        try:
            s.bind((sources[i % len(sources)], 0))
            err = s.connect_ex(addr)
        except OSError as exc:
            err = exc.errno
        if err not in (0, errno.EINPROGRESS):
            s.close()
            refused += 1
            continue
        socks.append(s)
    issued = time.monotonic() - start
    pending = {s.fileno(): (i, s) for i, s in enumerate(socks)}
    poller = select.poll()
    for fd in pending:
        poller.register(fd, select.POLLOUT)
    opened = 0
    end = time.monotonic() + settle_s
    while pending and time.monotonic() < end:
        for fd, _ in poller.poll(100):
            i, s = pending.pop(fd)
            poller.unregister(fd)
            if s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR):
                refused += 1
                continue
            opened += 1
            _send_opening(s, i, port)
    return socks, {"opened": opened, "pending": len(pending), "refused": refused,
                   "open_s": issued}  # fmt: skip


def _send_opening(s: socket.socket, i: int, port: str) -> None:
    """One in four: a partial ClientHello (partial HTTP request); one in four: garbage; on
    the data port one in four: a partial pair-key opening."""
    kind = i % 4
    data = (HTTP_START if port == "metrics" else TLS_HELLO_START) if kind == 0 else b""
    if kind == 1:
        data = os.urandom(64)
    if kind == 2 and port == "data":
        data = KEY_START
    if data:
        with contextlib.suppress(OSError):
            s.send(data)


def still_open(socks: list[socket.socket]) -> int:
    """How many sockets the server has not closed (no EOF, no reset)."""
    alive = 0
    for s in socks:
        try:
            alive += s.recv(1, socket.MSG_PEEK) != b""
        except BlockingIOError:
            alive += 1
        except OSError:
            pass
    return alive


def close_all(socks: list[socket.socket]) -> None:
    """Close every socket (SO_LINGER 0: a reset, no TIME_WAIT here)."""
    for s in socks:
        s.close()


class ProcessSampler:
    """Samples a process's open descriptors and threads every 50 ms in a thread; peaks kept."""

    def __init__(self, pid: int) -> None:
        self.pid, self.fds, self.threads = pid, 0, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            self.sample()
            self._stop.wait(0.05)

    def sample(self) -> None:
        """Read the counts now (a gone process counts 0)."""
        with contextlib.suppress(OSError, ValueError):
            self.fds = max(self.fds, len(os.listdir(f"/proc/{self.pid}/fd")))
            for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
                if line.startswith("Threads:"):
                    self.threads = max(self.threads, int(line.split()[1]))

    def stop(self) -> None:
        """Stop sampling."""
        self._stop.set()
        self._thread.join()


def flood_port(system: System, port: str, args) -> dict:
    """Flood one port, probe during and after; returns the figures of one table row."""
    sampler = ProcessSampler(system.pids[port])
    socks: list[socket.socket] = []
    row: dict = {"port": port, "addr": "{}:{}".format(*system.addrs[port])}
    try:
        start = time.monotonic()
        socks, row["flood"] = open_flood(system.addrs[port], args.connections,
                                         flood_sources(args.flood_sources),
                                         port, args.settle)  # fmt: skip
        row["held_at_probe"] = still_open(socks)
        row["during"] = []
        for k in range(args.probes):
            row["during"].append(timed_probe(system, port, PROBE_ADDR, args.probe_timeout))
            if k + 1 < args.probes:
                time.sleep(1.0)
        time.sleep(max(0.0, start + args.hold - time.monotonic()))
        row["held_at_end"] = still_open(socks)
    finally:
        closed = time.monotonic()
        close_all(socks)
    row["after"] = timed_probe(system, port, FLOOD_ADDR, args.probe_timeout, since=closed)
    time.sleep(0.5)
    sampler.stop()
    row["fds_peak"], row["threads_peak"] = sampler.fds, sampler.threads
    return row


def final_coflow(system: System, timeout: float) -> dict:
    """A real one-flow coflow ba1 -> hk1 (4 MB, synthetic bytes): its final state or error."""
    start = time.monotonic()
    try:
        with system.ctl.client(timeout=timeout, name=JOB) as client:
            cid = client.submit_coflow([{"id": "f", "src": "ba1", "dst": FLOODED_AGENT,
                                         "bytes": 4_000_000}])  # fmt: skip
            status = client.wait(cid, timeout=timeout)
        return {"state": status["state"], "reason": status.get("reason"),
                "s": time.monotonic() - start}  # fmt: skip
    except Exception as exc:  # the figure is what happened
        return {"state": "error", "reason": f"{type(exc).__name__}: {exc}"[:200],
                "s": time.monotonic() - start}  # fmt: skip


# ---- report ------------------------------------------------------------------------------------


def _fmt(probe: dict) -> str:
    return f"FAIL({probe['s']:.1f}s)" if "error" in probe else f"{probe['s']:.3f}"


def print_table(rows: list[dict], survived: dict[str, dict], coflows: list[dict], load) -> None:
    """The per-port table, the failure reasons, the coflow after each system's floods, the
    load."""
    print(f"{'port':<8} {'address':<16} {'conn':>5} {'held':>5} {'during s':>12} "
          f"{'after s':>12} {'fds peak':>8} {'threads':>7} {'survived':>8}")  # fmt: skip
    for r in rows:
        during = max(r["during"], key=lambda p: ("error" in p, p["s"]))
        ok = "yes" if "error" not in survived[r["port"]] else "NO"
        print(f"{r['port']:<8} {r['addr']:<16} {r['flood']['opened']:>5} "
              f"{r['held_at_probe']:>5} {_fmt(during):>12} {_fmt(r['after']):>12} "
              f"{r['fds_peak']:>8} {r['threads_peak']:>7} {ok:>8}")  # fmt: skip
    for r in rows:
        for what, p in [*(("during", p) for p in r["during"]), ("after", r["after"]),
                        ("final", survived[r["port"]])]:  # fmt: skip
            if "error" in p:
                print(f"  {r['port']} {what}: {p['error']}")
    print(
        "conn: connections the client saw established; held: not closed by the server when probed"
    )
    for coflow in coflows:
        print(
            f"coflow ba1 -> hk1 after the floods of {', '.join(coflow['after'])}: "
            f"{coflow['state']} in {coflow['s']:.1f} s"
            + (f" ({coflow['reason']})" if coflow.get("reason") else "")
        )
    print("load average (1, 5, 15 min): " + ", ".join(f"{x:.2f}" for x in load))


def survives(system: System, port: str, timeout: float) -> dict:
    """The final probe of `port` from the flooding address, and its process still running."""
    probe = timed_probe(system, port, FLOOD_ADDR, timeout)
    proc = next(p for p in [system.ctl.proc, *system.agents] if p.pid == system.pids[port])
    if proc.poll() is not None:
        return {"s": 0.0, "error": f"process exited ({proc.returncode})"}
    return probe


def main() -> None:
    """Command-line entry point."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--connections", type=int, default=5000, help="flood size per port")
    p.add_argument("--ports", nargs="+", choices=PORTS, default=list(PORTS))
    p.add_argument(
        "--flood-sources",
        type=int,
        default=1,
        help="loopback addresses the flood comes from (1: 127.0.0.1 only)",
    )
    p.add_argument("--hold", type=float, default=5.0, help="seconds the flood is held")
    p.add_argument(
        "--settle",
        type=float,
        default=3.0,
        help="seconds to wait for the flood's connects to complete",
    )
    p.add_argument("--probes", type=int, default=2, help="probes during each flood")
    p.add_argument("--probe-timeout", type=float, default=10.0)
    p.add_argument(
        "--child-nofile", type=int, default=1024, help="RLIMIT_NOFILE of the controller and agents"
    )
    p.add_argument(
        "--fresh",
        action="store_true",
        help="a new controller and agents for every port (else one system for all)",
    )
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # run the clean-up below
    nofile = raise_nofile()
    if nofile < args.connections + 256:
        p.error(f"--connections {args.connections} needs an open-file limit above "
                f"{args.connections + 256} (hard limit here: {nofile})")  # fmt: skip
    load_before = os.getloadavg()
    rows, survived, coflows = [], {}, []
    groups = [[port] for port in args.ports] if args.fresh else [args.ports]
    for ports in groups:
        system = start_system(args.child_nofile)
        try:
            for port in ports:
                rows.append(flood_port(system, port, args))
                print(f"{port}: during {[_fmt(x) for x in rows[-1]['during']]}, "
                      f"after {_fmt(rows[-1]['after'])}", flush=True)  # fmt: skip
            time.sleep(1.0)
            for port in ports:
                survived[port] = survives(system, port, args.probe_timeout)
            coflows.append({**final_coflow(system, timeout=30.0), "after": ports})
        finally:
            system.stop()
    load = os.getloadavg()
    print(f"\n{args.connections} connections per port from {args.flood_sources} address(es), "
          f"held {args.hold:g} s; controller and agents at RLIMIT_NOFILE {args.child_nofile}; "
          f"target: served within 1 s during and after")  # fmt: skip
    print_table(rows, survived, coflows, load)
    if args.json:
        during = [p["s"] for r in rows for p in r["during"] if "error" not in p]
        args.json.write_text(json.dumps({
            "connections": args.connections, "flood_sources": args.flood_sources,
            "child_nofile": args.child_nofile, "hold_s": args.hold, "rows": rows,
            "survived": survived, "coflows": coflows, "load_before": load_before,
            "load_after": load,
            "during_median_s": statistics.median(during) if during else None,
        }, indent=2))  # fmt: skip


if __name__ == "__main__":
    main()
