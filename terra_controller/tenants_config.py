"""The tenants file of `terra-controller --tenants FILE` (docs/design.md section 4.5).

A TOML file (read with tomllib) checked against msgspec Structs that forbid unknown keys:

    sharing = "cooperative"        # optional: cooperative (default), strict or static
                                   # (terra_core/tenant_shares.SHARINGS)
    order = "wan"                  # optional: each tenant's coflows in order of Γ on the
                                   # whole WAN (default) or on its share, "share"
                                   # (terra_core/tenant_shares.ORDERS)

    [default]                      # optional: what a job of a tenant not listed gets
    action = "refuse"              # "refuse" (the default: error code unknown_tenant)
                                   # or "map" (its coflows go to `tenant`)
    tenant = "batch"               # with action = "map": a tenant listed below

    [tenants.analytics]            # one table per tenant; the name as in job certificates
    weight = 3                     # > 0 (its share of a contended link: weight / sum)
    max_coflows = 100              # optional: active coflows at most (> 0)
    max_bytes = 1_000_000_000_000  # optional: bytes not yet delivered of its active
                                   # coflows, the new one's included, at most (> 0)
    max_reserved_bytes_per_s = 1e8 # optional: its guarantees in force at once add up to
                                   # at most this (> 0); a job may reserve for its own
                                   # tenant only when this is set

    [[tenants.analytics.reservations]]  # optional, any number: a guaranteed rate
    src = "HK"                     # between two DCs (docs/design.md 4.5)
    dst = "NY"
    rate_bytes_per_s = 50_000_000  # the guarantee (> 0)
    ceil_bytes_per_s = 80_000_000  # optional: its traffic on the pair at most (>= rate)
    start_s = 1_790_000_000        # optional window [start_s, end_s): UNIX seconds in the
    end_s = 1_790_003_600          # controller, simulated seconds in terra-sim

    [tenants.batch]
    weight = 1

max_coflows and max_bytes are integers of at most 2**63-1 (MAX_LIMIT), what the API's
replies and the journal carry.

Whether the guarantees fit the WAN (under every single link failure the tunnels route
around) is checked against the topology when the controller or terra-sim starts
(terra_controller/reservations.py).

Every problem is one line naming it and, where the file says it, its line: `tenants.toml:
line 7: tenants.analytics.wieght: unknown key`. New per-tenant settings are new optional
fields of `TenantLimits`, so files written for this version stay valid.
"""

from __future__ import annotations

import math
import re
import tomllib
from pathlib import Path
from typing import Annotated, Literal

import msgspec

from terra_model.reservation_shape import shape_problem
from terra_security.pki import NAME_RE

# terra_core.tenant_shares.SHARINGS and ORDERS, not imported here: that module loads the
# solver (numpy, HiGHS), which the controller imports only after it listens (tests check the
# two agree)
Sharing = Literal["cooperative", "strict", "static"]
Order = Literal["share", "wan"]

# The largest max_coflows / max_bytes: a signed 64-bit integer, so that every reply carrying
# the tenant's row (msgpack, at most 2**64-1) and the journal can hold it.
MAX_LIMIT = 2**63 - 1


class TenantsError(ValueError):
    """A tenants file or a tenant change is invalid; the message is one line."""


