"""`terra-controller pki`: the CA and the certificates of agents, job clients and operators
(docs/security.md; the work is terra_security/pki.py)."""

from __future__ import annotations

import argparse
import sys

from terra_core.cli_support import HelpFormatter


def add_pki_parser(commands) -> argparse.ArgumentParser:
    """Add `pki init` and `pki issue` to `commands`."""
    from terra_security.pki import Role

    pki = commands.add_parser(
        "pki",
        help="make the CA and certificates (docs/security.md)",
        description="Make certificates: `init` creates the CA and the controller's "
        "certificate in DIR, `issue` one certificate per agent, job master or operator. "
        "Prints the files written; an existing CA or a bad name exits 2.",
        formatter_class=HelpFormatter,
    )
    sub = pki.add_subparsers(dest="action", required=True, title="actions", metavar="ACTION")
    init = sub.add_parser(
        "init", help="create the CA and the controller's certificate",
        formatter_class=HelpFormatter,
    )  # fmt: skip
    init.add_argument("dir", metavar="DIR", help="PKI directory (created)")
    init.add_argument(
        "--host", action="append", default=[],
        help="extra DNS name or IP address the controller is reached at (repeatable)",
    )  # fmt: skip
    new = sub.add_parser(
        "issue", help="issue a certificate to an agent, job client or operator",
        formatter_class=HelpFormatter,
    )  # fmt: skip
    new.add_argument("dir", metavar="DIR", help="PKI directory made by `pki init`")
    new.add_argument(
        "--role", required=True, choices=[r.value for r in Role if r != "controller"],
        help="what the certificate's holder may do",
    )  # fmt: skip
    new.add_argument("name", metavar="NAME", help="the holder's name (an agent: its --id)")
    new.add_argument("--tenant", help="a job's tenant (default: its NAME; docs/security.md)")
    return pki


def run_pki(args: argparse.Namespace) -> int:
    """Carry out a parsed `pki` command (see pki.py).

    Returns:
        0; prints the files written. Errors (existing CA, bad name) exit with status 2.
    """
    from terra_security.pki import PkiError, init_ca, issue

    try:
        if args.action == "init":
            written = init_ca(args.dir, args.host)
        else:
            written = issue(args.dir, args.role, args.name, args.tenant)
    except PkiError as exc:
        print(f"terra-controller pki: {exc}", file=sys.stderr)
        return 2
    for path in written:
        print(path)
    return 0
