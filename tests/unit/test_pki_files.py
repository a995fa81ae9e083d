"""The PKI's names and files: reserved names, subject alternative names checked (never the
common name alone), and modes that do not depend on the umask or on what was there before."""

from __future__ import annotations

import datetime
import os
import socket
import ssl
import stat
import threading
from pathlib import Path

import pytest

from terra_security.pki import (
    CONTROLLER_HOSTNAME,
    PkiError,
    Role,
    client_context,
    init_ca,
    issue,
    peer_identity,
)


def mode(path: Path) -> int:
    return stat.S_IMODE(path.lstat().st_mode)


@pytest.fixture
def umask_000():
    old = os.umask(0)
    yield
    os.umask(old)


@pytest.mark.parametrize(
    "name", ["terra-controller", "Terra-Controller", "terra-controller.", "controller", "ca",
             "agent", "job", "operator", "terra-controller2"],
)  # fmt: skip
def test_reserved_names_are_not_issued(tmp_path, name):
    init_ca(tmp_path / "p")
    before = {p.name: p.read_bytes() for p in (tmp_path / "p").iterdir()}
    for role in ("agent", "job", "operator"):
        with pytest.raises(PkiError, match="reserved"):
            issue(tmp_path / "p", role, name)
    assert {p.name: p.read_bytes() for p in (tmp_path / "p").iterdir()} == before


def test_every_role_name_is_reserved():
    from terra_security.pki import RESERVED_NAMES

    assert {r.value for r in Role} | {CONTROLLER_HOSTNAME} <= RESERVED_NAMES


def test_every_certificate_carries_its_name_as_san(tmp_path):
    from cryptography import x509

    init_ca(tmp_path / "p")
    issue(tmp_path / "p", "agent", "dc1_agent")
    for name, expected in (("dc1_agent", ["dc1_agent"]), ("controller", [CONTROLLER_HOSTNAME])):
        cert = x509.load_pem_x509_certificate((tmp_path / "p" / f"{name}.crt").read_bytes())
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        assert san.get_values_for_type(x509.DNSName) == expected


def test_a_certificate_without_its_san_is_no_identity():
    subject = ((("commonName", "a1"),), (("organizationalUnitName", "agent"),))
    assert peer_identity({"subject": subject, "subjectAltName": (("DNS", "a1"),)}).name == "a1"
    with pytest.raises(PkiError, match="subject alternative name"):
        peer_identity({"subject": subject})
    with pytest.raises(PkiError, match="subject alternative name"):
        peer_identity({"subject": subject, "subjectAltName": (("DNS", "b1"),)})


def cn_only_certificate(pki: Path, out: Path, cn: str) -> tuple[Path, Path]:
    """A certificate of the CA in `pki` for `cn` without a SAN (as older versions issued
    to every participant); returns (crt, key) in `out`."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    ca_cert = x509.load_pem_x509_certificate((pki / "ca.crt").read_bytes())
    ca_key = serialization.load_pem_private_key((pki / "ca.key").read_bytes(), None)
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn),
                                 x509.NameAttribute(NameOID.ORGANIZATIONAL_UNIT_NAME, "agent")]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .sign(ca_key, hashes.SHA256())
    )  # fmt: skip
    crt, key_path = out / f"{cn}.crt", out / f"{cn}.key"
    crt.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                          serialization.NoEncryption())
    )  # fmt: skip
    return crt, key_path


def test_a_common_name_alone_does_not_make_the_controller(tmp_path, pki):
    """A CA-signed certificate whose common name is `terra-controller` but without that SAN
    (an agent's, from before names were reserved) is not taken for the controller."""
    crt, key = cn_only_certificate(pki, tmp_path, CONTROLLER_HOSTNAME)
    server_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_ctx.load_cert_chain(crt, key)
    listener = socket.create_server(("127.0.0.1", 0))

    def serve_one() -> None:
        try:
            conn, _ = listener.accept()
            with server_ctx.wrap_socket(conn, server_side=True) as tls:
                tls.recv(1)
        except OSError:
            pass

    thread = threading.Thread(target=serve_one, daemon=True)
    thread.start()
    try:
        raw = socket.create_connection(listener.getsockname(), timeout=5)
        with pytest.raises(ssl.SSLCertVerificationError):
            client_context(pki, "job1").wrap_socket(raw, server_hostname=CONTROLLER_HOSTNAME)
        raw.close()
    finally:
        listener.close()
        thread.join(5)


def test_pki_init_under_umask_000_is_private(tmp_path, umask_000):
    d = tmp_path / "p"
    init_ca(d)
    issue(d, "agent", "a1")
    assert mode(d) == 0o700
    assert mode(d / "ca.crt") == mode(d / "a1.crt") == mode(d / "controller.crt") == 0o644
    assert mode(d / "ca.key") == mode(d / "a1.key") == mode(d / "controller.key") == 0o600
    assert not [p for p in d.iterdir() if p.name.startswith(".")]  # no temporary file left


def test_issue_over_an_existing_key_makes_a_new_private_file(tmp_path, umask_000):
    d = tmp_path / "p"
    init_ca(d)
    (d / "a1.key").write_text("old key")
    os.chmod(d / "a1.key", 0o644)
    issue(d, "agent", "a1")
    assert mode(d / "a1.key") == 0o600
    assert b"PRIVATE KEY" in (d / "a1.key").read_bytes()


def test_issue_never_writes_through_a_symlink(tmp_path):
    d = tmp_path / "p"
    init_ca(d)
    victim = tmp_path / "victim"
    victim.write_text("keep me")
    os.chmod(victim, 0o644)
    (d / "a1.key").symlink_to(victim)
    (d / "a2.crt").symlink_to(victim)
    issue(d, "agent", "a1")
    assert victim.read_text() == "keep me" and mode(victim) == 0o644
    assert not (d / "a1.key").is_symlink() and mode(d / "a1.key") == 0o600
    with pytest.raises(PkiError):
        issue(d, "agent", "a2")  # NAME.crt exists (as a link): refused, nothing written
    assert victim.read_text() == "keep me"
