"""Guaranteed reservations in the live controller (docs/design.md 4.5; the admission and
enforcement are terra_core/reservations.py).

A tenant's reservations live in its TenantLimits (tenants_config.ReservationSpec: src, dst,
rate_bytes_per_s, ceil_bytes_per_s, start_s / end_s in UNIX seconds), so they are journaled
with the tenants (a restart or a new leader keeps them) and shown by REST /tenants. The
file's are admitted when the controller starts (refused: exit status 2, one line naming the
failure that does not fit); `ctl tenant reserve|unreserve` (operators) and the API
operations `tenant_reserve|tenant_unreserve` (a job: for its own tenant only) add and drop
them live: a request is admitted only if it fits together with every admitted guarantee
(else refused with code "reservation_refused" and the reason), and a bad value changes
nothing. The policy takes a change at its next round, the windows moved onto its clock.
"""

from __future__ import annotations

import logging
import math

import msgspec

from terra_controller.coflow_state import RegistryError
from terra_controller.tenants_config import (
    ReservationSpec,
    TenantLimits,
    TenantsError,
    check_reserved_cap,
    make_spec,
)

LOG = logging.getLogger("terra.tenants")
DEFAULT_K = 4  # tunnels per DC pair when the controller did not say (openflow_app.DEFAULT_K)


def core_reservations(limits: dict[str, TenantLimits], offset: float = 0.0) -> list:
    """The terra_core Reservations of every tenant in `limits`, their windows moved by
    `offset` seconds (window start - offset on the scheduler's clock; None: open)."""
    from terra_core.reservations import Reservation

    out = []
    for tenant, lim in limits.items():
        for s in lim.reservations:
            start = -math.inf if s.start_s is None else s.start_s - offset
            end = math.inf if s.end_s is None else s.end_s - offset
            out.append(Reservation(tenant, s.src, s.dst, float(s.rate_bytes_per_s),
                                   s.ceil_bytes_per_s, start, end))  # fmt: skip
    return out


def admit(limits: dict[str, TenantLimits], topology, k: int) -> dict:
    """Check that every reservation of `limits` fits the WAN (terra_core admission).

    Returns:
        {"covered": ["U-V", ...], "uncovered": {"U-V": "SRC->DST"}}: the single link
        failures checked, and those that cut every tunnel of a reserved pair.

    Raises:
        TenantsError: a reservation names an unknown DC, or the guarantees do not fit
            (one line with the reason).
    """
    from terra_core.reservations import ReservationError, admission

    try:
        found = admission(core_reservations(limits), topology, k)
    except ReservationError as exc:
        raise TenantsError(f"reservation of {exc}") from None
    if not found.ok:
        raise TenantsError(f"reservations refused: {found.reason}")
    return {
        "covered": [f"{u}-{v}" for u, v in found.covered or ()],
        "uncovered": {f"{u}-{v}": pair for (u, v), pair in (found.uncovered or {}).items()},
    }


def check_at_start(book, topology, k: int, p) -> None:
    """Admit the tenants file's reservations against `topology` with `k` tunnels per pair
    (nothing without a book); the book keeps the topology and K for live requests.

    Raises:
        SystemExit(2): they do not fit or name an unknown DC (one line on stderr).
    """
    if book is None:
        return
    book.topology, book.k = topology, k
    if any(lim.reservations for lim in book.limits.values()):
        try:
            book.failures = admit(book.limits, topology, k)
        except TenantsError as exc:
            p.exit(2, f"terra-controller: {book.where}: {exc}\n")


def _context(book):
    topology = book.topology
    if topology is None and book.controller is not None:
        topology = book.controller.topology
    return topology, book.k or DEFAULT_K


def reserve(book, name: object, fields: dict) -> dict:
    """Add a reservation for tenant `name` if it fits with every admitted one; journaled.

    Args:
        fields: {"src", "dst", "rate_bytes_per_s", "ceil_bytes_per_s"?, "start_s"?,
            "end_s"?} (tenants_config.ReservationSpec).

    Returns:
        the tenant's row (TenantBook.row).

    Raises:
        RegistryError: "unknown_tenant"; "bad_request" (a bad value);
            "reservation_refused" (it does not fit, or the tenant's reservations would
            exceed its max_reserved_bytes_per_s: the reason). Nothing changed then.
    """
    try:
        spec = make_spec(fields)
    except TenantsError as exc:
        raise RegistryError("bad_request", str(exc)) from None
    if not isinstance(name, str) or name not in book.limits:
        raise RegistryError("unknown_tenant", f"no tenant {name!r:.70}")
    lim = book.limits[name]
    trial = dict(book.limits)
    trial[name] = _with(lim, [*lim.reservations, spec])
    topology, k = _context(book)
    try:
        check_reserved_cap(f"tenant {name}", trial[name])
        failures = admit(trial, topology, k)
    except TenantsError as exc:
        code = "bad_request" if "unknown DC" in str(exc) else "reservation_refused"
        # over the tenant's max_reserved_bytes_per_s, or not fitting the WAN
        raise RegistryError(code, str(exc)) from None
    book.limits, book.failures = trial, failures
    book.version += 1
    book.save(changed=True)
    LOG.info("tenant %s reserved %s", name, fields)
    return book.row(name)


def unreserve(book, name: object, src: object, dst: object) -> dict:
    """Drop tenant `name`'s reservations from `src` to `dst`; journaled.

    Raises:
        RegistryError: "unknown_tenant"; "bad_request": it has none on that pair.
    """
    if not isinstance(name, str) or name not in book.limits:
        raise RegistryError("unknown_tenant", f"no tenant {name!r:.70}")
    lim = book.limits[name]
    kept = [s for s in lim.reservations if (s.src, s.dst) != (src, dst)]
    if len(kept) == len(lim.reservations):
        raise RegistryError("bad_request", f"tenant {name!r} has no reservation "
                            f"from {src!r:.40} to {dst!r:.40}")  # fmt: skip
    book.limits = dict(book.limits) | {name: _with(lim, kept)}
    book.version += 1
    book.failures = None
    if any(x.reservations for x in book.limits.values()):
        try:  # fewer guarantees still fit: only the failure lists can change
            book.failures = admit(book.limits, *_context(book))
        except TenantsError as exc:  # e.g. the topology changed since: keep going
            LOG.warning("reservations after unreserve: %s", exc)
    book.save(changed=True)
    LOG.info("tenant %s unreserved %s->%s", name, src, dst)
    return book.row(name)


def _with(lim: TenantLimits, specs: list[ReservationSpec]) -> TenantLimits:
    return msgspec.structs.replace(lim, reservations=specs)


def reserved_now(specs: list[ReservationSpec], now: float) -> float:
    """The sum of the guaranteed rates (bytes/s) of `specs` whose window holds `now`
    (UNIX seconds)."""
    return sum(
        s.rate_bytes_per_s
        for s in specs
        if (s.start_s is None or s.start_s <= now) and (s.end_s is None or now < s.end_s)
    )


def live_reservations(book) -> list:
    """The book's reservations with windows on the controller's round clock (seconds since
    it started: UNIX time minus the clock's offset), for TenantPolicy.set_reservations."""
    controller = book.controller
    offset = controller.wall_offset if controller is not None else 0.0
    return core_reservations(book.limits, offset)
