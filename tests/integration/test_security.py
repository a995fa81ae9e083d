"""Attacks on the controller's API and agent channel, each kept as a test.

Real servers on loopback with mutual TLS (the session's PKI); attackers are plain
TCP peers, peers with a certificate of another CA, or legitimate participants
acting outside their role.
"""

from __future__ import annotations

import select
import socket
import ssl
import struct
import threading
import time

import pytest
from test_api import Server, daemon_spawn, flow
from test_controller_channel import Agent, channel  # noqa: F401 (fixture)
from tls_helpers import make_pki, plain_socket, tls_socket

from terra_controller.client import TerraClient, TerraError
from terra_controller.transport import ServerSecurity, read_message
from terra_security.pki import PkiError, Role, client_context, init_ca, issue
from terra_wire import control as protocol
from terra_wire.api import pack_message


@pytest.fixture
def server(pki):
    srv = Server(pki)
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def foreign_pki(tmp_path_factory):
    """Another CA with the same participant names: its certificates must not be accepted."""
    return make_pki(tmp_path_factory.mktemp("foreign"))


def closed_without_reply(sock: socket.socket) -> bool:
    """True when the server closes `sock` and sends nothing but (at most) a TLS alert."""
    data = b""
    try:
        while chunk := sock.recv(4096):
            data += chunk
    except (ConnectionResetError, ssl.SSLError):
        pass
    return data[:1] in (b"", b"\x15")


# ---- identities ------------------------------------------------------------------------------


def test_pki_files_roles_and_refusals(tmp_path):
    written = init_ca(tmp_path / "p", hosts=["10.0.0.1", "ctl.example"])
    assert [p.name for p in written] == ["ca.crt", "ca.key", "controller.crt", "controller.key"]
    assert (tmp_path / "p/ca.key").stat().st_mode & 0o077 == 0  # private keys: owner only
    with pytest.raises(PkiError):
        init_ca(tmp_path / "p")  # a CA is never overwritten
    issue(tmp_path / "p", "job", "alice")
    refused = [("job", "alice"), ("wizard", "bob"), ("controller", "x"), ("agent", "../etc"),
               ("agent", "controller"), ("agent", "a" * 65)]  # fmt: skip
    for role, name in refused:
        with pytest.raises(PkiError):
            issue(tmp_path / "p", role, name)
    with pytest.raises(PkiError):
        client_context(tmp_path / "p", "nobody")


def test_plain_tcp_and_foreign_certificates_get_no_answer(server, foreign_pki):
    with plain_socket(server.host, server.port) as s:  # an outsider speaking the API in clear
        s.sendall(pack_message({"v": 1, "op": "list"}))
        assert closed_without_reply(s)
    with pytest.raises((ssl.SSLError, ConnectionError, OSError)):
        # foreign client certificate; and the foreign CA does not trust our controller either
        tls_socket(server.host, server.port, foreign_pki, "operator1").recv(1)
    ctx = client_context(foreign_pki, "operator1")
    ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE  # ignore who the server is
    raw = socket.create_connection((server.host, server.port), timeout=5)
    with pytest.raises((ssl.SSLError, ConnectionError, OSError)):
        with ctx.wrap_socket(raw) as s:
            s.sendall(pack_message({"v": 1, "op": "list"}))
            assert read_message(s) is None
    assert server.controller.registry.coflows == {}


def test_a_client_verifies_the_controller(pki, foreign_pki):
    """A server with a certificate of another CA (or an agent's certificate) is refused."""
    impostor = Server(foreign_pki)  # a controller of another CA
    try:
        client = TerraClient(impostor.host, impostor.port, pki=pki, name="job1", timeout=1)
        with pytest.raises(ConnectionError):
            client.list_coflows()
    finally:
        impostor.stop()


def test_insecure_needs_to_be_explicit():
    with pytest.raises(ValueError):
        TerraClient("127.0.0.1", 1)


