"""Read-only views of the controller's state for REST, metrics, the coflow API and the
operator page (docs/runtime.md), each copied on the owner loop in time proportional to what it
shows, never waiting for a round.

`ControllerViews` is the part of `Controller` (terra_controller/controller.py) that
makes them; `Snapshot` is the frozen copy REST and metrics read.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Snapshot:
    """A consistent copy of the controller's state for REST, metrics and listings
    (`Controller.snapshot`); nothing in it changes afterwards.

    Attributes:
        topology: topology name. dcs: DC names in order.
        links: ((src DC, dst DC, capacity bytes/s, "up"|"down", allocated bytes/s), ...)
            per directed link.
        agents: ((agent id, DC, data address), ...).
        coflows: (CoflowState.summary() map, ...) of every coflow in memory (submission
            order).
        stats: a copy of Controller.stats (lists copied).
        active: coflows not in a final state.
        bytes_delivered: bytes acknowledged by receivers, all coflows ever (dropped ones
            included).
    """

    topology: str
    dcs: tuple[str, ...]
    links: tuple[tuple[str, str, float, str, float], ...]
    agents: tuple[tuple[str, str, str], ...]
    coflows: tuple[dict, ...]
    stats: dict
    active: int
    bytes_delivered: int


class ControllerViews:
    """The views of `Controller` (its attributes: lock, registry, topology, rates,
    link_bytes, stats, policy, connected_agents)."""

    def snapshot(self, coflows: bool = True) -> Snapshot:
        """A Snapshot of the registry, the WAN and the stats, copied on the loop (brief:
        O(coflows in memory); never waits for a round).

        Args:
            coflows: copy the coflows' summaries; False leaves `coflows` empty and
                `bytes_delivered` 0 and costs O(links + agents) only (REST /status and
                /topology, polled every second by the operator page).
        """
        with_coflows = coflows

        def on_loop():
            topo, reg, load = self.topology, self.registry, self._link_rates()
            links = tuple(
                (u, v, topo.capacity[(u, v)], "down" if (u, v) in topo.down else "up",
                 load.get((u, v), 0.0))
                for u, v in topo.links
            )  # fmt: skip
            coflows = tuple(c.summary() for c in reg.coflows.values()) if with_coflows else ()
            stats = {k: (list(v) if isinstance(v, list) else v) for k, v in self.stats.items()}
            stats["dropped_finished"] = dict(stats["dropped_finished"])
            return Snapshot(
                topology=topo.name,
                dcs=tuple(topo.dcs),
                links=links,
                agents=tuple((a.id, a.dc, a.data_addr) for a in reg.agents.values()),
                coflows=coflows,
                stats=stats,
                active=len(reg.active()),
                bytes_delivered=(
                    sum(c["bytes_delivered"] for c in coflows)
                    + self.stats["dropped_bytes_delivered"]
                    if with_coflows
                    else 0
                ),
            )

        return self.owner.run(on_loop)

    def metrics_view(self) -> dict:
        """What /metrics reads from the controller at scrape time, copied on the loop.

        Cost O(links + active coflows + their flows' rates): it never walks the finished
        coflows, however many are kept (docs/runtime.md "Metrics").

        Returns:
            {"links": [(a, b, capacity bytes/s, up: bool, allocated bytes/s, bytes
            acknowledged across it (link_bytes))] per directed link, "active": {state:
            coflows} of the active states, "in_memory": coflows kept, "agents": registered
            agents, "lps": LPs the policy solved (int), "dropped": {final state: finished
            coflows dropped from memory}}.
        """

        def on_loop():
            topo, reg, load = self.topology, self.registry, self._link_rates()
            delivered = self.link_bytes
            links = [
                (u, v, cap, (u, v) not in topo.down, load.get((u, v), 0.0),
                 delivered.get((u, v), 0.0))
                for (u, v), cap in sorted(topo.capacity.items())
            ]  # fmt: skip
            active: dict[str, int] = {}
            for coflow in reg.active():
                active[coflow.state.value] = active.get(coflow.state.value, 0) + 1
            stats = getattr(self.policy, "stats", None)
            lps = int(stats.get("lps", 0)) if isinstance(stats, dict) else 0
            return {
                "links": links,
                "active": active,
                "in_memory": len(reg.coflows),
                "agents": len(reg.agents),
                "lps": lps,
                "dropped": dict(reg.dropped),
            }

        return self.owner.run(on_loop)

    def state_counts(self) -> dict[str, int]:
        """{state: coflows in memory in that state}, O(active coflows)."""

        def on_loop():
            return self.registry.state_counts()

        return self.owner.run(on_loop)

    def recent_coflows(self, finished: int) -> list[dict]:
        """Summaries (CoflowState.summary()) of every active coflow and of the `finished`
        coflows that ended last, newest id first; O(active + finished), whatever the
        history (the operator page polls it every second)."""

        def on_loop():
            reg = self.registry
            chosen = list(reg.active())
            left = finished
            for cid in reversed(reg.finished):
                if left <= 0:
                    break
                coflow = reg.coflows.get(cid)
                if coflow is not None:
                    chosen.append(coflow)
                    left -= 1
            return [c.summary() for c in sorted(chosen, key=lambda c: c.id, reverse=True)]

        return self.owner.run(on_loop)

    def link_delivered(self) -> dict[tuple[str, str], float]:
        """A copy of `link_bytes`: {directed link: bytes acknowledged across it}."""

        def on_loop():
            return dict(self.link_bytes)

        return self.owner.run(on_loop)

    def link_rates(self) -> dict[tuple[str, str], float]:
        """Allocated bytes/s per directed link in the current allocation."""
        return self.owner.run(self._link_rates)

    def _link_rates(self) -> dict[tuple[str, str], float]:
        """`link_rates`, on the loop."""
        load: dict[tuple[str, str], float] = {}
        for flows in self.rates.values():
            for paths in flows.values():
                for path, rate in paths:
                    for link in zip(path[:-1], path[1:], strict=False):
                        load[link] = load.get(link, 0.0) + rate
        return load

    def flowgroup_rates(self, coflow_id: int) -> list[dict]:
        """The coflow's FlowGroups with their per-path rates.

        Returns:
            [{"src_dc", "dst_dc", "bytes_remaining", "paths": [{"path": [dc...],
            "rate_bytes_per_s"}]}] (docs/operations.md, REST).
        """

        def on_loop():
            coflow = self.registry.get(coflow_id)
            groups: dict[tuple[str, str], dict] = {}
            rates = self.rates.get(coflow.id, {})
            for f in coflow.flows.values():
                if f.intra_dc:
                    continue
                g = groups.setdefault(
                    (f.src_dc, f.dst_dc),
                    {"src_dc": f.src_dc, "dst_dc": f.dst_dc, "bytes_remaining": 0, "paths": {}},
                )
                g["bytes_remaining"] += f.remaining
                for path, rate in rates.get(f.id, []):
                    g["paths"][path] = g["paths"].get(path, 0.0) + rate
            for g in groups.values():
                g["paths"] = [
                    {"path": list(p), "rate_bytes_per_s": r} for p, r in g["paths"].items()
                ]
            return list(groups.values())

        return self.owner.run(on_loop)

    def agents_view(self) -> dict:
        """What a job may know of the agents: {"dcs": [DC names of the topology], "agents":
        [{"id", "dc", "connected": bool (an open control connection now; False for every
        agent when no agent channel is attached)}]}, sorted by agent id. No addresses."""
        connected: set = set()
        if self.connected_agents is not None:
            connected = set(self.connected_agents())

        def on_loop():
            agents = sorted(self.registry.agents.values(), key=lambda a: a.id)
            return {
                "dcs": list(self.topology.dcs),
                "agents": [
                    {"id": a.id, "dc": a.dc, "connected": a.id in connected} for a in agents
                ],  # fmt: skip
            }

        return self.owner.run(on_loop)

    def registered_agents(self) -> dict:
        """A copy of the registered agents: {agent id: AgentInfo (id, dc, data_addr)}."""

        def on_loop():
            return dict(self.registry.agents)

        return self.owner.run(on_loop)

    def wan_flows_of(self, agent: str) -> list:
        """[(CoflowState, FlowState)] of the unfinished WAN flows of active coflows that
        `agent` sends or receives (the descriptors a (re)registering agent gets)."""

        def on_loop():
            return [
                (c, f)
                for c in self.registry.active()
                for f in c.flows.values()
                if not f.intra_dc and not f.done and agent in (f.src_agent, f.dst_agent)
            ]

        return self.owner.run(on_loop)
