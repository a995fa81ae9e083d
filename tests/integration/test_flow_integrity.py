"""Keyed flow integrity, the spill bound and encrypted data connections.

terra_security/integrity.py (keyed chunk MACs, keyed flow digest), InFlow.admit (MAC and spill bound
checked before a chunk is kept), reorder.remove_spill_files (start-up cleanup) and
terra-agent --encrypt-data (sealed records). Agents run in-process under the loopback harness;
chunks are tampered with by an in-test TCP proxy on a real tunnel, or sent by an in-test peer that
speaks the real data protocol.
"""

from __future__ import annotations

import hashlib
import os

import blake3
import pytest
import trio
from test_agent import loopback

from benchmarks.harness import LoopbackHarness, delay_proxy
from overlay.framing import FrameWriter
from terra_agent.agent import AgentConfig
from terra_agent.receiver import InFlow
from terra_security.integrity import (
    ALGORITHM,
    ALGORITHMS,
    GMAC_ALGORITHM,
    LEAF_BYTES,
    MAC_BYTES,
    FlowDigest,
    FlowKeys,
    IntegrityError,
    align_down,
    default_algorithm,
    flow_digest,
    has_aes_instructions,
    new_flow_key,
)
from terra_wire.control import (
    FlowSpec,
    GroupRates,
    ProtocolError,
    TunnelSpec,
    flows_message,
    parse_flows,
)
from terra_wire.frames import chunk_header

MB = 1_000_000
TIMEOUT = 60
ERRORS = (trio.BrokenResourceError, trio.ClosedResourceError, OSError)


# ---- the construction -----------------------------------------------------------------------


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_a_digest_or_mac_made_without_the_key_does_not_match(algorithm):
    key, other = new_flow_key(), new_flow_key()
    data = os.urandom(300_000)  # 4 whole leaves and a short one
    digest = flow_digest(key, data, algorithm)
    assert len(digest) == 64 and digest != flow_digest(other, data, algorithm)
    assert digest != blake3.blake3(data).hexdigest()  # unkeyed BLAKE3
    assert digest != hashlib.blake2b(data, digest_size=32).hexdigest()  # the old digest
    keys = FlowKeys(key, algorithm)
    macs = keys.leaf_macs(LEAF_BYTES, data)
    assert len(macs) == 5 * MAC_BYTES and keys.check(LEAF_BYTES, data, macs)
    assert not FlowKeys(other, algorithm).check(LEAF_BYTES, data, macs)  # another flow's key
    assert len({flow_digest(key, data, a) for a in ALGORITHMS}) == len(ALGORITHMS)
    assert not keys.check(0, data, macs)  # replayed at another offset
    assert not keys.check(LEAF_BYTES + 1, data, macs)  # off the leaf grid
    assert not keys.check(LEAF_BYTES, data[:-1], macs)  # truncated
    tampered = bytearray(data)
    tampered[123_456] ^= 1
    assert not keys.check(LEAF_BYTES, tampered, macs)
    assert not keys.check(LEAF_BYTES, data, bytes(len(macs)))
    with pytest.raises(IntegrityError):
        keys.leaf_macs(100, data)


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_the_digest_is_the_same_from_macs_from_bytes_and_mixed(algorithm):
    """Sender (MACs it made), receiver (verified MACs of some leaves, bytes of others, in
    pieces of any size): one digest."""
    key = new_flow_key()
    keys = FlowKeys(key, algorithm)
    data = os.urandom(5 * LEAF_BYTES + 777)
    sender = FlowDigest(keys, len(data))
    sender.add_macs(0, keys.leaf_macs(0, data[: 2 * LEAF_BYTES]), 2 * LEAF_BYTES)
    sender.add_macs(2 * LEAF_BYTES, keys.leaf_macs(2 * LEAF_BYTES, data[2 * LEAF_BYTES :]),
                    len(data) - 2 * LEAF_BYTES)  # fmt: skip
    receiver = FlowDigest(keys, len(data))
    receiver.know(LEAF_BYTES, keys.leaf_macs(LEAF_BYTES, data[LEAF_BYTES : 3 * LEAF_BYTES]))
    for start in range(0, len(data), 10_000):
        receiver.update(data[start : start + 10_000])
    assert sender.hexdigest() == receiver.hexdigest() == flow_digest(key, data, algorithm)
    with pytest.raises(IntegrityError):
        FlowDigest(keys, 10).hexdigest()