# ---- authorization on the API ------------------------------------------------------------------


def test_job_clients_see_and_change_only_their_own_coflows(server):
    alice, bob, op = server.client("job1"), server.client("job2"), server.client("operator1")
    mine = alice.submit_coflow([flow("f")])
    theirs = bob.submit_coflow([flow("g")])
    assert [c["id"] for c in alice.list_coflows()] == [mine]
    assert [c["id"] for c in bob.list_coflows()] == [theirs]
    assert sorted(c["id"] for c in op.list_coflows()) == [mine, theirs]
    for call in (
        lambda: bob.check_status(mine),
        lambda: bob.update_coflow(mine, [flow("evil", size=10**12)]),
        lambda: bob.cancel_coflow(mine),
    ):
        with pytest.raises(TerraError) as info:
            call()
        assert info.value.code == "unknown_coflow"  # same answer as for an id that does not exist
    assert [f["id"] for f in op.check_status(mine)["flows"]] == ["f"]
    assert alice.check_status(mine)["state"] not in ("cancelled", "failed")
    # Resubmitting under another client's id is refused too.
    with pytest.raises(TerraError):
        bob._call({"op": "submit", "coflow": mine, "flows": [flow("f")]})


@pytest.mark.parametrize("who", ["job1", "a1"])
def test_only_operators_change_the_wan(server, who):
    client = server.client(who)
    for call in (lambda: client.set_link_state("A", "B", False),
                 lambda: client.set_capacity("A", "B", 1.0)):  # fmt: skip
        with pytest.raises(TerraError) as info:
            call()
        assert info.value.code == "forbidden"
    assert server.controller.topology.down == set()
    assert server.client("operator1").set_link_state("A", "B", False) is True


def test_agents_cannot_submit(server):
    with pytest.raises(TerraError) as info:
        server.client("a1").submit_coflow([flow("f")])
    assert info.value.code == "forbidden"
    assert server.controller.registry.coflows == {}


def test_a_ref_replays_only_for_the_client_that_sent_it(server):
    """Request refs are per client: another client reusing a ref gets its own execution,
    not the first client's reply (which would disclose its coflow id)."""
    replies = []
    for name in ("job1", "job2"):
        with server.connect(name) as s:
            s.sendall(pack_message({"v": 1, "op": "submit", "ref": "r", "flows": [flow("f")]}))
            replies.append(read_message(s))
    assert [r["coflow"] for r in replies] == [0, 1]


# ---- bounded resources --------------------------------------------------------------------------


def test_a_slow_request_is_cut_off_by_its_deadline(server):
    server.handler.frame_timeout_s = 1.0
    with server.connect("job1") as s:
        body = pack_message({"v": 1, "op": "list"})
        start = time.monotonic()
        s.sendall(body[:1])
        with pytest.raises((OSError, AssertionError)):
            for byte in body[1:]:  # one byte every 0.2 s: each recv is quick, the frame is not
                time.sleep(0.2)
                s.sendall(bytes([byte]))
            assert read_message(s) is None
        assert time.monotonic() - start < 10
    with server.client("job1") as c:  # others are still served
        assert c.list_coflows() == []


def test_a_slow_handshake_is_cut_off(pki):
    srv = Server(pki, handshake_s=1.0)
    try:
        with plain_socket(srv.host, srv.port, timeout=10) as s:
            start = time.monotonic()
            s.sendall(b"\x16")  # the first byte of a TLS record, then nothing more
            assert closed_without_reply(s)
            assert time.monotonic() - start < 5
    finally:
        srv.stop()


def test_an_oversized_frame_is_refused_before_its_body_is_read(server):
    with server.connect("job1") as s:
        s.sendall(struct.pack(">I", 32 << 20 | 1 << 26))  # > 64 MiB announced, nothing sent
        reply = read_message(s)
    assert reply["ok"] is False and reply["code"] == "bad_message"


