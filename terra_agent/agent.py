"""The Terra agent on trio: control channel, data listeners, senders and receivers.

docs/design.md sections 5 and 6; wire format in overlay/framing.py and
terra_wire/control.py. Every task lives in the agent's nursery; a connection's errors (bad frames,
protocol violations, resets) are logged and close that connection only.

Lifecycle: run() listens on the data port, connects to the controller (reconnecting with backoff)
and registers with {dc, agent, data_addr, inflight} (over mutual TLS: the agent's certificate
names it, see docs/security.md). The controller then sends the tunnel
table (outgoing tunnels + ports to listen on), flow descriptors and per-FlowGroup per-path rates.
The agent opens one persistent connection per (peer agent, tunnel) and sends (with --pki each
data connection is first authenticated by a mutual TLS handshake, then carries data in clear:
terra_security/data_auth.py); receivers
acknowledge the offsets they delivered in order, hashed and wrote; progress (bytes acknowledged
per flow) goes to the controller every `progress_interval` seconds and at once when a flow is
fully acknowledged; receivers send "complete" when a flow's bytes are all in and its digest
matches.

Chunks that arrive before the receiver has the flow's descriptor (the sender got its copy first)
are held unacknowledged in a bounded PendingChunks store (terra_agent/pending.py) and fed to the
flow when the descriptor arrives; past the store's byte bound or timeout the connections that
carried them are closed so the sender resends. Chunks of a flow the receiver refused (its sink
cannot be opened) close their connection with an error naming the refusal.

Restart: a restarted agent knows nothing; it registers again and the controller re-sends tunnels,
flow descriptors with the acknowledged offsets, and rates. A restarted sender resumes at that
offset; a restarted receiver resumes at what its file sink holds (digest sinks restart at 0) and
its acks carry a new epoch, which makes senders rewind to the receiver's offset if needed.

Controller loss: any failure of the control channel (EOF, reset, bad frames, errors in applying
a message) ends only that connection; data connections keep moving bytes at the last rates, and
the agent reconnects with backoff. On every (re-)registration it reports its unfinished flows
("inflight" rows of "register") and sends "complete" again for every flow it received in full, so
a restarted controller learns about flows that finished while it was down or before it died.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import math
import re
import socket
import ssl
import time
from collections import OrderedDict, deque
from dataclasses import dataclass

import trio

from overlay.framing import FrameReader, FrameWriter, PayloadBuffers
from overlay.rate_limit import RATE_LIMITERS, chunk_frame_overhead, stream_rate, tls_record_rate
from overlay.rate_limited_log import RateLimitedLog
from overlay.reorder import MemoryBudget, remove_spill_files
from terra_security.data_auth import DATA_HANDSHAKE_S, DataAuthError, accept
from terra_security.pki import CONTROLLER_HOSTNAME
from terra_wire.control import (
    FlowSpec,
    ProtocolError,
    complete_message,
    error_message,
    failed_message,
    parse_flows,
    parse_pair_keys,
    parse_rates,
    parse_tunnels,
    progress_message,
    register_message,
    report_tag,
    validate_control,
    validate_data,
)
from terra_wire.frames import MAX_PAYLOAD_BYTES, FrameError

from .admission import Admission, Caps, caps_from_file_limit, serve_admitted
from .pending import PENDING_LIMIT_BYTES, PENDING_TIMEOUT_S, HeldChunk, PendingChunks
from .receiver import MAX_AHEAD_BYTES, ChunkRejected, HashQueue, InFlow
from .sender import (
    BACKOFF_MAX_S,
    BACKOFF_MIN_S,
    CONNECTION_ERRORS,
    PARKED_LINK_S,
    TUNNEL_DEAD_PEER_S,
    FlowGroupSender,
    OutFlow,
    PeerLink,
    chunk_bytes,
    detect_dead_peers,
)
from .sources import SourceError, flow_key, open_source, resolve_data_path

log = logging.getLogger(__name__)

# 4 MiB receive buffers kept for reuse by all incoming data connections together (at most 128 MiB,
# only as many as were in use at once: 23 in overlay_goodput, chunks held by the reorder buffers,
# queued for hashing and being received).
PAYLOAD_BUFFERS = 32
CONTROL_HANDSHAKE_S = 10.0  # TLS handshake with the controller
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

    controller: (host, port) of the controller's agent channel; dc: this agent's DC; agent_id:
    unique agent id; data_addr: (host, port) to listen on for tunnel connections (tunnels may add
    more ports on the same host); spill_dir: directory for reorder spill files; memory_limit:
    bytes of out-of-order data held in memory by all flows together (a MemoryBudget shared by
    their reorder buffers) before spilling; tls: client ssl.SSLContext for the control channel
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
    encrypt_data: keep TLS on data connections after the handshake (terra-agent --encrypt-data;
    needs data_tls_server / data_tls_client; every agent of a deployment must agree, a mismatch
    fails the handshake's deadline); False (default): back to plain TCP after it.
    max_ahead: bytes a chunk may end past its flow's in-order point (the spill bound per flow,
    >= MAX_PAYLOAD_BYTES); chunks beyond are refused and their connection closed, the sender
    resends.
    rate_limiter: "bucket" (default: a trio TokenBucket per FlowGroup and path) or "pacing"
    (the kernel paces each tunnel connection, SO_MAX_PACING_RATE; see Agent._plan_pacing and
    docs/design.md section 5 "Rate limiting"); terra-agent --rate-limiter.
    tcp_congestion: the kernel TCP congestion control of the tunnel connections this agent
    opens (e.g. "cubic"; sender.set_congestion_control; terra-agent --tcp-congestion), None
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
    def spill_prefix(self) -> str:
        """Name prefix of this agent's spill files: "reorder-<agent id, filename-safe>-<4-byte
        hash of the id, hex>-" (the hash keeps ids that map to one safe name apart)."""
        safe = re.sub(r"[^A-Za-z0-9._-]", "_", self.agent_id)[:64]
        tag = hashlib.blake2b(self.agent_id.encode(), digest_size=4).hexdigest()
        return f"reorder-{safe}-{tag}-"


