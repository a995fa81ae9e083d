"""An agent's settings (AgentConfig), its limits and timeouts, and byte-count parsing."""

from __future__ import annotations

import hashlib
import logging
import math
import re
import socket
import ssl
from dataclasses import dataclass

from overlay.rate_limit import RATE_LIMITERS
from terra_security.data_auth import DATA_HANDSHAKE_S
from terra_wire.frames import MAX_PAYLOAD_BYTES

from .admission import Caps
from .pending import PENDING_LIMIT_BYTES, PENDING_TIMEOUT_S
from .receiver import MAX_AHEAD_BYTES

log = logging.getLogger("terra_agent.agent")

# 4 MiB receive buffers kept for reuse by all incoming data connections together (at most 128 MiB,
# only as many as were in use at once: 23 in overlay_goodput, chunks held by the reorder buffers,
# queued for hashing and being received).
PAYLOAD_BUFFERS = 32
CONTROL_HANDSHAKE_S = 10.0  # TLS handshake with the controller
CONTROL_CONNECT_S = 10.0  # TCP connect to a controller (then the next one is tried)
HASH_QUEUE_BYTES = 32 << 20  # in-order bytes received, not yet hashed / written (all flows)
MAX_DROPPED = 10_000  # flows the controller dropped, remembered to ignore their late chunks/acks
ROWS_PER_MESSAGE = 500  # flow rows per progress/register message (keeps headers < 64 KiB)
MIN_PACING_BYTES_PER_S = 64 * 1024  # a paced socket drains a 64 KiB chunk within ~1 s
PACING_REFRESH_S = 0.5  # paced links are also re-planned this often (groups that finished)
FORGED_LOG_S = 5.0  # dropped (forged) acks are logged at most this often
MAX_EPOCH_AHEAD_NS = 3600 * 10**9  # a receiver epoch may be this far in our future (clocks)
HELLO_S = DATA_HANDSHAKE_S  # an incoming data connection authenticates and says "hello" within
CONNECTION_LOG_S = 10.0  # refused incoming data connections are logged at most this often
DATA_BACKLOG = 1024  # accept queue of data and tunnel ports (a flood queued ahead of a peer
# delays it by the time to drain the queue; the controller's servers use the same)


class RegistrationRefused(Exception):
    """The controller refused this agent's registration for good (a fatal "error": unknown
    DC, wrong identity, a data address not its own); Agent.run ends with it."""


