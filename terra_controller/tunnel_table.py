"""Tunnel ids and the tunnel table each agent gets; routing over installed tunnels only.

The tunnels are built once at start-up (`tunnels.startup_tunnels`) and shared
with the OpenFlow app, so rules, tunnel ids and TCP ports agree (paper section
5: routes change without touching the switches; docs/runtime.md).
"""

from __future__ import annotations

import logging

from terra_controller.tunnels import Tunnel, paths_up, startup_tunnels
from terra_core.policy import PathSource
from terra_wire import control as protocol
from topologies import Path, Topology, path_links

LOG = logging.getLogger("terra.tunnels")

MAX_TUNNEL_INDEX = 32  # per DC pair, logical tunnels included


class TunnelTable:
    """Tunnel ids for paths, and the tunnel table each agent gets.

    Tunnels are those of `tunnels.startup_tunnels` (the same ids and ports the
    OpenFlow rules use; pass the list the OpenFlow app got as `tunnels`). With
    `logical=True` (no switches, --no-openflow) a path the scheduler picks after
    a failure that is not among them gets a new logical tunnel (next path index
    of its DC pair); with switches such a path has no rules, so it gets no tunnel
    and its rate is dropped (logged).

    Destination port of tunnel index i at a peer agent: with switches,
    `base_port + i` (the rules match it); logical, data port + 1 + i of that
    agent (so several agents can share one loopback address).
    """

    def __init__(
        self,
        topology: Topology,
        k: int,
        base_port: int = 20000,
        logical: bool = True,
        tunnels: list[Tunnel] | None = None,
    ):
        self.topology = topology
        self.k = k
        self.logical = logical
        self.base_port = base_port
        self.tunnels = tunnels or startup_tunnels(topology, k, base_port)
        self.unrouted: set[Path] = set()
        self.by_path: dict[Path, tuple[int, int]] = {  # path -> (tunnel id, index)
            t.path: (t.tunnel_id, t.index) for t in self.tunnels
        }
        self.count: dict[tuple[str, str], int] = {}
        for t in self.tunnels:
            self.count[(t.src, t.dst)] = max(self.count.get((t.src, t.dst), 0), t.index + 1)
        self.next_id = len(self.tunnels)

    def tunnel_for(self, path: Path) -> str | None:
        """Return the tunnel id (str) that carries `path`, or None (see class docstring)."""
        path = tuple(path)
        found = self.by_path.get(path)
        if found is None:
            pair = (path[0], path[-1])
            index = self.count.get(pair, 0)
            if not self.logical or index >= MAX_TUNNEL_INDEX:
                if path not in self.unrouted:
                    self.unrouted.add(path)
                    LOG.warning("no tunnel for path %s; its rate is dropped", "-".join(path))
                return None
            found = (self.next_id, index)
            self.by_path[path] = found
            self.count[pair] = index + 1
            self.next_id += 1
        return str(found[0])

    def path_up(self, path: Path) -> bool:
        """True when every link of the path is up in both directions."""
        down = self.topology.down
        return not any(link in down or link[::-1] in down for link in path_links(path))

    def port(self, index: int, peer_data_addr: str) -> int:
        """Destination TCP port of path index `index` at a peer with that data address."""
        if not self.logical:
            return self.base_port + index
        return protocol.parse_addr(peer_data_addr, "data_addr")[1] + 1 + index

    def listen_ports(self, data_addr: str) -> list[int]:
        """Ports an agent with that data address accepts tunnels on."""
        top = max([*self.count.values(), self.k])
        return [self.port(i, data_addr) for i in range(top)]

    def specs_for(self, agent, peers) -> list[protocol.TunnelSpec]:
        """Tunnel table of `agent` (AgentInfo): every up tunnel to every peer in another DC."""
        specs = []
        for peer in peers:
            if peer.dc == agent.dc:
                continue
            for path, (tid, index) in sorted(self.by_path.items(), key=lambda x: x[1]):
                if path[0] == agent.dc and path[-1] == peer.dc and self.path_up(path):
                    specs.append(
                        protocol.TunnelSpec(
                            str(tid),
                            peer.id,
                            peer.data_addr,
                            path,
                            self.port(index, peer.data_addr),
                        )
                    )
        return specs

    def to_json(self) -> list[dict]:
        """[{"tunnel", "src", "dst", "index", "path", "up"}] of every known tunnel."""
        return [
            {
                "tunnel": tid,
                "src": p[0],
                "dst": p[-1],
                "index": index,
                "path": list(p),
                "up": self.path_up(p),
            }
            for p, (tid, index) in sorted(self.by_path.items(), key=lambda x: x[1])
        ]


def installed_path_source(table: TunnelTable) -> PathSource:
    """A policy.PathSource that routes only over installed tunnels that are up (with switches).

    With switches only the tunnels installed at start-up carry traffic; after a
    failure the K shortest paths over the links still up may include paths that
    have no rules (7 of them on SWAN, K = 4, LA-NY down). Every scheduler of the
    registry takes its paths from this source instead (docs/design.md section 5:
    route changes never touch the switches).

    Args:
        table: the TunnelTable (logical=False).

    Returns:
        (topology, K) -> {(src DC, dst DC): [paths of the pair's installed tunnels that
        are up in `topology`, tunnel index order]} (K is ignored: the tunnels are fixed).
    """

    def source(topology: Topology, k: int) -> dict[tuple[str, str], list[Path]]:
        return paths_up(table.tunnels, topology)

    return source
