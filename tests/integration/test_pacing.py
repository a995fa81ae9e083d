"""The kernel rate-limit backend (terra-agent --rate-limiter pacing), over real loopback TCP.

Socket-level: SO_MAX_PACING_RATE set and read back, the frame-header accounting matches real
frames, a paced socket delivers its rate. Agent-level (benchmarks/harness.py): the paced link's
socket option follows set_rates at run time, rate 0 stops the bytes, and two FlowGroups sharing
one tunnel connection each get their own rate.
"""

import math
import socket
import time
from contextlib import asynccontextmanager

import pytest
import test_agent
import trio
from test_agent import MB, loopback

from benchmarks.harness import LoopbackHarness
from overlay.rate_limit import (
    chunk_frame_overhead,
    pacing_rate,
    set_pacing_rate,
    stream_rate,
)
from terra_agent.agent import MIN_PACING_BYTES_PER_S
from terra_agent.metrics import AgentCollector
from terra_agent.sender import chunk_bytes
from terra_security.data_records import TAG_BYTES
from terra_security.integrity import mac_bytes
from terra_wire.control import GroupRates
from terra_wire.frames import chunk_header, encode_frame, encode_head

TIMEOUT = 60


def connected_pair():
    """(client, server) connected TCP sockets on loopback (blocking)."""
    listener = socket.create_server(("127.0.0.1", 0))
    client = socket.create_connection(listener.getsockname())
    server, _ = listener.accept()
    listener.close()
    return client, server


def test_pacing_rate_is_set_read_back_and_changed_on_a_live_socket():
    client, server = connected_pair()
    with client, server:
        assert pacing_rate(client) == math.inf  # a new socket is unpaced
        set_pacing_rate(client, 125_000.4)
        assert pacing_rate(client) == 125_000
        set_pacing_rate(client, 3e9)  # above 32 bits: the 64-bit option value
        assert pacing_rate(client) == 3e9
        set_pacing_rate(client, math.inf)
        assert pacing_rate(client) == math.inf


@pytest.mark.parametrize("rate", [0, -1, float("nan")])
def test_pacing_rate_zero_or_bad_is_refused(rate):
    client, server = connected_pair()
    with client, server, pytest.raises(ValueError):
        set_pacing_rate(client, rate)


@pytest.mark.parametrize("n", [1024, 4096, 1_250_000, 4 << 20])
@pytest.mark.parametrize("offset", [0, 70_000, 3 << 30])
def test_frame_overhead_matches_real_chunk_frames(n, offset):
    payload = bytes(n)
    macs = bytes(mac_bytes(n))
    header = chunk_header("coflow-7", "flow-12", offset, payload, macs)
    real = len(encode_frame(header, payload)[0])
    estimate = chunk_frame_overhead("coflow-7", "flow-12", n)
    assert abs(estimate - real) <= 4, (estimate, real)
    assert stream_rate(1e6, n, estimate) == pytest.approx(1e6 * (n + estimate) / n)
    sealed = {**header, "t": "schunk", "s": 2**40}  # an encrypted connection's record
    real = len(encode_head(sealed, n + TAG_BYTES)) + TAG_BYTES
    estimate = chunk_frame_overhead("coflow-7", "flow-12", n, sealed=True)
    assert 0 <= estimate - real <= 8, (estimate, real)  # "s" is counted at its longest


def test_a_paced_socket_delivers_its_rate():
    """2 MB/s paced, the writer writing as fast as the socket takes: ~2 MB/s at the receiver."""
    rate = 2e6
    listener = socket.create_server(("127.0.0.1", 0))
    client = socket.socket()
    client.setsockopt(socket.IPPROTO_TCP, socket.TCP_MAXSEG, 1448)
    client.connect(listener.getsockname())
    server, _ = listener.accept()
    listener.close()
    with client, server:
        set_pacing_rate(client, rate)
        client.setblocking(False)
        server.settimeout(5)
        data = bytes(64 << 10)
        got, first, last = 0, None, None
        end = time.monotonic() + 3.0
        while time.monotonic() < end:
            try:
                client.send(data)
            except BlockingIOError:
                pass
            try:
                chunk = server.recv(1 << 20, socket.MSG_DONTWAIT)
            except BlockingIOError:
                time.sleep(0.001)
                continue
            now = time.monotonic()
            if first is None and now > end - 2.0:  # 1 s of warm-up
                first = now
            elif first is not None:
                got += len(chunk)
                last = now
    measured = got / (last - first)
    assert abs(measured - rate) / rate < 0.05, measured


