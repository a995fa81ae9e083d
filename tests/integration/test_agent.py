"""Agents over real TCP on loopback, driven by the in-test controller peer (benchmarks/harness.py).

Every transfer checks the receiver's result byte for byte (file sink vs source file) or by the
BLAKE2b digest the receiver reports, which it only reports when it equals the sender's.
"""

import os
from contextlib import asynccontextmanager

import pytest
import trio

from benchmarks.harness import LoopbackHarness, delay_proxy, free_port_block
from overlay.framing import FrameReader
from terra_agent.agent import Agent, AgentConfig
from terra_agent.sender import MIN_CHUNK_BYTES
from terra_agent.sources import synthetic_digest
from terra_agent.tcp_options import kernel_queued_bytes
from terra_security.integrity import LEAF_BYTES, flow_digest
from terra_wire.control import GroupRates, TunnelSpec, flows_message

MB = 1_000_000
UNLIMITED = 1e12
TIMEOUT = 60


@asynccontextmanager
async def loopback(tmp_path, k=4, **kw):
    """Controller peer + agents a (DC HK) and b (DC LA) with k tunnels a -> b."""
    async with trio.open_nursery() as nursery:
        h = LoopbackHarness(nursery, tmp_path, **kw)
        await h.start()
        await h.add_agent("a", "HK")
        await h.add_agent("b", "LA")
        h.tunnels = (await h.install_tunnels([("a", "b", k)]))["a"]
        yield h
        nursery.cancel_scope.cancel()


def source_file(tmp_path, size, name="src.bin"):
    path = tmp_path / name
    path.write_bytes(os.urandom(size))
    return path


async def start(h, flows, rates_per_tunnel):
    """Announce flows and set every tunnel of a -> b to the given rate(s) (bytes/s)."""
    await h.controller.add_flows(flows)
    if not isinstance(rates_per_tunnel, list):
        rates_per_tunnel = [rates_per_tunnel] * len(h.tunnels)
    paths = {t.tunnel: r for t, r in zip(h.tunnels, rates_per_tunnel, strict=False)}
    await h.controller.set_rates("a", [GroupRates(flows[0].coflow, "LA", paths)])


async def wait_complete(h, flows):
    with trio.fail_after(TIMEOUT):
        await h.controller.wait_until(lambda: h.controller.all_complete([f.key for f in flows]))


async def wait_acked(h, key, nbytes):
    """Wait until the sender agent a has nbytes of the flow acknowledged."""
    with trio.fail_after(TIMEOUT):
        while h.agents["a"].agent.out_flows[key].acked < nbytes:
            await trio.sleep(0.01)


def file_digest(path, key):
    """The flow digest of a file's bytes under flow key `key`."""
    return flow_digest(key, path.read_bytes())


def files(src, dst):
    """Source / sink descriptors of files in the agents' data root (the harness's tmp_path)."""
    return {"source": f"file:{src.name}", "sink": f"file:{dst.name}"}


async def test_file_to_file_over_four_tunnels(tmp_path):
    size = 6 * MB + 12345  # not a multiple of any chunk size
    src = source_file(tmp_path, size)
    dst = tmp_path / "dst.bin"
    async with loopback(tmp_path) as h:
        f = h.flow("c1", "f1", "a", "b", size, **files(src, dst))
        await start(h, [f], 5 * MB)  # equal rates: every path sends (earliest completion first)
        await wait_complete(h, [f])
        group = h.agents["a"].agent.groups[("c1", "LA")]
    assert dst.read_bytes() == src.read_bytes()
    assert h.controller.completed[f.key] == file_digest(src, f.digest_key)
    assert sum(group.sent_bytes.values()) == size  # nothing lost, nothing resent
    assert sum(1 for n in group.sent_bytes.values() if n > 0) >= 2  # really multipath


async def test_synthetic_flows_to_digest_sink_and_progress_reports(tmp_path):
    size = 3 * MB
    async with loopback(tmp_path, k=2) as h:
        flows = [h.flow("c1", f"f{i}", "a", "b", size) for i in range(3)]
        seen = set()

        async def watch():
            while True:
                seen.add(h.controller.acked.get(flows[0].key))
                await trio.sleep(0.05)

        h.nursery.start_soon(watch)
        await start(h, flows, 2.5 * MB)  # 9 MB over 5 MB/s: ~1.8 s
        await wait_complete(h, flows)
    for f in flows:
        assert h.controller.completed[f.key] == synthetic_digest("c1", f.flow, size, f.digest_key)
    # reports every 0.5 s: some strictly between 0 and size were seen
    assert any(v is not None and 0 < v < size for v in seen)


