"""The WAN flows of a simulation run as arrays indexed by position (coflows in arrival
order, each one's flows in workload order), and the links they load (docs/design.md 4.4).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

from terra_core.flow_bundles import flow_count
from terra_model import Coflow
from terra_sim.errors import SimulationError
from topologies import Topology, path_links

CAPACITY_REL = 1e-6  # tolerated relative link overload before SimulationError


class DcPairs(NamedTuple):
    """The DC pairs of a run's flows, numbered in order of first appearance.

    Attributes:
        pairs: list of (src DC, dst DC).  index: {pair: its number}.
        objects: object array of the pairs (for takes by an index array).
    """

    pairs: list[tuple[str, str]]
    index: dict[tuple[str, str], int]
    objects: np.ndarray


class FlowTable:
    """Every WAN flow of a run by position, its state and the live set.

    Args:
        arrivals: the coflows in arrival order.
        wan: {coflow id: the coflow with its WAN flows (bundled or not)}.

    Attributes:
        src, dst: lists of each flow's DCs.  owner, owner_ids: lists of each flow's
            coflow id and flow id.  size, rem, rate, members: float arrays (flows,) of
            bytes, remaining bytes, bytes/s and member counts (flow_bundles.flow_count).
        pair_of: int array (flows,), each flow's number in `pairs`.  pairs: DcPairs.
        local: int array (flows,), each flow's index in its coflow's flows.
        start: {coflow id: position of its first flow}.  n_flows: {coflow id: flows}.
        alive: bool array (flows,), admitted and not finished.
        live: int array, the positions where alive, ascending.
        zero_sized: some flow has no bytes.
    """

    def __init__(self, arrivals: Sequence[Coflow], wan: dict[str, Coflow]) -> None:
        flows = [f for c in arrivals for f in wan[c.id].flows]
        self.src = [f.src for f in flows]
        self.dst = [f.dst for f in flows]
        self.size = np.array([f.bytes for f in flows], dtype=float)
        self.rem = self.size.copy()
        self.zero_sized = bool((self.size <= 0).any())
        self.rate = np.zeros(len(flows))
        self.owner: list[str] = [c.id for c in arrivals for _ in wan[c.id].flows]
        self.owner_ids: list[str] = [f.id for f in flows]
        pairs = list(dict.fromkeys(zip(self.src, self.dst, strict=True)))
        index = {pair: i for i, pair in enumerate(pairs)}
        objects = np.empty(len(pairs), dtype=object)
        for i, pair in enumerate(pairs):
            objects[i] = pair
        self.pairs = DcPairs(pairs, index, objects)
        self.pair_of = np.array([index[(f.src, f.dst)] for f in flows], dtype=np.intp)
        self.members = np.array([flow_count(f) for f in flows], dtype=float)
        self.alive = np.zeros(len(flows), dtype=bool)
        self.live = np.zeros(0, dtype=np.intp)
        self.n_flows = {c.id: len(wan[c.id].flows) for c in arrivals}
        starts = np.cumsum([0] + [len(wan[c.id].flows) for c in arrivals])
        self.start = {c.id: int(s) for c, s in zip(arrivals, starts, strict=False)}
        sizes = np.diff(starts)
        self.local = np.arange(len(flows), dtype=np.intp) - np.repeat(starts[:-1], sizes)


class LinkTable:
    """The WAN's links by row (topology.links order): their available capacity and the
    rows of each path's links.

    Args:
        topology: the shared WAN (mutated by the run; call `refresh` after a change).
        policy_name: named in overload errors.
    """

    def __init__(self, topology: Topology, policy_name: str) -> None:
        self.topology = topology
        self.policy_name = policy_name
        self.row = {link: i for i, link in enumerate(topology.links)}
        self._path_rows: dict[tuple[str, ...], list[int]] = {}
        self.refresh()

    def refresh(self) -> None:
        """Read the available capacities again: `avail` (float array by row, bytes/s, 0
        when down) and their sum `capacity_sum`."""
        topology = self.topology
        self.capacity_sum = sum(topology.available(link) for link in topology.links)
        self.avail = np.array([topology.available(link) for link in topology.links])

    def rows_of(self, path: tuple[str, ...]) -> list[int]:
        """Rows of a path's links, cached per path.

        Raises:
            SimulationError: a link the WAN does not have.
        """
        rows = self._path_rows.get(path)
        if rows is None:
            rows = []
            for link in path_links(path):
                if link not in self.row:
                    raise SimulationError(f"allocation uses unknown link {link}")
                rows.append(self.row[link])
            self._path_rows[path] = rows
        return rows

    def rows_of_all(self, paths: list[tuple[str, ...]]) -> list[list[int]]:
        """`rows_of(path)` for every path of `paths`, in order (one C-level pass over the
        cache when every path is in it).

        Raises:
            SimulationError: a link the WAN does not have (the first such path's).
        """
        try:
            return list(map(self._path_rows.__getitem__, paths))
        except KeyError:
            return [self.rows_of(path) for path in paths]

    def check_loads(self, load: np.ndarray, now: float) -> None:
        """Raise SimulationError if a link (float array by row, bytes/s) is loaded above
        its available capacity by more than CAPACITY_REL relative; `now` in seconds."""
        avail = self.avail  # in row order (topology.links is sorted)
        over = np.flatnonzero(load > avail * (1 + CAPACITY_REL))
        if over.size:
            link = self.topology.links[over[0]]
            raise SimulationError(
                f"t={now:.6f}s: link {link[0]}-{link[1]} loaded {load[over[0]]:.6g} B/s, "
                f"available {avail[over[0]]:.6g} B/s (policy {self.policy_name})"
            )
