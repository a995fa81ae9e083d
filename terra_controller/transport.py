"""Accepting connections for the controller's servers: TLS, identities, deadlines, caps.

Used by the coflow API (api_server.py), the agent channel (agent_channel.py) and
REST (rest.py), whose authenticated connections are tasks of the controller's loop
(`owner`), or native threads of their own without one (a standby's servers; os-ken's
hub is native threads here). What every connection goes through, before a server sees
a byte of it (docs/security.md):

1. admission: at most `max_connections` at once per server and
   `max_per_address` from one IP address; beyond that it is closed at once, except
   that when the total cap is reached a pending connection (handshake not done) of the
   busiest address is evicted for a newcomer from a less busy one (`Admission`,
   pending.py); connection_caps.py derives both caps from the open-file limit;
2. the TLS handshake (mutual: the client's certificate is verified against the
   CA) within `handshake_s` seconds, measured for the whole handshake (a peer
   sending one byte a second is cut off too), run non-blocking by the server's accept
   thread (an idle connection holds a descriptor, not a thread); the peer's Identity is
   its certificate's name and role;
3. the server's handler(sock, addr, identity): a task of the owner loop on the
   non-blocking socket, or in a thread of its own.

Accepting, admission and handshakes are one thread per server (`accept_loop`), which owns
the server's Admission and pending handshakes: no lock. A served connection that closes is
handed back to it as a message (`Admission.leave`).

Without an SSL context (`--insecure`) step 2 is skipped and every peer gets
`pki.INSECURE`. Out of descriptors (EMFILE) the accept loop backs off and keeps
listening; refusals are logged at most once per interval (`RateLimitedLog`).

`read_message` (the clients' and tests' blocking reader) bounds a whole frame rather
than one recv: each recv may wait only for what is left of the frame's deadline.
"""

from __future__ import annotations

import errno
import heapq
import itertools
import logging
import queue
import selectors
import socket
import ssl
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass

from overlay.pending_connections import AdmittedConnection, ConnectionCounts
from overlay.rate_limited_log import RateLimitedLog
from terra_security.pki import INSECURE, Identity, PkiError, peer_identity
from terra_wire.api import MAX_MESSAGE_BYTES, WireError
from terra_wire.frames import FrameError, unpack_map

LOG = logging.getLogger("terra.transport")

MAX_CONNECTIONS = 4096
MAX_PER_ADDRESS = 256
HANDSHAKE_S = 5.0


def shutdown(sock, how: int = socket.SHUT_RDWR) -> None:
    """Shut the descriptor down (`how`: socket.SHUT_RDWR, SHUT_WR), bypassing
    SSLSocket.shutdown, which is not thread-safe and drops the TLS state (later reads would
    see raw TLS records); a socket already gone is ignored."""
    sock = getattr(sock, "raw", sock)  # (a socket wrapper, as benchmarks.shared_socket)
    try:
        socket.socket.shutdown(sock, how)
    except OSError:
        pass


@dataclass
class ServerSecurity:
    """How a server admits connections.

    Attributes:
        context: server ssl.SSLContext (mutual TLS), or None for plain TCP (--insecure).
        handshake_s: seconds for the whole TLS handshake.
        max_connections: connections served at once.
        max_per_address: connections at once from one IP address.
    """

    context: ssl.SSLContext | None
    handshake_s: float = HANDSHAKE_S
    max_connections: int = MAX_CONNECTIONS
    max_per_address: int = MAX_PER_ADDRESS


class Evicted(ConnectionAbortedError):
    """A pending connection dropped at the total cap to admit a newcomer (pending.py)."""


class Ticket(AdmittedConnection):
    """One admitted connection (Admission.enter): host, pending (TLS handshake running, or
    served without a certificate: may be evicted for a newcomer), admitted (still counted),
    and sock: the socket its handler serves (None until the handshake is done)."""

    __slots__ = ("sock",)

    def __init__(self, host: str, pending: bool) -> None:
        super().__init__(host, pending)
        self.sock = None