async def test_killed_tunnel_connection_resends_over_surviving_paths(tmp_path):
    size = 10 * MB
    src = source_file(tmp_path, size)
    dst = tmp_path / "dst.bin"
    async with loopback(tmp_path) as h:
        f = h.flow("c1", "f1", "a", "b", size, **files(src, dst))
        await start(h, [f], 2.5 * MB)  # 10 MB/s in all: ~1 s
        await wait_acked(h, f.key, 3 * MB)
        a, b = h.agents["a"].agent, h.agents["b"].agent
        dead = h.tunnels[0]
        b.stop_listening(dead.port)  # the path stays down: no reconnect possible
        assert b.close_incoming("a", dead.tunnel) == 1
        with trio.fail_after(TIMEOUT):
            while a.links[("b", dead.tunnel)].up:
                await trio.sleep(0.01)
        sent_dead = a.groups[("c1", "LA")].sent_bytes[dead.tunnel]
        await wait_complete(h, [f])
        assert a.groups[("c1", "LA")].sent_bytes[dead.tunnel] == sent_dead
        assert not a.links[("b", dead.tunnel)].up
    assert dst.read_bytes() == src.read_bytes()  # every byte once, in order
    assert h.controller.completed[f.key] == file_digest(src, f.digest_key)


async def test_controller_declares_tunnel_down(tmp_path):
    size = 10 * MB
    src = source_file(tmp_path, size)
    dst = tmp_path / "dst.bin"
    async with loopback(tmp_path) as h:
        f = h.flow("c1", "f1", "a", "b", size, **files(src, dst))
        await start(h, [f], 2.5 * MB)
        await wait_acked(h, f.key, 3 * MB)
        a = h.agents["a"].agent
        down, alive = h.tunnels[1], [t for t in h.tunnels if t != h.tunnels[1]]
        await h.controller.set_tunnels("a", alive, [])  # returns once a applied it
        await h.controller.set_rates(
            "a", [GroupRates("c1", "LA", {t.tunnel: 2.5 * MB for t in alive})]
        )
        assert ("b", down.tunnel) not in a.links
        sent_down = a.groups[("c1", "LA")].sent_bytes[down.tunnel]
        await wait_complete(h, [f])
        assert a.groups[("c1", "LA")].sent_bytes[down.tunnel] == sent_down
    assert dst.read_bytes() == src.read_bytes()


async def test_a_tunnel_that_comes_back_reuses_its_parked_connection(tmp_path):
    """Link down then up (the controller withdraws a tunnel and restores it, unchanged): the
    sender parks the idle connection and puts the same one back in use, with no new
    connection or authentication; the transfer over it is byte-exact."""
    size = 10 * MB
    src = source_file(tmp_path, size)
    dst = tmp_path / "dst.bin"
    async with loopback(tmp_path) as h:
        f = h.flow("c1", "f1", "a", "b", size, **files(src, dst))
        a, b = h.agents["a"].agent, h.agents["b"].agent
        await start(h, [f], 1 * MB)
        await wait_acked(h, f.key, 2 * MB)
        down = h.tunnels[1]
        key = ("b", down.tunnel)
        link = a.links[key]
        alive = [t for t in h.tunnels if t != down]
        await h.controller.set_tunnels("a", alive, [])
        assert key not in a.links and a.parked[key][0] is link and link.up
        await h.controller.set_tunnels("a", h.tunnels, [])  # back, unchanged
        assert a.links[key] is link and key not in a.parked and a.links_reused == 1
        assert link.connects == 1 and len(b.incoming[("a", down.tunnel)]) == 1  # the first one
        await start(h, [f], 2.5 * MB)
        await wait_complete(h, [f])
        assert link.sent_bytes > 0
    assert dst.read_bytes() == src.read_bytes()


async def test_a_parked_connection_that_ended_is_replaced_when_its_tunnel_returns(tmp_path):
    """The parked connection dies (the receiver aborts it): the link does not reconnect while
    parked, and when the tunnel returns a new link connects in its place."""
    async with loopback(tmp_path) as h:
        a, b = h.agents["a"].agent, h.agents["b"].agent
        down = h.tunnels[0]
        key = ("b", down.tunnel)
        with trio.fail_after(TIMEOUT):
            while not a.links[key].up:
                await trio.sleep(0.01)
        old = a.links[key]
        await h.controller.set_tunnels("a", h.tunnels[1:], [])
        assert a.parked[key][0] is old
        assert b.close_incoming("a", down.tunnel) == 1
        with trio.fail_after(TIMEOUT):
            while old.up:
                await trio.sleep(0.01)
        await trio.sleep(0.3)  # longer than the first reconnect backoff (50 ms)
        assert old.connects == 1 and not old.up
        await h.controller.set_tunnels("a", h.tunnels, [])
        new = a.links[key]
        assert new is not old and a.links_reused == 0 and key not in a.parked
        with trio.fail_after(TIMEOUT):
            while not new.up:
                await trio.sleep(0.01)


