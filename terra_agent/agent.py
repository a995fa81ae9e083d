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
import logging
import time
from collections import OrderedDict, deque

import trio

from overlay.framing import PayloadBuffers
from overlay.rate_limit import chunk_frame_overhead, stream_rate
from overlay.rate_limited_log import RateLimitedLog
from overlay.reorder import MemoryBudget, remove_spill_files
from terra_security.data_records import TAG_BYTES
from terra_security.integrity import LEAF_BYTES
from terra_wire.control import (
    FlowSpec,
    ProtocolError,
    complete_message,
    parse_pair_keys,
    parse_tunnels,
    report_tag,
)
from terra_wire.frames import MAX_PAYLOAD_BYTES

from .admission import Admission, caps_from_file_limit
from .config import (
    CONNECTION_LOG_S,
    DATA_BACKLOG,
    FORGED_LOG_S,
    HASH_QUEUE_BYTES,
    HELLO_S,
    MAX_DROPPED,
    MAX_EPOCH_AHEAD_NS,
    MIN_PACING_BYTES_PER_S,
    PACING_REFRESH_S,
    PAYLOAD_BUFFERS,
    AgentConfig,
)
from .control_session import ControlSession, failed_report
from .incoming import IncomingData
from .pending import PendingChunks
from .receiver import HashQueue, InFlow
from .sender import (
    PARKED_LINK_S,
    FlowGroupSender,
    OutFlow,
    PeerLink,
    chunk_bytes,
)
from .sources import SourceError, flow_key, open_sink, open_source, resolve_data_path

log = logging.getLogger(__name__)


