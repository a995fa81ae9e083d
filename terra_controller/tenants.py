"""Tenants in the live controller: whose share of the WAN a coflow is scheduled in
(docs/design.md section 4.5).

With `terra-controller --tenants FILE` (tenants_config.py) and `--isolation tenants` (the
default then) the controller's policy is `LiveTenantPolicy`: terra_core's TenantPolicy (the
WAN divided among the tenants with active coflows by their weights, HUG-style, Terra inside
each share) whose tenants and weights can change while it runs. A coflow's tenant is its
submitting job's: the tenant its certificate names (terra_security/pki.py, `pki issue
--role job NAME --tenant T`; a certificate without one names the job's own NAME), never a
field of the request. A job of a tenant the file does not list is refused (code
"unknown_tenant") or its coflows go to the file's default tenant (`[default] action =
"map"`). In-process submits (no job) and insecure clients go to the default tenant, else the
first one listed.

`TenantBook` is the live state: the tenants (weight, limits), the default, which job names
belong to which tenant (learned from their certificates, so coflows resumed after a restart
keep their tenant), and each active coflow's tenant. Like the coflow registry it has one
owner, the controller's loop, and no lock: the API's worker threads, REST and metrics hand
their reads and changes to the loop (`on_loop`), and the round's worker thread does not
touch it (LiveTenantPolicy takes its changes in `begin_round` and notes the round in
`end_round`, both on the loop). Operators change it with `ctl tenant
set|remove` (tenant_api.py); the policy takes a change at its next round. Every change is
kept in the controller's journal ("t" line, journal.py; with --etcd in the shared store, so
a new leader has it): a restart or failover keeps the live changes. The file is the
start-up default: a journal whose record was made from another version of the file (its
SHA-256 differs) is replaced by the file's tenants.

Limits are checked when a coflow is submitted: max_coflows (active coflows of the tenant)
and max_bytes (bytes still to deliver of its active coflows, as of the last round, plus the
new coflow's WAN bytes); a submit beyond either is refused with code "tenant_limit".
"""

from __future__ import annotations

import hashlib
import logging
import math
import time

from terra_controller.coflow_state import RegistryError, parse_coflow_key
from terra_controller.reservations import live_reservations, reserved_now
from terra_controller.tenants_config import (
    DefaultTenant,
    TenantLimits,
    TenantsError,
    TenantsFile,
    as_dict,
    make_limits,
)

LOG = logging.getLogger("terra.tenants")


