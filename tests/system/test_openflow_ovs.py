"""The os-ken tunnel app against real Open vSwitch (userspace datapath) in Mininet.

Three DCs in a triangle (A-B, B-C, A-C), one switch and one agent host each, K=2:
every ordered pair has the direct path (index 0) and the two-hop path (index 1).
The app runs in a subprocess (`python -m terra_controller.openflow_app`) that
prints one JSON line per event; its link-change line is written by the
on_link_change callback, so it shows both the PortStatus and the callback.
"""

from __future__ import annotations

import json
import queue
import re
import select
import socket
import subprocess
import sys
import threading
import time

import pytest

from benchmarks.harness import free_port
from terra_controller.tunnels import build_tunnels, compile_rules, rules_per_switch
from topologies import Topology
from topologies.binding import load_binding, make_binding
from topologies.loaders import load_json_topology

pytestmark = [pytest.mark.ovs, pytest.mark.filterwarnings("ignore::DeprecationWarning:mininet")]
K = 2
LINK_MBPS = 20
TCP_BYTES = 2**21  # 2 MiB, a multiple of the 256-byte pattern

SINK = """
import hashlib, socket, sys
srv = socket.socket(); srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
srv.bind(("0.0.0.0", int(sys.argv[1]))); srv.listen(1); print("ready", flush=True)
conn, _ = srv.accept(); h = hashlib.sha256(); n = 0
while chunk := conn.recv(65536):
    h.update(chunk); n += len(chunk)
conn.sendall(f"{n} {h.hexdigest()}".encode()); conn.close()
"""

SOURCE = """
import hashlib, socket, sys
data = bytes(range(256)) * (int(sys.argv[3]) // 256)
conn = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=60)
conn.sendall(data); conn.shutdown(socket.SHUT_WR)
reply = b""
while chunk := conn.recv(4096):
    reply += chunk
print(len(data), hashlib.sha256(data).hexdigest(), "|", reply.decode(), flush=True)
"""


class AppProcess:
    """The app subprocess and a queue of the JSON events it prints."""

    def __init__(self, topology_file: str, of_port: int):
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "terra_controller.openflow_app",
                topology_file,
                "--k",
                str(K),
                "--of-port",
                str(of_port),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        self.events: queue.Queue = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.events.put(json.loads(line))

    def next_event(self, kind: str, timeout: float = 30.0) -> dict:
        while True:
            try:
                event = self.events.get(timeout=timeout)
            except queue.Empty:
                raise AssertionError(f"no {kind!r} event from the app in {timeout} s") from None
            if event["event"] == kind:
                return event

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture(scope="module")
def testbed(ovs, tmp_path_factory):
    from mininet.log import setLogLevel

    from mininet_scenarios.wan_net import build_wan, cleanup

    setLogLevel("critical")
    doc = {
        "name": "triangle",
        "default_capacity_gbps": LINK_MBPS / 1000,
        "dcs": ["A", "B", "C"],
        "links": [{"a": "A", "b": "B"}, {"a": "B", "b": "C"}, {"a": "A", "b": "C"}],
    }
    path = tmp_path_factory.mktemp("ovs") / "triangle.json"
    path.write_text(json.dumps(doc))
    topo = load_json_topology(path)
    doc.update(make_binding(topo))
    path.write_text(json.dumps(doc))
    topo = load_json_topology(path)
    binding = load_binding(topo)
    app = AppProcess(str(path), free_port())
    wan = None
    try:
        app.next_event("listening")
        of_port = int(app.proc.args[-1])
        wan = build_wan(topo, binding, of_port=of_port, mgmt=True)
        installed = app.next_event("installed")
        yield topo, binding, wan, app, installed
    finally:
        try:
            if wan is not None:
                wan.stop()
        except Exception:
            cleanup()  # `mn -c`: only when Mininet could not undo its own work
            raise
        finally:
            app.stop()


