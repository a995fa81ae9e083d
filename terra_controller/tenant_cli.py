"""The tenant options of `terra-controller` and `terra-controller ctl tenant`.

    terra-controller --tenants FILE [--isolation {none,tenants}] ...
    terra-controller ctl ... tenant list
    terra-controller ctl ... tenant show [NAME]
    terra-controller ctl ... tenant set NAME --weight W [--max-coflows N|none]
                             [--max-bytes B|none] [--max-reserved-bytes-per-s R|none]
    terra-controller ctl ... tenant remove NAME
    terra-controller ctl ... tenant reserve [NAME] --src DC --dst DC --rate-bytes-per-s R
                             [--ceil-bytes-per-s C] [--start-s T] [--end-s T]
    terra-controller ctl ... tenant unreserve [NAME] --src DC --dst DC

--tenants FILE: the tenants (tenants_config.py); --isolation tenants (the default with
--tenants; it needs --scheduler terra) schedules with tenants.LiveTenantPolicy, --isolation
none ignores the file. A bad file, or --isolation tenants without one, exits with status 2
and one line on stderr. `ctl tenant` sends the API operations of tenant_api.py and prints
the answer as JSON (exit status 1 with one line on stderr when refused). `tenant set`
changes the weight and the limits given: a limit left out keeps its value, `none` clears
it; `tenant reserve|unreserve` names the tenant (a job: its own, NAME left out).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

from terra_core.cli_support import HelpFormatter


def add_tenant_arguments(p: argparse.ArgumentParser) -> None:
    """Add --tenants FILE and --isolation {none,tenants} to the controller's parser."""
    p.add_argument(
        "--tenants", metavar="FILE", help="tenant weights (TOML); --isolation none ignores it"
    )
    p.add_argument(
        "--isolation", choices=("none", "tenants"),
        help="tenants: shares of the WAN (default with --tenants)",
    )  # fmt: skip


def tenant_book_of(args, p: argparse.ArgumentParser):
    """The TenantBook of --tenants / --isolation, or None (--isolation none).

    Raises:
        SystemExit(2): a bad file, or --isolation tenants without --tenants or with another
            scheduler than terra (one line "terra-controller: ..." on stderr).
    """
    isolation = args.isolation or ("tenants" if args.tenants else "none")
    if isolation == "none":
        return None
    if not args.tenants:
        p.exit(2, "terra-controller: --isolation tenants needs --tenants FILE\n")
    if args.scheduler != "terra":
        p.exit(2, f"terra-controller: --isolation tenants needs --scheduler terra, "
                  f"not {args.scheduler}\n")  # fmt: skip
    from terra_controller.tenants import TenantBook
    from terra_controller.tenants_config import TenantsError, parse_tenants

    try:
        source = Path(args.tenants).read_bytes()
        config = parse_tenants(source.decode("utf-8"), args.tenants)
    except (OSError, UnicodeDecodeError) as exc:
        p.exit(2, f"terra-controller: {args.tenants}: cannot read: {exc}\n")
    except TenantsError as exc:
        p.exit(2, f"terra-controller: {exc}\n")
    book = TenantBook(config, source)
    book.where = args.tenants
    return book


def check_at_start(book, topology, k: int, p: argparse.ArgumentParser) -> None:
    """Admit the tenants file's reservations on `topology` (reservations.check_at_start).

    Raises:
        SystemExit(2): they do not fit the WAN (one line on stderr).
    """
    if book is not None:
        from terra_controller.reservations import check_at_start as check

        check(book, topology, k, p)


def scheduler_factory(args, topology, options, book):
    """The policy's factory for Deferred: make_scheduler's, or with a TenantBook a
    LiveTenantPolicy over TenantPolicy made with the book's weights (measuring the
    isolation guarantee of every round with several tenants active)."""
    from terra_core.registry import make_scheduler

    if book is None:
        return lambda: make_scheduler(args.scheduler, topology, options)

    def make():
        from terra_controller.tenants import LiveTenantPolicy
        from terra_core.tenant_policy import TenantSpec

        spec = TenantSpec(book.weights(), {}, book.sharing, order=book.order)
        inner = make_scheduler("terra", topology, dataclasses.replace(options, tenants=spec))
        inner.measure = True
        return LiveTenantPolicy(inner, book)

    return make


def attach_tenants(controller, book) -> None:
    """Give `controller` its TenantBook (None: nothing): the journal's live changes made
    from this file are taken (tenants.py), the record is journaled, metrics registered
    (tenant_api.TenantCollector and the per-tenant CCT histogram)."""
    if book is None:
        return
    from prometheus_client import Histogram

    from terra_controller.metrics import CCT_BUCKETS
    from terra_controller.tenant_api import TenantCollector

    controller.owner.run(lambda: book.restore(controller.journal.tenants))
    book.controller = controller
    controller.tenants = book
    if controller.journal.tenants != book.record():
        book.save()
    controller.metrics.registry.register(TenantCollector(book))
    book.cct = Histogram(
        "terra_tenant_cct_seconds", "CCT of the tenant's finished coflows", ["tenant"],
        buckets=CCT_BUCKETS, registry=controller.metrics.registry,
    )  # fmt: skip


# ---- ctl tenant ----------------------------------------------------------------------------


