"""Certificates and TLS contexts: every participant has its own identity (docs/security.md).

A private certificate authority (CA) issues one certificate per participant:

- the controller (`controller.crt`: serverAuth, subject alternative name
  `DNS:terra-controller`, which every client checks, whatever address it dials);
- agents, job clients and operators (`NAME.crt`: clientAuth; the subject's
  common name is the participant's name, its organizational unit its role;
  a job's certificate also names its tenant, the share of the WAN its coflows
  are scheduled in, as the URI `urn:terra:tenant:TENANT` in its subject
  alternative name: signed by the CA, so no client chooses its tenant);
  agents' certificates also carry serverAuth: a receiving agent presents its
  certificate as the TLS server of the data connections it accepts
  (`data_server_context` / `data_client_context`).

Every certificate carries a subject alternative name: the controller's
`terra-controller` (and --host names), a participant's its own name; names that
are roles or the controller's (`RESERVED_NAMES`) are never issued to
participants.

Keys are ECDSA P-256, certificates X.509 v3 signed with SHA-256, made with
the `cryptography` package. Whatever the umask, the directory is made 0700,
certificates 0644 and private keys 0600, each written to a new temporary file
(O_EXCL | O_NOFOLLOW) then renamed into place: never through a symlink, never
keeping an old file's mode.

Layout of a PKI directory DIR:

    DIR/ca.crt, DIR/ca.key                  the CA (ca.key stays with whoever issues)
    DIR/controller.crt, DIR/controller.key  the controller
    DIR/NAME.crt, DIR/NAME.key              one per agent / job client / operator

A host needs only `ca.crt` and its own pair.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
import re
import ssl
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # cryptography is imported where it is used (it is slow to import)
    from cryptography import x509
    from cryptography.hazmat.primitives.asymmetric import dsa, ec, ed448, ed25519, rsa

    IssuerKey = (
        ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey | ed25519.Ed25519PrivateKey
        | ed448.Ed448PrivateKey | dsa.DSAPrivateKey
    )  # fmt: skip

CONTROLLER_NAME = "controller"
CONTROLLER_HOSTNAME = "terra-controller"  # the SAN every client verifies
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
CA_DAYS = 3650
CERT_DAYS = 825
PathArg = str | os.PathLike[str]  # a PKI directory


class PkiError(Exception):
    """A PKI directory, certificate or name is missing, malformed or already exists."""


class Role(StrEnum):
    """What a certificate's holder may do (its subject's organizational unit)."""

    CONTROLLER = "controller"
    AGENT = "agent"  # registers as itself, reports on its own flows
    JOB = "job"  # submits, sees and changes its own coflows
    OPERATOR = "operator"  # sees everything, changes link state and capacity


TENANT_URI = "urn:terra:tenant:"  # + the tenant's name, in a job certificate's SAN


@dataclass(frozen=True)
class Identity:
    """An authenticated peer: its certificate's name (CN), role (OU) and tenant.

    `tenant` is the tenant named in the certificate's SAN (TENANT_URI), else (and when
    given as "") the peer's name. `insecure` identities come from plain-TCP connections
    (`--insecure`): no certificate, so no name check and every role's rights (for tests
    and trusted labs only).
    """

    name: str
    role: Role
    insecure: bool = False
    tenant: str = ""

    def __post_init__(self) -> None:
        if not self.tenant:
            object.__setattr__(self, "tenant", self.name)

    def may(self, role: Role) -> bool:
        """True when this identity holds `role` (an insecure peer holds every role)."""
        return self.insecure or self.role is role


INSECURE = Identity("insecure", Role.OPERATOR, insecure=True)


# names no agent, job or operator may hold: the CA's, the controller's file name and the
# host name clients verify, and every role's name (and any future role's, via Role)
RESERVED_NAMES = frozenset({"ca", CONTROLLER_NAME, CONTROLLER_HOSTNAME}) | frozenset(
    r.value for r in Role
)


def check_name(name: str) -> str:
    """Validate a participant name (1-64 of [A-Za-z0-9._-], not starting with . - _).

    Raises:
        PkiError: invalid name, or a reserved one (RESERVED_NAMES, any letter case, or
            any name starting with "terra-controller").
    """
    if not isinstance(name, str) or not NAME_RE.match(name):
        raise PkiError(f"bad name {name!r}: 1-64 characters of A-Z a-z 0-9 . _ -")
    folded = name.lower().rstrip(".")
    if folded in RESERVED_NAMES or folded.startswith(CONTROLLER_HOSTNAME):
        raise PkiError(f"name {name!r} is reserved")
    return name


# ---- issuing ---------------------------------------------------------------------------------


def init_ca(directory: PathArg, hosts: list[str] | None = None) -> list[Path]:
    """Create a CA and the controller's certificate in `directory` (created if needed).

    Args:
        directory: the PKI directory.
        hosts: extra DNS names or IP addresses for the controller certificate's SAN
            (clients verify `terra-controller`, which is always present).

    Returns:
        the four paths written (ca.crt, ca.key, controller.crt, controller.key).

    Raises:
        PkiError: the directory already holds a CA (never overwritten).
    """
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    d = Path(directory)
    if (d / "ca.key").exists() or (d / "ca.crt").exists():
        raise PkiError(f"{d} already holds a CA; refusing to overwrite it")
    d.mkdir(mode=DIR_MODE, parents=True, exist_ok=True)
    os.chmod(d, DIR_MODE)  # whatever the umask, and if it existed
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "Terra CA")])
    now = _now()
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=CA_DAYS))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )  # fmt: skip
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), False)
        .sign(key, hashes.SHA256())
    )
    written = [_write_cert(d / "ca.crt", cert), _write_key(d / "ca.key", key)]
    written += _issue(d, CONTROLLER_NAME, Role.CONTROLLER, hosts or [])
    return written


def issue(directory: PathArg, role: Role | str, name: str, tenant: str | None = None) -> list[Path]:
    """Issue a certificate for participant `name` with `role` from the CA in `directory`.

    Args:
        tenant: a job's tenant (TENANT_URI in its SAN; a name as check_tenant allows);
            None: the job's own name (no URI is written then).

    Returns:
        [DIR/NAME.crt, DIR/NAME.key].

    Raises:
        PkiError: no CA in the directory, bad name, role or tenant (a tenant for a role
            other than job), or NAME.crt exists already.
    """
    try:
        role = Role(role)
    except ValueError:
        raise PkiError(f"unknown role {role!r}") from None
    if role is Role.CONTROLLER:
        raise PkiError("the controller's certificate is made by `pki init`")
    if tenant is not None and role is not Role.JOB:
        raise PkiError(f"only job certificates name a tenant, not {role.value} ones")
    d = Path(directory)
    if (d / f"{check_name(name)}.crt").exists():
        raise PkiError(f"{d / (name + '.crt')} exists; refusing to overwrite it")
    return _issue(d, name, role, [], None if tenant is None else check_tenant(tenant))


def check_tenant(tenant: str) -> str:
    """Validate a tenant name (1-64 of [A-Za-z0-9._-], not starting with . - _).

    Raises:
        PkiError: an invalid name.
    """
    if not isinstance(tenant, str) or not NAME_RE.match(tenant):
        raise PkiError(f"bad tenant {tenant!r}: 1-64 characters of A-Z a-z 0-9 . _ -")
    return tenant


def _load_ca(d: Path) -> tuple[x509.Certificate, IssuerKey]:
    """The CA's certificate and private key in `d`.

    Raises:
        PkiError: a file is missing or not PEM, or the key cannot sign certificates.
    """
    from cryptography import x509
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import dsa, ec, ed448, ed25519, rsa

    try:
        ca_cert = x509.load_pem_x509_certificate((d / "ca.crt").read_bytes())
        ca_key = serialization.load_pem_private_key((d / "ca.key").read_bytes(), None)
    except (OSError, ValueError) as exc:
        raise PkiError(f"cannot load the CA from {d}: {exc}") from exc
    signing = (
        ec.EllipticCurvePrivateKey, rsa.RSAPrivateKey, ed25519.Ed25519PrivateKey,
        ed448.Ed448PrivateKey, dsa.DSAPrivateKey,
    )  # fmt: skip
    if not isinstance(ca_key, signing):
        raise PkiError(f"the CA key in {d} cannot sign certificates ({type(ca_key).__name__})")
    return ca_cert, ca_key


def _issue(
    d: Path, name: str, role: Role, hosts: list[str], tenant: str | None = None
) -> list[Path]:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    ca_cert, ca_key = _load_ca(d)
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name(
        [
            x509.NameAttribute(NameOID.COMMON_NAME, name),
            x509.NameAttribute(NameOID.ORGANIZATIONAL_UNIT_NAME, role.value),
        ]
    )
    now = _now()
    if role is Role.CONTROLLER:
        usages = [ExtendedKeyUsageOID.SERVER_AUTH]
    elif role is Role.AGENT:  # client of the controller, server of incoming data connections
        usages = [ExtendedKeyUsageOID.CLIENT_AUTH, ExtendedKeyUsageOID.SERVER_AUTH]
    else:
        usages = [ExtendedKeyUsageOID.CLIENT_AUTH]
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=CERT_DAYS))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), False
        )
    )
    # every certificate carries a SAN (peers are checked by it): the controller's host names,
    # else the participant's name (reserved names cannot be issued: check_name)
    sans: list[x509.GeneralName]
    if role is Role.CONTROLLER:
        sans = [_san(h) for h in [CONTROLLER_HOSTNAME, *hosts]]
    else:
        sans = [x509.DNSName(name)]
    if tenant is not None:
        sans.append(x509.UniformResourceIdentifier(TENANT_URI + tenant))
    builder = builder.add_extension(x509.SubjectAlternativeName(sans), False)
    cert = builder.sign(ca_key, hashes.SHA256())
    return [_write_cert(d / f"{name}.crt", cert), _write_key(d / f"{name}.key", key)]


def _san(host: str) -> x509.GeneralName:
    from cryptography import x509

    try:
        return x509.IPAddress(ipaddress.ip_address(host))
    except ValueError:
        return x509.DNSName(host)


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


DIR_MODE = 0o700  # a PKI directory
CERT_MODE = 0o644  # NAME.crt, ca.crt
KEY_MODE = 0o600  # NAME.key, ca.key


def _write_cert(path: Path, cert: x509.Certificate) -> Path:
    from cryptography.hazmat.primitives import serialization

    return _write_new(path, cert.public_bytes(serialization.Encoding.PEM), CERT_MODE)


def _write_key(path: Path, key: ec.EllipticCurvePrivateKey) -> Path:
    from cryptography.hazmat.primitives import serialization

    data = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    return _write_new(path, data, KEY_MODE)


def _write_new(path: Path, data: bytes, mode: int) -> Path:
    """Write `data` to `path` with exactly `mode`, whatever the umask: into a new temporary
    file (O_CREAT | O_EXCL | O_NOFOLLOW, never an existing file or a symlink's target),
    synced, then renamed over `path` (which replaces a symlink itself, not its target).

    Raises:
        PkiError: the file cannot be written.
    """
    tmp = path.with_name(f".{path.name}.{os.urandom(6).hex()}.tmp")
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(tmp, flags, mode & 0o600)
        try:
            os.fchmod(fd, mode)
            with os.fdopen(fd, "wb") as fh:
                fd = -1
                fh.write(data)
                fh.flush()
                os.fsync(fh.fileno())
        finally:
            if fd >= 0:
                os.close(fd)
        os.replace(tmp, path)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise PkiError(f"cannot write {path}: {exc}") from exc
    return path


# ---- TLS contexts ----------------------------------------------------------------------------


def _files(directory: PathArg, name: str) -> tuple[str, str, str]:
    d = Path(directory)
    ca, crt, key = d / "ca.crt", d / f"{name}.crt", d / f"{name}.key"
    for f in (ca, crt, key):
        if not f.is_file():
            raise PkiError(f"missing {f} (make it with `terra-controller pki ...`)")
    return str(ca), str(crt), str(key)


def server_context(directory: PathArg, require_client_cert: bool = True) -> ssl.SSLContext:
    """TLS server context of the controller: its certificate, clients verified against the CA.

    Args:
        directory: PKI directory with ca.crt, controller.crt, controller.key.
        require_client_cert: False serves TLS to clients without a certificate
            (REST with --rest-public).

    Returns:
        ssl.SSLContext (TLS 1.2 or newer).

    Raises:
        PkiError: a file is missing; ssl.SSLError: a file is not valid PEM.
    """
    ca, crt, key = _files(directory, CONTROLLER_NAME)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.load_cert_chain(crt, key)
    ctx.load_verify_locations(ca)
    ctx.verify_mode = ssl.CERT_REQUIRED if require_client_cert else ssl.CERT_OPTIONAL
    return ctx


def client_context(directory: PathArg, name: str) -> ssl.SSLContext:
    """TLS client context for participant `name`: its certificate, the controller verified.

    Connect with ``server_hostname=CONTROLLER_HOSTNAME``: only the certificate made by
    `init_ca` carries that name in its SAN (the name is reserved, and the common name is
    never matched), so an agent or job certificate cannot pose as the controller.

    Returns:
        ssl.SSLContext.

    Raises:
        PkiError: bad name or a missing file; ssl.SSLError: a file is not valid PEM.
    """
    ca, crt, key = _files(directory, check_name(name))
    ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=ca)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.hostname_checks_common_name = False  # the SAN only: never a CN-only match
    ctx.load_cert_chain(crt, key)
    return ctx


def data_server_context(directory: PathArg, name: str) -> ssl.SSLContext:
    """TLS server context of agent `name` for the data connections it accepts.

    Presents DIR/NAME.crt (which must carry serverAuth, as agent certificates issued by
    `issue` do) and requires a client certificate signed by the CA; the caller checks the
    client's name and role (`peer_identity`). Only the handshake runs over TLS: both ends
    then unwrap to the plain connection (terra_security/data_auth.py).

    Raises:
        PkiError: bad name, a missing file, or a certificate without serverAuth (issued
            before agents got it: issue it again); ssl.SSLError: a file is not valid PEM.
    """
    ca, crt, key = _files(directory, check_name(name))
    _require_server_auth(crt)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.load_cert_chain(crt, key)
    ctx.load_verify_locations(ca)
    ctx.verify_mode = ssl.CERT_REQUIRED
    ctx.num_tickets = 0  # no session resumption: nothing but the handshake crosses TLS
    return ctx


def data_client_context(directory: PathArg, name: str) -> ssl.SSLContext:
    """TLS client context of agent `name` for the data connections it opens.

    Presents DIR/NAME.crt and verifies the receiving agent's certificate against the CA,
    without a host name check (agent certificates carry no address): the caller checks the
    peer's name equals the tunnel's peer agent and its role is agent (`peer_identity`).

    Raises:
        PkiError: bad name or a missing file; ssl.SSLError: a file is not valid PEM.
    """
    ca, crt, key = _files(directory, check_name(name))
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_REQUIRED
    ctx.load_verify_locations(ca)
    ctx.load_cert_chain(crt, key)
    return ctx


def _require_server_auth(crt: str) -> None:
    from cryptography import x509
    from cryptography.x509.oid import ExtendedKeyUsageOID

    try:
        cert = x509.load_pem_x509_certificate(Path(crt).read_bytes())
    except (OSError, ValueError) as exc:
        raise PkiError(f"cannot load {crt}: {exc}") from exc
    try:
        eku = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    except x509.ExtensionNotFound:
        return  # no EKU: any usage
    if ExtendedKeyUsageOID.SERVER_AUTH not in eku:
        raise PkiError(
            f"{crt} lacks the serverAuth usage that authenticated data connections need "
            "(issued by an older version): issue the agent's certificate again"
        )


def peer_identity(peercert: dict[str, Any] | None) -> Identity:
    """The Identity in a verified peer certificate (`SSLSocket.getpeercert()`).

    The name is the subject's common name, which the certificate's subject alternative
    name (DNS) must carry too; the role its organizational unit; the tenant the SAN's
    TENANT_URI (at most one), else the name.

    Raises:
        PkiError: no certificate, its subject lacks a valid (unreserved) name or role, its
            SAN lacks the name, or it names a bad tenant or more than one.
    """
    if not peercert:
        raise PkiError("no client certificate")
    fields: dict[str, str] = {}
    for rdn in peercert.get("subject", ()):
        for key, value in rdn:
            fields[key] = value
    name, role = fields.get("commonName", ""), fields.get("organizationalUnitName", "")
    try:
        identity = Identity(check_name(name), Role(role))
    except (PkiError, ValueError) as exc:
        raise PkiError(f"certificate subject {fields!r} is not a Terra identity") from exc
    if ("DNS", name) not in peercert.get("subjectAltName", ()):
        raise PkiError(
            f"certificate of {name!r} lacks the subject alternative name {name!r} (issued by "
            "an older version: issue it again)"
        )
    tenants = [v for kind, v in peercert.get("subjectAltName", ())
               if kind == "URI" and v.startswith(TENANT_URI)]  # fmt: skip
    if len(tenants) > 1:
        raise PkiError(f"certificate of {name!r} names {len(tenants)} tenants")
    if tenants:
        try:
            tenant = check_tenant(tenants[0][len(TENANT_URI) :])
        except PkiError as exc:
            raise PkiError(f"certificate of {name!r}: {exc}") from None
        identity = Identity(identity.name, identity.role, tenant=tenant)
    return identity
