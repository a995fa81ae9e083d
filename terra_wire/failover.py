"""Several controllers, one leader: the addresses agents and clients try in turn, and the
standby's "not_leader" reply, without I/O.

A highly available deployment runs several `terra-controller` instances; one, the leader,
serves, the others are standbys. A standby refuses agents' connections and answers every
coflow API request with the error reply

    {"v": 1, "ok": false, "code": "not_leader",
     "error": "this controller is a standby; the leader is HOST:PORT",
     "leader": "HOST:PORT" or null (not known yet)}

Agents (terra_agent/control_session.py) and clients (terra_controller/client.py,
async_client.py) keep a `ControllerList`: they use one address until it fails, then move to
the next one (round robin; a client told where the leader is goes there first) and wait
their backoff only after a full pass over the list failed, so a dead leader among three
controllers costs one refused connection, not a backoff.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable

from terra_wire.api import Message
from terra_wire.api_session import TerraError

NOT_LEADER = "not_leader"  # the code of a standby's reply
RETRY_MIN_S = 0.05  # a client's first backoff after a full pass failed (doubling)
RETRY_MAX_S = 1.0  # its longest backoff
MAX_NAMED = 16  # leader addresses learned from replies that are kept besides the given ones

Address = tuple[str, int]


class NotLeader(TerraError):
    """A standby controller answered a coflow API request (nothing was executed).

    Attributes:
        leader: the leader's API address the standby named, or None (not known yet, or not
            a valid HOST:PORT).
    """

    def __init__(self, message: str, leader: Address | None) -> None:
        super().__init__(NOT_LEADER, message)
        self.leader = leader


def parse_address(text: object) -> Address:
    """ "HOST:PORT" (an IPv6 host may be in brackets) as (host, port); a (host, port) pair is
    checked and returned.

    Raises:
        ValueError: malformed, or the port is not 0..65535.
    """
    if isinstance(text, tuple | list) and len(text) == 2:
        host, port = text
        port = str(port)
    elif isinstance(text, str):
        host, _, port = text.rpartition(":")
    else:
        raise ValueError(f"expected HOST:PORT, got {text!r}")
    if not isinstance(host, str) or not host.strip("[]") or not port.isdigit():
        raise ValueError(f"expected HOST:PORT, got {text!r}")
    if int(port) > 65535:
        raise ValueError(f"port must be 0..65535, got {text!r}")
    return host.strip("[]"), int(port)


def parse_addresses(items: str | Iterable[object]) -> list[Address]:
    """Controller addresses: "HOST:PORT[,HOST:PORT...]" or an iterable of "HOST:PORT" strings
    or (host, port) pairs; duplicates are dropped, the order is kept.

    Raises:
        ValueError: none given, or one is malformed (parse_address).
    """
    if isinstance(items, str):
        items = [part.strip() for part in items.split(",")]
    addresses: list[Address] = []
    for item in items:
        address = parse_address(item)
        if address not in addresses:
            addresses.append(address)
    if not addresses:
        raise ValueError("no controller address given")
    return addresses


def format_address(address: Address) -> str:
    """(host, port) as "HOST:PORT" ("[HOST]:PORT" for an IPv6 host)."""
    host, port = address
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def not_leader(reply: Message) -> NotLeader | None:
    """The NotLeader a standby's "not_leader" error reply means (with the leader it names,
    if a valid HOST:PORT), or None for any other reply."""
    if reply.get("ok") or reply.get("code") != NOT_LEADER:
        return None
    try:
        leader: Address | None = parse_address(reply.get("leader"))
    except ValueError:
        leader = None
    return NotLeader(str(reply.get("error", "this controller is a standby")), leader)


def check_leader(reply: Message) -> Message:
    """`reply` itself, unless it is a standby's "not_leader" error.

    Raises:
        NotLeader: it is (not_leader).
    """
    exc = not_leader(reply)
    if exc is not None:
        raise exc
    return reply


class ControllerList:
    """The controllers' addresses and the one in use (round robin on failures).

    The rule: `failed` moves to the next address; `failed` returns True after as many
    failures in a row as there are addresses (a full pass: the caller waits its backoff
    then, and only then); `reached` (a controller answered as leader, or a session held)
    starts the count again. A standby naming the leader (`redirect`) makes that address the
    one in use (added to the list if new, at most MAX_NAMED such) and counts as a failure,
    so standbys naming each other cannot make a caller spin without backoff.

    Failures are attributed: `failed(address)` and `redirect(address, ...)` do nothing when
    `address` is no longer the one in use (several calls sharing one connection report its
    loss once).

    Args:
        addresses: the controllers, in the order to try them (parse_addresses).

    Raises:
        ValueError: no address given.
    """

    def __init__(self, addresses: Iterable[Address]) -> None:
        self.addresses: list[Address] = list(dict.fromkeys(addresses))
        if not self.addresses:
            raise ValueError("no controller address given")
        self.given = len(self.addresses)
        self.index = 0
        self.misses = 0

    @property
    def current(self) -> Address:
        """The address to use now."""
        return self.addresses[self.index]

    def __str__(self) -> str:
        return ", ".join(format_address(a) for a in self.addresses)

    def reached(self) -> None:
        """The current controller answered as leader: a new pass starts at the next failure."""
        self.misses = 0

    def failed(self, address: Address) -> bool:
        """`address` failed (refused, unreachable, lost); move to the next one.

        Returns:
            True when a full pass over the list has now failed (wait the backoff).
        """
        if address != self.current:
            return False
        self.index = (self.index + 1) % len(self.addresses)
        return self._missed()

    def redirect(self, address: Address, leader: Address | None) -> bool:
        """The standby at `address` named `leader` (None: not known): use the leader next,
        else the next address.

        Returns:
            True when a full pass has now failed (as `failed`).
        """
        if address != self.current:
            return False
        if leader is None or leader == address:
            return self.failed(address)
        if leader not in self.addresses:
            if len(self.addresses) - self.given >= MAX_NAMED:
                del self.addresses[self.given]  # the oldest learned one
            self.addresses.append(leader)
        self.index = self.addresses.index(leader)
        return self._missed()

    def _missed(self) -> bool:
        self.misses += 1
        if self.misses >= len(self.addresses):
            self.misses = 0
            return True
        return False


def client_controllers(
    host: str | None, port: int | None, controllers: str | Iterable[object] | None
) -> ControllerList:
    """A client's ControllerList from its arguments: `host` and `port` (one controller), or
    `controllers` (parse_addresses: "HOST:PORT" strings, (host, port) pairs, or one string
    of comma-separated HOST:PORT).

    Raises:
        ValueError: both or neither given, or an address is malformed.
    """
    if controllers is not None:
        if host is not None or port is not None:
            raise ValueError("give host and port, or controllers, not both")
        return ControllerList(parse_addresses(controllers))
    if host is None or port is None:
        raise ValueError("give host and port, or controllers=[HOST:PORT, ...]")
    return ControllerList([parse_address((host, port))])


class Retry:
    """One client request's attempts over a ControllerList, within `timeout` seconds.

    After a failed attempt at `address` (`failed`): a standby's NotLeader sends the next
    attempt to the leader it named, anything else to the next address; the backoff (50 ms
    doubling to 1 s) is waited only after a full pass over the list failed. Past the
    deadline `failed` raises ConnectionError, one line naming every address tried and the
    last failure.

    The request is sent again on the next attempt unchanged: every coflow API request but
    submit and update is idempotent, and those carry their client-chosen "ref", which the
    controller uses to execute a resent request once (never make a new ref for a resend).
    """

    def __init__(
        self, controllers: ControllerList, timeout: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:  # fmt: skip
        self.controllers = controllers
        self.timeout = timeout
        self.clock = clock
        self.end = clock() + timeout
        self.delay = RETRY_MIN_S

    def remaining(self) -> float:
        """Seconds left (at least 10 ms: an attempt needs some time)."""
        return max(self.end - self.clock(), 0.01)

    def failed(self, address: Address, exc: BaseException) -> float:
        """The attempt at `address` failed with `exc`; the seconds to wait before the next
        one (0: at once, at ControllerList.current).

        Raises:
            ConnectionError: the deadline passed (or would, waiting the backoff).
        """
        if isinstance(exc, NotLeader):
            full_pass = self.controllers.redirect(address, exc.leader)
        else:
            full_pass = self.controllers.failed(address)
        wait = self.delay if full_pass else 0.0
        if self.clock() + wait >= self.end:
            last = " ".join(str(exc).split()) or type(exc).__name__
            raise ConnectionError(
                f"controller unreachable within {self.timeout:g} s at {self.controllers} "
                f"(last: {format_address(address)}: {last})"
            ) from exc
        if full_pass:
            self.delay = min(self.delay * 2, RETRY_MAX_S)
        return wait