async def test_kernel_queued_bytes_counts_what_the_peer_has_not_acknowledged():
    """kernel_queued_bytes (SIOCOUTQ): > 0 while a peer that does not read leaves bytes
    unsent/unacknowledged, 0 once it has read them all (an idle connection)."""
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    port = listeners[0].socket.getsockname()[1]
    client = await trio.open_tcp_stream("127.0.0.1", port)
    server = await listeners[0].accept()
    blob = b"x" * (8 << 20)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(client.send_all, blob)  # blocks: the server does not read yet
        await trio.sleep(0.2)
        assert kernel_queued_bytes(client.socket) > 0
        got = 0
        while got < len(blob):
            got += len(await server.receive_some(1 << 20))
    with trio.fail_after(5):
        while kernel_queued_bytes(client.socket) != 0:
            await trio.sleep(0.01)
    await client.aclose()
    assert kernel_queued_bytes(client.socket) == -1  # closed
    await server.aclose()
    await listeners[0].aclose()


async def test_a_small_flow_is_left_to_its_fast_path(tmp_path):
    """Earliest completion first: 84 kB over paths at 1.15 MB/s and 141 kB/s (the testbed's
    split). A 64 KiB chunk on the slow path needs 65536 / 141228 = 0.46 s, the fast path sends
    all 83886 bytes in 83886 / 1.15e6 = 0.073 s: the slow path sends nothing."""
    size = 83886
    async with loopback(tmp_path, k=2) as h:
        f = h.flow("c1", "f1", "a", "b", size)
        a = h.agents["a"].agent
        with trio.fail_after(TIMEOUT):
            while not all(a.links[("b", t.tunnel)].up for t in h.tunnels):
                await trio.sleep(0.01)
        await start(h, [f], [1_150_000, 141_228])
        await wait_complete(h, [f])
        sent = a.groups[("c1", "LA")].sent_bytes
    assert sent[h.tunnels[0].tunnel] == size and sent[h.tunnels[1].tunnel] == 0
    assert h.controller.completed[f.key] == synthetic_digest("c1", "f1", size, f.digest_key)


async def test_a_large_flow_uses_its_slow_path_until_near_the_end(tmp_path):
    """8 MB over 4 MB/s and 1 MB/s: both paths send, the slow one about a fifth (24 of its
    64 KiB chunks when the paths keep their rates: the 25th would end after the fast path).

    The choice uses each path's pacing debt, so on a busy machine, where the fast path's
    pacing falls behind, the slow path may rightly send one chunk more; more than that
    means it kept sending chunks the fast path would have finished sooner."""
    size = 8 * MB
    async with loopback(tmp_path, k=2) as h:
        f = h.flow("c1", "f1", "a", "b", size)
        await start(h, [f], [4 * MB, 1 * MB])
        await wait_complete(h, [f])
        sent = h.agents["a"].agent.groups[("c1", "LA")].sent_bytes
    slow = sent[h.tunnels[1].tunnel]
    assert 0.1 * size < slow <= 0.2 * size + MIN_CHUNK_BYTES
    assert sum(sent.values()) == size


async def test_the_slow_path_takes_over_when_the_fast_one_dies(tmp_path):
    """The fast path's connection ends for good while the slow path is leaving it the bytes:
    the slow path sends the rest (no stall)."""
    size = 3 * MB
    async with loopback(tmp_path, k=2) as h:
        f = h.flow("c1", "f1", "a", "b", size)
        a, b = h.agents["a"].agent, h.agents["b"].agent
        fast, slow = h.tunnels
        await start(h, [f], [1 * MB, 0.2 * MB])
        await wait_acked(h, f.key, 2 * MB)
        b.stop_listening(fast.port)
        b.close_incoming("a", fast.tunnel)
        await wait_complete(h, [f])
        sent = a.groups[("c1", "LA")].sent_bytes
    assert sent[slow.tunnel] > 0.3 * MB
    assert h.controller.completed[f.key] == synthetic_digest("c1", "f1", size, f.digest_key)


async def test_sender_restart_resumes_from_acked_offset(tmp_path):
    size = 8 * MB
    src = source_file(tmp_path, size)
    dst = tmp_path / "dst.bin"
    async with loopback(tmp_path) as h:
        f = h.flow("c1", "f1", "a", "b", size, **files(src, dst))
        await start(h, [f], 2 * MB)  # ~1 s
        with trio.fail_after(TIMEOUT):
            await h.controller.wait_until(lambda: h.controller.acked.get(f.key, 0) >= 3 * MB)
        await h.stop_agent("a")
        await h.start_agent("a")  # re-registers; the controller re-sends tunnels, flows, rates
        resumed = h.agents["a"].agent.out_flows[f.key]
        assert resumed.spec.offset >= 3 * MB  # did not start over
        await wait_complete(h, [f])
        assert h.agents["b"].agent.in_flows[f.key].base == 0  # receiver kept its state
    assert dst.read_bytes() == src.read_bytes()
    assert h.controller.completed[f.key] == file_digest(src, f.digest_key)


