"""Command-line options of the coflow API's clients, shared by `terra-controller ctl` and
`terra-job`: the API address (HOST:PORT) and how the client authenticates (--pki DIR --name
NAME, or --insecure). Light to import: only the client and the PKI, not the controller."""

from __future__ import annotations

import argparse


def parse_addr(text: str) -> tuple[str, int]:
    """Parse "HOST:PORT" (port 0..65535) for argparse.

    Raises:
        argparse.ArgumentTypeError: malformed.
    """
    host, _, port = text.rpartition(":")
    if not host or not port.isdigit() or int(port) > 65535:
        raise argparse.ArgumentTypeError(f"expected HOST:PORT, got {text!r}")
    return host.strip("[]"), int(port)


def client_args(p: argparse.ArgumentParser) -> None:
    """Add --api HOST:PORT (default 127.0.0.1:6700) and --pki DIR --name NAME | --insecure
    (how a client authenticates) to a parser."""
    p.add_argument(
        "--api", type=parse_addr, default="127.0.0.1:6700", metavar="HOST:PORT",
        help="the controller's coflow API",
    )  # fmt: skip
    p.add_argument("--pki", metavar="DIR", help="PKI directory holding ca.crt, NAME.crt, NAME.key")
    p.add_argument("--name", metavar="NAME", help="this client's certificate name")
    p.add_argument("--insecure", action="store_true", help="plain TCP (controller --insecure)")


def make_client(p: argparse.ArgumentParser, args, host: str, port: int, timeout: float):
    """A TerraClient from the parsed `client_args` (p.error, exit status 2, on a bad
    combination or an unreadable certificate)."""
    from terra_controller.client import TerraClient
    from terra_security.pki import PkiError

    if not args.insecure and (args.pki is None or args.name is None):
        p.error("give --pki DIR --name NAME (or --insecure)")
    try:
        return TerraClient(
            host, port, pki=args.pki, name=args.name, insecure=args.insecure, timeout=timeout
        )
    except (PkiError, OSError) as exc:
        p.error(str(exc))
