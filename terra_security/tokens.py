"""Short-lived operator tokens: what a browser presents to the REST server instead of a client
certificate (docs/security.md "Console login").

A token is issued over mutual TLS to a certificate holder (`terra-controller ctl login`: the
coflow API's "login" operation) and carries that certificate's name and role:

    token = "terra1." base64url(payload) "." base64url(HMAC-SHA256(key, "terra1." payload_b64))
    payload = JSON {"n": name, "r": role, "e": expiry (UNIX s, int), "i": issued (UNIX s)}

The key is the controller's own (32 random bytes per controller process: tokens end when
it restarts). The REST server accepts a token like the certificate it came from: the same
role check, and nothing once `e` has passed. Tokens are not stored; they cannot be revoked
before they expire, hence the short lifetime (at most MAX_TTL_S).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import secrets
import time

from terra_security.pki import Identity, PkiError, Role, check_name

PREFIX = "terra1"
DEFAULT_TTL_S = 900  # 15 minutes
MAX_TTL_S = 8 * 3600
KEY_BYTES = 32
MAX_TOKEN_CHARS = 1024


class TokenError(ValueError):
    """A token is malformed, forged (bad signature), expired or names no valid role."""


def new_key() -> bytes:
    """A fresh HMAC key (KEY_BYTES from the OS CSPRNG)."""
    return secrets.token_bytes(KEY_BYTES)


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def _mac(key: bytes, signed: str) -> bytes:
    return hmac.new(key, signed.encode("ascii"), hashlib.sha256).digest()


def issue_token(key: bytes, identity: Identity, ttl_s: float = DEFAULT_TTL_S,
                now: float | None = None) -> tuple[str, int]:  # fmt: skip
    """A token for `identity` (its name and role) valid for `ttl_s` seconds.

    Returns:
        (token, expiry in UNIX seconds).

    Raises:
        TokenError: ttl_s not in (0, MAX_TTL_S].
    """
    if isinstance(ttl_s, bool) or not isinstance(ttl_s, int | float) or not 0 < ttl_s <= MAX_TTL_S:
        raise TokenError(f"the lifetime must be 1..{MAX_TTL_S} s")
    issued = int(time.time() if now is None else now)
    expiry = issued + max(1, int(ttl_s))
    payload = {"n": identity.name, "r": identity.role.value, "e": expiry, "i": issued}
    body = _b64(json.dumps(payload, separators=(",", ":"), sort_keys=True).encode())
    signed = f"{PREFIX}.{body}"
    return f"{signed}.{_b64(_mac(key, signed))}", expiry


def verify_token(key: bytes, token: object, now: float | None = None) -> Identity:
    """The Identity (name, role) a token was issued to, if its signature is the controller's
    and it has not expired.

    Raises:
        TokenError: not a token, a signature that does not match (forged or altered, or
            another controller's key), expired, or an unknown role / invalid name.
    """
    if not isinstance(token, str) or len(token) > MAX_TOKEN_CHARS or not token.isascii():
        raise TokenError("not a token")
    parts = token.split(".")
    if len(parts) != 3 or parts[0] != PREFIX:
        raise TokenError("not a token")
    try:
        mac = _unb64(parts[2])
    except (binascii.Error, ValueError) as exc:
        raise TokenError("not a token") from exc
    if not hmac.compare_digest(mac, _mac(key, f"{parts[0]}.{parts[1]}")):
        raise TokenError("bad token signature")
    try:
        payload = json.loads(_unb64(parts[1]))
        name, role, expiry = payload["n"], Role(payload["r"]), payload["e"]
        check_name(name)
    except (ValueError, KeyError, TypeError, PkiError) as exc:
        raise TokenError("malformed token") from exc
    if isinstance(expiry, bool) or not isinstance(expiry, int):
        raise TokenError("malformed token")
    if (time.time() if now is None else now) >= expiry:
        raise TokenError("token expired")
    return Identity(name, role)
