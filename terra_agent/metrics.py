"""An agent's Prometheus metrics (`terra-agent --metrics HOST:PORT`; docs/runtime.md,
"Metrics").

The collector reads the agent's own state when Prometheus scrapes, so the data path pays
nothing per chunk. The HTTP server (serve_metrics: plain HTTP, in the agent's trio tasks, one
request per connection, within REQUEST_S, capped per address and in total like the data
port, terra_agent/admission.py) serves only `/metrics` and should listen on a management
address: it reveals tunnel, peer and rate figures, not data. Scrapes run in the agent's
trio thread, so they see one consistent moment.

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
    terra_agent_connections_open{server}, terra_agent_connections_refused_total{server},
        terra_agent_connections_evicted_total{server}: the data and metrics ports'
        connections held now, refused at a cap, evicted while unauthenticated at the
        total cap (server "data port" / "metrics port").
"""

from __future__ import annotations

import socket

import trio
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from overlay.pending_connections import listener_families

from .admission import serve_admitted

REQUEST_S = 5.0  # a metrics connection gets its response within this long, or is closed
MAX_REQUEST_BYTES = 8192  # request head (request line and headers)


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
        servers = {"data port": a.data_admission, "metrics port": a.metrics_admission}
        yield from listener_families(servers, "terra_agent")

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


def bind_metrics(host: str, port: int) -> socket.socket:
    """A TCP socket bound to host:port (SO_REUSEADDR) for serve_metrics; it listens once
    the agent runs. Bound here, before the agent starts, so a port in use is an error at
    start (terra-agent exits 1).

    Raises:
        OSError: the address cannot be bound (or resolved).
    """
    info = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    family, kind, proto, _, addr = info[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(addr)
    except BaseException:
        sock.close()
        raise
    return sock


async def serve_metrics(
    agent, sock: socket.socket, admission, handler_nursery, task_status=trio.TASK_STATUS_IGNORED
) -> None:
    """Serve GET /metrics on `sock` (bind_metrics) from trio tasks until cancelled.

    Every connection goes through `admission` (terra_agent.admission.Admission: caps in
    total and per address, accept failures survived; at the total cap a connection whose
    request is not read yet may be evicted for a newcomer) and gets one response within
    REQUEST_S of its first byte wait, request and response together; then it is closed
    (HTTP/1.0 style, "Connection: close"). No thread per connection: an idle one costs a
    descriptor and a sleeping task until its deadline.
    """
    registry = CollectorRegistry()
    registry.register(AgentCollector(agent))
    sock.listen(128)
    listener = trio.SocketListener(trio.socket.from_stdlib_socket(sock))

    async def handle(stream: trio.SocketStream) -> None:
        async with stream:
            with trio.move_on_after(REQUEST_S):
                try:
                    await _answer(stream, registry, admission)
                except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                    pass

    await serve_admitted(handle, [listener], admission, handler_nursery, task_status=task_status)


async def _answer(stream: trio.SocketStream, registry: CollectorRegistry, admission) -> None:
    """Read one request head (at most MAX_REQUEST_BYTES) and send the response; the
    connection is evictable (`admission`) until its request head is read."""
    head = bytearray()
    while b"\r\n\r\n" not in head and b"\n\n" not in head:
        if len(head) > MAX_REQUEST_BYTES:
            await stream.send_all(_response(431, b"request head too large\n"))
            return
        data = await stream.receive_some(4096)
        if not data:
            return
        head += data
    admission.authenticated(stream)  # a whole request: never evicted from now on
    line = bytes(head).split(b"\n", 1)[0].decode("latin-1").strip().split()
    if len(line) != 3 or not line[2].startswith("HTTP/"):
        await stream.send_all(_response(400, b"bad request\n"))
    elif line[0] not in ("GET", "HEAD"):
        await stream.send_all(_response(405, b"only GET\n"))
    elif line[1].split("?", 1)[0] != "/metrics":
        await stream.send_all(_response(404, b"only /metrics\n"))
    else:
        body = generate_latest(registry)
        reply = _response(200, body, CONTENT_TYPE_LATEST)
        await stream.send_all(reply if line[0] == "GET" else reply[: len(reply) - len(body)])


def _response(status: int, body: bytes, content_type: str = "text/plain; charset=utf-8"):
    """An HTTP/1.1 response with `body`, closing the connection."""
    reason = {200: "OK", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed",
              431: "Request Header Fields Too Large"}[status]  # fmt: skip
    head = (
        f"HTTP/1.1 {status} {reason}\r\nContent-Type: {content_type}\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    )
    return head.encode("latin-1") + body
