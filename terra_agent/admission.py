"""Admission of the agent's incoming connections: caps, and accept loops that outlive EMFILE.

The agent's listeners (its data port and tunnel ports, and its --metrics port) serve every
connection in a trio task. What bounds them, before a handler sees a byte (docs/security.md):

1. caps: at most `max_connections` at once per listener group and `max_per_address` from
   one IP address; a connection beyond either is closed at once (counted in `refused`);
2. the handler's own first-byte / whole-request deadline (data connections: the
   authentication and "hello" within DATA_HANDSHAKE_S; metrics: the whole request);
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
import time
from collections import Counter
from dataclasses import dataclass

import trio

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


class RateLimitedLog:
    """Log at most once per `interval_s` seconds (monotonic), counting what was left out:
    RateLimitedLog(logger, interval_s).log(level, message)."""

    def __init__(self, logger: logging.Logger, interval_s: float) -> None:
        self.logger = logger
        self.interval_s = interval_s
        self._next = 0.0
        self._skipped = 0

    def log(self, level: int, message: str) -> None:
        """Log `message` at `level` unless one was logged less than interval_s ago."""
        now = time.monotonic()
        if now < self._next:
            self._skipped += 1
            return
        if self._skipped:
            message = f"{message} (and {self._skipped} more since the last one)"
        self.logger.log(level, message)
        self._next = now + self.interval_s
        self._skipped = 0


class Admission:
    """Live connections of one listener group, per address and in total (one trio thread).

    Admission(caps: Caps, name: str for messages). Attributes: total, per_address (Counter),
    refused (connections closed at once because a cap was reached), accept_failures (accepts
    that failed for want of descriptors).
    """

    def __init__(self, caps: Caps, name: str) -> None:
        self.caps = caps
        self.name = name
        self.total = 0
        self.per_address: Counter = Counter()
        self.refused = 0
        self.accept_failures = 0
        self._log = RateLimitedLog(log, LOG_INTERVAL_S)

    def enter(self, host: str) -> bool:
        """Admit one connection from `host`; False (counted, logged) when a cap is reached."""
        if self.total >= self.caps.max_connections or (
            self.per_address[host] >= self.caps.max_per_address
        ):
            self.refused += 1
            self._log.log(
                logging.WARNING,
                f"{self.name}: connection from {host} refused: {self.per_address[host]} from "
                f"it, {self.total} in all (caps {self.caps.max_per_address} per address, "
                f"{self.caps.max_connections} in all)",
            )
            return False
        self.total += 1
        self.per_address[host] += 1
        return True

    def leave(self, host: str) -> None:
        """Forget one admitted connection from `host`."""
        self.total -= 1
        self.per_address[host] -= 1
        if self.per_address[host] <= 0:
            del self.per_address[host]

    def accept_failed(self, exc: OSError) -> None:
        """Count and (rate-limited) log an accept that failed for want of resources."""
        self.accept_failures += 1
        self._log.log(
            logging.ERROR,
            f"{self.name}: accept failed: {exc.strerror or exc}; retrying every "
            f"{ACCEPT_BACKOFF_S:g} s ({self.total} connections open)",
        )


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
    handler(stream) in `handler_nursery` (the handler closes it); a connection over the caps
    is closed at once. Accept failures for want of resources back off and retry (module
    docstring); any other OSError of a listener ends this task with it.

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
            if not admission.enter(host):
                stream.socket.close()
                continue
            handler_nursery.start_soon(_run_admitted, handler, stream, host, admission)


async def _run_admitted(handler, stream, host: str, admission: Admission) -> None:
    try:
        await handler(stream)
    finally:
        admission.leave(host)