def test_the_leaf_mac_is_chosen_per_deployment_and_named_in_descriptors():
    """GMAC where the CPU has AES instructions, else BLAKE3 (integrity.default_algorithm);
    the controller names its choice (terra-controller --leaf-mac) in every descriptor, and a
    descriptor's name survives the wire; unknown names are refused."""
    from terra_controller.agent_channel import AgentChannel
    from terra_controller.controller import Controller
    from terra_controller.tunnel_table import TunnelTable
    from terra_core.terra_policy import TerraPolicy
    from topologies import Topology

    assert default_algorithm() == (GMAC_ALGORITHM if has_aes_instructions() else ALGORITHM)
    topology = Topology("two", ["A", "B"], {("A", "B"): 1e8, ("B", "A"): 1e8})
    controller = Controller(topology, TerraPolicy(topology, k=1))
    tunnels = TunnelTable(topology, 1)
    assert AgentChannel(controller, tunnels).leaf_mac == default_algorithm()
    for name in ALGORITHMS:
        assert AgentChannel(controller, tunnels, leaf_mac=name).leaf_mac == name
        spec = FlowSpec("c", "f", "a", "b", "B", 10, digest_alg=name)
        (parsed,) = parse_flows(flows_message([spec]))
        assert parsed.digest_alg == name
    with pytest.raises(ValueError, match="unknown leaf MAC"):
        AgentChannel(controller, tunnels, leaf_mac="hmac-md5")


@pytest.mark.parametrize("size", [LEAF_BYTES, 2 * LEAF_BYTES + 5])
def test_bytes_past_the_flow_size_are_refused_not_folded_in(size):
    """A digest fed more bytes than its flow holds raises at once (a whole number of leaves
    used to loop for ever); the digest of the real bytes is unchanged by the attempt."""
    key = new_flow_key()
    data = os.urandom(size)
    digest = FlowDigest(FlowKeys(key), size)
    digest.update(data)
    with pytest.raises(IntegrityError):
        digest.update(b"x")
    assert digest.hexdigest() == flow_digest(key, data)


def test_bad_keys_and_algorithms_are_refused():
    for bad in ("00" * 31, "zz" * 32, "", None):
        with pytest.raises(IntegrityError):
            FlowKeys(bad)
    with pytest.raises(IntegrityError, match="algorithm"):
        FlowKeys(new_flow_key(), "blake2b")
    row = {"coflow": "c", "flow": "f", "src_agent": "a", "dst_agent": "b", "dst_dc": "B"}
    row["size"] = 10
    for fields, match in (
        ({}, "digest_key"),
        ({"digest_key": "AB" * 32}, "digest_key"),
        ({"digest_key": "ab" * 31}, "digest_key"),
        ({"digest_key": "ab" * 32, "digest_alg": "blake2b"}, "digest_alg"),
    ):
        with pytest.raises(ProtocolError, match=match):
            parse_flows({"t": "flows", "flows": [{**row, **fields}]})
    (spec,) = parse_flows({"t": "flows", "flows": [{**row, "digest_key": "ab" * 32}]})
    assert spec.digest_key == "ab" * 32 and spec.digest_alg == "blake3-keyed-v1"
    assert "ab" * 32 not in repr(spec)  # keys stay out of logs


def test_the_receiver_refuses_a_digest_computed_without_the_key(tmp_path):
    data = os.urandom(50_000)
    key = new_flow_key()
    (spec,) = parse_flows(
        flows_message([FlowSpec("c1", "f1", "a", "b", "LA", 50_000, digest_key=key)])
    )
    flow = InFlow(spec, memory_limit=1 << 20, spill_dir=str(tmp_path))
    flow.add(0, data, blake3.blake3(data).hexdigest())  # right bytes, digest without the key
    assert not flow.check_digest() and flow.digest_mismatch
    assert flow.digest == flow_digest(key, data)


# ---- agents ------------------------------------------------------------------------------------


async def proxy(listen_host, target, tap, task_status=trio.TASK_STATUS_IGNORED):
    """A TCP proxy to `target`; tap(connection number, stream offset, bytes) -> bytes may read
    or change what goes from the client to the target. A connection ends when either side
    does."""
    listeners = await trio.open_tcp_listeners(0, host=listen_host)
    task_status.started(listeners[0].socket.getsockname()[1])
    count = [0]

    async def pump(src, dst, number, scope):
        seen = 0
        try:
            while data := await src.receive_some(1 << 16):
                if number is not None:
                    data = tap(number, seen, bytes(data))
                seen += len(data)
                await dst.send_all(data)
        except ERRORS:
            pass
        scope.cancel()

    async def handle(client):
        count[0] += 1
        try:
            upstream = await trio.open_tcp_stream(*target)
        except OSError:
            await client.aclose()
            return
        async with client, upstream, trio.open_nursery() as nursery:
            nursery.start_soon(pump, client, upstream, count[0], nursery.cancel_scope)
            nursery.start_soon(pump, upstream, client, None, nursery.cancel_scope)

    await trio.serve_listeners(handle, listeners)


