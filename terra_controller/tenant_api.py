"""Tenants through the coflow API, REST and metrics (terra_controller/tenants.py).

API operations (request fields -> reply fields; api_server.py's wire format):

    tenant         name?                    -> tenant: the row (TenantBook.row) of the
                                               caller's own tenant (a job; `name` left out
                                               or its own, else "forbidden") or of `name`
                                               (an operator: required)
    tenants                                 -> TenantBook.view (operators)
    tenant_set     name, weight,            -> tenant: the row after the change (operators;
                   max_coflows?, max_bytes?,   a bad value changes nothing; a limit left
                   max_reserved_bytes_per_s?   out keeps the tenant's current value, one
                                               given as nil clears it)
    tenant_remove  name                     -> removed: name (operators)
    tenant_reserve name?, src, dst,         -> tenant: the row after the change; refused
                   rate_bytes_per_s,           with code "reservation_refused" and the
                   ceil_bytes_per_s?,          reason when it does not fit with every
                   start_s?, end_s?            admitted guarantee or exceeds the tenant's
                                               max_reserved_bytes_per_s (reservations.py;
                                               a job: for its own tenant, `name` left out
                                               or its own, and only when the tenant has a
                                               max_reserved_bytes_per_s: else "forbidden";
                                               an operator: `name` required)
    tenant_unreserve name?, src, dst        -> tenant: the row (its reservations on the
                                               pair dropped; `name` as for tenant_reserve)

An insecure client (`--insecure`: every role) that leaves out `name` gets the default
tenant (TenantBook.fallback).

A controller without tenants (--isolation none) answers code "no_tenants". Metrics (read
at scrape time, label `tenant`: one series per configured tenant, so the label's values are
bounded by the tenants file and `ctl tenant set`):

    terra_tenant_weight{tenant}                   the tenant's weight
    terra_tenant_active_coflows{tenant}           its coflows in the policy
    terra_tenant_allocated_bytes_per_second{tenant}  the last round's rates of its coflows
    terra_tenant_reserved_bytes_per_second{tenant}   its guaranteed rates in force now
    terra_tenant_isolation_guarantee              the last round's optimal isolation
                                                  guarantee μ* (absent with fewer than two
                                                  tenants active)
    terra_tenant_isolation_achieved               the isolation guarantee the rates reached
    terra_tenant_progress{tenant}                 the tenant's weighted progress P_t/s_t in
                                                  that round (its own isolation guarantee;
                                                  the minimum over tenants is the one above)
    terra_tenant_cct_seconds{tenant}              histogram of its finished coflows' CCTs
                                                  (tenants.LiveTenantPolicy)
"""

from __future__ import annotations

import math

from prometheus_client.core import GaugeMetricFamily

from terra_controller.coflow_state import RegistryError
from terra_security.pki import Identity, Role


def book_of(controller):
    """The controller's TenantBook.

    Raises:
        RegistryError("no_tenants"): the controller runs without tenants.
    """
    book = getattr(controller, "tenants", None)
    if book is None:
        raise RegistryError("no_tenants", "this controller runs without tenants (--isolation none)")
    return book


def _only(request: dict, fields: set[str]) -> None:
    unknown = set(request) - fields - {"v", "op", "req", "ref"}
    if unknown:
        raise RegistryError("bad_request", f"unknown fields {sorted(map(str, unknown))}")


def op_tenant(handler, request: dict, identity: Identity) -> dict:
    """ "tenant": the caller's own tenant's row (jobs), or `name`'s (operators)."""
    _only(request, {"name"})
    book = book_of(handler.controller)
    return handler.controller.owner.run(_tenant_row, book, request, identity)


def _tenant_row(book, request: dict, identity: Identity) -> dict:
    """op_tenant's answer, on the controller's loop (the book's owner).

    Raises:
        RegistryError: "forbidden" (a job names another tenant than its own),
            "unknown_tenant", "bad_request" (an operator without `name`).
    """
    if identity.role is Role.JOB and not identity.insecure:
        name = book.resolve(identity.tenant)  # a job sees its own tenant only
        if request.get("name", name) not in (name, identity.tenant):
            raise RegistryError("forbidden", "a job sees its own tenant only")
    elif "name" in request:
        name = request["name"]
        if name not in book.weights():
            raise RegistryError("unknown_tenant", f"no tenant {name!r:.70}")
    elif identity.insecure:
        name = book.fallback()
    else:
        raise RegistryError("bad_request", "an operator names the tenant (tenant show NAME)")
    return {"tenant": book.row(name)}


