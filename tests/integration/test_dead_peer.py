"""Dead-peer bounds of tunnel connections: they must outlast TCP loss recovery on the WAN.

SWAN testbed, before the fix: tunnel connections (agent links and incoming data connections)
carried TCP_USER_TIMEOUT = 10 s, keepalive after 5 s idle. A burst of losses around the LA-NY
failure left live connections in exponential RTO backoff (ss -ti: rto 3580 ms, backoff 3,
7 s without an ack on HK-LA, a tunnel that does not cross LA-NY) and idle ones with 5 unanswered
keepalive probes; the kernel aborted them with ETIMEDOUT ~10 s after the stall began, and the
agents re-sent their chunks after reconnecting. Real sockets on loopback, real PeerLink / Agent.
"""

import socket

import trio

from overlay.framing import FrameReader, FrameWriter
from terra_agent.agent import Agent, AgentConfig
from terra_agent.sender import TUNNEL_DEAD_PEER_S, PeerLink
from terra_agent.tcp_options import DEAD_PEER_S, detect_dead_peers
from terra_wire.control import TunnelSpec

# Linux retransmits a lost segment after RTO >= 200 ms, doubling each time: a segment lost on
# its first 6 retransmissions is acknowledged at the earliest 0.2 * (2**6 - 1) = 12.6 s after it
# was first sent. A tunnel connection must survive that (10 s did not).
RTO_BACKOFF_6_LOSSES_S = 0.2 * (2**6 - 1)


def tcp_option(sock: socket.socket, name: str) -> int:
    return sock.getsockopt(socket.IPPROTO_TCP, getattr(socket, name))


def assert_survives_loss_bursts(sock: socket.socket) -> None:
    assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) == 1
    assert tcp_option(sock, "TCP_USER_TIMEOUT") >= RTO_BACKOFF_6_LOSSES_S * 1000
    # An idle connection is aborted once USER_TIMEOUT passed since the peer was last heard and a
    # keepalive probe is out; probes start after KEEPIDLE: both must be past the loss burst.
    assert tcp_option(sock, "TCP_KEEPIDLE") + tcp_option(sock, "TCP_KEEPINTVL") > 10
    assert tcp_option(sock, "TCP_KEEPINTVL") * tcp_option(sock, "TCP_KEEPCNT") > 10


async def test_agent_link_survives_a_wan_loss_burst():
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    port = listeners[0].socket.getsockname()[1]
    spec = TunnelSpec("7", "peer", f"127.0.0.1:{port}", ("A", "B"), port)
    link = PeerLink(spec, "me", "127.0.0.1", lambda *a: None, lambda: None)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(link.run)
        accepted = await listeners[0].accept()
        hello = await FrameReader(accepted).read()
        assert hello[0]["t"] == "hello" and hello[0]["tunnel"] == "7"
        while not link.up:
            await trio.sleep(0.01)
        assert_survives_loss_bursts(link._stream.socket)
        link.close()
        await accepted.aclose()
    for listener in listeners:
        await listener.aclose()


async def test_incoming_tunnel_connection_survives_a_wan_loss_burst(tmp_path):
    config = AgentConfig(("127.0.0.1", 9), "B", "rcv", ("127.0.0.1", 0), spill_dir=str(tmp_path))
    agent = Agent(config)
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    port = listeners[0].socket.getsockname()[1]
    async with trio.open_nursery() as nursery:
        client = await trio.open_tcp_stream("127.0.0.1", port)
        served = await listeners[0].accept()
        nursery.start_soon(agent._serve_incoming, served)
        await FrameWriter(client).send({"t": "hello", "agent": "snd", "tunnel": "7"})
        while ("snd", "7") not in agent.incoming:
            await trio.sleep(0.01)
        (stream,) = agent.incoming[("snd", "7")]
        assert_survives_loss_bursts(stream.socket)
        await client.aclose()
    for listener in listeners:
        await listener.aclose()


def test_control_channel_keeps_the_short_bound():
    # The control channel runs on the management network, not the WAN: 10 s stays.
    assert DEAD_PEER_S == 10.0 and TUNNEL_DEAD_PEER_S >= RTO_BACKOFF_6_LOSSES_S


async def test_user_timeout_aborts_a_live_but_stalled_connection():
    """The failure mode itself: a live peer that stops draining for longer than USER_TIMEOUT
    (zero-window probes answered) is aborted with ETIMEDOUT (Linux >= 5.11)."""
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    port = listeners[0].socket.getsockname()[1]
    client = await trio.open_tcp_stream("127.0.0.1", port)
    served = await listeners[0].accept()  # never reads: the window closes, the peer stays alive
    detect_dead_peers(client, timeout_s=1.0)
    block = b"x" * (1 << 20)
    error = None
    with trio.move_on_after(20):
        try:
            while True:
                await client.send_all(block)
        except trio.BrokenResourceError as exc:
            error = exc.__cause__
    assert isinstance(error, OSError) and error.errno == 110  # ETIMEDOUT
    await client.aclose()
    await served.aclose()
    for listener in listeners:
        await listener.aclose()
