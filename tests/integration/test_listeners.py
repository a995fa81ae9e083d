"""Attacks and faults on the controller's listening ports: descriptor floods past the open-file
limit, idle and trickling connections, certificate-less REST clients, ports in use.

Real servers (in-process or a `terra-controller` subprocess) on loopback with mutual TLS;
attackers are plain TCP or certificate-less TLS peers from other loopback addresses
(127.0.0.2 ...), so a client from 127.0.0.1 counts as another address.
"""

from __future__ import annotations

import contextlib
import json
import logging
import resource
import socket
import ssl
import subprocess
import sys
import textwrap
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from test_api import Server, flow
from test_rest import context, get, serve
from tls_helpers import tls_socket

from benchmarks.harness import free_port
from terra_controller import rest
from terra_controller.client import TerraClient

REPO = Path(__file__).resolve().parents[2]
TOPOLOGY = {
    "name": "tri",
    "dcs": ["A", "B", "C"],
    "default_capacity_gbps": 1,
    "links": [{"a": "A", "b": "B"}, {"a": "B", "b": "C"}, {"a": "A", "b": "C"}],
}


def flood(port: int, count: int, source: str = "127.0.0.2") -> list[socket.socket]:
    """`count` TCP connections to 127.0.0.1:port from `source` that never send a byte
    (non-blocking connects: ones the kernel's queue cannot take yet do not block the test)."""
    out = []
    for _ in range(count):
        s = socket.socket()
        s.setblocking(False)
        s.bind((source, 0))
        s.connect_ex(("127.0.0.1", port))
        out.append(s)
    return out


def close_all(socks) -> None:
    for s in socks:
        s.close()


def start_controller(tmp_path: Path, args: list[str], nofile: int | None = None):
    """A `terra-controller --no-openflow` subprocess on free ports (soft open-file limit
    `nofile`); returns (process, {"api": port, "agents": port, "rest": port})."""
    topo = tmp_path / "tri.json"
    topo.write_text(json.dumps(TOPOLOGY))
    ports = {"api": free_port(), "agents": free_port(), "rest": free_port()}

    def limit() -> None:
        if nofile is not None:
            _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
            resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, hard))

    proc = subprocess.Popen(
        [sys.executable, "-m", "terra_controller.cli", "--topology", str(topo), "--no-openflow",
         "--api", f"127.0.0.1:{ports['api']}", "--agents", f"127.0.0.1:{ports['agents']}",
         "--rest", f"127.0.0.1:{ports['rest']}", "--log-level", "INFO", *args],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=limit, cwd=REPO,
    )  # fmt: skip
    return proc, ports


def stop(proc: subprocess.Popen) -> str:
    """Terminate `proc` and return its stderr."""
    if proc.poll() is None:
        proc.terminate()
    try:
        _, err = proc.communicate(timeout=15)
    except subprocess.TimeoutExpired:
        proc.kill()
        _, err = proc.communicate()
    return err


def timed(func):
    """(func()'s result, seconds it took)."""
    start = time.monotonic()
    result = func()
    return result, time.monotonic() - start


# ---- running out of descriptors --------------------------------------------------------------

ECHO_SERVER = textwrap.dedent(
    """
    import resource, socket, sys, threading
    from terra_controller.transport import ServerSecurity, accept_loop

    resource.setrlimit(resource.RLIMIT_NOFILE, (64, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
    listener = socket.create_server(("127.0.0.1", 0), backlog=1024)

    def spawn(func, *args):
        thread = threading.Thread(target=func, args=args, daemon=True)
        thread.start()
        return thread

    def hello(sock, addr, identity):  # say hello, hold until the client closes
        sock.sendall(b"hello")
        while sock.recv(100):
            pass

    print(listener.getsockname()[1], flush=True)
    accept_loop(listener, hello, spawn, ServerSecurity(None, max_connections=10**6,
                                                       max_per_address=10**6))
    print("accept loop returned", file=sys.stderr, flush=True)
    """
)


