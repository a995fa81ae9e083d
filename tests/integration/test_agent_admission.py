"""An agent's listeners hold up under connection floods (data port, tunnel ports, metrics).

Real agents: `terra-agent` subprocesses on loopback (the data-port test runs them under a
256-file limit, as systemd's default of 1,024 would, scaled down) driven by the in-test
controller peer (benchmarks/harness.py). The flood comes from 127.0.0.1; agents and honest
clients use other loopback addresses.

- 1,400 idle connections to a receiver's tunnel port: they get at most the per-address cap,
  the receiver keeps descriptors for its sink file and a file flow to it completes;
- 1,000 idle connections to an agent's --metrics port hold neither 1,000 threads nor the
  port: a scrape from another address is answered meanwhile, an idle admitted connection is
  closed after the request deadline;
- caps follow from the open-file limit; accept loops survive EMFILE.
"""

import errno
import os
import socket
import subprocess
import sys
import time

import trio
from test_data_root import MB, file_digest, run_flows, wait_complete

from benchmarks.harness import LoopbackHarness, free_port, free_port_block, stop_processes
from terra_agent.admission import Admission, Caps, caps_from_file_limit, serve_admitted
from terra_agent.metrics import REQUEST_S, bind_metrics, serve_metrics
from terra_agent.sources import PART_SUFFIX

FLOOD_HOST = "127.0.0.1"
TIMEOUT = 60


def flood(host: str, port: int, n: int) -> list[socket.socket]:
    """Open `n` connections to host:port from FLOOD_HOST without waiting for them."""
    return flood_from(host, port, [FLOOD_HOST], n)


def close_all(socks) -> None:
    for s in socks:
        s.close()


def test_caps_follow_the_file_limit():
    data, metrics = caps_from_file_limit(1024)
    assert (data.max_connections, data.max_per_address) == (512, 128)
    assert (metrics.max_connections, metrics.max_per_address) == (32, 8)
    data, metrics = caps_from_file_limit(256)
    assert data.max_connections == 128 and data.max_per_address == 32
    assert metrics.max_connections <= 8


async def test_a_flood_of_idle_connections_leaves_room_for_a_file_flow(tmp_path):
    size = 3 * MB
    async with trio.open_nursery() as nursery:
        h = LoopbackHarness(nursery, tmp_path, data_root="data", agent_nofile=256)
        await h.start()
        await h.add_agent("a", "HK")
        b = await h.add_agent("b", "LA", subprocess=True)
        h.tunnels = (await h.install_tunnels([("a", "b", 2)]))["a"]
        with trio.fail_after(TIMEOUT):  # a's links to b are up before the flood
            while not all(link.up for link in h.agents["a"].agent.links.values()):
                await trio.sleep(0.05)
        socks = flood(b.host, b.tunnel_port(0), 1400) + flood(b.host, b.base_port, 100)
        try:
            await trio.sleep(1)  # b accepts what it accepts
            src = h.data_root / "src.bin"
            src.write_bytes(os.urandom(size))
            f = h.flow("c1", "f1", "a", "b", size, source="file:src.bin", sink="file:dst.bin")
            await run_flows(h, [f])
            await wait_complete(h, [f])
            assert not h.controller.failed, h.controller.failed
        finally:
            close_all(socks)
        assert h.controller.completed[f.key] == file_digest(src, f.digest_key)
        assert (h.data_root / "dst.bin").read_bytes() == src.read_bytes()
        assert not (h.data_root / f"dst.bin{PART_SUFFIX}").exists()
        nursery.cancel_scope.cancel()