async def via(h, tap):
    """Route the first tunnel a -> b through a tapping proxy."""
    b = h.agents["b"]
    t = h.tunnels[0]
    port = await h.nursery.start(proxy, b.host, (b.host, t.port), tap)
    h.tunnels = [TunnelSpec(t.tunnel, "b", b.data_addr, t.path, port), *h.tunnels[1:]]
    await h.controller.set_tunnels("a", h.tunnels, [])


async def run_flow(h, flow, rates):
    await h.controller.add_flows([flow])
    paths = {t.tunnel: r for t, r in zip(h.tunnels, rates, strict=True)}
    await h.controller.set_rates("a", [GroupRates(flow.coflow, "LA", paths)])
    with trio.fail_after(TIMEOUT):
        await h.controller.wait_until(lambda: flow.key in h.controller.completed)


def files(h, size):
    src = h.data_root / "src.bin"
    src.write_bytes(os.urandom(size))
    return src, h.data_root / "dst.bin", {"source": "file:src.bin", "sink": "file:dst.bin"}


def assert_intact(h, flow, src, dst):
    """Every byte arrived (the sink equals the source) and the digests matched."""
    assert dst.read_bytes() == src.read_bytes()
    assert h.controller.completed[flow.key] == flow_digest(flow.digest_key, src.read_bytes())
    assert not h.controller.failed


@pytest.mark.parametrize("encrypt", [False, True])
async def test_a_tampered_chunk_is_dropped_and_resent(tmp_path, pki, encrypt):
    """A proxy on the tunnel flips one payload byte of the first connection: b drops that
    chunk (bad MAC; encrypted: its AES-GCM record does not verify) before it reaches the
    sink, closes the connection, a resends."""
    flipped = []

    def flip_once(number, seen, data):
        at = 50_000  # inside the first chunk's payload (chunks of 200 KB at 20 MB/s)
        if number == 1 and seen <= at < seen + len(data):
            data = bytearray(data)
            data[at - seen] ^= 0xFF
            flipped.append(at)
        return bytes(data)

    async with loopback(tmp_path, k=1, pki=pki if encrypt else None, encrypt_data=encrypt) as h:
        await via(h, flip_once)
        size = 6 * MB
        src, dst, ends = files(h, size)
        flow = h.flow("c1", "f1", "a", "b", size, **ends)
        await run_flow(h, flow, [20 * MB])
        b = h.agents["b"].agent
        assert flipped and b.rejected_chunks == 1
        assert b.in_flows[flow.key].rejected_macs == 1
        assert h.agents["a"].agent.links[("b", h.tunnels[0].tunnel)].connects == 2
        assert_intact(h, flow, src, dst)


async def test_forged_chunks_and_chunks_far_ahead_are_refused(tmp_path):
    """An in-test peer speaking the data protocol as the flow's sender (the harness has no
    PKI: "hello" names it): a chunk MACed without the key carrying an unkeyed digest, a
    chunk MACed with another key, a chunk with a valid MAC far past the in-order point
    (max_ahead) - each closes its connection, nothing is held or spilled; then the real
    sender moves the flow with every byte intact."""
    async with loopback(tmp_path, k=1) as h:
        b = h.agents["b"]
        b.agent.config.max_ahead = 4 << 20
        size = 12 * MB
        src, dst, ends = files(h, size)
        flow = h.flow("c1", "f1", "a", "b", size, **ends)
        await h.controller.add_flows([flow])
        data = src.read_bytes()
        keys, other = FlowKeys(flow.digest_key), FlowKeys(new_flow_key())
        last, far = align_down(size - 1), 128 * LEAF_BYTES  # far: 8 MiB ahead
        two = 2 * LEAF_BYTES
        forged = [  # (offset, payload, MACs, extra header fields)
            (last, data[last:], blake3.blake3(data[last:]).digest(length=MAC_BYTES),
             {"d": blake3.blake3(data).hexdigest()}),
            (0, data[:two], other.leaf_macs(0, data[:two]), {}),
            (far, data[far : far + two], keys.leaf_macs(far, data[far : far + two]), {}),
        ]  # fmt: skip
        inflow = b.agent.in_flows[flow.key]
        for offset, payload, mac, extra in forged:
            inflow.max_ahead = size if offset == last else 4 << 20  # the MAC is checked second
            stream = await trio.open_tcp_stream(b.host, h.tunnels[0].port)
            async with stream:
                writer = FrameWriter(stream)
                await writer.send({"t": "hello", "agent": "a", "tunnel": h.tunnels[0].tunnel})
                header = {**chunk_header("c1", "f1", offset, payload, mac), **extra}
                await writer.send(header, payload)
                with trio.fail_after(TIMEOUT):  # b closes the connection
                    try:
                        while await stream.receive_some(1 << 16):
                            pass
                    except ERRORS:
                        pass
        assert (inflow.rejected_macs, inflow.rejected_ahead, b.agent.rejected_chunks) == (2, 1, 3)
        assert inflow.delivered == 0 and inflow.expected_digest is None
        assert inflow.reorder_stats() == (0, 0)  # nothing held in memory or spilled
        assert not list((tmp_path / "spill-b").iterdir())
        await h.controller.set_rates("a", [GroupRates("c1", "LA", {h.tunnels[0].tunnel: 1e12})])
        with trio.fail_after(TIMEOUT):
            await h.controller.wait_until(lambda: flow.key in h.controller.completed)
        assert_intact(h, flow, src, dst)


