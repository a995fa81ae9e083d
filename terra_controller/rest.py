"""Read-only REST for operators: JSON views of the controller and Prometheus metrics.

Routes (GET only; docs/design.md section 6; docs/operations.md lists every field and its unit):

    /                the operator's web page (terra_controller/web/: the WAN graph, link
                     states and loads, tunnels of a DC pair, coflows, round times; it polls
                     the JSON routes below every second; see docs/runtime.md)
    /static/NAME     the page's script and style sheet (package files, nothing fetched
                     from elsewhere)
    /status          controller: topology name, uptime, agents, coflows per state, rounds
    /topology        the topology's name, DCs and links (as /links); DC positions ([x, y],
                     from the topology file's "positions", e.g. longitude/latitude) when known
    /links           directed links a -> b: capacity (bytes/s and Gbit/s), state (up/down),
                     allocated rate (bytes/s), bytes the receivers acknowledged across the
                     link and, with switches, the sending port's counters and measured rate
                     (bytes/s)
    /tunnels         tunnels (id, DC pair, path, up) and, with switches, the rules of every
                     switch (by DPID) and their counts, flow-mods sent
    /coflows         every coflow in memory: id, state, bytes total/delivered, CCT;
                     ?finished=N: every active coflow and the N that finished last only
    /coflows/{id}    one coflow's status with its FlowGroups' per-path allocations
    /metrics         Prometheus text format: the controller's CollectorRegistry
                     (terra_controller/metrics.py; every metric in docs/runtime.md)

A WSGI app served by the standard library's wsgiref handler in a thread per
authenticated request, behind the same admission as the coflow API
(transport.accept_loop: caps per address and in total, TLS handshakes without a
thread each, a whole-request deadline), started on os-ken's hub. Errors: 400 for
a malformed query (integers are ASCII digits only), 404 for unknown paths or
coflows, 405 for other methods; a failing view answers 500 and the server keeps
running.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import time
from collections.abc import Callable
from importlib import resources
from urllib.parse import parse_qs
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer

from overlay.rate_limited_log import RateLimitedLog
from terra_controller.coflow_registry import RegistryError
from terra_controller.controller import Controller
from terra_controller.metrics import CONTENT_TYPE, ControllerCollector
from terra_controller.transport import (
    DEADLINES,
    REST_CAP,
    ServerSecurity,
    listen_and_serve,
    stop_listener,
)
from terra_security.pki import Role

LOG = logging.getLogger("terra.rest")

# The web page's files (terra_controller/web/) by URL path, with their content type.
WEB_FILES = {
    "/": ("index.html", "text/html; charset=utf-8"),
    "/static/app.js": ("app.js", "text/javascript; charset=utf-8"),
    "/static/style.css": ("style.css", "text/css; charset=utf-8"),
}
# The page runs only its own files: no inline script, nothing from another origin.
WEB_HEADERS = [
    ("Content-Security-Policy",
     "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
     "connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'none'"),
    ("X-Content-Type-Options", "nosniff"),
    ("Cache-Control", "no-cache"),
]  # fmt: skip
REQUEST_TIMEOUT_S = 10.0


class RestApp:
    """The WSGI application.

    Args:
        controller: the Controller.
        channel: the AgentChannel (agents connected, tunnels) or None.
        openflow: callable (detail: bool = True) returning {"rules_per_switch": {dpid: n},
            "flow_mods": n, "flow_mods_per_switch": {dpid: n}, "rules": {...} (empty
            without detail)} from the OpenFlow app, or None without switches.
        ports: callable returning {(a, b): port_stats.LinkLoad} (the switches' WAN port
            counters), or None without switches.

    Attributes:
        metrics: the controller's CollectorRegistry (`Controller.metrics`), with a
            ControllerCollector reading this app's controller, channel and switches.
    """

    def __init__(
        self, controller: Controller, channel=None, openflow: Callable | None = None,
        ports: Callable | None = None,
    ):  # fmt: skip
        self.controller = controller
        self.channel = channel
        self.openflow = openflow
        self.ports = ports
        self.web: dict[str, bytes] = {}  # WEB_FILES' contents, read once
        self.metrics = controller.metrics.registry
        self.metrics.register(
            ControllerCollector(
                controller,
                connected=lambda: len(self.connected_agents()),
                openflow=None if openflow is None else lambda: openflow(detail=False),
                ports=ports,
            )
        )

    def __call__(self, environ, start_response):
        """WSGI entry point."""
        path = environ.get("PATH_INFO", "/").rstrip("/") or "/"
        if environ.get("REQUEST_METHOD") != "GET":
            return _reply(start_response, 405, {"error": "read-only: GET only"}, [("Allow", "GET")])
        try:
            if path == "/metrics":
                body = self.controller.metrics.render()
                start_response(
                    "200 OK", [("Content-Type", CONTENT_TYPE), ("Content-Length", str(len(body)))]
                )
                return [body]
            if path in WEB_FILES:
                return self._web_file(path, start_response)
            if path == "/coflows" and environ.get("QUERY_STRING"):
                query = parse_qs(environ["QUERY_STRING"])
                text = query.get("finished", [""])[0]
                if not _ascii_digits(text) or len(text) > 9:
                    return _reply(start_response, 400, {"error": "finished must be 0..999999999"})
                return _reply(start_response, 200, self.controller.recent_coflows(int(text)))
            view = self._route(path)
            if view is None:
                return _reply(start_response, 404, {"error": f"no such resource {path}"})
            return _reply(start_response, 200, view())
        except RegistryError as exc:
            return _reply(start_response, 404, {"error": str(exc)})
        except Exception:
            LOG.exception("REST %s failed", path)
            return _reply(start_response, 500, {"error": "internal error (logged)"})

    def _web_file(self, path: str, start_response) -> list[bytes]:
        """One of WEB_FILES from the package (read once), with WEB_HEADERS."""
        name, ctype = WEB_FILES[path]
        if name not in self.web:
            self.web[name] = (resources.files("terra_controller") / "web" / name).read_bytes()
        body = self.web[name]
        start_response(
            "200 OK",
            [("Content-Type", ctype), ("Content-Length", str(len(body))), *WEB_HEADERS],
        )
        return [body]

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
            if not _ascii_digits(text) or len(text) > 19:  # coflow ids are 63-bit at most
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
        snap = c.snapshot(coflows=False)
        states = c.state_counts()
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
        """{"name", "dcs", "links": the rows of `links()`, "positions": {dc: [x, y]} (only
        DCs the topology file places)}."""
        snap = self.controller.snapshot(coflows=False)
        return {
            "name": snap.topology,
            "dcs": list(snap.dcs),
            "links": self._link_rows(snap),
            "positions": positions(self.controller.topology.attrs.get("positions"), snap.dcs),
        }

    def links(self) -> dict:
        """Every directed WAN link with its allocation and, with switches, what its sending
        port counted (OpenFlow port statistics, port_stats.py):
        {"links": [{"a", "b", "state", "capacity_bytes_per_s", "capacity_gbps",
        "allocated_bytes_per_s", "bytes_delivered" (bytes the receivers acknowledged that
        crossed the link, split over each flow's paths by rate; Controller.link_bytes),
        "measured_bytes_per_s" (rate between the last two polls), "tx_bytes", "tx_packets",
        "tx_dropped", "rx_bytes", "rx_dropped", "dpid", "port", "sampled_s" (age of the
        sample)}]}, one row per direction a -> b ("a" and "b" as the topology file names the
        ends; capacity_gbps = capacity_bytes_per_s * 8 / 1e9); the measured fields are null
        without switches or before a poll."""
        return {"links": self._link_rows(self.controller.snapshot(coflows=False))}

    def _link_rows(self, snap) -> list[dict]:
        """The rows of `links()` for a Snapshot."""
        measured = self.ports() if self.ports is not None else {}
        delivered = self.controller.link_delivered()
        out = []
        for a, b, cap, state, load in snap.links:
            row = {"a": a, "b": b, "state": state, "capacity_bytes_per_s": cap,
                   "capacity_gbps": cap * 8 / 1e9, "allocated_bytes_per_s": load,
                   "bytes_delivered": delivered.get((a, b), 0.0)}  # fmt: skip
            m = measured.get((a, b))
            for key in _MEASURED:
                row[key] = None if m is None else getattr(m, key)
            row["measured_bytes_per_s"] = None if m is None else m.tx_bytes_per_s
            out.append(row)
        return out

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
        """checkStatus's map plus "flowgroups": [{"src_dc", "dst_dc", "bytes_remaining",
        "paths": [{"path", "rate_bytes_per_s"}]}].

        Raises:
            RegistryError: unknown coflow (answered 404).
        """
        status = self.controller.status(coflow_id)
        status["flowgroups"] = self.controller.flowgroup_rates(coflow_id)
        return status


def positions(value: object, dcs) -> dict[str, list[float]]:
    """The topology file's "positions" ({dc: [x, y]}, e.g. [longitude, latitude]) for the
    DCs in `dcs`; entries that are not two finite numbers are left out (the page places
    those DCs itself)."""
    out: dict[str, list[float]] = {}
    if not isinstance(value, dict):
        return out
    for dc in dcs:
        xy = value.get(dc)
        if (
            isinstance(xy, list | tuple)
            and len(xy) == 2
            and all(isinstance(c, int | float) and not isinstance(c, bool) for c in xy)
            and all(math.isfinite(c) for c in xy)
        ):
            out[dc] = [float(xy[0]), float(xy[1])]
    return out


def _policy_lps(controller: Controller) -> int:
    stats = getattr(controller.policy, "stats", None)
    return int(stats.get("lps", 0)) if isinstance(stats, dict) else 0


_MEASURED = ("tx_bytes", "tx_packets", "tx_dropped", "rx_bytes", "rx_dropped", "dpid", "port",
             "sampled_s")  # fmt: skip


def _ascii_digits(text: str) -> bool:
    """True when `text` is one or more ASCII digits 0-9 (not "²", "٣" or other digits)."""
    return text.isascii() and text.isdigit()


def _reply(start_response, code: int, body, headers: list | None = None) -> list[bytes]:
    reason = {
        200: "OK",
        400: "Bad Request",
        404: "Not Found",
        405: "Method Not Allowed",
        500: "Internal Server Error",
    }
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


class _RestServer(WSGIServer):
    """wsgiref's request handling, without its listening socket: the connections come from
    `transport.accept_loop` (the same admission, TLS handshake thread and caps as the API)."""

    def __init__(self, app, host: str, port: int) -> None:
        super().__init__((host, port), _QuietHandler, bind_and_activate=False)
        self.socket.close()  # never bound: transport's listener accepts
        self.server_name, self.server_port = host, port
        self.setup_environ()
        self.set_app(app)


class RestServer:
    """A running REST server (what `start_rest_server` returns).

    Attributes:
        listener: the listening socket.
        not_operator: RateLimitedLog of clients refused for lacking an operator certificate.
    """

    def __init__(self, listener, wsgi: _RestServer, public: bool) -> None:
        self.listener, self.wsgi, self.public = listener, wsgi, public
        self.not_operator = RateLimitedLog(LOG, "REST: clients without an operator "
                                           "certificate refused")  # fmt: skip

    def handle(self, sock, addr, identity) -> None:
        """Serve one HTTP request on an authenticated connection, within REQUEST_TIMEOUT_S
        for the whole request and reply (a peer trickling its request is cut off)."""
        if not self.public and (identity is None or not identity.may(Role.OPERATOR)):
            self.not_operator.event(f"{addr}: {identity.name if identity else 'no certificate'}")
            return
        sock.settimeout(REQUEST_TIMEOUT_S)
        try:
            with DEADLINES.guard(sock, REQUEST_TIMEOUT_S):
                _QuietHandler(sock, addr, self.wsgi)
        except (OSError, ValueError) as exc:
            LOG.debug("REST %s: %s", addr, exc)

    def shutdown(self) -> None:
        """Stop accepting (requests in progress finish)."""
        stop_listener(self.listener)

    def server_close(self) -> None:
        """Close the listener (as shutdown; for socketserver's interface)."""
        stop_listener(self.listener)


class _DebugLog:
    """A file-like stderr for wsgiref that writes to the log at DEBUG (a client closing
    before its reply is common and not worth a traceback on stderr)."""

    def write(self, text: str) -> int:
        """Log `text` (stripped) at DEBUG."""
        if text.strip():
            LOG.debug("REST: %s", text.rstrip())
        return len(text)

    def flush(self) -> None:
        """Nothing buffered."""


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, fmt, *args) -> None:
        LOG.debug("REST %s", fmt % args)

    def get_stderr(self):
        return _DebugLog()


