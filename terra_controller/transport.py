"""Accepting connections for the controller's servers: TLS, identities, deadlines, caps.

Used by the coflow API (api_server.py) and the agent channel (agent_channel.py),
which run one native thread per connection (os-ken's hub is native threads
here). What every connection goes through, before a server sees a byte of it
(docs/security.md):

1. admission: at most `max_connections` at once per server and
   `max_per_address` from one IP address; beyond that it is closed at once;
2. the TLS handshake (mutual: the client's certificate is verified against the
   CA) within `handshake_s` seconds, measured for the whole handshake (a peer
   sending one byte a second is cut off too); the peer's Identity is its
   certificate's name and role;
3. the server's handler(sock, addr, identity).

Without an SSL context (`--insecure`) step 2 is skipped and every peer gets
`pki.INSECURE`.

`Deadlines` bounds a whole blocking exchange (a handshake, a frame) rather
than one recv: when the deadline passes it shuts the socket down, which makes
the blocked call fail at once.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import select
import socket
import ssl
import threading
import time
from collections import Counter
from contextlib import contextmanager
from dataclasses import dataclass

from terra_controller.pki import INSECURE, Identity, PkiError, peer_identity

LOG = logging.getLogger("terra.transport")

MAX_CONNECTIONS = 4096
MAX_PER_ADDRESS = 256
HANDSHAKE_S = 5.0


class Deadlines:
    """One thread that shuts sockets down when their deadline passes.

    ``with deadlines.guard(sock, seconds): ...`` : if the block has not left after
    `seconds`, `sock` is shut down (both directions) and the block's blocking call
    fails (OSError, or EOF); leaving the block in time cancels the deadline.
    """

    def __init__(self) -> None:
        self._heap: list[tuple[float, int]] = []
        self._socks: dict[int, socket.socket] = {}
        self._ids = itertools.count()
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None

    @contextmanager
    def guard(self, sock: socket.socket, seconds: float):
        """Shut `sock` down unless the block finishes within `seconds`."""
        key = next(self._ids)
        at = time.monotonic() + seconds
        with self._cond:
            self._socks[key] = sock
            earliest = self._heap[0][0] if self._heap else None
            heapq.heappush(self._heap, (at, key))
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="terra-deadlines", daemon=True
                )
                self._thread.start()
            if earliest is None or at < earliest:  # else the thread wakes early enough
                self._cond.notify()
        try:
            yield
        finally:
            with self._cond:
                self._socks.pop(key, None)

    def _run(self) -> None:
        while True:
            with self._cond:
                while self._heap and self._heap[0][1] not in self._socks:
                    heapq.heappop(self._heap)
                if not self._heap:
                    self._cond.wait()
                    continue
                at, key = self._heap[0]
                wait = at - time.monotonic()
                if wait > 0:
                    self._cond.wait(wait)
                    continue
                heapq.heappop(self._heap)
                sock = self._socks.pop(key)
            _shutdown(sock)


DEADLINES = Deadlines()


def _shutdown(sock) -> None:
    """Shut the descriptor down (bypassing SSLSocket.shutdown, which is not thread-safe)."""
    sock = getattr(sock, "raw", sock)  # a SharedSocket
    try:
        socket.socket.shutdown(sock, socket.SHUT_RDWR)
    except OSError:
        pass


class SharedSocket:
    """A (TLS) socket used by one reading thread and one writing thread at once.

    OpenSSL forbids concurrent use of one SSL object, so every SSL call is made
    under a lock, on a non-blocking socket; threads wait for readiness (poll)
    without holding it. Offers what the agent channel uses of a socket: recv,
    sendall, settimeout/gettimeout (seconds, None: forever), setsockopt,
    fileno, shutdown, close.

    Args:
        sock: a connected socket.socket or ssl.SSLSocket (handshake done).
    """

    def __init__(self, sock: socket.socket) -> None:
        self.raw = sock
        self.timeout: float | None = sock.gettimeout()
        self.lock = threading.Lock()
        sock.setblocking(False)

    def settimeout(self, seconds: float | None) -> None:
        """Timeout of each recv/sendall call (TimeoutError when it passes)."""
        self.timeout = seconds

    def gettimeout(self) -> float | None:
        """The current timeout in seconds (None: none)."""
        return self.timeout

    def recv(self, n: int) -> bytes:
        """Up to n bytes; b"" at EOF.

        Raises:
            TimeoutError: nothing within the timeout. OSError: the connection failed.
        """
        end = None if self.timeout is None else time.monotonic() + self.timeout
        while True:
            with self.lock:
                try:
                    return self.raw.recv(n)
                except (ssl.SSLWantReadError, BlockingIOError):
                    pass
                except ssl.SSLZeroReturnError:
                    return b""
            self._wait(end, read=True)

    def sendall(self, data) -> None:
        """Send all of `data`.

        Raises:
            TimeoutError: the peer did not read within the timeout. OSError: failed.
        """
        view = memoryview(data).cast("B")
        end = None if self.timeout is None else time.monotonic() + self.timeout
        while len(view):
            with self.lock:
                try:
                    view = view[self.raw.send(view) :]
                    continue
                except (ssl.SSLWantWriteError, BlockingIOError):
                    read = False
                except ssl.SSLWantReadError:
                    read = True
            self._wait(end, read=read)

    def _wait(self, end: float | None, read: bool) -> None:
        left = None if end is None else end - time.monotonic()
        if left is not None and left <= 0:
            raise TimeoutError("timed out")
        fd = self.raw.fileno()
        if fd < 0:
            raise OSError("socket closed")
        poller = select.poll()  # not select(): descriptors above 1023 are common here
        poller.register(fd, select.POLLIN if read else select.POLLOUT)
        if not poller.poll(None if left is None else left * 1e3):
            raise TimeoutError("timed out")

    def setsockopt(self, *args) -> None:
        """socket.setsockopt."""
        self.raw.setsockopt(*args)

    def fileno(self) -> int:
        """The descriptor (-1 once closed)."""
        return self.raw.fileno()

    def shutdown(self, how: int) -> None:
        """Shut the descriptor down (no TLS close_notify; safe from any thread)."""
        socket.socket.shutdown(self.raw, how)

    def close(self) -> None:
        """Close the socket."""
        self.raw.close()


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


class Admission:
    """Counts live connections per server and per address (thread-safe)."""

    def __init__(self, security: ServerSecurity) -> None:
        self.security = security
        self.total = 0
        self.per_address: Counter = Counter()
        self.refused = 0
        self.lock = threading.Lock()

    def enter(self, host: str) -> bool:
        """Admit one connection from `host`; False when a cap is reached (counted)."""
        with self.lock:
            if (
                self.total >= self.security.max_connections
                or self.per_address[host] >= self.security.max_per_address
            ):
                self.refused += 1
                return False
            self.total += 1
            self.per_address[host] += 1
            return True

    def leave(self, host: str) -> None:
        """Forget one admitted connection from `host`."""
        with self.lock:
            self.total -= 1
            self.per_address[host] -= 1
            if self.per_address[host] <= 0:
                del self.per_address[host]


def authenticate(
    sock: socket.socket, security: ServerSecurity, optional: bool = False
) -> tuple[socket.socket, Identity | None]:
    """Run the TLS handshake on an accepted socket within the deadline.

    Args:
        optional: a peer without a certificate is let through (identity None); needs a
            context made with require_client_cert=False.

    Returns:
        (the socket to use: an SSLSocket, or `sock` itself when insecure, the peer's Identity).

    Raises:
        OSError / ssl.SSLError: handshake failed or timed out (the socket is closed).
        PkiError: the verified certificate is not a Terra identity.
    """
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # requests and replies are small
    if security.context is None:
        return sock, INSECURE
    tls = security.context.wrap_socket(sock, server_side=True, do_handshake_on_connect=False)
    try:
        with DEADLINES.guard(tls, security.handshake_s):
            tls.settimeout(security.handshake_s)
            tls.do_handshake()
        tls.settimeout(None)
        peercert = tls.getpeercert()
        if optional and not peercert:
            return tls, None
        return tls, peer_identity(peercert)
    except BaseException:
        tls.close()
        raise


def accept_loop(listener: socket.socket, handle, spawn, security: ServerSecurity) -> None:
    """Accept connections until `listener` is closed; each runs in its own thread (spawn):
    admission caps, then `authenticate`, then handle(sock, addr, identity).

    A refused, failed or timed-out handshake closes only that connection (logged at
    INFO/DEBUG); the handler's socket is closed when it returns.
    """
    admission = Admission(security)

    def run(sock: socket.socket, addr) -> None:
        try:
            try:
                sock, identity = authenticate(sock, security)
            except (OSError, ssl.SSLError, PkiError, ValueError) as exc:
                LOG.info("%s: not authenticated: %s", addr, exc)
                return
            handle(sock, addr, identity)
        finally:
            try:
                sock.close()
            except OSError:
                pass
            admission.leave(addr[0])

    while True:
        try:
            sock, addr = listener.accept()
        except OSError:
            return
        if not admission.enter(addr[0]):
            LOG.warning("%s: connection cap reached; refused", addr)
            sock.close()
            continue
        try:
            spawn(run, sock, addr)
        except Exception:  # cannot start a thread: refuse, keep accepting
            LOG.exception("%s: cannot serve", addr)
            admission.leave(addr[0])
            sock.close()


def stop_listener(listener: socket.socket) -> None:
    """Stop an accept loop: shut the listening socket down (wakes accept) and close it."""
    try:
        listener.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    listener.close()


def listen_and_serve(host: str, port: int, handle, security: ServerSecurity, spawn=None):
    """Listen on host:port and accept connections in a hub thread (one thread per connection).

    Args:
        handle: called as handle(sock, addr, identity) in the connection's own thread.
        security: ServerSecurity (TLS context or None, caps, handshake deadline).
        spawn: spawn(func, *args) -> thread; default os_ken.lib.hub.spawn (tests pass a
            daemon-thread starter).

    Returns:
        (listening socket (`stop_listener` stops it), accept thread, bound (host, port)).

    Raises:
        OSError: the address cannot be bound.
    """
    from os_ken.lib import hub

    spawn = spawn or hub.spawn
    listener = hub.listen((host, port), backlog=1024)
    thread = spawn(accept_loop, listener, handle, spawn, security)
    return listener, thread, listener.getsockname()[:2]


def connect_tls(host: str, port: int, context: ssl.SSLContext | None, timeout: float):
    """Client side: a TCP connection to the controller, with TLS when `context` is given.

    The controller is verified by its certificate's `terra-controller` name (pki.py).

    Returns:
        a connected (SSL)socket with TCP_NODELAY and `timeout` set.

    Raises:
        OSError / ssl.SSLError: cannot connect, or the controller is not verified.
    """
    from terra_controller.pki import CONTROLLER_HOSTNAME

    sock = socket.create_connection((host, port), timeout=timeout)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    if context is None:
        return sock
    try:
        return context.wrap_socket(sock, server_hostname=CONTROLLER_HOSTNAME)
    except BaseException:
        sock.close()
        raise