@pytest.mark.parametrize("encrypt", [False, True])
async def test_receiver_restart_with_file_sink_resumes(tmp_path, pki, encrypt):
    """The receiving agent stops mid-flow and starts again: it resumes from its part file
    (re-hashing its leaves) and the sender from its offset, also over sealed records."""
    size = 8 * MB
    src = source_file(tmp_path, size)
    dst = tmp_path / "dst.bin"
    kw = {"pki": pki, "encrypt_data": True} if encrypt else {}
    async with loopback(tmp_path, **kw) as h:
        f = h.flow("c1", "f1", "a", "b", size, **files(src, dst))
        await start(h, [f], 2 * MB)
        with trio.fail_after(TIMEOUT):
            await h.controller.wait_until(lambda: h.controller.acked.get(f.key, 0) >= 3 * MB)
        await h.stop_agent("b")
        await h.start_agent("b")
        inflow = h.agents["b"].agent.in_flows[f.key]
        assert inflow.base >= 3 * MB  # resumed from the file it had written
        await wait_complete(h, [f])
    assert dst.read_bytes() == src.read_bytes()  # nothing lost or duplicated at the sink
    assert h.controller.completed[f.key] == file_digest(src, f.digest_key)


async def test_receiver_restart_with_digest_sink_rewinds_sender(tmp_path):
    size = 8 * MB
    async with loopback(tmp_path) as h:
        f = h.flow("c1", "f1", "a", "b", size)
        await start(h, [f], 2 * MB)
        await wait_acked(h, f.key, 3 * MB)
        await h.stop_agent("b")
        await h.start_agent("b")  # a digest sink keeps nothing: the flow must restart at 0
        await wait_complete(h, [f])
        assert h.agents["b"].agent.in_flows[f.key].base == 0
    assert h.controller.completed[f.key] == synthetic_digest("c1", "f1", size, f.digest_key)


@pytest.mark.parametrize("encrypt", [False, True])
async def test_subprocess_agents_sender_killed_and_restarted(tmp_path, pki, encrypt):
    """SIGKILL of the sending agent mid-flow: the restarted one resumes and every byte
    arrives (also over sealed records, --encrypt-data)."""
    size = 8 * MB
    src = source_file(tmp_path, size)
    dst = tmp_path / "dst.bin"
    async with trio.open_nursery() as nursery:
        kw = {"pki": pki, "encrypt_data": True} if encrypt else {}
        h = LoopbackHarness(nursery, tmp_path, **kw)
        await h.start()
        await h.add_agent("a", "HK", subprocess=True)
        await h.add_agent("b", "LA", subprocess=True)
        h.tunnels = (await h.install_tunnels([("a", "b", 3)]))["a"]
        f = h.flow("c1", "f1", "a", "b", size, **files(src, dst))
        await start(h, [f], 1.5 * MB)  # ~1.8 s
        with trio.fail_after(TIMEOUT):
            await h.controller.wait_until(lambda: h.controller.acked.get(f.key, 0) >= 2 * MB)
        await h.stop_agent("a")  # SIGKILL
        await h.start_agent("a", subprocess=True)
        await wait_complete(h, [f])
        nursery.cancel_scope.cancel()
    assert dst.read_bytes() == src.read_bytes()


async def test_striping_follows_rates_three_to_one(tmp_path):
    size = 8 * MB
    async with loopback(tmp_path, k=2) as h:
        f = h.flow("c1", "f1", "a", "b", size)
        await start(h, [f], [3 * MB, 1 * MB])  # ~2 s
        await wait_complete(h, [f])
        sent = h.agents["a"].agent.groups[("c1", "LA")].sent_bytes
    fast, slow = (sent[t.tunnel] for t in h.tunnels)
    assert fast + slow == size
    assert abs(fast / slow - 3) / 3 < 0.05, (fast, slow)


async def test_rate_zero_pauses_and_new_rates_apply(tmp_path):
    size = 4 * MB
    async with loopback(tmp_path, k=2) as h:
        f = h.flow("c1", "f1", "a", "b", size)
        await start(h, [f], 1 * MB)
        await wait_acked(h, f.key, 1 * MB)
        await h.controller.set_rates("a", [GroupRates("c1", "LA", {})])  # every path 0
        await trio.sleep(0.1)  # let chunks already in flight land
        flow = h.agents["a"].agent.out_flows[f.key]
        paused_at = flow.next_offset
        await trio.sleep(0.3)
        assert flow.next_offset == paused_at and not h.controller.all_complete([f.key])
        await h.controller.set_rates(
            "a", [GroupRates("c1", "LA", {h.tunnels[1].tunnel: UNLIMITED})]
        )
        await wait_complete(h, [f])
        sent = h.agents["a"].agent.groups[("c1", "LA")].sent_bytes
        assert sent[h.tunnels[1].tunnel] >= size - paused_at  # the rest went on tunnel 1


