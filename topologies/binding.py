"""The binding of a topology to switches: DPID per DC, port per WAN link, agent hosts.

It extends our JSON topology format (topologies/loaders.py keeps unknown
top-level keys in `Topology.attrs`) with two keys (docs/design.md section 5)::

    "tunnel_base_port": 20000,
    "switches": {
      "HK": {"dpid": 1,
             "ports": {"LA": 1, "NY": 2},
             "hosts": [{"name": "hHK1", "ip": "10.0.1.1", "port": 10}]},
      ...
    }

- `dpid`: the OpenFlow datapath id of the DC's switch (positive integer, unique).
- `ports`: neighbour DC -> the switch port that faces the WAN link to it; every
  link of the topology needs a port at both ends.
- `hosts`: the agent hosts attached to the switch: a name (Mininet node name),
  an IPv4 address (unique) and the switch port; optional "mac".
- `tunnel_base_port`: agents connect for path index i of a DC pair to TCP port
  base + i of the destination agent (default 20000, below Linux's ephemeral
  port range 32768-60999 so that no client port is mistaken for a tunnel port).
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field

from topologies.topology import Link, Topology, TopologyError

DEFAULT_TUNNEL_BASE_PORT = 20000
MAX_OF_PORT = 0xFFFFFF00  # OFPP_MAX: larger numbers are reserved ports


@dataclass(frozen=True)
class HostBinding:
    """An agent host: Mininet node `name`, IPv4 `ip`, switch `port`, optional `mac`."""

    name: str
    ip: str
    port: int
    mac: str | None = None


@dataclass(frozen=True)
class SwitchBinding:
    """One DC's switch: `dpid`, `ports` {neighbour DC: port}, `hosts` attached to it."""

    dc: str
    dpid: int
    ports: dict[str, int]
    hosts: tuple[HostBinding, ...]


@dataclass
class Binding:
    """The switches of a topology, by DC name, and the tunnel base TCP port.

    Attributes:
        switches: DC name -> SwitchBinding.
        base_port: TCP port of path index 0 (path i uses base_port + i).
    """

    switches: dict[str, SwitchBinding]
    base_port: int = DEFAULT_TUNNEL_BASE_PORT
    _by_dpid: dict[int, str] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        self._by_dpid = {sw.dpid: dc for dc, sw in self.switches.items()}

    def dc_of(self, dpid: int) -> str | None:
        """Return the DC whose switch has datapath id `dpid`, or None."""
        return self._by_dpid.get(dpid)

    def dpid_of(self, dc: str) -> int:
        """Return the datapath id of DC `dc`'s switch (KeyError when unbound)."""
        return self.switches[dc].dpid

    def port_to(self, dc: str, neighbour: str) -> int:
        """Return the port of `dc`'s switch that faces the link to `neighbour`."""
        return self.switches[dc].ports[neighbour]

    def link_of_port(self, dpid: int, port: int) -> Link | None:
        """Return the directed WAN link (this DC, neighbour) behind a switch port, or None.

        None for host ports, unknown ports and unknown switches.
        """
        dc = self.dc_of(dpid)
        if dc is None:
            return None
        for neighbour, p in self.switches[dc].ports.items():
            if p == port:
                return (dc, neighbour)
        return None

    def hosts(self, dc: str) -> tuple[HostBinding, ...]:
        """Return the agent hosts of DC `dc`."""
        return self.switches[dc].hosts

    def all_hosts(self) -> list[tuple[str, HostBinding]]:
        """Return [(dc, host), ...] for every agent host, in DC order."""
        return [(dc, h) for dc, sw in self.switches.items() for h in sw.hosts]


def load_binding(topology: Topology) -> Binding:
    """Parse and validate the binding kept in `topology.attrs` (see module docstring).

    Returns:
        The Binding, switches in the topology's DC order.

    Raises:
        TopologyError: no "switches" key, a DC without a switch or an unknown
            DC, a duplicate DPID / port / host name / IP, a link without a
            port at one end, a port facing a non-neighbour, a bad number or IP.
    """
    where = f"topology {topology.name}"
    raw = topology.attrs.get("switches")
    if not isinstance(raw, dict):
        raise TopologyError(f"{where}: no 'switches' binding (an object keyed by DC name)")
    unknown = sorted(set(raw) - set(topology.dcs))
    if unknown:
        raise TopologyError(f"{where}: switches: unknown DCs {unknown}")
    base = topology.attrs.get("tunnel_base_port", DEFAULT_TUNNEL_BASE_PORT)
    if isinstance(base, bool) or not isinstance(base, int) or not 1 <= base <= 65535 - 64:
        raise TopologyError(f"{where}: tunnel_base_port must be an integer in 1..65471")
    switches: dict[str, SwitchBinding] = {}
    for dc in topology.dcs:
        if dc not in raw:
            raise TopologyError(f"{where}: switches: DC {dc!r} has no switch")
        switches[dc] = _parse_switch(topology, dc, raw[dc], f"{where}: switches.{dc}")
    _check_unique(
        [(sw.dpid, f"dpid of {dc}") for dc, sw in switches.items()], f"{where}: duplicate dpid"
    )
    hosts = [(dc, h) for dc, sw in switches.items() for h in sw.hosts]
    _check_unique([(h.name, dc) for dc, h in hosts], f"{where}: duplicate host name")
    _check_unique([(h.ip, h.name) for _, h in hosts], f"{where}: duplicate host ip")
    return Binding(switches, base)


