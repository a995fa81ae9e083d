"""Authentication of data connections between agents (docs/security.md).

When agents run with a PKI (terra-agent --pki), each data connection starts with a mutual TLS
handshake: the receiving agent is the TLS server (terra_security.pki.data_server_context),
the sending agent the TLS client (data_client_context). Each end checks the other's
certificate: signed by the CA, role agent, and on the sender's side the name of the tunnel's
peer agent. Nothing but the handshake crosses TLS: both ends then unwrap (close_notify both
ways) and the connection carries "hello" and chunks in clear on the plain socket, so the
readv / writev path of overlay/framing.py stays.

The sender sends its "hello" only once its unwrap returned, and the receiver sends nothing
before the first chunk arrives, so the sender's end has no bytes left over from the TLS layer;
the receiver's end may have some (the "hello" and first chunks can follow the sender's
close_notify in one read): `authenticate` returns them and they go to the FrameReader first.

Pair keys (cheaper, same property): the controller gives every agent, in its "tunnels"
message (over the mutual-TLS control channel), a 32-byte key per other connected agent,
K(a, b) = the same for both ends (terra_security.data_keys). A sender holding the key of the
tunnel's peer proves and checks identities with it instead of the TLS handshake, one round
trip, two HMAC-SHA256 (key_authenticate_sender / key_authenticate_receiver):

    sender   -> receiver: KEY_TAG | len(name) | sender name | nonce_s (16 bytes)
    receiver -> sender:   nonce_r (16) | HMAC(K, "recv" | sender | receiver | nonce_s | nonce_r)
    sender   -> receiver: HMAC(K, "send" | sender | receiver | nonce_s | nonce_r), then "hello"

Only the controller and the two agents know K; fresh nonces on both sides stop replays, and
the role label stops a proof of one side being reflected as the other's. The receiver tells
the two methods apart by the first byte (a TLS record starts with 0x16, KEY_TAG is 0x4b);
accept() serves both. A receiver without the sender's key closes the connection; the sender's
next attempt then runs the TLS handshake (PeerLink).

Encrypted connections (seal=True, terra-agent --encrypt-data) come out of either method with
a connection secret S for the AEAD records of terra_security/data_records.py: from the pair
key and both nonces (data_records.pair_secret), or, after the TLS handshake and before the
unwrap, from RANDOM_BYTES each end sends inside TLS (the sender first, after SEAL_TAG, which
names the record format: a peer without it is refused by name; data_records.tls_secret).
Python's ssl then carries no data bytes.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import socket
import ssl
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import trio

from terra_security.data_records import RANDOM_BYTES, pair_secret, tls_secret
from terra_security.pki import Identity, PkiError, Role, check_name, peer_identity

DATA_HANDSHAKE_S = 10.0  # TLS handshake + unwrap of a data connection
KEY_TAG = b"\x4b"  # first byte of a pair-key authenticated connection ("K")
KEY_BYTES = 32  # pair key
NONCE_BYTES = 16
MAC_BYTES = 32  # HMAC-SHA256
TLS_HANDSHAKE_RECORD = 0x16
SEAL_TAG = b"terra sealed records v1\n"  # sent inside TLS before the sender's random bytes


class DataAuthError(Exception):
    """The peer of a data connection could not be authenticated (the connection is dropped)."""


async def authenticate(
    stream: trio.SocketStream,
    context: ssl.SSLContext,
    server_side: bool,
    expected_peer: str | None = None,
    timeout_s: float = DATA_HANDSHAKE_S,
    seal: bool = False,
) -> tuple[Identity, bytes, bytes | None]:
    """Run the TLS handshake on `stream`, check the peer, unwrap back to the plain stream.

    Args:
        stream: a connected TCP stream; used in clear afterwards (the caller closes it on
            error).
        context: the agent's data server (receiver) or client (sender) context.
        server_side: True on the receiving (accepting) end.
        expected_peer: the agent id the peer's certificate must name (sender: the tunnel's
            peer agent); None: any agent (receiver: the "hello" is checked against it).
        timeout_s: deadline of handshake and unwrap together.
        seal: True (terra-agent --encrypt-data): before the unwrap both ends agree on a
            connection secret inside TLS (module docstring); both ends must agree.

    Returns:
        (the peer's Identity, bytes received past the TLS layer: the first plain bytes, the
        connection secret with seal=True, else None).

    Raises:
        DataAuthError: handshake failure (no / untrusted certificate, not TLS), a peer that
            is not an agent or not `expected_peer`, a peer that does not seal (seal=True), a
            timeout, a connection error meanwhile.
    """
    tls = trio.SSLStream(stream, context, server_side=server_side)
    secret = None
    try:
        with trio.fail_after(timeout_s):
            await tls.do_handshake()
            identity = peer_identity(tls.getpeercert())
            if identity.role is not Role.AGENT:
                raise DataAuthError(
                    f"peer certificate {identity.name!r} has role {identity.role.value!r}, "
                    "not agent"
                )
            if expected_peer is not None and identity.name != expected_peer:
                raise DataAuthError(
                    f"peer certificate names {identity.name!r}, expected {expected_peer!r}"
                )
            if seal:
                secret = await _agree_inside_tls(tls, server_side)
            _, trailing = await tls.unwrap()
    except trio.TooSlowError:
        raise DataAuthError(f"TLS handshake not done within {timeout_s:g} s") from None
    except PkiError as exc:
        raise DataAuthError(str(exc)) from exc
    except (trio.BrokenResourceError, trio.ClosedResourceError, ssl.SSLError, OSError) as exc:
        cause = exc.__cause__ if exc.__cause__ is not None else exc
        raise DataAuthError(f"TLS handshake failed: {cause!r}") from exc
    return identity, bytes(trailing), secret


async def _agree_inside_tls(tls: trio.SSLStream[trio.SocketStream], server_side: bool) -> bytes:
    """The connection secret of a sealed connection: SEAL_TAG and RANDOM_BYTES from the
    sender, RANDOM_BYTES from the receiver, all inside TLS (data_records.tls_secret)."""
    mine = os.urandom(RANDOM_BYTES)
    if server_side:
        buf = bytearray()
        if await _read_exact(tls, buf, len(SEAL_TAG)) != SEAL_TAG:  # shorter than any "hello"
            raise DataAuthError(
                "peer does not seal its data connection (an agent without --encrypt-data, "
                "or of a version that keeps TLS on it); refused"
            )
        theirs = await _read_exact(tls, buf, RANDOM_BYTES)
        await tls.send_all(mine)
        return tls_secret(theirs, mine)
    await tls.send_all(SEAL_TAG + mine)
    theirs = await _read_exact(tls, bytearray(), RANDOM_BYTES)
    return tls_secret(mine, theirs)


def _mac(
    key: bytes, role: bytes, sender: str, receiver: str, nonce_s: bytes, nonce_r: bytes
) -> bytes:
    """HMAC-SHA256 of one side's proof; names are length-prefixed (no ambiguity)."""
    parts = [role]
    for name in (sender, receiver):
        raw = name.encode()
        parts += [bytes([len(raw)]), raw]
    return hmac.new(key, b"".join([*parts, nonce_s, nonce_r]), hashlib.sha256).digest()