class TenantBook:
    """The tenants of a running controller (module docstring).

    Args:
        config: the checked tenants file.
        source: the file's bytes (their SHA-256 tells whether the journal's record was
            made from this version of the file).

    Attributes:
        limits: {tenant: TenantLimits}, in the file's order (new tenants last).
        default: the DefaultTenant. sharing: tenant_shares' sharing name. order: the Γ
            order inside each share (tenant_shares.ORDERS).
        owners: {job name: tenant} as their certificates said.
        coflows: {policy coflow key: tenant} of the coflows in the policy.
        in_flight: {policy coflow key: bytes still to deliver} (as of the last round).
        version: changes of `limits` so far (the policy compares it with what it applied).
        guarantee, achieved: the optimal isolation guarantee μ* of the last round and the
            one the rates reached (tenant_shares; None when fewer than two tenants were
            active).
        progress: {tenant: its weighted progress P_t/s_t} in that round (empty then).
        cct: a prometheus Histogram of finished coflows' CCTs (seconds) labelled by
            tenant (`attach_tenants` makes it; None before).
        controller: the Controller, once attached (`attach_tenants`).
        topology, k: the WAN and tunnels per pair reservations are admitted on
            (reservations.py; None: the controller's, 4).
        failures: the single link failures the admitted reservations were checked under
            ({"covered", "uncovered"}; reservations.admit), None before any check.
        where: the tenants file's name (for messages).
    """

    def __init__(self, config: TenantsFile, source: bytes = b"") -> None:
        self.limits: dict[str, TenantLimits] = dict(config.tenants)
        self.default: DefaultTenant = config.default
        self.sharing = config.sharing
        self.order = config.order
        self.digest = hashlib.sha256(source).hexdigest()
        self.owners: dict[str, str] = {}
        self.coflows: dict[str, str] = {}
        self.in_flight: dict[str, float] = {}
        self.version = 0
        self.guarantee: float | None = None
        self.achieved: float | None = None
        self.progress: dict[str, float] = {}
        self.cct = None
        self.controller = None
        self.topology = None
        self.k: int | None = None
        self.failures: dict | None = None
        self.where = "tenants"

    def on_loop(self, fn, *args):
        """`fn(*args)` on the controller's loop, the book's one owner (at once for a book
        no controller holds yet); for callers in other threads."""
        controller = self.controller
        return fn(*args) if controller is None else controller.owner.run(fn, *args)

    # ---- whose coflow -------------------------------------------------------------------

    def weights(self) -> dict[str, float]:
        """{tenant: weight}, in order."""
        return {t: lim.weight for t, lim in self.limits.items()}

    def reserve_cap(self, name: str) -> float | None:
        """Tenant `name`'s max_reserved_bytes_per_s (None: none, or no such tenant)."""
        lim = self.limits.get(name)
        return None if lim is None else lim.max_reserved_bytes_per_s

    def fallback(self) -> str:
        """The tenant of in-process submits: the default's, else the first listed."""
        if self.default.action == "map" and self.default.tenant in self.limits:
            return self.default.tenant
        return next(iter(self.limits))

    def resolve(self, tenant: str) -> str:
        """The tenant a job of certificate tenant `tenant` is scheduled in.

        Raises:
            RegistryError("unknown_tenant"): not listed, and the default refuses.
        """
        if tenant in self.limits:
            return tenant
        if self.default.action == "map" and self.default.tenant in self.limits:
            return self.default.tenant
        raise RegistryError("unknown_tenant", f"tenant {tenant!r} is not served here")

    def learn(self, identity) -> str:
        """The tenant of a submitting client (`resolve` of its certificate's tenant; the
        fallback for insecure clients), remembered for its name (journaled when new).

        Raises:
            RegistryError("unknown_tenant"): as resolve.
        """
        if identity.insecure:
            return self.fallback()
        tenant = self.resolve(identity.tenant)
        known = self.owners.get(identity.name)
        self.owners[identity.name] = tenant
        if known != tenant:
            self.save()
        return tenant

    def owner_tenant(self, owner: str | None) -> str:
        """The tenant of a coflow of `owner` (None: in-process): the one its certificate
        gave when still listed, else the default's or the first listed."""
        tenant = self.owners.get(owner) if owner is not None else None
        if tenant in self.limits:
            return tenant
        if owner is not None and owner in self.limits and owner not in self.owners:
            return owner
        return self.fallback()

    def admit(self, key: str, owner: str | None, wan_bytes: float) -> str:
        """Check the tenant's limits for a new coflow `key` of `owner` with `wan_bytes`
        bytes on the WAN, and note its tenant.

        Raises:
            RegistryError("tenant_limit"): max_coflows or max_bytes would be exceeded.
        """
        tenant = self.owner_tenant(owner)
        lim = self.limits[tenant]
        mine = [k for k, t in self.coflows.items() if t == tenant and k != key]
        if lim.max_coflows is not None and len(mine) >= lim.max_coflows:
            raise RegistryError(
                "tenant_limit", f"tenant {tenant!r} has {len(mine)} active coflows "
                f"(max_coflows {lim.max_coflows})",
            )  # fmt: skip
        held = sum(self.in_flight.get(k, 0.0) for k in mine)
        if lim.max_bytes is not None and held + wan_bytes > lim.max_bytes:
            raise RegistryError(
                "tenant_limit", f"tenant {tenant!r} would have {held + wan_bytes:.0f} "
                f"bytes in flight (max_bytes {lim.max_bytes})",
            )  # fmt: skip
        self.coflows[key] = tenant
        self.in_flight[key] = float(wan_bytes)
        return tenant

    def tenant_of_coflow(self, coflow_id: int, owner: str | None) -> str:
        """The tenant of a coflow: the policy's while it is active, else its owner's."""
        tenant = self.coflows.get(str(coflow_id))
        return tenant if tenant is not None else self.owner_tenant(owner)

    # ---- live changes -------------------------------------------------------------------

    def set(self, name: object, weight: object, max_coflows=None, max_bytes=None,
            max_reserved_bytes_per_s=None) -> dict:  # fmt: skip
        """Add tenant `name` or change its weight and limits (`ctl tenant set`); journaled;
        the policy takes it at its next round. Its reservations stay (`ctl tenant
        unreserve` drops them).

        Returns:
            the tenant's row (`rows`).

        Raises:
            RegistryError("bad_request"): a bad name or value, or a reservation cap below
                what its reservations hold; nothing changed.
        """
        known = isinstance(name, str) and name in self.limits
        held = self.limits[name].reservations if known else []
        try:
            limits = make_limits(name, weight, max_coflows, max_bytes, list(held),
                                 max_reserved_bytes_per_s)  # fmt: skip
        except TenantsError as exc:
            raise RegistryError("bad_request", str(exc)) from None
        clash = [t for t in self.limits if t.lower() == name.lower() and t != name]
        if clash:
            raise RegistryError("bad_request", f"tenant {name!r} clashes with {clash[0]!r}")
        self.limits[name] = limits
        self.version += 1
        self.save(changed=True)
        LOG.info("tenant %s set: %s", name, as_dict(limits))
        return self.row(name)

    def remove(self, name: object) -> None:
        """Drop tenant `name` (`ctl tenant remove`); journaled.

        Raises:
            RegistryError: "unknown_tenant"; "bad_request": the last tenant, the default's
                target, or one with active coflows; nothing changed.
        """
        if not isinstance(name, str) or name not in self.limits:
            raise RegistryError("unknown_tenant", f"no tenant {name!r:.70}")
        if len(self.limits) == 1:
            raise RegistryError("bad_request", f"{name!r} is the only tenant")
        if self.default.action == "map" and self.default.tenant == name:
            raise RegistryError("bad_request", f"{name!r} is the default tenant")
        active = sum(1 for t in self.coflows.values() if t == name)
        if active:
            raise RegistryError("bad_request", f"tenant {name!r} has {active} active coflows")
        del self.limits[name]
        self.version += 1
        self.save(changed=True)
        LOG.info("tenant %s removed", name)

    # ---- journal ------------------------------------------------------------------------

    def record(self) -> dict:
        """The journal's "t" record: the file's digest, tenants, default and owners."""
        return {
            "src": self.digest,
            "tenants": {t: as_dict(lim) for t, lim in self.limits.items()},
            "owners": dict(self.owners),
        }

    def restore(self, record: object) -> bool:
        """Take the tenants of a journaled record made from this file (same digest) and
        its owners (whatever the digest). Returns True when the tenants were taken; a bad
        record is logged and skipped."""
        if not isinstance(record, dict):
            return False
        owners = record.get("owners")
        if isinstance(owners, dict):
            self.owners.update(
                {o: t for o, t in owners.items() if isinstance(o, str) and isinstance(t, str)}
            )  # fmt: skip
        tenants = record.get("tenants")
        if record.get("src") != self.digest or not isinstance(tenants, dict) or not tenants:
            return False
        try:
            limits = {name: make_limits(name, **dict(v)) for name, v in tenants.items()}
        except (TenantsError, TypeError, ValueError) as exc:
            LOG.warning("journaled tenants not used (the file's are): %s", exc)
            return False
        if self.default.action == "map" and self.default.tenant not in limits:
            return False
        self.limits = limits
        self.version += 1
        return True

    def save(self, changed: bool = False) -> None:
        """Journal the record (on the controller's loop); with `changed`, ask for a round and,
        called off the loop, wait for the shared store (on the loop, as a core event,
        `Controller.tenant_change` waits after it)."""
        controller = self.controller
        if controller is None:
            return
        record = self.record()
        controller.owner.run(controller.journal.tenants_set, record)
        if changed:
            controller.want_round()
            if not controller.owner.on_loop and not controller.journal.wait_durable():
                LOG.warning("tenants: not yet in the shared state")

    # ---- views --------------------------------------------------------------------------

    def row(self, name: str, rates: dict[str, float] | None = None) -> dict:
        """One tenant: {"name", "weight", "share" (weight / sum of weights), "max_coflows",
        "max_bytes", "max_reserved_bytes_per_s", "reservations" (as in the tenants file),
        "reserved_bytes_per_s" (the sum of its reservations whose window holds the time
        now), "active_coflows", "bytes_in_flight", "allocated_bytes_per_s", "progress" (its
        weighted progress in the last round with two or more tenants active, else None)}."""
        rates = self.rates() if rates is None else rates
        lim = self.limits[name]
        total = sum(x.weight for x in self.limits.values())
        keys = [k for k, t in self.coflows.items() if t == name]
        return {
            "name": name, "weight": lim.weight, "share": lim.weight / total,
            "max_coflows": lim.max_coflows, "max_bytes": lim.max_bytes,
            "max_reserved_bytes_per_s": lim.max_reserved_bytes_per_s,
            "reservations": as_dict(lim)["reservations"],
            "reserved_bytes_per_s": reserved_now(lim.reservations, time.time()),
            "active_coflows": len(keys),
            "bytes_in_flight": sum(self.in_flight.get(k, 0.0) for k in keys),
            "allocated_bytes_per_s": rates.get(name, 0.0),
            "progress": _finite(self.progress.get(name)),
        }  # fmt: skip

    def rates(self) -> dict[str, float]:
        """{tenant: bytes/s the last round gave its coflows} (the controller's allocation)."""
        allocation = self.controller.allocation if self.controller is not None else {}
        out: dict[str, float] = {}
        for key, flows in allocation.items():
            tenant = self.coflows.get(key)
            if tenant is not None:
                rate = sum(r for lst in flows.values() for _, r in lst)
                out[tenant] = out.get(tenant, 0.0) + rate
        return out

    def view(self) -> dict:
        """REST /tenants and `ctl tenant list`: {"isolation": "tenants", "sharing", "order",
        "default": {"action", "tenant"}, "guarantee", "achieved" (last round; None with
        fewer than two tenants active), "reservation_failures" (`failures`),
        "tenants": [row, ...]}."""
        rates = self.rates()
        names = list(self.limits)
        head = {
            "isolation": "tenants", "sharing": self.sharing, "order": self.order,
            "default": {"action": self.default.action, "tenant": self.default.tenant},
            "guarantee": _finite(self.guarantee), "achieved": _finite(self.achieved),
            "reservation_failures": self.failures,
        }  # fmt: skip
        return head | {"tenants": [self.row(n, rates) for n in names]}


