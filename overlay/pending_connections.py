"""Connection admission of a listener: caps in total and per source address, and which
not-yet-authenticated connection a full listener drops for a newcomer.

A listener's total cap can be filled by a flood spread over many source addresses. The
connections that have not authenticated yet (TLS handshake, "hello" or first request not
complete) are cheap to drop, and a legitimate client leaves that state within
milliseconds; so when the total cap is reached, a new connection takes the place of the
oldest pending connection of the address holding the most pending connections, provided
the newcomer's address holds no pending connection, or, counting the newcomer, still fewer
than that one. The busiest flooder pays first; the connections of a flood spread evenly
over its addresses do not evict one another (each would cost a new handler for nothing),
they are refused at once. Authenticated connections are never chosen.

`ConnectionCounts` is the bookkeeping shared by terra_controller/transport.py's
Admission (threads, under its lock) and terra_agent/admission.py's (trio); no locking here.
"""

from __future__ import annotations

from collections import Counter, OrderedDict
from collections.abc import Hashable


class AdmittedConnection:
    """One admitted connection: host (the peer's IP address), pending (not authenticated
    yet: may be evicted for a newcomer), admitted (still counted: False once it left or
    was evicted)."""

    __slots__ = ("host", "pending", "admitted")

    def __init__(self, host: str, pending: bool = True) -> None:
        self.host, self.pending, self.admitted = host, pending, True


class ConnectionCounts:
    """Live connections of one listener (group), in total and per address, and the pending
    ones (`PendingConnections`); no locking (the caller serializes).

    Args:
        max_connections: connections at once in total; max_per_address: from one address.

    Attributes:
        total, per_address (Counter), pending (PendingConnections), refused (connections
        turned away: a cap reached and nothing to evict), evicted (pending connections
        dropped for a newcomer).
    """

    def __init__(self, max_connections: int, max_per_address: int) -> None:
        self.max_connections, self.max_per_address = max_connections, max_per_address
        self.total = 0
        self.per_address: Counter = Counter()
        self.pending = PendingConnections()
        self.refused = 0
        self.evicted = 0

    def admit(self, conn: AdmittedConnection) -> tuple[bool, AdmittedConnection | None]:
        """Count `conn` in if the caps allow, evicting a pending connection at the total cap.

        Returns:
            (admitted, victim): victim is the evicted connection (already uncounted; the
            caller closes it) or None; admitted False means `conn` is refused (counted).
        """
        host = conn.host
        if self.per_address[host] >= self.max_per_address:
            self.refused += 1
            return False, None
        victim = None
        if self.total >= self.max_connections:
            found = self.pending.victim(host)
            if found is None:
                self.refused += 1
                return False, None
            victim = found[1]
            self.forget(victim)
            self.evicted += 1
        self.total += 1
        self.per_address[host] += 1
        if conn.pending:
            self.pending.add(host, conn)
        return True, victim

    def settle(self, conn: AdmittedConnection) -> None:
        """`conn` is authenticated: never evicted from now on."""
        if conn.pending:
            conn.pending = False
            self.pending.discard(conn.host, conn)

    def forget(self, conn: AdmittedConnection) -> bool:
        """Uncount a connection that closed or was evicted; False if it was not counted."""
        if not conn.admitted:
            return False
        conn.admitted = False
        self.total -= 1
        self.per_address[conn.host] -= 1
        if self.per_address[conn.host] <= 0:
            del self.per_address[conn.host]
        if conn.pending:
            self.pending.discard(conn.host, conn)
        return True


class PendingConnections:
    """The pending connections of one listener (group), per source address, oldest first.

    Keys are any hashable objects naming a connection, unique within the set. Finding the
    busiest address is O(1) (addresses bucketed by their pending count), so an accept at
    the cap costs the same under a flood from 20 or 20,000 addresses.
    """

    def __init__(self) -> None:
        self._by_host: dict[str, OrderedDict[Hashable, None]] = {}
        self._hosts_with: dict[int, dict[str, None]] = {}  # pending count -> addresses
        self._top = 0  # the largest pending count of an address (0: none pending)

    def __len__(self) -> int:
        return sum(len(keys) for keys in self._by_host.values())

    def count(self, host: str) -> int:
        """Pending connections from `host`."""
        return len(self._by_host.get(host, ()))

    def add(self, host: str, key: Hashable) -> None:
        """Record connection `key` from `host` as pending (newest of its address)."""
        keys = self._by_host.setdefault(host, OrderedDict())
        before = len(keys)
        keys[key] = None
        self._move(host, before, before + 1)

    def discard(self, host: str, key: Hashable) -> bool:
        """Forget `key` (authenticated, closed or evicted); False if it was not pending."""
        keys = self._by_host.get(host)
        if keys is None or key not in keys:
            return False
        before = len(keys)
        del keys[key]
        if not keys:
            del self._by_host[host]
        self._move(host, before, before - 1)
        return True

    def victim(self, newcomer: str) -> tuple[str, Hashable] | None:
        """(address, key) of the connection to drop for a newcomer from address `newcomer`:
        the oldest pending one of the busiest address, if `newcomer` holds no pending
        connection or, counting the newcomer, fewer than that address; None otherwise (the
        newcomer is refused). Does not forget it (call discard)."""
        held = self.count(newcomer)
        if self._top == 0 or (held and held + 1 >= self._top):
            return None
        host = next(iter(self._hosts_with[self._top]))
        return host, next(iter(self._by_host[host]))

    def _move(self, host: str, before: int, after: int) -> None:
        if before:
            bucket = self._hosts_with[before]
            del bucket[host]
            if not bucket:
                del self._hosts_with[before]
        if after:
            self._hosts_with.setdefault(after, {})[host] = None
        if after > self._top:
            self._top = after
        elif before == self._top and before not in self._hosts_with:
            self._top = after  # counts change by one: the next largest is `after`


def listener_families(listeners: dict, prefix: str):
    """Prometheus families of listeners' connection counts ({server name: ConnectionCounts}):
    PREFIX_connections_open (gauge), PREFIX_connections_refused_total and
    PREFIX_connections_evicted_total (counters), label server (e.g. "coflow API", "data
    port"). Yields prometheus_client metric families."""
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

    open_ = GaugeMetricFamily(
        f"{prefix}_connections_open", "Connections a server holds now (authenticated or not)",
        labels=["server"],
    )  # fmt: skip
    refused = CounterMetricFamily(
        f"{prefix}_connections_refused",
        "Connections a server closed at once: a cap reached and none to evict",
        labels=["server"],
    )  # fmt: skip
    evicted = CounterMetricFamily(
        f"{prefix}_connections_evicted",
        "Unauthenticated connections a server dropped at its total cap for a newcomer",
        labels=["server"],
    )  # fmt: skip
    for name, counts in sorted(listeners.items()):
        open_.add_metric([name], counts.total)
        refused.add_metric([name], counts.refused)
        evicted.add_metric([name], counts.evicted)
    yield from (open_, refused, evicted)
