"""Read-only REST for operators: JSON views of the controller and Prometheus metrics.

Routes (GET only; docs/design.md section 6, issue 4 item 5):

    /status          controller: topology name, uptime, agents, coflows per state, rounds
    /topology        links with capacity (bytes/s), state (up/down), allocated rate (bytes/s)
    /tunnels         tunnels (id, DC pair, path, up) and, with switches, the rules of every
                     switch (by DPID) and their counts, flow-mods sent
    /coflows         every coflow: id, state, bytes total/delivered, CCT
    /coflows/{id}    one coflow's status with its FlowGroups' per-path allocations
    /metrics         Prometheus text format: terra_rounds_total, terra_round_latency_ms,
                     terra_lps_solved_total, terra_active_coflows, terra_bytes_delivered_total,
                     terra_rejected_coflows_total, terra_failed_coflows_total,
                     terra_cancelled_coflows_total, terra_flow_restarts_total,
                     terra_dropped_finished_coflows_total{state}, terra_agents_connected

A WSGI app served by the standard library's wsgiref in a thread per request,
started on os-ken's hub. Errors: 404 for unknown paths or coflows, 405 for
other methods; a failing view answers 500 and the server keeps running.
"""

from __future__ import annotations

import json
import logging
import socketserver
import threading
import time
from collections.abc import Callable
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from terra_controller.coflow_registry import RegistryError
from terra_controller.controller import Controller
from terra_controller.pki import PkiError, Role
from terra_controller.transport import ServerSecurity, authenticate

LOG = logging.getLogger("terra.rest")

MAX_REST_THREADS = 64
REQUEST_TIMEOUT_S = 10.0