async def test_a_sender_running_far_ahead_is_held_back_by_the_spill_bound(tmp_path):
    """Two paths, one 0.3 s late: the fast one runs more than max_ahead past the in-order
    point; b refuses those chunks (closing that connection), a resends them, the flow
    completes intact and b never held more than max_ahead out of order."""
    async with loopback(tmp_path, k=2, memory_limit=1 << 20) as h:
        b = h.agents["b"]
        b.agent.config.max_ahead = 4 << 20
        slow = h.tunnels[1]
        port = await h.nursery.start(delay_proxy, b.host, (b.host, slow.port), 0.3)
        h.tunnels = [h.tunnels[0], TunnelSpec(slow.tunnel, "b", b.data_addr, slow.path, port)]
        await h.controller.set_tunnels("a", h.tunnels, [])
        size = 24 * MB
        src, dst, ends = files(h, size)
        flow = h.flow("c1", "f1", "a", "b", size, **ends)
        await run_flow(h, flow, [40 * MB, 2 * MB])
        inflow = b.agent.in_flows[flow.key]
        assert inflow.rejected_ahead > 0 and inflow.rejected_macs == 0
        peak, _ = inflow.reorder_stats()
        assert peak <= 1 << 20
        assert_intact(h, flow, src, dst)


async def test_spill_files_of_an_earlier_run_are_removed_at_start(tmp_path):
    spill = tmp_path / "spill-b"
    spill.mkdir()
    async with trio.open_nursery() as nursery:
        h = LoopbackHarness(nursery, tmp_path)
        await h.start()
        prefix = AgentConfig(("127.0.0.1", 1), "LA", "b", ("127.0.0.1", 1)).spill_prefix
        assert prefix.startswith("reorder-b-")
        mine = [spill / f"{prefix}{i}.spill" for i in range(3)]
        others = [spill / "reorder-bb-0000-1.spill", spill / f"{prefix}1.keep", spill / "x.spill"]
        for path in mine + others:
            path.write_bytes(b"stale")
        await h.add_agent("b", "LA")
        assert not any(p.exists() for p in mine)
        assert all(p.exists() for p in others)
        nursery.cancel_scope.cancel()


@pytest.mark.parametrize("encrypt", [False, True])
async def test_encrypt_data_seals_data_connections(tmp_path, pki, encrypt):
    """With --encrypt-data no source bytes cross the tunnel in clear (AES-GCM records after
    the TLS handshake); without it they do; the flow completes either way."""
    seen = bytearray()

    def record(number, offset, data):
        seen.extend(data)
        return data

    async with loopback(tmp_path, k=1, pki=pki, encrypt_data=encrypt) as h:
        await via(h, record)
        size = 3 * MB
        src, dst, ends = files(h, size)
        flow = h.flow("c1", "f1", "a", "b", size, **ends)
        await run_flow(h, flow, [1e12])
        assert_intact(h, flow, src, dst)
    sample = src.read_bytes()[MB : MB + 64]
    assert len(seen) > size
    assert (sample in seen) is not encrypt


def test_cli_refuses_encryption_without_pki_and_a_spill_bound_below_one_chunk(capsys):
    from terra_agent.cli import main

    argv = ["--controller", "127.0.0.1:9", "--dc", "X", "--id", "x", "--data-addr", "127.0.0.1:9"]
    assert main([*argv, "--insecure", "--encrypt-data"]) == 2
    assert "--encrypt-data needs --pki" in capsys.readouterr().err
    assert main([*argv, "--insecure", "--max-ahead", "1M"]) == 2
    assert "--max-ahead must be >=" in capsys.readouterr().err
    with pytest.raises(ValueError, match="max_ahead"):
        AgentConfig(("127.0.0.1", 1), "X", "x", ("127.0.0.1", 1), max_ahead=1 << 20)
