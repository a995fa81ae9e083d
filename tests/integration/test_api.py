"""Coflow API over mutual TLS on loopback: TerraClient against the in-process API server.

The server runs with the real Controller and TerraPolicy; the agents are
registered in the registry directly (the agent channel has its own tests).
"""

import socket
import struct
import threading
import time

import msgpack
import pytest
from tls_helpers import security, tls_socket

from terra_controller.api_server import ApiHandler, serve_connection_on_loop
from terra_controller.client import TerraClient, TerraError
from terra_controller.controller import Controller
from terra_controller.controller_round import RoundRunner
from terra_controller.transport import (
    ServerSecurity,
    accept_loop,
    listen_and_serve,
    read_message,
    stop_listener,
)
from terra_core.terra_policy import TerraPolicy
from terra_wire.api import pack_message
from topologies import Topology

CAP = 1e8  # bytes/s per directed link


def triangle() -> Topology:
    links = {}
    for u, v in [("A", "B"), ("B", "C"), ("A", "C")]:
        links[(u, v)] = links[(v, u)] = CAP
    return Topology("tri", ["A", "B", "C"], links)


def daemon_spawn(func, *args):
    thread = threading.Thread(target=func, args=args, daemon=True)
    thread.start()
    return thread


class Server:
    """An API server in this process; `restart()` replaces the controller (new instance)."""

    def __init__(self, pki, port: int = 0, **caps) -> None:
        """caps: ServerSecurity settings (handshake_s, max_per_address, ...)."""
        self.pki = pki
        self.conns: list[socket.socket] = []
        topology = triangle()
        self.controller = Controller(topology, TerraPolicy(topology))
        for agent, dc in [("a1", "A"), ("a2", "A"), ("b1", "B"), ("c1", "C")]:
            self.controller.registry.register_agent(agent, dc, "127.0.0.1:1")
        self.runner = RoundRunner(self.controller).start()
        self.handler = ApiHandler(self.controller)

        async def serve(sock, addr, identity):  # the API server, remembering the connection
            self.conns.append(sock)
            await serve_connection_on_loop(self.handler, sock, addr, identity)

        self.listener, _, (self.host, self.port) = listen_and_serve(
            "127.0.0.1", port, serve, security(pki, **caps), daemon_spawn,
            owner=self.controller.owner,
        )  # fmt: skip

    def client(self, name: str = "operator1", timeout: float = 5) -> TerraClient:
        return TerraClient(self.host, self.port, pki=self.pki, name=name, timeout=timeout)

    def connect(self, name: str = "operator1"):
        return tls_socket(self.host, self.port, self.pki, name)

    def stop(self) -> None:
        self.runner.stop()
        stop_listener(self.listener)
        for sock in self.conns:
            try:
                socket.socket.shutdown(sock, socket.SHUT_RDWR)  # not SSLSocket's (thread-safe)
            except OSError:
                pass


@pytest.fixture
def server(pki):
    srv = Server(pki)
    yield srv
    srv.stop()


@pytest.fixture
def client(server):
    with server.client() as c:
        yield c


def flow(fid, src="a1", dst="b1", size=10_000_000, **extra):
    return {"id": fid, "src": src, "dst": dst, "bytes": size, **extra}


def test_submit_and_status(server, client):
    cid = client.submit_coflow([flow("f1"), flow("f2", "a2", "c1", 5_000_000)])
    assert cid == 0
    assert client.submitCoflow([flow("g")]) == 1  # the paper's alias
    server.controller.run_round()
    status = client.check_status(cid)
    assert status["id"] == 0 and status["bytes_total"] == 15_000_000
    assert status["bytes_delivered"] == 0 and status["cct_s"] is None
    assert status["state"] in ("running", "preempted")
    assert {f["id"]: f["dst_dc"] for f in status["flows"]} == {"f1": "B", "f2": "C"}
    assert client.checkStatus(cid)["id"] == 0
    # The round gave rates: coflow 1 (10 MB A->B only, the smaller Γ) runs. Coflow 0 may get
    # nothing: with the aged starvation guard (the default) no capacity is held back for it
    # until it has waited 2Γ (the paper's fixed α = 0.1 would give it a share).
    other = client.check_status(1)
    assert other["state"] == "running"
    assert sum(f["rate_bytes_per_s"] for f in other["flows"]) > 0


def test_update_coflow_adds_flows(client):
    cid = client.submit_coflow([flow("f1")])
    client.update_coflow(cid, [flow("f2", "b1", "c1", 3)])
    client.updateCoflow(cid, [flow("f3", "c1", "a1", 4)])
    status = client.check_status(cid)
    assert [f["id"] for f in status["flows"]] == ["f1", "f2", "f3"]
    assert status["bytes_total"] == 10_000_000 + 3 + 4