def test_per_address_cap_and_idle_connections_do_not_lock_clients_out(pki):
    """1000 idle TCP connections (no byte sent) from four addresses, 260 more from a fifth
    (over its cap of 256: refused at once): a new client's request is still answered."""
    srv = Server(pki, handshake_s=60.0)
    idle = []
    try:
        for i in range(1000):
            s = socket.socket()
            s.bind((f"127.0.0.{2 + i % 4}", 0))
            s.connect((srv.host, srv.port))
            idle.append(s)
        over = []
        for _ in range(260):
            s = socket.socket()
            s.bind(("127.0.0.9", 0))
            s.connect((srv.host, srv.port))
            over.append(s)
        idle += over
        start = time.monotonic()
        with srv.client("job1", timeout=10) as c:
            assert c.submit_coflow([flow("f")]) == 0
        assert time.monotonic() - start < 60  # not by timeouts: idle ones hold their slots
        poller = select.poll()
        for s in over:
            poller.register(s, select.POLLIN)
        time.sleep(0.5)
        closed = [fd for fd, _ in poller.poll(1000)]
        assert len(closed) == 4  # 260 - 256 closed at once; the others are waited for
    finally:
        for s in idle:
            s.close()
        srv.stop()


# ---- the agent channel ------------------------------------------------------------------------


def test_an_agent_reports_only_on_its_own_flows(channel):  # noqa: F811
    controller, chan, addr = channel
    a1, b1 = Agent(addr, "a1", "A", 30000), Agent(addr, "b1", "B", 31000)
    c1 = Agent(addr, "c1", "C", 32000)
    for agent in (a1, b1, c1):
        agent.wait_for(lambda m: m["t"] == "registered")
    cid = controller.submit([{"id": "f", "src": "a1", "dst": "b1", "bytes": 100_000_000}])
    coflow = controller.registry.get(cid)
    k = protocol.report_tag(coflow.flows["f"].digest_key)  # even with the attempt's tag:
    # c1 is no endpoint: its reports change nothing.
    c1.send(protocol.progress_message([(str(cid), "f", 100_000_000, k)]))
    c1.send(protocol.complete_message(str(cid), "f", "ab" * 32, 100_000_000, k))
    # a1 is the sender: it may report progress, but only the receiver completes a flow.
    a1.send(protocol.progress_message([(str(cid), "f", 16_000_000, k)]))
    a1.send(protocol.complete_message(str(cid), "f", "ab" * 32, 100_000_000, k))
    deadline = time.monotonic() + 5
    while coflow.flows["f"].delivered != 16_000_000 and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.2)
    assert coflow.flows["f"].delivered == 16_000_000
    assert not coflow.flows["f"].done and coflow.state != "done"
    b1.send(protocol.complete_message(str(cid), "f", "ab" * 32, 100_000_000, k))
    deadline = time.monotonic() + 5
    while coflow.state != "done" and time.monotonic() < deadline:
        time.sleep(0.01)
    assert coflow.state == "done"


def test_a_job_certificate_cannot_register_as_an_agent(channel):  # noqa: F811
    controller, chan, addr = channel
    intruder = Agent(addr, "job1", "A", 30500, cert="job1")  # issued with role "job"
    deadline = time.monotonic() + 5
    while not intruder.closed and time.monotonic() < deadline:
        time.sleep(0.01)
    assert intruder.closed and "job1" not in controller.registry.agents


def test_acks_of_unknown_messages_are_not_kept(channel):  # noqa: F811
    controller, chan, addr = channel
    a1 = Agent(addr, "a1", "A", 30000)
    a1.wait_for(lambda m: m["t"] == "registered")
    before = len(chan.acks)
    for i in range(1500):
        a1.send({"t": "ack", "id": 10**9 + i})
    a1.send({"t": "heartbeat"})
    time.sleep(0.5)
    assert len(chan.acks) <= before + 2  # only ids the controller sent are recorded


