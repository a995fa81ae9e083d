"""The controller's side of the control channel to the agents (docs/design.md sections 5 and 6).

Messages are those of `terra_wire/control.py`, one frame each in the format of
`overlay/framing.py` (u32 header length | msgpack header | empty payload).

What the channel does:

- registration: an agent sends "register" {dc, agent, data_addr, token?,
  inflight?}; the controller records it (`CoflowRegistry.register_agent`),
  answers "registered", and sends every connected agent its tunnel table
  (a new peer may have appeared), then the new agent's flow descriptors and rates.
- tunnel table per agent: for every peer agent in another DC and every tunnel
  of the DC pair that is up, a TunnelSpec (`TunnelTable.specs_for`).
- flow descriptors ("flows") go to the sender and the receiver of each WAN flow
  when a coflow is submitted or updated (and again when an agent re-registers).
- rates: after every scheduling round, each sending agent gets, per FlowGroup
  (coflow, its DC, dst DC), the sum of its flows' per-path rates. The controller
  has already split every FlowGroup's rates among its flows, i.e. among its
  (sender agent, receiver agent) pairs, in proportion to remaining bytes
  (the policy's `split_by_remaining`, see `controller_round.flow_rates`). Only changed
  entries are sent; a FlowGroup that lost its rates gets an entry with no paths (= paused).
- reports: "progress" feeds remaining volumes, "complete" finishes flows, and
  "inflight" in "register" (a reconnecting agent) restores acknowledged offsets
  (a "recv" row may carry "digest": the flow completed). Every report is accepted
  only from the flow's endpoint and with the tag "k" of the flow's current attempt
  (protocol.report_tag); others are refused, logged and counted. Reports about
  coflows a restarted controller does not know yet are kept, per reporting agent
  (at most agent_core.MAX_PENDING_PER_AGENT each, its oldest dropped first), until the job master
  resubmits; they are applied then with the same checks.
- failures: "failed" {coflow, flow, reason, cause} from an endpoint fails the flow
  and its coflow (`Controller.fail_flow`); cause "digest" restarts it from byte 0
  instead, up to the controller's max_restarts. When a coflow fails or is
  cancelled both endpoints of its unfinished WAN flows get "drop"; a restarted
  flow gets "drop" then its descriptor (attempt + 1) at the receiver, and at the
  sender only once the receiver acknowledged them (or agent_core.RESTART_ACK_S passed), so
  no chunk of the new attempt reaches a receiver still holding the old one. A
  progress report about a flow of a failed/cancelled coflow gets "drop" back.

Each agent connection is a reading task and a writing task of the controller's loop, the
writer draining the connection's queue (`agent_connection.AgentConnection`), so a slow or
dead agent never blocks a scheduling round or another agent. A malformed frame or message
closes only that agent's connection.

What to do with each message, and with each event of the controller's (new flows, drops,
a round's rates, a tick), is decided by the agents' core (`agent_core.py`: events in,
effects out, no I/O); this module reads and writes the connections, dispatches every event
to it on the controller's loop (owner_loop.py) and applies the effects it returns.
"""

from __future__ import annotations

import ipaddress
import logging
import socket
import time

import trio

from terra_controller import agent_core as core
from terra_controller.agent_connection import (
    AgentConnection,
    ChannelError,
    parse_control,
)
from terra_controller.coflow_state import (
    CoflowState,
    FlowState,
    RegistryError,
    coflow_key,
    parse_coflow_key,
)
from terra_controller.controller import Controller
from terra_controller.controller_round import FlowRates
from terra_controller.file_requests import FileRequests
from terra_controller.flow_specs import BATCH_BYTES, flow_spec, sized_batches, spec_bytes
from terra_controller.loop_frames import FrameReader
from terra_controller.registration_checks import RegistrationRefused
from terra_controller.transport import (
    FRAME_TIMEOUT_S,
    ServerSecurity,
    listen_and_serve,
    shutdown,
)
from terra_controller.tunnel_table import TunnelTable
from terra_security.data_keys import DataKeys
from terra_security.integrity import ALGORITHMS, default_algorithm
from terra_security.pki import INSECURE, Identity
from terra_wire import control as protocol
from terra_wire.api import WireError
from terra_wire.frames import MAX_HEADER_BYTES