def frame(header: dict, payload: bytes = b"") -> bytes:
    import msgpack

    packed = msgpack.packb({"v": 1, "n": len(payload), **header})
    return len(packed).to_bytes(4, "big") + packed + payload


HELLO = frame({"t": "hello", "agent": "x", "tunnel": "t"})
HELLO_A = frame({"t": "hello", "agent": "a", "tunnel": "t"})  # the flow's sender (no PKI)
MAC = bytes(16)  # not the flow key's MAC of anything
BAD_INPUTS = {  # name: (bytes sent, what the agent's log must say)
    "malformed msgpack": (b"\x00\x00\x00\x03\xc1\xc1\xc1", "malformed msgpack"),
    "wrong version": (
        frame({"v": 2, "t": "hello", "agent": "x", "tunnel": "t"}),
        "unsupported frame version 2",
    ),
    "oversized header": ((2**31).to_bytes(4, "big") + b"x" * 100, "header length 2147483648"),
    "oversized payload": (
        HELLO + frame({"t": "chunk", "c": "c1", "f": "f1", "o": 0, "m": MAC, "n": 64 << 20}),
        "payload length 67108864",
    ),
    "bad MAC": (  # right sender, bytes not MACed with the flow's key: dropped
        HELLO_A + frame({"t": "chunk", "c": "c1", "f": "f1", "o": 0, "m": MAC}, bytes(LEAF_BYTES)),
        "MAC does not match",
    ),
    "unknown flow": (
        HELLO + frame({"t": "chunk", "c": "c9", "f": "nope", "o": 0, "m": MAC}, b"data"),
        "unknown flow c9/nope",
    ),
    "chunk from the wrong agent": (  # would corrupt c1/f1 if accepted
        HELLO + frame({"t": "chunk", "c": "c1", "f": "f1", "o": 0, "m": MAC}, b"data"),
        "its sender is 'a'",
    ),
    "first frame not hello": (
        frame({"t": "ack", "c": "c", "f": "f", "o": 0, "e": 1}),
        "first frame must be 'hello'",
    ),
    "disconnect mid-frame": (
        HELLO + frame({"t": "chunk", "c": "c1", "f": "f1", "o": 0, "m": MAC}, b"y" * 1000)[:-500],
        "closed mid-frame",
    ),
}


async def test_bad_input_closes_only_that_connection(tmp_path, caplog):
    size = 6 * MB
    async with loopback(tmp_path, k=2) as h:
        f = h.flow("c1", "f1", "a", "b", size)
        await start(h, [f], 3 * MB)  # ~1 s; runs while the garbage arrives
        b = h.agents["b"]
        b.agent.config.pending_timeout = 0.5  # chunks of the unknown flow are held this long
        for name, (data, reason) in BAD_INPUTS.items():
            before = b.agent.closed_connections
            caplog.clear()
            for port in (b.base_port, b.tunnel_port(0)):
                stream = await trio.open_tcp_stream(b.host, port)
                await stream.send_all(data)
                if name == "disconnect mid-frame":
                    await stream.send_eof()
                with trio.fail_after(10):  # the agent closes it: EOF (or reset) reaches us
                    try:
                        while await stream.receive_some(65536):
                            pass
                    except trio.BrokenResourceError:
                        pass
                await stream.aclose()
            assert b.agent.closed_connections == before + 2, name
            errors = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
            assert len(errors) == 2 and all(reason in e for e in errors), (name, errors)
        await wait_complete(h, [f])
        assert h.agents["a"].agent.links[("b", h.tunnels[0].tunnel)].connects == 1
    assert h.controller.completed[f.key] == synthetic_digest("c1", "f1", size, f.digest_key)


async def test_bad_control_message_gets_error_reply_and_channel_stays(tmp_path):
    async with loopback(tmp_path, k=1) as h:
        await h.controller.send("a", {"t": "rates", "rates": [{"coflow": "c"}]}, wait=False)
        with trio.fail_after(TIMEOUT):
            await h.controller.wait_until(lambda: h.controller.errors)
        assert "dst_dc" in h.controller.errors[0]["message"]
        f = h.flow("c1", "f1", "a", "b", 1 * MB)
        await start(h, [f], UNLIMITED)  # the same control session still works
        await wait_complete(h, [f])
        assert h.controller.registrations["a"] == 1


