"""The controllers' shared state in etcd: the leader key and the coflow journal's entries.

Several `terra-controller --etcd URL[,URL...]` instances share one etcd cluster (Debian's
etcd-server; this module speaks its v3 JSON gateway through OpenStack's etcd3gw). Keys, under
`/terra/CLUSTER/`:

    leader          {"id", "api", "agents", "rest", "liveness", "lease"} of the leader (JSON),
                    on its lease (takeover.py: "liveness" and "lease" let standbys revoke
                    the lease of a leader whose process ended)
    next_id         the lowest coflow id never used (decimal)
    coflows/ID      one coflow's journal records (a JSON list of journal.py's lines)
    links           the operator's link states and capacities, and the live tenants (a JSON
                    list of journal.py's "l" lines and its "t" line)

A controller becomes the leader by creating `leader` on a lease of its own in one transaction
that succeeds only if the key does not exist (the etcd election recipe, as in etcd's
concurrency package); the key's create revision is its *generation*. Every write of the
leader is a transaction guarded by that create revision, so a controller that lost its lease
cannot overwrite its successor's state (fencing): the write fails with StateStoreError.

Endpoints are tried in order; one that cannot be reached is skipped for the next request
(etcd's members serve the same data). They are dialled directly: the environment's proxy
settings (HTTP_PROXY, ...) and ~/.netrc are not used (reading them on every request cost
a third of a transaction's client CPU).
"""

from __future__ import annotations

import base64
import http.client
import json
import logging
import warnings
from collections.abc import Callable
from typing import Any, TypeVar

with warnings.catch_warnings():  # futurist (etcd3gw's executor helper) imports eventlet,
    warnings.simplefilter("ignore")  # which warns that it is deprecated
    import etcd3gw
    from etcd3gw import exceptions as etcd_errors

LOG = logging.getLogger("terra.etcd")

REQUEST_TIMEOUT_S = 1.0  # one etcd request (a member that does not answer is skipped)
TXN_OPS = 100  # operations per transaction (etcd's default limit is 128)
T = TypeVar("T")


class StateStoreError(Exception):
    """etcd cannot be reached at any endpoint, or a guarded write failed because this
    controller is no longer the leader (the message says which)."""


def parse_endpoints(text: str) -> list[tuple[str, int]]:
    """`HOST:PORT[,HOST:PORT...]` (each optionally prefixed by http://) as (host, port) pairs.

    Raises:
        ValueError: an empty list or an entry without a valid port (message names it).
    """
    out = []
    for item in text.split(","):
        item = item.strip().removeprefix("http://").rstrip("/")
        host, _, port = item.rpartition(":")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f"bad etcd endpoint {item!r} (want HOST:PORT)")
        out.append((host.strip("[]"), int(port)))
    if not out:
        raise ValueError("no etcd endpoint given")
    return out


class TxnConnection:
    """One etcd member's keep-alive HTTP connection for the journal's transactions: a POST
    to /v3/kv/txn straight through http.client (a fifth of the client CPU of etcd3gw's
    requests session, measured in docs/results.md 4.3). A connection the member closed
    while idle is opened again once; other failures raise etcd3gw's ConnectionFailedError
    (the member is skipped) or Etcd3Exception (it answered with an error)."""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self.conn: http.client.HTTPConnection | None = None

    def transaction(self, txn: dict) -> dict:
        """etcd's reply map to `txn` (the v3 JSON gateway's txn request)."""
        body = json.dumps(txn)
        for attempt in (0, 1):
            fresh = self.conn is None
            if fresh:
                self.conn = http.client.HTTPConnection(self.host, self.port,
                                                       timeout=REQUEST_TIMEOUT_S)  # fmt: skip
            try:
                self.conn.request("POST", "/v3/kv/txn", body,
                                  {"Content-Type": "application/json"})  # fmt: skip
                reply = self.conn.getresponse()
                data = reply.read()
            except (OSError, http.client.HTTPException) as exc:
                self.conn.close()
                self.conn = None
                stale = isinstance(exc, ConnectionResetError | BrokenPipeError
                                   | http.client.RemoteDisconnected)  # fmt: skip
                if fresh or not stale or attempt:
                    raise etcd_errors.ConnectionFailedError(str(exc)) from exc
                continue
            if reply.status != 200:
                raise etcd_errors.Etcd3Exception(f"{reply.status} {data[:200]!r}")
            return json.loads(data)
        raise AssertionError("unreachable")


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