def test_the_accept_loop_survives_running_out_of_descriptors(tmp_path):
    """With caps above the open-file limit (64), a flood makes accept() fail with EMFILE: the
    loop backs off, logs once per interval and, once the flood is gone, serves again."""
    proc = subprocess.Popen(
        [sys.executable, "-c", ECHO_SERVER], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True, cwd=REPO,
    )  # fmt: skip
    socks = []
    try:
        port = int(proc.stdout.readline())
        socks = flood(port, 300)
        time.sleep(2)  # the server accepts until EMFILE, then keeps failing
        close_all(socks)
        socks = []
        with socket.create_connection(("127.0.0.1", port), timeout=15) as s:
            assert s.recv(5) == b"hello"  # served again once descriptors are free
        assert proc.poll() is None
    finally:
        close_all(socks)
        err = stop(proc)
    assert "accept loop returned" not in err
    lines = [line for line in err.splitlines() if "cannot accept" in line]
    assert 1 <= len(lines) <= 3, err  # once per interval, not once per failed accept


def test_caps_fit_the_open_file_limit():
    from terra_controller.connection_caps import caps_for_file_limit

    for nofile in (256, 1024, 16384, 1 << 20):
        caps = caps_for_file_limit(nofile)
        assert sum(total for total, _ in caps.values()) <= nofile - 128
        assert all(0 < per <= total for total, per in caps.values())
    with pytest.raises(ValueError):
        caps_for_file_limit(100)


def test_a_flood_past_the_file_limit_leaves_every_port_serving(tmp_path, pki):
    """The controller under a 256-descriptor limit, 1,500 connections flooding each of its
    ports from 127.0.0.2: during the flood and after it, a client from 127.0.0.1 is
    served on each port (the caps derived from the limit keep descriptors free)."""
    proc, ports = start_controller(tmp_path, ["--pki", str(pki)], nofile=256)
    socks = []
    ctx = context(pki, "operator1")
    try:
        assert proc.stdout.readline().startswith("terra-controller ready")

        def served() -> float:
            """Seconds until an API request, an agent handshake and a REST GET are done."""
            start = time.monotonic()
            with TerraClient("127.0.0.1", ports["api"], pki=pki, name="job1", timeout=20) as c:
                c.list_coflows()
            tls_socket("127.0.0.1", ports["agents"], pki, "a1", timeout=20).close()
            with urllib.request.urlopen(
                f"https://127.0.0.1:{ports['rest']}/status", timeout=20, context=ctx
            ) as reply:
                assert reply.status == 200
            return time.monotonic() - start

        for port in ports.values():
            socks += flood(port, 1500)
        time.sleep(1)
        during = served()
        close_all(socks)
        socks = []
        time.sleep(1)
        after = served()
        print(f"three ports served in {during:.3f} s during the flood, {after:.3f} s after")
        assert during < 10 and after < 10  # generous: the target (1 s) is for benchmarks
        assert proc.poll() is None
    finally:
        close_all(socks)
        err = stop(proc)
    assert "at most" in err and "open-file limit 256" in err  # the caps are logged


# ---- idle connections hold no thread ----------------------------------------------------------


def test_idle_connections_hold_no_handshake_thread(pki):
    """1,000 idle connections (no byte sent) start no thread each; a new client is answered."""
    srv = Server(pki, handshake_s=60.0)
    socks = []
    try:
        before = threading.active_count()
        for i in range(4):
            socks += flood(srv.port, 250, f"127.0.0.{2 + i}")
        time.sleep(1)  # all accepted and waiting for their handshakes
        grown = threading.active_count() - before
        with srv.client("job1", timeout=20) as c:
            cid, seconds = timed(lambda: c.submit_coflow([flow("f")]))
        print(f"submit answered in {seconds:.3f} s beside 1,000 idle connections")
        assert cid == 0 and seconds < 5
        assert grown < 10, f"{grown} threads for 1,000 idle connections"
    finally:
        close_all(socks)
        srv.stop()


# ---- REST --------------------------------------------------------------------------------------


@pytest.fixture
def public_rest(pki):
    controller, base, server = serve(pki, public=True)
    yield controller, base
    server.shutdown()


@pytest.fixture
def private_rest(pki):
    controller, base, server = serve(pki)
    yield controller, base
    server.shutdown()


