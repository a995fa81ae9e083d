"""The agent's side of the control channel: connect to the controller (mutual TLS, backoff),
register with the flows in flight, apply tunnels / flows / rates / drops, and report progress,
completions and failures (terra_wire/control.py has the messages)."""

from __future__ import annotations

import logging
import ssl

import trio

from overlay.framing import FrameReader, FrameWriter
from terra_security.pki import CONTROLLER_HOSTNAME
from terra_wire.control import (
    FlowSpec,
    ProtocolError,
    complete_message,
    error_message,
    failed_message,
    parse_flows,
    parse_rates,
    progress_message,
    register_message,
    report_tag,
    validate_control,
)
from terra_wire.failover import ControllerList, format_address
from terra_wire.frames import FrameError

from .config import (
    CONTROL_CONNECT_S,
    CONTROL_HANDSHAKE_S,
    ROWS_PER_MESSAGE,
    RegistrationRefused,
)
from .file_listing import answer_files
from .sender import (
    BACKOFF_MAX_S,
    BACKOFF_MIN_S,
    CONNECTION_ERRORS,
    detect_dead_peers,
)

log = logging.getLogger("terra_agent.agent")
FLOWS_PER_SETUP = 32  # descriptors whose sink files one worker-thread call makes (_open_sinks)
WRITE_BATCH = 64  # queued control messages sent in one write, at most
# Backoff bound of an agent given several controllers: a pass is a few refused connects,
# and a new leader listens about 0.15 s after the old one's process ended (takeover.py).
FAILOVER_BACKOFF_MAX_S = 0.1
# How long after registering with a leader of etcd generation G the agent refuses a
# controller registering it with a lower generation (a deposed leader still running).
STALE_GENERATION_S = 30.0


class StaleController(ConnectionError):
    """The controller registered this agent with an older etcd generation than a leader
    it registered with lately: it was deposed; the agent moves on to the next address."""