class Admission(ConnectionCounts):
    """Counts live connections per server and per address; keeps the pending ones (see
    `Ticket`) evictable: at the total cap a newcomer takes the place of the oldest pending
    connection of the address holding the most pending ones, if its own address holds
    none or (with it) fewer (overlay/pending_connections.py); authenticated connections
    are never evicted.

    Owned by its server's accept thread (`accept_loop`), which alone calls `enter` and
    `serving`: no lock. A connection served elsewhere (a task of the controller's loop, a
    handler's thread) that closes is handed back with `leave`, a message the accept thread
    takes before its next decision. Other threads may read the counts (metrics).

    Attributes:
        those of ConnectionCounts (total, per_address, pending, refused, evicted);
        evict: evict(victim Ticket, newcomer's host), called for each eviction, closes the
            victim (default: shuts `victim.sock` down; accept_loop also stops its
            handshake).
        wake: called after each `leave` (accept_loop's: wakes its thread).
    """

    def __init__(self, security: ServerSecurity) -> None:
        super().__init__(security.max_connections, security.max_per_address)
        self.security = security
        self.evict = _shut_down_victim
        self.wake: Callable[[], None] = _nothing
        self._closed: queue.SimpleQueue[Ticket] = queue.SimpleQueue()

    def enter(self, host: str, pending: bool = True) -> Ticket | None:
        """Admit one connection from `host`, pending (evictable) until `serving` says
        otherwise; None when a cap is reached and nothing may be evicted (counted)."""
        self.take_closed()
        ticket = Ticket(host, pending)
        admitted, victim = self.admit(ticket)
        if victim is not None:
            self.evict(victim, host)
        return ticket if admitted else None

    def serving(self, ticket: Ticket, sock, pending: bool = False) -> bool:
        """The connection's handshake is done and `sock` goes to its handler; it stays
        evictable only if `pending` (no certificate). False: it was evicted meanwhile (the
        caller closes `sock`)."""
        if not ticket.admitted:
            return False
        ticket.sock = sock
        if not pending:
            self.settle(ticket)
        return True

    def leave(self, ticket: Ticket) -> None:
        """Forget an admitted connection that closed (nothing if it was evicted already):
        from any thread, taken by the owner's next `enter` or `take_closed`."""
        self._closed.put(ticket)
        self.wake()

    def take_closed(self) -> None:
        """(The owner's thread) forget the connections handed back by `leave`."""
        while True:
            try:
                ticket = self._closed.get_nowait()
            except queue.Empty:
                return
            self.forget(ticket)


def _nothing() -> None:
    pass


def _shut_down_victim(victim: Ticket, host: str) -> None:
    """Admission's default eviction: shut the victim's socket down (if it has one yet)."""
    if victim.sock is not None:
        shutdown(victim.sock)


def _identity(tls: ssl.SSLSocket, optional: bool) -> Identity | None:
    """The Identity of a handshaken peer (None: no certificate and `optional`)."""
    peercert = tls.getpeercert()
    if optional and not peercert:
        return None
    return peer_identity(peercert)


ACCEPT_ERRORS = {errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM}  # back off, retry
TRANSIENT_ERRORS = {errno.ECONNABORTED, errno.EPROTO, errno.EINTR, errno.EPERM}
BACKOFF_S = (0.01, 0.5)  # first and longest pause after an accept out of descriptors/memory
CLOSED_CHECK_S = 1.0  # how often the accept thread checks that its listener is still open
ACCEPT_BATCH = 64  # connections accepted per wake-up before the handshakes get their turn


def accept_loop(listener: socket.socket, handle, spawn, security: ServerSecurity,
                optional: bool = False, name: str = "server",
                admission: Admission | None = None, owner=None) -> None:  # fmt: skip
    """Accept connections until `listener` is closed, in this thread: admission caps, then
    the TLS handshake, then handle(sock, addr, identity) for authenticated peers.

    One thread does all of it for the listener (`_AcceptThread`): it accepts, counts the
    connection in `admission` (which it owns), and runs every pending TLS handshake
    non-blocking, each within `handshake_s` for the whole handshake: an idle or trickling
    peer holds a descriptor, never a thread. At the total cap a connection still in its
    handshake (or, with `optional`, served without a certificate) is evicted for a
    newcomer from a less busy address; authenticated connections are never evicted.
    Refused, evicted, failed and timed-out connections close only themselves (logged at
    most once per interval with their count, `RateLimitedLog`); the handler's socket is
    closed when it returns. Out of descriptors or memory (EMFILE, ENFILE, ENOBUFS, ENOMEM)
    it stops accepting for 10 ms doubling to 0.5 s, logs once per interval and goes on;
    it returns once the listener is closed (`stop_listener`).

    Args:
        handle: handle(sock, addr, identity), run in a thread of its own (spawn), or with
            `owner` an async function run as a task on that loop with the socket
            non-blocking (no thread per connection).
        optional: peers without a certificate are served too (identity None).
        name: the server's name in log lines (e.g. "coflow API").
        admission: the Admission to count in (default: a new one over `security`; its
            `evict` and `wake` are replaced).
        owner: None, or the controller's OwnerLoop (see `handle`).
    """
    _AcceptThread(listener, handle, spawn, admission or Admission(security), security,
                  optional, name, owner).run()  # fmt: skip