def trickler(base: str, source: str) -> ssl.SSLSocket | None:
    """A certificate-less TLS connection from `source` that sends half a request (None: the
    server refused it)."""
    host, port = base[len("https://") :].split(":")
    ctx = ssl.create_default_context()
    ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
    try:
        raw = socket.create_connection((host, int(port)), timeout=5, source_address=(source, 0))
        tls = ctx.wrap_socket(raw)
        tls.sendall(b"GET /status HTTP/1.0\r\n")
        return tls
    except OSError:
        return None


def test_trickling_public_clients_do_not_lock_operators_out(public_rest, capfd):
    """64 certificate-less clients from one address each send half a request and wait:
    operators (another address) are still served, every time; the trickling clients
    leaving writes no traceback."""
    _, base = public_rest
    socks = [trickler(base, "127.0.0.2") for _ in range(64)]
    try:
        codes = []
        for _ in range(35):
            try:
                codes.append(get(base, "/status")[0])
            except OSError as exc:  # refused (urllib.error.URLError is an OSError)
                codes.append(str(exc))
        assert codes == [200] * 35
        admitted = [s for s in socks if s is not None]
        assert len(admitted) <= 9  # the per-address cap (8; one more may race its close)
    finally:
        close_all(s for s in socks if s is not None)
    time.sleep(0.5)  # the server notices them leave
    assert "Traceback" not in capfd.readouterr().err


def test_refused_connections_are_counted_in_the_metrics(public_rest):
    """Connections a server refuses at its caps are counted per server in /metrics
    (terra_connections_refused_total{server}), beside the connections it holds."""
    _, base = public_rest
    socks = [trickler(base, "127.0.0.4") for _ in range(16)]  # twice the per-address cap
    try:
        from test_rest import labelled

        m = labelled(base)
        assert m[("terra_connections_refused_total", (("server", "REST"),))] >= 7
        assert m[("terra_connections_open", (("server", "REST"),))] >= 1
        assert m[("terra_connections_evicted_total", (("server", "REST"),))] == 0
    finally:
        close_all(s for s in socks if s is not None)


def test_a_rest_request_has_a_whole_request_deadline(public_rest, monkeypatch):
    """A client sending its request one byte at a time (each recv is quick) is cut off when
    the request's deadline passes, not kept for as long as it trickles."""
    monkeypatch.setattr(rest, "REQUEST_TIMEOUT_S", 2.0)
    _, base = public_rest
    tls = trickler(base, "127.0.0.3")
    assert tls is not None
    start = time.monotonic()
    with contextlib.suppress(OSError):
        while time.monotonic() - start < 15:
            tls.sendall(b"X")
            time.sleep(0.2)
    assert time.monotonic() - start < 8
    tls.close()


def test_certificate_less_clients_are_refused_quietly(private_rest, caplog):
    """200 connections without a certificate to REST in its default mode: each refused, the
    log gets a few lines (not one per connection), operators are served meanwhile."""
    _, base = private_rest
    caplog.set_level(logging.DEBUG, logger="terra")
    host, port = base[len("https://") :].split(":")
    codes = []
    for i in range(200):
        s = trickler(base, f"127.0.0.{2 + i % 8}")
        if s is not None:
            with contextlib.suppress(OSError):
                s.recv(1)
            s.close()
        if i % 20 == 0:
            codes.append(get(base, "/status")[0])
    assert codes == [200] * 10
    noisy = [r for r in caplog.records if r.levelno >= logging.INFO]
    assert len(noisy) <= 6, [r.getMessage() for r in noisy]


@pytest.mark.parametrize("query", ["finished=%C2%B2", "finished=%D9%A3", "finished=-1"])
def test_non_ascii_digits_in_a_query_are_a_bad_request(private_rest, query):
    _, base = private_rest
    with pytest.raises(urllib.error.HTTPError) as err:
        get(base, f"/coflows?{query}")
    assert err.value.code == 400
    assert "finished" in json.loads(err.value.read())["error"]
    with pytest.raises(urllib.error.HTTPError) as err:
        get(base, "/coflows/%B2")  # the path's Latin-1 "²"
    assert err.value.code == 404


# ---- start-up ----------------------------------------------------------------------------------


