"""Admission of the agent's incoming connections: caps, and accept loops that outlive EMFILE.

The agent's listeners (its data port and tunnel ports, and its --metrics port) serve every
connection in a trio task. What bounds them, before a handler sees a byte (docs/security.md):

1. caps: at most `max_connections` at once per listener group and `max_per_address` from
   one IP address; a connection beyond either is closed at once (counted in `refused`),
   except that at the total cap a pending connection (one whose handler has not called
   `Admission.authenticated` yet) of the busiest address is evicted for a newcomer from a
   less busy address (counted in `evicted`; overlay/pending_connections.py);
2. the handler's own first-byte / whole-request deadline (data connections: the
   authentication and "hello" within DATA_HANDSHAKE_S; metrics: the whole request); the
   handler calls `Admission.authenticated(stream)` once past it (data: hello read;
   metrics: request read), after which the connection is never evicted;
3. an accept that fails for want of descriptors or memory (EMFILE, ENFILE, ENOBUFS,
   ENOMEM) backs off ACCEPT_BACKOFF_S and tries again, logging once per LOG_INTERVAL_S:
   the listener never stops.

The caps come from the process's open-file limit (RLIMIT_NOFILE) at start-up
(caps_from_file_limit), leaving room for the agent's own tunnel connections, sink, source
and spill files. This mirrors terra_controller/transport.py's Admission for the trio side
(that one is thread-based and pulls in the controller's TLS stack).
"""

from __future__ import annotations

import errno
import logging
import resource
from dataclasses import dataclass

import trio

from overlay.pending_connections import AdmittedConnection, ConnectionCounts
from overlay.rate_limited_log import RateLimitedLog

log = logging.getLogger(__name__)

ACCEPT_BACKOFF_S = 0.1  # an accept that failed for want of descriptors is retried after this
LOG_INTERVAL_S = 10.0  # such failures (and refusals) are logged at most this often
CAPACITY_ERRNOS = {errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM}
DATA_SHARE = 2  # data connections may hold 1 / DATA_SHARE of the descriptors
DATA_PER_ADDRESS_SHARE = 4  # one address may hold 1 / this of the data connections
METRICS_CONNECTIONS = 32  # metrics connections at once (scrapers are few)
METRICS_PER_ADDRESS = 8


@dataclass(frozen=True)
class Caps:
    """Connection caps of one listener group.

    Attributes:
        max_connections: connections served at once (>= 1).
        max_per_address: connections at once from one IP address (>= 1).
    """

    max_connections: int
    max_per_address: int

    def __post_init__(self) -> None:
        if self.max_connections < 1 or self.max_per_address < 1:
            raise ValueError(f"connection caps must be >= 1, got {self}")


