"""Tunnels and the tunnel rule compiler: a pure function from paths to OpenFlow 1.3 entries.

docs/design.md section 5. For every ordered DC pair (s, d) and each
of its <= K paths (topologies.all_pairs_paths, computed once with every link
up) there is one tunnel. Agents open one TCP connection per (peer agent,
tunnel): the connection for path index i goes to TCP port base + i of the
destination agent, so

- the ingress switch (s) classifies IPv4/TCP packets by (ipv4_dst = an agent
  host of d, tcp_dst = base + i), pushes an MPLS label (the tunnel's forward
  label) and outputs towards the path's next DC;
- transit switches forward on the label;
- the egress switch (d) pops the label and hands the packet to table 1, which
  delivers by ipv4_dst to the host port;
- the reverse direction (ACKs of the same connection, d -> s) is pinned to the
  same path reversed: the ingress switch d classifies (ipv4_dst = an agent
  host of s, tcp_src = base + i) and pushes the tunnel's reverse label.

Non-tunnel IPv4 between agent hosts (ping, the per-flow TCP baseline) takes a
default route: the pair's first tunnel that is up, at a lower priority. ARP is
not forwarded: hosts get static ARP entries (Mininet's staticArp), so a WAN
with cycles never floods. Everything else hits the table-miss entry: drop.
The agents reach the controller over an out-of-band management network, which
these rules do not touch.

Table 0 priorities: 400 local delivery, 300 tunnel classification,
200 label forwarding / pop, 100 default route, 0 drop. Table 1: 100 delivery
by ipv4_dst, 0 drop. Every entry of a tunnel carries cookie = tunnel id + 1
(static entries: cookie 0).
"""

from __future__ import annotations

from dataclasses import dataclass

from topologies import Path, Topology, all_pairs_paths, path_links
from topologies.binding import Binding

ETH_IPV4 = 0x0800
ETH_MPLS = 0x8847
IPPROTO_TCP = 6
FIRST_LABEL = 16  # MPLS labels 0-15 are reserved
PRIO_LOCAL, PRIO_CLASSIFY, PRIO_LABEL, PRIO_DEFAULT, PRIO_MISS = 400, 300, 200, 100, 0
PRIO_DELIVER = 100
TABLE_CLASSIFY, TABLE_DELIVER = 0, 1


@dataclass(frozen=True)
class Tunnel:
    """One path of one ordered DC pair, with its TCP port and MPLS labels.

    Attributes:
        tunnel_id: 0, 1, ... in (src, dst, index) order.
        src, dst: DC names.
        index: path index within the pair (0 = shortest).
        path: DC names from src to dst.
        tcp_port: destination TCP port of the agent connections on this tunnel.
        label: MPLS label of the src -> dst direction.
        reverse_label: MPLS label of the dst -> src direction (ACKs).
    """

    tunnel_id: int
    src: str
    dst: str
    index: int
    path: Path
    tcp_port: int
    label: int
    reverse_label: int

    @property
    def cookie(self) -> int:
        """OpenFlow cookie of this tunnel's entries (tunnel id + 1; 0 is static)."""
        return self.tunnel_id + 1

    def uses(self, link: tuple[str, str]) -> bool:
        """True when the path crosses the WAN link in either direction (ACKs go back)."""
        u, v = link
        links = path_links(self.path)
        return (u, v) in links or (v, u) in links


@dataclass(frozen=True)
class FlowEntry:
    """One OpenFlow 1.3 flow entry as plain data.

    Attributes:
        dpid: datapath id of the switch.
        table_id: 0 (classification, labels) or 1 (delivery to hosts).
        priority: OpenFlow priority (higher wins).
        match: OFPMatch fields by os-ken name (eth_type, ip_proto, ipv4_dst,
            tcp_dst, tcp_src, mpls_label); {} matches everything.
        actions: tuples applied in order: ("push_mpls", ethertype),
            ("set_field", "mpls_label", label), ("pop_mpls", ethertype),
            ("output", port), and last ("goto_table", table_id).
            An empty list drops.
        cookie: tunnel id + 1, or 0 for static entries.
    """

    dpid: int
    table_id: int
    priority: int
    match: dict
    actions: list
    cookie: int = 0

    def key(self) -> tuple:
        """(dpid, table, priority, match) — what identifies the entry in a switch."""
        return (self.dpid, self.table_id, self.priority, tuple(sorted(self.match.items())))


def startup_tunnels(topology: Topology, k: int, base_port: int) -> list[Tunnel]:
    """The tunnels installed once at start-up: `build_tunnels` with every link up,
    whatever the current link state of `topology` (which is not changed).

    Built once per controller and shared by the OpenFlow app (rules) and the agent
    channel (tunnel ids and ports), so both always name the same tunnels.
    """
    all_up = topology.copy()
    all_up.down.clear()
    return build_tunnels(all_up, k, base_port)