def test_a_port_in_use_is_named_and_the_controller_exits(tmp_path, pki):
    """The REST port is taken: the controller names it, exits non-zero and frees the others."""
    with socket.create_server(("127.0.0.1", 0)) as taken:
        busy = taken.getsockname()[1]  # the last --rest wins over start_controller's
        proc, topo_ports = start_controller(
            tmp_path, ["--pki", str(pki), "--rest", f"127.0.0.1:{busy}"]
        )
        try:
            code = proc.wait(timeout=30)
        finally:
            err = stop(proc)
    assert code != 0
    assert f"cannot listen on 127.0.0.1:{busy} (REST)" in err
    for which in ("api", "agents"):  # released on the way out
        with socket.create_server(("127.0.0.1", topo_ports[which])):
            pass


SWITCHED = REPO / "topologies" / "data" / "swan_testbed.json"  # a topology with switches


def test_an_openflow_port_in_use_is_named_and_the_controller_exits(tmp_path):
    with socket.create_server(("127.0.0.1", 0)) as taken:
        busy = taken.getsockname()[1]
        proc = subprocess.run(
            [sys.executable, "-m", "terra_controller.cli", "--topology", str(SWITCHED),
             "--insecure", "--of-port", str(busy), "--api", "127.0.0.1:0",
             "--agents", "127.0.0.1:0", "--rest", "127.0.0.1:0"],
            capture_output=True, text=True, timeout=60, cwd=REPO,
        )  # fmt: skip
    assert proc.returncode != 0
    assert f"cannot listen on 127.0.0.1:{busy} (OpenFlow)" in proc.stderr


def test_insecure_says_what_does_not_hold(tmp_path):
    proc, _ = start_controller(tmp_path, ["--insecure"])
    try:
        assert proc.stdout.readline().startswith("terra-controller ready")
    finally:
        err = stop(proc)
    assert "register as an agent" in err and "digest keys" in err
    assert "not an attacker" in err
    security = (REPO / "docs" / "security.md").read_text()
    assert "digest_key" in security and "--insecure" in security


# ---- at the total cap, pending connections make room -------------------------------------------


@contextlib.contextmanager
def name_server(pki, max_connections: int, max_per_address: int):
    """A mutual-TLS server on 127.0.0.1 (listen_and_serve) that sends each authenticated
    peer its name and a newline, then echoes; yields (port, its Admission)."""
    from test_api import daemon_spawn
    from tls_helpers import security

    from terra_controller.transport import Admission, listen_and_serve, stop_listener

    sec = security(pki, handshake_s=60.0, max_connections=max_connections,
                   max_per_address=max_per_address)  # fmt: skip
    admission = Admission(sec)

    def handle(sock, addr, identity):
        sock.sendall(identity.name.encode() + b"\n")
        while data := sock.recv(100):
            sock.sendall(data)

    listener, _, (_, port) = listen_and_serve(
        "127.0.0.1", 0, handle, sec, daemon_spawn, admission=admission
    )
    try:
        yield port, admission
    finally:
        stop_listener(listener)


def authenticated(pki, port: int, source: str, name: str = "job1") -> ssl.SSLSocket:
    """A mutual-TLS connection from `source` that the server has served (name read back)."""
    from terra_security.pki import CONTROLLER_HOSTNAME, client_context

    raw = socket.create_connection(("127.0.0.1", port), timeout=20, source_address=(source, 0))
    tls = client_context(pki, name).wrap_socket(raw, server_hostname=CONTROLLER_HOSTNAME)
    assert tls.recv(len(name) + 1) == name.encode() + b"\n"
    return tls


def wait_until(predicate, seconds: float = 30) -> None:
    end = time.monotonic() + seconds
    while not predicate():
        assert time.monotonic() < end, "timed out"
        time.sleep(0.01)


def was_closed(sock: socket.socket) -> bool:
    """True when the server closed `sock` (EOF or reset)."""
    sock.setblocking(True)
    sock.settimeout(20)
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True