def test_unmeetable_deadline_returns_minus_one(client):
    # 1e9 bytes A->B over the direct path and A-C-B, 1e8 B/s each: Γ = 1e9 / 2e8 = 5 s.
    # Admission needs Γ·(1+ε) = 5.5 s <= deadline, so 1 s is rejected and 60 s admitted.
    assert client.submit_coflow([flow("f", size=1_000_000_000)], deadline=1.0) == -1
    cid = client.submit_coflow([flow("f", size=1_000_000_000)], deadline=60.0)
    assert cid >= 0
    assert client.check_status(cid)["deadline_s"] == 60.0


@pytest.mark.parametrize(
    ("flows", "code"),
    [
        ([flow("f"), flow("f")], "duplicate_flow"),
        ([flow("f", src="ghost")], "unknown_agent"),
        ([flow("f", size=0)], "bad_size"),
        ([flow("f", size=-1)], "bad_size"),
        ([flow("f", size=2.5)], "bad_size"),
        ([], "bad_request"),
        ("flows", "bad_request"),
    ],
)
def test_bad_submissions_change_nothing(server, client, flows, code):
    client.submit_coflow([flow("ok")])
    before = [(c["id"], c["bytes_total"]) for c in client.list_coflows()]
    with pytest.raises(TerraError) as info:
        client.submit_coflow(flows)
    assert info.value.code == code
    assert [(c["id"], c["bytes_total"]) for c in client.list_coflows()] == before
    assert server.controller.registry.next_id == 1


def test_unknown_coflow_and_bad_update(client):
    cid = client.submit_coflow([flow("f1")])
    for bad in (99, -1, "0"):
        with pytest.raises(TerraError) as info:
            client.check_status(bad)
        assert info.value.code == "unknown_coflow"
    with pytest.raises(TerraError) as info:
        client.update_coflow(cid, [flow("f1")])  # f1 is already in the coflow
    assert info.value.code == "duplicate_flow"
    with pytest.raises(TerraError):
        client.update_coflow(7, [flow("x")])
    assert [f["id"] for f in client.check_status(cid)["flows"]] == ["f1"]


def raw_exchange(server, data: bytes) -> list[dict]:
    """Send raw bytes, return the replies until the server closes the connection."""
    with server.connect() as s:
        s.sendall(data)
        socket.socket.shutdown(s, socket.SHUT_WR)  # TCP half-close under TLS
        replies = []
        while True:
            try:
                reply = read_message(s)
            except Exception:
                break
            if reply is None:
                break
            replies.append(reply)
        return replies


@pytest.mark.parametrize(
    "data",
    [
        struct.pack(">I", 5) + b"\xc1\xc1\xc1\xc1\xc1",  # 0xc1 is never valid msgpack
        struct.pack(">I", 2**31),  # oversized length
        struct.pack(">I", 100) + b"short",  # EOF inside a message
        pack_message([1, 2, 3]),  # not a map  # type: ignore[arg-type]
    ],
)
def test_malformed_messages_close_only_that_connection(server, client, data):
    cid = client.submit_coflow([flow("f")])
    replies = raw_exchange(server, data)
    assert all(not r["ok"] for r in replies)
    # The server and the other client's connection still work.
    assert client.check_status(cid)["id"] == cid
    assert client.submit_coflow([flow("g")]) == cid + 1


@pytest.mark.parametrize(
    ("request_map", "code"),
    [
        ({"v": 2, "op": "list"}, "bad_version"),
        ({"op": "list"}, "bad_version"),
        ({"v": 1, "op": "explode"}, "bad_request"),
        ({"v": 1, "op": 7}, "bad_request"),
        ({"v": 1, "op": "status", "coflow": 0, "extra": 1}, "bad_request"),
        (
            {"v": 1, "op": "link_state", "a": "A", "b": "Z", "up": False},
            "bad_request",
        ),
        (
            {"v": 1, "op": "link_state", "a": "A", "b": "B", "up": "no"},
            "bad_request",
        ),
    ],
)
def test_bad_requests_get_error_replies_on_a_live_connection(server, request_map, code):
    with server.connect() as s:
        s.sendall(pack_message(request_map) + pack_message({"v": 1, "op": "hello", "req": 9}))
        first, second = read_message(s), read_message(s)
    assert first["ok"] is False and first["code"] == code
    assert second["ok"] is True and second["req"] == 9  # the connection survived


def test_link_state_operator_command(server, client):
    assert client.set_link_state("A", "B", False) is True
    assert ("A", "B") in server.controller.topology.down
    assert client.set_link_state("A", "B", False) is False  # already down
    assert client.set_link_state("A", "B", True) is True
    assert server.controller.topology.down == set()


def test_wait_times_out_on_an_unfinished_coflow(client):
    cid = client.submit_coflow([flow("f")])
    with pytest.raises(TimeoutError):
        client.wait(cid, timeout=0.2)