def test_the_agent_refuses_a_controller_of_another_ca(pki, foreign_pki, tmp_path):
    """terra-agent with our PKI never registers with a controller holding another CA's
    certificate (it keeps retrying)."""
    import trio

    from terra_agent.agent import Agent as TerraAgent
    from terra_agent.agent import AgentConfig
    from terra_controller.agent_channel import AgentChannel, start_agent_server
    from terra_controller.controller import Controller
    from terra_controller.tunnel_table import TunnelTable
    from terra_core.terra_policy import TerraPolicy
    from terra_security.pki import server_context
    from topologies import Topology

    topo = Topology("two", ["A", "B"], {("A", "B"): 1e8, ("B", "A"): 1e8})
    controller = Controller(topo, TerraPolicy(topo, k=1))
    chan = AgentChannel(controller, TunnelTable(topo, 1))
    listener, _, (host, port) = start_agent_server(
        chan, "127.0.0.1", 0, ServerSecurity(server_context(foreign_pki)), daemon_spawn
    )

    async def run():
        config = AgentConfig((host, port), "A", "a1", ("127.0.0.31", 0), str(tmp_path),
                             tls=client_context(pki, "a1"))  # fmt: skip
        with trio.move_on_after(2):
            await TerraAgent(config).run()

    try:
        trio.run(run)
        assert "a1" not in controller.registry.agents
    finally:
        listener.close()


def test_role_enum_values_are_the_certificate_units():
    assert {r.value for r in Role} == {"controller", "agent", "job", "operator"}


def test_threads_do_not_pile_up_after_refused_connections(server):
    before = threading.active_count()
    for _ in range(50):
        with plain_socket(server.host, server.port) as s:
            s.sendall(b"GET / HTTP/1.0\r\n\r\n")
            closed_without_reply(s)
    time.sleep(0.5)
    assert threading.active_count() <= before + 5


def test_a_request_of_nested_maps_is_refused_without_being_built():
    """Found by fuzzing: a msgpack body of 1 MiB of empty maps decoded as a plain map costs
    ~70 MiB. Requests decode straight into their typed shape, so such a body fails at its
    first misplaced value: the peak allocation stays near the body's own size."""
    import tracemalloc

    import msgpack

    from terra_wire.api import INVALID, decode_request

    for field in ("req", "flows", "coflow"):
        body = msgpack.packb({"v": 1, "op": "submit", field: [{}] * (1 << 20)})
        tracemalloc.start()
        try:
            decoded = decode_request(body)
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert INVALID in decoded
        assert peak < 4 * len(body), (field, peak)


def test_idle_connections_do_not_lock_agents_out_of_the_channel(channel):  # noqa: F811
    """The agent channel goes through the same admission as the API: 600 idle TCP
    connections (no byte sent) from three addresses, then a real agent registers."""
    controller, chan, addr = channel
    idle = []
    try:
        for i in range(600):
            s = socket.socket()
            s.bind((f"127.0.0.{2 + i % 3}", 0))
            s.connect(tuple(addr))
            idle.append(s)
        start = time.monotonic()
        agent = Agent(addr, "a1", "A", 30000)
        agent.wait_for(lambda m: m["t"] == "registered")
        assert time.monotonic() - start < 5  # before any handshake deadline freed a slot
        assert "a1" in controller.registry.agents
    finally:
        for s in idle:
            s.close()


def test_a_request_with_a_non_utf8_string_closes_only_that_connection(server):
    """Found by fuzzing: invalid UTF-8 inside a msgpack str escaped the decoder and killed
    the connection's thread; it is now a malformed message like any other."""
    body = b"\x81\xa2op\xa2\x92x"  # {"op": <2-byte str that is not UTF-8>}
    with server.connect("job1") as s:
        s.sendall(struct.pack(">I", len(body)) + body)
        reply = read_message(s)
    assert reply["ok"] is False and reply["code"] == "bad_message"
    with server.client("job1") as c:
        assert c.list_coflows() == []