class Agent:
    """One Terra agent. `await Agent(config).run()` runs until cancelled.

    Inspection (tests, benchmarks): out_flows {(coflow, flow): OutFlow}, in_flows {(coflow, flow):
    InFlow}, groups {(coflow, dst_dc): FlowGroupSender}, links {(peer_agent, tunnel): PeerLink},
    group_links {(coflow, dst_dc, peer_agent, tunnel): PeerLink} (--rate-limiter pacing only:
    each FlowGroup's own paced connections, see _plan_pacing; group_links_opened counts them),
    registered (trio.Event, set on each registration), epoch (receiver incarnation, ns),
    reorder_budget (MemoryBudget: out-of-order bytes in memory now / peak, all flows),
    pending (PendingChunks: chunks held for flows without a descriptor yet), payload_buffers
    (PayloadBuffers: reused receive buffers of large chunks), hash_queue (HashQueue: in-order
    bytes waiting for their flows' consumer tasks, all flows), refused
    {(coflow, flow): reason} (flows whose receiving end could not start), closed_connections
    (incoming data connections this agent closed because of an error), unauthenticated
    (incoming data connections closed because their peer failed authentication: handshake or
    certificate refused, or a "hello" naming another agent than the certificate; also counted
    in closed_connections), rejected_chunks (incoming connections closed because a chunk
    failed InFlow.admit: bad MAC or too far ahead; also counted in closed_connections),
    sinks {resolved sink path: flow key} (the flow that owns each file sink, _claim_sink),
    forged_acks (acks dropped by check_ack: not from the flow's receiver, past its size, an
    epoch in the future), data_admission / metrics_admission (admission.Admission: caps and
    counts of the data and tunnel ports / of the metrics port).
    """

    def __init__(self, config: AgentConfig) -> None:
        self.config = config
        self.epoch = time.time_ns()
        self.out_flows: dict[tuple[str, str], OutFlow] = {}
        self.in_flows: dict[tuple[str, str], InFlow] = {}
        self.groups: dict[tuple[str, str], FlowGroupSender] = {}
        self.links: dict[tuple[str, str], PeerLink] = {}
        # links of tunnels that left the table, kept connected (PeerLink.park) until their
        # tunnel returns or a tunnel table arrives PARKED_LINK_S after they were parked:
        # (peer_agent, tunnel) -> (link, trio time parked)
        self.parked: dict[tuple[str, str], tuple[PeerLink, float]] = {}
        self.links_reused = 0  # parked links put back in use (inspection)
        # --rate-limiter pacing: (coflow, dst_dc, peer_agent, tunnel) -> the group's own link
        self.group_links: dict[tuple[str, str, str, str], PeerLink] = {}
        self.group_links_opened = 0  # group_links ever created (inspection)
        self.listeners: dict[int, trio.CancelScope] = {}
        self.incoming: dict[tuple[str, str], set[trio.SocketStream]] = {}
        self.registered = trio.Event()
        self.closed_connections = 0
        self.unauthenticated = 0
        self.rejected_chunks = 0
        self.rejected_macs = 0  # of flows no longer in in_flows (metrics.py adds the live ones)
        self.rejected_ahead = 0
        self.received_bytes = 0
        self.control_connects = 0
        self.pair_keys: dict[str, bytes] = {}
        self.reorder_budget = MemoryBudget(config.memory_limit)
        self.pending = PendingChunks(config.pending_limit)
        self.payload_buffers = PayloadBuffers(MAX_PAYLOAD_BYTES, PAYLOAD_BUFFERS)
        self.hash_queue = HashQueue(HASH_QUEUE_BYTES)
        self.refused: dict[tuple[str, str], str] = {}
        self.forged_acks = 0  # acks dropped by check_ack (inspection)
        data_caps, metrics_caps = caps_from_file_limit()
        self.data_admission = Admission(config.data_caps or data_caps, "data port")
        self.metrics_admission = Admission(config.metrics_caps or metrics_caps, "metrics port")
        self._hello_log = RateLimitedLog(
            log, f"incoming data connections closed: no authentication and hello within "
            f"{HELLO_S:g} s", interval_s=CONNECTION_LOG_S,
        )  # fmt: skip
        self._auth_log = RateLimitedLog(
            log, "incoming data connections refused", logging.ERROR, CONNECTION_LOG_S
        )
        self._forged_log = RateLimitedLog(log, "acks dropped", interval_s=FORGED_LOG_S)
        self.sinks: dict[str, tuple[str, str]] = {}  # resolved sink path -> owning flow key
        self._pending_timers: set[tuple[str, str]] = set()
        # (coflow, flow) -> attempt, of flows the controller dropped (most recent last)
        self.dropped: OrderedDict[tuple[str, str], int] = OrderedDict()
        self._outbox: deque[dict] = deque()
        self._outbox_event = trio.Event()
        self._nursery: trio.Nursery | None = None

    # ------------------------------------------------------------ lifecycle

    async def run(self, task_status=trio.TASK_STATUS_IGNORED) -> None:
        """Listen on the data port, keep the control channel up, serve until cancelled.

        Raises:
            OSError: the data port cannot be bound (at start only).
            RegistrationRefused: the controller refused the registration for good (inside
                an ExceptionGroup: split it out, see cli.main).
        """
        host, port = self.config.data_addr
        listeners = await trio.open_tcp_listeners(port, host=host, backlog=DATA_BACKLOG)
        stale = remove_spill_files(self.config.spill_dir, self.config.spill_prefix)
        if stale:
            log.warning("removed %d spill files of an earlier run: %s", len(stale), stale[:5])
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                await nursery.start(self._listen, port, listeners)
                if self.config.metrics_socket is not None:
                    from .metrics import serve_metrics  # prometheus_client: only with metrics

                    await nursery.start(
                        serve_metrics,
                        self,
                        self.config.metrics_socket,
                        self.metrics_admission,
                        nursery,
                    )
                nursery.start_soon(self._control_loop)
                if self.config.rate_limiter == "pacing":
                    nursery.start_soon(self._pacing_loop)
                task_status.started(self)
        finally:
            for flow in self.out_flows.values():
                flow.close()
            for flow in self.in_flows.values():
                flow.close()

    def _spawn(self, fn, *args) -> None:
        self._nursery.start_soon(fn, *args)

    # ------------------------------------------------------------ kernel pacing

    async def _pacing_loop(self) -> None:
        """Re-plan pacing every PACING_REFRESH_S (groups finish without a message)."""
        while True:
            await trio.sleep(PACING_REFRESH_S)
            self._plan_pacing()

    def _plan_pacing(self) -> None:
        """--rate-limiter pacing: one paced connection per (FlowGroup, peer agent, tunnel).

        Kernel pacing is per socket, so each FlowGroup gets its own connection per peer agent
        and tunnel (group_links; the receiver takes any number per tunnel), paced at the
        group's rate on that tunnel converted to stream bytes (stream_rate: the frame headers of
        chunk_bytes(rate) chunks added; with encrypt_data also TLS record overhead,
        tls_record_rate). A group sending to one peer only has non-binding
        buckets (FlowGroupSender.set_kernel_paced): the kernel alone sets its pace. A group
        with flows to several peers in its DC keeps binding buckets (its rate on a tunnel is
        for all of them together) and each connection is paced at that rate as a ceiling.
        A paused path (rate 0) keeps its connection's last pacing rate (the kernel reads 0 as
        "unpaced"): its bucket stops the writes, only the bytes already queued (~100 ms) leave.
        A connection is never paced below MIN_PACING_BYTES_PER_S: at least one 64 KiB chunk
        sits in its socket, and at the LP's smallest rates (1.4 kB/s on the SWAN testbed) it
        took 46 s to leave, holding its flow (and, paused, for good); below that floor the
        path's bucket binds at its rate and the kernel drains each chunk within a second.
        Connections of finished or dropped groups and of removed or changed tunnels are
        closed here. Called on every rates/flows/drop/tunnels message and every
        PACING_REFRESH_S. No-op with the bucket limiter.
        """
        if self.config.rate_limiter != "pacing":
            return
        wanted: dict[tuple[str, str, str, str], tuple[FlowGroupSender, float | None]] = {}
        for key, group in self.groups.items():
            live = [f for f in group.flows if not f.done and f.failed is None]
            peers = {f.spec.dst_agent for f in live}
            slow = set()
            for tunnel, rate in group.rates.items():
                paced = None
                if rate > 0:
                    n = chunk_bytes(rate)
                    spec = live[0].spec if live else None
                    head = chunk_frame_overhead(key[0], spec.flow, n, spec.attempt) if spec else 0
                    paced = stream_rate(rate, n, head)
                    if self.config.encrypt_data:  # the socket carries TLS records
                        paced = tls_record_rate(paced)
                    if paced < MIN_PACING_BYTES_PER_S:  # the bucket binds, the kernel drains
                        slow.add(tunnel)
                        paced = MIN_PACING_BYTES_PER_S
                for peer in peers:
                    if (peer, tunnel) in self.links:
                        wanted[(*key, peer, tunnel)] = (group, paced)
            group.set_kernel_paced(set(group.rates) - slow if len(peers) == 1 else set())
        for gkey, link in list(self.group_links.items()):
            tunnel = self.links.get(gkey[2:])
            group = self.groups.get(gkey[:2])
            if tunnel is None or tunnel.spec != link.spec or group is None or group.done:
                link.close()  # unacknowledged chunks go back to their flows
                del self.group_links[gkey]
        for gkey, (_, paced) in wanted.items():
            link = self.group_links.get(gkey)
            if link is None:
                if paced is None:
                    continue  # opened once the path gets a rate
                link = self._new_link(self.links[gkey[2:]].spec)
                link.set_pacing_rate(paced)  # before its first byte
                self.group_links[gkey] = link
                self.group_links_opened += 1
                self._spawn(link.run)
            elif paced is not None and paced != link.pacing_rate:
                link.set_pacing_rate(paced)

    def _group_link_for(self, key: tuple[str, str], peer_agent: str, tunnel: str):
        """The paced connection of FlowGroup `key` to `peer_agent` over `tunnel`, or None."""
        return self.group_links.get((*key, peer_agent, tunnel))

    # ------------------------------------------------------------ control channel

    async def _control_loop(self) -> None:
        """Keep the control channel up: connect, register, serve; on any failure reconnect
        with backoff (50 ms doubling to 2 s). Only cancellation and a refused registration
        (RegistrationRefused, raised) end it: senders and receivers keep moving data at their
        last rates while the controller is away."""
        host, port = self.config.controller
        backoff = BACKOFF_MIN_S
        while True:
            started = trio.current_time()
            try:
                await self._control_connection(host, port)
                log.warning("controller closed the control channel")
            except RegistrationRefused:
                raise
            except (FrameError, ProtocolError) as exc:
                log.error("control channel: bad frame from controller: %s", exc)
            except (*CONNECTION_ERRORS, trio.TooSlowError, ssl.SSLError) as exc:
                log.warning("control channel to %s:%d: %s", host, port, exc)
            except Exception:  # ExceptionGroups, bugs: the agent outlives its control channel
                log.exception("control channel to %s:%d failed; reconnecting", host, port)
            if trio.current_time() - started > 2.0:
                backoff = BACKOFF_MIN_S
            await trio.sleep(backoff)
            backoff = min(BACKOFF_MAX_S, backoff * 2)

    async def _control_connection(self, host: str, port: int) -> None:
        tcp = await trio.open_tcp_stream(host, port)
        self.control_connects += 1
        detect_dead_peers(tcp)
        stream: trio.abc.Stream = tcp
        if self.config.tls is not None:
            stream = trio.SSLStream(tcp, self.config.tls, server_hostname=CONTROLLER_HOSTNAME)
            try:
                with trio.fail_after(CONTROL_HANDSHAKE_S):
                    await stream.do_handshake()
            except BaseException:
                await trio.aclose_forcefully(tcp)
                raise
        async with stream:
            await self._control_session(stream)

    async def _control_session(self, stream: trio.abc.Stream) -> None:
        writer = FrameWriter(stream)
        reader = FrameReader(stream, max_payload=0)
        host, port = self.config.data_addr
        await writer.send(
            register_message(
                self.config.dc,
                self.config.agent_id,
                f"{host}:{port}",
                inflight=self._inflight_state(),
            )
        )
        self._queue_completions()
        error: Exception | None = None
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._control_writer, writer, nursery.cancel_scope)
            try:
                await self._control_reader(reader)
            except (FrameError, RegistrationRefused, *CONNECTION_ERRORS) as exc:
                error = exc  # re-raised below, outside the nursery (no ExceptionGroup)
            nursery.cancel_scope.cancel()
        if error is not None:
            raise error

    async def _control_reader(self, reader: FrameReader) -> None:
        """Apply controller messages until EOF; a bad message gets an "error" reply."""
        while True:
            frame = await reader.read()
            if frame is None:
                return
            header, _ = frame
            try:
                await self._apply_control(header)
            except ProtocolError as exc:
                log.error("control message rejected: %s", exc)
                self.send_control(error_message(f"rejected {header.get('t')!r}: {exc}"))

    async def _control_writer(self, writer: FrameWriter, session: trio.CancelScope) -> None:
        """Drain the outbox; progress every progress_interval, heartbeats. Ends the session
        (cancels `session`) when the connection fails."""
        try:
            await self._control_writes(writer)
        except CONNECTION_ERRORS as exc:
            log.warning("control channel: send failed: %s", exc)
            session.cancel()

    async def _control_writes(self, writer: FrameWriter) -> None:
        next_progress = trio.current_time()
        next_heartbeat = trio.current_time() + self.config.heartbeat_interval
        while True:
            now = trio.current_time()
            if now >= next_progress:
                self._queue_progress(only_changed=True)
                next_progress = now + self.config.progress_interval
            if now >= next_heartbeat:
                self._outbox.append({"t": "heartbeat"})
                next_heartbeat = now + self.config.heartbeat_interval
            while self._outbox:
                try:
                    await writer.send(self._outbox[0])
                except FrameError as exc:  # cannot be encoded (e.g. too large): drop it
                    log.error("dropping control message %r: %s", self._outbox[0].get("t"), exc)
                self._outbox.popleft()
            with trio.move_on_at(min(next_progress, next_heartbeat)):
                await self._outbox_event.wait()
            self._outbox_event = trio.Event()

    def send_control(self, msg: dict) -> None:
        """Queue a control message for the controller (sent in order once connected)."""
        self._outbox.append(msg)
        self._outbox_event.set()

    def _queue_progress(self, only_changed: bool) -> None:
        rows = []
        for (coflow, flow_id), flow in self.out_flows.items():
            if only_changed and flow.reported == flow.acked:
                continue
            flow.reported = flow.acked
            rows.append((coflow, flow_id, flow.acked, report_tag(flow.spec.digest_key)))
        for i in range(0, len(rows), ROWS_PER_MESSAGE):
            self.send_control(progress_message(rows[i : i + ROWS_PER_MESSAGE]))

    def _queue_completions(self) -> None:
        """Report every flow received in full again ("complete" with its digest), and every
        flow that failed here again ("failed"), after each (re-)registration: a controller
        that restarted knows of them only from here (it keeps reports about coflows it does
        not know yet until the job master resubmits them)."""
        for flow in self.in_flows.values():
            spec = flow.spec
            if flow.done:
                self._outbox.append(
                    complete_message(
                        spec.coflow, spec.flow, flow.digest, spec.size, report_tag(spec.digest_key)
                    )
                )
            elif flow.failed is not None and flow.reported:
                self._outbox.append(self._in_failure(flow))
        for flow in self.out_flows.values():
            if flow.failed is not None:
                spec = flow.spec
                self._outbox.append(_failed(spec, flow.failed, "source"))
        self._outbox_event.set()

    def _inflight_state(self) -> list[dict]:
        """Unfinished flows for "register" (at most ROWS_PER_MESSAGE, so the header fits)."""
        rows = [
            {"coflow": c, "flow": f, "role": "send", "offset": flow.acked,
             "k": report_tag(flow.spec.digest_key)}
            for (c, f), flow in self.out_flows.items()
            if not flow.done and flow.failed is None
        ]  # fmt: skip
        rows += [
            {"coflow": c, "flow": f, "role": "recv", "offset": flow.acknowledged,
             "k": report_tag(flow.spec.digest_key)}
            for (c, f), flow in self.in_flows.items()
            if not flow.done and flow.failed is None
        ]  # fmt: skip
        if len(rows) > ROWS_PER_MESSAGE:
            log.warning(
                "%d flows in flight; register reports the first %d", len(rows), ROWS_PER_MESSAGE
            )
            self._queue_progress(only_changed=False)  # senders' offsets reach the controller anyway
        return rows[:ROWS_PER_MESSAGE]

    async def _apply_control(self, header: dict) -> None:
        """Validate and apply one controller message; ProtocolError if it is bad."""
        validate_control(header)
        kind = header["t"]
        if kind == "registered":
            log.info("registered with the controller as %s", self.config.agent_id)
            self.registered.set()
            self.registered = trio.Event()
        elif kind == "tunnels":
            await self._apply_tunnels(header)
        elif kind == "flows":
            for spec in parse_flows(header):
                self._add_flow(spec)
            self._plan_pacing()
        elif kind == "rates":
            for group in parse_rates(header):
                if group.paths or group.key in self.groups:  # no group for a pause alone
                    self._group(group.key).set_rates(group.paths)
            self._plan_pacing()
        elif kind == "drop":
            self._drop_flows(header["coflow"], header["flows"])
            self._plan_pacing()
        elif kind == "error":
            log.error("controller reports an error: %s", header["message"])
            if header.get("fatal") is True:
                raise RegistrationRefused(header["message"])
        elif kind not in ("heartbeat", "ack"):
            raise ProtocolError(f"{kind!r} is not a controller-to-agent message")
        if "id" in header:
            self.send_control({"t": "ack", "id": header["id"]})

    # ------------------------------------------------------------ tunnels and flows

    async def _apply_tunnels(self, header: dict) -> None:
        specs, listen = parse_tunnels(header)
        if self.config.data_tls_server is not None:  # keys are of no use without --pki
            self.pair_keys = parse_pair_keys(header)
        wanted = {(s.peer_agent, s.tunnel): s for s in specs}
        now = trio.current_time()
        for key, link in list(self.links.items()):
            if key not in wanted or wanted[key] != link.spec:
                del self.links[key]
                if key not in wanted and link.park():
                    log.info("tunnel %s to %s removed: link parked", key[1], key[0])
                    self.parked[key] = (link, now)
                else:
                    log.info("tunnel %s to %s removed or changed: closing its link", *key[::-1])
                    link.close()
        for key, (link, since) in list(self.parked.items()):
            if key in wanted or now - since > PARKED_LINK_S:
                del self.parked[key]
                if wanted.get(key) == link.spec and link.unpark():
                    log.info("tunnel %s to %s back: parked link reused", key[1], key[0])
                    self.links[key] = link
                    self.links_reused += 1
                else:
                    link.close()
        for key, spec in wanted.items():
            if key not in self.links:
                link = self._new_link(spec)
                self.links[key] = link
                self._spawn(link.run)
        for port in listen:
            if port not in self.listeners:
                await self._start_listener(port)
        self._plan_pacing()
        self._wake_all()

    def _new_link(self, spec) -> PeerLink:
        """A PeerLink over tunnel `spec` with this agent's identity, TLS and pair keys."""
        return PeerLink(
            spec,
            self.config.agent_id,
            self.config.data_addr[0],
            self._on_ack,
            self._wake_all,
            tls=self.config.data_tls_client,
            encrypt=self.config.encrypt_data,
            key_for=self._pair_key,
            congestion=self.config.tcp_congestion,
        )

    def _pair_key(self, peer_agent: str) -> bytes | None:
        """The data connections' pair key of this agent and `peer_agent` (from the latest
        "tunnels" message), or None."""
        return self.pair_keys.get(peer_agent)

    def _link_for(self, peer_agent: str, tunnel: str) -> PeerLink | None:
        return self.links.get((peer_agent, tunnel))

    def _group(self, key: tuple[str, str]) -> FlowGroupSender:
        group = self.groups.get(key)
        if group is None:
            link_for = self._link_for
            if self.config.rate_limiter == "pacing":
                link_for = functools.partial(self._group_link_for, key)
            group = FlowGroupSender(key, link_for, self._spawn, self._flow_failed)
            self.groups[key] = group
        return group

    def _add_flow(self, spec: FlowSpec) -> None:
        me = self.config.agent_id
        if spec.src_agent != me and spec.dst_agent != me:
            raise ProtocolError(f"flow {spec.coflow}/{spec.flow} names neither end as {me!r}")
        held = [f for f in (self.in_flows.get(spec.key), self.out_flows.get(spec.key)) if f]
        if any(f.spec.attempt < spec.attempt for f in held):  # missed the "drop" (reconnected)
            self._drop_flows(spec.coflow, [spec.flow])
        self.dropped.pop(spec.key, None)
        cause = "sink"
        try:
            if spec.dst_agent == me and spec.key not in self.in_flows:
                self._add_inflow(spec)
            cause = "source"
            if spec.src_agent == me and spec.key not in self.out_flows:
                source = open_source(
                    spec.source,
                    flow_key(spec.coflow, spec.flow),
                    spec.size,
                    data_root=self.config.data_root,
                )
                flow = OutFlow(spec, source)
                self.out_flows[spec.key] = flow
                self._group((spec.coflow, spec.dst_dc)).add_flow(flow)
        except (SourceError, OSError, ValueError) as exc:  # ValueError: e.g. NUL in a path
            log.error("flow %s/%s cannot start: %s", spec.coflow, spec.flow, exc)
            self.send_control(_failed(spec, str(exc), cause))

    def _drop_flows(self, coflow: str, flow_ids: list[str]) -> None:
        """Forget flows the controller dropped ("drop": their coflow failed or was cancelled,
        or a flow restarts from byte 0 and its new descriptor follows): senders stop and
        release their sources, receivers stop and close their sinks, chunks held for them are
        discarded. Their late chunks and acks are ignored from now on (`dropped`)."""
        for fid in flow_ids:
            key = (coflow, fid)
            attempt = self.dropped.pop(key, 0)
            out = self.out_flows.pop(key, None)
            if out is not None:
                attempt = max(attempt, out.spec.attempt)
                out.failed = out.failed or "dropped by the controller"
                out.acked = out.spec.size  # nothing left to send or requeue on any link
                out.resend.clear()
                out.close()
                group = self.groups.get((coflow, out.spec.dst_dc))
                if group is not None:
                    group.remove_flow(out)
            inflow = self.in_flows.pop(key, None)
            if inflow is not None:
                self.rejected_macs += inflow.rejected_macs
                self.rejected_ahead += inflow.rejected_ahead
                attempt = max(attempt, inflow.spec.attempt)
                inflow.abort(f"flow {coflow}/{fid}: dropped by the controller")
                path = getattr(inflow.sink, "path", None)
                if path is not None and self.sinks.get(path) == key:
                    del self.sinks[path]
            self.refused.pop(key, None)
            self.pending.drop(key)
            self.dropped[key] = attempt
            while len(self.dropped) > MAX_DROPPED:
                self.dropped.popitem(last=False)
            if out is not None or inflow is not None:
                log.info("flow %s/%s dropped by the controller", coflow, fid)

    def _claim_sink(self, spec: FlowSpec) -> None:
        """Make flow `spec` the owner of its sink file, by resolved path (sinks {path: flow
        key}); a path a live flow of another key owns (receiving: not done, not failed) is
        refused, so its part file is never truncated under it.

        Raises:
            SourceError: the path is owned by another live flow, or refused
                (resolve_data_path).
        """
        if not spec.sink.startswith("file:"):
            return
        path = resolve_data_path(self.config.data_root, spec.sink[5:], "sink")
        owner_key = self.sinks.get(path)
        owner = self.in_flows.get(owner_key) if owner_key is not None else None
        if owner_key != spec.key and owner is not None and not owner.done and not owner.failed:
            raise SourceError(
                f"sink {spec.sink[5:]!r} refused: flow {owner_key[0]}/{owner_key[1]} is "
                "still writing that file"
            )
        self.sinks[path] = spec.key

    def _add_inflow(self, spec: FlowSpec) -> None:
        """Start receiving flow `spec` and feed it the chunks held for it; a flow whose sink
        cannot be opened or is owned by another live flow (_claim_sink) is recorded in
        `refused` (SourceError / OSError / ValueError re-raised)."""
        try:
            self._claim_sink(spec)
            inflow = InFlow(
                spec,
                self.config.memory_limit,
                self.config.spill_dir,
                self.reorder_budget,
                self.hash_queue,
                data_root=self.config.data_root,
                max_ahead=self.config.max_ahead,
                spill_prefix=self.config.spill_prefix,
            )
        except (SourceError, OSError, ValueError) as exc:
            self.refused[spec.key] = str(exc)
            held = self.pending.drop(spec.key)
            if held:
                self._close_streams(
                    held, f"flow {spec.coflow}/{spec.flow} refused ({exc}): its held chunks"
                )
            raise
        self.refused.pop(spec.key, None)
        self.in_flows[spec.key] = inflow
        if inflow.check_digest():  # a restarted receiver that already had every byte
            self._report_complete(inflow)
        else:
            self._spawn(self._consume, inflow)
        held = self.pending.pop(spec.key)
        if held:
            log.info(
                "flow %s/%s: descriptor arrived; feeding %d held chunks (%d bytes)",
                spec.coflow,
                spec.flow,
                len(held),
                sum(len(c.payload) for c in held),
            )
            self._spawn(self._feed_held, inflow, held)

    def _on_ack(
        self,
        coflow: str,
        flow_id: str,
        offset: int,
        epoch: int,
        attempt: int = 0,
        peer: str | None = None,
    ) -> None:
        """Apply an ack that arrived on a data connection to `peer` (PeerLink: the tunnel's
        peer agent, authenticated with --pki; None: not checked, in-process callers).

        Believed only from the flow's receiver (spec.dst_agent), for its current attempt,
        with an offset within the flow and a plausible receiver epoch (check_ack); any other
        is dropped and logged (at most once per FORGED_LOG_S). An ack of a flow this agent
        does not send raises ProtocolError (its connection is closed), unless the controller
        dropped that flow.
        """
        flow = self.out_flows.get((coflow, flow_id))
        if flow is None:
            if (coflow, flow_id) in self.dropped:
                return  # a late ack of a flow the controller dropped
            raise ProtocolError(f"ack for unknown flow {coflow}/{flow_id}")
        if attempt != flow.spec.attempt:
            return  # an ack of the flow's previous attempt (it restarted from byte 0)
        problem = check_ack(flow.spec, offset, epoch, peer)
        if problem is not None:
            self.forged_acks += 1
            self._forged_log.event(problem)
            return
        was_done = flow.done
        added = flow.on_ack(offset, epoch)
        group = self.groups.get((coflow, flow.spec.dst_dc))
        if added and group is not None:
            group._ensure_tasks()
            group.notify()
        if flow.done and not was_done:
            flow.source.close()  # frees a synthetic block / file descriptor (reopened if needed)
            flow.reported = flow.acked
            tag = report_tag(flow.spec.digest_key)
            self.send_control(progress_message([(coflow, flow_id, flow.acked, tag)]))
            if group is not None:
                group.notify()

    def _report_complete(self, flow: InFlow) -> None:
        flow.reported = True
        spec = flow.spec
        log.info("flow %s/%s complete (%d bytes)", spec.coflow, spec.flow, spec.size)
        tag = report_tag(spec.digest_key)
        self.send_control(complete_message(spec.coflow, spec.flow, flow.digest, spec.size, tag))

    def _flow_failed(self, flow: OutFlow, message: str) -> None:
        self.send_control(_failed(flow.spec, message, "source"))

    @staticmethod
    def _in_failure(flow: InFlow) -> dict:
        """The "failed" report of a receiving flow: cause "digest" (the controller may send it
        again) or "sink"."""
        cause = "digest" if flow.digest_mismatch else "sink"
        return _failed(flow.spec, flow.failed, cause)

    def _wake_all(self) -> None:
        for group in self.groups.values():
            group.notify()

    # ------------------------------------------------------------ data listeners (receiver)

    async def _start_listener(self, port: int) -> None:
        """Listen on a tunnel port (bound before this returns); errors are logged and reported."""
        try:
            await self._nursery.start(self._listen, port)
        except OSError as exc:
            message = f"cannot listen on {self.config.data_addr[0]}:{port}: {exc}"
            log.error(message)
            self.send_control(error_message(message))

    async def _listen(
        self, port: int, listeners=None, task_status=trio.TASK_STATUS_IGNORED
    ) -> None:
        if listeners is None:
            listeners = await trio.open_tcp_listeners(
                port, host=self.config.data_addr[0], backlog=DATA_BACKLOG
            )
        with trio.CancelScope() as scope:
            self.listeners[port] = scope
            try:
                await serve_admitted(
                    self._serve_incoming,
                    listeners,
                    self.data_admission,
                    self._nursery,
                    task_status=task_status,
                )
            finally:
                self.listeners.pop(port, None)

    def stop_listening(self, port: int) -> None:
        """Close the listener on `port` (tests: make a tunnel unreachable)."""
        scope = self.listeners.get(port)
        if scope is not None:
            scope.cancel()

    def close_incoming(self, peer_agent: str, tunnel: str) -> int:
        """Abort the incoming connections from `peer_agent` on `tunnel`; returns how many."""
        streams = self.incoming.get((peer_agent, tunnel), set())
        for stream in list(streams):
            stream.socket.close()
        return len(streams)

    async def _serve_incoming(self, stream: trio.SocketStream) -> None:
        """One incoming tunnel connection: (authentication,) hello, then chunks; acks go back
        on it. With data_tls_server, the peer's certificate names the agent the "hello" must
        name; chunks are then accepted only for flows whose sender is that agent (_deliver)."""
        peer = "?"
        key = None
        try:
            async with stream:
                detect_dead_peers(stream, TUNNEL_DEAD_PEER_S)
                with trio.fail_after(HELLO_S):  # authentication and "hello": one deadline
                    greeting = await self._greet(stream)
                if greeting is None:
                    return
                self.data_admission.authenticated(stream)  # never evicted from now on
                reader, writer, authenticated, hello = greeting
                peer = f"{hello['agent']} via {hello['tunnel']}"
                key = (hello["agent"], hello["tunnel"])
                self.incoming.setdefault(key, set()).add(stream)
                while True:
                    frame = await reader.read()
                    if frame is None:
                        return
                    # the sender whose flows this connection may carry (_deliver checks it):
                    # the certificate's name when authenticated (== hello's), else hello's
                    sender = authenticated or hello["agent"]
                    await self._receive_chunk(frame[0], frame[1], writer, sender, stream)
        except trio.TooSlowError:
            self.closed_connections += 1
            self._hello_log.event(peer)
        except DataAuthError as exc:
            self.unauthenticated += 1
            self.closed_connections += 1
            self._auth_log.event(exc)
        except ChunkRejected as exc:
            self.closed_connections += 1
            self.rejected_chunks += 1
            log.error("incoming connection from %s: %s", peer, exc)
        except (FrameError, ProtocolError) as exc:
            self.closed_connections += 1
            log.error("incoming connection from %s: %s; closing it", peer, exc)
        except CONNECTION_ERRORS as exc:
            log.warning("incoming connection from %s: %s", peer, exc)
        except Exception:
            self.closed_connections += 1
            log.exception("incoming connection from %s failed; closing it", peer)
        finally:
            if key is not None:
                self.incoming.get(key, set()).discard(stream)
            self.pending.drop_stream(stream)  # the sender requeues what it sent on it

    async def _greet(self, stream: trio.SocketStream):
        """Authenticate an incoming data connection (with data_tls_server) and read its
        "hello"; (reader, writer, the authenticated sender or None, hello), or None when the
        peer closed first.

        Raises:
            DataAuthError: authentication failed. ProtocolError / FrameError: the first frame
                is not a valid "hello", or names another agent than the certificate.
        """
        initial, channel = b"", stream
        authenticated = None
        if self.config.data_tls_server is not None:
            encrypt = self.config.encrypt_data
            authenticated, rest = await accept(
                stream,
                self.config.data_tls_server,
                self.config.agent_id,
                self._pair_key,
                unwrap=not encrypt,
            )
            if encrypt:
                channel = rest
            else:
                initial = rest
        reader = FrameReader(channel, buffers=self.payload_buffers, initial=initial)
        writer = FrameWriter(channel)
        frame = await reader.read()
        if frame is None:
            return None
        hello = validate_data(frame[0])
        if hello["t"] != "hello":
            raise ProtocolError(f"first frame must be 'hello', got {hello['t']!r}")
        if authenticated is not None and hello["agent"] != authenticated:
            self.unauthenticated += 1
            raise ProtocolError(
                f"'hello' names agent {hello['agent']!r}, the peer's certificate {authenticated!r}"
            )
        return reader, writer, authenticated, hello

    async def _receive_chunk(
        self, header: dict, payload, writer: FrameWriter, peer: str, stream: trio.SocketStream
    ) -> None:
        validate_data(header)
        if header["t"] != "chunk":
            raise ProtocolError(f"unexpected {header['t']!r} frame on a receiving connection")
        key = (header["c"], header["f"])
        attempt = header.get("a", 0)
        self.received_bytes += len(payload)
        flow = self.in_flows.get(key)
        if flow is None:
            reason = self.refused.get(key)
            if reason is not None:
                raise ProtocolError(
                    f"chunk for flow {key[0]}/{key[1]}, which this agent refused: {reason}"
                )
            if key in self.dropped and attempt <= self.dropped[key]:
                return  # a late chunk of a flow the controller dropped: nobody wants it
            chunk = HeldChunk(
                header["o"], payload, header.get("d"), stream, writer, peer, attempt, header["m"]
            )
            self._hold(key, chunk)
            return
        await self._deliver(
            flow, header["o"], payload, header.get("d"), writer, peer, attempt, header["m"]
        )

    async def _deliver(
        self,
        flow: InFlow,
        offset: int,
        payload,
        digest,
        writer: FrameWriter,
        peer: str,
        attempt: int = 0,
        mac: bytes = b"",
    ) -> None:
        """Give one chunk to its flow (hashed later by the flow's _consume task), report a
        completion / failure not reported yet. A chunk that added in-order bytes is acked by
        _consume once they are hashed and written; any other (out of order, a duplicate: its
        sender may have missed an ack) gets the flow's acknowledged offset on `writer` at once.
        A chunk of an earlier attempt of the flow (`attempt`: the chunk's "a") is ignored.

        `peer`: the agent that sent the chunk (authenticated by its certificate when the agent
        has data_tls_server); a chunk whose flow's src_agent is another agent closes the
        connection before it reaches the flow (sink, reorder buffer, spill file). So does a
        chunk whose `mac` ("m", its leaf MACs) is not the flow key's MAC list of its bytes and
        offset (tampered, or made without the key; terra_security/integrity.py), a chunk off the
        leaf
        grid and a chunk ending more than the flow's max_ahead bytes past its in-order point
        (InFlow.admit): the connection's end makes the sender requeue everything
        unacknowledged on it, so the flow still completes.

        Raises ProtocolError (wrong sender, bad MAC, too far ahead, chunk past the flow's end,
        changed digest, a later attempt than the receiver's descriptor) and the writer's
        connection errors.
        """
        key = flow.spec.key
        if peer != flow.spec.src_agent:
            raise ProtocolError(
                f"chunk for flow {key[0]}/{key[1]} from agent {peer!r}, "
                f"its sender is {flow.spec.src_agent!r}"
            )
        if attempt != flow.spec.attempt:
            if attempt < flow.spec.attempt:
                return  # the flow restarted from byte 0: bytes of the old attempt are void
            raise ProtocolError(
                f"chunk of attempt {attempt} for flow {key[0]}/{key[1]}, which is at attempt "
                f"{flow.spec.attempt} here; closing so the sender resends"
            )
        flow.admit(offset, payload, mac)
        flow.ack_writer = writer
        added = await flow.receive(offset, payload, digest, mac)
        self._report_if_finished(flow)
        if not added:
            await writer.send(self._ack(flow))

    async def _consume(self, flow: InFlow) -> None:
        """The task that hashes and writes one receiving flow's in-order bytes (InFlow.consume)
        until it is complete or failed; acks each batch on the connection of the latest chunk
        and reports the completion (or failure) once."""
        key = flow.spec.key
        try:
            while await flow.consume():
                if flow.complete:
                    self._report_if_finished(flow)
                writer = flow.ack_writer
                if writer is not None:
                    try:
                        await writer.send(self._ack(flow))
                    except CONNECTION_ERRORS:
                        pass  # the sender resends on another connection; that one acks
        except Exception as exc:  # a bug or an unexpected sink error: fail this flow only
            log.exception("flow %s/%s: consuming its bytes failed", *key)
            flow.fail(f"flow {key[0]}/{key[1]}: consuming its bytes failed: {exc!r}")
        self._report_if_finished(flow)

    def _ack(self, flow: InFlow) -> dict:
        key = flow.spec.key
        ack = {"t": "ack", "c": key[0], "f": key[1], "o": flow.acknowledged, "e": self.epoch}
        if flow.spec.attempt:
            ack["a"] = flow.spec.attempt
        return ack

    def _report_if_finished(self, flow: InFlow) -> None:
        """Report a flow's completion (digest matched) or failure to the controller, once."""
        if flow.reported or not (flow.check_digest() or flow.failed is not None):
            return
        if flow.done:
            self._report_complete(flow)
        else:
            flow.reported = True
            self.send_control(self._in_failure(flow))

    # ------------------------------------------------------------ chunks ahead of descriptors

    def _hold(self, key: tuple[str, str], chunk: HeldChunk) -> None:
        """Hold a chunk of a flow without a descriptor (unacknowledged); ProtocolError (its
        connection closes, the sender resends) when the pending store is full."""
        first = self.pending.add(key, chunk)
        if first is None:
            self.pending.drop_stream(chunk.stream)
            raise ProtocolError(
                f"chunk for unknown flow {key[0]}/{key[1]}: {self.pending.held_bytes} bytes "
                f"already held for flows without a descriptor (limit "
                f"{self.pending.limit_bytes}); closing so the sender resends"
            )
        if first:
            log.info("chunk for flow %s/%s before its descriptor: holding it", *key)
        if key not in self._pending_timers:
            self._pending_timers.add(key)
            self._spawn(self._expire_held, key)

    async def _expire_held(self, key: tuple[str, str]) -> None:
        """After pending_timeout, drop what is still held for `key` and close its connections."""
        try:
            await trio.sleep(self.config.pending_timeout)
        finally:
            self._pending_timers.discard(key)
        held = self.pending.drop(key)
        if held:
            self._close_streams(
                held,
                f"chunks for unknown flow {key[0]}/{key[1]}: no descriptor within "
                f"{self.config.pending_timeout:g} s of the first",
            )

    def _close_streams(self, held: list[HeldChunk], why: str) -> None:
        """Close the connections that carried `held` (dropped) chunks so the sender resends."""
        streams = {id(c.stream): c.stream for c in held}
        for stream in streams.values():
            self.pending.drop_stream(stream)
            self.closed_connections += 1
            stream.socket.close()
        log.error(
            "%s: dropped %d held bytes, closed %d connection(s) so the sender resends",
            why,
            sum(len(c.payload) for c in held),
            len(streams),
        )

    async def _feed_held(self, flow: InFlow, held: list[HeldChunk]) -> None:
        """Deliver chunks held before `flow`'s descriptor arrived, in arrival order."""
        closed: set[int] = set()
        for chunk in held:
            if id(chunk.stream) in closed:
                continue
            try:
                await self._deliver(
                    flow,
                    chunk.offset,
                    chunk.payload,
                    chunk.digest,
                    chunk.writer,
                    chunk.peer,
                    chunk.attempt,
                    chunk.mac,
                )
            except ProtocolError as exc:
                closed.add(id(chunk.stream))
                self._close_streams([chunk], f"held chunk from {chunk.peer}: {exc}")
            except CONNECTION_ERRORS:
                closed.add(id(chunk.stream))  # connection gone: the sender requeued its chunks


def check_ack(spec: FlowSpec, offset: int, epoch: int, peer: str | None) -> str | None:
    """Why an ack of flow `spec` (its current attempt) from agent `peer` cannot be believed,
    or None: the peer is not the flow's receiver, the offset is past the flow's size, or the
    receiver epoch (its start time, ns since the epoch) lies more than MAX_EPOCH_AHEAD_NS in
    this host's future (such an epoch would make the receiver's genuine acks look stale)."""
    name = f"{spec.coflow}/{spec.flow}"
    if peer is not None and peer != spec.dst_agent:
        return f"agent {peer!r} acked flow {name}, whose receiver is {spec.dst_agent!r}"
    if offset > spec.size:
        return f"offset {offset} past the {spec.size} bytes of flow {name}"
    if epoch > time.time_ns() + MAX_EPOCH_AHEAD_NS:
        return f"epoch {epoch} of flow {name} lies in the future"
    return None


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


def _failed(spec: FlowSpec, reason: str, cause: str) -> dict:
    """The "failed" report of flow attempt `spec` (cause "source", "sink" or "digest"), with
    the attempt's tag."""
    return failed_message(
        spec.coflow, spec.flow, reason, cause, spec.attempt, report_tag(spec.digest_key)
    )