class EtcdState:
    """The leader key and the journal's entries of one controller cluster in etcd.

    Args:
        endpoints: (host, port) of etcd members' client URLs (http).
        cluster: the cluster's name (the key prefix /terra/CLUSTER/).

    Attributes:
        prefix: the key prefix. generation: the create revision of our leader key once
        elected (None before). lease: our etcd3gw Lease once elected. revision: etcd's
        revision after our last write (0 before). deposed: a guarded write found that
        another controller leads.
    """

    def __init__(self, endpoints: list[tuple[str, int]], cluster: str = "terra") -> None:
        self.clients = [
            etcd3gw.Etcd3Client(host, port, timeout=REQUEST_TIMEOUT_S, api_path="/v3/")
            for host, port in endpoints
        ]
        for client in self.clients:  # the members are dialled directly: no proxy or .netrc
            client.session.trust_env = False  # look-ups in the environment on every request
        self._txns = {id(c): TxnConnection(h, p) for c, (h, p) in zip(self.clients, endpoints,
                                                                    strict=True)}  # fmt: skip
        self.endpoints = list(endpoints)
        self.names = [f"{h}:{p}" for h, p in endpoints]
        self._next = 0
        self.prefix = f"/terra/{cluster}/"
        self.generation: int | None = None
        self.lease = None
        self.revision = 0
        self.deposed = False

    def _call(self, request: Callable[[Any], T]) -> T:
        """Run `request(client)` on the first member that answers.

        Raises:
            StateStoreError: no member could be reached.
        """
        errors = []
        for i in range(len(self.clients)):
            at = (self._next + i) % len(self.clients)
            try:
                result = request(self.clients[at])
            except (etcd_errors.ConnectionFailedError, etcd_errors.ConnectionTimeoutError) as exc:
                errors.append(f"{self.names[at]}: {type(exc).__name__}")
                continue
            except etcd_errors.Etcd3Exception as exc:
                raise StateStoreError(f"etcd at {self.names[at]}: {exc}") from exc
            self._next = at
            return result
        raise StateStoreError("etcd unreachable (" + "; ".join(errors) + ")")

    # ---- leadership ----------------------------------------------------------------------

    def campaign(self, member: dict, ttl_s: int) -> int | None:
        """Try once to become the leader: create the leader key with `member` and the new
        lease's id ("lease", JSON) on a new lease of `ttl_s` seconds, only if no leader key
        exists.

        Returns:
            our generation (the key's create revision, > 0) when elected, else None.

        Raises:
            StateStoreError: etcd unreachable.
        """
        lease = self._call(lambda c: c.lease(ttl_s))
        key = self.prefix + "leader"
        value = _b64(json.dumps({**member, "lease": lease.id}))
        txn = {
            "compare": [{"key": _b64(key), "result": "EQUAL", "target": "CREATE",
                         "create_revision": "0"}],
            "success": [{"request_put": {"key": _b64(key), "value": value,
                                         "lease": lease.id}}],
            "failure": [],
        }  # fmt: skip
        reply = self._call(lambda c: c.transaction(txn))
        if not reply.get("succeeded"):
            self._call(lambda c: etcd3gw.Lease(lease.id, c).revoke())
            return None
        self.lease = lease
        self.generation = int(reply["header"]["revision"])
        return self.generation

    def leader(self) -> dict | None:
        """The current leader's member map, or None when there is none.

        Raises:
            StateStoreError: etcd unreachable.
        """
        values = self._call(lambda c: c.get(self.prefix + "leader"))
        if not values:
            return None
        try:
            return json.loads(values[0])
        except ValueError:
            return None

    def keep_alive(self) -> bool:
        """Refresh our lease once: True while it lives, False once it expired.

        Raises:
            StateStoreError: etcd unreachable.
        """
        if self.lease is None:
            return False
        lease_id = self.lease.id  # asked of whichever member answers, not the granting one
        return self._call(lambda c: etcd3gw.Lease(lease_id, c).refresh()) > 0

    def revoke(self, lease_id: int) -> None:
        """Revoke another controller's lease `lease_id` (its leader key goes with it; a
        lease already gone is no error).

        Raises:
            StateStoreError: etcd unreachable.
        """
        self._call(lambda c: etcd3gw.Lease(lease_id, c).revoke())

    def resign(self) -> None:
        """Give the leadership up (revoke our lease: the leader key goes with it)."""
        if self.lease is not None:
            lease, self.lease = self.lease, None
            try:
                self._call(lambda c: etcd3gw.Lease(lease.id, c).revoke())
            except StateStoreError as exc:
                LOG.warning("resigning: %s", exc)

    # ---- the journal's entries -----------------------------------------------------------

    def load(self) -> tuple[int, list[list[dict]]]:
        """(next_id, [records of each coflow, in admission order]) as stored.

        Raises:
            StateStoreError: etcd unreachable.
        """
        nxt = self._call(lambda c: c.get(self.prefix + "next_id"))
        rows = self._call(lambda c: c.get_prefix(self.prefix + "coflows/"))
        entries = []
        for value, meta in sorted(rows, key=lambda r: int(r[1].get("create_revision", 0))):
            try:
                records = json.loads(value)
            except ValueError:
                LOG.warning("etcd: unreadable entry %r skipped", meta.get("key"))
                continue
            entries.append(records)
        return (int(nxt[0]) if nxt else 0), entries

    def load_links(self) -> list[dict]:
        """The operator's link records as stored ([] when none).

        Raises:
            StateStoreError: etcd unreachable.
        """
        values = self._call(lambda c: c.get(self.prefix + "links"))
        try:
            records = json.loads(values[0]) if values else []
        except ValueError:
            LOG.warning("etcd: unreadable link states skipped")
            return []
        return records if isinstance(records, list) else []

    def write(
        self, next_id: int, entries: dict[int, list[dict] | None], links: list[dict] | None = None
    ) -> None:
        """Store the id counter, coflows' records ({id: records, or None to remove it}) and,
        unless None, the operator's link records (replacing those stored), in guarded
        transactions of at most TXN_OPS operations (only while we lead).

        Raises:
            StateStoreError: etcd unreachable, or we are not the leader (any more).
        """
        ops = [{"request_put": {"key": _b64(self.prefix + "next_id"),
                                "value": _b64(str(next_id))}}]  # fmt: skip
        if links is not None:
            ops.append({"request_put": {"key": _b64(self.prefix + "links"),
                                        "value": _b64(json.dumps(links))}})  # fmt: skip
        for cid, records in entries.items():
            key = _b64(f"{self.prefix}coflows/{cid}")
            if records is None:
                ops.append({"request_delete_range": {"key": key}})
            else:
                ops.append({"request_put": {"key": key, "value": _b64(json.dumps(records))}})
        for start in range(0, len(ops), TXN_OPS):
            self._guarded(ops[start : start + TXN_OPS])

    def _guarded(self, operations: list[dict]) -> None:
        """Apply `operations` in one transaction that succeeds only while our leader key is
        the one we created.

        Raises:
            StateStoreError: etcd unreachable, or we are not the leader (any more).
        """
        if self.generation is None:
            raise StateStoreError("not the leader: no write to the shared state")
        key = _b64(self.prefix + "leader")
        txn = {
            "compare": [{"key": key, "result": "EQUAL", "target": "CREATE",
                         "create_revision": str(self.generation)}],
            "success": operations,
            "failure": [],
        }  # fmt: skip
        reply = self._call(lambda c: self._txns[id(c)].transaction(txn))
        if not reply.get("succeeded"):
            self.deposed = True
            raise StateStoreError("this controller is no longer the leader")
        self.revision = int(reply["header"]["revision"])