async def _read_exact(stream: trio.abc.ReceiveStream, buf: bytearray, n: int) -> bytes:
    """The first `n` bytes of `buf` + the stream (waiting for them); the rest stays in `buf`.

    Raises DataAuthError on EOF before `n` bytes."""
    while len(buf) < n:  # inside TLS no more than asked (the next bytes may be past it)
        want = n - len(buf) if isinstance(stream, trio.SSLStream) else max(n - len(buf), 4096)
        data = await stream.receive_some(want)
        if not data:
            raise DataAuthError("connection closed during authentication")
        buf += data
    out = bytes(buf[:n])
    del buf[:n]
    return out


@contextmanager
def _key_exchange(timeout_s: float) -> Iterator[None]:
    """Deadline of a pair-key exchange; its timeout and connection errors -> DataAuthError."""
    try:
        with trio.fail_after(timeout_s):
            yield
    except trio.TooSlowError:
        raise DataAuthError(f"key exchange not done within {timeout_s:g} s") from None
    except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
        raise DataAuthError(f"key exchange failed: {exc!r}") from exc


async def key_authenticate_sender(
    stream: trio.SocketStream,
    agent_id: str,
    peer: str,
    key: bytes,
    timeout_s: float = DATA_HANDSHAKE_S,
) -> bytes:
    """Sending end of a pair-key authenticated data connection (module docstring).

    Args:
        stream: a connected TCP stream (used in clear afterwards; the caller closes it on
            error). agent_id: this agent. peer: the tunnel's peer agent (the receiver).
        key: K(agent_id, peer), KEY_BYTES bytes, from the controller.

    Returns:
        the connection secret (data_records.pair_secret; used by sealed connections only).

    Raises:
        DataAuthError: the receiver's proof is wrong (it does not hold K: not `peer`, or it
            has no key for us and closed), a timeout, a connection error meanwhile.
    """
    nonce_s = os.urandom(NONCE_BYTES)
    name = agent_id.encode()
    with _key_exchange(timeout_s):
        await stream.send_all(KEY_TAG + bytes([len(name)]) + name + nonce_s)
        reply = await _read_exact(stream, bytearray(), NONCE_BYTES + MAC_BYTES)
        nonce_r, proof = reply[:NONCE_BYTES], reply[NONCE_BYTES:]
        if not hmac.compare_digest(proof, _mac(key, b"recv", agent_id, peer, nonce_s, nonce_r)):
            raise DataAuthError(f"peer did not prove it is {peer!r} (wrong pair key)")
        await stream.send_all(_mac(key, b"send", agent_id, peer, nonce_s, nonce_r))
    return pair_secret(key, agent_id, peer, nonce_s, nonce_r)


