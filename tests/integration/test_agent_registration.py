"""Registration refusals are final, and an agent may only name its own data address.

The controller's real agent channel (plain TCP: --insecure, so in-test peers need no
certificates) on loopback; a real `terra-agent` subprocess or an in-test agent speaking the
control protocol registers with it.

- an agent with an unknown --dc gets a fatal "error" and exits non-zero with the reason
  (it used to retry every 2 s forever);
- a data_addr naming another host (where honest agents would then open their tunnels) is
  refused, fatally; 0.0.0.0 means the control connection's address; --data-prefix admits
  a configured prefix.
"""

import socket
import subprocess
import sys
import threading

import pytest

from benchmarks.harness import free_port
from terra_controller.agent_channel import AgentChannel, start_agent_server
from terra_controller.agent_connection import read_control, send_parts
from terra_controller.cli import build_parser
from terra_controller.controller import Controller
from terra_controller.registration_checks import RegistrationRefused, check_data_addr
from terra_controller.transport import ServerSecurity, stop_listener
from terra_controller.tunnel_table import TunnelTable
from terra_core.terra_policy import TerraPolicy
from terra_wire import control as protocol
from topologies import Topology

EXIT_WITHIN_S = 60  # generous: the agent exits at its first registration


def daemon_spawn(func, *args):
    thread = threading.Thread(target=func, args=args, daemon=True)
    thread.start()
    return thread


@pytest.fixture(params=[(), ("192.0.2.0/24",)], ids=["no-prefix", "prefix"])
def channel(request):
    links = {("A", "B"): 1e8, ("B", "A"): 1e8}
    topology = Topology("pair", ["A", "B"], links)
    controller = Controller(topology, TerraPolicy(topology, k=1))
    chan = AgentChannel(controller, TunnelTable(topology, 1), data_prefixes=request.param)
    listener, _, bound = start_agent_server(
        chan, "127.0.0.1", 0, ServerSecurity(None), daemon_spawn
    )
    yield controller, chan, bound, request.param
    stop_listener(listener)
    chan.close_all(grace_s=0)


def register(bound, agent: str, dc: str, data_addr: str) -> tuple[dict, bool]:
    """Register over a fresh connection; (the first reply, whether the channel then closed)."""
    with socket.create_connection(bound, timeout=10) as s:
        send_parts(s, protocol.register_message(dc, agent, data_addr))
        reply = read_control(s)
        if reply["t"] != "error":
            return reply, False
        try:
            closed = read_control(s) is None
        except OSError:  # reset: closed too
            closed = True
        return reply, closed


def test_check_data_addr():
    assert check_data_addr("127.0.0.5:7000", "127.0.0.1") == "127.0.0.5:7000"  # one host
    assert check_data_addr("0.0.0.0:7000", "10.0.0.4") == "10.0.0.4:7000"
    assert check_data_addr("[::]:7000", "::ffff:10.0.0.4") == "10.0.0.4:7000"
    assert check_data_addr("10.0.0.4:7000", "::ffff:10.0.0.4") == "10.0.0.4:7000"
    nets = [__import__("ipaddress").ip_network("10.1.0.0/16")]
    assert check_data_addr("10.1.2.3:7000", "10.0.0.4", nets) == "10.1.2.3:7000"
    for bad in ("10.2.0.1:7000", "agent.example:7000", "10.1.2.3", 17):
        with pytest.raises(RegistrationRefused):
            check_data_addr(bad, "10.0.0.4", nets)


def test_a_data_addr_of_a_third_party_is_refused(channel):
    controller, chan, bound, prefixes = channel
    reply, closed = register(bound, "a1", "A", "192.0.2.7:4000")
    if prefixes:  # the operator's prefix admits it
        assert reply["t"] == "registered"
        assert controller.registry.agents["a1"].data_addr == "192.0.2.7:4000"
    else:
        assert reply["t"] == "error" and reply.get("fatal") is True, reply
        assert "192.0.2.7" in reply["message"] and closed
        assert "a1" not in controller.registry.agents
    reply, _ = register(bound, "a2", "A", "0.0.0.0:4100")
    assert reply["t"] == "registered"
    assert controller.registry.agents["a2"].data_addr == "127.0.0.1:4100"


def test_an_unknown_dc_is_fatal_and_a_known_one_is_not(channel):
    controller, chan, bound, _ = channel
    reply, closed = register(bound, "z1", "Mars", "127.0.0.1:4200")
    assert reply["t"] == "error" and reply.get("fatal") is True and closed, reply
    assert "Mars" in reply["message"]
    reply, _ = register(bound, "b1", "B", "127.0.0.1:4300")
    assert reply["t"] == "registered"


def test_an_agent_with_an_unknown_dc_exits_with_the_reason(channel, tmp_path):
    controller, chan, bound, _ = channel
    data_port = free_port()
    cmd = [
        sys.executable, "-m", "terra_agent.cli", "--insecure",
        "--controller", f"{bound[0]}:{bound[1]}", "--dc", "Mars", "--id", "z1",
        "--data-addr", f"127.0.0.1:{data_port}", "--spill-dir", str(tmp_path / "spill"),
    ]  # fmt: skip
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        _, err = proc.communicate(timeout=EXIT_WITHIN_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        raise AssertionError("terra-agent kept retrying a refused registration") from None
    assert proc.returncode == 1, err
    assert "refused this agent" in err and "unknown DC 'Mars'" in err, err
    assert "z1" not in controller.registry.agents


def test_controller_data_prefix_option():
    args = build_parser().parse_args(
        ["--topology", "swan", "--insecure", "--data-prefix", "10.1.2.3/16"]
    )
    assert args.data_prefix == ["10.1.0.0/16"]
    assert build_parser().parse_args(["--topology", "swan", "--insecure"]).data_prefix is None
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--topology", "swan", "--insecure", "--data-prefix", "x/99"])


async def test_a_link_to_an_unreachable_peer_backs_off_to_seconds(autojump_clock):
    """A peer address that refuses (a third party, an agent that is down) is retried at
    most every UNREACHABLE_BACKOFF_MAX_S once the failures go on (virtual time)."""
    import trio

    from terra_agent.sender import UNREACHABLE_BACKOFF_MAX_S, PeerLink
    from terra_wire.control import TunnelSpec

    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    attempts = 0

    async def refuse(stream):
        nonlocal attempts
        attempts += 1
        await stream.aclose()  # accepts, then closes at once: never a usable link

    port = listeners[0].socket.getsockname()[1]
    spec = TunnelSpec("t0", "x", f"127.0.0.1:{port - 1}", ("A", "B"), port)
    link = PeerLink(spec, "a", "127.0.0.1", lambda *a, **k: None, lambda: None)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(trio.serve_listeners, refuse, listeners)
        nursery.start_soon(link.run)
        await trio.sleep(120)
        link.close()
        nursery.cancel_scope.cancel()
    assert UNREACHABLE_BACKOFF_MAX_S >= 10
    assert attempts <= 7 + 120 // UNREACHABLE_BACKOFF_MAX_S, attempts  # 2 s: about 60
