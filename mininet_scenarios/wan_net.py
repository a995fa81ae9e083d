"""A Mininet WAN built from a topology binding (docs/design.md section 10).

One Open vSwitch per DC (userspace datapath, OpenFlow 1.3, fail mode secure,
connected to a remote controller on 127.0.0.1), the DPIDs and port numbers of
the binding, WAN links shaped with HTB (TCLink bw=, never delay=: the kernel
has no netem), one Mininet host per agent host of the binding, checksum and
segmentation offloads off on every interface (TCP through the userspace
datapath stalls otherwise), MTU 1600 on the WAN ports (the 4-byte MPLS tag
must fit), and static ARP between agent hosts (the switches never flood).

Optionally an out-of-band management network: every host's second interface
and a root-namespace interface (`MGMT_ROOT_IP`) on a standalone L2 switch, so
agents in the hosts reach a controller running in the root namespace.

Needs root, Open vSwitch running (ovs-ctl start) and Debian's mininet (mnexec).

OVS send buffer (`ensure_ovs_send_buffer`, called by build_wan): the userspace
datapath sends every packet of every port through ONE AF_PACKET socket of
ovs-vswitchd, created with the default send buffer (net.core.wmem_default,
208 KiB). Packets waiting in the WAN ports' HTB queues count against it, so a
few queued links made every send fail with EAGAIN ("error sending Ethernet
packet ...: Resource temporarily unavailable" in ovs-vswitchd.log, thousands per
10 s): drops on all ports, host ports too, invisible in `tc -s qdisc`. TCP
connections then sat seconds in RTO backoff (agents' tunnels died with
ETIMEDOUT after the LA-NY failure). build_wan raises wmem_default and restarts
an idle ovs-vswitchd whose socket is smaller.
"""

from __future__ import annotations

import codecs
import ipaddress
import logging
import re
import subprocess
from dataclasses import dataclass, field

from mininet.link import Link, TCLink
from mininet.net import Mininet
from mininet.node import Host, Node, OVSSwitch, RemoteController

from topologies import Topology, TopologyError
from topologies.binding import Binding

MGMT_NET = ipaddress.IPv4Network("10.254.0.0/16")
MGMT_ROOT_IP = "10.254.255.254"
MGMT_SWITCH_DPID = "f000000000000001"
WAN_MTU = 1600
OFFLOADS_OFF = "tx off rx off tso off gso off gro off"
# ovs-vswitchd's shared send socket must hold every WAN queue's backlog: 14 links x 1000
# packets x ~2.3 KB (truesize of a 1518-byte frame) = 32 MB.
OVS_SEND_BUFFER_BYTES = 32 << 20
OVS_CTL = "/usr/share/openvswitch/scripts/ovs-ctl"
CONTROLLER_BACKOFF_MS = 1000  # with several controllers (OVS's minimum is 1000)

log = logging.getLogger(__name__)


def ovs_send_buffer(ss_output: str) -> int | None:
    """Send buffer (bytes) of ovs-vswitchd's unbound AF_PACKET socket in `ss -0 -m -p` output.

    That socket ("[0]:*", not bound to a port) sends the packets of every port. Returns None
    when ss lists no such socket (ovs-vswitchd not running, or no packet sent yet).
    """
    for line in ss_output.splitlines():
        if "ovs-vswitchd" in line and "[0]:*" in line:
            found = re.search(r"\btb(\d+)", line)
            if found:
                return int(found.group(1))
    return None


def ensure_ovs_send_buffer(min_bytes: int = OVS_SEND_BUFFER_BYTES) -> None:
    """Make new sockets get >= `min_bytes` send buffer; restart ovs-vswitchd if its is smaller.

    Sets net.core.wmem_default (root namespace) when lower. ovs-vswitchd keeps the socket it
    created at start-up, so when ss shows a smaller one and no bridge exists, OVS is restarted
    (ovs-ctl restart); with bridges present it only logs a warning. Errors are logged, not
    raised: the testbed still runs, with the drops described in the module docstring.
    """
    try:
        with open("/proc/sys/net/core/wmem_default") as f:
            if int(f.read()) < min_bytes:
                with open("/proc/sys/net/core/wmem_default", "w") as out:
                    out.write(str(min_bytes))
        ss = subprocess.run(["ss", "-0", "-m", "-p"], capture_output=True, text=True, timeout=10)
        have = ovs_send_buffer(ss.stdout)
        if have is None or have >= min_bytes:
            return
        bridges = subprocess.run(
            ["ovs-vsctl", "--timeout=10", "list-br"], capture_output=True, text=True, timeout=15
        ).stdout.split()
        if bridges:
            log.warning("ovs-vswitchd send buffer %d < %d bytes; bridges %s exist, not restarting",
                        have, min_bytes, bridges)  # fmt: skip
            return
        log.warning("ovs-vswitchd send buffer %d < %d bytes: restarting OVS", have, min_bytes)
        subprocess.run([OVS_CTL, "restart", "--system-id=random"], capture_output=True,
                       timeout=60, check=False)  # fmt: skip
    except (OSError, ValueError, subprocess.SubprocessError) as exc:
        log.warning("cannot check ovs-vswitchd's send buffer: %s", exc)


