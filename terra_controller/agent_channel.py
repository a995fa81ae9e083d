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
  (at most MAX_PENDING_PER_AGENT each, its oldest dropped first), until the job master
  resubmits; they are applied then with the same checks.
- failures: "failed" {coflow, flow, reason, cause} from an endpoint fails the flow
  and its coflow (`Controller.fail_flow`); cause "digest" restarts it from byte 0
  instead, up to the controller's max_restarts. When a coflow fails or is
  cancelled both endpoints of its unfinished WAN flows get "drop"; a restarted
  flow gets "drop" then its descriptor (attempt + 1) at the receiver, and at the
  sender only once the receiver acknowledged them (or RESTART_ACK_S passed), so
  no chunk of the new attempt reaches a receiver still holding the old one. A
  progress report about a flow of a failed/cancelled coflow gets "drop" back.

One reader thread per agent connection and one writer thread with a queue per
agent (`agent_connection.AgentConnection`), so a slow or dead agent never blocks
a scheduling round or another agent. A malformed frame or message closes only
that agent's connection.
"""

from __future__ import annotations

import hmac
import ipaddress
import itertools
import logging
import socket
import threading
import time
from collections import OrderedDict, deque

from terra_controller.agent_connection import (
    AgentConnection,
    ChannelError,
    read_control,
    send_parts,
)
from terra_controller.coflow_state import (
    CoflowState,
    FlowState,
    RegistryError,
    coflow_key,
    flow_key,
    parse_coflow_key,
)
from terra_controller.controller import Controller
from terra_controller.controller_round import FlowRates
from terra_controller.file_requests import FileRequests
from terra_controller.flow_specs import BATCH_BYTES, batches, flow_spec, sized_batches, spec_bytes
from terra_controller.reaction import Reaction
from terra_controller.registration_checks import RegistrationRefused, check_data_addr
from terra_controller.transport import ServerSecurity, SharedSocket, listen_and_serve
from terra_controller.tunnel_table import TunnelTable
from terra_security.data_keys import DataKeys
from terra_security.integrity import ALGORITHMS, default_algorithm
from terra_security.pki import INSECURE, Identity, Role
from terra_wire import control as protocol

LOG = logging.getLogger("terra.agents")

AGENT_SILENCE_S = 15.0  # no message (heartbeats included) for this long: disconnect
MAX_PENDING_PER_AGENT = 10_000  # reports kept per agent for coflows not (yet) resubmitted
MAX_SENT = 20_000  # ids of sent messages remembered for their acks (reaction times)
RESTART_ACK_S = 5.0  # a restarted flow's sender gets its descriptor after this at the latest
RESYNC_S = 10.0  # a flow's agents get its current attempt again at most this often
MAX_RESYNCED = 10_000  # flows remembered for RESYNC_S


# ---- the channel ----------------------------------------------------------------------------


class AgentChannel:
    """Server side of the control channel.

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
        connections: {agent id: AgentConnection}. last_seen: {agent id: wall-clock s of
            its last message} of agents whose connection ended.
        acks: {message id: monotonic s acked}.
        sent_at: {message id: monotonic s queued}. reactions: the last 100 Reactions;
            reaction_count: Reactions recorded in all.
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
        self.data_prefixes = [ipaddress.ip_network(p, strict=False) for p in data_prefixes]
        self.data_keys = data_keys
        self.silence_s = silence_s
        self.tunnels = tunnels
        self.connections: dict[str, AgentConnection] = {}
        self.last_seen: dict[str, float] = {}  # agent id -> wall-clock s, once disconnected
        self.lock = threading.RLock()
        self.ids = itertools.count(1)
        self.acks: dict[int, float] = {}
        self.sent_at: dict[int, float] = {}
        self.ack_event = threading.Condition()
        # reports about coflows not known yet: {reporting agent: {coflow: {(kind, flow):
        # report args}}} (kind "progress" / "complete" / "failed", coflows oldest first),
        # reports kept per agent, and {coflow: agents with reports about it}
        self.pending: dict[str, OrderedDict[str, dict[tuple[str, str], tuple]]] = {}
        self.pending_count: dict[str, int] = {}
        self.pending_agents: dict[str, set[str]] = {}
        # message id -> (monotonic deadline, callback): run once the message is acked
        # or the deadline passed (restarted flows: the sender's part)
        self.after_ack: dict[int, tuple[float, object]] = {}
        self.resynced: OrderedDict[tuple[str, str, int], float] = OrderedDict()
        self.reactions: deque[Reaction] = deque(maxlen=100)
        self.reaction_count = 0
        controller.on_rates.append(self.push_rates)
        controller.on_flows.append(self.push_flows)
        controller.on_drop.append(self.push_drop)
        controller.on_tick.append(self.run_overdue)
        controller.connected_agents = self.connected_agents
        self.files = FileRequests(self.connections.get)  # "list" / "check" and their replies
        controller.files = self.files

    # -- connections

    def serve_connection(self, sock: socket.socket, addr, identity: Identity = INSECURE) -> None:
        """Read and handle one agent's messages until EOF, a bad frame or silence.

        `identity` is the peer's certificate (transport.authenticate): only an agent
        certificate may register, and only under its own name.

        An agent sends a heartbeat every couple of seconds; one silent for
        `silence_s` (or not reading for that long) is disconnected, and it
        reconnects and re-registers when it can.
        """
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock = SharedSocket(sock)  # read here, written by the connection's writer thread
        sock.settimeout(self.silence_s)
        conn = AgentConnection(sock, addr)
        conn.identity = identity
        try:
            while True:
                message = read_control(sock)
                if message is None:
                    return
                conn.last_seen = time.time()
                self._handle(conn, message)
        except ChannelError as exc:
            LOG.warning("agent %s: %s; closing", conn.agent or addr, exc)
            fatal = {"fatal": True} if isinstance(exc, RegistrationRefused) else {}
            try:
                send_parts(sock, protocol.error_message(str(exc), **fatal))
            except OSError:
                pass
        except OSError as exc:
            LOG.info("agent %s: connection ended: %s", conn.agent or addr, exc)
        finally:
            conn.close()
            with self.lock:
                if conn.agent is not None and self.connections.get(conn.agent) is conn:
                    del self.connections[conn.agent]
                    LOG.info("agent %s disconnected", conn.agent)
                    self.last_seen[conn.agent] = conn.last_seen
                    self.controller.events.add("agent_lost", agent=conn.agent)

    def _handle(self, conn: AgentConnection, m: dict) -> None:
        kind = m["t"]
        if kind == "register":
            self._register(conn, m)
            return
        if conn.agent is None:
            raise ChannelError(f"{kind} before register")
        if kind == "progress":
            for item in m["flows"]:
                try:
                    self._progress(
                        conn.agent, item["coflow"], item["flow"], item["acked"], item.get("k", "")
                    )
                except RegistryError as exc:
                    self._refused(conn.agent, kind, exc, item["coflow"], item["flow"], item)
            return
        try:
            if kind == "complete":
                self._complete(conn.agent, m["coflow"], m["flow"], m["digest"], m.get("sha256"),
                               m.get("k", ""))  # fmt: skip
            elif kind == "listing":
                self.files.answer(conn.agent, m)
            elif kind == "ack":
                self._acked(m["id"])
            elif kind == "failed":
                self._failed(
                    conn.agent, m["coflow"], m["flow"], m["reason"], m["cause"],
                    m.get("attempt", 0), m.get("k", ""),
                )  # fmt: skip
            elif kind == "error":
                LOG.warning("agent %s reports: %.1024s", conn.agent, m.get("message"))
        except RegistryError as exc:  # e.g. a report about a coflow this controller forgot
            self._refused(conn.agent, kind, exc, m.get("coflow"), m.get("flow"), m)

    def _refused(self, agent: str, kind: str, exc: RegistryError, coflow, flow, report) -> None:
        """Log a refused report; one about another attempt than the flow's current one
        resynchronizes the flow's agents (`resync`)."""
        _log_refused(agent, kind, exc)
        if exc.code == "stale_attempt" and report.get("k"):  # a report without one: refused
            self.resync(coflow, flow, report["k"])

    def resync(self, coflow: str, flow: str, tag: object) -> bool:
        """An endpoint reported on `flow` with a tag of no attempt this controller made (it
        holds the flow from before a controller restart that lost the coflow's secret, or
        from an earlier coflow with the same ids): send both endpoints "drop" and the
        current descriptor, receiver first (as for a restart; at most once per RESYNC_S per
        flow attempt). A tag of one of the flow's earlier attempts (a late report) changes
        nothing.

        Returns:
            True when the descriptor was sent again.
        """
        with self.controller.lock:
            try:
                f = self.controller.registry.flow(parse_coflow_key(coflow), flow)
                c = self.controller.registry.get(parse_coflow_key(coflow))
            except RegistryError:
                return False
            if c.state.final or f.ended or _earlier_attempt(c, f, tag):
                return False
            key, now = (coflow, f.id, f.restarts), time.monotonic()
            with self.lock:
                if self.resynced.get(key, -RESYNC_S) > now - RESYNC_S:
                    return False
                self.resynced[key] = now
                self.resynced.move_to_end(key)
                while len(self.resynced) > MAX_RESYNCED:
                    self.resynced.popitem(last=False)
            LOG.warning("flow %s/%s: an agent holds another attempt: sent again", coflow, flow)
            self.push_drop(c, [f], True)
            return True

    def _acked(self, msg_id) -> None:
        now = time.monotonic()
        with self.ack_event:
            if msg_id not in self.sent_at or msg_id in self.acks:
                return  # not a message we sent (or acked already): nothing to remember
            self.acks[msg_id] = now
            for reaction in self.reactions:
                if msg_id in reaction.pending:
                    reaction.pending.discard(msg_id)
                    if not reaction.pending:
                        reaction.applied_at = now
                        self.controller.metrics.reaction.observe(now - reaction.event_at)
            self.ack_event.notify_all()
            after = self.after_ack.pop(msg_id, None)
        if after is not None:
            after[1]()

    def _check_endpoint(self, agent: str, coflow: str, flow: str, role: str) -> None:
        """Raise RegistryError("forbidden") unless `agent` is the flow's sender (role "send"),
        its receiver ("recv") or either ("any"); an unknown coflow/flow raises
        "unknown_coflow"/"unknown_flow".
        """
        with self.controller.lock:
            f = self.controller.registry.flow(parse_coflow_key(coflow), flow)
            endpoints = {"send": (f.src_agent,), "recv": (f.dst_agent,)}.get(
                role, (f.src_agent, f.dst_agent)
            )
        if agent not in endpoints:
            raise RegistryError(
                "forbidden", f"agent {agent!r} is not the {role} endpoint of {coflow}/{flow}"
            )

    def _keep_pending(self, agent: str, kind: str, coflow: str, flow: str, args: tuple) -> None:
        """Keep `agent`'s report about a coflow this controller does not know yet (at most
        MAX_PENDING_PER_AGENT per agent, its oldest dropped first: one agent cannot push
        out another's reports). A progress report keeps the highest offset."""
        with self.lock:
            mine = self.pending.setdefault(agent, OrderedDict())
            group = mine.setdefault(coflow, {})
            old = group.get((kind, flow))
            if kind == "progress" and old is not None and old[1] == args[1] and old[0] > args[0]:
                args = old  # the same attempt: keep the highest offset
            group[(kind, flow)] = args
            self.pending_agents.setdefault(coflow, set()).add(agent)
            count = self.pending_count.get(agent, 0) + (old is None)
            while count > MAX_PENDING_PER_AGENT:
                oldest, first = next(iter(mine.items()))
                first.pop(next(iter(first)))
                count -= 1
                if not first:
                    del mine[oldest]
                    holders = self.pending_agents.get(oldest, set())
                    holders.discard(agent)
                    if not holders:
                        self.pending_agents.pop(oldest, None)
            self.pending_count[agent] = count

    def _progress(self, agent: str, coflow: str, flow: str, acked: int, tag: str) -> None:
        try:
            self._check_endpoint(agent, coflow, flow, "any")
        except RegistryError as exc:
            if exc.code != "forbidden" and self._unknown(coflow):
                self._keep_pending(agent, "progress", coflow, flow, (acked, tag))
                return
            raise
        if not self.controller.progress(parse_coflow_key(coflow), flow, acked, tag):
            self._send_drop({agent}, coflow, [flow])  # its coflow failed / was cancelled

    def _complete(
        self, agent: str, coflow: str, flow: str, digest: str, sha256: str | None, tag: str
    ) -> None:
        try:
            self._check_endpoint(agent, coflow, flow, "recv")
        except RegistryError as exc:
            if exc.code != "forbidden" and self._unknown(coflow):
                # finished while the controller was down: keep it until resubmitted
                self._keep_pending(agent, "complete", coflow, flow, (digest, sha256, tag))
                return
            raise
        self.controller.complete(parse_coflow_key(coflow), flow, digest, tag, sha256)

    def _failed(
        self,
        agent: str,
        coflow: str,
        flow: str,
        reason: str,
        cause: str,
        attempt: int = 0,
        tag: str = "",
    ) -> None:
        """An endpoint reports that attempt `attempt` of a flow cannot run (see
        Controller.fail_flow); a report about a coflow not known yet (controller restarted)
        is kept until it is resubmitted.

        Raises:
            RegistryError: "forbidden" (not the flow's endpoint: its sender for cause
                "source", its receiver otherwise), "stale_attempt" (not the tag of the
                flow's current attempt), unknown flow of a known coflow.
        """
        try:
            self._check_endpoint(agent, coflow, flow, "send" if cause == "source" else "recv")
        except RegistryError as exc:
            if exc.code != "forbidden" and self._unknown(coflow):
                args = (reason, cause, attempt, tag)
                self._keep_pending(agent, "failed", coflow, flow, args)
                return
            raise
        cid = parse_coflow_key(coflow)
        outcome = self.controller.fail_flow(cid, flow, reason, cause == "digest", attempt, tag)
        if outcome != "ignored":
            LOG.warning(
                "agent %s: flow %s/%s cannot run (%s): %s", agent, coflow, flow, cause, reason
            )

    def _unknown(self, coflow: str, known: dict | None = None) -> bool:
        """True when `coflow` is a well-formed id of a coflow not in memory (a report about it
        is kept)."""
        try:
            cid = parse_coflow_key(coflow)
        except RegistryError:
            return False
        return cid not in (self.controller.registry.coflows if known is None else known)

    def _register(self, conn: AgentConnection, m: dict) -> None:
        """Register the agent of `conn`; RegistrationRefused (sent to it as a fatal "error":
        it exits instead of retrying) for a peer that is not an agent or not the named one, an
        unknown DC, a bad id or a data_addr check_data_addr refuses."""
        identity = conn.identity
        if not identity.may(Role.AGENT):
            raise RegistrationRefused(f"{identity.role.value} {identity.name!r} is not an agent")
        if not identity.insecure and m["agent"] != identity.name:
            raise RegistrationRefused(
                f"certificate of {identity.name!r} cannot register as {m['agent']!r}"
            )
        if conn.agent is not None and conn.agent != m["agent"]:
            raise RegistrationRefused("one connection cannot register two agents")
        data_addr = check_data_addr(m["data_addr"], conn.addr[0], self.data_prefixes)
        with self.controller.lock:
            try:
                info = self.controller.registry.register_agent(m["agent"], m["dc"], data_addr)
            except RegistryError as exc:
                raise RegistrationRefused(str(exc)) from exc
        with self.lock:
            old = self.connections.get(info.id)
            if old is not None and old is not conn:
                old.close()
            conn.agent = info.id
            self.connections[info.id] = conn
        for item in m.get("inflight", []):  # acked offsets (sender) / delivered (receiver)
            tag = item.get("k", "")
            try:
                self._progress(info.id, item["coflow"], item["flow"], item["offset"], tag)
                digest = item.get("digest")  # optional: a receiving flow that completed
                if item["role"] == "recv" and isinstance(digest, str) and digest:
                    self._complete(info.id, item["coflow"], item["flow"], digest, None, tag)
            except RegistryError as exc:
                self._refused(info.id, "inflight row", exc, item["coflow"], item["flow"], item)
        LOG.info("agent %s registered in %s at %s", info.id, info.dc, info.data_addr)
        self.controller.events.add("agent_registered", agent=info.id, dc=info.dc)
        self.controller.metrics.registrations.inc()
        conn.send({"t": "registered", "agent": info.id, "generation": self.controller.generation})
        self.controller.agent_registered()  # waiting submits; journaled coflows resume
        self.apply_inflight()
        self.push_tunnels()
        with self.controller.lock:
            flows = [
                (c, f)
                for c in self.controller.registry.active()
                for f in c.flows.values()
                if not f.intra_dc and not f.done and info.id in (f.src_agent, f.dst_agent)
            ]
        self._send_flows(flows)
        conn.sent_rates = {}
        self.push_rates(self.controller.rates, False)

    def apply_inflight(self, coflows: list[str] | None = None) -> None:
        """Apply the reports kept for coflows not known when they arrived: those about
        coflows known now (among `coflows`, default all) are applied with the usual endpoint
        and attempt checks, progress first, then completions, then failures; the others
        stay kept."""
        with self.lock:
            if not self.pending_agents:
                return
            known = self.controller.registry.coflows
            chosen = self.pending_agents if coflows is None else coflows
            ready: list[tuple[str, str, str, str, tuple]] = []
            for coflow in [c for c in chosen if not self._unknown(c, known)]:
                for agent in self.pending_agents.pop(coflow, ()):
                    mine = self.pending.get(agent, {})
                    group = mine.pop(coflow, {})
                    if not mine:
                        self.pending.pop(agent, None)
                    self.pending_count[agent] = self.pending_count.get(agent, 0) - len(group)
                    ready += [(k, agent, coflow, f, args) for (k, f), args in group.items()]
        order = {"progress": 0, "complete": 1, "failed": 2}
        ready.sort(key=lambda r: order[r[0]])
        for kind, agent, coflow, flow, args in ready:
            try:
                getattr(self, "_" + kind)(agent, coflow, flow, *args)
            except RegistryError as exc:
                self._refused(agent, f"kept {kind}", exc, coflow, flow, {"k": args[-1]})

    def close_all(self, grace_s: float = 0.2) -> None:
        """Say goodbye to every agent: half-close (FIN), let them close, then close.

        Used on SIGTERM so agents see a clean end of the control channel (a plain
        exit with unread data would reset the connections) and reconnect.
        """
        with self.lock:
            conns = list(self.connections.values())
        for conn in conns:
            try:
                conn.sock.shutdown(socket.SHUT_WR)
            except OSError:
                pass
        end = time.monotonic() + grace_s
        while time.monotonic() < end and any(not c.closed for c in conns):
            time.sleep(0.01)
        for conn in conns:
            conn.close()

    # -- pushes

    def push_tunnels(self) -> dict[int, str]:
        """Send every connected agent its current tunnel table.

        Returns:
            {message id: agent id} of the "tunnels" messages sent.
        """
        with self.controller.lock:
            agents = dict(self.controller.registry.agents)
        with self.lock:
            conns = list(self.connections.values())
            connected = list(self.connections)
        sent = {}
        for conn in conns:
            info = agents.get(conn.agent)
            if info is None:
                continue
            peers = [agents[a] for a in connected if a in agents and a != info.id]
            with self.controller.lock:
                specs = self.tunnels.specs_for(info, peers)
                listen = self.tunnels.listen_ports(info.data_addr)
            keys = None
            if self.data_keys is not None:
                keys = self.data_keys.keys_for(info.id, [p.id for p in peers])
            msg_id = self._new_id()
            conn.send(protocol.tunnels_message(specs, listen, msg_id=msg_id, keys=keys))
            sent[msg_id] = info.id
        return sent

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
        with self.lock:  # a drop or restart of these flows (sent under this lock) follows
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

    def connected_agents(self) -> list[str]:
        """Ids of the agents with an open control connection now (Controller.connected_agents)."""
        with self.lock:
            return list(self.connections)

    def push_drop(self, coflow: CoflowState, flows: list[FlowState], restart: bool) -> None:
        """Controller listener (lock held): tell agents to forget `flows` of `coflow`.

        Args:
            flows: WAN flows of the coflow.
            restart: False: the coflow failed or was cancelled; both endpoints get "drop".
                True: each flow starts again from byte 0 (attempt = flow.restarts): its
                receiver gets "drop" and the new descriptor at once, its sender only once
                the receiver acknowledged them (or after RESTART_ACK_S, or at once when the
                receiver is not connected).

        On a restart, what was last sent as rates to the sender's FlowGroup is forgotten, so
        the next round sends its rates afresh; otherwise the next round pauses the group.
        """
        cid = coflow_key(coflow.id)
        if not restart:
            per_agent: dict[str, list[str]] = {}
            for f in flows:
                for agent in (f.src_agent, f.dst_agent):
                    per_agent.setdefault(agent, []).append(f.id)
            for agent, ids in per_agent.items():
                self._send_drop({agent}, cid, ids)
            return
        for f in flows:
            spec = flow_spec(coflow, f, self.leaf_mac)
            with self.lock:
                receiver = self.connections.get(f.dst_agent)
                sender = self.connections.get(f.src_agent)
                if sender is not None:
                    sender.sent_rates.pop((cid, f.dst_dc), None)
            sender_part = _once(lambda f=f, spec=spec: self._restart_at(f.src_agent, spec))
            if receiver is None:
                sender_part()
                continue
            msg_id = self._new_id()
            with self.ack_event:
                self.after_ack[msg_id] = (time.monotonic() + RESTART_ACK_S, sender_part)
            self._restart_at(f.dst_agent, spec, msg_id)

    def _restart_at(self, agent: str, spec: protocol.FlowSpec, msg_id=None) -> None:
        """Send "drop" and the new descriptor of a restarted flow to one of its agents."""
        with self.lock:
            conn = self.connections.get(agent)
            if conn is None:
                return  # it gets the descriptor when it registers again
            for m in protocol.drop_messages(spec.coflow, [spec.flow]):
                conn.send(m)
            conn.send(protocol.flows_message([spec], msg_id=msg_id))

    def _send_drop(self, agents: set[str], coflow: str, flows: list[str]) -> None:
        """Send "drop" for `flows` of `coflow` to those of `agents` that are connected."""
        with self.lock:
            for agent in agents:
                conn = self.connections.get(agent)
                if conn is not None:
                    for m in protocol.drop_messages(coflow, flows):
                        conn.send(m)

    def run_overdue(self) -> None:
        """Controller tick: run the deferred sends whose acknowledgement is overdue."""
        now = time.monotonic()
        with self.ack_event:
            due = [k for k, (deadline, _) in self.after_ack.items() if deadline <= now]
            calls = [self.after_ack.pop(k)[1] for k in due]
        for call in calls:
            call()

    def push_rates(self, rates: FlowRates, wan_changed: bool) -> list[int]:
        """Controller listener: send each sending agent its changed FlowGroup rates.

        Args:
            rates: {coflow id: {flow id: [(path, bytes/s)]}} from the round.
            wan_changed: the tunnel table changed (link down/up): send it first.

        Returns:
            ids of the "rates" messages sent (each agent acks them once applied).
        """
        event_at = self.controller.wan_event_at
        known = self.tunnels.next_id
        wanted = self.group_rates(rates)  # may add logical tunnels for new paths
        new_tunnels = self.tunnels.next_id != known
        tunnel_ids = self.push_tunnels() if wan_changed or new_tunnels else {}
        sent = []
        sent_to = dict(tunnel_ids)
        with self.lock:
            for agent, conn in self.connections.items():
                want = wanted.get(agent, {})
                changed = [
                    protocol.GroupRates(c, d, paths)
                    for (c, d), paths in want.items()
                    if conn.sent_rates.get((c, d)) != paths
                ]
                changed += [
                    protocol.GroupRates(c, d, {})
                    for (c, d), paths in conn.sent_rates.items()
                    if (c, d) not in want and paths
                ]
                for batch in batches(changed):
                    msg_id = self._new_id()
                    conn.send(protocol.rates_message(batch, msg_id=msg_id))
                    sent.append(msg_id)
                    sent_to[msg_id] = agent
                conn.sent_rates = {k: v for k, v in want.items()}
        if wan_changed and event_at is not None:
            reaction = Reaction(event_at, time.monotonic(), set(sent_to), set(sent_to.values()))
            with self.ack_event:
                reaction.pending -= set(self.acks)  # acks that raced ahead
                if not reaction.pending:
                    reaction.applied_at = time.monotonic()
                    self.controller.metrics.reaction.observe(
                        reaction.applied_at - reaction.event_at
                    )
                self.reactions.append(reaction)
                self.reaction_count += 1
        return sent

    def group_rates(self, rates: FlowRates) -> dict[str, dict[tuple[str, str], dict[str, float]]]:
        """Sum flows' per-path rates per (sender agent, coflow, dst DC, tunnel).

        Returns:
            {agent id: {(coflow id str, dst DC): {tunnel id: bytes/s}}}.
        """
        out: dict[str, dict[tuple[str, str], dict[str, float]]] = {}
        with self.controller.lock:
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
        return out

    def _new_id(self) -> int:
        msg_id = next(self.ids)
        self.sent_at[msg_id] = time.monotonic()
        if len(self.sent_at) > MAX_SENT:
            for old in list(self.sent_at)[: MAX_SENT // 2]:
                self.sent_at.pop(old, None)
                self.acks.pop(old, None)
        return msg_id


def _earlier_attempt(coflow: CoflowState, flow: FlowState, tag: object) -> bool:
    """True when `tag` is the report tag of one of the flow's attempts before the current."""
    if not isinstance(tag, str):
        return False
    for attempt in range(flow.restarts):
        want = protocol.report_tag(flow_key(coflow.secret, flow.id, attempt))
        if hmac.compare_digest(tag.encode(), want.encode()):
            return True
    return False


def _log_refused(agent: str, kind: str, exc: RegistryError) -> None:
    level = logging.WARNING if exc.code == "forbidden" else logging.INFO
    LOG.log(level, "agent %s: %s refused: %s", agent, kind, exc)


def _once(func):
    """Wrap `func` (no arguments) so that only its first call runs it."""
    done = []

    def call():
        if not done:
            done.append(True)
            func()

    return call


def start_agent_server(
    channel: AgentChannel, host: str, port: int, security: ServerSecurity, spawn=None
):
    """Serve the agent channel on host:port (see `transport.listen_and_serve`; its
    connection counts go to the controller's metrics under "agent channel")."""
    result = listen_and_serve(
        host, port, channel.serve_connection, security, spawn, name="agent channel",
        listeners=channel.controller.metrics.listeners,
    )  # fmt: skip
    LOG.info("agent channel on %s:%d (%s)", *result[2], "TLS" if security.context else "INSECURE")
    return result
