"""Command-line options of the coflow API's clients, shared by `terra-controller ctl` and
`terra-job`: the API address (HOST:PORT, or several: a highly available controller's
instances, HOST:PORT,HOST:PORT...) and how the client authenticates (--pki DIR --name
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


def parse_addrs(text: str) -> list[tuple[str, int]]:
    """Parse "HOST:PORT[,HOST:PORT...]" for argparse: the (host, port) pairs in order,
    duplicates dropped.

    Raises:
        argparse.ArgumentTypeError: one is malformed.
    """
    return list(dict.fromkeys(parse_addr(part.strip()) for part in text.split(",")))


def client_args(p: argparse.ArgumentParser) -> None:
    """Add --api HOST:PORT[,HOST:PORT...] (default 127.0.0.1:6700; args.api: a list of
    (host, port)) and --pki DIR --name NAME | --insecure (how a client authenticates) to a
    parser."""
    p.add_argument(
        "--api", type=parse_addrs, default="127.0.0.1:6700", metavar="HOST:PORT[,HOST:PORT...]",
        help="the controller's coflow API; several: a highly available controller's "
        "instances, tried in turn (a standby names the leader)",
    )  # fmt: skip
    p.add_argument("--pki", metavar="DIR", help="PKI directory holding ca.crt, NAME.crt, NAME.key")
    p.add_argument("--name", metavar="NAME", help="this client's certificate name")
    p.add_argument("--insecure", action="store_true", help="plain TCP (controller --insecure)")


def make_client(p: argparse.ArgumentParser, args, timeout: float):
    """A TerraClient of the controllers args.api from the parsed `client_args` (p.error,
    exit status 2, on a bad combination or an unreadable certificate)."""
    from terra_controller.client import TerraClient
    from terra_security.pki import PkiError

    if not args.insecure and (args.pki is None or args.name is None):
        p.error("give --pki DIR --name NAME (or --insecure)")
    try:
        return TerraClient(
            controllers=args.api, pki=args.pki, name=args.name, insecure=args.insecure,
            timeout=timeout,
        )  # fmt: skip
    except (PkiError, OSError) as exc:
        p.error(str(exc))
