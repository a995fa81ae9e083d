"""Authentication of data connections between agents (issue 11 item 2, docs/security.md).

When agents run with a PKI (terra-agent --pki), each data connection starts with a mutual TLS
handshake: the receiving agent is the TLS server (terra_controller.pki.data_server_context),
the sending agent the TLS client (data_client_context). Each end checks the other's
certificate: signed by the CA, role agent, and on the sender's side the name of the tunnel's
peer agent. Nothing but the handshake crosses TLS: both ends then unwrap (close_notify both
ways) and the connection carries "hello" and chunks in clear on the plain socket, so the
readv / writev path of overlay/framing.py stays.

The sender sends its "hello" only once its unwrap returned, and the receiver sends nothing
before the first chunk arrives, so the sender's end has no bytes left over from the TLS layer;
the receiver's end may have some (the "hello" and first chunks can follow the sender's
close_notify in one read): `authenticate` returns them and they go to the FrameReader first.
"""

from __future__ import annotations

import ssl

import trio

from terra_controller.pki import Identity, PkiError, Role, peer_identity

DATA_HANDSHAKE_S = 10.0  # TLS handshake + unwrap of a data connection


class DataAuthError(Exception):
    """The peer of a data connection could not be authenticated (the connection is dropped)."""


async def authenticate(
    stream: trio.SocketStream,
    context: ssl.SSLContext,
    server_side: bool,
    expected_peer: str | None = None,
    timeout_s: float = DATA_HANDSHAKE_S,
    unwrap: bool = True,
) -> tuple[Identity, bytes | trio.SSLStream]:
    """Run the TLS handshake on `stream`, check the peer, unwrap back to the plain stream.

    Args:
        stream: a connected TCP stream; used in clear afterwards (the caller closes it on
            error).
        context: the agent's data server (receiver) or client (sender) context.
        server_side: True on the receiving (accepting) end.
        expected_peer: the agent id the peer's certificate must name (sender: the tunnel's
            peer agent); None: any agent (receiver: the "hello" is checked against it).
        timeout_s: deadline of handshake and unwrap together.
        unwrap: False keeps TLS (terra-agent --encrypt-data): no unwrap, the connection goes
            on inside TLS (AES-GCM as negotiated by the contexts); both ends must agree.

    Returns:
        (the peer's Identity, bytes received past the TLS layer: the first plain bytes), or
        with unwrap=False (the peer's Identity, the trio.SSLStream to use from now on).

    Raises:
        DataAuthError: handshake failure (no / untrusted certificate, not TLS), a peer that
            is not an agent or not `expected_peer`, a timeout, a connection error meanwhile.
    """
    tls = trio.SSLStream(stream, context, server_side=server_side)
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
            if not unwrap:
                return identity, tls
            _, trailing = await tls.unwrap()
    except trio.TooSlowError:
        raise DataAuthError(f"TLS handshake not done within {timeout_s:g} s") from None
    except PkiError as exc:
        raise DataAuthError(str(exc)) from exc
    except (trio.BrokenResourceError, trio.ClosedResourceError, ssl.SSLError, OSError) as exc:
        cause = exc.__cause__ if exc.__cause__ is not None else exc
        raise DataAuthError(f"TLS handshake failed: {cause!r}") from exc
    return identity, bytes(trailing)
