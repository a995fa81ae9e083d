"""TCP socket options of the agent's connections (Linux): dead-peer detection, congestion
control, the kernel's unsent-bytes bound, and the bytes the kernel still holds to send.

Used by the sending side (sender.PeerLink), the data listener (incoming.py) and the control
session (control_session.py).
"""

from __future__ import annotations

import fcntl
import socket
import termios

import trio

DEAD_PEER_S = 10.0  # a silent peer (no acks, no keepalive answers) is dropped after this long


def kernel_queued_bytes(sock: socket.socket) -> int:
    """Bytes `sock`'s kernel still holds to send or to see acknowledged (Linux SIOCOUTQ for
    TCP: unsent + unacknowledged); -1 when that cannot be read (closed socket, no ioctl)."""
    try:
        buf = fcntl.ioctl(sock.fileno(), termios.TIOCOUTQ, b"\0\0\0\0")
    except (OSError, ValueError):
        return -1
    return int.from_bytes(buf, "little", signed=True)


def detect_dead_peers(stream: trio.SocketStream, timeout_s: float = DEAD_PEER_S) -> None:
    """Make the kernel drop `stream` when its peer goes silent for about `timeout_s` seconds.

    TCP_USER_TIMEOUT bounds how long sent data may stay unacknowledged (a WAN path that drops
    packets without a reset), keepalive probes cover idle connections. Linux options; ignored
    where missing.
    """
    sock = stream.socket
    probes = [
        (socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1),
        (socket.IPPROTO_TCP, getattr(socket, "TCP_KEEPIDLE", None), max(1, int(timeout_s / 2))),
        (socket.IPPROTO_TCP, getattr(socket, "TCP_KEEPINTVL", None), max(1, int(timeout_s / 6))),
        (socket.IPPROTO_TCP, getattr(socket, "TCP_KEEPCNT", None), 3),
        (socket.IPPROTO_TCP, getattr(socket, "TCP_USER_TIMEOUT", None), int(timeout_s * 1000)),
    ]
    for level, option, value in probes:
        if option is not None:
            try:
                sock.setsockopt(level, option, value)
            except OSError:
                pass


def set_congestion_control(sock: socket.socket, name: str) -> None:
    """Make `sock` use the kernel's TCP congestion control `name` (TCP_CONGESTION, e.g.
    "cubic"); it applies to an open connection too.

    Why an agent may want one (docs/design.md 5.1, "Tunnel congestion control"): the
    controller's rates already share each link, so a tunnel connection's congestion control
    only has to keep up with its rate. BBR, a common default, sizes its window at twice its
    bandwidth estimate times the smallest RTT seen and probes for more bandwidth only every
    eight round trips, so on short paths with queueing it holds a connection below a rate
    the controller just raised.

    Raises:
        OSError: the kernel does not know `name` (ENOENT) or this process may not use it
            (EPERM: not in net.ipv4.tcp_allowed_congestion_control and not privileged).
    """
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_CONGESTION, name.encode("ascii"))


def allow_unsent_bytes(stream: trio.SocketStream, nbytes: int) -> None:
    """Let the kernel queue up to about `nbytes` not-yet-sent bytes on `stream`
    (TCP_NOTSENT_LOWAT: the socket is writable while fewer are queued).

    trio sets 16 KiB on every SocketStream (low latency for small messages); with 4 MiB chunks a
    data connection then became writable after each receiver window update and a chunk went out
    in ~30 short writes, each an epoll round and a trio wake-up. PeerLink sets one chunk's worth
    (about 10 ms of the path's rate, see chunk_bytes), so rate changes and failures still act on
    a short kernel queue. Linux option; ignored where missing.
    """
    option = getattr(socket, "TCP_NOTSENT_LOWAT", None)
    if option is not None:
        try:
            stream.socket.setsockopt(socket.IPPROTO_TCP, option, nbytes)
        except OSError:
            pass
