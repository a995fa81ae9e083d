"""What a standby controller serves while another one leads (terra-controller --etcd).

A standby runs no scheduler and holds no state. On the coflow API port it answers every
request with the error "not_leader" and the leader's API address (clients follow it); on
the REST port it answers /healthz ({"role": "standby", "leader", "state_version": null})
and 503 for anything else; it does not listen on the agents' port, so an agent given
several controllers moves on to the next at once. Its connections are tasks of a trio loop
of its own (owner_loop.OwnerLoop), as the leader's are of the leader's. Once elected it
closes these listeners, stops that loop and starts as the leader on the same ports (cli.py).
"""

from __future__ import annotations

import secrets
from collections.abc import Callable

from terra_controller.api_server import serve_connection_on_loop
from terra_controller.owner_loop import OwnerLoop
from terra_controller.rest import HealthApp, start_rest_server
from terra_controller.transport import (
    FRAME_TIMEOUT_S,
    ServerSecurity,
    listen_and_serve,
    stop_listener,
)
from terra_wire.api import API_VERSION


class StandbyHandler:
    """Answers API requests on a standby: {"v", "ok": False, "code": "not_leader", "error",
    "leader": HOST:PORT or None, "instance"} (and "req" echoed).

    Args:
        leader: callable returning the leader's API address, or None when none is known.
    """

    def __init__(self, leader: Callable[[], str | None]) -> None:
        self.leader = leader
        self.frame_timeout_s = FRAME_TIMEOUT_S
        self.instance = secrets.token_hex(8)

    async def handle_on_loop(self, request: object, identity=None) -> dict:
        """`handle`, as the loop's API server calls it."""
        return self.handle(request, identity)

    def handle(self, request: object, identity=None) -> dict:
        """The not_leader reply to any request (never raises)."""
        leader = self.leader()
        where = f"the leader is {leader}" if leader else "no leader is known yet"
        reply = {"v": API_VERSION, "ok": False, "code": "not_leader", "leader": leader,
                 "error": f"this controller is a standby; {where}",
                 "instance": self.instance}  # fmt: skip
        req = request.get("req") if isinstance(request, dict) else None
        if req is not None:
            reply["req"] = req
        return reply


def standby_health(leader: Callable[[], str | None]) -> Callable[[], dict]:
    """The /healthz map of a standby: {"role": "standby", "leader", "state_version": None}."""
    return lambda: {"role": "standby", "leader": leader(), "state_version": None}


class StandbyServers:
    """The API and REST listeners of a standby (`start`), their connections tasks of the
    standby's own OwnerLoop; `close()` stops both and the loop.

    Args:
        api, rest: (host, port) to listen on. api_security, rest_security: ServerSecurity of
            each (as the leader's). leader: callable returning the leader's API address.

    Attributes:
        bound: {"api": (host, port), "rest": (host, port)} once started.
    """

    def __init__(
        self, api, rest, api_security: ServerSecurity, rest_security: ServerSecurity,
        leader: Callable[[], str | None],
    ) -> None:  # fmt: skip
        self.api, self.rest = api, rest
        self.api_security, self.rest_security = api_security, rest_security
        self.handler = StandbyHandler(leader)
        self.health = standby_health(leader)
        self.listeners: list = []
        self.bound: dict = {}
        self.owner: OwnerLoop | None = None

    def start(self) -> StandbyServers:
        """Listen on both ports (OSError: one cannot be bound; the other is closed)."""
        handler = self.handler
        self.owner = owner = OwnerLoop("terra-standby")
        try:
            listener, _, self.bound["api"] = listen_and_serve(
                *self.api,
                lambda sock, addr, ident: serve_connection_on_loop(handler, sock, addr, ident),
                self.api_security, name="coflow API (standby)", owner=owner,
            )  # fmt: skip
            self.listeners.append(listener)
            app = HealthApp(self.health, 503, "this controller is a standby")
            server, _, self.bound["rest"] = start_rest_server(
                app, *self.rest, self.rest_security, public=True, listeners={}, owner=owner
            )
            self.listeners.append(server.listener)
        except OSError:
            self.close()
            raise
        return self

    def close(self) -> None:
        """Stop listening, and end the connections in progress with the loop."""
        for listener in self.listeners:
            stop_listener(listener)
        self.listeners = []
        if self.owner is not None:
            self.owner.stop()
            self.owner = None


def advertised(host: str, port: int, advertise: str | None) -> str:
    """The HOST:PORT others reach a listener on: `advertise` (or the listen host unless it
    is a wildcard, else this machine's FQDN) with `port`."""
    if advertise:
        host = advertise
    elif host in ("0.0.0.0", "::", ""):
        import socket

        host = socket.getfqdn()
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def lead_when_elected(
    args, api_security: ServerSecurity, rest_security: ServerSecurity,
    warm_up: Callable[[], None] | None = None,
):  # fmt: skip
    """Serve as a standby (StandbyServers) until this controller wins the election on the
    etcd cluster of `args.etcd`, then close the standby's listeners and serve the liveness
    port (bound on the API host at --liveness-port from the start; takeover.py). `warm_up`
    runs once the standby listens, before it campaigns (building the scheduler there, not
    after a failover, keeps it off the takeover's time).

    Prints `terra-controller standby api=HOST:PORT rest=HOST:PORT` once listening.

    Returns:
        (EtcdState, Leadership) of the elected leader.

    Raises:
        SystemExit: a bad --etcd list, --lease-ttl, or a port that cannot be bound.
    """
    import os
    import socket

    from terra_controller.etcd_state import EtcdState, parse_endpoints
    from terra_controller.leadership import Leadership
    from terra_controller.takeover import LivenessServer

    try:
        liveness = LivenessServer(args.api[0], args.liveness_port)
        state = EtcdState(parse_endpoints(args.etcd), args.cluster)
        member = {"id": f"{socket.gethostname()}:{os.getpid()}",
                  "api": advertised(*args.api, args.advertise),
                  "agents": advertised(*args.agents, args.advertise),
                  "rest": advertised(*args.rest, args.advertise),
                  "liveness": advertised(*liveness.bound, args.advertise)}  # fmt: skip
        leadership = Leadership(state, member, ttl_s=args.lease_ttl)
    except ValueError as exc:
        raise SystemExit(f"terra-controller: {exc}") from exc
    except OSError as exc:
        raise SystemExit(f"terra-controller: cannot listen on the liveness port: {exc}") from exc

    def leader() -> str | None:
        return (leadership.leader or {}).get("api")

    try:
        servers = StandbyServers(args.api, args.rest, api_security, rest_security, leader).start()
    except OSError as exc:
        raise SystemExit(f"terra-controller: cannot listen as a standby: {exc}") from exc
    api, rest = servers.bound["api"], servers.bound["rest"]
    print(f"terra-controller standby api={api[0]}:{api[1]} rest={rest[0]}:{rest[1]}", flush=True)
    if warm_up is not None:
        warm_up()
    leadership.campaign()
    liveness.serve(state.lease.id)
    leadership.keep(lambda reason: start_over(leadership, reason))
    servers.close()
    return state, leadership


def start_over(leadership, reason: str) -> None:
    """The leadership is lost: run `leadership.before_start_over` (closing the agents'
    channels), then start again as a standby: the same command line in this process (agents
    keep moving data at their last rates meanwhile)."""
    import logging
    import os
    import sys

    log = logging.getLogger("terra.cli")
    log.error("starting over as a standby: %s", reason)
    for hook in leadership.before_start_over:
        try:
            hook()
        except Exception:
            log.exception("closing before starting over failed")
    logging.shutdown()
    os.execv(sys.executable, sys.orig_argv)
