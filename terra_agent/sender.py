"""Sending side: flows, FlowGroups with per-path token buckets, and peer links (docs/design.md 5).

- OutFlow: one flow's sender state. New bytes are read from the source in order (and hashed for
  the keyed flow digest, terra_security/integrity.py); each chunk sent gets its keyed MAC.
  Unacknowledged ranges that must be resent sit in `resend` and are re-read from the
  (re-readable) source.
- PeerLink: the persistent TCP connection to one peer agent over one tunnel (the tunnel's own
  destination port). It remembers the chunk ranges sent on it and not yet acknowledged; when the
  connection fails or the tunnel is removed they go back to their flows' resend queues, so the
  FlowGroup's other paths carry them. It reconnects with exponential backoff.
- FlowGroupSender: the flows of one FlowGroup (coflow, this DC -> dst_dc); one task per path
  pulls chunks from the group (resends first) after taking tokens from that path's TokenBucket,
  so bytes per path follow the controller's rates; rate 0 pauses the path.
"""

from __future__ import annotations

import logging
import math
from collections import deque

import trio

from overlay.framing import FrameReader, FrameWriter
from overlay.rate_limit import TokenBucket, set_pacing_rate
from overlay.sealed import SealedReader, SealedWriter
from terra_security.data_auth import DataAuthError, authenticate, key_authenticate_sender
from terra_security.data_records import TO_RECEIVER, TO_SENDER, Opener, RecordError, Sealer
from terra_security.integrity import LEAF_BYTES, FlowDigest, FlowKeys, align_down
from terra_wire.control import FlowSpec, ProtocolError, TunnelSpec, validate_data
from terra_wire.frames import FrameError, chunk_header

from .sources import MAX_CHUNK_BYTES
from .tcp_options import (
    allow_unsent_bytes,
    detect_dead_peers,
    kernel_queued_bytes,
    set_congestion_control,
)

log = logging.getLogger(__name__)

MIN_CHUNK_BYTES = LEAF_BYTES  # chunks hold whole 64 KiB leaves (terra_security/integrity.py)
CHUNK_SECONDS = 0.01  # a chunk is about this much of its path's rate (rate_limit.py advice)
ECF_RECHECK_S = 0.02  # a path that left a group's last bytes to faster paths looks again after
BACKOFF_MIN_S = 0.05
BACKOFF_MAX_S = 2.0
UNREACHABLE_BACKOFF_MAX_S = 10.0  # reconnect backoff bound while a peer cannot be reached
MIN_UNSENT_BYTES = 16 * 1024  # data connections queue in the kernel at most one chunk of unsent
# bytes, and at least this many (trio's default TCP_NOTSENT_LOWAT for every SocketStream)
PACED_UNSENT_S = 0.1  # a paced link queues ~100 ms of its rate unsent (docs/design.md 5.1)
# Tunnel connections cross the emulated/real WAN: a burst of losses there (a link failure and
# the re-route, full queues) stalls a live connection in TCP's exponential RTO backoff
# (0.2 s doubling: 6 lost retransmissions = 12.6 s) and silences idle connections' keepalive
# probes. The default bound (tcp_options.DEAD_PEER_S, 10 s) aborted such connections with
# ETIMEDOUT (SWAN testbed, tunnels not crossing the failed link). A dead peer agent is also
# noticed by the controller (AGENT_SILENCE_S), which then removes its tunnels; this bound only
# ends connections nobody else ends.
TUNNEL_DEAD_PEER_S = 60.0
CONNECTION_ERRORS = (trio.BrokenResourceError, trio.ClosedResourceError, OSError)
PARKED_LINK_S = 30.0  # a removed tunnel's idle connection is kept this long for its return