async def test_bad_flow_source_reports_error_and_other_flows_complete(tmp_path):
    async with loopback(tmp_path, k=2) as h:
        bad = h.flow("c1", "bad", "a", "b", 1000, source="file:missing")
        good = h.flow("c1", "good", "a", "b", 2 * MB)
        await start(h, [bad, good], UNLIMITED)
        await wait_complete(h, [good])
        errors = [e for e in h.controller.errors if e.get("flow") == "bad"]
        assert errors and "cannot open source file" in errors[0]["message"]
        assert h.controller.connected("a")


async def test_bytes_lost_on_a_failed_path_are_resent_on_the_others(tmp_path):
    """Tunnel 'bh' leads to a black hole that swallows chunks without acking them; when its
    connection dies, everything sent on it must reach b over the other tunnels."""
    size = 8 * MB
    src = source_file(tmp_path, size)
    dst = tmp_path / "dst.bin"
    async with loopback(tmp_path, k=2) as h:
        b = h.agents["b"]
        swallowed = 0
        conns = []

        async def black_hole(stream):
            nonlocal swallowed
            conns.append(stream)
            try:
                while data := await stream.receive_some(1 << 20):
                    swallowed += len(data)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                pass

        listeners = await trio.open_tcp_listeners(0, host=b.host)
        bh_port = listeners[0].socket.getsockname()[1]
        with trio.CancelScope() as bh_scope:
            h.nursery.start_soon(trio.serve_listeners, black_hole, listeners)
            bh = TunnelSpec("HK-LA-bh", "b", b.data_addr, ("HK", "bh", "LA"), bh_port)
            await h.controller.set_tunnels("a", [*h.tunnels, bh], [])
            h.tunnels = [*h.tunnels, bh]
            f = h.flow("c1", "f1", "a", "b", size, **files(src, dst))
            await start(h, [f], 2 * MB)  # 6 MB/s over three tunnels
            a = h.agents["a"].agent
            with trio.fail_after(TIMEOUT):
                while swallowed < 1 * MB:
                    await trio.sleep(0.01)
            assert not h.controller.all_complete([f.key])  # b cannot finish without those bytes
            lost = a.groups[("c1", "LA")].sent_bytes["HK-LA-bh"]
            await h.controller.set_rates(
                "a", [GroupRates("c1", "LA", {t.tunnel: 2 * MB for t in h.tunnels[:2]})]
            )
            for stream in conns:  # the path dies
                stream.socket.close()
            bh_scope.cancel()
        await wait_complete(h, [f])
        sent = a.groups[("c1", "LA")].sent_bytes
    assert lost >= 1 * MB - 200_000
    assert sum(sent.values()) >= size + lost - 200_000  # the lost bytes went out again
    assert dst.read_bytes() == src.read_bytes()


async def test_control_channel_loss_keeps_data_moving_and_reregisters_with_inflight(tmp_path):
    size = 6 * MB
    async with loopback(tmp_path, k=2) as h:
        f = h.flow("c1", "f1", "a", "b", size)
        await start(h, [f], 2 * MB)  # ~1.5 s
        await wait_acked(h, f.key, 1 * MB)
        h.controller.drop("a")
        h.controller.drop("b")
        with trio.fail_after(TIMEOUT):
            await h.controller.wait_until(
                lambda: (
                    h.controller.registrations["a"] == 2 and h.controller.registrations["b"] == 2
                )
            )
        sent = h.controller.register_msgs["a"]["inflight"]
        received = h.controller.register_msgs["b"]["inflight"]
        assert [(r["coflow"], r["flow"], r["role"]) for r in sent] == [("c1", "f1", "send")]
        assert [(r["coflow"], r["flow"], r["role"]) for r in received] == [("c1", "f1", "recv")]
        assert sent[0]["offset"] >= 1 * MB and received[0]["offset"] >= 1 * MB
        await wait_complete(h, [f])
        assert h.agents["a"].agent.links[("b", h.tunnels[0].tunnel)].connects == 1
    assert h.controller.completed[f.key] == synthetic_digest("c1", "f1", size, f.digest_key)