def op_tenants(handler, request: dict, identity: Identity) -> dict:
    """ "tenants": TenantBook.view."""
    _only(request, set())
    return handler.controller.owner.run(book_of(handler.controller).view)


SET_LIMITS = ("max_coflows", "max_bytes", "max_reserved_bytes_per_s")


def op_tenant_set(handler, request: dict, identity: Identity) -> dict:
    """ "tenant_set": add or change a tenant; the limits it leaves out keep their values."""
    _only(request, {"name", "weight", *SET_LIMITS})
    given = [k for k in SET_LIMITS if k in request]
    args = [request.get(k) for k in ("name", "weight", *SET_LIMITS)] + [given]
    return {"tenant": handler.controller.tenant_change("set", args)}


def set_args(book, args: list) -> list:
    """The arguments of TenantBook.set for a "set" change [name, weight, max_coflows,
    max_bytes, max_reserved_bytes_per_s, given?]: with `given` (the limits the request
    named), the limits it left out are the tenant's current ones (none for a new tenant);
    without it (changes journaled before `given`), every limit as in `args`.

    Raises:
        RegistryError("bad_request"): `given` is not a list of limit names.
    """
    if len(args) != 6:
        return list(args)
    *values, given = args
    if not isinstance(given, list) or not set(given) <= set(SET_LIMITS):
        raise RegistryError("bad_request", f"bad limits given {given!r:.70}")
    name = values[0]
    current = book.limits.get(name) if isinstance(name, str) else None
    if current is not None:
        for i, key in enumerate(SET_LIMITS, 2):
            if key not in given:
                values[i] = getattr(current, key)
    return values


def op_tenant_remove(handler, request: dict, identity: Identity) -> dict:
    """ "tenant_remove": drop a tenant without active coflows."""
    _only(request, {"name"})
    handler.controller.tenant_change("remove", [request.get("name")])
    return {"removed": request.get("name")}


def _reserving_for(book, request: dict, identity: Identity) -> object:
    """The tenant a reserve or unreserve request is for: a job's own, else the operator's
    `name` (an insecure client without one: the default tenant).

    Raises:
        RegistryError: "forbidden" (a job names another tenant), "bad_request" (an
            operator without `name`).
    """
    if identity.role is Role.JOB and not identity.insecure:
        own = book.resolve(identity.tenant)
        if request.get("name", own) != own:
            raise RegistryError("forbidden", "a job reserves for its own tenant only")
        return own
    if "name" in request:
        return request["name"]
    if identity.insecure:
        return book.fallback()
    op = "reserve" if request.get("op") == "tenant_reserve" else "unreserve"
    raise RegistryError("bad_request", f"an operator names the tenant (tenant {op} NAME)")


def op_tenant_reserve(handler, request: dict, identity: Identity) -> dict:
    """ "tenant_reserve": add a guaranteed rate if it fits (reservations.reserve)."""
    keys = {"src", "dst", "rate_bytes_per_s", "ceil_bytes_per_s", "start_s", "end_s"}
    _only(request, keys | {"name"})
    book = book_of(handler.controller)
    name, cap = handler.controller.owner.run(
        lambda: (n := _reserving_for(book, request, identity), book.reserve_cap(n))
    )
    if identity.role is Role.JOB and not identity.insecure and cap is None:
        raise RegistryError("forbidden", f"tenant {name!r} has no max_reserved_bytes_per_s: "
                            "only an operator reserves for it")  # fmt: skip
    fields = {k: v for k, v in request.items() if k in keys}
    return {"tenant": handler.controller.tenant_change("reserve", [name, fields])}


def op_tenant_unreserve(handler, request: dict, identity: Identity) -> dict:
    """ "tenant_unreserve": drop the tenant's reservations on a pair."""
    _only(request, {"name", "src", "dst"})
    book = book_of(handler.controller)
    name = handler.controller.owner.run(_reserving_for, book, request, identity)
    args = [name, request.get("src"), request.get("dst")]
    return {"tenant": handler.controller.tenant_change("unreserve", args)}