class ControlSession:
    """The control-channel part of `terra_agent.agent.Agent` (a mixin: its state lives on the
    Agent, which also provides the flow handling the applied messages call)."""

    async def _control_loop(self) -> None:
        """Keep the control channel up: connect, register, serve; on any failure reconnect.
        Only cancellation and a refused registration (RegistrationRefused, raised) end it:
        senders and receivers keep moving data at their last rates while the controller is
        away.

        Several controllers (AgentConfig.controller_addresses: a leader and its standbys,
        which refuse agents' connections): a failed connect (refused, or not made within
        CONTROL_CONNECT_S) or a lost control channel moves to the next address, round robin
        (terra_wire.failover.ControllerList). The backoff (50 ms doubling to
        FAILOVER_BACKOFF_MAX_S) is waited once per full pass over the list, not per address:
        with three controllers, a dead leader costs two refused connects before the new
        leader is tried, no wait, and the new leader is reached within
        FAILOVER_BACKOFF_MAX_S of listening. A session that lasted over 2 s starts a new
        pass with the shortest backoff. A controller that registers the agent with an older
        etcd generation than a leader it registered with in the last STALE_GENERATION_S is
        left at once (StaleController): it was deposed. One controller: the backoff (50
        ms doubling to 2 s) is waited before every reconnect, as a pass is that one address.
        """
        controllers = ControllerList(self.config.controller_addresses)
        backoff = BACKOFF_MIN_S
        several = len(self.config.controller_addresses) > 1
        most = FAILOVER_BACKOFF_MAX_S if several else BACKOFF_MAX_S
        while True:
            address = controllers.current
            started = trio.current_time()
            try:
                await self._control_connection(*address)
                log.warning("controller %s closed the control channel", format_address(address))
            except RegistrationRefused:
                raise
            except (FrameError, ProtocolError) as exc:
                log.error("control channel: bad frame from controller: %s", exc)
            except (*CONNECTION_ERRORS, trio.TooSlowError, ssl.SSLError) as exc:
                log.warning("control channel to %s: %s", format_address(address), exc)
            except Exception:  # ExceptionGroups, bugs: the agent outlives its control channel
                log.exception("control channel to %s failed; reconnecting", format_address(address))
            if trio.current_time() - started > 2.0:
                backoff = BACKOFF_MIN_S
                controllers.reached()
            if controllers.failed(address):
                await trio.sleep(backoff)
                backoff = min(most, backoff * 2)

    async def _control_connection(self, host: str, port: int) -> None:
        with trio.fail_after(CONTROL_CONNECT_S):
            tcp = await trio.open_tcp_stream(host, port)
        self.control_connects += 1
        self.controller_addr = (host, port)
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
                self._acked_msg = None  # encoded below: _report_acked starts a new one
                batch = [self._outbox[i] for i in range(min(len(self._outbox), WRITE_BATCH))]
                for msg, exc in await writer.send_headers(batch):  # cannot be encoded: dropped
                    log.error("dropping control message %r: %s", msg.get("t"), exc)
                for _ in batch:
                    self._outbox.popleft()
            with trio.move_on_at(min(next_progress, next_heartbeat)):
                await self._outbox_event.wait()
            self._outbox_event = trio.Event()

    def _report_acked(self, coflow: str, flow: str, acked: int, tag: str) -> None:
        """Report a sending flow's acknowledged offset at once (it was fully acknowledged): the
        rows reported this way until the control writer takes the next batch share one
        "progress" message (ROWS_PER_MESSAGE rows at most), queued where the first one was."""
        msg = self._acked_msg
        if msg is None:
            msg = self._acked_msg = progress_message([])
            self._outbox.append(msg)
        msg["flows"] += progress_message([(coflow, flow, acked, tag)])["flows"]
        if len(msg["flows"]) >= ROWS_PER_MESSAGE:
            self._acked_msg = None
        self._outbox_event.set()

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
                        spec.coflow,
                        spec.flow,
                        flow.digest,
                        spec.size,
                        report_tag(spec.digest_key),
                        flow.sha256,
                    )
                )
            elif flow.failed is not None and flow.reported:
                self._outbox.append(self._in_failure(flow))
        for flow in self.out_flows.values():
            if flow.failed is not None:
                spec = flow.spec
                self._outbox.append(failed_report(spec, flow.failed, "source"))
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

    async def _answer_files(self, header: dict) -> None:
        """Answer a "list" / "check" request (file_listing.answer_files, in a worker thread)."""
        replies = await trio.to_thread.run_sync(answer_files, header, self.config.data_root)
        for msg in replies:
            self.send_control(msg)

    async def _apply_control(self, header: dict) -> None:
        """Validate and apply one controller message; ProtocolError if it is bad."""
        validate_control(header)
        kind = header["t"]
        if kind == "registered":
            where = "?" if self.controller_addr is None else format_address(self.controller_addr)
            _newest_generation(self, header.get("generation", 0), where)
            log.info("registered with the controller at %s as %s", where, self.config.agent_id)
            self.registered.set()
            self.registered = trio.Event()
        elif kind == "tunnels":
            await self._apply_tunnels(header)
        elif kind == "flows":
            specs = parse_flows(header)
            for start in range(0, len(specs), FLOWS_PER_SETUP):
                batch = specs[start : start + FLOWS_PER_SETUP]
                opened = await self._open_sinks(batch)  # data connections run meanwhile
                for spec in batch:
                    self._add_flow(spec, opened.pop(spec.key, None))
                for sink in opened.values():  # not taken (cannot happen): release it
                    if not isinstance(sink, Exception):
                        sink.close()
                await trio.lowlevel.checkpoint()
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
        elif kind in ("list", "check"):
            self._spawn(self._answer_files, header)
            return  # answered by "listing" replies, not an ack
        elif kind not in ("heartbeat", "ack"):
            raise ProtocolError(f"{kind!r} is not a controller-to-agent message")
        if "id" in header:
            self.send_control({"t": "ack", "id": header["id"]})


def _newest_generation(agent, generation: int, where: str) -> None:
    """Follow only the newest leader: raise StaleController when `generation` is older than
    one registered with in the last STALE_GENERATION_S; else remember it."""
    seen, at = getattr(agent, "generation_seen", (0, 0.0))
    now = trio.current_time()
    if generation < seen and now - at < STALE_GENERATION_S:
        raise StaleController(f"the controller at {where} leads generation {generation}, "
                              f"older than {seen}")  # fmt: skip
    agent.generation_seen = (generation, now)


def failed_report(spec: FlowSpec, reason: str, cause: str) -> dict:
    """The "failed" report of flow attempt `spec` (cause "source", "sink" or "digest"), with
    the attempt's tag."""
    return failed_message(
        spec.coflow, spec.flow, reason, cause, spec.attempt, report_tag(spec.digest_key)
    )
