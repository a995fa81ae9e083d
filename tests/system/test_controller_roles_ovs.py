"""Two controllers on etcd and real Open vSwitch switches: the switches see exactly one
master, a standby cut off from etcd never acts as leader, not even when the leader dies, and
a leader whose lease is revoked while it runs hands the switches to the new master.

Three DCs in a triangle (Mininet, userspace OVS, no agents), a one-member etcd on loopback,
controller A reaching etcd directly and controller B through a TCP relay the test can cut
(B's partition from etcd). Every switch is given both controllers' OpenFlow targets; the
roles come from OVS's Controller table (`is_connected`, `role`).
"""

from __future__ import annotations

import json
import socket
import subprocess
import time
import urllib.request

import pytest
from switch_triangle import bound_triangle

from benchmarks.harness import free_port, start_etcd, stop_processes
from benchmarks.tcp_relay import TcpRelay
from mininet_scenarios.testbed_processes import controller_argv
from terra_security.pki import client_context
from topologies.binding import load_binding
from topologies.loaders import load_json_topology

pytestmark = [pytest.mark.ovs, pytest.mark.filterwarnings("ignore::DeprecationWarning:mininet")]
LEASE_TTL_S = 2


class Ctl:
    """One terra-controller --etcd (OpenFlow mode) with fixed ports."""

    def __init__(self, topo, pki, workdir, name: str, etcd: str) -> None:
        self.name = name
        self.ports = {p: free_port() for p in ("api", "agents", "rest", "of")}
        argv = controller_argv(
            topo, 2, self.ports["of"], pki, "terra", workdir,
            api=f"127.0.0.1:{self.ports['api']}", agents=f"127.0.0.1:{self.ports['agents']}",
            rest=f"127.0.0.1:{self.ports['rest']}",
            extra=("--etcd", etcd, "--cluster", "roles", "--lease-ttl", str(LEASE_TTL_S),
                   "--advertise", "127.0.0.1"),
        )  # fmt: skip
        self.log = workdir / f"{name}.log"
        with open(self.log, "a") as log:
            self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=log, text=True)
        self.tls = client_context(pki, "operator1")  # REST beyond /healthz: an operator
        self.tls.check_hostname = False

    def line(self) -> str:
        return self.proc.stdout.readline()

    def rest(self, path: str) -> dict | None:
        url = f"https://127.0.0.1:{self.ports['rest']}{path}"
        try:
            with urllib.request.urlopen(url, timeout=2, context=self.tls) as reply:
                return json.loads(reply.read())
        except OSError:
            return None

    def target(self) -> str:
        return f"tcp:127.0.0.1:{self.ports['of']}"

    def listens_for_switches(self) -> bool:
        with socket.socket() as s:
            return s.connect_ex(("127.0.0.1", self.ports["of"])) == 0


def controller_roles(wan) -> dict[str, dict[str, tuple[bool, str]]]:
    """{bridge: {target: (is_connected, role)}} from OVS's Controller table."""
    out = {}
    for sw in wan.switches.values():
        uuids = subprocess.run(["ovs-vsctl", "get", "bridge", sw.name, "controller"],
                               capture_output=True, text=True, check=True).stdout  # fmt: skip
        rows = {}
        for uuid in uuids.strip().strip("[]").split(","):
            got = subprocess.run(
                ["ovs-vsctl", "--format=json", "--columns=target,is_connected,role", "list",
                 "controller", uuid.strip()], capture_output=True, text=True, check=True,
            ).stdout  # fmt: skip
            target, connected, role = json.loads(got)["data"][0]
            rows[target] = (connected, role if isinstance(role, str) else "")
        out[sw.name] = rows
    return out


def masters(wan) -> dict[str, list[str]]:
    """{bridge: [targets connected with role master]}."""
    return {
        br: [t for t, (connected, role) in rows.items() if connected and role == "master"]
        for br, rows in controller_roles(wan).items()
    }


def wait_until(predicate, timeout: float, what: str) -> None:
    end = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > end:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.1)


