"""Pair keys of the agents' data connections (terra_security/data_auth.py, docs/security.md).

The controller draws a random master secret at start-up and derives, for every unordered pair
of agents {a, b}, K(a, b) = HMAC-SHA256(master, "terra-data-key" | a | b) with the two names
sorted and length-prefixed. Each agent gets the keys of its pairs with the other connected
agents in its "tunnels" message, which travels over the mutual-TLS control channel only (an
insecure controller sends none). A sender and a receiver then prove to each other that they
hold K of their pair instead of running a TLS handshake per data connection.

A restarted controller has a new master: agents get the new keys when they register again;
a connection attempt between an agent with the old key and one with the new fails once and
falls back to the TLS handshake.
"""

from __future__ import annotations

import hashlib
import hmac
import os

MASTER_BYTES = 32
LABEL = b"terra-data-key"


class DataKeys:
    """Derives pair keys from one master secret.

    DataKeys(master: bytes | None = None): `master` (at least 32 bytes) for tests; None: a
    random one (os.urandom). Raises ValueError for a shorter master.
    """

    def __init__(self, master: bytes | None = None) -> None:
        if master is None:
            master = os.urandom(MASTER_BYTES)
        if len(master) < MASTER_BYTES:
            raise ValueError(f"master secret must have at least {MASTER_BYTES} bytes")
        self._master = master

    def pair_key(self, a: str, b: str) -> bytes:
        """K(a, b) == K(b, a): 32 bytes. Raises ValueError if a == b or a name is over 255
        bytes in UTF-8."""
        if a == b:
            raise ValueError("a pair key needs two different agents")
        parts = [LABEL]
        for name in sorted((a, b)):
            raw = name.encode()
            if len(raw) > 255:
                raise ValueError(f"agent name too long: {name[:32]!r}...")
            parts += [bytes([len(raw)]), raw]
        return hmac.new(self._master, b"".join(parts), hashlib.sha256).digest()

    def keys_for(self, agent: str, peers: list[str]) -> dict[str, str]:
        """{peer: K(agent, peer) as 64 hex digits} for every peer other than `agent` (the
        "keys" field of a "tunnels" message)."""
        return {p: self.pair_key(agent, p).hex() for p in peers if p != agent}