LOG = logging.getLogger("terra.agents")

AGENT_SILENCE_S = 15.0  # no message (heartbeats included) for this long: disconnect
FLUSH_S = 1.0  # a closing connection's queued messages (its last "error") get this long


# ---- the channel ----------------------------------------------------------------------------


class AgentChannel:
    """Server side of the control channel: the connections, and the dispatch of their events
    to the agents' core (`agent_core.step`) on the controller's loop.

    Args:
        controller: the Controller (registers its listeners on it).
        tunnels: the TunnelTable.
        silence_s: seconds without any message after which an agent is disconnected.
        data_keys: the pair keys of the agents' data connections (terra_security/data_keys.py),
            sent in every "tunnels" message; None (an insecure channel): no keys are sent.
        data_prefixes: CIDR prefixes (terra-controller --data-prefix) an agent's registered
            data_addr may lie in besides its control connection's own address
            (check_data_addr); ValueError for a malformed one.
        leaf_mac: the leaf-MAC construction every flow descriptor names
            (terra_security/integrity.py ALGORITHMS, terra-controller --leaf-mac); None: the
            fastest on this host (integrity.default_algorithm()). ValueError for another name.

    Attributes:
        connections: {agent id: AgentConnection}.
        core: the AgentState (agent_core.py): last_seen, kept reports, acks, reactions, ...
            (also readable as attributes of the channel: last_seen, pending, pending_count,
            pending_agents, acks, sent_at, reactions, reaction_count).
        owner: the controller's loop (owner_loop.py), the one owner of `core` and
            `connections`.
        record: None, or a list the dispatched (monotonic s, event) pairs are appended to
            (agent_core.replay replays it).
    """

    def __init__(
        self,
        controller: Controller,
        tunnels: TunnelTable,
        silence_s: float = AGENT_SILENCE_S,
        data_keys: DataKeys | None = None,
        data_prefixes: list[str] | tuple[str, ...] = (),
        leaf_mac: str | None = None,
    ):
        self.controller = controller
        # the leaf-MAC construction named in every flow descriptor (terra_security/integrity.py)
        self.leaf_mac = leaf_mac if leaf_mac is not None else default_algorithm()
        if self.leaf_mac not in ALGORITHMS:
            raise ValueError(f"unknown leaf MAC {self.leaf_mac!r} (know {ALGORITHMS})")
        prefixes = tuple(ipaddress.ip_network(p, strict=False) for p in data_prefixes)
        self.core = core.AgentState(data_prefixes=prefixes, leaf_mac=self.leaf_mac)
        self.data_keys = data_keys
        self.silence_s = silence_s
        self.tunnels = tunnels
        self.connections: dict[str, AgentConnection] = {}
        self.owner = controller.owner
        self.record: list | None = None
        controller.on_rates.append(self.push_rates)
        controller.on_flows.append(self.push_flows)
        controller.on_drop.append(self.push_drop)
        controller.on_tick.append(self.run_overdue)
        controller.connected_agents = self.connected_agents
        self.files = FileRequests(self.owner, self._send_on_loop)  # "list" / "check"
        controller.files = self.files

    # views of the core's state (read them on the loop)
    last_seen = property(lambda self: self.core.last_seen)
    pending = property(lambda self: self.core.pending)
    pending_count = property(lambda self: self.core.pending_count)
    pending_agents = property(lambda self: self.core.pending_agents)
    acks = property(lambda self: self.core.acks)
    sent_at = property(lambda self: self.core.sent_at)
    reactions = property(lambda self: self.core.reactions)
    reaction_count = property(lambda self: self.core.reaction_count)

    # -- dispatch

    def dispatch(self, event: object, conn: AgentConnection | None = None) -> list:
        """Step the core with `event` on the controller's loop and apply its effects
        (`_apply`; `conn`: the connection a Register came on).

        Returns:
            the effects.

        Raises:
            RegistrationRefused: a registration the core or the registry refused.
        """

        def on_loop():
            now = time.monotonic()
            if self.record is not None:
                self.record.append((now, event))
            effects = core.step(self.core, self.controller.registry, event, now)
            for effect in effects:
                self._apply(effect, conn)
            return effects

        return self.owner.run(on_loop)

    def _apply(self, effect: object, conn: AgentConnection | None) -> None:
        """Apply one effect of the core (on the loop); registry updates dispatch their outcome."""
        if isinstance(effect, core.Send):
            target = self.connections.get(effect.agent)
            if target is not None:
                target.send(effect.message)
        elif isinstance(effect, core.ApplyReport):
            self.dispatch(apply_report(self.controller, effect.report, self.connections))
        elif isinstance(effect, core.Refused):
            level = logging.WARNING if effect.code == "forbidden" else logging.INFO
            LOG.log(level, "agent %s: %s refused: %s", effect.agent, effect.label, effect.message)
        elif isinstance(effect, core.Log):
            LOG.log(effect.level, "%s", effect.message)
        elif isinstance(effect, core.Note):
            self.controller.events.add(effect.kind, **dict(effect.fields))
        elif isinstance(effect, core.Metric):
            metrics = self.controller.metrics
            if effect.name == "registrations":
                metrics.registrations.inc(effect.value)
            else:
                metrics.reaction.observe(effect.value)
        elif isinstance(effect, core.RecordAgent):
            self._record_agent(effect, conn)
        elif isinstance(effect, core.RefuseRegistration):
            raise RegistrationRefused(effect.message)
        else:
            raise TypeError(f"not an agent effect: {effect!r}")

    def _record_agent(self, effect: core.RecordAgent, conn: AgentConnection | None) -> None:
        """Record the agent in the registry, bind `conn` to it (closing another connection of
        it), then dispatch AgentRecorded (on the loop)."""
        try:
            info = self.controller.register_agent(effect.agent, effect.dc, effect.data_addr)
        except RegistryError as exc:
            raise RegistrationRefused(str(exc)) from exc
        if conn is not None:
            old = self.connections.get(info.id)
            if old is not None and old is not conn:
                old.close()
            conn.agent = info.id
            self.connections[info.id] = conn
        recorded = core.AgentRecorded(
            info.id, info.dc, info.data_addr, effect.inflight, effect.generation
        )
        self.dispatch(recorded)

    # -- connections

    async def serve_connection_on_loop(
        self, sock: socket.socket, addr, identity: Identity = INSECURE
    ) -> None:
        """Read and handle one agent's messages until EOF, a bad frame or silence, as a task
        of the controller's loop (`sock` non-blocking), with the connection's writer task
        beside it (AgentConnection.write_loop).

        `identity` is the peer's certificate (transport.accept_loop): only an agent
        certificate may register, and only under its own name.

        An agent sends a heartbeat every couple of seconds; one silent for
        `silence_s` (or not reading for that long) is disconnected, and it
        reconnects and re-registers when it can.
        """
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        conn = AgentConnection(sock, addr)
        conn.identity = identity
        async with trio.open_nursery() as nursery:
            nursery.start_soon(conn.write_loop, self.silence_s)
            try:
                await self._serve_reads(conn, FrameReader(sock))
            finally:
                conn.finish_sending()  # (sends to it are dropped from now on)
                try:
                    if conn.agent is not None and self.connections.get(conn.agent) is conn:
                        del self.connections[conn.agent]
                        self.dispatch(core.Disconnect(conn.agent, conn.last_seen))
                    with trio.move_on_after(FLUSH_S):  # (a last "error" reaches the agent)
                        await conn.written.wait()
                finally:
                    conn.close()  # (ends the writer task if it still waits)

    async def _serve_reads(self, conn: AgentConnection, reader: FrameReader) -> None:
        """The reading half of serve_connection_on_loop: the messages until the connection
        ends; a bad one queues a last "error" message (fatal for a refused registration)."""
        try:
            with reader.idle:
                await self._read_messages(conn, reader)
            if reader.idle.cancelled_caught:
                raise TimeoutError("timed out")
        except ChannelError as exc:
            LOG.warning("agent %s: %s; closing", conn.agent or conn.addr, exc)
            fatal = {"fatal": True} if isinstance(exc, RegistrationRefused) else {}
            conn.send(protocol.error_message(str(exc), **fatal))
        except (OSError, trio.ClosedResourceError) as exc:
            LOG.info("agent %s: connection ended: %s", conn.agent or conn.addr, exc or "closed")

    async def _read_messages(self, conn: AgentConnection, reader: FrameReader) -> None:
        """Handle the connection's messages until EOF (serve_connection_on_loop).

        Raises:
            ChannelError: a bad frame or message.
        """
        while True:
            try:
                body = await reader.read(FRAME_TIMEOUT_S, self.silence_s, MAX_HEADER_BYTES)
            except WireError as exc:
                raise ChannelError(str(exc)) from exc
            if body is None:
                return
            message = parse_control(body)
            conn.last_seen = time.time()
            if message["t"] == "register":
                await self._register_on_loop(conn, message)
            else:
                self._handle(conn, message)
            if not reader.waited:  # an agent sending without pause lets the others in too
                await trio.lowlevel.checkpoint()
            reader.waited = False

    async def _register_on_loop(self, conn: AgentConnection, m: dict) -> None:
        """Register the agent of `conn` (agent_core: the checks, the inflight rows, then
        "registered"); RegistrationRefused (sent to it as a fatal "error": it exits instead
        of retrying) for a peer that is not an agent or not the named one, an unknown DC, a
        bad id or a data_addr check_data_addr refuses. Then: submits waiting for it and
        journaled coflows resume (in a worker thread: they submit), kept reports are applied,
        every agent gets its tunnel table, this one its flow descriptors and all its rates."""
        event = core.Register(
            m["agent"], m["dc"], m["data_addr"], conn.addr[0], conn.identity, conn.agent,
            tuple(m.get("inflight", [])), self.controller.generation,
        )  # fmt: skip
        self.dispatch(event, conn)
        agent = conn.agent
        await trio.to_thread.run_sync(self.controller.agent_registered)
        self._after_register(agent)

    def _handle(self, conn: AgentConnection, m: dict) -> None:
        """Dispatch a registered agent's message other than "register"."""
        kind = m["t"]
        agent = conn.agent
        if agent is None:
            raise ChannelError(f"{kind} before register")
        if kind == "progress":
            for item in m["flows"]:
                args = (item["acked"], item.get("k", ""))
                self.dispatch(core.Report(agent, kind, item["coflow"], item["flow"], args))
        elif kind == "complete":
            args = (m["digest"], m.get("sha256"), m.get("k", ""))
            self.dispatch(core.Report(agent, kind, m["coflow"], m["flow"], args))
        elif kind == "failed":
            args = (m["reason"], m["cause"], m.get("attempt", 0), m.get("k", ""))
            self.dispatch(core.Report(agent, kind, m["coflow"], m["flow"], args))
        elif kind == "listing":
            self.files.answer(agent, m)
        elif kind == "ack":
            self.dispatch(core.Ack(m["id"]))
        elif kind == "error":
            LOG.warning("agent %s reports: %.1024s", agent, m.get("message"))

    def _acked(self, msg_id) -> None:
        """An agent acknowledged message `msg_id`."""
        self.dispatch(core.Ack(msg_id))

    def _after_register(self, agent: str | None) -> None:
        """After a registration: kept reports, every agent's tunnel table, the agent's flow
        descriptors and all its rates."""
        self.apply_inflight()
        self.push_tunnels()
        self._send_flows(self.controller.wan_flows_of(agent))
        self.push_rates(self.controller.rates, False, fresh=(agent,))

    def apply_inflight(self, coflows: list[str] | None = None) -> None:
        """Apply the reports kept for coflows not known when they arrived: those about
        coflows known now (among `coflows`, default all) are applied with the usual endpoint
        and attempt checks, progress first, then completions, then failures; the others
        stay kept."""
        self.dispatch(core.ApplyKept(None if coflows is None else tuple(coflows)))

    def close_all(self, grace_s: float = 0.2) -> None:
        """Say goodbye to every agent: half-close (FIN), let them close, then close.

        Used on SIGTERM so agents see a clean end of the control channel (a plain
        exit with unread data would reset the connections) and reconnect.
        """

        def half_close() -> list[AgentConnection]:
            conns = list(self.connections.values())
            for conn in conns:
                shutdown(conn.sock, socket.SHUT_WR)  # (the TLS state stays)
            return conns

        conns = self.owner.run(half_close)
        end = time.monotonic() + grace_s
        while time.monotonic() < end and any(not c.closed for c in conns):
            time.sleep(0.01)
        self.owner.run(lambda: [conn.close() for conn in conns])

    # -- pushes

    def push_tunnels(self) -> dict[int, str]:
        """Send every connected agent its current tunnel table.

        Returns:
            {message id: agent id} of the "tunnels" messages sent.
        """

        def on_loop() -> list:
            agents = self.controller.registered_agents()
            connected = list(self.connections)
            tables = []
            for agent in connected:
                info = agents.get(agent)
                if info is None:
                    continue
                peers = [agents[a] for a in connected if a in agents and a != info.id]
                specs = self.tunnels.specs_for(info, peers)
                listen = self.tunnels.listen_ports(info.data_addr)
                keys = None
                if self.data_keys is not None:
                    keys = self.data_keys.keys_for(info.id, [p.id for p in peers])
                tables.append((info.id, specs, listen, keys))
            return self.dispatch(core.Tunnels(tuple(tables)))

        effects = self.owner.run(on_loop)
        return {e.message["id"]: e.agent for e in effects}

    def push_flows(self, coflow: CoflowState, flows: list[FlowState]) -> None:
        """Controller listener: announce new flows of a coflow to their agents.

        Offsets and completions the agents reported before a restarted controller
        learned of the coflow are applied first, so the descriptors carry them.
        """
        self.apply_inflight([coflow_key(coflow.id)])
        self._send_flows([(coflow, f) for f in flows if not f.intra_dc and not f.done])

    def _send_flows(self, pairs: list[tuple[CoflowState, FlowState]]) -> None:
        """Send the descriptors of `pairs` to their connected endpoints, in "flows" messages
        of at most BATCH_BYTES (each descriptor encoded once for both of its agents; the
        agents validate them). A flow that ended or restarted after its descriptor was made
        is left out (its "drop" and new descriptor are sent by push_drop)."""
        built = []
        for coflow, f in pairs:
            spec = flow_spec(coflow, f, self.leaf_mac)
            built.append((coflow, f, spec.attempt, spec.to_dict(), spec_bytes(spec)))

        def on_loop():  # a drop or restart of these flows (sent on the loop) follows
            per_agent: dict[str, list[tuple[dict, int]]] = {}
            for coflow, f, attempt, wire, n in built:
                if coflow.state.final or f.ended or f.restarts != attempt:
                    continue
                # the receiver's first: it has more to set up (sink files) than the sender
                per_agent.setdefault(f.dst_agent, []).append((wire, n))
                if f.dst_agent != f.src_agent:
                    per_agent.setdefault(f.src_agent, []).append((wire, n))
            for agent, entries in per_agent.items():
                conn = self.connections.get(agent)
                if conn is None:
                    continue
                for batch in sized_batches(entries, BATCH_BYTES):
                    conn.send({"t": "flows", "flows": batch})

        self.owner.run(on_loop)

    def _send_on_loop(self, agent: str, headers: list[dict]) -> bool:
        """Queue `headers` on `agent`'s control connection (on the loop); False when the
        agent is not connected."""
        conn = self.connections.get(agent)
        if conn is None:
            return False
        for header in headers:
            conn.send(header)
        return True

    def connected_agents(self) -> list[str]:
        """Ids of the agents with an open control connection now (Controller.connected_agents)."""

        def on_loop():
            return list(self.connections)

        return self.owner.run(on_loop)

    def push_drop(self, coflow: CoflowState, flows: list[FlowState], restart: bool) -> None:
        """Controller listener (on the loop): tell agents to forget `flows` of `coflow`
        (agent_core.Drop: "drop" to both endpoints when the coflow failed or was cancelled,
        restart=False; a restart from byte 0 when restart=True)."""
        ends = tuple((f.id, f.src_agent, f.dst_agent) for f in flows)

        def on_loop():
            connected = frozenset(self.connections) if restart else frozenset()
            self.dispatch(core.Drop(coflow_key(coflow.id), ends, restart, connected))

        self.owner.run(on_loop)

    def run_overdue(self) -> None:
        """Controller tick: run the deferred sends whose acknowledgement is overdue."""
        self.dispatch(core.Tick())

    def push_rates(self, rates: FlowRates, wan_changed: bool, fresh: tuple = ()) -> list[int]:
        """Controller listener: send each sending agent its changed FlowGroup rates.

        Args:
            rates: {coflow id: {flow id: [(path, bytes/s)]}} from the round.
            wan_changed: the tunnel table changed (link down/up): send it first.
            fresh: agents whose last sent rates are forgotten first (they get all of theirs).

        Returns:
            ids of the "rates" messages sent (each agent acks them once applied).
        """
        event_at = self.controller.wan_event_at if wan_changed else None
        known = self.tunnels.next_id
        wanted = self.group_rates(rates)  # may add logical tunnels for new paths
        new_tunnels = self.tunnels.next_id != known
        tunnel_ids = self.push_tunnels() if wan_changed or new_tunnels else {}

        def on_loop() -> list:
            event = core.Rates(wanted, tuple(self.connections), fresh, event_at, tunnel_ids)
            return self.dispatch(event)

        effects = self.owner.run(on_loop)
        return [e.message["id"] for e in effects if isinstance(e, core.Send)]

    def group_rates(self, rates: FlowRates) -> dict[str, dict[tuple[str, str], dict[str, float]]]:
        """Sum flows' per-path rates per (sender agent, coflow, dst DC, tunnel).

        Returns:
            {agent id: {(coflow id str, dst DC): {tunnel id: bytes/s}}}.
        """
        out: dict[str, dict[tuple[str, str], dict[str, float]]] = {}

        def on_loop():
            coflows = self.controller.registry.coflows
            for cid, flows in rates.items():
                coflow = coflows.get(cid)
                if coflow is None:
                    continue
                for fid, paths in flows.items():
                    f = coflow.flows.get(fid)
                    if f is None:
                        continue
                    key = (coflow_key(cid), f.dst_dc)
                    group = out.setdefault(f.src_agent, {}).setdefault(key, {})
                    for path, rate in paths:
                        tunnel = self.tunnels.tunnel_for(path)
                        if tunnel is not None and rate > 0:
                            group[tunnel] = group.get(tunnel, 0.0) + rate

        self.owner.run(on_loop)
        return out


