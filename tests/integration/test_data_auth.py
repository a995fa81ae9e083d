"""Authenticated data connections between agents (terra_security/data_auth.py).

Agents a, b with certificates of one CA (and c, a third agent's certificate, and j, a job's)
run in-process under the loopback harness with data contexts; the controller channel stays
plain (the in-test controller peer). Rogue peers connect to b's tunnel port by hand. With
`keys=True` the controller peer also hands out pair keys (terra_security/data_keys.py): the
agents then authenticate with them instead of TLS; the TLS attacks above must still fail.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import ssl
from contextlib import asynccontextmanager

import pytest
import trio
import trio.testing

from benchmarks.harness import LoopbackHarness
from overlay.framing import FrameReader, FrameWriter
from terra_agent.sources import synthetic_digest
from terra_security.data_auth import (
    KEY_TAG,
    NONCE_BYTES,
    DataAuthError,
    authenticate,
    key_authenticate_receiver,
    key_authenticate_sender,
)
from terra_security.data_auth import MAC_BYTES as PROOF_BYTES
from terra_security.data_keys import DataKeys
from terra_security.integrity import MAC_BYTES
from terra_security.pki import (
    PkiError,
    Role,
    data_client_context,
    data_server_context,
    init_ca,
    issue,
)
from terra_wire.control import GroupRates, ProtocolError, parse_pair_keys, validate_control
from terra_wire.frames import chunk_header

MB = 1_000_000
MAC = bytes(MAC_BYTES)  # a well-formed MAC, not made with any flow's key
TIMEOUT = 30


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    d = tmp_path_factory.mktemp("pki")
    init_ca(d)
    for name in ("a", "b", "c"):
        issue(d, Role.AGENT, name)
    issue(d, Role.JOB, "j")
    return d


@pytest.fixture(scope="module")
def foreign_pki(tmp_path_factory):
    d = tmp_path_factory.mktemp("foreign")
    init_ca(d)
    issue(d, Role.AGENT, "a")
    return d


@asynccontextmanager
async def loopback(tmp_path, pki, keys=False):
    """Controller peer + agents a (HK) and b (LA) with certificates, one tunnel a -> b; with
    `keys`, the controller peer hands out pair keys (h.controller.data_keys)."""
    async with trio.open_nursery() as nursery:
        h = LoopbackHarness(nursery, tmp_path, pki=pki)
        if keys:
            h.controller.data_keys = DataKeys()
        await h.start()
        await h.add_agent("a", "HK")
        await h.add_agent("b", "LA")
        h.tunnels = (await h.install_tunnels([("a", "b", 1)]))["a"]
        yield h
        nursery.cancel_scope.cancel()


async def send_rates(h, flow):
    paths = {t.tunnel: 1e12 for t in h.tunnels}
    await h.controller.set_rates("a", [GroupRates(flow.coflow, "LA", paths)])


async def announce(h, flow):
    """Give b (and a) the flow's descriptor, without rates: a sends nothing yet."""
    await h.controller.add_flows([flow])
    with trio.fail_after(TIMEOUT):
        while flow.key not in h.agents["b"].agent.in_flows:
            await trio.sleep(0.01)


async def send_hello_and_chunks(stream, agent, tunnel, flow):
    """Send "hello" naming `agent`, then chunks at offsets 0 and 100000 of `flow`; then wait
    until the receiver closes the connection (True) or TIMEOUT."""
    writer = FrameWriter(stream)
    data = b"x" * 1000
    try:
        await writer.send({"t": "hello", "agent": agent, "tunnel": tunnel})
        for offset in (0, 100_000):
            await writer.send(chunk_header(flow.coflow, flow.flow, offset, data, MAC), data)
        with trio.fail_after(TIMEOUT):
            while await stream.receive_some(1 << 16):
                pass
    except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
        pass
    return True


def assert_nothing_delivered(h, flow):
    b = h.agents["b"].agent
    inflow = b.in_flows[flow.key]
    assert inflow.delivered == 0 and inflow.acknowledged == 0
    assert inflow._reorder is None or inflow._reorder.held_bytes == 0
    assert inflow._reorder is None or inflow._reorder.spilled_bytes == 0
    assert b.pending.held_bytes == 0
    assert flow.key not in h.controller.completed