@pytest.fixture
def cluster(ovs, pki, tmp_path):
    """etcd, the relay, A leading, B standing by behind the relay, the triangle WAN."""
    from mininet.log import setLogLevel

    from mininet_scenarios.wan_net import build_wan, cleanup

    setLogLevel("critical")
    topo_path = bound_triangle(tmp_path)
    topo = load_json_topology(topo_path)
    etcd, addrs = start_etcd(tmp_path, 1)
    host, port = addrs[0].rsplit(":", 1)
    relay = TcpRelay(f"{host}:{port}")
    ctls, wan = [], None
    try:
        a = Ctl(topo_path, pki, tmp_path, "a", addrs[0])
        ctls.append(a)
        assert a.line().startswith("terra-controller standby")
        assert a.line().startswith("terra-controller ready")  # the only one: it leads
        b = Ctl(topo_path, pki, tmp_path, "b", f"127.0.0.1:{relay.port}")
        ctls.append(b)
        assert b.line().startswith("terra-controller standby")
        wan = build_wan(topo, load_binding(topo), of_ports=[a.ports["of"], b.ports["of"]])
        yield a, b, relay, wan
    finally:
        try:
            if wan is not None:
                wan.stop()
        except Exception:
            cleanup()  # `mn -c`: only when Mininet could not undo its own work
            raise
        finally:
            relay.close()
            stop_processes([p for p in [*(c.proc for c in ctls), *etcd] if p.poll() is None])


def test_a_standby_cut_off_from_etcd_never_leads_and_the_switches_see_one_master(cluster):
    a, b, relay, wan = cluster
    bridges = [sw.name for sw in wan.switches.values()]
    wait_until(lambda: masters(wan) == {br: [a.target()] for br in bridges}, 30, "A master")
    wait_until(lambda: (a.rest("/tunnels") or {}).get("switches", {}).get("installed"), 30,
               "A's rules")  # fmt: skip
    assert all(not rows[b.target()][0] for rows in controller_roles(wan).values())
    assert (b.rest("/healthz") or {}).get("role") == "standby"

    relay.cut()  # B cannot reach etcd: A keeps leading, B stays a standby
    time.sleep(3 * LEASE_TTL_S)
    assert (a.rest("/healthz") or {})["role"] == "leader"
    assert (b.rest("/healthz") or {})["role"] == "standby"
    assert masters(wan) == {br: [a.target()] for br in bridges}

    a.proc.kill()  # the leader dies while B is cut off: nobody may lead
    a.proc.wait()
    time.sleep(3 * LEASE_TTL_S)
    assert (b.rest("/healthz") or {})["role"] == "standby"
    assert not b.listens_for_switches()
    assert masters(wan) == {br: [] for br in bridges}

    relay.heal()  # B reaches etcd again: A's lease is long gone, B leads
    wait_until(lambda: (b.rest("/healthz") or {}).get("role") == "leader", 30, "B leading")
    wait_until(lambda: masters(wan) == {br: [b.target()] for br in bridges}, 30, "B master")
    wait_until(lambda: (b.rest("/tunnels") or {}).get("switches", {}).get("installed"), 30,
               "B's rules")  # fmt: skip
    switches = b.rest("/tunnels")["switches"]
    assert switches["flow_mods_at_install"] == 0  # the tables held A's rules: nothing sent
    assert switches["flow_mods"] == 0


def test_a_leader_whose_lease_is_revoked_hands_the_switches_to_the_new_master(cluster):
    """A's lease is revoked while A runs (as a standby does when it sees A's liveness
    connection closed): A gives up at once and stops listening for switches, and B becomes
    every switch's only master with 0 flow-mods. (OVS's Controller table refreshes its role
    columns lazily, so a read during the change may show a role already given up; the
    switch itself demotes the old master when the new one's ROLE_REQUEST arrives.)"""
    from terra_controller.etcd_state import EtcdState

    a, b, relay, wan = cluster
    bridges = [sw.name for sw in wan.switches.values()]
    wait_until(lambda: masters(wan) == {br: [a.target()] for br in bridges}, 30, "A master")
    wait_until(lambda: (a.rest("/tunnels") or {}).get("switches", {}).get("installed"), 30,
               "A's rules")  # fmt: skip
    state = EtcdState([relay.target], "roles")
    state.revoke(state.leader()["lease"])
    wait_until(lambda: masters(wan) == {br: [b.target()] for br in bridges}, 30, "B master")
    assert a.proc.poll() is None  # A runs on, as a standby
    wait_until(lambda: (a.rest("/healthz") or {}).get("role") == "standby", 30, "A standby")
    assert not a.listens_for_switches()
    log = a.log.read_text()  # (the watch sees the key deleted, or the next refresh is
    # told the lease expired, whichever comes first: a revoked lease is both)
    assert ("leadership lost: the leader key is gone" in log
            or "leadership lost: the leader lease expired" in log), log  # fmt: skip
    wait_until(lambda: (b.rest("/tunnels") or {}).get("switches", {}).get("installed"), 30,
               "B's rules")  # fmt: skip
    assert b.rest("/tunnels")["switches"]["flow_mods"] == 0  # the tables held A's rules