async def sampled_rates(agent, keys, warmup, window):
    """Bytes/s acknowledged to `agent` per flow key over `window` s after `warmup` s."""
    await trio.sleep(warmup)
    t0 = trio.current_time()
    a0 = [agent.out_flows[k].acked for k in keys]
    await trio.sleep(window)
    span = trio.current_time() - t0
    return [(agent.out_flows[k].acked - a) / span for k, a in zip(keys, a0, strict=True)]


async def paced_rate(agent, key, want: float, warmup: float, tries: int = 3) -> float:
    """Bytes/s acknowledged to `agent` for flow `key` over 4 s after `warmup` s, sampled again
    (up to `tries` windows) while more than 5 % off `want`; the window closest to `want`. A
    process starved of CPU (the suite on 4 workers) moves fewer bytes than its pacing allows,
    never more: windows 5 % and 19 % short were seen, so one window does not show the pacer."""
    best = math.inf
    for i in range(tries):
        (rate,) = await sampled_rates(agent, [key], warmup if i == 0 else 0.0, 4.0)
        if abs(rate - want) < abs(best - want):
            best = rate
        if abs(rate - want) / want < 0.05:
            break
    return best


async def test_paced_link_follows_rates_at_run_time_and_zero_pauses(tmp_path):
    async with loopback(tmp_path, k=1, rate_limiter="pacing") as h:
        tunnel = h.tunnels[0].tunnel
        a = h.agents["a"].agent
        f = h.flow("c1", "f1", "a", "b", 200 * MB)
        await h.controller.add_flows([f])
        await h.controller.set_rates("a", [GroupRates("c1", "LA", {tunnel: 1 * MB})])
        with trio.fail_after(TIMEOUT):
            while a.out_flows[f.key].acked < 200_000:
                await trio.sleep(0.01)
        link = a.group_links[("c1", "LA", "b", tunnel)]  # the group's own paced connection
        assert pacing_rate(a.links[("b", tunnel)]._stream.socket) == math.inf  # unused, unpaced

        def expected(rate):
            n = chunk_bytes(rate)
            return stream_rate(rate, n, chunk_frame_overhead("c1", "f1", n))

        assert pacing_rate(link._stream.socket) == round(expected(1 * MB))
        group = a.groups[("c1", "LA")]
        assert group.buckets[tunnel].rate == math.inf  # sole user: the kernel alone paces
        await h.controller.set_rates("a", [GroupRates("c1", "LA", {tunnel: 3 * MB})])
        assert pacing_rate(link._stream.socket) == round(expected(3 * MB))
        rate = await paced_rate(a, f.key, 3 * MB, 0.5)
        assert abs(rate - 3 * MB) / (3 * MB) < 0.05, rate

        await h.controller.set_rates("a", [GroupRates("c1", "LA", {})])  # pause
        await trio.sleep(0.3)  # the bytes queued in the kernel leave (~100 ms)
        flow, inflow = a.out_flows[f.key], h.agents["b"].agent.in_flows[f.key]
        sent, received = flow.next_offset, inflow.acknowledged
        await trio.sleep(0.5)
        assert flow.next_offset == sent and inflow.acknowledged == received
        assert group.buckets[tunnel].rate == 0

        await h.controller.set_rates("a", [GroupRates("c1", "LA", {tunnel: 2 * MB})])
        assert pacing_rate(link._stream.socket) == round(expected(2 * MB))
        families = {m.name: m for m in AgentCollector(a).collect()}
        (sample,) = families["terra_agent_link_sent_bytes"].samples[:1]
        assert sample.labels == {"peer": "b", "tunnel": tunnel}
        assert sample.value == link.sent_bytes >= received  # the group's paced bytes counted
        with trio.fail_after(TIMEOUT):
            while a.out_flows[f.key].acked < received + 200_000:
                await trio.sleep(0.01)