async def complete_from_a(h, flow):
    """The real sender still gets the flow through afterwards."""
    await send_rates(h, flow)
    with trio.fail_after(TIMEOUT):
        await h.controller.wait_until(lambda: flow.key in h.controller.completed)
    assert h.controller.completed[flow.key] == synthetic_digest(
        flow.coflow, flow.flow, flow.size, flow.digest_key
    )


def tunnel_port(h):
    return h.agents["b"].host, h.tunnels[0].port


async def test_agents_with_certificates_move_a_flow(tmp_path, pki):
    async with loopback(tmp_path, pki) as h:
        flow = h.flow("c1", "f1", "a", "b", 5 * MB + 17)
        await announce(h, flow)
        await complete_from_a(h, flow)
        link = h.agents["a"].agent.links[("b", h.tunnels[0].tunnel)]
        assert link.connects >= 1
        assert h.agents["b"].agent.unauthenticated == 0
        assert h.agents["b"].agent.closed_connections == 0


async def test_plain_tcp_peer_is_refused_before_any_chunk(tmp_path, pki):
    async with loopback(tmp_path, pki) as h:
        flow = h.flow("c1", "f1", "a", "b", 1 * MB)
        await announce(h, flow)
        stream = await trio.open_tcp_stream(*tunnel_port(h))
        async with stream:
            await send_hello_and_chunks(stream, "a", h.tunnels[0].tunnel, flow)
        b = h.agents["b"].agent
        assert b.unauthenticated == 1
        assert_nothing_delivered(h, flow)
        await complete_from_a(h, flow)


async def rogue_tls(h, directory, name, expected="b"):
    """A TLS data connection to b's tunnel port with `name`'s certificate from `directory`,
    authenticated and unwrapped as an agent does it; returns (plain stream, trailing)."""
    stream = await trio.open_tcp_stream(*tunnel_port(h))
    ctx = data_client_context(directory, name)
    _, trailing, _ = await authenticate(stream, ctx, server_side=False, expected_peer=expected)
    return stream, trailing


async def test_a_valid_agent_naming_another_in_hello_is_refused(tmp_path, pki):
    async with loopback(tmp_path, pki) as h:
        flow = h.flow("c1", "f1", "a", "b", 1 * MB)
        await announce(h, flow)
        stream, trailing = await rogue_tls(h, pki, "c")
        assert trailing == b""
        async with stream:
            await send_hello_and_chunks(stream, "a", h.tunnels[0].tunnel, flow)
        b = h.agents["b"].agent
        assert b.unauthenticated == 1 and b.closed_connections == 1
        assert_nothing_delivered(h, flow)
        await complete_from_a(h, flow)


async def test_chunks_from_an_agent_that_is_not_the_flows_sender_are_refused(tmp_path, pki):
    async with loopback(tmp_path, pki) as h:
        flow = h.flow("c1", "f1", "a", "b", 1 * MB)
        await announce(h, flow)
        stream, _ = await rogue_tls(h, pki, "c")
        async with stream:
            await send_hello_and_chunks(stream, "c", h.tunnels[0].tunnel, flow)
        b = h.agents["b"].agent
        assert b.unauthenticated == 0  # c is who it says it is ...
        assert b.closed_connections == 1  # ... but not the flow's sender
        assert_nothing_delivered(h, flow)
        await complete_from_a(h, flow)


async def test_chunks_held_before_the_descriptor_from_a_wrong_sender_are_dropped(tmp_path, pki):
    async with loopback(tmp_path, pki) as h:
        flow = h.flow("c1", "f1", "a", "b", 1 * MB)
        b = h.agents["b"].agent
        stream, _ = await rogue_tls(h, pki, "c")
        async with stream:
            writer = FrameWriter(stream)
            data = b"y" * 1000
            await writer.send({"t": "hello", "agent": "c", "tunnel": h.tunnels[0].tunnel})
            await writer.send(chunk_header(flow.coflow, flow.flow, 0, data, MAC), data)
            with trio.fail_after(TIMEOUT):
                while b.pending.held_bytes == 0:
                    await trio.sleep(0.01)
            await announce(h, flow)
            with trio.fail_after(TIMEOUT):
                while b.closed_connections == 0:
                    await trio.sleep(0.01)
        assert_nothing_delivered(h, flow)
        await complete_from_a(h, flow)


