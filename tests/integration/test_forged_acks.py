"""A sender believes an ack only from its flow's receiver, within the flow, with a sane epoch.

Agents a (HK) and b (LA) run in-process over real TCP on loopback (benchmarks/harness.py),
driven by the in-test controller peer. "m" is an in-test peer agent speaking the real data
protocol: a holds a tunnel to it (as to any agent of another DC), so m's end of that data
connection can send acks:

- m acks flow a -> b (which it does not receive) in full: a must not believe it, the flow is
  not shown delivered and still completes through b;
- m, the receiver of flow a -> m, acks with epoch 2**64-1 then genuinely: the forged epoch must
  not make the genuine ack look stale;
- an ack past the flow's size is dropped.
"""

import time

import trio
from test_data_root import MB, loopback, run_flows, wait_complete

from benchmarks.harness import free_port_block
from overlay.framing import FrameReader, FrameWriter
from terra_agent.sources import synthetic_digest
from terra_wire.control import GroupRates, TunnelSpec, validate_data

TIMEOUT = 30
M_HOST = "127.0.0.9"


class FakePeer:
    """The receiving end of a's data connection to agent "m": records chunks, sends acks."""

    def __init__(self) -> None:
        self.port = free_port_block(M_HOST, 2) + 1
        self.writer: FrameWriter | None = None
        self.connected = trio.Event()
        self.chunks: list[dict] = []

    def spec(self) -> TunnelSpec:
        return TunnelSpec("HK-LA-m", "m", f"{M_HOST}:{self.port - 1}", ("HK", "LA"), self.port)

    async def serve(self, task_status=trio.TASK_STATUS_IGNORED) -> None:
        listeners = await trio.open_tcp_listeners(self.port, host=M_HOST)
        task_status.started()
        await trio.serve_listeners(self._session, listeners)

    async def _session(self, stream) -> None:
        async with stream:
            reader = FrameReader(stream)
            hello = await reader.read()
            assert validate_data(hello[0])["t"] == "hello"
            self.writer = FrameWriter(stream)
            self.connected.set()
            while (frame := await reader.read()) is not None:
                self.chunks.append(frame[0])

    async def ack(self, coflow: str, flow: str, offset: int, epoch: int) -> None:
        await self.writer.send({"t": "ack", "c": coflow, "f": flow, "o": offset, "e": epoch})


async def with_fake_peer(h, nursery) -> FakePeer:
    """Start m and give a a tunnel to it beside its tunnels to b; wait for the connection."""
    peer = FakePeer()
    await nursery.start(peer.serve)
    await h.controller.set_tunnels("a", [*h.tunnels, peer.spec()], [])
    with trio.fail_after(TIMEOUT):
        await peer.connected.wait()
    return peer


async def test_an_ack_from_an_agent_that_is_not_the_receiver_is_dropped(tmp_path):
    size = 4 * MB
    async with loopback(tmp_path) as h, trio.open_nursery() as nursery:
        peer = await with_fake_peer(h, nursery)
        a = h.agents["a"].agent
        f = h.flow("c1", "f1", "a", "b", size)
        await run_flows(h, [f], rate=1 * MB)  # 2 tunnels: ~2 s
        with trio.fail_after(TIMEOUT):
            await h.controller.wait_until(lambda: 0 < h.controller.acked.get(f.key, 0))
        await peer.ack("c1", "f1", size, time.time_ns())
        with trio.fail_after(TIMEOUT):  # the ack was read: dropped, or (wrongly) believed
            while getattr(a, "forged_acks", 0) < 1 and not a.out_flows[f.key].done:
                await trio.sleep(0.01)
        assert not a.out_flows[f.key].done
        assert h.controller.acked[f.key] < size and f.key not in h.controller.completed
        await wait_complete(h, [f])
        assert h.controller.completed[f.key] == synthetic_digest("c1", "f1", size, f.digest_key)
        nursery.cancel_scope.cancel()


async def test_an_epoch_at_the_top_of_the_range_does_not_stale_later_acks(tmp_path):
    size = 1 * MB
    async with loopback(tmp_path) as h, trio.open_nursery() as nursery:
        peer = await with_fake_peer(h, nursery)
        h.agents["m"] = h.agents["b"]  # flow() reads the receiver's DC: m is in LA too
        f = h.flow("c1", "to-m", "a", "m", size)
        del h.agents["m"]
        await h.controller.add_flows([f])  # only a is told: m is not a harness agent
        a = h.agents["a"].agent
        await h.controller.set_rates("a", [GroupRates("c1", "LA", {"HK-LA-m": 1e12})])
        with trio.fail_after(TIMEOUT):
            while not peer.chunks:
                await trio.sleep(0.01)
        await peer.ack("c1", "to-m", 0, 2**64 - 1)
        await peer.ack("c1", "to-m", size + 1, time.time_ns())  # past the flow: dropped
        await peer.ack("c1", "to-m", size, time.time_ns())
        with trio.fail_after(TIMEOUT):
            await h.controller.wait_until(lambda: h.controller.acked.get(f.key) == size)
        assert a.out_flows[f.key].done
        assert a.forged_acks == 2
        nursery.cancel_scope.cancel()
