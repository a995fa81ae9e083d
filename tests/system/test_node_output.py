"""The testbed's Mininet nodes read their shells' output with invalid UTF-8 replaced
(mininet_scenarios/wan_net.py): binary bytes on a node's terminal, such as the OpenFlow
HELLO that Mininet's own `telnet` check of a controller prints, are not a testbed error.
Mininet's plain nodes decode strictly and fail on them (checked too, so the test can fail)."""

from __future__ import annotations

import socket
import threading

import pytest

pytestmark = [pytest.mark.ovs, pytest.mark.filterwarnings("ignore::DeprecationWarning:mininet")]

BINARY = "printf 'ok \\244\\n'"  # 0xa4: not a UTF-8 start byte
HELLO = b'\x04\x00\x00\x08b"\xa5='  # an OpenFlow 1.3 HELLO, as a controller greets


@pytest.mark.parametrize("kind", ["Node", "RemoteController"])
def test_a_lenient_node_reads_binary_output_a_plain_one_fails(ovs, kind):
    from mininet import node

    from mininet_scenarios import wan_net

    plain = getattr(node, kind)("plain9", inNamespace=False)
    lenient = getattr(wan_net, f"Lenient{kind}")("lenient9", inNamespace=False)
    try:
        with pytest.raises(UnicodeDecodeError):
            plain.cmd(BINARY)
        assert lenient.cmd(BINARY).strip() == "ok \ufffd"
        assert lenient.cmd("echo after").strip() == "after"  # the shell goes on
    finally:
        plain.terminate()
        lenient.terminate()


def test_the_controller_check_survives_an_openflow_hello(ovs):
    """Mininet's RemoteController.checkListening telnets to the controller's port from the
    node's shell; a listener that greets with a binary OpenFlow HELLO (as os-ken does)."""
    from mininet_scenarios.wan_net import LenientRemoteController

    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]

    def greet() -> None:
        listener.settimeout(30)
        for _ in range(2):  # Mininet may probe twice
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            with conn:
                conn.sendall(HELLO)

    threading.Thread(target=greet, daemon=True).start()
    ctl = LenientRemoteController("c9", ip="127.0.0.1", port=port)
    try:
        ctl.checkListening()  # no UnicodeDecodeError
        assert ctl.cmd("echo after").strip() == "after"
    finally:
        ctl.terminate()
        listener.close()