async def test_a_certificate_of_another_ca_is_refused(tmp_path, pki, foreign_pki):
    async with loopback(tmp_path, pki) as h:
        flow = h.flow("c1", "f1", "a", "b", 1 * MB)
        await announce(h, flow)
        ctx = data_client_context(foreign_pki, "a")
        ctx.verify_mode = ssl.CERT_NONE  # the rogue does not care who b is
        stream = await trio.open_tcp_stream(*tunnel_port(h))
        async with stream:
            with pytest.raises(DataAuthError):
                await authenticate(stream, ctx, server_side=False)
        b = h.agents["b"].agent
        with trio.fail_after(TIMEOUT):
            while b.unauthenticated == 0:
                await trio.sleep(0.01)
        assert_nothing_delivered(h, flow)
        await complete_from_a(h, flow)


async def serve_once(ctx, task_status=trio.TASK_STATUS_IGNORED):
    """A TLS data server on an ephemeral loopback port; records what its handshakes gave."""
    results = []
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    port = listeners[0].socket.getsockname()[1]

    async def handle(stream):
        async with stream:
            try:
                identity, trailing, _ = await authenticate(stream, ctx, server_side=True)
                reader = FrameReader(stream, initial=trailing)
                results.append((identity, await reader.read()))
            except DataAuthError as exc:
                results.append(exc)

    task_status.started((port, results))
    await trio.serve_listeners(handle, listeners)


async def test_the_sender_checks_the_receivers_name_and_role(pki):
    """The client side refuses a valid certificate of the wrong agent, and a job's."""
    async with trio.open_nursery() as nursery:
        for server_name, error in (("c", "expected 'b'"), ("b", None)):
            port, results = await nursery.start(serve_once, data_server_context(pki, server_name))
            stream = await trio.open_tcp_stream("127.0.0.1", port)
            async with stream:
                if error:
                    with pytest.raises(DataAuthError, match=error):
                        await authenticate(
                            stream, data_client_context(pki, "a"), False, expected_peer="b"
                        )
                else:
                    identity, trailing, _ = await authenticate(
                        stream, data_client_context(pki, "a"), False, expected_peer="b"
                    )
                    assert identity.name == "b" and trailing == b""
                    await FrameWriter(stream).send({"t": "hello", "agent": "a", "tunnel": "t"})
                    with trio.fail_after(TIMEOUT):
                        while not results:
                            await trio.sleep(0.01)
                    identity, (header, _) = results[-1]
                    assert identity.name == "a" and header["agent"] == "a"
        # a job's certificate is not an agent's: refused on the receiving side
        port, results = await nursery.start(serve_once, data_server_context(pki, "b"))
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        async with stream:
            with pytest.raises(DataAuthError):
                await authenticate(stream, data_client_context(pki, "j"), False, "b")
        with trio.fail_after(TIMEOUT):
            while not results:
                await trio.sleep(0.01)
        assert isinstance(results[0], DataAuthError) and "not agent" in str(results[0])
        nursery.cancel_scope.cancel()


def test_agent_certificates_serve_and_old_ones_are_refused(pki, tmp_path):
    """Agent certificates carry serverAuth; a certificate without it gets a clear error."""
    assert isinstance(data_server_context(pki, "a"), ssl.SSLContext)
    with pytest.raises(PkiError, match="serverAuth"):
        data_server_context(pki, "j")  # clientAuth only, like agents' before this change


async def test_frame_reader_reads_initial_bytes_first():
    """Bytes left over by the TLS layer are read before the socket's."""
    left, right = trio.testing.memory_stream_pair()
    writer = FrameWriter(left)
    await writer.send({"t": "hello", "agent": "a", "tunnel": "t"})
    await writer.send(chunk_header("c", "f", 0, b"abc", MAC), b"abc")
    raw = await right.receive_some(1 << 16)
    cut = len(raw) - 5  # the first frame and part of the second arrived with the handshake
    reader = FrameReader(right, initial=raw[:cut])
    header, _ = await reader.read()
    assert header["agent"] == "a"
    async with trio.open_nursery() as nursery:
        nursery.start_soon(left.send_all, raw[cut:])
        header, payload = await reader.read()
    assert header["t"] == "chunk" and bytes(payload) == b"abc"