async def test_slow_path_reorders_and_receiver_spills_within_memory_bound(tmp_path):
    """Tunnel 1 goes through a proxy adding 0.3 s: chunks striped over it arrive late, the fast
    path's bytes wait in the reorder buffer (64 KiB in memory, the rest spilled to disk)."""
    size = 3 * MB
    limit = 64 * 1024
    src = source_file(tmp_path, size)
    dst = tmp_path / "dst.bin"
    async with loopback(tmp_path, k=2, memory_limit=limit) as h:
        b = h.agents["b"]
        slow = h.tunnels[1]
        port = await h.nursery.start(delay_proxy, b.host, (b.host, slow.port), 0.3)
        slow_via_proxy = TunnelSpec(slow.tunnel, "b", b.data_addr, slow.path, port)
        await h.controller.set_tunnels("a", [h.tunnels[0], slow_via_proxy], [])
        f = h.flow("c1", "f1", "a", "b", size, **files(src, dst))
        await start(h, [f], [2 * MB, 0.2 * MB])
        await wait_complete(h, [f])
        peak, spilled = h.agents["b"].agent.in_flows[f.key].reorder_stats()
        agent_peak = h.agents["b"].agent.reorder_budget.peak_bytes
        sent = h.agents["a"].agent.groups[("c1", "LA")].sent_bytes
    assert sent[slow.tunnel] > 0 and spilled > 0
    assert peak <= limit and 0 < agent_peak <= limit
    assert dst.read_bytes() == src.read_bytes()


async def test_many_small_flows_complete_and_progress_is_batched(tmp_path):
    n, size = 1200, 3000  # > ROWS_PER_MESSAGE flows in one FlowGroup
    async with loopback(tmp_path, k=2) as h:
        flows = [h.flow("c1", f"f{i}", "a", "b", size) for i in range(n)]
        await start(h, flows, UNLIMITED)
        await wait_complete(h, flows)
        with trio.fail_after(TIMEOUT):
            await h.controller.wait_until(
                lambda: all(h.controller.acked.get(f.key) == size for f in flows)
            )
    assert h.controller.completed[flows[-1].key] == synthetic_digest(
        "c1", f"f{n - 1}", size, flows[-1].digest_key
    )


async def test_garbage_from_controller_closes_control_channel_only(tmp_path):
    """A fake controller answers each registration with a different bad frame; the agent drops
    that control connection, reconnects and registers again every time."""
    bad_frames = [
        BAD_INPUTS["malformed msgpack"][0],
        BAD_INPUTS["wrong version"][0],
        BAD_INPUTS["oversized header"][0],
        frame({"t": "flows", "flows": []}, b"payload"),
    ]
    registrations = []
    done = trio.Event()

    async def fake_controller(stream):
        reader = FrameReader(stream, max_payload=0)
        header, _ = await reader.read()
        registrations.append(header["agent"])
        if len(registrations) > len(bad_frames):
            done.set()
            return
        await stream.send_all(bad_frames[len(registrations) - 1])
        with trio.move_on_after(TIMEOUT):
            while await stream.receive_some(1024):
                pass  # until the agent hangs up

    async with trio.open_nursery() as nursery:
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        port = listeners[0].socket.getsockname()[1]
        nursery.start_soon(trio.serve_listeners, fake_controller, listeners)
        data_port = free_port_block("127.0.0.2", 1)
        nursery.start_soon(
            Agent(
                AgentConfig(("127.0.0.1", port), "HK", "a", ("127.0.0.2", data_port), str(tmp_path))
            ).run
        )
        with trio.fail_after(TIMEOUT):
            await done.wait()
        assert registrations == ["a"] * (len(bad_frames) + 1)
        nursery.cancel_scope.cancel()


async def test_finished_flows_are_reported_complete_again_after_reregistration(tmp_path):
    """A controller that lost its state (restarted) learns of flows finished before from the
    receivers: after re-registering, b sends "complete" again for every flow it received."""
    size = 1 * MB
    async with loopback(tmp_path, k=2) as h:
        flows = [h.flow("c1", f"f{i}", "a", "b", size) for i in range(3)]
        await start(h, flows, UNLIMITED)
        await wait_complete(h, flows)
        h.controller.completed.clear()  # what a restarted controller knows
        h.controller.drop("b")
        with trio.fail_after(TIMEOUT):
            await h.controller.wait_until(lambda: h.controller.registrations["b"] == 2)
        await wait_complete(h, flows)
    for f in flows:
        assert h.controller.completed[f.key] == synthetic_digest("c1", f.flow, size, f.digest_key)


async def test_unusable_flow_paths_from_controller_do_not_take_the_agent_down(tmp_path):
    """A NUL byte in a file path (os calls would raise ValueError, not OSError): the flow is
    refused with an error report, the control session and the other flows carry on."""
    async with loopback(tmp_path, k=1) as h:
        bad_sink = h.flow("c1", "bad-sink", "a", "b", 1000, sink="file:x\0y")
        bad_source = h.flow("c1", "bad-source", "a", "b", 1000, source="file:x\0y")
        good = h.flow("c1", "good", "a", "b", 1 * MB)
        # the bad sink goes to its receiver only (a controller withholds from the sender a
        # flow its receiver refused; chunks of a flow the receiver does not know close a link)
        await h.controller.send("b", flows_message([bad_sink]))
        await start(h, [bad_source, good], UNLIMITED)
        await wait_complete(h, [good])
        reported = {(e["agent"], e.get("flow")) for e in h.controller.errors}
        assert {("b", "bad-sink"), ("a", "bad-source")} <= reported
        assert h.controller.registrations == {"a": 1, "b": 1}  # no session was lost