def threads_of(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("Threads:"):
                return int(line.split()[1])
    raise AssertionError("no Threads line")


def scrape(host: str, port: int, source: str) -> str:
    """GET /metrics from a socket bound to `source`."""
    with socket.create_connection((host, port), timeout=10, source_address=(source, 0)) as s:
        s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    return data.decode()


def test_idle_metrics_connections_hold_no_threads_and_do_not_block_a_scrape(tmp_path):
    host = "127.0.0.44"
    data_port = free_port_block(host, 2)
    metrics_port = free_port_block(host, 1)
    controller = free_port()  # a controller address that refuses: the agent retries
    cmd = [
        sys.executable, "-m", "terra_agent.cli", "--insecure",
        "--controller", f"127.0.0.1:{controller}", "--dc", "HK", "--id", "m1",
        "--data-addr", f"{host}:{data_port}", "--spill-dir", str(tmp_path),
        "--metrics", f"{host}:{metrics_port}",
    ]  # fmt: skip
    proc = subprocess.Popen(cmd, stderr=subprocess.DEVNULL)
    socks = []
    try:
        end = time.monotonic() + TIMEOUT
        while True:  # until it serves
            try:
                assert "terra_agent_received_bytes_total" in scrape(host, metrics_port, host)
                break
            except OSError:
                assert time.monotonic() < end, "the agent never served /metrics"
                time.sleep(0.1)
        socks = flood(host, metrics_port, 1000)
        time.sleep(1)
        assert threads_of(proc.pid) < 50
        assert "terra_agent_received_bytes_total" in scrape(host, metrics_port, "127.0.0.45")
        assert threads_of(proc.pid) < 50
        # an admitted idle connection is closed after the request deadline
        with socket.create_connection((host, metrics_port), source_address=("127.0.0.46", 0)) as s:
            s.settimeout(REQUEST_S + 30)
            started = time.monotonic()
            assert s.recv(10) == b""
            assert time.monotonic() - started < REQUEST_S + 30
    finally:
        close_all(socks)
        stop_processes([proc])


async def test_accept_loops_survive_running_out_of_descriptors():
    """An accept that fails with EMFILE is retried; the listener keeps serving."""
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    port = listeners[0].socket.getsockname()[1]
    real_accept = listeners[0].accept
    failures = 3

    async def accept():
        nonlocal failures
        if failures:
            failures -= 1
            raise OSError(errno.EMFILE, os.strerror(errno.EMFILE))
        return await real_accept()

    listeners[0].accept = accept
    served = trio.Event()

    async def handler(stream):
        async with stream:
            served.set()

    admission = Admission(Caps(4, 2), "test port")
    async with trio.open_nursery() as nursery:
        await nursery.start(serve_admitted, handler, listeners, admission, nursery)
        client = await trio.open_tcp_stream("127.0.0.1", port)
        with trio.fail_after(TIMEOUT):
            await served.wait()
        await client.aclose()
        assert admission.accept_failures == 3
        nursery.cancel_scope.cancel()


async def test_connections_over_a_cap_are_closed_at_once():
    """Authenticated connections fill the caps: a newcomer is closed at once."""
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    port = listeners[0].socket.getsockname()[1]
    release = trio.Event()
    admission = Admission(Caps(3, 2), "test port")

    async def handler(stream):
        async with stream:
            admission.authenticated(stream)
            await release.wait()

    async with trio.open_nursery() as nursery:
        await nursery.start(serve_admitted, handler, listeners, admission, nursery)
        clients = [await trio.open_tcp_stream("127.0.0.1", port) for _ in range(4)]
        other = await trio.open_tcp_stream("127.0.0.1", port, local_address="127.0.0.7")
        with trio.fail_after(TIMEOUT):
            while admission.refused < 2:
                await trio.sleep(0.01)
        assert admission.total == 3 and admission.per_address == {"127.0.0.1": 2, "127.0.0.7": 1}
        assert admission.evicted == 0
        extra = await trio.open_tcp_stream("127.0.0.1", port, local_address="127.0.0.8")
        with trio.fail_after(TIMEOUT):  # over the total: closed at once
            assert await extra.receive_some(10) == b""
        release.set()
        for c in [*clients, other, extra]:
            await c.aclose()
        nursery.cancel_scope.cancel()


async def test_during_a_flood_a_peer_from_another_address_reconnects(tmp_path):
    """In-process receiver with small caps: while 1,400 connections from one address are
    held or refused, the sender's links (another address) are cut and come back."""
    async with trio.open_nursery() as nursery:
        h = LoopbackHarness(nursery, tmp_path)
        await h.start()
        await h.add_agent("a", "HK")
        b = await h.add_agent("b", "LA")
        b.agent.data_admission = Admission(Caps(64, 16), "data port")  # before any tunnel
        h.tunnels = (await h.install_tunnels([("a", "b", 2)]))["a"]
        links = h.agents["a"].agent.links.values()
        with trio.fail_after(TIMEOUT):
            while not all(link.up for link in links):
                await trio.sleep(0.05)
        socks = flood(b.host, b.tunnel_port(0), 1400)
        try:
            with trio.fail_after(TIMEOUT):
                while b.agent.data_admission.refused < 1400 - 16 - 10:
                    await trio.sleep(0.05)
            assert b.agent.data_admission.per_address[FLOOD_HOST] <= 16
            connects = sum(link.connects for link in links)
            for spec in h.tunnels:
                b.agent.close_incoming("a", spec.tunnel)
            with trio.fail_after(TIMEOUT):
                while sum(link.connects for link in links) < connects + 2 or not all(
                    link.up for link in links
                ):
                    await trio.sleep(0.05)
            f = h.flow("c1", "f1", "a", "b", 2 * MB)
            await run_flows(h, [f])
            await wait_complete(h, [f])
        finally:
            close_all(socks)
        nursery.cancel_scope.cancel()


# ---- eviction of pending connections at the total cap -------------------------------------


async def serve_auth(caps: Caps, nursery):
    """A listener on 127.0.0.1 behind Admission(caps) whose handler authenticates a peer when
    it sends b"auth" (answers b"ok"), then echoes; (admission, port)."""
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    admission = Admission(caps, "test port")

    async def handler(stream):
        async with stream:
            if await stream.receive_some(4) != b"auth":
                return
            admission.authenticated(stream)
            await stream.send_all(b"ok")
            while data := await stream.receive_some(100):
                await stream.send_all(data)

    await nursery.start(serve_admitted, handler, listeners, admission, nursery)
    return admission, listeners[0].socket.getsockname()[1]


async def connect(port: int, source: str, auth: bool) -> trio.SocketStream:
    """A connection from `source`; authenticated (b"ok" read) when `auth`."""
    stream = await trio.open_tcp_stream("127.0.0.1", port, local_address=source)
    if auth:
        await stream.send_all(b"auth")
        with trio.fail_after(TIMEOUT):
            assert await stream.receive_some(2) == b"ok"
    return stream


async def wait_for(predicate) -> None:
    with trio.fail_after(TIMEOUT):
        while not predicate():
            await trio.sleep(0.01)


async def closed(stream: trio.SocketStream) -> bool:
    """True when the server closed `stream` (EOF or reset)."""
    try:
        with trio.fail_after(TIMEOUT):
            return await stream.receive_some(10) == b""
    except trio.BrokenResourceError:
        return True


async def test_at_the_cap_a_pending_connection_of_the_busiest_address_makes_room():
    """Pending connections from several addresses fill the total cap: a client from
    another address is admitted and served in place of the oldest pending connection of
    the address holding the most; a newcomer from that address itself is refused."""
    async with trio.open_nursery() as nursery:
        admission, port = await serve_auth(Caps(6, 6), nursery)
        busiest = [await connect(port, "127.0.0.2", auth=False) for _ in range(4)]
        other = [await connect(port, "127.0.0.3", auth=False) for _ in range(2)]
        await wait_for(lambda: admission.total == 6)
        assert len(admission.pending) == 6
        # the busiest address gains nothing by reconnecting: refused, nothing evicted
        again = await connect(port, "127.0.0.2", auth=False)
        assert await closed(again)
        assert admission.refused == 1 and admission.evicted == 0
        # a client from another address is served; the oldest of 127.0.0.2 made room
        client = await connect(port, "127.0.0.9", auth=True)
        await client.send_all(b"ping")
        assert await client.receive_some(4) == b"ping"
        assert admission.evicted == 1 and admission.total == 6
        assert admission.per_address == {"127.0.0.2": 3, "127.0.0.3": 2, "127.0.0.9": 1}
        assert await closed(busiest[0])
        for stream in [*busiest, *other, again, client]:
            await stream.aclose()
        nursery.cancel_scope.cancel()


async def test_authenticated_connections_are_never_evicted():
    """Authenticated connections and one pending connection fill the cap: the pending one
    makes room for one newcomer; then every newcomer is refused, the authenticated
    connections all keep being served."""
    async with trio.open_nursery() as nursery:
        admission, port = await serve_auth(Caps(4, 4), nursery)
        served = [await connect(port, "127.0.0.2", auth=True) for _ in range(3)]
        pending = await connect(port, "127.0.0.3", auth=False)
        await wait_for(lambda: admission.total == 4)
        served.append(await connect(port, "127.0.0.4", auth=True))
        assert await closed(pending) and admission.evicted == 1
        refused = [await connect(port, f"127.0.0.{5 + i}", auth=False) for i in range(5)]
        for stream in refused:
            assert await closed(stream)
        assert admission.refused == 5 and admission.evicted == 1 and admission.total == 4
        for stream in served:
            await stream.send_all(b"ping")
            with trio.fail_after(TIMEOUT):
                assert await stream.receive_some(4) == b"ping"
        for stream in [*served, pending, *refused]:
            await stream.aclose()
        nursery.cancel_scope.cancel()


def flood_from(host: str, port: int, sources: list[str], per_source: int) -> list[socket.socket]:
    """`per_source` idle connections to host:port from each of `sources`."""
    socks = []
    for source in sources:
        for _ in range(per_source):
            s = socket.socket()
            s.setblocking(False)
            s.bind((source, 0))
            s.connect_ex((host, port))
            socks.append(s)
    return socks


FLOOD_SOURCES = ["127.0.0.1", *(f"127.0.0.{60 + i}" for i in range(5))]


async def test_a_flood_from_many_addresses_leaves_the_data_port_to_agents(tmp_path, monkeypatch):
    """In-process receiver with small caps (64 data connections, 16 per address): idle
    connections from six addresses to its data port fill the total cap (and would be held
    for 120 s); the sender's links to its tunnel ports (same caps, another address) come
    up, each in place of a pending flood connection, and a flow completes."""
    import terra_agent.agent as agent_module

    small = (Caps(64, 16), Caps(8, 2))
    monkeypatch.setattr(agent_module, "caps_from_file_limit", lambda: small)
    monkeypatch.setattr(agent_module, "HELLO_S", 120.0)
    async with trio.open_nursery() as nursery:
        h = LoopbackHarness(nursery, tmp_path)
        await h.start()
        await h.add_agent("a", "HK")
        b = await h.add_agent("b", "LA")
        admission = b.agent.data_admission
        socks = flood_from(b.host, b.base_port, FLOOD_SOURCES, 16)
        try:
            # every flood connection admitted, refused, or evicted by a later one
            await wait_for(lambda: admission.refused + admission.evicted + 64 >= 96)
            assert admission.total == 64 and len(admission.pending) == 64
            evicted = admission.evicted
            h.tunnels = (await h.install_tunnels([("a", "b", 2)]))["a"]
            links = h.agents["a"].agent.links.values()
            with trio.fail_after(TIMEOUT):
                while not all(link.up for link in links):
                    await trio.sleep(0.05)
            assert admission.evicted >= evicted + 2 and admission.total == 64
            f = h.flow("c1", "f1", "a", "b", 2 * MB)
            await run_flows(h, [f])
            await wait_complete(h, [f])
        finally:
            close_all(socks)
        nursery.cancel_scope.cancel()


async def test_a_flood_from_many_addresses_leaves_the_metrics_port_to_a_scrape(tmp_path):
    """The metrics port's cap full of unfinished requests from four addresses: a scrape
    from another address is answered in place of one of them."""
    async with trio.open_nursery() as nursery:
        h = LoopbackHarness(nursery, tmp_path)
        await h.start()
        agent = (await h.add_agent("a", "HK")).agent
        sock = bind_metrics("127.0.0.1", 0)
        port = sock.getsockname()[1]
        admission = Admission(Caps(8, 2), "metrics port")
        await nursery.start(serve_metrics, agent, sock, admission, nursery)
        partial = []
        for i in range(4):
            for _ in range(2):
                stream = await connect(port, f"127.0.0.{70 + i}", auth=False)
                await stream.send_all(b"GET /metrics HTTP/1.1\r\n")
                partial.append(stream)
        await wait_for(lambda: admission.total == 8)
        reply = await trio.to_thread.run_sync(scrape, "127.0.0.1", port, "127.0.0.80")
        assert reply.startswith("HTTP/1.1 ")
        assert admission.evicted == 1
        for stream in partial:
            await stream.aclose()
        nursery.cancel_scope.cancel()