def paced_unsent_bytes(chunk_size: int, pacing_rate: float) -> int:
    """Unsent bytes a paced connection may queue in the kernel: PACED_UNSENT_S (100 ms) of its
    pacing rate (bytes/s), at least one chunk (`chunk_size` bytes) and MIN_UNSENT_BYTES, at
    most 4 x MAX_CHUNK_BYTES (16 MiB: "unlimited" rates)."""
    queued = min(pacing_rate * PACED_UNSENT_S, 4 * MAX_CHUNK_BYTES)  # inf -> the cap
    return int(max(MIN_UNSENT_BYTES, chunk_size, queued))


def chunk_bytes(rate: float) -> int:
    """Chunk size for a path at `rate` bytes/s: rate * 10 ms rounded down to whole 64 KiB
    leaves, clamped to [64 KiB, 4 MiB] (MIN_CHUNK_BYTES, MAX_CHUNK_BYTES). Below 6.5 MB/s a
    chunk is more than 10 ms of the rate (the token bucket then sends coarser bursts)."""
    if not math.isfinite(rate):
        return MAX_CHUNK_BYTES
    n = int(min(MAX_CHUNK_BYTES, max(MIN_CHUNK_BYTES, rate * CHUNK_SECONDS)))
    return align_down(n)


class OutFlow:
    """Sender state of one flow.

    OutFlow(spec: FlowSpec, source): starts at spec.offset (rounded down to a leaf boundary;
    bytes before it are re-read and their leaf MACs made, so the digest covers the whole flow).
    keys: the flow's FlowKeys (spec.digest_key). Attributes: acked (bytes the receiver
    acknowledged), next_offset (new-data frontier), resend (deque of (offset, length) to send
    again), digest (hex flow digest, once the MACs of every byte were made: the MACs of new
    chunks are made inline by take(), one keyed pass, and fold into it), epoch
    (receiver incarnation of the last ack). Chunks start on leaf boundaries
    (terra_security/integrity.py LEAF_BYTES) and hold whole leaves but at the flow's end.
    """

    def __init__(self, spec: FlowSpec, source) -> None:
        self.spec = spec
        self.source = source
        self.keys = FlowKeys(spec.digest_key, spec.digest_alg)
        self._digest = FlowDigest(self.keys, spec.size)
        self.next_offset = 0
        self.digest: str | None = None
        self.acked = spec.offset if spec.offset >= spec.size else align_down(spec.offset)
        self.resend: deque[tuple[int, int]] = deque()
        self.epoch: int | None = None
        self.reported = -1
        self.failed: str | None = None
        self._hash_to(self.acked)

    @property
    def done(self) -> bool:
        """True once the receiver acknowledged every byte."""
        return self.acked >= self.spec.size

    def _hash_to(self, offset: int) -> None:
        """Advance the new-data frontier to `offset` (a leaf boundary or the flow's size),
        making and folding the MACs of the bytes it passes."""
        while self.next_offset < offset:
            n = min(MAX_CHUNK_BYTES, offset - self.next_offset)
            self._new_macs(self.next_offset, self.source.read(self.next_offset, n))

    def _new_macs(self, offset: int, data) -> bytes:
        """MACs of new bytes at the frontier; folds them into the digest, moves the frontier."""
        macs = self.keys.leaf_macs(offset, data)
        self._digest.add_macs(offset, macs, len(data))
        self.next_offset = offset + len(data)
        if self.next_offset >= self.spec.size and self.digest is None:
            self.digest = self._digest.hexdigest()
        return macs

    def unsent_bytes(self) -> int:
        """Bytes still to be sent: resend ranges above the acknowledged offset plus the bytes
        past the new-data frontier (0 once done)."""
        if self.done:
            return 0
        resend = sum(max(0, o + n - max(o, self.acked)) for o, n in self.resend)
        return resend + max(0, self.spec.size - self.next_offset)

    def has_work(self) -> bool:
        """True when there is something to send (a resend or new bytes)."""
        while self.resend and sum(self.resend[0]) <= self.acked:
            self.resend.popleft()
        return bool(self.resend) or (self.next_offset < self.spec.size and not self.done)

    def take(self, max_len: int) -> tuple[int, object, bytes, str | None] | None:
        """Next chunk to send: (offset, data, its leaf MACs, digest if the chunk ends the flow
        else None). max_len: most bytes, a multiple of LEAF_BYTES.

        Resends (unacknowledged ranges of failed connections) come first, then new bytes.
        Returns None when there is nothing to send.
        """
        while self.resend:
            offset, length = self.resend.popleft()
            end = offset + length
            if end <= self.acked:
                continue
            offset = align_down(max(offset, self.acked))
            n = min(max_len, end - offset)
            if offset + n < end:
                self.resend.appendleft((offset + n, end - offset - n))
            return self._chunk(offset, n)
        if self.done or self.next_offset >= self.spec.size:
            return None
        offset = self.next_offset
        data = self.source.read(offset, min(max_len, self.spec.size - offset))
        macs = self._new_macs(offset, data)
        return offset, data, macs, self.digest if self.next_offset >= self.spec.size else None

    def _chunk(self, offset: int, n: int) -> tuple[int, object, bytes, str | None]:
        """A resent chunk: re-read and MACed again (a pass over resent bytes only)."""
        end = offset + n
        if end > self.next_offset:  # only after a jump; keep the digest complete
            self._hash_to(end)
        data = self.source.read(offset, n)
        macs = self.keys.leaf_macs(offset, data)
        return offset, data, macs, self.digest if end >= self.spec.size else None

    def on_ack(self, offset: int, epoch: int) -> bool:
        """Apply a receiver ack (delivered `offset`, receiver `epoch`); True if work was added.

        Acks of one receiver incarnation only move `acked` forward. An ack from a newer receiver
        incarnation is authoritative: a receiver that lost its state (lower offset) makes the
        sender rewind and resend [offset, frontier); a higher offset moves the frontier forward.
        Acks from older incarnations are ignored.
        """
        offset = min(offset, self.spec.size)
        if self.epoch is not None and epoch < self.epoch:
            return False
        if self.epoch is None or epoch > self.epoch:
            self.epoch = epoch
            if offset < self.acked:
                log.info(
                    "flow %s/%s: receiver restarted at %d (was %d): resending",
                    self.spec.coflow,
                    self.spec.flow,
                    offset,
                    self.acked,
                )
                self.acked = offset
                self.resend.clear()
                if self.next_offset > offset:
                    self.resend.append((offset, self.next_offset - offset))
                return True
        if offset > self.acked:
            self.acked = offset
            if offset > self.next_offset:
                self._hash_to(offset if offset >= self.spec.size else align_down(offset))
        return False

    def requeue(self, offset: int, length: int) -> bool:
        """Put a sent-but-unacknowledged range back for resending; True if anything was left."""
        if offset + length <= self.acked:
            return False
        self.resend.append((offset, length))
        return True

    def close(self) -> None:
        """Release the source."""
        self.source.close()