class _AcceptThread:
    """`accept_loop`'s state: the listener, the pending handshakes and the Admission, all
    used by the thread that runs `run` only. Other threads reach it through the Admission's
    `leave` (a closed connection) and the wake-up socket pair."""

    def __init__(self, listener, handle, spawn, admission: Admission,
                 security: ServerSecurity, optional: bool, name: str, owner) -> None:  # fmt: skip
        self.listener, self.handle, self.spawn, self.name = listener, handle, spawn, name
        self.admission, self.security, self.optional = admission, security, optional
        self.owner = owner  # an OwnerLoop: `handle` is async and runs as a task on it
        self.selector = selectors.DefaultSelector()  # epoll on Linux: no 1024-fd limit
        self.wake_r, self.wake_w = socket.socketpair()
        self.pending: dict[int, tuple] = {}  # fd -> (tls, addr, deadline, ticket)
        self.fd_of: dict[Ticket, int] = {}  # a pending handshake's ticket -> its fd
        self.deadlines: list[tuple[float, int, int]] = []  # (deadline, seq, fd) heap
        self.seq = itertools.count()
        self.paused_until: float | None = None  # accepting paused (out of descriptors)
        self.backoff = BACKOFF_S[0]
        self.refused = RateLimitedLog(LOG, f"{name}: connections refused at the cap")
        self.evictions = RateLimitedLog(LOG, f"{name}: pending connections evicted at the cap")
        self.unauthenticated = RateLimitedLog(LOG, f"{name}: connections not authenticated",
                                              logging.INFO)  # fmt: skip
        self.exhausted = RateLimitedLog(LOG, f"{name}: cannot accept (out of descriptors or "
                                        "memory); retrying")  # fmt: skip
        admission.evict, admission.wake = self.evict, self._wake

    def run(self) -> None:
        """Serve the listener until it is closed; then fail the pending handshakes."""
        _ACCEPT_WAKES[self.listener] = self._wake
        try:
            for s in (self.listener, self.wake_r, self.wake_w):
                s.setblocking(False)
            self.selector.register(self.listener, selectors.EVENT_READ)
            self.selector.register(self.wake_r, selectors.EVENT_READ)
            while self.listener.fileno() >= 0 and self._once():
                pass
        except OSError:  # (the listener was closed before this thread began)
            pass
        finally:
            _ACCEPT_WAKES.pop(self.listener, None)
            for fd in list(self.pending):
                self._finish(fd, ConnectionAbortedError("server stopped"))
            self.selector.close()
            self.wake_r.close()
            self.wake_w.close()

    def _once(self) -> bool:
        """One wait and what it found; False once the listener is shut down."""
        try:
            for key, _ in self.selector.select(self._timeout()):
                if key.fileobj is self.listener:
                    if not self._accept_ready():
                        return False
                elif key.fileobj is self.wake_r:
                    self._drain_wake()
                else:
                    self._step(key.fd)
            self.admission.take_closed()
            self._expire()
            self._resume()
        except Exception:  # a bug here must not stop every later connection
            LOG.exception("%s: accept thread", self.name)
            time.sleep(0.01)
        return True

    def _timeout(self) -> float:
        now, wait = time.monotonic(), CLOSED_CHECK_S
        if self.deadlines:
            wait = min(wait, self.deadlines[0][0] - now)
        if self.paused_until is not None:
            wait = min(wait, self.paused_until - now)
        return max(0.0, wait)

    def _wake(self) -> None:
        try:
            self.wake_w.send(b"x")
        except OSError:
            pass  # a wake-up is already queued, or the thread is gone

    def _drain_wake(self) -> None:
        try:
            while self.wake_r.recv(4096):
                pass
        except OSError:
            pass

    def _accept_ready(self) -> bool:
        """Accept the connections waiting, at most ACCEPT_BATCH (a flood must not hold
        back the handshakes in progress); False once the listener is shut down."""
        for _ in range(ACCEPT_BATCH):
            try:
                sock, addr = self.listener.accept()
            except BlockingIOError:
                return True
            except OSError as exc:
                if self.listener.fileno() < 0 or exc.errno in (
                    errno.EBADF, errno.EINVAL, errno.ENOTSOCK
                ):  # fmt: skip
                    return False  # shut down (stop_listener)
                if exc.errno in TRANSIENT_ERRORS:
                    continue
                self._pause(exc)
                return True
            self.backoff = BACKOFF_S[0]
            sock.setblocking(True)
            self._take(sock, addr)
        return True

    def _pause(self, exc: OSError) -> None:
        """Out of descriptors or memory: stop watching the listener for the backoff."""
        self.exhausted.event(exc)
        self.selector.unregister(self.listener)
        self.paused_until = time.monotonic() + self.backoff
        self.backoff = min(self.backoff * 2, BACKOFF_S[1])

    def _resume(self) -> None:
        """Watch the listener again once the pause is over (or pause again if it cannot)."""
        if self.paused_until is None or time.monotonic() < self.paused_until:
            return
        if self.listener.fileno() < 0:
            return
        try:
            self.selector.register(self.listener, selectors.EVENT_READ)
        except OSError as exc:  # (out of memory again: another pause)
            self.exhausted.event(exc)
            self.paused_until = time.monotonic() + self.backoff
            self.backoff = min(self.backoff * 2, BACKOFF_S[1])
            return
        self.paused_until = None

    def _take(self, sock: socket.socket, addr) -> None:
        """Admit an accepted connection (or refuse and close it at a cap), then start its
        handshake, or serve it at once when insecure."""
        context = self.security.context
        ticket = self.admission.enter(addr[0], pending=context is not None)
        if ticket is None:
            self.refused.event(addr)
            sock.close()
            return
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except OSError:
            pass
        if context is None:
            self._serve(ticket, sock, addr, INSECURE)
            return
        try:
            tls = context.wrap_socket(sock, server_side=True, do_handshake_on_connect=False)
            tls.setblocking(False)
            fd = tls.fileno()
            self.selector.register(fd, selectors.EVENT_READ)
        except (OSError, ValueError) as exc:
            sock.close()
            self._failed(ticket, addr, exc)
            return
        at = time.monotonic() + self.security.handshake_s
        self.pending[fd] = (tls, addr, at, ticket)
        self.fd_of[ticket] = fd
        heapq.heappush(self.deadlines, (at, next(self.seq), fd))
        self._step(fd)

    def _step(self, fd: int) -> None:
        if fd not in self.pending:  # an event of a socket finished in this round
            return
        tls = self.pending[fd][0]
        try:
            tls.do_handshake()
        except ssl.SSLWantReadError:
            self.selector.modify(fd, selectors.EVENT_READ)
        except ssl.SSLWantWriteError:
            self.selector.modify(fd, selectors.EVENT_WRITE)
        except (OSError, ValueError) as exc:  # ssl.SSLError is an OSError
            self._finish(fd, exc)
        else:
            self._finish(fd, None)

    def _expire(self) -> None:
        now = time.monotonic()
        while self.deadlines and self.deadlines[0][0] <= now:
            at, _, fd = heapq.heappop(self.deadlines)
            entry = self.pending.get(fd)
            if entry is not None and entry[2] == at:
                limit = self.security.handshake_s
                self._finish(fd, TimeoutError(f"no TLS handshake within {limit} s"))

    def _finish(self, fd: int, error: BaseException | None) -> None:
        """A handshake ended: serve the peer, or close the socket and uncount it."""
        tls, addr, _, ticket = self.pending.pop(fd)
        self.fd_of.pop(ticket, None)
        self.selector.unregister(fd)
        if error is None:
            try:
                tls.setblocking(True)
                identity = _identity(tls, self.optional)
            except (OSError, ValueError, PkiError) as exc:
                error = exc
            else:
                self._serve(ticket, tls, addr, identity)
                return
        tls.close()
        self._failed(ticket, addr, error)

    def _serve(self, ticket: Ticket, sock, addr, identity) -> None:
        """Start the handler's task (or thread); close `sock` if it was evicted or none can
        start."""
        if not self.admission.serving(ticket, sock, pending=identity is None):
            sock.close()
            return
        try:
            if self.owner is not None:
                self.owner.start_task(self.run_on_loop, sock, addr, identity, ticket)
            else:
                self.spawn(self.run_thread, sock, addr, identity, ticket)
        except Exception as exc:  # cannot start a thread or task: refuse, keep accepting
            self.refused.event(f"{addr}: cannot serve: {exc}")
            self.admission.forget(ticket)
            sock.close()

    def run_thread(self, sock: socket.socket, addr, identity, ticket: Ticket) -> None:
        """The handler's thread: handle the connection, then close it and hand it back."""
        try:
            self.handle(sock, addr, identity)
        finally:
            self._release(sock, ticket)

    async def run_on_loop(self, sock: socket.socket, addr, identity, ticket: Ticket) -> None:
        """The handler's task on the owner loop (non-blocking socket), then as `run_thread`."""
        import trio  # (the clients import this module: only the controller's loop needs trio)

        try:
            sock.setblocking(False)
            await self.handle(sock, addr, identity)
        except trio.ClosedResourceError:
            pass  # closed by another thread (notify_closing)
        except Exception:  # one connection's failure must not end the loop's other tasks
            LOG.exception("%s: connection %s failed", self.name, addr)
        finally:
            self._release(sock, ticket)

    def _release(self, sock: socket.socket, ticket: Ticket) -> None:
        """Close a served connection and hand it back to the accept thread."""
        try:
            sock.close()
        except OSError:
            pass
        self.admission.leave(ticket)

    def _failed(self, ticket: Ticket, addr, exc: BaseException) -> None:
        """The handshake failed or was evicted (the socket is closed already)."""
        if not isinstance(exc, Evicted):
            self.unauthenticated.event(f"{addr}: {exc}")
        self.admission.forget(ticket)

    def evict(self, victim: Ticket, host: str) -> None:
        """Admission's eviction: drop `victim` (pending) for a newcomer from `host`."""
        self.evictions.event(f"{victim.host} for {host}")
        if victim.sock is not None:  # served without a certificate
            shutdown(victim.sock)
            return
        fd = self.fd_of.get(victim)
        if fd is not None:
            self._finish(fd, Evicted("evicted for a newcomer at the connection cap"))