class RestApp:
    """The WSGI application.

    Args:
        controller: the Controller.
        channel: the AgentChannel (agents connected, tunnels) or None.
        openflow: callable returning {"rules_per_switch": {dpid: n}, "flow_mods": n, ...}
            from the OpenFlow app, or None without switches.
        ports: callable returning {(a, b): port_stats.LinkLoad} (the switches' WAN port
            counters), or None without switches.
    """

    def __init__(
        self, controller: Controller, channel=None, openflow: Callable | None = None,
        ports: Callable | None = None,
    ):  # fmt: skip
        self.controller = controller
        self.channel = channel
        self.openflow = openflow
        self.ports = ports
        self.metrics = CollectorRegistry()
        self.metrics.register(_Collector(self))

    def __call__(self, environ, start_response):
        """WSGI entry point."""
        path = environ.get("PATH_INFO", "/").rstrip("/") or "/"
        if environ.get("REQUEST_METHOD") != "GET":
            return _reply(start_response, 405, {"error": "read-only: GET only"}, [("Allow", "GET")])
        try:
            if path == "/metrics":
                body = generate_latest(self.metrics)
                start_response("200 OK", [("Content-Type", "text/plain; version=0.0.4")])
                return [body]
            view = self._route(path)
            if view is None:
                return _reply(start_response, 404, {"error": f"no such resource {path}"})
            return _reply(start_response, 200, view())
        except RegistryError as exc:
            return _reply(start_response, 404, {"error": str(exc)})
        except Exception:
            LOG.exception("REST %s failed", path)
            return _reply(start_response, 500, {"error": "internal error (logged)"})

    def _route(self, path: str):
        views = {
            "/status": self.status,
            "/topology": self.topology,
            "/links": self.links,
            "/tunnels": self.tunnels,
            "/coflows": self.coflows,
        }
        if path in views:
            return views[path]
        if path.startswith("/coflows/"):
            text = path[len("/coflows/") :]
            if not text.isdigit() or len(text) > 19:  # coflow ids are 63-bit at most
                return None
            return lambda: self.coflow(int(text))
        return None

    # ---- views --------------------------------------------------------------------------

    def connected_agents(self) -> set[str]:
        """Ids of agents with an open control connection."""
        if self.channel is None:
            return set()
        with self.channel.lock:
            return set(self.channel.connections)

    def status(self) -> dict:
        """{"topology", "scheduler" (the policy's registry name), "uptime_s", "openflow",
        "agents": [...], "coflows": {state: n} (coflows
        in memory), "rejected" / "failed" / "cancelled" (coflows ever), "dropped_finished":
        {final state: finished coflows dropped from memory}, "rounds", "last_round_ms",
        "recent_round_ms" / "recent_allocate_ms" (last 100 rounds:
        whole round / its policy.allocate part), "lps", "reactions": last 10 WAN events'
        reaction times, "reactions_total"}."""
        c = self.controller
        connected = self.connected_agents()
        snap = c.snapshot()
        states: dict[str, int] = {}
        for coflow in snap.coflows:
            states[coflow["state"]] = states.get(coflow["state"], 0) + 1
        stats = snap.stats
        return {
            "topology": snap.topology,
            "scheduler": getattr(c.policy, "name", None),
            "uptime_s": time.time() - c.started_wall,
            "openflow": self.openflow is not None,
            "agents": [
                {"id": a, "dc": dc, "data_addr": addr, "connected": a in connected}
                for a, dc, addr in snap.agents
            ],
            "coflows": states,
            "rejected": stats["rejected"],
            "failed": stats["failed"],
            "cancelled": stats["cancelled"],
            "dropped_finished": stats["dropped_finished"],
            "rounds": stats["rounds"],
            "last_round_ms": stats["last_round_ms"],
            "recent_round_ms": stats["round_ms"][-100:],
            "recent_allocate_ms": stats["allocate_ms"][-100:],
            "lps": _policy_lps(c),
            "reactions": self.reactions()[-10:],
            "reactions_total": self.channel.reaction_count if self.channel else 0,
        }

    def reactions(self) -> list[dict]:
        """WAN events' reaction times: [{"event_to_push_ms", "event_to_applied_ms", "agents"}]."""
        if self.channel is None:
            return []
        with self.channel.ack_event:
            return [r.to_json() for r in self.channel.reactions]

    def topology(self) -> dict:
        """{"name", "dcs", "links": [{"src", "dst", "capacity", "state", "allocated"}]}."""
        snap = self.controller.snapshot()
        links = [
            {"src": u, "dst": v, "capacity": cap, "state": state, "allocated": load}
            for u, v, cap, state, load in snap.links
        ]
        return {"name": snap.topology, "dcs": list(snap.dcs), "links": links}

    def links(self) -> dict:
        """Every directed WAN link with its allocation and, with switches, what its sending
        port counted (OpenFlow port statistics, port_stats.py):
        {"links": [{"a", "b", "state", "capacity_bytes_per_s", "allocated_bytes_per_s",
        "measured_bytes_per_s" (rate between the last two polls), "tx_bytes", "tx_packets",
        "tx_dropped", "rx_bytes", "rx_dropped", "dpid", "port", "sampled_s" (age of the
        sample)}]}; the measured fields are null without switches or before a poll."""
        snap = self.controller.snapshot()
        measured = self.ports() if self.ports is not None else {}
        out = []
        for a, b, cap, state, load in snap.links:
            row = {"a": a, "b": b, "state": state, "capacity_bytes_per_s": cap,
                   "allocated_bytes_per_s": load}  # fmt: skip
            m = measured.get((a, b))
            for key in _MEASURED:
                row[key] = None if m is None else getattr(m, key)
            row["measured_bytes_per_s"] = None if m is None else m.tx_bytes_per_s
            out.append(row)
        return {"links": out}

    def tunnels(self) -> dict:
        """{"tunnels": [{"tunnel", "src", "dst", "index", "path", "up"}], "switches": {...}}."""
        table = self.channel.tunnels if self.channel is not None else None
        with self.controller.lock:
            tunnels = table.to_json() if table is not None else []
        switches = self.openflow() if self.openflow is not None else {}
        return {"logical": self.openflow is None, "tunnels": tunnels, "switches": switches}

    def coflows(self) -> list[dict]:
        """[{"id", "state", "bytes_total", "bytes_delivered", "cct_s", "deadline_s"}]."""
        return list(self.controller.snapshot().coflows)

    def coflow(self, coflow_id: int) -> dict:
        """checkStatus's map plus "flowgroups": [{"src_dc", "dst_dc", "remaining",
        "paths": [{"path", "rate"}]}].

        Raises:
            RegistryError: unknown coflow (answered 404).
        """
        status = self.controller.status(coflow_id)
        status["flowgroups"] = self.controller.flowgroup_rates(coflow_id)
        return status