def test_at_the_cap_a_handshaking_connection_makes_room_for_an_authenticated_client(pki, caplog):
    """Connections that never start their handshake, from three addresses, fill the total
    cap (20; 8 per address): a client from a fourth address is served in place of the
    oldest pending connection of the busiest address; the eviction is logged."""
    caplog.set_level(logging.WARNING, logger="terra.transport")
    socks = []
    with name_server(pki, 20, 8) as (port, admission):
        try:
            for i in range(3):
                socks += flood(port, 8, f"127.0.0.{2 + i}")
            wait_until(lambda: admission.refused + admission.evicted + 20 >= 24)
            assert admission.total == 20 and len(admission.pending) == 20
            evicted = admission.evicted
            client = authenticated(pki, port, "127.0.0.1")
            client.sendall(b"ping")
            assert client.recv(4) == b"ping"
            client.close()
            assert admission.evicted == evicted + 1
        finally:
            close_all(socks)
    assert "pending connections evicted at the cap" in caplog.text


def test_authenticated_connections_are_never_evicted(pki):
    """Three authenticated connections and one handshaking fill the cap (4): the handshaking
    one makes room for an authenticated newcomer; then every newcomer is refused and the four
    authenticated connections keep being served."""
    socks = []
    with name_server(pki, 4, 4) as (port, admission):
        try:
            served = [authenticated(pki, port, "127.0.0.2") for _ in range(3)]
            socks += served
            pending = flood(port, 1, "127.0.0.3")
            socks += pending
            wait_until(lambda: admission.total == 4)
            socks.append(authenticated(pki, port, "127.0.0.4"))
            served.append(socks[-1])
            assert was_closed(pending[0]) and admission.evicted == 1
            late = [s for i in range(5) for s in flood(port, 1, f"127.0.0.{5 + i}")]
            socks += late
            wait_until(lambda: admission.refused == 5)
            assert all(was_closed(s) for s in late)
            assert admission.evicted == 1 and admission.total == 4
            for s in served:
                s.sendall(b"ping")
                assert s.recv(4) == b"ping"
        finally:
            close_all(socks)


def test_certificate_less_public_clients_make_room_for_an_operator(public_rest, monkeypatch):
    """Public REST: 64 certificate-less clients from eight addresses hold every connection
    with half a request; an operator (another address) is served in place of the oldest of
    them (all addresses hold 8: the first to reach 8 counts as the busiest)."""
    monkeypatch.setattr(rest, "REQUEST_TIMEOUT_S", 120.0)  # only an eviction closes them
    _, base = public_rest
    socks = [trickler(base, f"127.0.0.{2 + i % 8}") for i in range(64)]
    try:
        assert all(s is not None for s in socks)
        assert get(base, "/status")[0] == 200
        assert was_closed(socks[0])
    finally:
        close_all(s for s in socks if s is not None)


def test_the_victim_is_the_oldest_pending_connection_of_the_busiest_address():
    from overlay.pending_connections import PendingConnections

    pending = PendingConnections()
    assert pending.victim("10.0.0.9") is None  # nothing pending: refuse
    for i in range(3):
        pending.add("10.0.0.1", f"a{i}")
    pending.add("10.0.0.2", "b0")
    assert pending.victim("10.0.0.9") == ("10.0.0.1", "a0")
    assert pending.victim("10.0.0.2") == ("10.0.0.1", "a0")  # 1 < 3
    assert pending.victim("10.0.0.1") is None  # the busiest address does not churn itself
    pending.add("10.0.0.2", "b1")  # 2 + the newcomer = 3, not fewer than 3: refused
    assert pending.victim("10.0.0.2") is None and pending.victim("10.0.0.9") is not None
    pending.discard("10.0.0.2", "b1")
    assert pending.discard("10.0.0.1", "a0") and not pending.discard("10.0.0.1", "a0")
    assert pending.victim("10.0.0.9") == ("10.0.0.1", "a1")
    pending.discard("10.0.0.1", "a1")
    pending.discard("10.0.0.1", "a2")  # the busiest address drained: 10.0.0.2 is next
    assert pending.victim("10.0.0.9") == ("10.0.0.2", "b0") and len(pending) == 1
    pending.discard("10.0.0.2", "b0")
    assert pending.victim("10.0.0.9") is None and len(pending) == 0
