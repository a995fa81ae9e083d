"""Connection caps of the controller's servers (coflow API, agent channel, REST) derived
from the process's open-file limit, so that a flood of connections cannot take the
descriptors the switches' connections, files and logs need (docs/security.md)."""

from __future__ import annotations

from terra_controller.transport import MAX_CONNECTIONS, MAX_PER_ADDRESS, REST_CAP

FILE_HEADROOM = (128, 8)  # descriptors kept free: at least 128, at least 1/8 of the limit


def file_limit() -> int:
    """This process's soft RLIMIT_NOFILE (open descriptors allowed)."""
    import resource

    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return soft if soft != resource.RLIM_INFINITY else 1 << 20


def caps_for_file_limit(nofile: int) -> dict[str, tuple[int, int]]:
    """Connection caps of the controller's servers that fit `nofile` open descriptors.

    max(128, nofile / 8) descriptors stay free (switches' OpenFlow connections, files, logs,
    the servers' own sockets); REST gets up to 64 (8 per address), the coflow API and the
    agent channel half of the rest each, at most MAX_CONNECTIONS; one address may hold a
    quarter of a server's connections (at least 4).

    Returns:
        {"api" | "agents" | "rest": (max_connections, max_per_address)}.

    Raises:
        ValueError: the limit leaves no room for connections (below ~200).
    """
    usable = nofile - max(FILE_HEADROOM[0], nofile // FILE_HEADROOM[1])
    if usable < 48:
        raise ValueError(f"an open-file limit of {nofile} is too small (at least 200 needed)")
    rest = min(REST_CAP[0], usable // 8)
    each = min(MAX_CONNECTIONS, (usable - rest) // 2)
    per = min(MAX_PER_ADDRESS, max(4, each // 4))
    return {
        "api": (each, per),
        "agents": (each, per),
        "rest": (rest, max(2, min(REST_CAP[1], rest // 4))),
    }