async def test_a_path_at_a_tiny_rate_is_paced_at_the_floor_and_its_bucket_binds(tmp_path):
    """The LP gave testbed paths 1.4 kB/s: paced at that, the 64 KiB chunk in the socket
    needed 46 s and held its flow (for good once the path paused). Below
    MIN_PACING_BYTES_PER_S the socket is paced at the floor and the bucket keeps the rate:
    the flow moves at its rate, and a pause leaves nothing stuck for long."""
    async with loopback(tmp_path, k=1, rate_limiter="pacing") as h:
        tunnel = h.tunnels[0].tunnel
        a = h.agents["a"].agent
        f = h.flow("c1", "f1", "a", "b", 2 * MB)
        await h.controller.add_flows([f])
        await h.controller.set_rates("a", [GroupRates("c1", "LA", {tunnel: 20_000})])
        with trio.fail_after(TIMEOUT):
            while ("c1", "LA", "b", tunnel) not in a.group_links:
                await trio.sleep(0.01)
        link = a.group_links[("c1", "LA", "b", tunnel)]
        group = a.groups[("c1", "LA")]
        assert link.pacing_rate == MIN_PACING_BYTES_PER_S
        assert group.buckets[tunnel].rate == 20_000  # the bucket binds
        (rate,) = await sampled_rates(a, [f.key], 1.0, 4.0)
        assert rate < 2.5 * 65536 / 4.0  # 20 kB/s: at most a couple of 64 KiB chunks
        await h.controller.set_rates("a", [GroupRates("c1", "LA", {tunnel: 4 * MB})])
        with trio.fail_after(10):  # the rest at 4 MB/s, nothing stuck behind the slow pace
            while not a.out_flows[f.key].done:
                await trio.sleep(0.01)


@pytest.mark.parametrize("backend", ["pacing", "bucket"])
async def test_two_flowgroups_on_one_tunnel_each_get_their_rate(tmp_path, backend):
    """Coflows c1 (2 MB/s) and c2 (6 MB/s) both use tunnel 0 from a to b: each gets its rate
    (bucket: they share the tunnel's connection; pacing: a paced connection per group)."""
    rates = [2 * MB, 6 * MB]
    async with loopback(tmp_path, k=1, rate_limiter=backend) as h:
        tunnel = h.tunnels[0].tunnel
        a = h.agents["a"].agent
        flows = [h.flow(f"c{i}", "f", "a", "b", int(r * 20)) for i, r in enumerate(rates, 1)]
        await h.controller.add_flows(flows)
        await h.controller.set_rates(
            "a",
            [GroupRates(f.coflow, "LA", {tunnel: r}) for f, r in zip(flows, rates, strict=True)],
        )
        measured = await sampled_rates(a, [f.key for f in flows], 1.0, 4.0)
        if backend == "pacing":  # a connection per group, each paced at its group's rate
            for f, r in zip(flows, rates, strict=True):
                link = a.group_links[(f.coflow, "LA", "b", tunnel)]
                assert pacing_rate(link._stream.socket) == pytest.approx(r, rel=0.02)
                assert a.groups[(f.coflow, "LA")].buckets[tunnel].rate == math.inf
    for got, want in zip(measured, rates, strict=True):
        assert abs(got - want) / want < 0.05, (backend, measured)  # load here: 8-23


async def test_harness_passes_the_rate_limiter_and_bad_names_are_refused(tmp_path):
    async with trio.open_nursery() as nursery:
        h = LoopbackHarness(nursery, tmp_path, rate_limiter="pacing")
        await h.start()
        await h.add_agent("a", "HK")
        assert h.agents["a"].agent.config.rate_limiter == "pacing"
        with pytest.raises(ValueError, match="rate_limiter"):
            LoopbackHarness(nursery, tmp_path, rate_limiter="htb")._config(h.agents["a"])
        nursery.cancel_scope.cancel()