def apply_report(controller: Controller, report: core.Report, connected) -> object:
    """Apply an agent's report to the controller (Controller.progress, complete or fail_flow;
    on the controller's loop or not).

    Args:
        report: the agent_core.Report (its endpoint already checked by the core).
        connected: the ids of the agents with an open control connection (a collection;
            copied into a ReportRefused only).

    Returns:
        agent_core.ReportApplied with the method's result, or agent_core.ReportRefused with
        the RegistryError's code and message (unknown flow, bad offset, "stale_attempt").
    """
    try:
        cid = parse_coflow_key(report.coflow)
        if report.kind == "progress":
            acked, tag = report.args
            result = controller.progress(cid, report.flow, acked, tag)
        elif report.kind == "complete":
            digest, sha256, tag = report.args
            result = controller.complete(cid, report.flow, digest, tag, sha256)
        else:
            reason, cause, attempt, tag = report.args
            retry = cause == "digest"
            result = controller.fail_flow(cid, report.flow, reason, retry, attempt, tag)
    except RegistryError as exc:
        return core.ReportRefused(report, exc.code, str(exc), frozenset(connected))
    return core.ReportApplied(report, result)


def start_agent_server(
    channel: AgentChannel, host: str, port: int, security: ServerSecurity, spawn=None
):
    """Serve the agent channel on host:port (see `transport.listen_and_serve`; its
    connection counts go to the controller's metrics under "agent channel"): each
    authenticated connection's reads are a task of the controller's loop
    (serve_connection_on_loop)."""
    result = listen_and_serve(
        host, port, channel.serve_connection_on_loop, security, spawn, name="agent channel",
        listeners=channel.controller.metrics.listeners, owner=channel.owner,
    )  # fmt: skip
    LOG.info("agent channel on %s:%d (%s)", *result[2], "TLS" if security.context else "INSECURE")
    return result