def _policy_lps(controller: Controller) -> int:
    stats = getattr(controller.policy, "stats", None)
    return int(stats.get("lps", 0)) if isinstance(stats, dict) else 0


_MEASURED = ("tx_bytes", "tx_packets", "tx_dropped", "rx_bytes", "rx_dropped", "dpid", "port",
             "sampled_s")  # fmt: skip


class _Collector:
    """Prometheus collector reading the controller at scrape time."""

    def __init__(self, app: RestApp) -> None:
        self.app = app

    def collect(self):
        c = self.app.controller
        snap = c.snapshot()
        rounds = snap.stats["rounds"]
        last_ms = snap.stats["last_round_ms"]
        recent = snap.stats["round_ms"]
        active = snap.active
        delivered = snap.bytes_delivered
        rejected = snap.stats["rejected"]
        ended = {k: snap.stats[k] for k in ("failed", "cancelled", "restarts")}
        dropped = snap.stats["dropped_finished"]
        yield CounterMetricFamily("terra_rounds", "Scheduling rounds run", value=rounds)
        yield GaugeMetricFamily(
            "terra_round_latency_ms", "Wall time of the last scheduling round (ms)", value=last_ms
        )
        mean = sum(recent) / len(recent) if recent else 0.0
        yield GaugeMetricFamily(
            "terra_round_latency_mean_ms",
            "Mean wall time of the last 1000 scheduling rounds (ms)",
            value=mean,
        )
        yield CounterMetricFamily(
            "terra_lps_solved", "LPs solved by the policy", value=_policy_lps(c)
        )
        yield GaugeMetricFamily("terra_active_coflows", "Coflows not yet done", value=active)
        yield CounterMetricFamily(
            "terra_bytes_delivered", "Bytes acknowledged by receivers", value=delivered
        )
        yield CounterMetricFamily(
            "terra_rejected_coflows", "Coflows rejected (deadline)", value=rejected
        )
        yield CounterMetricFamily(
            "terra_failed_coflows", "Coflows failed (a flow cannot run)", value=ended["failed"]
        )
        yield CounterMetricFamily(
            "terra_cancelled_coflows", "Coflows cancelled", value=ended["cancelled"]
        )
        yield CounterMetricFamily(
            "terra_flow_restarts",
            "Flows sent again after a digest mismatch",
            value=ended["restarts"],
        )
        family = CounterMetricFamily(
            "terra_dropped_finished_coflows",
            "Finished coflows dropped from memory, per final state",
            labels=["state"],
        )
        for state, n in sorted(dropped.items()):
            family.add_metric([state], n)
        yield family
        yield GaugeMetricFamily(
            "terra_agents_connected",
            "Agents on the control channel",
            value=len(self.app.connected_agents()),
        )
        if self.app.ports is not None:
            yield from _port_families(self.app.ports())


def _port_families(loads: dict):
    """Per-link families from the switches' WAN port counters (port_stats.LinkLoad)."""
    labels = ["a", "b", "dpid", "port"]
    tx = CounterMetricFamily(
        "terra_link_tx_bytes", "Bytes a WAN port sent (OpenFlow)", labels=labels
    )
    drops = CounterMetricFamily(
        "terra_link_tx_dropped", "Packets a WAN port dropped on send (OpenFlow)", labels=labels
    )
    rx_drops = CounterMetricFamily(
        "terra_link_rx_dropped", "Packets a WAN port dropped on receive (OpenFlow)", labels=labels
    )
    rate = GaugeMetricFamily(
        "terra_link_measured_bytes_per_second",
        "Bytes/s a WAN port sent between the last two port-statistics polls",
        labels=labels,
    )
    for (a, b), m in sorted(loads.items()):
        key = [a, b, str(m.dpid), str(m.port)]
        tx.add_metric(key, m.tx_bytes)
        drops.add_metric(key, m.tx_dropped)
        rx_drops.add_metric(key, m.rx_dropped)
        if m.tx_bytes_per_s is not None:
            rate.add_metric(key, m.tx_bytes_per_s)
    yield from (tx, drops, rx_drops, rate)