@pytest.mark.parametrize(
    "scenario",
    [
        test_agent.test_file_to_file_over_four_tunnels,
        test_agent.test_rate_zero_pauses_and_new_rates_apply,
        test_agent.test_controller_declares_tunnel_down,
        test_agent.test_bytes_lost_on_a_failed_path_are_resent_on_the_others,
    ],
    ids=lambda f: f.__name__.removeprefix("test_"),
)
async def test_agent_scenarios_with_the_pacing_limiter(tmp_path, monkeypatch, scenario):
    """tests/integration/test_agent.py scenarios (multipath files, rate 0, a tunnel removed,
    bytes lost on a dead path resent) with every agent on --rate-limiter pacing. (Its 3:1
    striping test moves only 8 MB: see test_paced_striping_follows_rates_three_to_one.)"""
    harnesses = []

    @asynccontextmanager
    async def paced(tmp_path, **kw):
        async with loopback(tmp_path, rate_limiter="pacing", **kw) as h:
            harnesses.append(h)
            yield h

    monkeypatch.setattr(test_agent, "loopback", paced)
    await scenario(tmp_path)
    a = harnesses[0].agents["a"].agent
    assert a.config.rate_limiter == "pacing" and a.groups
    assert a.group_links_opened >= 1  # the bytes went over the groups' own paced connections


async def test_paced_striping_follows_rates_three_to_one(tmp_path):
    """test_agent's 3:1 striping with pacing, measured over 3 s of a running transfer (after
    1 s): the kernel sends a connection's first 10 segments unpaced, up to 64 KiB each on
    loopback (14 KiB in all on a WAN path), which would skew the totals of a short transfer."""
    async with loopback(tmp_path, k=2, rate_limiter="pacing") as h:
        f = h.flow("c1", "f1", "a", "b", 40 * MB)
        await test_agent.start(h, [f], [3 * MB, 1 * MB])
        group = None
        with trio.fail_after(TIMEOUT):
            while group is None or sum(group.sent_bytes.values()) == 0:
                await trio.sleep(0.01)
                group = h.agents["a"].agent.groups.get(("c1", "LA"))
        await trio.sleep(1.0)
        before = dict(group.sent_bytes)
        await trio.sleep(3.0)
        fast, slow = (group.sent_bytes[t.tunnel] - before[t.tunnel] for t in h.tunnels)
    assert abs(fast / slow - 3) / 3 < 0.05, (fast, slow)


@pytest.mark.parametrize("encrypt", [False, True])
async def test_paced_connections_authenticate_and_encrypt_like_the_tunnel_links(
    tmp_path, pki, encrypt
):
    """With a PKI (and --encrypt-data) a group's own paced connections authenticate (and stay
    inside TLS) as the per-tunnel links do; the rate holds (TLS records added when encrypting)."""
    async with loopback(tmp_path, k=1, rate_limiter="pacing", pki=pki, encrypt_data=encrypt) as h:
        tunnel = h.tunnels[0].tunnel
        a = h.agents["a"].agent
        f = h.flow("c1", "f1", "a", "b", 100 * MB)
        await h.controller.add_flows([f])
        await h.controller.set_rates("a", [GroupRates("c1", "LA", {tunnel: 3 * MB})])
        rate = await paced_rate(a, f.key, 3 * MB, 1.0)
        link = a.group_links[("c1", "LA", "b", tunnel)]
        assert link.encrypt is encrypt and link.key_auths + link.tls_auths >= 1
        n = chunk_bytes(3 * MB)
        want = stream_rate(3 * MB, n, chunk_frame_overhead("c1", "f1", n, sealed=encrypt))
        assert pacing_rate(link._stream.socket) == round(want)
    assert abs(rate - 3 * MB) / (3 * MB) < 0.05, rate
