"""Certificates for tests: one PKI per test session (see the `pki` fixture in conftest.py)."""

from __future__ import annotations

import socket
import ssl
from pathlib import Path

from benchmarks.shared_socket import SharedSocket
from terra_controller.transport import ServerSecurity, connect_tls
from terra_security.pki import Role, client_context, init_ca, issue, server_context

JOBS = ("job1", "job2")
OPERATORS = ("operator1",)
AGENTS = ("a", "b", "a1", "a2", "a3", "a9", "b1", "c1", "hk1", "hk2", "la1", "ny1", "fl1", "ba1")


def make_pki(directory: Path) -> Path:
    """CA, controller and the standard test identities (JOBS, OPERATORS, AGENTS)."""
    init_ca(directory)
    for name in JOBS:
        issue(directory, Role.JOB, name)
    for name in OPERATORS:
        issue(directory, Role.OPERATOR, name)
    for name in AGENTS:
        issue(directory, Role.AGENT, name)
    return directory


def ensure(pki: Path, role: Role, name: str) -> str:
    """Issue `name` with `role` unless it exists; returns the name."""
    if not (Path(pki) / f"{name}.crt").exists():
        issue(pki, role, name)
    return name


def security(pki: Path, **caps) -> ServerSecurity:
    """The controller's ServerSecurity (mutual TLS) over `pki`."""
    return ServerSecurity(server_context(pki), **caps)


def tls_socket(host: str, port: int, pki: Path, name: str, timeout: float = 5.0) -> ssl.SSLSocket:
    """A mutual-TLS socket to a controller server as participant `name`."""
    return connect_tls(host, port, client_context(pki, name), timeout)


def shared_tls_socket(host: str, port: int, pki: Path, name: str, timeout: float = 5.0):
    """tls_socket for one reading and one writing thread at once (shared_socket.SharedSocket)."""
    return SharedSocket(tls_socket(host, port, pki, name, timeout))


def plain_socket(host: str, port: int, timeout: float = 5.0) -> socket.socket:
    """A plain TCP socket (what an outsider without a certificate opens)."""
    return socket.create_connection((host, port), timeout=timeout)