class ReservationSpec(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """A guaranteed rate between two DCs (terra_core/reservations.py).

    Attributes:
        src, dst: DC names (checked against the topology at start).
        rate_bytes_per_s: the guarantee (> 0, finite).
        ceil_bytes_per_s: its traffic on the pair at most (>= the rate; None: no ceiling).
        start_s, end_s: the window [start_s, end_s), seconds on the scheduler's clock
            (UNIX time in the controller; None: open).
    """

    src: str
    dst: str
    rate_bytes_per_s: Annotated[float, msgspec.Meta(gt=0)]
    ceil_bytes_per_s: Annotated[float, msgspec.Meta(gt=0)] | None = None
    start_s: float | None = None
    end_s: float | None = None


class TenantLimits(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """One tenant's settings.

    Attributes:
        weight: its weight (> 0, finite; dimensionless).
        max_coflows: active coflows at most (at most MAX_LIMIT; None: no limit).
        max_bytes: bytes still to deliver of its active coflows at most (at most MAX_LIMIT;
            None: no limit).
        max_reserved_bytes_per_s: the sum of its guaranteed rates whose windows overlap at
            most (bytes/s; None: no cap for operators, and jobs may not reserve).
        reservations: its guaranteed rates (ReservationSpec), admitted together.
    """

    weight: Annotated[float, msgspec.Meta(gt=0)]
    max_coflows: Annotated[int, msgspec.Meta(gt=0, le=MAX_LIMIT)] | None = None
    max_bytes: Annotated[int, msgspec.Meta(gt=0, le=MAX_LIMIT)] | None = None
    max_reserved_bytes_per_s: Annotated[float, msgspec.Meta(gt=0)] | None = None
    reservations: list[ReservationSpec] = msgspec.field(default_factory=list)


class DefaultTenant(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """What a job of an unlisted tenant gets: "refuse", or "map" to `tenant`."""

    action: Literal["refuse", "map"] = "refuse"
    tenant: str | None = None


class TenantsFile(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """The whole file (module docstring): tenants in file order, the default, the sharing,
    the order inside each share."""

    tenants: dict[str, TenantLimits]
    default: DefaultTenant = msgspec.field(default_factory=DefaultTenant)
    sharing: Sharing = "cooperative"
    order: Order = "wan"


def load_tenants(path: str | Path) -> TenantsFile:
    """Read and check the tenants file `path`.

    Raises:
        TenantsError: the file cannot be read, is not TOML, or breaks the schema (module
            docstring): one line "FILE: line N: WHAT" (no line when it cannot be told).
    """
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise TenantsError(f"{path}: cannot read: {exc}") from None
    return parse_tenants(text, str(path))


def parse_tenants(text: str, where: str = "tenants") -> TenantsFile:
    """`load_tenants` of the file's text; `where` names it in messages.

    Raises:
        TenantsError: as load_tenants.
    """
    first = _duplicate(text)
    if first is not None:
        raise TenantsError(f"{where}: {first}")
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise TenantsError(f"{where}: not TOML: {exc}") from None
    tenants = data.get("tenants")
    if not isinstance(tenants, dict):
        why = "missing: at least one [tenants.NAME] table" if tenants is None else "not a table"
        raise TenantsError(f"{where}: tenants: {why}")
    try:
        config = msgspec.convert(dict(data, tenants={}), TenantsFile)
    except msgspec.ValidationError as exc:
        raise TenantsError(f"{where}: {_located(str(exc), text, [])}") from None
    for name, limits in tenants.items():  # one by one: msgspec does not name dict keys
        try:
            config.tenants[name] = msgspec.convert(limits, TenantLimits)
        except msgspec.ValidationError as exc:
            located = _located(str(exc), text, ["tenants", name])
            raise TenantsError(f"{where}: {located}") from None
    try:
        check_config(config)
    except TenantsError as exc:
        key = str(exc).split(":", 1)[0]
        line = _line_of(text, key.split("."))
        raise TenantsError(f"{where}: {'' if line is None else f'line {line}: '}{exc}") from None
    return config


def check_config(config: TenantsFile) -> None:
    """What the schema cannot say: tenant names, finite weights, names unique whatever
    their letter case, at least one tenant, and a default that names a listed tenant.

    Raises:
        TenantsError: "KEY: problem" (KEY as dotted path, e.g. tenants.a.weight).
    """
    if not config.tenants:
        raise TenantsError("tenants: at least one tenant is needed")
    seen: dict[str, str] = {}
    for name, limits in config.tenants.items():
        if not NAME_RE.match(name):
            raise TenantsError(
                f"tenants.{name}: bad tenant name: 1-64 characters of A-Z a-z 0-9 . _ -"
            )
        if name.lower() in seen:
            raise TenantsError(f"tenants.{name}: duplicate tenant (as {seen[name.lower()]!r})")
        seen[name.lower()] = name
        check_limits(name, limits)
    d = config.default
    if d.action == "map" and d.tenant not in config.tenants:
        raise TenantsError(f"default.tenant: action map needs a listed tenant, got {d.tenant!r}")
    if d.action == "refuse" and d.tenant is not None:
        raise TenantsError('default.tenant: only with action = "map"')


def check_limits(name: str, limits: TenantLimits) -> None:
    """Raise TenantsError "tenants.NAME.weight: ..." for a weight that is not finite,
    "tenants.NAME.reservations[i].KEY: ..." for a reservation that cannot be (check_spec),
    or "tenants.NAME.max_reserved_bytes_per_s: ..." for a cap that is not finite or that
    its reservations exceed (check_reserved_cap)."""
    if not math.isfinite(limits.weight):
        raise TenantsError(f"tenants.{name}.weight: must be a finite number > 0")
    for i, spec in enumerate(limits.reservations):
        check_spec(f"tenants.{name}.reservations[{i}]", spec)
    check_reserved_cap(f"tenants.{name}", limits)


def check_reserved_cap(where: str, limits: TenantLimits) -> None:
    """Raise TenantsError "WHERE.max_reserved_bytes_per_s: ..." when the cap is not finite
    or the peak of the tenant's reservations (`peak_reserved`) is above it."""
    cap = limits.max_reserved_bytes_per_s
    if cap is None:
        return
    if not math.isfinite(cap):
        raise TenantsError(f"{where}.max_reserved_bytes_per_s: must be a finite number > 0")
    peak = peak_reserved(limits.reservations)
    if peak > cap:
        raise TenantsError(f"{where}.max_reserved_bytes_per_s: its reservations hold "
                           f"{peak:.6g} B/s at once, more than {cap:.6g}")  # fmt: skip


def peak_reserved(specs: list[ReservationSpec]) -> float:
    """The largest sum of guaranteed rates (bytes/s) of `specs` whose windows [start_s,
    end_s) hold one instant (None: open); 0.0 for none. The sum can only rise at a window's
    start, so those are the instants checked (O(n^2) for n reservations)."""
    windows = [
        (-math.inf if r.start_s is None else r.start_s,
         math.inf if r.end_s is None else r.end_s, r.rate_bytes_per_s)
        for r in specs
    ]  # fmt: skip
    return max(
        (sum(rate for start, end, rate in windows if start <= t < end) for t, _, _ in windows),
        default=0.0,
    )


def check_spec(where: str, spec: ReservationSpec) -> None:
    """Raise TenantsError "WHERE.KEY: problem" for a start or end that is not finite, or a
    shape reservation_shape.shape_problem refuses (src == dst, a rate or ceiling that is not
    finite, a ceiling below the rate, a window that ends before it starts)."""
    for key in ("start_s", "end_s"):
        value = getattr(spec, key)
        if value is not None and not math.isfinite(value):
            raise TenantsError(f"{where}.{key}: must be a finite number")
    problem = shape_problem(spec.src, spec.dst, spec.rate_bytes_per_s, spec.ceil_bytes_per_s,
                            spec.start_s, spec.end_s)  # fmt: skip
    if problem is not None:
        raise TenantsError(f"{where}.{problem[0]}: {problem[1]}")


def make_limits(
    name: str,
    weight: object,
    max_coflows: object = None,
    max_bytes: object = None,
    reservations: object = (),
    max_reserved_bytes_per_s: object = None,
) -> TenantLimits:
    """A checked TenantLimits for a live change (`ctl tenant set`) or a journaled record
    (`reservations`: ReservationSpec dicts or structs).

    Raises:
        TenantsError: a bad name or value (one line naming it).
    """
    if not isinstance(name, str) or not NAME_RE.match(name):
        raise TenantsError(f"bad tenant name {name!r:.70}: 1-64 characters of A-Z a-z 0-9 . _ -")
    fields = {"weight": weight, "max_coflows": max_coflows, "max_bytes": max_bytes,
              "max_reserved_bytes_per_s": max_reserved_bytes_per_s,
              "reservations": msgspec.to_builtins(reservations)}  # fmt: skip
    try:
        limits = msgspec.convert(fields, TenantLimits)
    except msgspec.ValidationError as exc:
        raise TenantsError(f"tenant {name}: {_located(str(exc), '', [])}") from None
    check_limits(name, limits)
    return limits


def as_dict(limits: TenantLimits) -> dict:
    """{"weight", "max_coflows", "max_bytes", "max_reserved_bytes_per_s", "reservations":
    [{"src", "dst", "rate_bytes_per_s", "ceil_bytes_per_s", "start_s", "end_s"}, ...]}
    (None where no limit), plain data for the journal and the views."""
    return msgspec.to_builtins(limits)


def make_spec(fields: dict) -> ReservationSpec:
    """A checked ReservationSpec of a live request's fields (`ctl tenant reserve`).

    Raises:
        TenantsError: a missing, unknown or bad field (one line naming it).
    """
    try:
        spec = msgspec.convert(fields, ReservationSpec)
    except msgspec.ValidationError as exc:
        raise TenantsError(f"reservation: {_located(str(exc), '', [])}") from None
    check_spec("reservation", spec)
    return spec


# ---- messages with their lines -------------------------------------------------------------

_HEADER = re.compile(r"^\s*\[\s*tenants\s*\.\s*(\"[^\"]*\"|'[^']*'|[A-Za-z0-9_-]+)\s*\]")
_AT = re.compile(r"^(?P<what>.*?) - at `\$(?P<path>[^`]*)`$")


def _duplicate(text: str) -> str | None:
    """ "line N: duplicate tenant 'X' (first at line M)" for a [tenants.X] table declared
    twice (names compared whatever their letter case), else None."""
    first: dict[str, int] = {}
    for number, line in enumerate(text.splitlines(), 1):
        m = _HEADER.match(line)
        if m is None:
            continue
        name = m.group(1).strip("\"'")
        if name.lower() in first:
            return f"line {number}: duplicate tenant {name!r} (first at line {first[name.lower()]})"
        first[name.lower()] = number
    return None


def _located(message: str, text: str, base: list[str]) -> str:
    """A msgspec ValidationError message as "line N: KEY: what" (the key's line found in
    `text` where it can be); `base` is the path of the value converted ([] for the file)."""
    m = _AT.match(message)
    what, where = (message, "") if m is None else (m.group("what"), m.group("path"))
    path = base + [p for p in re.split(r"\.|\[|\]", where) if p and p != "..."]
    unknown = re.match(r"Object contains unknown field `([^`]*)`", what)
    if unknown:
        path.append(unknown.group(1))
        what = "unknown key"
    missing = re.match(r"Object missing required field `([^`]*)`", what)
    if missing:
        path.append(missing.group(1))
        what = "missing"
    line = _line_of(text, path)
    key = re.sub(r"\.(\d+)(?=\.|$)", r"[\1]", ".".join(path)) or "file"
    return f"{'' if line is None else f'line {line}: '}{key}: {_plain(what)}"


def _plain(what: str) -> str:
    """msgspec's wording, lower-cased at the start, without the `$...` location."""
    what = _AT.sub(lambda m: m.group("what"), what)
    return what[:1].lower() + what[1:]


def _line_of(text: str, path: list[str]) -> int | None:
    """The line (1-based) where `path` (["tenants", NAME, KEY] or [KEY] or ["default", KEY])
    is written in `text`: a table's header, or a key's line inside its table (top-level keys
    before the first table); None when not found (e.g. inline tables)."""
    if not path:
        return None
    lines = text.splitlines()
    path = [q for p in path for q in re.split(r"\[|\]", p) if q]  # a[0] -> a, 0
    if len(path) >= 4 and path[2] == "reservations" and path[3].isdigit():
        return _entry_line(lines, path[:3], int(path[3]), path[4:])
    header = _header_line(lines, path)
    if header is not None:
        return header
    table, key = path[:-1], path[-1]
    start = 0
    if table:
        at = _header_line(lines, table)
        if at is None:
            return None
        start = at
    key_re = re.compile(rf"^\s*{_key(key)}\s*[=.]")
    for i in range(start, len(lines)):
        if lines[i].lstrip().startswith("["):
            break  # the next table: not in this one
        if key_re.match(lines[i]):
            return i + 1
    return start or None


def _key(part: str) -> str:
    """A regex matching the TOML key `part`, bare or quoted."""
    p = re.escape(part)
    return rf"(?:{p}|\"{p}\"|'{p}')"


def _header_line(lines: list[str], table: list[str]) -> int | None:
    """The line (1-based) of the header [a.b...] of `table`, or None."""
    pattern = re.compile(r"^\s*\[\s*" + r"\s*\.\s*".join(map(_key, table)) + r"\s*\]")
    return next((i + 1 for i, ln in enumerate(lines) if pattern.match(ln)), None)


def _entry_line(lines: list[str], table: list[str], n: int, key: list[str]) -> int | None:
    """The line of `key` (or of the header when none) in the n-th (0-based) [[table]]."""
    pattern = re.compile(r"^\s*\[\[\s*" + r"\s*\.\s*".join(map(_key, table)) + r"\s*\]\]")
    heads = [i for i, ln in enumerate(lines) if pattern.match(ln)]
    if n >= len(heads):
        return None
    if key:
        key_re = re.compile(rf"^\s*{_key(key[-1])}\s*=")
        for i in range(heads[n] + 1, len(lines)):
            if lines[i].lstrip().startswith("["):
                break
            if key_re.match(lines[i]):
                return i + 1
    return heads[n] + 1