class _LenientShell:
    """A Mininet node whose shell output is decoded with invalid UTF-8 bytes replaced: a
    stray binary byte on a node's terminal (seen once from a shell's pty at bring-up) is
    diagnostic text, not a reason to fail the testbed (Mininet decodes strictly)."""

    def startShell(self, *args, **kwargs) -> None:  # noqa: N802 (Mininet's name)
        """Mininet's startShell with a lenient decoder in place first."""
        self.decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        super().startShell(*args, **kwargs)  # type: ignore[misc]


class LenientHost(_LenientShell, Host):
    """A Mininet Host with a lenient output decoder (_LenientShell)."""


class LenientOVS(_LenientShell, OVSSwitch):
    """An OVSSwitch with a lenient output decoder (_LenientShell)."""


class LenientNode(_LenientShell, Node):
    """A Mininet Node with a lenient output decoder (_LenientShell)."""


class LenientRemoteController(_LenientShell, RemoteController):
    """A RemoteController with a lenient output decoder (_LenientShell): Mininet checks that
    the controller listens with `telnet` from this node's shell, which then prints the
    controller's binary OpenFlow HELLO (b"\\x04\\x00\\x00\\x08...") as output."""


class StandaloneOVS(LenientOVS):
    """An OVS bridge that never connects to a controller: a plain L2 learning switch."""

    def start(self, controllers) -> None:
        """Start without controllers (fail mode standalone = normal L2 forwarding)."""
        super().start([])


@dataclass
class WanNet:
    """A started Mininet WAN. Call stop() (also on errors) to remove everything.

    Attributes:
        net: the Mininet object.
        switches: DC name -> OVSSwitch.
        hosts: agent host name -> Mininet Host.
        mgmt_ips: agent host name -> management IP (empty without a management network).
    """

    net: Mininet
    topology: Topology
    binding: Binding
    switches: dict[str, OVSSwitch]
    hosts: dict[str, Host]
    mgmt_ips: dict[str, str] = field(default_factory=dict)
    root: Node | None = None

    def set_link(self, a: str, b: str, up: bool) -> None:
        """Set the WAN link between DCs a and b down or up (both interfaces)."""
        self.topology.check_dc(a, "set_link")
        self.topology.check_dc(b, "set_link")
        if (a, b) not in self.topology.capacity:
            raise TopologyError(f"no WAN link {a}-{b}")
        self.net.configLinkStatus(
            self.switches[a].name, self.switches[b].name, "up" if up else "down"
        )

    def stop(self) -> None:
        """Stop Mininet: bridges, links, host shells and the root mgmt shell."""
        try:
            self.net.stop()
        finally:
            if self.root is not None:
                self.root.terminate()


def build_wan(
    topology: Topology,
    binding: Binding,
    of_port: int = 6653,
    link_mbps: float | None = None,
    mgmt: bool = False,
    of_ports: list[int] | None = None,
) -> WanNet:
    """Build and start the Mininet WAN of a bound topology.

    Args:
        topology: the WAN; each link is shaped to its capacity (bytes/s * 8 / 1e6
            Mbit/s) unless `link_mbps` is given.
        binding: DPIDs, ports and agent hosts (topologies.binding.load_binding).
        of_port: TCP port of the OpenFlow controller on 127.0.0.1.
        link_mbps: one HTB rate (Mbit/s) for every WAN link.
        mgmt: add the out-of-band management network (module docstring).
        of_ports: several controllers (a leader and its standbys) on 127.0.0.1, one OpenFlow
            port each, instead of `of_port`: every switch gets them all, retried at least
            every CONTROLLER_BACKOFF_MS (so a new leader is reached within about a second).

    Returns:
        The started WanNet; switches try to connect to the controller.

    Raises:
        TopologyError: a host IP inside the management subnet.
        Exception: whatever Mininet raises; everything built so far is stopped first.
    """
    for _, host in binding.all_hosts():
        if mgmt and ipaddress.IPv4Address(host.ip) in MGMT_NET:
            raise TopologyError(f"host {host.name}: {host.ip} is in the mgmt subnet {MGMT_NET}")
    ensure_ovs_send_buffer()
    net = Mininet(
        host=LenientHost,
        switch=LenientOVS,
        controller=None,
        link=Link,
        build=False,
        autoSetMacs=False,
        autoStaticArp=False,
    )
    wan = WanNet(net, topology, binding, {}, {})
    try:
        _add_nodes(wan, of_ports or [of_port], link_mbps, mgmt)
        net.build()
        net.start()
        _configure(wan, mgmt)
        if of_ports and len(of_ports) > 1:
            _controller_backoff(wan)
    except BaseException:
        wan.stop()
        raise
    return wan


