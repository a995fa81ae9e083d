"""A TLS socket one reading and one writing thread use at once: the fake agents of the
benchmarks and tests (loopback_system.FakeAgent, tests/tls_helpers.py) read and write their
control connection from two threads.

OpenSSL forbids concurrent use of one SSL object, so every SSL call is made under a lock,
on a non-blocking socket; threads wait for readiness (poll) without holding it.
"""

from __future__ import annotations

import select
import socket
import ssl
import threading
import time


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