def apply_tenant_change(controller, op: str, args: list) -> object:
    """Carry out a tenant change on the controller's TenantBook (on its loop: the core event
    "tenant", Controller.tenant_change): "set" [name, weight, max_coflows, max_bytes,
    max_reserved_bytes_per_s, given?] (set_args), "remove" [name], "reserve" [name,
    fields], "unreserve" [name, src, dst]. Returns the tenant's row (None for "remove").

    Raises:
        RegistryError: "no_tenants" (book_of); as set_args, TenantBook.set / remove,
            reservations.reserve / unreserve.
        ValueError: an unknown `op`.
    """
    from terra_controller.reservations import reserve, unreserve

    book = book_of(controller)

    if op == "set":
        return book.set(*set_args(book, args))
    if op == "remove":
        return book.remove(*args)
    if op == "reserve":
        return reserve(book, *args)
    if op == "unreserve":
        return unreserve(book, *args)
    raise ValueError(f"unknown tenant change {op!r}")


TENANT_OPS = {
    "tenant": op_tenant,
    "tenants": op_tenants,
    "tenant_set": op_tenant_set,
    "tenant_remove": op_tenant_remove,
    "tenant_reserve": op_tenant_reserve,
    "tenant_unreserve": op_tenant_unreserve,
}
TENANT_ROLES = {
    "tenant": (Role.JOB, Role.OPERATOR),
    "tenants": (Role.OPERATOR,),
    "tenant_set": (Role.OPERATOR,),
    "tenant_remove": (Role.OPERATOR,),
    "tenant_reserve": (Role.JOB, Role.OPERATOR),
    "tenant_unreserve": (Role.JOB, Role.OPERATOR),
}


def submit_tenant(controller, identity: Identity) -> None:
    """Before a submit: refuse a client whose tenant is not served (nothing without
    tenants); remember its tenant for its name.

    Raises:
        RegistryError("unknown_tenant").
    """
    book = getattr(controller, "tenants", None)
    if book is not None:
        controller.owner.run(book.learn, identity)


def with_tenant(controller, status: dict) -> dict:
    """`status` (a coflow's status map) with its "tenant" (None without tenants)."""
    book = getattr(controller, "tenants", None)
    tenant = None
    if book is not None:
        owner = controller.owner_of(status["id"])[1]
        tenant = controller.owner.run(book.tenant_of_coflow, status["id"], owner)
    status["tenant"] = tenant
    return status


def rest_view(controller) -> dict:
    """REST /tenants: TenantBook.view, or {"isolation": "none", "tenants": []}."""
    book = getattr(controller, "tenants", None)
    if book is None:
        return {"isolation": "none", "tenants": []}
    return controller.owner.run(book.view)


class TenantCollector:
    """Prometheus collector of the tenant metrics (module docstring), read at scrape time."""

    def __init__(self, book) -> None:
        self.book = book

    def describe(self):
        """Nothing: collected at scrape time only."""
        return []

    def collect(self):
        """One series per configured tenant, and the last round's guarantee."""
        book = self.book
        view, progress_now = book.on_loop(lambda: (book.view(), dict(book.progress)))
        families = {
            "weight": GaugeMetricFamily(
                "terra_tenant_weight", "The tenant's weight", labels=["tenant"]
            ),
            "active_coflows": GaugeMetricFamily(
                "terra_tenant_active_coflows", "The tenant's coflows in the policy",
                labels=["tenant"],
            ),
            "allocated_bytes_per_s": GaugeMetricFamily(
                "terra_tenant_allocated_bytes_per_second",
                "Rates the last round gave the tenant's coflows (bytes/s)", labels=["tenant"],
            ),
            "reserved_bytes_per_s": GaugeMetricFamily(
                "terra_tenant_reserved_bytes_per_second",
                "The tenant's guaranteed rates in force now (bytes/s)", labels=["tenant"],
            ),
        }  # fmt: skip
        for row in view["tenants"]:
            for key, family in families.items():
                family.add_metric([row["name"]], float(row[key]))
        yield from families.values()
        for key, text in (
            ("guarantee", "Optimal isolation guarantee of the last round"),
            ("achieved", "Isolation guarantee the last round's rates reached"),
        ):
            if view[key] is not None:
                yield GaugeMetricFamily(f"terra_tenant_isolation_{key}", text,
                                        value=float(view[key]))  # fmt: skip
        progress = GaugeMetricFamily(
            "terra_tenant_progress",
            "The tenant's weighted progress P_t/s_t in the last round with two or more "
            "tenants active (its isolation guarantee)", labels=["tenant"],
        )  # fmt: skip
        for tenant, value in sorted(progress_now.items()):
            if math.isfinite(value):
                progress.add_metric([tenant], float(value))
        yield progress
