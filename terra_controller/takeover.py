"""A takeover shorter than the leader's etcd lease, when the leader's process dies on a host
that stays up.

The leader listens on a liveness port (`LivenessServer`, terra-controller --liveness-port)
and publishes it, with its lease id, in the leader key (EtcdState.campaign). Every standby
holds one TCP connection to it (`LeaderFollower`): the leader sends one hello line naming
its lease, then nothing more, and never closes the connection while it runs. When the
leader's process ends (SIGKILL, a crash, an exit, or a re-exec as a standby) its kernel
closes the connection: the standby reads end-of-stream (FIN) or a reset (RST), revokes the
lease etcd named for that leader, and campaigns at once, without waiting for the lease to
expire.

Only a close counts. A connection that cannot be made, a hello that names another lease,
or silence (a partition, a dead host: no FIN ever arrives) changes nothing; such a leader's
lease expires as before. A standby that restarts closes its own end, which the leader
ignores. The connection carries no command and no secret: the lease revoked is the one etcd
names, not one the peer names; whoever can reset the connection (as anyone on its path can
reset any TCP connection) can at worst make a live leader lose the leadership, which it
then gives up at once (`KeyWatch`).

`KeyWatch` is the leader's side of that: an etcd watch on the leader key (after checking it
still holds our generation). A delete (the lease revoked or expired) or a put by another
controller ends the leadership within one etcd event, not at the next lease refresh.
"""

from __future__ import annotations

import base64
import http.client
import json
import logging
import selectors
import socket
import threading
import time
from collections.abc import Callable

LOG = logging.getLogger("terra.takeover")

CONNECT_S = 1.0  # connecting to the leader's liveness port and reading its hello
MAX_PEERS = 64  # connections the leader's liveness port keeps open at once
HELLO_MAX = 256  # bytes of the hello line
RETRY_S = 0.2  # a standby's wait before connecting again to the same leader
WATCH_RETRY_S = 0.1  # the leader's wait before watching again on the next etcd member
JSON = {"Content-Type": "application/json"}