async def key_authenticate_receiver(
    stream: trio.SocketStream,
    agent_id: str,
    key_for: Callable[[str], bytes | None],
    timeout_s: float = DATA_HANDSHAKE_S,
) -> tuple[str, bytes, bytes]:
    """Receiving end of a pair-key authenticated data connection (the tag byte not read yet).

    Args:
        stream: the accepted TCP stream; agent_id: this agent; key_for(peer) -> K(peer,
            agent_id) or None (no key: refused).

    Returns:
        (the sender's agent id, proven; bytes received past the proof: the first frames;
        the connection secret, data_records.pair_secret).

    Raises:
        DataAuthError: not the key tag, a bad name, no key for the named sender, a wrong
            proof, a timeout, a connection error meanwhile.
    """
    buf = bytearray()
    with _key_exchange(timeout_s):
        head = await _read_exact(stream, buf, 2)
        if head[:1] != KEY_TAG:
            raise DataAuthError("not a pair-key handshake")
        raw = await _read_exact(stream, buf, head[1])
        try:
            sender = check_name(raw.decode())
        except (UnicodeDecodeError, PkiError) as exc:
            raise DataAuthError(f"bad sender name {raw[:64]!r}") from exc
        key = key_for(sender)
        if key is None:
            raise DataAuthError(f"no pair key for {sender!r}")
        nonce_s = await _read_exact(stream, buf, NONCE_BYTES)
        nonce_r = os.urandom(NONCE_BYTES)
        await stream.send_all(nonce_r + _mac(key, b"recv", sender, agent_id, nonce_s, nonce_r))
        proof = await _read_exact(stream, buf, MAC_BYTES)
        if not hmac.compare_digest(proof, _mac(key, b"send", sender, agent_id, nonce_s, nonce_r)):
            raise DataAuthError(f"peer did not prove it is {sender!r} (wrong pair key)")
    return sender, bytes(buf), pair_secret(key, sender, agent_id, nonce_s, nonce_r)


async def accept(
    stream: trio.SocketStream,
    context: ssl.SSLContext,
    agent_id: str,
    key_for: Callable[[str], bytes | None],
    timeout_s: float = DATA_HANDSHAKE_S,
    seal: bool = False,
) -> tuple[str, bytes, bytes | None]:
    """Authenticate an incoming data connection by whichever method its first byte names.

    Args: as authenticate (server side) and key_authenticate_receiver. seal=True
        (terra-agent --encrypt-data): the connection's records are sealed; a TLS-authenticated
        sender must send SEAL_TAG inside TLS (module docstring).

    Returns:
        (the sender's agent id: from its certificate or its pair-key proof, bytes received
        past the authentication, the connection secret: with seal=True always, else for
        pair-key connections only).

    Raises:
        DataAuthError: as authenticate / key_authenticate_receiver.
    """
    with _key_exchange(timeout_s):
        first = await stream.socket.recv(1, socket.MSG_PEEK)
    if first == KEY_TAG:
        return await key_authenticate_receiver(stream, agent_id, key_for, timeout_s)
    identity, rest, secret = await authenticate(
        stream, context, server_side=True, timeout_s=timeout_s, seal=seal
    )
    return identity.name, rest, secret
