"""Tunnel congestion control (terra-agent --tcp-congestion; docs/design.md 5.1): the agent's
tunnel connections use the kernel congestion control it was given, and a name the kernel
refuses stops the agent at start. Real sockets on loopback, a real PeerLink."""

import socket

import pytest
import trio

from overlay.framing import FrameReader
from terra_agent.agent import AgentConfig
from terra_agent.cli import check_congestion_control, main
from terra_agent.sender import PeerLink
from terra_agent.tcp_options import set_congestion_control
from terra_wire.control import TunnelSpec


def congestion(sock: socket.socket) -> str:
    return sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_CONGESTION, 16).rstrip(b"\0").decode()


def a_name_other_than_the_default() -> str:
    with socket.socket() as sock:
        default = congestion(sock)
    return "reno" if default != "reno" else "cubic"


async def link_congestion(name: str | None) -> str:
    """Connect a PeerLink with congestion `name` to a local listener; its socket's setting."""
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    port = listeners[0].socket.getsockname()[1]
    spec = TunnelSpec("7", "peer", f"127.0.0.1:{port}", ("A", "B"), port)
    link = PeerLink(spec, "me", "127.0.0.1", lambda *a: None, lambda: None, congestion=name)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(link.run)
        accepted = await listeners[0].accept()
        hello = await FrameReader(accepted).read()
        assert hello[0]["t"] == "hello"
        while not link.up:
            await trio.sleep(0.01)
        got = congestion(link._stream.socket)
        link.close()
        await accepted.aclose()
    for listener in listeners:
        await listener.aclose()
    return got


async def test_a_link_uses_the_congestion_control_it_was_given():
    name = a_name_other_than_the_default()  # reno is always built in
    assert await link_congestion(name) == name
    with socket.socket() as sock:
        default = congestion(sock)
    assert await link_congestion(None) == default


def test_an_open_socket_can_change_and_an_unknown_name_is_refused():
    with socket.socket() as sock:
        set_congestion_control(sock, "reno")
        assert congestion(sock) == "reno"
        with pytest.raises(OSError):
            set_congestion_control(sock, "no-such-cc")


def test_the_agent_refuses_an_unknown_congestion_control_at_start(capsys):
    assert check_congestion_control("reno") is None
    assert "no-such-cc" in check_congestion_control("no-such-cc")
    argv = ["--controller", "127.0.0.1:9", "--dc", "X", "--id", "x", "--data-addr", "127.0.0.1:9"]
    assert main([*argv, "--insecure", "--tcp-congestion", "no-such-cc"]) == 2
    assert "--tcp-congestion 'no-such-cc'" in capsys.readouterr().err
    assert main([*argv, "--insecure", "--tcp-congestion", "cübic"]) == 2


@pytest.mark.parametrize("name", ["", "a b", "../x", "x" * 16, 7])
def test_agent_config_refuses_names_that_are_not_module_names(name):
    with pytest.raises(ValueError, match="tcp_congestion"):
        AgentConfig(("127.0.0.1", 1), "X", "x", ("127.0.0.1", 1), tcp_congestion=name)