def build_tunnels(topology: Topology, k: int, base_port: int) -> list[Tunnel]:
    """Return the tunnels of every ordered DC pair: its <= k shortest paths.

    Paths come from topologies.all_pairs_paths over the links that are up now
    (call it with every link up: tunnels are installed once, at start-up).
    Tunnel ids run over pairs in topology DC order, then path index; tunnel t
    gets labels 16 + 2t (forward) and 17 + 2t (reverse) and TCP port
    base_port + index.

    Raises:
        TopologyError: k < 1.
        ValueError: more tunnels than MPLS labels (2**20) or TCP ports allow.
    """
    tunnels: list[Tunnel] = []
    for (src, dst), paths in all_pairs_paths(topology, k).items():
        for index, path in enumerate(paths):
            tid = len(tunnels)
            tunnels.append(
                Tunnel(
                    tid,
                    src,
                    dst,
                    index,
                    path,
                    base_port + index,
                    FIRST_LABEL + 2 * tid,
                    FIRST_LABEL + 2 * tid + 1,
                )
            )
    if tunnels and (tunnels[-1].reverse_label >= 2**20 or base_port + k > 65535):
        raise ValueError(f"{len(tunnels)} tunnels with K={k} exceed MPLS labels or TCP ports")
    return tunnels


def tunnels_up(tunnels: list[Tunnel], topology: Topology) -> set[int]:
    """Return the ids of the tunnels whose every link (both directions) is up."""
    return {
        t.tunnel_id
        for t in tunnels
        if not any(
            link in topology.down or link[::-1] in topology.down for link in path_links(t.path)
        )
    }


def paths_up(tunnels: list[Tunnel], topology: Topology) -> dict[tuple[str, str], list[Path]]:
    """Return {(src, dst): [paths of its installed tunnels that are up]}, index order.

    This, not a fresh K-shortest-path search, is the path set the scheduler
    may use after a failure: only installed tunnels carry traffic.
    """
    up = tunnels_up(tunnels, topology)
    result: dict[tuple[str, str], list[Path]] = {}
    for t in tunnels:
        result.setdefault((t.src, t.dst), [])
        if t.tunnel_id in up:
            result[(t.src, t.dst)].append(t.path)
    return result


def compile_rules(
    tunnels: list[Tunnel], binding: Binding, up: set[int] | None = None
) -> list[FlowEntry]:
    """Compile the flow entries of every switch (see module docstring for the scheme).

    Args:
        tunnels: from build_tunnels.
        binding: DPIDs, ports and agent hosts of every DC.
        up: ids of the tunnels to install (default: all). A pair's default
            route uses its first tunnel in `up`.

    Returns:
        Flow entries of all switches; no two share a key().

    Raises:
        KeyError: a DC on a path has no switch or no port to the next DC
            (load_binding validates this).
    """
    up = {t.tunnel_id for t in tunnels} if up is None else up
    entries = [e for dc in binding.switches for e in _static_entries(binding, dc)]
    default_done: set[tuple[str, str]] = set()
    for t in tunnels:
        if t.tunnel_id not in up:
            continue
        entries += _direction(binding, t, t.path, t.label, "tcp_dst")
        entries += _direction(binding, t, t.path[::-1], t.reverse_label, "tcp_src")
        if (t.src, t.dst) not in default_done:
            default_done.add((t.src, t.dst))
            entries += _default_route(binding, t)
    return entries


def _static_entries(binding: Binding, dc: str) -> list[FlowEntry]:
    dpid = binding.dpid_of(dc)
    entries = [
        FlowEntry(dpid, TABLE_CLASSIFY, PRIO_MISS, {}, []),
        FlowEntry(dpid, TABLE_DELIVER, PRIO_MISS, {}, []),
    ]
    for host in binding.hosts(dc):
        match = {"eth_type": ETH_IPV4, "ipv4_dst": host.ip}
        entries.append(FlowEntry(dpid, TABLE_DELIVER, PRIO_DELIVER, match, [("output", host.port)]))
        entries.append(
            FlowEntry(
                dpid, TABLE_CLASSIFY, PRIO_LOCAL, dict(match), [("goto_table", TABLE_DELIVER)]
            )
        )
    return entries