@dataclass
class AgentConfig:
    """Settings of one agent.

    controller: (host, port) of the controller's agent channel (the first one tried);
    controllers: more controllers' agent channels (the standbys of a highly available
    controller; terra-agent --controller HOST:PORT,HOST:PORT...), tried in turn after
    `controller` (`controller_addresses`; ControlSession._control_loop has the rule);
    dc: this agent's DC; agent_id: unique agent id; data_addr: (host, port) to listen on for
    tunnel connections (tunnels may add more ports on the same host); spill_dir: directory for
    reorder spill files; memory_limit: bytes of out-of-order data held in memory by all flows
    together (a MemoryBudget shared by their reorder buffers) before spilling; tls: client
    ssl.SSLContext for the control channel
    (terra_security.pki.client_context with this agent's certificate; the controller is
    verified by its `terra-controller` name), None: plain TCP (--insecure);
    progress_interval / heartbeat_interval: seconds; pending_limit:
    bytes of chunks held for flows whose descriptor has not arrived yet (all flows together);
    pending_timeout: seconds such chunks are held (from the flow's first held chunk);
    data_root: directory this agent serves and writes flow files under (terra-agent
    --data-root): a flow's "file:PATH" source / sink is PATH relative to it, resolved and kept
    inside it (sources.resolve_data_path); None (default): every file flow is refused (the
    flow is reported to the controller with an "error" naming the refusal, the agent carries on).
    data_tls_server / data_tls_client: ssl.SSLContexts authenticating data connections
    (terra_security.pki.data_server_context / data_client_context with this agent's
    certificate, made by terra-agent --pki): every incoming / outgoing data connection starts
    with a mutual TLS handshake, the peers are checked (terra_security/data_auth.py), then hello
    and chunks go in clear; None (default, --insecure, the loopback harness): plain TCP,
    unauthenticated.
    encrypt_data: after the authentication every frame of a data connection is an AES-GCM
    record (terra-agent --encrypt-data, overlay/sealed.py, terra_security/data_records.py;
    needs data_tls_server / data_tls_client; every agent of a deployment must agree, a mismatch
    closes the connection with a logged refusal); False (default): hello and chunks in clear.
    max_ahead: bytes a chunk may end past its flow's in-order point (the spill bound per flow,
    >= MAX_PAYLOAD_BYTES); chunks beyond are refused and their connection closed, the sender
    resends.
    rate_limiter: "bucket" (default: a trio TokenBucket per FlowGroup and path) or "pacing"
    (the kernel paces each tunnel connection, SO_MAX_PACING_RATE; see Agent._plan_pacing and
    docs/design.md section 5 "Rate limiting"); terra-agent --rate-limiter.
    tcp_congestion: the kernel TCP congestion control of the tunnel connections this agent
    opens (e.g. "cubic"; tcp_options.set_congestion_control; terra-agent --tcp-congestion), None
    (default): the system's.
    data_caps: connection caps of the data port and tunnel ports together (admission.Caps:
    in total and per address; beyond them a connection is closed at once); metrics_caps:
    those of the metrics port. None (default): derived from the open-file limit when the
    Agent is made (admission.caps_from_file_limit).
    metrics_socket: a bound (not yet listening) TCP socket to serve Prometheus metrics on
    (metrics.bind_metrics, terra-agent --metrics); None: no metrics.
    """

    controller: tuple[str, int]
    dc: str
    agent_id: str
    data_addr: tuple[str, int]
    spill_dir: str = "/tmp"
    memory_limit: int = 64 << 20
    tls: ssl.SSLContext | None = None
    progress_interval: float = 0.5
    heartbeat_interval: float = 2.0
    pending_limit: int = PENDING_LIMIT_BYTES
    pending_timeout: float = PENDING_TIMEOUT_S
    data_root: str | None = None
    data_tls_server: ssl.SSLContext | None = None
    data_tls_client: ssl.SSLContext | None = None
    encrypt_data: bool = False
    max_ahead: int = MAX_AHEAD_BYTES
    rate_limiter: str = "bucket"
    tcp_congestion: str | None = None
    data_caps: Caps | None = None
    metrics_socket: socket.socket | None = None
    metrics_caps: Caps | None = None
    controllers: tuple[tuple[str, int], ...] = ()

    def __post_init__(self) -> None:
        if self.max_ahead < MAX_PAYLOAD_BYTES:
            raise ValueError(f"max_ahead must be >= {MAX_PAYLOAD_BYTES} bytes (one chunk)")
        if self.rate_limiter not in RATE_LIMITERS:
            raise ValueError(
                f"rate_limiter must be one of {RATE_LIMITERS}, got {self.rate_limiter!r}"
            )
        name = self.tcp_congestion
        if name is not None and not (
            isinstance(name, str) and 0 < len(name) < 16 and name.isascii() and name.isidentifier()
        ):
            raise ValueError(f"tcp_congestion must be a kernel module name, got {name!r}")

    @property
    def controller_addresses(self) -> tuple[tuple[str, int], ...]:
        """Every controller to try, in order: `controller`, then `controllers` (duplicates
        dropped)."""
        return tuple(dict.fromkeys([tuple(self.controller), *map(tuple, self.controllers)]))

    @property
    def spill_prefix(self) -> str:
        """Name prefix of this agent's spill files: "reorder-<agent id, filename-safe>-<4-byte
        hash of the id, hex>-" (the hash keeps ids that map to one safe name apart)."""
        safe = re.sub(r"[^A-Za-z0-9._-]", "_", self.agent_id)[:64]
        tag = hashlib.blake2b(self.agent_id.encode(), digest_size=4).hexdigest()
        return f"reorder-{safe}-{tag}-"


def parse_memory(value: str) -> int:
    """Parse a byte count with optional K/M/G suffix (powers of 1024): "64M" -> 67108864.

    Raises ValueError for anything else (negative, not a number).
    """
    text = value.strip().upper().removesuffix("B")
    scale = 1
    for suffix, mult in (("K", 1 << 10), ("M", 1 << 20), ("G", 1 << 30)):
        if text.endswith(suffix):
            text, scale = text[:-1], mult
            break
    number = float(text)
    if not math.isfinite(number) or number < 0:
        raise ValueError(f"byte count must be >= 0, got {value!r}")
    return int(number * scale)