def _parse_switch(topology: Topology, dc: str, raw: object, where: str) -> SwitchBinding:
    if not isinstance(raw, dict):
        raise TopologyError(f"{where}: must be an object with dpid, ports, hosts")
    dpid = _int(raw.get("dpid"), f"{where}.dpid", 1, 2**64 - 1)
    neighbours = {v for (u, v) in topology.capacity if u == dc}
    ports_raw = raw.get("ports")
    if not isinstance(ports_raw, dict):
        raise TopologyError(f"{where}.ports: must be an object {{neighbour DC: port}}")
    extra = sorted(set(ports_raw) - neighbours)
    if extra:
        raise TopologyError(f"{where}.ports: {extra} are not neighbours of {dc}")
    missing = sorted(neighbours - set(ports_raw))
    if missing:
        raise TopologyError(f"{where}.ports: no port for the links to {missing}")
    ports = {n: _int(p, f"{where}.ports.{n}", 1, MAX_OF_PORT) for n, p in ports_raw.items()}
    hosts_raw = raw.get("hosts", [])
    if not isinstance(hosts_raw, list):
        raise TopologyError(f"{where}.hosts: must be a list")
    hosts = tuple(_parse_host(h, f"{where}.hosts[{i}]") for i, h in enumerate(hosts_raw))
    _check_unique(
        [(p, f"link to {n}") for n, p in ports.items()] + [(h.port, h.name) for h in hosts],
        f"{where}: port used twice",
    )
    return SwitchBinding(dc, dpid, ports, hosts)


def _parse_host(raw: object, where: str) -> HostBinding:
    if not isinstance(raw, dict):
        raise TopologyError(f"{where}: must be an object with name, ip, port")
    name = raw.get("name")
    if not isinstance(name, str) or not name:
        raise TopologyError(f"{where}.name: must be a non-empty string")
    ip = raw.get("ip")
    try:
        ip = str(ipaddress.IPv4Address(ip))
    except ValueError as exc:
        raise TopologyError(f"{where}.ip: not an IPv4 address: {ip!r}") from exc
    mac = raw.get("mac")
    if mac is not None and not isinstance(mac, str):
        raise TopologyError(f"{where}.mac: must be a string")
    return HostBinding(name, ip, _int(raw.get("port"), f"{where}.port", 1, MAX_OF_PORT), mac)


def _int(value: object, where: str, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise TopologyError(f"{where}: must be an integer in {low}..{high}, got {value!r}")
    return value


def _check_unique(items: list[tuple[object, str]], message: str) -> None:
    seen: dict[object, str] = {}
    for value, owner in items:
        if value in seen:
            raise TopologyError(f"{message}: {value!r} ({seen[value]} and {owner})")
        seen[value] = owner


def make_binding(
    topology: Topology,
    hosts_per_dc: int = 1,
    base_port: int = DEFAULT_TUNNEL_BASE_PORT,
    first_host_port: int = 100,
) -> dict:
    """Return a default binding, as the JSON-ready dict to merge into `topology.attrs`.

    DC number i (0-based, topology order) gets DPID i+1; its WAN ports are
    1, 2, ... in the order of its neighbours in `topology.dcs`; its hosts
    "h<i+1>x<j+1>" get IPs 10.0.<i+1>.<j+1> and ports first_host_port + j.

    Returns:
        {"tunnel_base_port": base_port, "switches": {dc: {...}}}.

    Raises:
        TopologyError: hosts_per_dc not in 0..250, or more than 254 DCs.
    """
    if not 0 <= hosts_per_dc <= 250 or len(topology.dcs) > 254:
        raise TopologyError("make_binding: at most 254 DCs and 250 hosts per DC")
    switches = {}
    for i, dc in enumerate(topology.dcs):
        neighbours = [n for n in topology.dcs if (dc, n) in topology.capacity]
        switches[dc] = {
            "dpid": i + 1,
            "ports": {n: p + 1 for p, n in enumerate(neighbours)},
            "hosts": [
                {
                    "name": f"h{i + 1}x{j + 1}",
                    "ip": f"10.0.{i + 1}.{j + 1}",
                    "port": first_host_port + j,
                }
                for j in range(hosts_per_dc)
            ],
        }
    return {"tunnel_base_port": base_port, "switches": switches}
