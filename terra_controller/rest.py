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
    /coflows/{id}    one coflow's status with its FlowGroups' per-path allocations and each
                     flow's paths now (tunnel id, rate)
    /agents          registered agents: DC, connected, last seen, flows sent / received now
    /tenants         tenants (terra_controller/tenant_api.py): weight, share, active coflows,
                     allocated rate (bytes/s), the last round's isolation guarantee
    /events          the event log (terra_controller/events.py: link down/up, capacity,
                     coflow admitted / done / failed / cancelled, agent registered / lost);
                     ?since=N: only the events after number N
    /metrics         Prometheus text format: the controller's CollectorRegistry
                     (terra_controller/metrics.py; every metric in docs/runtime.md)

Who may read: a client with an operator certificate; without one (unless --rest-public)
the page's files and /healthz, and the JSON only with an operator token in
"Authorization: Bearer" (TokenGate; tokens from `terra-controller ctl login`,
terra_security/tokens.py).

A WSGI app (webob requests and responses, a routes Mapper) served on the controller's
loop: each authenticated connection is a task of it, its request read with h11 and
answered by the app there (http_on_loop.py), behind the same admission as the coflow API
(transport.accept_loop: caps per address and in total, TLS handshakes without a thread
each, a whole-request deadline). A standby serves /healthz the same way on a loop of its
own (standby.py). Errors answer JSON
{"error": text}: 400 for a malformed query (integers are ASCII digits only), 404 for
unknown paths or coflows, 405 for other methods; a failing view answers 500 and the
server keeps running.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time
from collections.abc import Callable
from importlib import resources

from routes import Mapper
from webob import Request, Response
from webob.exc import HTTPBadRequest, HTTPException, HTTPMethodNotAllowed, HTTPNotFound

from overlay.rate_limited_log import RateLimitedLog
from terra_controller.coflow_state import RegistryError
from terra_controller.console_views import (
    CoflowListing,
    agent_rows,
    flow_paths,
    link_coflows,
    to_json,
)
from terra_controller.controller import Controller
from terra_controller.http_on_loop import send_error, serve_wsgi_request
from terra_controller.metrics import CONTENT_TYPE, ControllerCollector
from terra_controller.tenant_api import rest_view, with_tenant
from terra_controller.transport import (
    REST_CAP,
    ServerSecurity,
    listen_and_serve,
    stop_listener,
)
from terra_security.pki import Role
from terra_security.tokens import TokenError, verify_token

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


def _routes() -> Mapper:
    """The GET routes: each match names a RestApp handler ("handler") and its arguments."""
    mapper = Mapper(controller_scan=None, register=False)
    for path, (name, ctype) in WEB_FILES.items():
        mapper.connect(path, handler="_web_file", file=name, content_type=ctype)
    for view in ("status", "topology", "links", "tunnels", "agents", "tenants"):
        mapper.connect(f"/{view}", handler="_view", view=view)
    mapper.connect("/coflows", handler="_coflows")
    # ASCII digits only ("²" or "٣" are not an id); coflow ids are 63-bit at most
    mapper.connect("/coflows/{coflow_id}", handler="_view", view="coflow",
                   requirements={"coflow_id": "[0-9]{1,19}"})  # fmt: skip
    mapper.connect("/events", handler="_events")
    mapper.connect("/metrics", handler="_metrics")
    mapper.connect("/healthz", handler="_healthz")
    mapper.create_regs([])
    return mapper