class PeerLink:
    """Persistent connection to `spec.peer_agent` over tunnel `spec.tunnel`.

    PeerLink(spec: TunnelSpec, agent_id: str, local_host: str|None, on_ack, on_change,
    tls=None, encrypt=False, key_for=None). tls: the agent's data client context
    (terra_security.pki.data_client_context): each connection first authenticates
    (terra_security/data_auth.py: mutual TLS handshake, the peer's certificate must name
    spec.peer_agent, then back to plain TCP; with encrypt=True every frame after that is an
    AEAD record, overlay/sealed.py, terra_security/data_records.py); None: plain TCP.
    key_for(peer agent) -> the pair key from the controller or None: with
    tls and a key, the connection authenticates with the key instead (one round
    trip, no public-key work); after a failed key exchange the next attempt runs the TLS
    handshake (the receiver may not have the key yet). key_auths / tls_auths count the
    connections authenticated each way.
    on_ack(coflow, flow, offset, epoch, attempt, peer=spec.peer_agent) is called for each ack
    frame (attempt: its "a", 0 when absent; peer: the agent at the other end, the one the
    connection authenticated with --pki); on_change() when the link
    goes up or down (so idle path tasks look again). run() connects, sends "hello", reads acks
    and reconnects with backoff (50 ms doubling to 10 s, see run()) until close().

    Parking (docs/design.md 5): park() takes the link out of use when its tunnel leaves the
    table but keeps an open connection (chunks in flight go back to their flows at once, as
    on close; acks still arriving are applied); unpark() puts it back in use if the tunnel
    returns unchanged and the connection is idle in the kernel (nothing unsent or
    unacknowledged: a connection whose path broke still holds bytes and is closed instead).
    A parked link does not reconnect: its connection ending closes it. So a link that goes
    down and up again (or a tunnel the controller withdraws for a moment) costs no new
    connection and no authentication.

    Kernel pacing (terra-agent --rate-limiter pacing): set_pacing_rate(stream bytes/s) caps
    the connection's TCP pacing (SO_MAX_PACING_RATE), now and on every reconnect; such a link
    lets paced_unsent_bytes() (~100 ms of its rate, at least a chunk) of unsent bytes queue in
    the kernel, so the pacer does not idle while the sending task wakes up late. pacing_rate is
    None on bucket links.

    congestion: the kernel TCP congestion control of every connection it makes (terra-agent
    --tcp-congestion, set_congestion_control), or None for the system's default.
    """

    def __init__(
        self,
        spec: TunnelSpec,
        agent_id: str,
        local_host,
        on_ack,
        on_change,
        tls=None,
        encrypt: bool = False,
        key_for=None,
        congestion: str | None = None,
    ) -> None:
        self.spec = spec
        self.congestion = congestion
        self.tls = tls
        self.encrypt = encrypt and tls is not None
        self.key_for = key_for
        self.key_auths = 0
        self.tls_auths = 0
        self._tls_next = False
        self.agent_id = agent_id
        self.local_host = local_host
        self.on_ack = on_ack
        self.on_change = on_change
        self.writer: FrameWriter | SealedWriter | None = None
        self.inflight: deque[tuple[OutFlow, int, int]] = deque()
        self.connects = 0
        self.sent_bytes = 0
        self._closed = False
        self.parked = False
        self._scope: trio.CancelScope | None = None
        self._stream: trio.SocketStream | None = None
        self._unsent_limit = MIN_UNSENT_BYTES
        self._came_up = False  # the current attempt's connection came up (hello sent)
        self.pacing_rate: float | None = None  # stream bytes/s the socket is paced at, or None

    def set_pacing_rate(self, rate: float) -> None:
        """Pace this link's connection at `rate` stream bytes/s (> 0; math.inf = unpaced).

        Applied at once to the open connection and again on every reconnect.

        Raises:
            ValueError: rate <= 0 or NaN (pause a paced link by not writing to it).
        """
        if not rate > 0:
            raise ValueError(f"a pacing rate must be > 0 bytes/s, got {rate!r}")
        self.pacing_rate = float(rate)
        if self._stream is not None:
            self._apply_pacing(self._stream)

    def _apply_pacing(self, stream: trio.SocketStream) -> None:
        try:
            set_pacing_rate(stream.socket, self.pacing_rate)
        except OSError as exc:  # closed under us: the reconnect applies it again
            log.warning("link %s via %s: cannot set pacing: %s", *self._name(), exc)

    @property
    def up(self) -> bool:
        """True while connected."""
        return self.writer is not None

    async def run(self) -> None:
        """Connect / serve / reconnect until close(); never raises connection errors.

        Backoff between attempts: 50 ms after a connection that was up for over a second,
        doubling while attempts fail (the peer cannot be reached or authenticated, or ends
        the connection at once) up to UNREACHABLE_BACKOFF_MAX_S, so a peer address that is
        wrong or down costs few connections."""
        backoff = BACKOFF_MIN_S
        while not self._closed:
            started = trio.current_time()
            self._came_up = False
            try:
                await self._session()
            except (FrameError, ProtocolError, RecordError) as exc:
                log.error("link %s via %s: bad frame from peer: %s", *self._name(), exc)
            except DataAuthError as exc:
                log.error("link %s via %s: peer not authenticated: %s", *self._name(), exc)
            except CONNECTION_ERRORS as exc:
                log.warning("link %s via %s: %s", *self._name(), exc)
            finally:
                self._down()
            if self.parked:
                self._closed = True  # a parked link does not reconnect
            if self._closed:
                break
            if self._came_up and trio.current_time() - started > 1.0:
                backoff = BACKOFF_MIN_S
            await trio.sleep(backoff)
            backoff = min(UNREACHABLE_BACKOFF_MAX_S, backoff * 2)

    def _name(self) -> tuple[str, str]:
        return self.spec.peer_agent, self.spec.tunnel

    async def _session(self) -> None:
        with trio.CancelScope() as scope:
            self._scope = scope
            if self._closed:
                return
            stream = await trio.open_tcp_stream(
                self.spec.peer_host, self.spec.port, local_address=self.local_host
            )
            self._stream = stream
            detect_dead_peers(stream, TUNNEL_DEAD_PEER_S)
            if self.congestion is not None:
                set_congestion_control(stream.socket, self.congestion)
            if self.pacing_rate is not None:
                self._apply_pacing(stream)
            self._unsent_limit = MIN_UNSENT_BYTES  # trio's setting
            async with stream:
                initial, secret = b"", None
                if self.tls is not None:  # authenticate (data_auth.py), then plain TCP
                    initial, secret = await self._authenticate(stream)
                reader = FrameReader(stream, initial=initial, keep_raw=self.encrypt)
                writer = FrameWriter(stream)
                if self.encrypt and secret is not None:  # AEAD records (data_records.py)
                    reader = SealedReader(reader, Opener(secret, TO_SENDER))
                    writer = SealedWriter(stream, Sealer(secret, TO_RECEIVER))
                hello = {"t": "hello", "agent": self.agent_id, "tunnel": self.spec.tunnel}
                await writer.send(hello)
                self.writer = writer
                self._came_up = True
                self.connects += 1
                log.info("link %s via %s up (connect #%d)", *self._name(), self.connects)
                self.on_change()
                await self._read_acks(reader)

    async def _authenticate(self, stream: trio.SocketStream) -> tuple[bytes, bytes | None]:
        """Pair-key exchange if we hold the peer's key (the last one did not fail), else the
        TLS handshake; returns (bytes received past it, the connection secret or None).
        DataAuthError if it failed."""
        peer = self.spec.peer_agent
        use_key = self.key_for is not None and not self._tls_next
        key = self.key_for(peer) if use_key else None
        if key is not None:
            try:
                secret = await key_authenticate_sender(stream, self.agent_id, peer, key)
            except DataAuthError:
                self._tls_next = True
                raise
            self.key_auths += 1
            return b"", secret
        self._tls_next = False
        _, rest, secret = await authenticate(
            stream, self.tls, server_side=False, expected_peer=peer, seal=self.encrypt
        )
        self.tls_auths += 1
        return rest, secret

    async def _read_acks(self, reader: FrameReader | SealedReader) -> None:
        while True:
            frame = await reader.read()
            if frame is None:
                raise trio.BrokenResourceError("peer closed the connection")
            header, _ = frame
            validate_data(header)
            if header["t"] != "ack":
                raise ProtocolError(f"unexpected {header['t']!r} frame on a sending link")
            self.on_ack(
                header["c"],
                header["f"],
                header["o"],
                header["e"],
                header.get("a", 0),
                peer=self.spec.peer_agent,
            )
            self._prune()

    def _prune(self) -> None:
        while self.inflight:
            flow, offset, length = self.inflight[0]
            if offset + length > flow.acked:
                break
            self.inflight.popleft()

    def _down(self) -> None:
        """Connection ended: requeue everything not acknowledged, wake the path tasks."""
        was_up = self.writer is not None
        self.writer = None
        self._scope = None
        self._stream = None
        for flow, offset, length in self.inflight:
            flow.requeue(offset, length)
        self.inflight.clear()
        if was_up or self._closed:
            self.on_change()

    async def send_chunk(
        self,
        flow: OutFlow,
        offset: int,
        data,
        macs: bytes,
        digest: str | None,
        chunk_size: int = 0,
    ) -> bool:
        """Send one chunk (`macs`: its leaf MACs, OutFlow.take); False (and the link is torn
        down, chunk requeued) if that failed.

        chunk_size: the path's chunk size in bytes (chunk_bytes of its rate); the connection may
        queue that many unsent bytes in the kernel (allow_unsent_bytes), at least 16 KiB
        (paced_unsent_bytes on a paced link).
        """
        writer = self.writer
        if writer is None:
            flow.requeue(offset, len(data))
            return False
        if self.pacing_rate is None:
            limit = max(MIN_UNSENT_BYTES, chunk_size)
        else:
            limit = paced_unsent_bytes(chunk_size, self.pacing_rate)
        if limit != self._unsent_limit and self._stream is not None:
            allow_unsent_bytes(self._stream, limit)
            self._unsent_limit = limit
        header = chunk_header(flow.spec.coflow, flow.spec.flow, offset, data, macs)
        if digest is not None:
            header["d"] = digest
        if flow.spec.attempt:
            header["a"] = flow.spec.attempt
        self.inflight.append((flow, offset, len(data)))
        try:
            await writer.send(header, data, flow.spec.digest_key)
        except CONNECTION_ERRORS as exc:
            log.warning("link %s via %s: send failed: %s", *self._name(), exc)
            self.fail()  # the connection's end requeues this chunk with the rest in flight
            return False
        self.sent_bytes += len(data)
        return True

    def fail(self) -> None:
        """Tear the current connection down (it will be re-opened after backoff)."""
        if self._stream is not None:
            self._stream.socket.close()
        if self._scope is not None:
            self._scope.cancel()

    def park(self) -> bool:
        """Take the link out of use but keep its connection (class docstring); chunks in flight
        are requeued to their flows now. Returns False (nothing changed) when it is not
        connected; the caller then closes it."""
        if self._closed or self.writer is None:
            return False
        self.parked = True
        for flow, offset, length in self.inflight:
            flow.requeue(offset, length)
        self.inflight.clear()
        return True

    def unpark(self) -> bool:
        """Put a parked link back in use; False (the caller closes it) when its connection
        ended or still holds unsent or unacknowledged bytes in the kernel (its path may be
        broken: a new connection is cheaper than waiting out TCP's retransmission backoff)."""
        stream = self._stream
        if self._closed or self.writer is None or stream is None:
            return False
        if kernel_queued_bytes(stream.socket) != 0:
            return False
        self.parked = False
        self.on_change()
        return True

    def close(self) -> None:
        """Stop for good (tunnel removed): tear down, requeue unacknowledged chunks, exit run()."""
        self._closed = True
        self.fail()