def test_terra_agent_refuses_a_certificate_without_server_auth(pki, capsys):
    from terra_agent.cli import main

    argv = ["--controller", "127.0.0.1:9", "--dc", "X", "--data-addr", "127.0.0.1:9"]
    assert main([*argv, "--id", "j", "--pki", str(pki)]) == 2
    assert "serverAuth" in capsys.readouterr().err


# ---- pair keys (terra_security/data_keys.py) ----------------------------------------------


def proof(key, role, sender, receiver, nonce_s, nonce_r):
    """What an honest end computes (data_auth._mac), written out independently."""
    parts = [role]
    for name in (sender, receiver):
        parts += [bytes([len(name)]), name.encode()]
    return hmac.new(key, b"".join([*parts, nonce_s, nonce_r]), hashlib.sha256).digest()


async def read_exact(stream, n):
    buf = b""
    while len(buf) < n:
        data = await stream.receive_some(n - len(buf))
        if not data:
            return None
        buf += data
    return buf


async def key_rogue(h, name, key, answer=None):
    """Open a pair-key connection to b's tunnel port naming `name`; answer b's challenge with
    answer(nonce_s, nonce_r, b's proof) (default: the proof `key` gives). Returns the stream
    (still open unless b closed it) and what was sent, for replays."""
    stream = await trio.open_tcp_stream(*tunnel_port(h))
    nonce_s = os.urandom(NONCE_BYTES)
    first = KEY_TAG + bytes([len(name)]) + name.encode() + nonce_s
    await stream.send_all(first)
    reply = await read_exact(stream, NONCE_BYTES + PROOF_BYTES)
    assert reply is not None, "b closed before answering"
    nonce_r, b_proof = reply[:NONCE_BYTES], reply[NONCE_BYTES:]
    if answer is None:
        mine = proof(key, b"send", name, "b", nonce_s, nonce_r)
    else:
        mine = answer(nonce_s, nonce_r, b_proof)
    await stream.send_all(mine)
    return stream, first, mine


async def wait_refused(b, count=1):
    with trio.fail_after(TIMEOUT):
        while b.unauthenticated < count:
            await trio.sleep(0.01)


async def test_agents_with_pair_keys_move_a_flow_without_a_tls_handshake(tmp_path, pki):
    async with loopback(tmp_path, pki, keys=True) as h:
        flow = h.flow("c1", "f1", "a", "b", 5 * MB + 17)
        await announce(h, flow)
        await complete_from_a(h, flow)
        link = h.agents["a"].agent.links[("b", h.tunnels[0].tunnel)]
        assert link.key_auths >= 1 and link.tls_auths == 0
        b = h.agents["b"].agent
        assert b.unauthenticated == 0 and b.closed_connections == 0
        assert b.pair_keys["a"] == h.controller.data_keys.pair_key("a", "b")


@pytest.mark.parametrize("wrong", ["random", "c's key", "b's own proof", "replay"])
async def test_a_peer_without_the_pair_key_is_refused_before_any_chunk(tmp_path, pki, wrong):
    async with loopback(tmp_path, pki, keys=True) as h:
        flow = h.flow("c1", "f1", "a", "b", 1 * MB)
        await announce(h, flow)
        b = h.agents["b"].agent
        keys = h.controller.data_keys
        if wrong == "random":
            stream, _, _ = await key_rogue(h, "a", os.urandom(32))
        elif wrong == "c's key":  # a real agent's key with b, claiming to be a
            stream, _, _ = await key_rogue(h, "a", keys.pair_key("c", "b"))
        elif wrong == "b's own proof":  # reflect b's answer back as the sender's proof
            stream, _, _ = await key_rogue(h, "a", b"", answer=lambda s, r, p: p)
        else:  # the bytes of an accepted exchange, replayed on a new connection
            good, first, mine = await key_rogue(h, "a", keys.pair_key("a", "b"))
            await good.aclose()
            stream = await trio.open_tcp_stream(*tunnel_port(h))
            await stream.send_all(first)
            assert await read_exact(stream, NONCE_BYTES + PROOF_BYTES) is not None
            await stream.send_all(mine)
        async with stream:
            await send_hello_and_chunks(stream, "a", h.tunnels[0].tunnel, flow)
        await wait_refused(b)
        assert b.unauthenticated == 1
        assert_nothing_delivered(h, flow)
        await complete_from_a(h, flow)