class LivenessServer:
    """The leader's liveness port: accepts standbys' connections, sends each the hello line
    `{"lease": ID}` and keeps it open until the standby closes it (or this process ends).

    One thread (started by `serve`) accepts and holds every connection with a selector, and
    alone owns them and their count: no lock. `close` only shuts the listener down and wakes
    that thread, which closes the connections.

    Args:
        host, port: where to listen (port 0: any free one).

    Attributes:
        bound: (host, port) listened on. peers: connections held now (read by others).

    Raises:
        OSError: the port cannot be bound.
    """

    def __init__(self, host: str, port: int) -> None:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self.sock = socket.socket(family, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind((host, port))
        self.sock.listen(16)
        self.bound = self.sock.getsockname()[:2]
        self.peers = 0
        self._wake_r, self._wake_w = socket.socketpair()
        self._closing = False
        self._thread: threading.Thread | None = None

    def serve(self, lease: int) -> None:
        """Accept and hold standbys in a daemon thread, telling each our `lease` id."""
        hello = (json.dumps({"lease": lease}) + "\n").encode()
        self._thread = threading.Thread(target=self._run, args=(hello,), name="terra-liveness",
                                        daemon=True)  # fmt: skip
        self._thread.start()

    def _run(self, hello: bytes) -> None:
        selector = selectors.DefaultSelector()
        self.sock.setblocking(False)
        selector.register(self.sock, selectors.EVENT_READ)
        selector.register(self._wake_r, selectors.EVENT_READ)
        held: set[socket.socket] = set()
        try:
            while not self._closing:
                for key, _ in selector.select():
                    if key.fileobj is self.sock:
                        self._accept(selector, held, hello)
                    elif key.fileobj is not self._wake_r:
                        self._read(selector, held, key.fileobj)
        finally:
            for conn in held:  # as this process's end would: each standby sees a close
                _close(conn)
            self.peers = 0
            selector.close()
            self.sock.close()
            self._wake_r.close()

    def _accept(self, selector, held: set, hello: bytes) -> None:
        try:
            conn, _ = self.sock.accept()
        except OSError:
            return
        if len(held) >= MAX_PEERS:
            conn.close()  # the standby takes it as a refusal: no hello was read
            return
        try:
            conn.settimeout(CONNECT_S)
            conn.sendall(hello)
            conn.setblocking(False)
        except OSError:
            conn.close()
            return
        held.add(conn)
        selector.register(conn, selectors.EVENT_READ)
        self.peers = len(held)

    def _read(self, selector, held: set, conn: socket.socket) -> None:
        """A standby sends nothing: readable means it closed its end (or sent bytes)."""
        try:
            if conn.recv(64):
                return
        except BlockingIOError:
            return
        except OSError:
            pass
        selector.unregister(conn)
        held.discard(conn)
        conn.close()
        self.peers = len(held)

    def close(self) -> None:
        """Stop listening and close every standby's connection, as this process's end
        would: each standby takes it as the leader's death. The port is free when this
        returns (the serving thread is waited for, up to 5 s)."""
        self._closing = True
        thread = self._thread
        if thread is None:  # never served: nothing holds a connection
            self.sock.close()
            self._wake_r.close()
        else:
            try:
                self._wake_w.send(b"x")
            except OSError:
                pass
            thread.join(5.0)
        self._wake_w.close()


def _close(conn: socket.socket) -> None:
    try:
        conn.shutdown(socket.SHUT_RDWR)  # sends FIN
    except OSError:
        pass
    conn.close()


def hello_lease(sock: socket.socket) -> int | None:
    """The lease id of the hello line read from `sock` (None: no valid line).

    Raises:
        OSError: the connection failed or timed out before the line's end.
    """
    data = b""
    while not data.endswith(b"\n") and len(data) < HELLO_MAX:
        chunk = sock.recv(HELLO_MAX - len(data))
        if not chunk:
            return None
        data += chunk
    try:
        lease = json.loads(data).get("lease")
    except (ValueError, AttributeError):
        return None
    return lease if isinstance(lease, int) and not isinstance(lease, bool) else None


class LeaderFollower:
    """A standby's connection to the leader's liveness port (module docstring).

    Args:
        on_closed: called with the leader's member map (as etcd named it, with "lease") when
            that leader's kernel closed the connection after a matching hello; called from
            the follower's thread.

    `follow(leader)` (the leader key's value, or None) is called on every look at etcd, from
    one thread (the campaign's); a new leader (another lease) starts a new connection thread
    and tells the old one to stop (its own event): the threads share no state.
    """

    def __init__(self, on_closed: Callable[[dict], None]) -> None:
        self.on_closed = on_closed
        self.lease: int | None = None
        self._stop: threading.Event | None = None  # the current connection thread's

    def follow(self, leader: dict | None) -> None:
        """Hold a connection to `leader`'s liveness port (none when it publishes none)."""
        lease = (leader or {}).get("lease")
        address = (leader or {}).get("liveness")
        if not isinstance(lease, int) or not isinstance(address, str):
            lease = None
        if lease == self.lease:
            return
        self.lease = lease
        if self._stop is not None:
            self._stop.set()
            self._stop = None
        if lease is not None:
            self._stop = stop = threading.Event()
            threading.Thread(target=self._hold, args=(leader, address, lease, stop),
                             name="terra-follow", daemon=True).start()  # fmt: skip

    def _hold(self, leader: dict, address: str, lease: int, stop: threading.Event) -> None:
        host, _, port = address.rpartition(":")
        while not stop.is_set():
            try:
                sock = socket.create_connection((host.strip("[]"), int(port)), CONNECT_S)
            except (OSError, ValueError):
                stop.wait(RETRY_S)  # not listening (yet, or any more): not a death
                continue
            with sock:
                try:
                    named = hello_lease(sock)
                except OSError:
                    named = None
                if named != lease:
                    stop.wait(RETRY_S)
                    continue
                LOG.info("holding the liveness connection of leader %s", leader.get("id"))
                if self._hold_until_closed(sock, stop):
                    LOG.warning("leader %s closed its liveness connection: its process ended",
                                leader.get("id"))  # fmt: skip
                    self.on_closed(leader)
                    return

    def _hold_until_closed(self, sock: socket.socket, stop: threading.Event) -> bool:
        """True when the peer closed the connection (FIN or RST); False when we stopped
        following this lease. Silence, however long, is neither."""
        sock.settimeout(0.5)
        while not stop.is_set():
            try:
                if not sock.recv(64):
                    return True
            except TimeoutError:
                continue
            except (ConnectionResetError, ConnectionAbortedError, BrokenPipeError):
                return True
            except OSError:
                return False
        return False


class KeyWatch:
    """The leader's watch on its leader key (module docstring): `on_lost(reason)` is called
    once, from the watch's daemon thread, when etcd reports the key deleted or put again.

    Args:
        endpoints: etcd members' (host, port), tried in turn. key: the leader key.
        generation: the key's create revision (ours): the key must keep it.
    """

    def __init__(
        self, endpoints: list[tuple[str, int]], key: str, generation: int,
        on_lost: Callable[[str], None],
    ) -> None:  # fmt: skip
        self.endpoints, self.key, self.generation = endpoints, key, generation
        self.on_lost = on_lost
        threading.Thread(target=self._run, name="terra-key-watch", daemon=True).start()

    def _run(self) -> None:
        at = 0
        while True:
            host, port = self.endpoints[at % len(self.endpoints)]
            try:
                reason = self._watch(host, port)
            except (OSError, http.client.HTTPException, ValueError) as exc:
                LOG.debug("leader key watch at %s:%d: %s", host, port, exc)
                reason = None
            if reason is not None:
                self.on_lost(reason)
                return
            at += 1
            time.sleep(WATCH_RETRY_S)

    def _watch(self, host: str, port: int) -> str | None:
        """Check the key at one member, then watch it from there on until it changes (the
        reason) or the stream ends (None)."""
        conn = http.client.HTTPConnection(host, port, timeout=CONNECT_S)
        key = base64.b64encode(self.key.encode()).decode()
        try:
            conn.request("POST", "/v3/kv/range", json.dumps({"key": key}), JSON)
            reply = conn.getresponse()
            data = json.loads(reply.read())
            if reply.status != 200:
                return None
            reason = self._lost_by([{"kv": kv} for kv in data.get("kvs", ())] or [{}])
            if reason is not None:
                return reason
            start = int(data["header"]["revision"]) + 1
            body = {"create_request": {"key": key, "start_revision": str(start)}}
            conn.request("POST", "/v3/watch", json.dumps(body), JSON)
            reply = conn.getresponse()
            if reply.status != 200:
                return None
            conn.sock.settimeout(None)  # events come when they come
            while line := reply.readline():
                if line.strip():
                    events = json.loads(line).get("result", {}).get("events", ())
                    reason = self._lost_by(events)
                    if reason is not None:
                        return reason
            return None
        finally:
            conn.close()

    def _lost_by(self, events) -> str | None:
        """Why the leadership is lost by etcd's `events` on the key ([{}]: the key is
        absent), or None."""
        for event in events:
            kv = event.get("kv")
            if kv is None or event.get("type") == "DELETE":
                return "the leader key is gone (lease revoked or expired)"
            if int(kv.get("create_revision", 0)) != self.generation:
                return "another controller created the leader key"
        return None