def test_concurrent_clients_get_distinct_ids(server):
    ids, errors = [], []

    def work():
        try:
            with server.client("job1") as c:
                for i in range(20):
                    ids.append(c.submit_coflow([flow(f"f{i}", size=1000)]))
        except Exception as exc:  # surfaced below
            errors.append(exc)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert sorted(ids) == list(range(80))


def test_client_resubmits_open_coflows_after_controller_restart(pki):
    first = Server(pki)
    client = first.client("job1")
    done = client.submit_coflow([flow("x", "a1", "a2")])  # intra-DC only: done at once
    assert client.check_status(done)["state"] == "done"
    open_id = client.submit_coflow([flow("f1")])
    client.update_coflow(open_id, [flow("f2", "b1", "c1", 77)])
    first.stop()
    second = Server(pki, first.port)  # a new controller on the same port, knows nothing
    try:
        status = client.check_status(open_id)  # reconnects, resubmits, then asks
        assert [f["id"] for f in status["flows"]] == ["f1", "f2"]
        assert set(second.controller.registry.coflows) == {open_id}
        # New submissions do not collide with the resubmitted id.
        assert client.submit_coflow([flow("g")]) == open_id + 1
    finally:
        client.close()
        second.stop()


def test_msgpack_garbage_inside_valid_frame_is_rejected_cleanly(server):
    body = msgpack.packb(
        {
            "v": 1,
            "op": "submit",
            "flows": [{"id": {"nested": 1}, "src": "a1", "dst": "b1", "bytes": 1}],
        }
    )
    with server.connect() as s:
        s.sendall(struct.pack(">I", len(body)) + body)
        reply = read_message(s)
    assert reply["ok"] is False and reply["code"] == "bad_request"
    assert server.controller.registry.coflows == {}


def test_connections_beyond_the_limit_are_refused_and_slots_come_back():
    listener = socket.create_server(("127.0.0.1", 0))
    addr = listener.getsockname()

    def hold(sock, _addr, _identity):  # serve until the client closes
        with sock:
            while sock.recv(100):
                pass

    daemon_spawn(accept_loop, listener, hold, daemon_spawn, ServerSecurity(None, max_connections=2))
    try:
        first = socket.create_connection(addr, timeout=5)
        second = socket.create_connection(addr, timeout=5)
        third = socket.create_connection(addr, timeout=5)
        assert third.recv(1) == b""  # the third of max 2 is closed at once
        first.close()
        deadline = time.monotonic() + 5
        while True:  # the freed slot serves a new client (it stays open)
            fourth = socket.create_connection(addr, timeout=0.5)
            try:
                fourth.recv(1)
            except TimeoutError:
                break
            fourth.close()
            assert time.monotonic() < deadline
        for s in (second, third, fourth):
            s.close()
    finally:
        stop_listener(listener)


def test_a_resent_request_with_the_same_ref_is_executed_once(server):
    submit = {"v": 1, "op": "submit", "ref": "r-1", "flows": [flow("f")]}
    update = {"v": 1, "op": "update", "ref": "r-2", "coflow": 0,
              "flows": [flow("g")]}  # fmt: skip
    with server.connect() as s:
        replies = []
        for message in (submit, submit, update, update):
            s.sendall(pack_message(message))
            replies.append(read_message(s))
    # A resent submit gets the first reply (coflow 0) instead of creating coflow 1;
    # a resent update does not fail with duplicate_flow.
    assert [r["ok"] for r in replies] == [True] * 4
    assert replies[0]["coflow"] == replies[1]["coflow"] == 0
    assert list(server.controller.registry.coflows) == [0]
    assert list(server.controller.registry.get(0).flows) == ["f", "g"]


def test_client_forgets_coflows_it_learns_are_finished_and_keeps_at_most_max_open(server):
    """`open` (what a client resubmits after a controller restart) does not grow without end:
    final states seen in status / list replies and refused cancels drop entries, and beyond
    max_open the oldest go."""
    with server.client("job1") as c, server.client("job1") as other:
        done = c.submit_coflow([flow("x", "a1", "a2")])  # intra-DC only: done at once
        running = c.submit_coflow([flow("f1")])
        cancelled = c.submit_coflow([flow("f2")])
        other.cancel_coflow(cancelled)  # c learns of it only from a reply
        assert set(c.open) == {done, running, cancelled}
        states = {s["id"]: s["state"] for s in c.list_coflows()}
        assert states[done] == "done" and states[cancelled] == "cancelled"
        assert set(c.open) == {running}
        done2 = c.submit_coflow([flow("y", "a1", "a2")])
        with pytest.raises(TerraError, match="coflow_done"):
            c.cancel_coflow(done2)
        assert set(c.open) == {running}
        small = server.client("job1")
        small.max_open = 3
        ids = [small.submit_coflow([flow(f"g{i}")]) for i in range(5)]
        assert list(small.open) == ids[2:] and small.forgotten == 2
        small.close()