ROUTES = _routes()


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
        self.listing = CoflowListing(controller)  # /coflows
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
        """WSGI entry point: the ROUTES handler's response, or JSON {"error": text} with
        400 / 404 / 405 (webob.exc raised by a handler), 404 (RegistryError) or 500."""
        # Latin-1 keeps the path's bytes as wsgiref gives them: every byte decodes, and a
        # non-ASCII one matches no route.
        request = Request(environ, url_encoding="latin-1")
        try:
            response = self._dispatch(request)
        except HTTPException as exc:
            response = _json({"error": exc.detail}, exc.code)
            if "Allow" in exc.headers:
                response.headers["Allow"] = exc.headers["Allow"]
        except RegistryError as exc:
            response = _json({"error": str(exc)}, 404)
        except Exception:
            LOG.exception("REST %s failed", request.path_info)
            response = _json({"error": "internal error (logged)"}, 500)
        return response(environ, start_response)

    def _dispatch(self, request: Request) -> Response:
        if request.method != "GET":
            raise HTTPMethodNotAllowed("read-only: GET only", headers={"Allow": "GET"})
        path = request.path_info.rstrip("/") or "/"
        # routes' patterns end in "$", which also matches before a final "\n" (from "%0A")
        match = ROUTES.match(path) if path.isprintable() else None
        if match is None:
            raise HTTPNotFound(f"no such resource {path}")
        return getattr(self, match.pop("handler"))(request, **match)

    def _web_file(self, request: Request, file: str, content_type: str) -> Response:
        """One of WEB_FILES from the package (read once), with WEB_HEADERS."""
        if file not in self.web:
            self.web[file] = (resources.files("terra_controller") / "web" / file).read_bytes()
        response = Response(body=self.web[file], content_type=content_type)
        response.headers.update(WEB_HEADERS)
        return response

    def _view(self, request: Request, view: str, **ids: str) -> Response:
        """The JSON of the view method `view`, given the route's ids as ints."""
        return _json(getattr(self, view)(*map(int, ids.values())))

    def _coflows(self, request: Request) -> Response:
        """`coflows()`, or with ?finished=N (N: 0..999999999) the active and N last finished."""
        if not request.query_string:
            return Response(body=self.listing.render(), content_type="application/json")
        return _json(self.controller.recent_coflows(_digits(request, "finished")))

    def _events(self, request: Request) -> Response:
        """The event log after ?since=N (default 0: every event kept)."""
        since = _digits(request, "since", 0)
        return _json(self.controller.owner.run(self.controller.events.since, since))

    def _metrics(self, request: Request) -> Response:
        return Response(body=self.controller.metrics.render(), content_type=CONTENT_TYPE)

    def _healthz(self, request: Request) -> Response:
        return _json(self.controller.health())

    # ---- views --------------------------------------------------------------------------

    def connected_agents(self) -> set[str]:
        """Ids of agents with an open control connection."""
        if self.channel is None:
            return set()
        return self.controller.owner.run(lambda: set(self.channel.connections))

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
        return self.controller.owner.run(lambda: [r.to_json() for r in self.channel.reactions])

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
        sample), "coflows": ids of the coflows with a rate on it now}]}, one row per
        direction a -> b ("a" and "b" as the topology file names the
        ends; capacity_gbps = capacity_bytes_per_s * 8 / 1e9); the measured fields are null
        without switches or before a poll."""
        return {"links": self._link_rows(self.controller.snapshot(coflows=False))}

    def _link_rows(self, snap) -> list[dict]:
        """The rows of `links()` for a Snapshot."""
        measured = self.ports() if self.ports is not None else {}
        delivered = self.controller.link_delivered()
        on_link = link_coflows(self.controller)
        out = []
        for a, b, cap, state, load in snap.links:
            row = {"a": a, "b": b, "state": state, "capacity_bytes_per_s": cap,
                   "capacity_gbps": cap * 8 / 1e9, "allocated_bytes_per_s": load,
                   "bytes_delivered": delivered.get((a, b), 0.0),
                   "coflows": on_link.get((a, b), [])}  # fmt: skip
            m = measured.get((a, b))
            for key in _MEASURED:
                row[key] = None if m is None else getattr(m, key)
            row["measured_bytes_per_s"] = None if m is None else m.tx_bytes_per_s
            out.append(row)
        return out

    def tunnels(self) -> dict:
        """{"tunnels": [{"tunnel", "src", "dst", "index", "path", "up"}], "switches": {...}}."""
        table = self.channel.tunnels if self.channel is not None else None
        tunnels = self.controller.owner.run(table.to_json) if table is not None else []
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
        status = with_tenant(self.controller, self.controller.status(coflow_id))
        status["flowgroups"] = self.controller.flowgroup_rates(coflow_id)
        return flow_paths(self.controller, self.channel, status)

    def agents(self) -> dict:
        """console_views.agent_rows: every agent with its DC, last seen and flows now."""
        return agent_rows(self.controller, self.channel)

    def tenants(self) -> dict:
        """tenant_api.rest_view: weights, active coflows, rates, isolation guarantee."""
        return rest_view(self.controller)


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


def _digits(request: Request, name: str, default: int | None = None) -> int:
    """The query parameter `name` as an int 0..999999999 (ASCII digits), or `default` when
    it is absent and a default is given.

    Raises:
        HTTPBadRequest: anything else (answered 400).
    """
    try:
        text = request.GET.get(name)
    except UnicodeDecodeError:  # not UTF-8, hence not digits
        text = ""
    if text is None and default is not None:
        return default
    text = text or ""
    if not (text.isascii() and text.isdigit()) or len(text) > 9:
        raise HTTPBadRequest(f"{name} must be 0..999999999")
    return int(text)


def _policy_lps(controller: Controller) -> int:
    stats = getattr(controller.policy, "stats", None)
    return int(stats.get("lps", 0)) if isinstance(stats, dict) else 0


_MEASURED = ("tx_bytes", "tx_packets", "tx_dropped", "rx_bytes", "rx_dropped", "dpid", "port",
             "sampled_s")  # fmt: skip


def _json(body, status: int = 200) -> Response:
    """A JSON response (sets and tuples as lists, other non-JSON values as strings)."""
    return Response(body=to_json(body), status=status, content_type="application/json")


class HealthApp:
    """A WSGI application that answers GET /healthz with `health()` (JSON) and every other
    request with JSON {"error": `refusal`} and status `code`: what a client without an
    operator certificate gets from the REST server, and what a standby controller serves.

    Args:
        health: callable returning the /healthz map ({"role", "leader", "state_version"}).
        code, refusal: the status and error text of any other request.
    """

    def __init__(self, health: Callable[[], dict], code: int, refusal: str) -> None:
        self.health, self.code, self.refusal = health, code, refusal

    def __call__(self, environ, start_response):
        """WSGI entry point."""
        request = Request(environ, url_encoding="latin-1")
        if request.method == "GET" and request.path_info.rstrip("/") == "/healthz":
            response = _json(self.health())
        else:
            response = _json({"error": self.refusal}, self.code)
        return response(environ, start_response)


class TokenGate:
    """What a client without an operator certificate gets (unless --rest-public): the page's
    own files (WEB_FILES: no data in them) and /healthz, and everything else only with a
    valid token (terra_security/tokens.py, from `terra-controller ctl login`) in
    "Authorization: Bearer TOKEN": the request then goes to `app` under the token's
    identity, with the role check a certificate gets (operators only). No or a forged,
    altered or expired token: 401 (WWW-Authenticate: Bearer); a token of another role: 403.

    Args:
        app: the RestApp. key: the controller's token key. health: /healthz's callable.
        refused: callable(text) noting a refusal (rate-limited log).
    """

    def __init__(self, app, key: bytes, health: Callable[[], dict], refused: Callable) -> None:
        self.app, self.key, self.health, self.refused = app, key, health, refused

    def __call__(self, environ, start_response):
        """WSGI entry point."""
        request = Request(environ, url_encoding="latin-1")
        path = request.path_info.rstrip("/") or "/"
        if request.method == "GET" and (path in WEB_FILES or path == "/healthz"):
            return self.app(environ, start_response)
        scheme, _, token = request.headers.get("Authorization", "").partition(" ")
        try:
            if scheme.lower() != "bearer" or not token:
                raise TokenError("an operator certificate or token is needed (only the page "
                                 "and /healthz are open; terra-controller ctl login)")  # fmt: skip
            identity = verify_token(self.key, token.strip())
        except TokenError as exc:
            self.refused(f"{request.remote_addr}: {exc}")
            response = _json({"error": str(exc)}, 401)
            response.headers["WWW-Authenticate"] = 'Bearer realm="terra"'
            return response(environ, start_response)
        if not identity.may(Role.OPERATOR):
            self.refused(f"{request.remote_addr}: token of {identity.role.value} {identity.name}")
            why = f"{identity.role.value} {identity.name!r} may not read the operator REST"
            return _json({"error": why}, 403)(environ, start_response)
        return self.app(environ, start_response)


class RestServer:
    """A running REST server (what `start_rest_server` returns): its connections come from
    `transport.accept_loop` (the same admission, TLS handshakes and caps as the API) and
    are served as tasks of the owner's loop (`handle_on_loop`).

    Attributes:
        listener: the listening socket.
        base_environ: the WSGI environ every request starts from (server name and port).
        not_operator: RateLimitedLog of clients refused for lacking an operator certificate
            or token.
    """

    def __init__(self, app: RestApp, public: bool) -> None:
        self.app, self.public, self.listener = app, public, None
        self.base_environ: dict[str, str] = {}
        self.scheme = "http"  # wsgi.url_scheme of the loop's requests
        self.not_operator = RateLimitedLog(LOG, "REST: clients without an operator "
                                           "certificate refused")  # fmt: skip

    async def handle_on_loop(self, sock, addr, identity) -> None:
        """Serve one HTTP request as a task of the owner's loop (http_on_loop.py: h11, the
        application called on the loop) within REQUEST_TIMEOUT_S for the whole request and
        reply (a peer trickling its request is cut off); 503 while no controller is
        attached to the app. Who reads what: `app_for`."""
        import trio

        app = self.app_for(identity)
        if app is None:  # starting: no controller attached to the app yet
            with trio.move_on_after(REQUEST_TIMEOUT_S):
                await send_error(sock, 503, "the controller is starting; retry")
            return
        with trio.move_on_after(REQUEST_TIMEOUT_S) as scope:
            try:
                await serve_wsgi_request(app, sock, addr, self.base_environ, self.scheme)
            except OSError as exc:
                LOG.debug("REST %s: %s", addr, exc)
        if scope.cancelled_caught:
            LOG.debug("REST %s: no whole request within %s s", addr, REQUEST_TIMEOUT_S)

    def app_for(self, identity):
        """The application a peer of `identity` gets: the whole app for an operator
        certificate (or any peer when `public`); else TokenGate, which serves the page's
        files and /healthz, and the rest only with an operator token; None while no
        controller is attached to the app (starting: 503)."""
        if self.public or (identity is not None and identity.may(Role.OPERATOR)):
            return self.app
        controller = getattr(self.app, "controller", None)
        if controller is None:
            return None
        return TokenGate(self.app, controller.token_key, controller.health,
                         self.not_operator.event)  # fmt: skip

    def shutdown(self) -> None:
        """Stop accepting (requests in progress finish)."""
        stop_listener(self.listener)


def start_rest_server(
    app: RestApp,
    host: str,
    port: int,
    security: ServerSecurity | None,
    public: bool = False,
    spawn=None,
    listeners: dict | None = None,
    *,
    owner,
):
    """Serve `app` on host:port (one request per connection, over TLS) behind
    `transport.accept_loop`'s admission: at most REST_CAP connections (REST_CAP per
    address; fewer when `security` caps lower), TLS handshakes in the accept thread, a
    whole-request deadline of REQUEST_TIMEOUT_S. Each authenticated connection is a task
    of `owner`'s loop (`RestServer.handle_on_loop`).

    Args:
        security: ServerSecurity with the controller's TLS context (client certificates
            verified when given), or None / a context of None: plain HTTP (--insecure). A
            context made with require_client_cert=False lets peers without a certificate
            read /healthz (and everything when `public`).
        public: serve clients without a certificate too (--rest-public); with a
            certificate, any role may read.
        spawn: how to run the loop (default os_ken.lib.hub.spawn; tests pass a
            daemon-thread starter).
        listeners: {server name: Admission} its connection counts go to (default: the
            app's controller's metrics).
        owner: the OwnerLoop the connections are tasks of (the controller's, or a
            standby's).

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
    server = RestServer(app, public)
    server.base_environ = _base_environ(host, port)
    if listeners is None:
        listeners = app.controller.metrics.listeners
    scheme = "https" if security.context is not None else "http"
    server.scheme = scheme
    server.listener, thread, bound = listen_and_serve(
        host, port, server.handle_on_loop, security,
        spawn, optional=True, name="REST", listeners=listeners, owner=owner,
    )  # fmt: skip
    server.base_environ = _base_environ(*bound)
    LOG.info("REST on %s://%s:%d%s", scheme, *bound, " (public)" if public else "")
    return server, thread, bound


def _base_environ(host: str, port: int) -> dict[str, str]:
    """The server's part of every request's WSGI environ (as wsgiref's WSGIServer sets it)."""
    return {"SERVER_NAME": host, "SERVER_PORT": str(port), "GATEWAY_INTERFACE": "CGI/1.1",
            "REMOTE_HOST": "", "CONTENT_LENGTH": "", "SCRIPT_NAME": ""}  # fmt: skip