def stop_listener(listener: socket.socket) -> None:
    """Stop an accept loop: shut the listening socket down, close it (its port is free when
    this returns) and wake its accept thread, which then ends (pending handshakes fail)."""
    try:
        listener.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    wake = _ACCEPT_WAKES.pop(listener, None)
    listener.close()
    if wake is not None:
        wake()


# The running accept threads' wake-ups by listener: `stop_listener` pops one (dict operations
# are single steps, so no lock).
_ACCEPT_WAKES: dict[socket.socket, Callable[[], None]] = {}


def listen_and_serve(host: str, port: int, handle, security: ServerSecurity, spawn=None,
                     optional: bool = False, name: str = "server",
                     admission: Admission | None = None,
                     listeners: dict | None = None, owner=None):  # fmt: skip
    """Listen on host:port and accept connections in a hub thread (`accept_loop`).

    Args:
        handle: called as handle(sock, addr, identity) in the connection's own thread.
        security: ServerSecurity (TLS context or None, caps, handshake deadline).
        spawn: spawn(func, *args) -> thread; default os_ken.lib.hub.spawn (tests pass a
            daemon-thread starter).
        optional: serve TLS peers without a certificate too (identity None).
        name: the server's name in log lines.
        admission: the Admission counting its connections (default: a new one; tests
            pass one to read its counts).
        listeners: {server name: Admission} to record it in (the controller's metrics
            read them at scrape time), or None.
        owner: see `accept_loop`.

    Returns:
        (listening socket (`stop_listener` stops it), accept thread, bound (host, port)).

    Raises:
        OSError: the address cannot be bound.
    """
    from os_ken.lib import hub

    spawn = spawn or hub.spawn
    admission = admission or Admission(security)
    if listeners is not None:
        listeners[name] = admission
    listener = hub.listen((host, port), backlog=1024)
    try:
        thread = spawn(accept_loop, listener, handle, spawn, security, optional, name, admission,
                       owner)  # fmt: skip
    except BaseException:
        listener.close()
        raise
    return listener, thread, listener.getsockname()[:2]