def start_rest_server(
    app: RestApp,
    host: str,
    port: int,
    security: ServerSecurity | None,
    public: bool = False,
    spawn=None,
):
    """Serve `app` on host:port (HTTP/1.0 over TLS, thread per authenticated request) on
    os-ken's hub, behind `transport.accept_loop`'s admission: at most REST_CAP connections
    (REST_CAP per address; fewer when `security` caps lower), TLS handshakes in one thread,
    a whole-request deadline of REQUEST_TIMEOUT_S.

    Args:
        security: ServerSecurity with the controller's TLS context (client certificates
            verified when given), or None / a context of None: plain HTTP (--insecure).
        public: serve clients without a certificate too (--rest-public; needs a context
            made with require_client_cert=False); with a certificate, any role may read.
        spawn: how to run the loop (default os_ken.lib.hub.spawn; tests pass a
            daemon-thread starter).

    Returns:
        (server (call .shutdown() to stop), thread, bound (host, port)).

    Raises:
        OSError: the address cannot be bound.
    """
    security = security or ServerSecurity(None)
    security = dataclasses.replace(
        security,
        max_connections=min(security.max_connections, REST_CAP[0]),
        max_per_address=min(security.max_per_address, REST_CAP[1]),
    )
    wsgi = _RestServer(app, host, port)
    server = RestServer(None, wsgi, public)
    server.listener, thread, bound = listen_and_serve(
        host, port, server.handle, security, spawn, optional=public, name="REST",
        listeners=app.controller.metrics.listeners,
    )  # fmt: skip
    wsgi.server_name, wsgi.server_port = bound[0], bound[1]
    wsgi.setup_environ()
    scheme = "https" if security.context is not None else "http"
    LOG.info("REST on %s://%s:%d%s", scheme, *bound, " (public)" if public else "")
    return server, thread, bound