class FlowGroupSender:
    """The flows of one FlowGroup (coflow, this DC -> dst_dc) and its per-path senders.

    FlowGroupSender(key: (coflow, dst_dc), link_for: (peer_agent, tunnel) -> PeerLink|None,
    spawn: start a task in the agent's nursery, on_error(flow, message): a flow's source failed
    and the flow was dropped). set_rates({tunnel: bytes/s}) replaces the per-path rates (missing
    tunnels -> 0); add_flow(OutFlow) adds a flow. Flows are served in the order they were added.

    Earliest completion first (docs/design.md 5.1): a path takes a chunk only if, at its
    rate, it would get the chunk out no later than the group's other usable paths would get
    out everything else left (leave_to_faster_paths). Chunks hold at least 64 KiB, so at a
    group's end a path with a small share of the rate (a 64 KiB chunk at 140 kB/s is 0.46 s)
    would otherwise finish the group long after its fast paths; now it stays idle and the
    fast paths finish the bytes, as the controller's fluid rates assume. Rates stay upper
    bounds: no path sends faster than its rate.

    Kernel pacing: set_kernel_paced({tunnel}) names the paths on which this group has its own
    connection, paced by the kernel at the group's rate (Agent._plan_pacing); their buckets
    stop binding (unlimited while the rate is > 0, still 0 = paused) so the kernel alone sets
    the pace. Every other path keeps a binding bucket at its rate.
    """

    def __init__(self, key: tuple[str, str], link_for, spawn, on_error) -> None:
        self.key = key
        self.flows: list[OutFlow] = []
        self._active: list[OutFlow] = []
        self._on_error = on_error
        self.rates: dict[str, float] = {}
        self.buckets: dict[str, TokenBucket] = {}
        self._running: set[str] = set()
        self._link_for = link_for
        self._spawn = spawn
        self._changed = trio.Event()
        self.sent_bytes: dict[str, int] = {}
        self.kernel_paced: set[str] = set()

    def set_kernel_paced(self, tunnels: set[str]) -> None:
        """Make the buckets of `tunnels` non-binding (the kernel paces them), the others bind."""
        tunnels = set(tunnels)
        if tunnels == self.kernel_paced:
            return
        self.kernel_paced = tunnels
        for tunnel, rate in self.rates.items():
            self._set_rate(tunnel, rate)

    @property
    def done(self) -> bool:
        """True when every flow of the group is fully acknowledged (or failed)."""
        return not any(not f.done for f in self._live())

    def notify(self) -> None:
        """Wake path tasks waiting for work (new flows, resends, links up, acks)."""
        self._changed.set()
        self._changed = trio.Event()

    def add_flow(self, flow: OutFlow) -> None:
        """Add a flow to the group and wake its path tasks."""
        self.flows.append(flow)
        self._active.append(flow)
        self._ensure_tasks()
        self.notify()

    def remove_flow(self, flow: OutFlow) -> None:
        """Take `flow` out of the group (the controller dropped it) and wake the path tasks
        (they end when no flow is left)."""
        self.flows = [f for f in self.flows if f is not flow]
        self._active = [f for f in self._active if f is not flow]
        self.notify()

    def set_rates(self, paths: dict[str, float]) -> None:
        """Set per-path rates in bytes/s; paths not listed get 0 (paused). Effective at once."""
        for tunnel in self.rates:
            if tunnel not in paths:
                self._set_rate(tunnel, 0.0)
        for tunnel, rate in paths.items():
            self._set_rate(tunnel, rate)
        self._ensure_tasks()

    def _set_rate(self, tunnel: str, rate: float) -> None:
        self.rates[tunnel] = rate
        if rate > 0 and tunnel in self.kernel_paced:
            rate = math.inf  # the link's socket paces this path (set_kernel_paced)
        bucket = self.buckets.get(tunnel)
        if bucket is None:
            self.buckets[tunnel] = TokenBucket(rate)  # depth: 50 ms of the current rate
            self.sent_bytes.setdefault(tunnel, 0)
        else:
            bucket.set_rate(rate)

    def _ensure_tasks(self) -> None:
        if self.done:
            return
        for tunnel in self.buckets:
            if tunnel not in self._running:
                self._running.add(tunnel)
                self._spawn(self._path_loop, tunnel)

    def _take(self, max_len: int, tunnel: str):
        """Next (flow, link, offset, data, macs, digest) for `tunnel`, flows in arrival order,
        or None.

        A flow whose source fails is dropped from the group and reported through on_error.
        """
        for flow in self._live():
            if not flow.has_work():
                continue
            link = self._link_for(flow.spec.dst_agent, tunnel)
            if link is None or not link.up:
                continue
            try:
                item = flow.take(max_len)
            except (OSError, ValueError) as exc:  # SourceError is a ValueError
                self._fail(flow, f"flow {flow.spec.coflow}/{flow.spec.flow}: source failed: {exc}")
                continue
            if item is not None:
                return (flow, link, *item)
        return None

    def _live(self) -> list[OutFlow]:
        """Flows in order, finished ones dropped from the head (flows finish roughly in order)."""
        drop = 0
        while drop < len(self._active) and self._active[drop].done:
            drop += 1
        if drop:
            del self._active[:drop]
        return self._active

    def _fail(self, flow: OutFlow, message: str) -> None:
        log.error(message)
        flow.failed = message
        self._active = [f for f in self._active if f is not flow]
        self._on_error(flow, message)

    def leave_to_faster_paths(self, tunnel: str, nbytes: int) -> bool:
        """True when `tunnel` should not take the group's next chunk (earliest completion
        first, class docstring).

        A path's time for a chunk of c = min(nbytes, bytes left) bytes is (its bucket's debt
        + c) / its rate (seconds). The path leaves the chunk when (a) the group's other
        usable paths (a rate > 0 and a connection up) would send every byte left, debts
        first, at their summed rate no later than that, and (b) one of them would send
        this chunk sooner (ties: the lower tunnel id sends), so the fastest path always
        sends and the group never stalls. False when no other path is usable, on
        kernel-paced or unlimited paths, and when nothing is left."""
        rate = self.rates.get(tunnel, 0.0)
        if not 0 < rate < math.inf or tunnel in self.kernel_paced:
            return False
        if not any(r > 0 for t, r in self.rates.items() if t != tunnel):
            return False  # no other path to leave it to (before walking the group's flows)
        live = self._live()
        peers = {f.spec.dst_agent for f in live}
        others = []  # (tunnel, rate, debt) of the other usable paths
        for t, r in self.rates.items():
            if t == tunnel or r <= 0 or not self._usable(t, peers):
                continue
            if math.isinf(r) or t in self.kernel_paced:
                return False  # no estimate for an unlimited path
            others.append((t, r, self.buckets[t].debt_bytes))
        if not others:
            return False  # a group's only path always sends (no sum over its flows)
        left = sum(f.unsent_bytes() for f in live)
        if left <= 0:
            return False
        chunk = min(nbytes, left)
        mine = (self.buckets[tunnel].debt_bytes + chunk) / rate
        better = any(
            (d + chunk) / r < mine or ((d + chunk) / r == mine and t < tunnel) for t, r, d in others
        )
        if not better:
            return False
        other_rate = sum(r for _, r, _ in others)
        other_debt = sum(d for _, _, d in others)
        return (other_debt + left) / other_rate <= mine

    def _usable(self, tunnel: str, peers: set[str]) -> bool:
        """True when a connection over `tunnel` to one of `peers` is up."""
        for peer in peers:
            link = self._link_for(peer, tunnel)
            if link is not None and link.up:
                return True
        return False

    async def _path_loop(self, tunnel: str) -> None:
        """Send the group's chunks over `tunnel` at its rate until the group is done."""
        try:
            bucket = self.buckets[tunnel]
            while not self.done:
                n = chunk_bytes(self.rates[tunnel])
                if self.leave_to_faster_paths(tunnel, n):
                    with trio.move_on_after(ECF_RECHECK_S):
                        await self._changed.wait()
                    continue
                await bucket.acquire(n)
                item = self._take(n, tunnel)
                while item is None:
                    if self.done:
                        return
                    await self._changed.wait()
                    fresh = chunk_bytes(self.rates[tunnel])
                    if fresh != n:  # the rate changed while idle: charge the new rate's chunk
                        n = fresh
                        await bucket.acquire(n)
                    item = self._take(n, tunnel)
                flow, link, offset, data, macs, digest = item
                bucket.refund(n - len(data))  # a small flow's chunk: the rest is not spent
                if await link.send_chunk(flow, offset, data, macs, digest, n):
                    self.sent_bytes[tunnel] += len(data)
        finally:
            self._running.discard(tunnel)