def _add_nodes(wan: WanNet, of_ports: list[int], link_mbps: float | None, mgmt: bool) -> None:
    net, topology, binding = wan.net, wan.topology, wan.binding
    for i, port in enumerate(of_ports):
        net.addController(f"c{i}", controller=LenientRemoteController, ip="127.0.0.1",
                          port=port)  # fmt: skip
    for dc, sw in binding.switches.items():
        wan.switches[dc] = net.addSwitch(
            f"s{sw.dpid}",
            dpid=f"{sw.dpid:016x}",
            datapath="user",
            protocols="OpenFlow13",
            failMode="secure",
        )
    for (u, v), cap in sorted(topology.capacity.items()):
        if topology.dcs.index(u) < topology.dcs.index(v):
            mbps = link_mbps if link_mbps is not None else cap * 8 / 1e6
            net.addLink(
                wan.switches[u],
                wan.switches[v],
                cls=TCLink,
                bw=mbps,
                port1=binding.port_to(u, v),
                port2=binding.port_to(v, u),
            )
    for dc, host in binding.all_hosts():
        mac = host.mac or "00:00:" + ":".join(f"{int(x):02x}" for x in host.ip.split("."))
        wan.hosts[host.name] = net.addHost(host.name, ip=f"{host.ip}/8", mac=mac)
        net.addLink(wan.hosts[host.name], wan.switches[dc], port2=host.port)
    if mgmt:
        msw = net.addSwitch(
            "mgmt0",
            cls=StandaloneOVS,
            dpid=MGMT_SWITCH_DPID,
            datapath="user",
            failMode="standalone",
        )
        for i, name in enumerate(wan.hosts):
            net.addLink(wan.hosts[name], msw)
            wan.mgmt_ips[name] = str(MGMT_NET.network_address + i + 1)
        wan.root = LenientNode("root", inNamespace=False)
        net.addLink(wan.root, msw)


def _configure(wan: WanNet, mgmt: bool) -> None:
    for host in wan.hosts.values():
        for intf in host.intfList():
            if intf.name != "lo":
                host.cmd(f"ethtool -K {intf.name} {OFFLOADS_OFF}")
    for sw in wan.switches.values():
        for intf in sw.intfList():
            if intf.name != "lo":
                _root(f"ethtool -K {intf.name} {OFFLOADS_OFF}")
                if intf.link and isinstance(intf.link, TCLink):
                    _root(f"ip link set {intf.name} mtu {WAN_MTU}")
    wan.net.staticArp()
    if mgmt:
        for name, ip in wan.mgmt_ips.items():
            intf = wan.hosts[name].intfList()[1]
            wan.hosts[name].cmd(f"ip addr add {ip}/{MGMT_NET.prefixlen} dev {intf.name}")
            wan.hosts[name].cmd(f"ethtool -K {intf.name} {OFFLOADS_OFF}")
        rintf = wan.root.intfList()[0].name
        _root(f"ip addr add {MGMT_ROOT_IP}/{MGMT_NET.prefixlen} dev {rintf}")
        _root(f"ip link set {rintf} up")
        _root(f"ethtool -K {rintf} {OFFLOADS_OFF}")
        for intf in wan.net["mgmt0"].intfList():
            if intf.name != "lo":
                _root(f"ethtool -K {intf.name} {OFFLOADS_OFF}")


def _controller_backoff(wan: WanNet) -> None:
    """Set max_backoff of every switch's controller records to CONTROLLER_BACKOFF_MS (OVS's
    default, 8 s, would leave a switch up to 8 s away from a newly elected leader: standbys
    do not listen on their OpenFlow port)."""
    for sw in wan.switches.values():
        out = subprocess.run(["ovs-vsctl", "get", "bridge", sw.name, "controller"],
                             capture_output=True, text=True, check=True).stdout  # fmt: skip
        for uuid in out.strip().strip("[]").split(","):
            subprocess.run(["ovs-vsctl", "set", "controller", uuid.strip(),
                            f"max_backoff={CONTROLLER_BACKOFF_MS}"], check=True)  # fmt: skip


def _root(command: str) -> None:
    subprocess.run(command, shell=True, check=False, capture_output=True)


def cleanup() -> None:
    """Remove everything Mininet may have left behind (`mn -c`), quietly."""
    subprocess.run(["mn", "-c"], check=False, capture_output=True)