async def test_a_key_authenticated_agent_may_not_send_another_agents_chunks(tmp_path, pki):
    async with loopback(tmp_path, pki, keys=True) as h:
        await h.add_agent("c", "NY")  # c registers: b's next tables carry K(b, c)
        h.tunnels = (await h.install_tunnels([("a", "b", 1)]))["a"]
        flow = h.flow("c1", "f1", "a", "b", 1 * MB)
        await announce(h, flow)
        b = h.agents["b"].agent
        assert "c" in b.pair_keys
        stream, _, _ = await key_rogue(h, "c", h.controller.data_keys.pair_key("c", "b"))
        async with stream:
            await send_hello_and_chunks(stream, "c", h.tunnels[0].tunnel, flow)
        assert b.unauthenticated == 0  # c proved it is c ...
        assert b.closed_connections == 1  # ... but is not the flow's sender
        assert_nothing_delivered(h, flow)
        await complete_from_a(h, flow)


async def test_an_unknown_sender_name_gets_no_challenge(tmp_path, pki):
    async with loopback(tmp_path, pki, keys=True) as h:
        stream = await trio.open_tcp_stream(*tunnel_port(h))
        async with stream:
            await stream.send_all(KEY_TAG + b"\x01z" + os.urandom(NONCE_BYTES))
            assert await read_exact(stream, 1) is None  # closed, nothing sent
        await wait_refused(h.agents["b"].agent)


async def test_the_sender_refuses_a_receiver_without_the_key(pki):
    """A listener that does not hold K(a, b) cannot pass as b; one that does can."""
    keys = DataKeys()
    results = []

    async def handle(stream, key):
        async with stream:
            try:
                results.append(await key_authenticate_receiver(stream, "b", {"a": key}.get))
            except DataAuthError as exc:
                results.append(exc)

    async with trio.open_nursery() as nursery:
        for key, ok in ((keys.pair_key("a", "c"), False), (keys.pair_key("a", "b"), True)):
            listeners = await nursery.start(trio.serve_tcp, lambda s, k=key: handle(s, k), 0)
            port = listeners[0].socket.getsockname()[1]
            stream = await trio.open_tcp_stream("127.0.0.1", port)
            async with stream:
                if ok:
                    await key_authenticate_sender(stream, "a", "b", keys.pair_key("a", "b"))
                    await stream.send_all(b"hello")
                    with trio.fail_after(TIMEOUT):
                        while len(results) < 2:
                            await trio.sleep(0.01)
                    name, initial, _ = results[-1]
                    assert name == "a" and initial in (b"", b"hello"[: len(initial)])
                else:
                    with pytest.raises(DataAuthError, match="wrong pair key"):
                        await key_authenticate_sender(stream, "a", "b", keys.pair_key("a", "b"))
        nursery.cancel_scope.cancel()


async def test_a_sender_falls_back_to_tls_when_the_receiver_lacks_its_key(tmp_path, pki):
    async with loopback(tmp_path, pki, keys=True) as h:
        b = h.agents["b"].agent
        b.pair_keys = {}  # b has not got its table with K(a, b) yet (e.g. a new controller)
        flow = h.flow("c1", "f1", "a", "b", 1 * MB)
        await announce(h, flow)
        b.pair_keys = {}
        link = h.agents["a"].agent.links[("b", h.tunnels[0].tunnel)]
        link.fail()  # reconnect now, against b without the key
        await complete_from_a(h, flow)
        assert link.tls_auths >= 1
        assert b.unauthenticated >= 1  # the key attempt was refused
        assert b.closed_connections == b.unauthenticated  # and nothing else went wrong