def _direction(
    binding: Binding, tunnel: Tunnel, path: Path, label: int, port_field: str
) -> list[FlowEntry]:
    """Entries of one direction of a tunnel along `path` (classify, forward, pop)."""
    first, last = path[0], path[-1]
    out = binding.port_to(first, path[1])
    push = [("push_mpls", ETH_MPLS), ("set_field", "mpls_label", label), ("output", out)]
    entries = [
        FlowEntry(
            binding.dpid_of(first),
            TABLE_CLASSIFY,
            PRIO_CLASSIFY,
            {
                "eth_type": ETH_IPV4,
                "ip_proto": IPPROTO_TCP,
                "ipv4_dst": host.ip,
                port_field: tunnel.tcp_port,
            },
            list(push),
            tunnel.cookie,
        )
        for host in binding.hosts(last)
    ]
    labelled = {"eth_type": ETH_MPLS, "mpls_label": label}
    for here, nxt in zip(path[1:-1], path[2:], strict=True):
        entries.append(
            FlowEntry(
                binding.dpid_of(here),
                TABLE_CLASSIFY,
                PRIO_LABEL,
                dict(labelled),
                [("output", binding.port_to(here, nxt))],
                tunnel.cookie,
            )
        )
    entries.append(
        FlowEntry(
            binding.dpid_of(last),
            TABLE_CLASSIFY,
            PRIO_LABEL,
            dict(labelled),
            [("pop_mpls", ETH_IPV4), ("goto_table", TABLE_DELIVER)],
            tunnel.cookie,
        )
    )
    return entries


def _default_route(binding: Binding, tunnel: Tunnel) -> list[FlowEntry]:
    """Any other IPv4 to the pair's destination hosts rides this tunnel's forward label."""
    out = binding.port_to(tunnel.src, tunnel.path[1])
    return [
        FlowEntry(
            binding.dpid_of(tunnel.src),
            TABLE_CLASSIFY,
            PRIO_DEFAULT,
            {"eth_type": ETH_IPV4, "ipv4_dst": host.ip},
            [("push_mpls", ETH_MPLS), ("set_field", "mpls_label", tunnel.label), ("output", out)],
            tunnel.cookie,
        )
        for host in binding.hosts(tunnel.dst)
    ]


def rules_per_switch(entries: list[FlowEntry]) -> dict[int, int]:
    """Return {dpid: number of entries} (all tables, table-miss entries included)."""
    counts: dict[int, int] = {}
    for e in entries:
        counts[e.dpid] = counts.get(e.dpid, 0) + 1
    return counts


def diff_rules(
    old: list[FlowEntry], new: list[FlowEntry]
) -> tuple[list[FlowEntry], list[FlowEntry]]:
    """Return (to_delete, to_add) that turn the entries `old` into `new`.

    An entry whose key() is in both but whose actions or cookie changed is in
    `to_add` only (an OpenFlow ADD with the same match and priority replaces it).
    """
    old_by_key = {e.key(): e for e in old}
    new_keys = {e.key() for e in new}
    to_delete = [e for e in old if e.key() not in new_keys]
    to_add = [e for e in new if old_by_key.get(e.key()) != e]
    return to_delete, to_add


def trace(
    entries: list[FlowEntry], binding: Binding, dc: str, packet: dict, max_hops: int = 64
) -> tuple[list[str], str | None]:
    """Follow a packet through the compiled entries, switch by switch (no switches needed).

    Args:
        entries: compiled flow entries.
        binding: the topology binding (which port leads to which DC or host).
        dc: the DC whose switch receives the packet from a local host.
        packet: header fields, e.g. {"eth_type": 0x0800, "ip_proto": 6,
            "ipv4_dst": "10.0.2.1", "tcp_dst": 20000, "tcp_src": 40000}.
        max_hops: give up (loop) after this many switches.

    Returns:
        (DCs visited in order, name of the host it was delivered to or None
        when it was dropped or looped).
    """
    tables: dict[tuple[int, int], list[FlowEntry]] = {}
    for e in sorted(entries, key=lambda e: -e.priority):
        tables.setdefault((e.dpid, e.table_id), []).append(e)
    pkt = dict(packet)
    labels: list[int] = []
    visited = [dc]
    table = TABLE_CLASSIFY
    while len(visited) <= max_hops:
        fields = dict(pkt, eth_type=ETH_MPLS, mpls_label=labels[-1]) if labels else pkt
        entry = next(
            (
                e
                for e in tables.get((binding.dpid_of(dc), table), [])
                if all(fields.get(f) == v for f, v in e.match.items())
            ),
            None,
        )
        if entry is None or not entry.actions:
            return visited, None
        table = TABLE_CLASSIFY
        for action in entry.actions:
            if action[0] == "push_mpls":
                labels.append(0)
            elif action[0] == "set_field":
                labels[-1] = action[2]
            elif action[0] == "pop_mpls":
                labels.pop()
            elif action[0] == "goto_table":
                table = action[1]
            elif action[0] == "output":
                link = binding.link_of_port(binding.dpid_of(dc), action[1])
                if link is None:
                    host = next((h for h in binding.hosts(dc) if h.port == action[1]), None)
                    return visited, host.name if host and not labels else None
                dc = link[1]
                visited.append(dc)
        if entry.actions[-1][0] != "goto_table" and entry.actions[-1][0] != "output":
            return visited, None
    return visited, None