async def send_sender_first(h, flows, rate, until):
    """Descriptors and rates to the sender a only; wait until `until()`, then the descriptors
    to the receiver b (a controller whose message to the receiver is late)."""
    for f in flows:
        h.controller.flows[f.key] = f
    await h.controller.send("a", flows_message(flows))
    paths = {t.tunnel: rate for t in h.tunnels}
    await h.controller.set_rates("a", [GroupRates(flows[0].coflow, "LA", paths)])
    with trio.fail_after(TIMEOUT):
        while not until():
            await trio.sleep(0.01)
    await h.controller.send("b", flows_message(flows))


@pytest.mark.parametrize("encrypt", [False, True])
async def test_chunks_before_the_receivers_descriptor_are_held_and_delivered(
    tmp_path, pki, encrypt
):
    """The receiver gets the flows' descriptors 0.5 s after the sender started sending: it holds
    the chunks (unacknowledged; encrypted: still sealed), then delivers them; no data
    connection is closed, no byte is sent twice."""
    size = 3 * MB
    kw = {"pki": pki, "encrypt_data": True} if encrypt else {}
    async with loopback(tmp_path, **kw) as h:
        a, b = h.agents["a"].agent, h.agents["b"].agent
        flows = [h.flow("c1", f"f{i}", "a", "b", size) for i in range(2)]
        start_time = trio.current_time()
        # 4 tunnels x 0.5 MB/s: ~1 MB held after 0.5 s, under the 4 MiB default bound
        await send_sender_first(
            h,
            flows,
            0.5 * MB,
            lambda: b.pending.held_bytes > 0 and trio.current_time() - start_time >= 0.5,
        )
        await wait_complete(h, flows)
        assert b.pending.peak_bytes > 0  # chunks really arrived ahead of the descriptor
        assert b.pending.held_bytes == 0 and b.pending.dropped_bytes == 0
        assert b.closed_connections == 0
        assert all(link.connects == 1 for link in a.links.values())
        assert sum(a.groups[("c1", "LA")].sent_bytes.values()) == 2 * size  # nothing resent
    for f in flows:
        assert h.controller.completed[f.key] == synthetic_digest("c1", f.flow, size, f.digest_key)


async def test_held_chunks_past_the_bound_close_their_connection_and_are_resent(tmp_path):
    """A pending bound of four chunks and a bit (chunks at 0.5 MB/s per path are one 64 KiB
    leaf): the fifth held chunk overflows it, its connection closes, the sender resends; the
    flow completes."""
    size = 2 * MB
    async with loopback(tmp_path, k=2) as h:
        b = h.agents["b"].agent
        b.pending.limit_bytes = 4 * LEAF_BYTES + 1000
        f = h.flow("c1", "f1", "a", "b", size)
        await send_sender_first(h, [f], 0.5 * MB, lambda: b.closed_connections > 0)
        await wait_complete(h, [f])
        assert b.pending.dropped_bytes > 0 and b.pending.held_bytes == 0
    assert h.controller.completed[f.key] == synthetic_digest("c1", "f1", size, f.digest_key)


async def test_held_chunks_past_the_timeout_close_their_connection_and_are_resent(tmp_path):
    size = 2 * MB
    async with loopback(tmp_path, k=2) as h:
        b = h.agents["b"].agent
        b.config.pending_timeout = 0.2
        f = h.flow("c1", "f1", "a", "b", size)
        await send_sender_first(h, [f], 0.5 * MB, lambda: b.closed_connections > 0)
        await wait_complete(h, [f])
        assert b.pending.dropped_bytes > 0 and b.pending.held_bytes == 0
    assert h.controller.completed[f.key] == synthetic_digest("c1", "f1", size, f.digest_key)


async def test_chunks_of_a_flow_the_receiver_refused_get_a_clear_error(tmp_path, caplog):
    """The sink cannot be opened (NUL in its path): the receiver reports the flow and closes a
    connection that carries its chunks with an error naming the refusal (they are not held)."""
    async with loopback(tmp_path, k=1) as h:
        b = h.agents["b"].agent
        bad = h.flow("c1", "bad", "a", "b", 100_000, sink="file:x\0y")
        await h.controller.send("b", flows_message([bad]))
        await start(h, [bad], 1 * MB)
        with trio.fail_after(TIMEOUT):
            while b.closed_connections == 0:
                await trio.sleep(0.01)
        assert bad.key in b.refused and b.pending.peak_bytes == 0
        assert ("b", "bad") in {(e["agent"], e.get("flow")) for e in h.controller.errors}
    errors = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert any("c1/bad, which this agent refused" in e for e in errors), errors