CLEAR = "none"  # `ctl tenant set --max-...`: no limit


def _limit(kind):
    """An argparse type: a number of `kind` (int or float), or CLEAR."""

    def parse(text: str):
        if text.strip().lower() == CLEAR:
            return CLEAR
        return kind(text)

    parse.__name__ = kind.__name__  # argparse's "invalid int value" message
    return parse


def add_tenant_ctl(ops) -> None:
    """Add `tenant {list,show,set,remove,reserve,unreserve}` to the ctl operations `ops`."""
    text = (
        "tenants: list, show one, set a weight and limits, remove (operators; show: jobs);"
        " reserve, unreserve a guaranteed rate (operators; a job: its own)"
    )
    tenant = ops.add_parser("tenant", help=text, description=text, formatter_class=HelpFormatter)
    sub = tenant.add_subparsers(dest="tenant_op", required=True, metavar="ACTION")
    sub.add_parser("list", help="every tenant: weight, share, coflows, rate, guarantee")
    show = sub.add_parser("show", help="one tenant (a job: its own)")
    show.add_argument("tenant_name", nargs="?", metavar="NAME", help="the tenant (operators)")
    put = sub.add_parser(
        "set", help="add a tenant or change its weight and limits",
        description="Add a tenant or change its weight and the limits given: a limit left "
        "out keeps its value, none clears it.",
    )  # fmt: skip
    put.add_argument("tenant_name", metavar="NAME", help="the tenant")
    put.add_argument("--weight", type=float, required=True, help="weight (> 0)")
    put.add_argument("--max-coflows", type=_limit(int), metavar="N",
                     help="active coflows at most (none: no limit)")  # fmt: skip
    put.add_argument("--max-bytes", type=_limit(int), metavar="B",
                     help="bytes in flight at most (none: no limit)")  # fmt: skip
    put.add_argument("--max-reserved-bytes-per-s", type=_limit(float), metavar="R",
                     help="reserved at once at most (bytes/s; none: no limit); lets jobs "
                     "reserve")  # fmt: skip
    rm = sub.add_parser("remove", help="drop a tenant without active coflows")
    rm.add_argument("tenant_name", metavar="NAME", help="the tenant")
    res = sub.add_parser("reserve", help="a guaranteed rate between two DCs, if it fits")
    unres = sub.add_parser("unreserve", help="drop the tenant's guarantees on a DC pair")
    for q in (res, unres):
        q.add_argument("tenant_name", nargs="?", metavar="NAME",
                       help="the tenant (operators; a job: its own)")  # fmt: skip
        q.add_argument("--src", required=True, metavar="DC", help="source DC")
        q.add_argument("--dst", required=True, metavar="DC", help="destination DC")
    res.add_argument("--rate-bytes-per-s", type=float, required=True, metavar="R",
                     help="the guaranteed rate (bytes/s)")  # fmt: skip
    res.add_argument("--ceil-bytes-per-s", type=float, metavar="C",
                     help="its traffic on the pair at most (bytes/s)")  # fmt: skip
    res.add_argument("--start-s", type=float, metavar="T", help="window start (UNIX s)")
    res.add_argument("--end-s", type=float, metavar="T", help="window end (UNIX s)")


def run_tenant_ctl(client, args) -> int:
    """Carry out `ctl tenant ...` with `client`; print the answer (JSON).

    Returns:
        0, or 1 when the controller refused or could not be reached, or a value cannot be
        (`tenant set`: tenants_config.make_limits; refused as the controller would, with
        "bad_request") (one line on stderr).
    """
    from terra_controller.client import TerraError
    from terra_controller.tenants_config import TenantsError, make_limits

    request: dict = {"op": {"list": "tenants", "show": "tenant", "set": "tenant_set",
                            "remove": "tenant_remove", "reserve": "tenant_reserve",
                            "unreserve": "tenant_unreserve"}[args.tenant_op]}  # fmt: skip
    if getattr(args, "tenant_name", None) is not None:  # args.name: the client's certificate
        request["name"] = args.tenant_name
    if args.tenant_op in ("reserve", "unreserve"):
        keys = ("src", "dst", "rate_bytes_per_s", "ceil_bytes_per_s", "start_s", "end_s")
        request.update({k: getattr(args, k) for k in keys if getattr(args, k, None) is not None})
    if args.tenant_op == "set":
        request["weight"] = args.weight
        for key in ("max_coflows", "max_bytes", "max_reserved_bytes_per_s"):
            value = getattr(args, key)
            if value is not None:
                request[key] = None if value == CLEAR else value
        limits = {k: v for k, v in request.items() if k not in ("op", "name")}
        try:  # what the wire cannot carry (integers above 2**64-1) never leaves
            make_limits(args.tenant_name, **limits)
        except TenantsError as exc:
            print(f"terra-controller ctl: bad_request: {exc}", file=sys.stderr)
            return 1
    try:
        reply = client.tenant_request(request)
    except (TerraError, ConnectionError, ValueError, OverflowError) as exc:
        print(f"terra-controller ctl: {exc}", file=sys.stderr)
        return 1
    print(json.dumps({k: v for k, v in reply.items() if k not in ("v", "ok", "instance")},
                     indent=1))  # fmt: skip
    return 0
