"""Checks of an agent's "register" message: the data address it asks the controller to
give its peers (docs/design.md section 6, "who may do what").
"""

from __future__ import annotations

import ipaddress

from terra_controller.agent_connection import ChannelError
from terra_wire import control as protocol


class RegistrationRefused(ChannelError):
    """A "register" the controller refuses for good (the agent is told so and exits)."""


def _ip(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    """`text` as an IP address (an IPv4-mapped IPv6 address as IPv4), None if it is not one."""
    try:
        ip = ipaddress.ip_address(text.split("%", 1)[0])
    except ValueError:
        return None
    mapped = getattr(ip, "ipv4_mapped", None)
    return mapped if mapped is not None else ip


def check_data_addr(data_addr: object, peer_host: str, prefixes=()) -> str:
    """The data address to record for an agent whose control connection comes from
    `peer_host` (an IP address string) and that registered `data_addr` ("host:port").

    Other agents connect to that address, so an agent may only name itself: the host must be
    an IP address equal to `peer_host` (any loopback address when both are loopback: one
    host), or lie in one of `prefixes` (ipaddress networks, terra-controller --data-prefix).
    An unspecified host (0.0.0.0, ::) is replaced by `peer_host`.

    Returns:
        "host:port" ("[host]:port" for IPv6).

    Raises:
        RegistrationRefused: not "host:port", a host name rather than an address, or an
            address of another host outside every prefix.
    """
    try:
        host, port = protocol.parse_addr(data_addr, "data_addr")
    except protocol.ProtocolError as exc:
        raise RegistrationRefused(str(exc)) from None
    ip, peer = _ip(host), _ip(peer_host)
    if ip is None:
        raise RegistrationRefused(f"data_addr {data_addr!r}: the host must be an IP address")
    if ip.is_unspecified and peer is not None:
        ip = peer
    own = ip == peer or (ip.is_loopback and peer is not None and peer.is_loopback)
    if not own and not any(ip.version == net.version and ip in net for net in prefixes):
        raise RegistrationRefused(
            f"data_addr {data_addr!r} is not this agent's address ({peer_host}) nor in a "
            "--data-prefix of the controller"
        )
    return f"[{ip}]:{port}" if ip.version == 6 else f"{ip}:{port}"