@pytest.mark.parametrize("key", ["ab" * 31, "AB" * 32, "zz" * 32, 7])
def test_a_tunnels_message_with_a_malformed_key_is_refused(key):
    msg = {"t": "tunnels", "tunnels": [], "listen": [], "keys": {"b": key}}
    with pytest.raises(ProtocolError):
        validate_control(msg)
    msg["keys"] = {"b": "ab" * 32}
    assert parse_pair_keys(validate_control(msg)) == {"b": bytes.fromhex("ab" * 32)}


def test_pair_keys_are_symmetric_per_pair_and_per_master():
    keys = DataKeys(b"m" * 32)
    assert keys.pair_key("a", "b") == keys.pair_key("b", "a")
    assert len(keys.pair_key("a", "b")) == 32
    assert keys.pair_key("a", "b") != keys.pair_key("a", "c")
    assert keys.pair_key("ab", "c") != keys.pair_key("a", "bc")  # names are length-prefixed
    assert DataKeys(b"n" * 32).pair_key("a", "b") != keys.pair_key("a", "b")
    assert keys.keys_for("a", ["a", "b"]) == {"b": keys.pair_key("a", "b").hex()}
    with pytest.raises(ValueError):
        DataKeys(b"short")
    with pytest.raises(ValueError):
        keys.pair_key("a", "a")


async def test_encrypting_agents_seal_after_a_pair_key_or_tls_and_refuse_plain_frames(
    tmp_path, pki
):
    """With --encrypt-data both authentications lead to AEAD records: a sender holding the
    pair key proves it and seals; after a failed key exchange it runs the TLS handshake and
    seals. A peer that proves the key and then sends a plain "hello" is refused."""
    async with trio.open_nursery() as nursery:
        h = LoopbackHarness(nursery, tmp_path, pki=pki, encrypt_data=True)
        h.controller.data_keys = DataKeys()
        await h.start()
        await h.add_agent("a", "HK")
        await h.add_agent("b", "LA")
        h.tunnels = (await h.install_tunnels([("a", "b", 1)]))["a"]
        flow = h.flow("c1", "f1", "a", "b", 1 * MB)
        await announce(h, flow)
        b = h.agents["b"].agent
        stream = await trio.open_tcp_stream(*tunnel_port(h))
        async with stream:
            key = h.controller.data_keys.pair_key("a", "b")
            await key_authenticate_sender(stream, "a", "b", key)
            refused = b.closed_connections
            await send_hello_and_chunks(stream, "a", h.tunnels[0].tunnel, flow)
        with trio.fail_after(TIMEOUT):
            while b.closed_connections == refused:
                await trio.sleep(0.01)
        await complete_from_a(h, flow)
        link = h.agents["a"].agent.links[("b", h.tunnels[0].tunnel)]
        assert link.key_auths >= 1
        again = h.flow("c1", "f2", "a", "b", 1 * MB)
        await announce(h, again)
        link._tls_next = True  # as after a failed key exchange
        link.fail()
        with trio.fail_after(TIMEOUT):
            while link.connects < 2:
                await trio.sleep(0.01)
        await complete_from_a(h, again)
        assert link.tls_auths >= 1, (link.connects, link.key_auths, link.tls_auths)
        nursery.cancel_scope.cancel()


async def test_a_sender_that_keeps_tls_on_the_connection_is_refused_by_name(tmp_path, pki, caplog):
    """An encrypting receiver and a sender that, after the handshake, sends its "hello" inside
    TLS (as agents did before sealed records): refused at once, with a message naming it."""
    async with trio.open_nursery() as nursery:
        h = LoopbackHarness(nursery, tmp_path, pki=pki, encrypt_data=True)
        await h.start()
        await h.add_agent("a", "HK")
        await h.add_agent("b", "LA")
        h.tunnels = (await h.install_tunnels([("a", "b", 1)]))["a"]
        b = h.agents["b"].agent
        before = b.unauthenticated
        stream = await trio.open_tcp_stream(*tunnel_port(h))
        tls = trio.SSLStream(stream, data_client_context(pki, "a"), server_hostname="b")
        async with tls:
            await tls.do_handshake()
            await FrameWriter(tls).send({"t": "hello", "agent": "a", "tunnel": "x"})
            with trio.fail_after(5):  # well before the 10 s handshake deadline
                await wait_refused(b, before + 1)
        assert "does not seal its data connection" in caplog.text
        nursery.cancel_scope.cancel()