def file_limit() -> int:
    """The soft open-file limit of this process (RLIMIT_NOFILE; 1024 when unlimited/unknown)."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return soft if 0 < soft < resource.RLIM_INFINITY else 1024


def caps_from_file_limit(nofile: int | None = None) -> tuple[Caps, Caps]:
    """(data caps, metrics caps) for an open-file limit of `nofile` (default: file_limit()).

    Data connections (all data and tunnel ports together) may hold half the descriptors, one
    address a quarter of those (at 1,024: 512 in all, 128 per address); the metrics port
    METRICS_CONNECTIONS / METRICS_PER_ADDRESS (fewer under tiny limits). The other half stays
    for the agent's own tunnel connections, control channel, sinks, sources and spill files.
    """
    nofile = file_limit() if nofile is None else nofile
    total = max(2, nofile // DATA_SHARE)
    data = Caps(total, max(1, total // DATA_PER_ADDRESS_SHARE))
    metrics_total = max(1, min(METRICS_CONNECTIONS, nofile // 32))
    metrics = Caps(metrics_total, max(1, min(METRICS_PER_ADDRESS, metrics_total)))
    return data, metrics


class Ticket(AdmittedConnection):
    """One admitted connection: host, pending, admitted (AdmittedConnection), stream, and
    scope (the trio.CancelScope its handler runs in: cancelled when evicted)."""

    __slots__ = ("stream", "scope")

    def __init__(self, host: str, stream) -> None:
        super().__init__(host)
        self.stream, self.scope = stream, trio.CancelScope()


class Admission(ConnectionCounts):
    """Live connections of one listener group, per address and in total (one trio thread).

    Admission(caps: Caps, name: str for messages). Attributes: those of ConnectionCounts
    (total, per_address, pending, refused, evicted: overlay/pending_connections.py),
    accept_failures (accepts that failed for want of descriptors).
    """

    def __init__(self, caps: Caps, name: str) -> None:
        super().__init__(caps.max_connections, caps.max_per_address)
        self.caps = caps
        self.name = name
        self.accept_failures = 0
        self._tickets: dict = {}  # stream -> Ticket
        self._refused_log = RateLimitedLog(
            log, f"{name}: connections refused at the cap", interval_s=LOG_INTERVAL_S
        )
        self._evict_log = RateLimitedLog(
            log, f"{name}: pending connections evicted at the cap", interval_s=LOG_INTERVAL_S
        )
        self._exhausted_log = RateLimitedLog(
            log, f"{name}: cannot accept (out of descriptors or memory); retrying every "
            f"{ACCEPT_BACKOFF_S:g} s", logging.ERROR, LOG_INTERVAL_S,
        )  # fmt: skip

    def enter(self, host: str, stream: trio.SocketStream) -> Ticket | None:
        """Admit one connection from `host` (pending until `authenticated`); None (counted,
        logged) when a cap is reached and no pending connection may be evicted for it."""
        ticket = Ticket(host, stream)
        admitted, victim = self.admit(ticket)
        if victim is not None:
            self._evicted(victim, host)
        if not admitted:
            return self._refuse(host)
        self._tickets[stream] = ticket
        return ticket

    def authenticated(self, stream) -> None:
        """The connection on `stream` is past its authentication (or first request): it is
        never evicted from now on. Nothing for a stream this Admission does not count."""
        ticket = self._tickets.get(stream)
        if ticket is not None:
            self.settle(ticket)

    def leave(self, ticket: Ticket) -> None:
        """Forget an admitted connection (closed); nothing if it was evicted already."""
        self.forget(ticket)
        if self._tickets.get(ticket.stream) is ticket:
            del self._tickets[ticket.stream]

    def _refuse(self, host: str) -> None:
        self._refused_log.event(
            f"{host}: {self.per_address[host]} from it, {self.total} in all (caps "
            f"{self.caps.max_per_address} per address, {self.caps.max_connections} in all)"
        )

    def _evicted(self, victim: Ticket, host: str) -> None:
        """`victim` (pending, already uncounted by admit) was dropped for a newcomer from
        `host`: its handler is cancelled (the stream is closed as it ends)."""
        if self._tickets.get(victim.stream) is victim:
            del self._tickets[victim.stream]
        victim.scope.cancel()
        self._evict_log.event(f"one from {victim.host} for {host}")

    def accept_failed(self, exc: OSError) -> None:
        """Count and (rate-limited) log an accept that failed for want of resources."""
        self.accept_failures += 1
        self._exhausted_log.event(f"{exc.strerror or exc}; {self.total} connections open")


def peer_host(stream: trio.SocketStream) -> str:
    """The IP address of `stream`'s peer ("?" when it cannot be read: already reset)."""
    try:
        return str(stream.socket.getpeername()[0])
    except (OSError, IndexError, TypeError):
        return "?"


async def serve_admitted(
    handler,
    listeners: list[trio.SocketListener],
    admission: Admission,
    handler_nursery: trio.Nursery,
    task_status=trio.TASK_STATUS_IGNORED,
) -> None:
    """Accept on every listener until cancelled; each admitted connection runs
    handler(stream) in `handler_nursery` (the handler closes it; it calls
    admission.authenticated(stream) once its peer is authenticated, and is cancelled if
    evicted before); a connection over the caps is closed at once. Accept failures for want
    of resources back off and retry (module docstring); any other OSError of a listener
    ends this task with it.

    Calls task_status.started(listeners) once accepting.
    """
    async with trio.open_nursery() as nursery:
        for listener in listeners:
            nursery.start_soon(_accept_loop, handler, listener, admission, handler_nursery)
        task_status.started(listeners)


async def _accept_loop(handler, listener, admission: Admission, handler_nursery) -> None:
    async with listener:
        while True:
            try:
                stream = await listener.accept()
            except OSError as exc:
                if exc.errno not in CAPACITY_ERRNOS:
                    raise
                admission.accept_failed(exc)
                await trio.sleep(ACCEPT_BACKOFF_S)
                continue
            host = peer_host(stream)
            ticket = admission.enter(host, stream)
            if ticket is None:
                stream.socket.close()
                continue
            handler_nursery.start_soon(_run_admitted, handler, ticket, admission)


async def _run_admitted(handler, ticket: Ticket, admission: Admission) -> None:
    try:
        with ticket.scope:  # cancelled when evicted
            await handler(ticket.stream)
    finally:
        admission.leave(ticket)
        ticket.stream.socket.close()  # the handler's own close, or an evicted one's