REST_CAP = (64, 8)  # REST: connections at once, and from one address


def connect_tls(host: str, port: int, context: ssl.SSLContext | None, timeout: float):
    """Client side: a TCP connection to the controller, with TLS when `context` is given.

    The controller is verified by its certificate's `terra-controller` name (pki.py).

    Returns:
        a connected (SSL)socket with TCP_NODELAY and `timeout` set.

    Raises:
        OSError / ssl.SSLError: cannot connect, or the controller is not verified.
    """
    from terra_security.pki import CONTROLLER_HOSTNAME

    sock = socket.create_connection((host, port), timeout=timeout)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    if context is None:
        return sock
    try:
        return context.wrap_socket(sock, server_hostname=CONTROLLER_HOSTNAME)
    except BaseException:
        sock.close()
        raise


FRAME_TIMEOUT_S = 30.0  # for the whole of one message, once its first byte arrived
_LEN = struct.Struct(">I")


# ---- blocking message readers (the API server, the agent channel and the client) -------


def recv_exact(sock: socket.socket, n: int, deadline: float | None = None) -> bytes:
    """Read exactly n bytes from a blocking socket; with `deadline` (time.monotonic()), all
    of them by then (each recv waits at most for what is left, and the socket's own
    timeout is put back afterwards).

    Raises:
        EOFError: the peer closed before n bytes arrived (ConnectionError on resets).
        TimeoutError: `deadline` passed first.
    """
    buf = bytearray()
    own = sock.gettimeout()
    try:
        while len(buf) < n:
            if deadline is not None:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"{len(buf)} of {n} bytes by the deadline")
                sock.settimeout(left if own is None else min(left, own))
            part = sock.recv(min(n - len(buf), 1 << 20))
            if not part:
                raise EOFError(f"connection closed after {len(buf)} of {n} bytes")
            buf += part
    finally:
        if deadline is not None:
            sock.settimeout(own)
    return bytes(buf)