def _finite(x: float | None) -> float | None:
    """`x`, or None when it is None or not finite (JSON has no Infinity: a browser's
    JSON.parse refuses it)."""
    return x if x is not None and math.isfinite(x) else None


class LiveTenantPolicy:
    """A TenantPolicy whose tenants come from a TenantBook (the Policy protocol).

    Args:
        inner: terra_core.tenant_policy.TenantPolicy (made with the book's weights).
        book: the TenantBook.

    Every attribute not defined here is the inner policy's (name, stats, state, paths...).
    """

    def __init__(self, inner, book: TenantBook) -> None:
        self.inner = inner
        self.book = book
        self.applied = -1  # the book's reservations are taken at the first round
        self._guarantees = 0  # rounds with a guarantee before this round's allocate

    def __getattr__(self, attr: str):
        if attr.startswith("__"):
            raise AttributeError(attr)
        return getattr(self.inner, attr)

    def _sync(self) -> None:
        """Give the inner policy the book's tenants and weights if they changed."""
        if self.applied != self.book.version:
            version, weights = self.book.version, self.book.weights()
            try:
                self.inner.set_weights(weights)
            except ValueError as exc:  # a removed tenant's coflows have not left yet
                LOG.warning("tenant change waits: %s", exc)
                return
            self.inner.set_reservations(live_reservations(self.book))
            self.applied = version
            LOG.info("tenant weights now %s", weights)

    def add_coflow(self, coflow, now: float) -> bool:
        """Register `coflow` with its tenant's Terra (the book's, else its owner's)."""
        self._sync()
        book = self.book
        tenant = book.coflows.get(coflow.id)
        if tenant is None:  # entering the policy later (update of an intra-DC coflow)
            owner = None
            if book.controller is not None:
                owner = book.controller.owner_of(parse_coflow_key(coflow.id))[1]
            tenant = book.owner_tenant(owner)
            book.coflows[coflow.id] = tenant
            book.in_flight[coflow.id] = coflow.wan_bytes
        if tenant not in self.inner.spec.weights:  # removed meanwhile: the default's
            tenant = book.fallback()
            book.coflows[coflow.id] = tenant
        self.inner.spec.tenant_of[coflow.id] = tenant
        ok = False
        try:
            ok = self.inner.add_coflow(coflow, now)
        finally:
            if not ok:
                self._forget(coflow.id)
        return ok

    def add_flows(self, coflow_id: str, flows: list, now: float) -> None:
        """As TerraPolicy.add_flows; the coflow's bytes in flight grow."""
        self.inner.add_flows(coflow_id, flows, now)
        extra = sum(f.bytes for f in flows if not f.intra_dc)
        self.book.in_flight[coflow_id] = self.book.in_flight.get(coflow_id, 0.0) + extra

    def remove_coflow(self, coflow_id: str, now: float) -> None:
        """Forget a coflow that left the schedule; a done one's CCT goes to its tenant's
        histogram (`TenantBook.cct`)."""
        self.inner.remove_coflow(coflow_id, now)
        self._observe_cct(coflow_id)
        self._forget(coflow_id)

    def _observe_cct(self, key: str) -> None:
        book = self.book
        tenant = book.coflows.get(key)
        if tenant is None or book.cct is None or book.controller is None:
            return
        try:
            cct = book.controller.registry.get(parse_coflow_key(key)).cct_s
        except (RegistryError, ValueError):
            return  # forgotten already (a cancelled or expired record)
        if cct is not None:
            book.cct.labels(tenant).observe(cct)

    def _forget(self, key: str) -> None:
        self.inner.spec.tenant_of.pop(key, None)
        self.book.coflows.pop(key, None)
        self.book.in_flight.pop(key, None)

    def begin_round(self) -> None:
        """On the controller's loop, before a round's allocate (Controller._round_begin):
        take the book's tenant changes."""
        self._sync()
        self._guarantees = len(self.inner.stats["guarantee"])

    def allocate(self, now: float, remaining):
        """TenantPolicy.allocate (in the round's worker thread: it reads and writes no part
        of the book, whose owner is the controller's loop; `begin_round` and `end_round`
        do, on the loop). Called with no round begun (a caller without a controller), it
        takes the book's changes first and notes the round in the book after."""
        if self.book.controller is None:
            self.begin_round()
            allocation = self.inner.allocate(now, remaining)
            self.end_round(remaining)
            return allocation
        return self.inner.allocate(now, remaining)

    def end_round(self, remaining) -> None:
        """On the controller's loop, once the round's allocate returned
        (Controller._round_end): note every coflow's bytes in flight and the round's
        isolation guarantee in the book."""
        if not remaining:  # (no allocate ran: the last round's figures stay)
            return
        stats, book = self.inner.stats, self.book
        fresh = len(stats["guarantee"]) > self._guarantees
        for key, flows in remaining.items():
            if key in book.in_flight:
                book.in_flight[key] = float(sum(flows.values()))
        book.guarantee = stats["guarantee"][-1] if fresh else None
        book.achieved = stats["achieved"][-1] if fresh else None
        book.progress = dict(self.inner.progress) if fresh else {}


def tenant_admission(controller, coflow, owner: str | None) -> None:
    """Before the policy admits `coflow` (a terra_model Coflow) of `owner`: check its
    tenant's limits and note its tenant (nothing without tenants).

    Raises:
        RegistryError("tenant_limit"): see TenantBook.admit.
    """
    book = getattr(controller, "tenants", None)
    if book is not None:
        book.admit(coflow.id, owner, coflow.wan_bytes)
