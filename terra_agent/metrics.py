"""An agent's Prometheus metrics (`terra-agent --metrics HOST:PORT`; docs/runtime.md,
"Metrics").

The collector reads the agent's own state when Prometheus scrapes, so the data path pays
nothing per chunk. The HTTP server (prometheus_client's, plain HTTP, one thread) serves
only `/metrics` and should listen on a management address: it reveals tunnel, peer and
rate figures, not data. Reads from the server thread see values the trio thread keeps
changing; each value is read once (a snapshot of a dict is taken with `list(...)`), so a
scrape may mix moments a few microseconds apart but never fails.

Metrics (labels; units in the names):
    terra_agent_link_sent_bytes_total{peer, tunnel}: payload bytes sent on the connection
        to `peer` over `tunnel` since the agent started it (with --rate-limiter pacing, plus
        those of the FlowGroups' own paced connections to `peer` over `tunnel`).
    terra_agent_link_connects_total{peer, tunnel}: connections made (1 + reconnects; with
        pacing, the FlowGroups' own connections' too).
    terra_agent_link_up{peer, tunnel}: 1 while connected.
    terra_agent_tunnel_rate_bytes_per_second{tunnel}: the controller's rates of this
        agent's FlowGroups on `tunnel`, summed.
    terra_agent_tunnel_backlog_bytes{tunnel}: token-bucket debt (bytes sent ahead of the
        rate, waiting to be paid back) summed over the FlowGroups on `tunnel`.
    terra_agent_received_bytes_total: chunk payload bytes received.
    terra_agent_reorder_resident_bytes: out-of-order bytes held in memory now.
    terra_agent_spilled_bytes: bytes the live flows spilled to disk.
    terra_agent_resend_queued_bytes: bytes queued for resending (after a path failed).
    terra_agent_rejected_chunks_total{reason}: chunks refused (mac: failed its integrity
        check; ahead: beyond the spill bound; other: unknown flow, wrong sender ...).
    terra_agent_unauthenticated_connections_total: data connections refused at the
        handshake.
    terra_agent_control_connects_total: control-channel connections (1 + reconnects).
    terra_agent_flows{direction, state}: live flows (out / in; running, done, failed).
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily


class AgentCollector:
    """A prometheus_client collector over one Agent (module docstring lists the metrics).

    Args:
        agent: the terra_agent.agent.Agent.
    """

    def __init__(self, agent) -> None:
        self.agent = agent

    def collect(self):
        """Yield the metric families (called by prometheus_client at scrape time)."""
        a = self.agent
        yield from self._links(list(a.links.items()), list(a.group_links.items()))
        yield from self._tunnels(list(a.groups.values()))
        in_flows, out_flows = list(a.in_flows.values()), list(a.out_flows.values())
        yield CounterMetricFamily(
            "terra_agent_received_bytes", "Chunk payload bytes received", value=a.received_bytes
        )
        yield GaugeMetricFamily(
            "terra_agent_reorder_resident_bytes", "Out-of-order bytes held in memory",
            value=a.reorder_budget.used_bytes,
        )  # fmt: skip
        yield GaugeMetricFamily(
            "terra_agent_spilled_bytes", "Bytes the live flows spilled to disk",
            value=sum(f.reorder_stats()[1] for f in in_flows),
        )  # fmt: skip
        yield GaugeMetricFamily(
            "terra_agent_resend_queued_bytes", "Bytes queued for resending",
            value=sum(n for f in out_flows for _, n in list(f.resend)),
        )  # fmt: skip
        rejected = CounterMetricFamily(
            "terra_agent_rejected_chunks", "Chunks refused", labels=["reason"]
        )
        macs = a.rejected_macs + sum(f.rejected_macs for f in in_flows)
        ahead = a.rejected_ahead + sum(f.rejected_ahead for f in in_flows)
        rejected.add_metric(["mac"], macs)
        rejected.add_metric(["ahead"], ahead)
        rejected.add_metric(["other"], a.rejected_chunks)
        yield rejected
        yield CounterMetricFamily(
            "terra_agent_unauthenticated_connections",
            "Data connections refused at the handshake", value=a.unauthenticated,
        )  # fmt: skip
        yield CounterMetricFamily(
            "terra_agent_control_connects", "Control-channel connections made",
            value=a.control_connects,
        )  # fmt: skip
        yield _flow_states(in_flows, out_flows)

    @staticmethod
    def _links(links, group_links=()):
        labels = ["peer", "tunnel"]
        sent = CounterMetricFamily(
            "terra_agent_link_sent_bytes", "Payload bytes sent on a tunnel connection",
            labels=labels,
        )  # fmt: skip
        connects = CounterMetricFamily(
            "terra_agent_link_connects", "Tunnel connections made", labels=labels
        )
        up = GaugeMetricFamily("terra_agent_link_up", "1 while connected", labels=labels)
        extra: dict[tuple[str, str], tuple[int, int]] = {}  # paced group links per tunnel link
        for (_, _, peer, tunnel), link in group_links:
            n, c = extra.get((peer, tunnel), (0, 0))
            extra[(peer, tunnel)] = (n + link.sent_bytes, c + link.connects)
        for (peer, tunnel), link in links:
            key = [peer, str(tunnel)]
            n, c = extra.get((peer, tunnel), (0, 0))
            sent.add_metric(key, link.sent_bytes + n)
            connects.add_metric(key, link.connects + c)
            up.add_metric(key, 1 if link.up else 0)
        yield from (sent, connects, up)

    @staticmethod
    def _tunnels(groups):
        rate = GaugeMetricFamily(
            "terra_agent_tunnel_rate_bytes_per_second",
            "Controller rates of this agent's FlowGroups on a tunnel, summed", labels=["tunnel"],
        )  # fmt: skip
        backlog = GaugeMetricFamily(
            "terra_agent_tunnel_backlog_bytes",
            "Token-bucket debt of the FlowGroups on a tunnel, summed", labels=["tunnel"],
        )  # fmt: skip
        rates: dict[str, float] = {}
        debts: dict[str, float] = {}
        for group in groups:
            for tunnel, r in list(group.rates.items()):
                rates[tunnel] = rates.get(tunnel, 0.0) + r
            for tunnel, bucket in list(group.buckets.items()):
                debts[tunnel] = debts.get(tunnel, 0.0) + bucket.debt_bytes
        for tunnel in sorted(rates):
            rate.add_metric([str(tunnel)], rates[tunnel])
            backlog.add_metric([str(tunnel)], debts.get(tunnel, 0.0))
        yield from (rate, backlog)


def _flow_states(in_flows, out_flows) -> GaugeMetricFamily:
    family = GaugeMetricFamily(
        "terra_agent_flows", "Live flows by direction and state", labels=["direction", "state"]
    )
    for direction, flows in (("out", out_flows), ("in", in_flows)):
        counts = {"running": 0, "done": 0, "failed": 0}
        for f in flows:
            state = "failed" if f.failed else ("done" if f.done else "running")
            counts[state] += 1
        for state, n in counts.items():
            family.add_metric([direction, state], n)
    return family


def serve_metrics(agent, host: str, port: int) -> CollectorRegistry:
    """Serve the agent's metrics on http://host:port/metrics from a daemon thread.

    Returns the registry (for tests).

    Raises:
        OSError: the address cannot be bound.
    """
    registry = CollectorRegistry()
    registry.register(AgentCollector(agent))
    start_http_server(port, addr=host, registry=registry)
    return registry