def read_message(
    sock: socket.socket,
    frame_timeout: float | None = FRAME_TIMEOUT_S,
    max_bytes: int = MAX_MESSAGE_BYTES,
    decode=None,
) -> dict | None:
    """Read one ``u32 length | msgpack map`` message; None on a clean EOF between messages.

    The first length byte waits as long as the socket's own timeout allows; once
    it arrived, the whole rest of the message must arrive within `frame_timeout`
    seconds in all (a peer trickling one byte a second is cut off: `recv_exact`'s
    deadline). A message cut short (EOF, deadline, error) shuts the socket down, so the
    caller's next exchange fails too instead of reading the rest as a new message. The
    overlay's control frames have the same outer format (agent_connection.read_control).
    `decode` turns the body into the map (default: `terra_wire.frames.unpack_map`; the API
    server passes `decode_request`).

    Raises:
        WireError: oversized length, bad msgpack, not a map, EOF inside a message, or
            the frame's deadline passed.
    """
    first = sock.recv(1)
    if not first:
        return None
    deadline = None if frame_timeout is None else time.monotonic() + frame_timeout
    try:
        (length,) = _LEN.unpack(first + recv_exact(sock, 3, deadline))
        if length > max_bytes:
            shutdown(sock)
            raise WireError(f"message length {length} exceeds {max_bytes}")
        body = recv_exact(sock, length, deadline)
    except EOFError as exc:
        shutdown(sock)
        raise WireError(f"truncated message: {exc}") from exc
    except OSError as exc:  # (the rest of the frame may still come: the stream is lost)
        shutdown(sock)
        raise WireError(f"message not received within {frame_timeout} s: {exc}") from exc
    if decode is not None:
        return decode(body)
    try:
        return unpack_map(body)
    except FrameError as exc:
        raise WireError(str(exc)) from exc