def dump_flows(bridge: str) -> list[str]:
    out = subprocess.run(
        ["ovs-ofctl", "-O", "OpenFlow13", "dump-flows", bridge],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return [line for line in out.splitlines() if "cookie=" in line]


def packets_with_cookie(bridge: str, cookie: int) -> int:
    lines = [ln for ln in dump_flows(bridge) if f"cookie={cookie:#x}," in ln]
    return sum(int(re.search(r"n_packets=(\d+)", ln).group(1)) for ln in lines)


def flow_counts(wan, binding) -> dict[str, int]:
    return {dc: len(dump_flows(wan.switches[dc].name)) for dc in binding.switches}


def wait_for_counts(wan, binding, expected: dict[str, int], timeout: float = 10.0) -> bool:
    """Poll dump-flows until every switch has the expected number of entries."""
    deadline = time.monotonic() + timeout
    while flow_counts(wan, binding) != expected:
        if time.monotonic() > deadline:
            print("flow counts", flow_counts(wan, binding), "expected", expected)
            return False
        time.sleep(0.1)
    return True


def transfer(wan, src: str, dst: str, port: int) -> tuple[str, str]:
    """Send TCP_BYTES from host src to host dst:port; return (sent, received) size+sha256."""
    sink = wan.hosts[dst].popen(
        [sys.executable, "-c", SINK, str(port)], stdout=subprocess.PIPE, text=True
    )
    try:
        ready, _, _ = select.select([sink.stdout], [], [], 30)
        assert ready and sink.stdout.readline().strip() == "ready"
        source = wan.hosts[src].popen(
            [sys.executable, "-c", SOURCE, wan.hosts[dst].IP(), str(port), str(TCP_BYTES)],
            stdout=subprocess.PIPE,
            text=True,
        )
        out, _ = source.communicate(timeout=120)
        sent, _, received = out.strip().partition(" | ")
        return sent, received
    finally:
        sink.kill()
        sink.wait()


def test_rules_installed_match_the_compiler(testbed):
    topo, binding, wan, app, installed = testbed
    expected = rules_per_switch(compile_rules(build_tunnels(topo, K, binding.base_port), binding))
    # Triangle, K=2: 6 ordered pairs x 2 paths = 12 tunnels.
    assert installed["tunnels"] == 12
    assert {int(d): n for d, n in installed["rules_per_switch"].items()} == expected
    for dc, sw in binding.switches.items():
        assert len(dump_flows(wan.switches[dc].name)) == expected[sw.dpid], dc


def test_tcp_rides_the_tunnel_it_was_classified_to(testbed):
    topo, binding, wan, app, installed = testbed
    tunnels = build_tunnels(topo, K, binding.base_port)
    hA, hB = binding.hosts("A")[0].name, binding.hosts("B")[0].name
    for index in range(K):
        tunnel = next(t for t in tunnels if (t.src, t.dst, t.index) == ("A", "B", index))
        before = packets_with_cookie(wan.switches["B"].name, tunnel.cookie)
        before_c = packets_with_cookie(wan.switches["C"].name, tunnel.cookie)
        sent, received = transfer(wan, hA, hB, tunnel.tcp_port)
        assert sent == received and sent.startswith(f"{TCP_BYTES} ")
        # The egress (B) popped this tunnel's labels (data, and its own reverse classification
        # of the ACKs), and the transit switch C forwarded them only for the two-hop path.
        assert packets_with_cookie(wan.switches["B"].name, tunnel.cookie) > before + 100
        via_c = packets_with_cookie(wan.switches["C"].name, tunnel.cookie) - before_c
        assert tunnel.path == (("A", "B") if index == 0 else ("A", "C", "B"))
        assert (via_c > 100) == (index == 1)


def test_link_down_sends_port_status_removes_tunnels_and_calls_back(testbed):
    topo, binding, wan, app, installed = testbed
    tunnels = build_tunnels(topo, K, binding.base_port)
    crossing = sorted(t.tunnel_id for t in tunnels if t.uses(("A", "B")))
    full = flow_counts(wan, binding)
    wan.set_link("A", "B", up=False)
    try:
        event = app.next_event("link")
        assert event["up"] is False and sorted(event["link"]) == ["A", "B"]
        assert event["tunnels"] == crossing and event["flow_mods"] > 0
        topo_down = topo.copy()
        topo_down.set_link_state("A", "B", up=False)
        up = {t.tunnel_id for t in tunnels} - set(crossing)
        expected = rules_per_switch(compile_rules(tunnels, binding, up))
        # The callback runs once the flow-mods are sent; the switches apply them shortly after.
        assert wait_for_counts(
            wan, binding, {dc: expected[sw.dpid] for dc, sw in binding.switches.items()}
        )
        # A->B traffic on the direct tunnel's port now takes the default route via C.
        tunnel = next(t for t in tunnels if (t.src, t.dst, t.index) == ("A", "B", 0))
        sent, received = transfer(
            wan, binding.hosts("A")[0].name, binding.hosts("B")[0].name, tunnel.tcp_port
        )
        assert sent == received
    finally:
        wan.set_link("A", "B", up=True)
    event = app.next_event("link")
    assert event["up"] is True and event["tunnels"] == crossing
    assert wait_for_counts(wan, binding, full)


def set_controller(wan, binding, of_port: int) -> None:
    """Point every switch at the app listening on of_port (its flows stay: fail-mode secure)."""
    for dc in binding.switches:
        subprocess.run(["ovs-vsctl", "set-controller", wan.switches[dc].name,
                        f"tcp:127.0.0.1:{of_port}"], check=True)  # fmt: skip


def test_a_new_app_reads_the_switches_installs_nothing_and_learns_a_down_link(testbed):
    """A controller that starts over (restart, failover) reads each switch's ports and flow
    table: with the link A-B down and the rules already following it, it sends no
    flow-mod and reports the link down."""
    topo, binding, wan, app, installed = testbed
    full = flow_counts(wan, binding)
    wan.set_link("A", "B", up=False)
    assert app.next_event("link")["up"] is False
    second = AppProcess(app.proc.args[3], free_port())
    try:
        second.next_event("listening")
        set_controller(wan, binding, int(second.proc.args[-1]))
        done = second.next_event("installed")
        assert done["flow_mods"] == 0 and done["tunnels"] == 12
        link = second.next_event("link")
        assert link["up"] is False and sorted(link["link"]) == ["A", "B"]
        assert link["flow_mods"] == 0
    finally:
        set_controller(wan, binding, int(app.proc.args[-1]))
        second.stop()
        wan.set_link("A", "B", up=True)
    event = app.next_event("link")
    assert event["up"] is True
    assert wait_for_counts(wan, binding, full)


def test_hosts_reach_the_root_namespace_over_the_management_network(testbed):
    from mininet_scenarios.wan_net import MGMT_ROOT_IP

    topo, binding, wan, app, installed = testbed
    with socket.socket() as server:
        server.bind((MGMT_ROOT_IP, 0))
        server.listen(8)
        server.settimeout(30)
        port = server.getsockname()[1]
        for name, host in wan.hosts.items():
            client = host.popen(
                [
                    sys.executable,
                    "-c",
                    "import socket, sys; socket.create_connection("
                    "(sys.argv[1], int(sys.argv[2])), timeout=10).sendall(sys.argv[3].encode())",
                    MGMT_ROOT_IP,
                    str(port),
                    name,
                ]
            )
            conn, (peer_ip, _) = server.accept()
            with conn:
                assert conn.recv(100).decode() == name
            assert peer_ip == wan.mgmt_ips[name]
            assert client.wait(timeout=10) == 0


def test_binding_of_the_triangle_is_what_the_test_assumes():
    topo = Topology("t", ["A", "B", "C"], {(u, v): 1.0 for u in "ABC" for v in "ABC" if u != v})
    topo.attrs.update(make_binding(topo))
    binding = load_binding(topo)
    assert binding.port_to("A", "B") == 1 and binding.port_to("A", "C") == 2
    assert [h.ip for _, h in binding.all_hosts()] == ["10.0.1.1", "10.0.2.1", "10.0.3.1"]