class Agent(ControlSession, IncomingData):
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
        self.controller_addr: tuple[str, int] | None = None  # the control channel's peer
        self.pair_keys: dict[str, bytes] = {}
        self.reorder_budget = MemoryBudget(config.memory_limit)
        self.pending = PendingChunks(config.pending_limit)
        # a sealed chunk's record is its bytes and an AEAD tag (overlay/sealed.py)
        record = MAX_PAYLOAD_BYTES + (TAG_BYTES if config.encrypt_data else 0)
        self.payload_buffers = PayloadBuffers(record, PAYLOAD_BUFFERS)
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
        self._acked_msg: dict | None = None  # "progress" that _report_acked adds rows to
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
        chunk_bytes(rate) chunks added; with encrypt_data as sealed records with their
        AEAD tags). A group sending to one peer only has non-binding
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
                    sealed = self.config.encrypt_data
                    head = (
                        chunk_frame_overhead(key[0], spec.flow, n, spec.attempt, sealed)
                        if spec
                        else 0
                    )
                    paced = stream_rate(rate, n, head)
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

    async def _open_sinks(self, specs: list[FlowSpec]) -> dict[tuple[str, str], object]:
        """Open the file sinks of new receiving flows among `specs` in worker threads (path
        resolution, missing directories, part files: system calls that wait for the file
        system's journal stay off the event loop), for `_add_flow`.

        Only flows starting at byte 0 that this agent does not hold yet, whose resolved path
        no live flow owns (_claim_sink, checked on the loop before any part file is
        truncated) and that no earlier flow of `specs` writes; the others are set up by
        `_add_flow` itself, as before.

        Returns:
            {flow key: its opened FileSink, or the exception opening it raised
            (SourceError / OSError / ValueError: _add_flow refuses the flow with it)}.
        """
        me, root = self.config.agent_id, self.config.data_root
        todo = [
            s for s in specs
            if s.dst_agent == me and s.offset == 0 and s.sink.startswith("file:")
            and s.key not in self.in_flows and s.key not in self.out_flows
        ]  # fmt: skip
        if not todo or root is None:
            return {}
        paths = await trio.to_thread.run_sync(_resolve_sinks, root, todo)
        free, seen = [], set()
        for spec, path in zip(todo, paths, strict=True):
            if isinstance(path, str):
                owner = self.in_flows.get(self.sinks.get(path))
                if path in seen or (owner is not None and not owner.done and not owner.failed):
                    continue  # _add_flow refuses it (_claim_sink)
                seen.add(path)
            free.append((spec, path))
        return await trio.to_thread.run_sync(_open_file_sinks, root, free)

    def _add_flow(self, spec: FlowSpec, sink=None) -> None:
        """Start sending and / or receiving flow `spec`; `sink`: its receiving end's file sink
        opened by _open_sinks (or the exception that raised), None: opened here."""
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
                self._add_inflow(spec, sink)
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
            self.send_control(failed_report(spec, str(exc), cause))

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

    def _claim_sink(self, spec: FlowSpec, path: str | None = None) -> str | None:
        """Make flow `spec` the owner of its sink file, by resolved path (sinks {path: flow
        key}); a path a live flow of another key owns (receiving: not done, not failed) is
        refused, so its part file is never truncated under it. `path`: the sink's resolved
        path when the caller has it (None: resolved here). Returns the resolved path (None for
        a sink that is not a file).

        Raises:
            SourceError: the path is owned by another live flow, or refused
                (resolve_data_path).
        """
        if not spec.sink.startswith("file:"):
            return None
        if path is None:
            path = resolve_data_path(self.config.data_root, spec.sink[5:], "sink")
        owner_key = self.sinks.get(path)
        owner = self.in_flows.get(owner_key) if owner_key is not None else None
        if owner_key != spec.key and owner is not None and not owner.done and not owner.failed:
            raise SourceError(
                f"sink {spec.sink[5:]!r} refused: flow {owner_key[0]}/{owner_key[1]} is "
                "still writing that file"
            )
        self.sinks[path] = spec.key
        return path

    def _add_inflow(self, spec: FlowSpec, sink=None) -> None:
        """Start receiving flow `spec` and feed it the chunks held for it; a flow whose sink
        cannot be opened or is owned by another live flow (_claim_sink) is recorded in
        `refused` (SourceError / OSError / ValueError re-raised). `sink`: as _add_flow."""
        try:
            if isinstance(sink, Exception):
                raise sink
            resolved = self._claim_sink(spec, getattr(sink, "path", None))
            inflow = InFlow(
                spec,
                self.config.memory_limit,
                self.config.spill_dir,
                self.reorder_budget,
                self.hash_queue,
                data_root=self.config.data_root,
                max_ahead=self.config.max_ahead,
                spill_prefix=self.config.spill_prefix,
                sink_path=resolved,
                sink=sink,
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
            self._report_acked(coflow, flow_id, flow.acked, report_tag(flow.spec.digest_key))
            if group is not None:
                group.notify()

    def _report_complete(self, flow: InFlow) -> None:
        flow.reported = True
        spec = flow.spec
        log.info("flow %s/%s complete (%d bytes)", spec.coflow, spec.flow, spec.size)
        tag = report_tag(spec.digest_key)
        self.send_control(
            complete_message(spec.coflow, spec.flow, flow.digest, spec.size, tag, flow.sha256)
        )

    def _flow_failed(self, flow: OutFlow, message: str) -> None:
        self.send_control(failed_report(flow.spec, message, "source"))

    @staticmethod
    def _in_failure(flow: InFlow) -> dict:
        """The "failed" report of a receiving flow: cause "digest" (the controller may send it
        again) or "sink"."""
        cause = "digest" if flow.digest_mismatch else "sink"
        return failed_report(flow.spec, flow.failed, cause)

    def _wake_all(self) -> None:
        for group in self.groups.values():
            group.notify()


def _resolve_sinks(data_root: str, specs: list[FlowSpec]) -> list:
    """[resolve_data_path of each spec's file sink, or the exception it raised] (a worker
    thread's part of Agent._open_sinks)."""
    out = []
    for spec in specs:
        try:
            out.append(resolve_data_path(data_root, spec.sink[5:], "sink"))
        except (SourceError, OSError, ValueError) as exc:
            out.append(exc)
    return out


def _open_file_sinks(data_root: str, todo: list[tuple[FlowSpec, object]]) -> dict:
    """{flow key: open_sink of each (spec, resolved path) from byte 0, or the exception it
    raised; a path given as an exception is that flow's answer} (a worker thread's part of
    Agent._open_sinks)."""
    out: dict[tuple[str, str], object] = {}
    for spec, path in todo:
        if isinstance(path, Exception):
            out[spec.key] = path
            continue
        try:
            out[spec.key] = open_sink(
                spec.sink, spec.size, False, data_root, LEAF_BYTES, resolved=path
            )
        except (SourceError, OSError, ValueError) as exc:
            out[spec.key] = exc
    return out


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