def _reply(start_response, code: int, body, headers: list | None = None) -> list[bytes]:
    reason = {200: "OK", 404: "Not Found", 405: "Method Not Allowed", 500: "Internal Server Error"}
    data = json.dumps(body, default=_json_default).encode()
    start_response(
        f"{code} {reason[code]}",
        [
            ("Content-Type", "application/json"),
            ("Content-Length", str(len(data))),
            *(headers or []),
        ],
    )
    return [data]


def _json_default(value):
    if isinstance(value, set | tuple):
        return list(value)
    return str(value)


class _ThreadingWSGIServer(socketserver.ThreadingMixIn, WSGIServer):
    """wsgiref's server, a thread per request, behind the controller's TLS (docs/security.md).

    Each request's thread runs the TLS handshake (within HANDSHAKE_S) and, unless the
    server is public, requires an operator certificate before any HTTP is read; at most
    MAX_REST_THREADS requests are served at once (others are closed at once), and a
    request must arrive within REQUEST_TIMEOUT_S.
    """

    daemon_threads = True
    security: ServerSecurity | None = None
    public = False
    slots: threading.BoundedSemaphore  # requests in progress (set by start_rest_server)

    def process_request(self, request, client_address):
        if not self.slots.acquire(blocking=False):
            LOG.warning("REST %s: too many requests in progress; refused", client_address)
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except Exception:
            self.slots.release()
            raise

    def process_request_thread(self, request, client_address):
        try:
            if self.security is not None:
                try:
                    request, identity = authenticate(request, self.security, self.public)
                except (OSError, PkiError, ValueError) as exc:
                    LOG.info("REST %s: not authenticated: %s", client_address, exc)
                    self.shutdown_request(request)
                    return
                if not self.public and not identity.may(Role.OPERATOR):
                    LOG.warning("REST %s: %s is not an operator", client_address, identity.name)
                    self.shutdown_request(request)
                    return
            request.settimeout(REQUEST_TIMEOUT_S)
            super().process_request_thread(request, client_address)
        finally:
            self.slots.release()


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, fmt, *args) -> None:
        LOG.debug("REST %s", fmt % args)


def start_rest_server(
    app: RestApp,
    host: str,
    port: int,
    security: ServerSecurity | None,
    public: bool = False,
    spawn=None,
):
    """Serve `app` on host:port (HTTP/1.0 over TLS, thread per request) on os-ken's hub.

    Args:
        security: ServerSecurity with the controller's TLS context (client certificates
            verified when given), or None: plain HTTP (--insecure).
        public: serve clients without a certificate too (--rest-public); with a
            certificate, any role may read.
        spawn: how to run the loop (default os_ken.lib.hub.spawn; tests pass a
            daemon-thread starter).

    Returns:
        (server (call .shutdown() to stop), thread, bound (host, port)).

    Raises:
        OSError: the address cannot be bound.
    """
    from os_ken.lib import hub

    server = make_server(
        host, port, app, server_class=_ThreadingWSGIServer, handler_class=_QuietHandler
    )
    server.security = security
    server.public = public
    server.slots = threading.BoundedSemaphore(MAX_REST_THREADS)
    bound = server.server_address[:2]
    scheme = "https" if security is not None and security.context is not None else "http"
    LOG.info("REST on %s://%s:%d%s", scheme, *bound, " (public)" if public else "")
    return server, (spawn or hub.spawn)(server.serve_forever), bound
