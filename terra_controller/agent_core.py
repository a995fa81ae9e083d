"""The agents' side of the controller as plain logic: events in, effects out.

`step(state, registry, event, now)` takes one event of the control channel (an agent's
registration, a report, an acknowledgement, a disconnection, a flow to drop or restart, a
round's rates, a tick), the time `now` (seconds, time.monotonic()) and the channel's plain
state (`AgentState`), updates the state and returns the effects as values: messages to send
to agents, registry updates to apply, log lines, events and metrics. It opens no socket,
starts no thread and takes no lock; `registry` (the CoflowRegistry) is read, never written.
The agent channel (`agent_channel.py`) reads and writes the connections, dispatches each
event here under the controller's `lock` (the one owner of this state) and applies the
effects; the outcome of a registry update (`ApplyReport`, `RecordAgent`) comes back as an
event of its own (`ReportApplied`, `ReportRefused`, `AgentRecorded`).

Events are frozen dataclasses of plain values, so a sequence of (now, event) pairs is a
record: replayed into a fresh `AgentState` over a registry in the same state it gives the
same state and effects (`replay`).

Reports (docs/runtime.md, "Coflow ids and states"): a report is taken only from the flow's
endpoint (its sender for a "source" failure, its receiver for a completion or another
failure, either for progress), else refused "forbidden"; a report about a coflow not known
yet (a restarted controller) is kept, per reporting agent (at most MAX_PENDING_PER_AGENT,
its oldest dropped first), until the coflow is known (`ApplyKept`). A report refused
"stale_attempt" whose tag is of no attempt the controller made resynchronizes the flow:
both endpoints get "drop" and the current descriptor, receiver first, at most once per
RESYNC_S per flow attempt.
"""

from __future__ import annotations

import hmac
import logging
from collections import OrderedDict, deque
from dataclasses import dataclass, field

from terra_controller.coflow_registry import CoflowRegistry
from terra_controller.coflow_state import (
    CoflowState,
    FlowState,
    RegistryError,
    coflow_key,
    flow_key,
    parse_coflow_key,
)
from terra_controller.flow_specs import batches, flow_spec
from terra_controller.reaction import Reaction
from terra_controller.registration_checks import RegistrationRefused, check_data_addr
from terra_security.integrity import ALGORITHM
from terra_security.pki import Identity, Role
from terra_wire import control as protocol

MAX_PENDING_PER_AGENT = 10_000  # reports kept per agent for coflows not (yet) resubmitted
MAX_SENT = 20_000  # ids of sent messages remembered for their acks (reaction times)
RESTART_ACK_S = 5.0  # a restarted flow's sender gets its descriptor after this at the latest
RESYNC_S = 10.0  # a flow's agents get its current attempt again at most this often
MAX_RESYNCED = 10_000  # flows remembered for RESYNC_S
REPORT_ORDER = {"progress": 0, "complete": 1, "failed": 2}  # kept reports applied in this order

GroupKey = tuple[str, str]  # (coflow id string, dst DC): a FlowGroup of one sending agent
GroupRates = dict[GroupKey, dict[str, float]]  # {FlowGroup: {tunnel id: bytes/s}}


# ---- state ----------------------------------------------------------------------------------


@dataclass
class AgentState:
    """What the controller keeps about its agents' channel (guarded by the controller's lock).

    Attributes:
        data_prefixes: ipaddress networks an agent's data_addr may lie in (check_data_addr).
        leaf_mac: the leaf-MAC construction named in flow descriptors (integrity.ALGORITHMS).
        last_seen: {agent id: wall-clock s of its last message} of agents whose connection
            ended.
        pending: {reporting agent: {coflow: {(kind, flow): report args}}} of reports about
            coflows not known yet (coflows oldest first); pending_count: {agent: reports kept};
            pending_agents: {coflow: agents with reports kept about it}.
        resynced: {(coflow, flow, attempt): monotonic s} of flows resynchronized lately.
        next_id: the next message id. sent_at: {message id: monotonic s queued}; acks:
            {message id: monotonic s acked}.
        after_ack: {message id: (monotonic deadline, effects)}: effects released once the
            message is acked or the deadline passed (a restarted flow's sender part).
        sent_rates: {agent id: {FlowGroup: {tunnel id: bytes/s}}} last sent to each agent.
        reactions: the last 100 Reactions; reaction_count: Reactions recorded in all.
    """

    data_prefixes: tuple = ()
    leaf_mac: str = ALGORITHM
    last_seen: dict[str, float] = field(default_factory=dict)
    pending: dict[str, OrderedDict[str, dict[tuple[str, str], tuple]]] = field(default_factory=dict)
    pending_count: dict[str, int] = field(default_factory=dict)
    pending_agents: dict[str, set[str]] = field(default_factory=dict)
    resynced: OrderedDict[tuple[str, str, int], float] = field(default_factory=OrderedDict)
    next_id: int = 1
    sent_at: dict[int, float] = field(default_factory=dict)
    acks: dict[int, float] = field(default_factory=dict)
    after_ack: dict[int, tuple[float, tuple]] = field(default_factory=dict)
    sent_rates: dict[str, GroupRates] = field(default_factory=dict)
    reactions: deque[Reaction] = field(default_factory=lambda: deque(maxlen=100))
    reaction_count: int = 0


# ---- events (inputs) ------------------------------------------------------------------------


@dataclass(frozen=True)
class Register:
    """An agent's "register" message: agent, dc, data_addr as sent (unchecked); peer_host:
    the control connection's IP address; identity: its certificate; bound: the agent the
    connection registered before (None); inflight: the message's rows (dicts: coflow, flow,
    role "send"/"recv", offset, k, digest?); generation: the controller's etcd generation."""

    agent: object
    dc: object
    data_addr: object
    peer_host: str
    identity: Identity
    bound: str | None = None
    inflight: tuple = ()
    generation: int = 0


@dataclass(frozen=True)
class AgentRecorded:
    """The registry recorded a registering agent (the outcome of `RecordAgent`)."""

    agent: str
    dc: str
    data_addr: str
    inflight: tuple = ()
    generation: int = 0


@dataclass(frozen=True)
class Report:
    """An agent's report about a flow. kind: "progress" (args: acked bytes, tag), "complete"
    (digest, sha256 or None, tag) or "failed" (reason, cause, attempt, tag); label: what a
    refusal is logged as; then: the report handled once this one is applied or kept (an
    inflight row's completion after its progress)."""

    agent: str
    kind: str
    coflow: str
    flow: str
    args: tuple
    label: str = ""
    then: Report | None = None


@dataclass(frozen=True)
class ReportApplied:
    """The controller applied `report`: result = Controller.progress's bool (False: drop
    it), Controller.complete's bool or Controller.fail_flow's outcome string."""

    report: Report
    result: object


@dataclass(frozen=True)
class ReportRefused:
    """The controller refused `report` (RegistryError `code`, `message`); connected: the
    agents with an open control connection."""

    report: Report
    code: str
    message: str
    connected: frozenset = frozenset()


@dataclass(frozen=True)
class ApplyKept:
    """Coflows may have become known: apply the reports kept about those of `coflows`
    (None: all) that are known now."""

    coflows: tuple | None = None


@dataclass(frozen=True)
class Ack:
    """An agent acknowledged message `msg_id` (applied)."""

    msg_id: object


@dataclass(frozen=True)
class Disconnect:
    """A registered agent's control connection ended; last_seen: wall-clock s of its last
    message."""

    agent: str
    last_seen: float


@dataclass(frozen=True)
class Drop:
    """Agents must forget flows of a coflow: flows = ((flow id, sender, receiver), ...);
    restart False: the coflow failed or was cancelled, True: each flow starts again from
    byte 0 (its current attempt in the registry); connected: agents connected now (read on a
    restart only)."""

    coflow: str
    flows: tuple
    restart: bool
    connected: frozenset = frozenset()


@dataclass(frozen=True)
class Tunnels:
    """Send tunnel tables: tables = ((agent, [TunnelSpec], [listen port], keys or None), ...)."""

    tables: tuple


@dataclass(frozen=True)
class Rates:
    """A round's rates: wanted = {agent: {FlowGroup: {tunnel: bytes/s}}} of the sending
    agents; connected: agents connected now (in order); fresh: agents whose last sent rates
    are forgotten first (a new registration); event_at: monotonic s of the WAN event this
    round answers (None); tunnel_ids: {message id: agent} of the "tunnels" messages sent
    for it."""

    wanted: dict
    connected: tuple
    fresh: tuple = ()
    event_at: float | None = None
    tunnel_ids: dict = field(default_factory=dict)


@dataclass(frozen=True)
class Tick:
    """The controller's tick: release the deferred effects whose acknowledgement is overdue."""


# ---- effects (outputs) ----------------------------------------------------------------------


@dataclass(frozen=True)
class Send:
    """Queue control message `message` to `agent` (nothing when it is not connected)."""

    agent: str
    message: dict


@dataclass(frozen=True)
class RefuseRegistration:
    """Refuse the registration for good (RegistrationRefused(message): fatal, closes)."""

    message: str


@dataclass(frozen=True)
class RecordAgent:
    """Record the agent in the registry, bind the connection to it, then dispatch
    AgentRecorded (inflight, generation passed on); a RegistryError refuses it."""

    agent: object
    dc: object
    data_addr: str
    inflight: tuple = ()
    generation: int = 0


@dataclass(frozen=True)
class ApplyReport:
    """Apply `report` to the registry (Controller.progress / complete / fail_flow) and
    dispatch ReportApplied or ReportRefused."""

    report: Report


@dataclass(frozen=True)
class Refused:
    """A report refused: logged (WARNING for "forbidden", else INFO) and not applied."""

    agent: str
    label: str
    code: str
    message: str


@dataclass(frozen=True)
class Log:
    """A line for the "terra.agents" log at `level` (logging levels)."""

    level: int
    message: str


@dataclass(frozen=True)
class Note:
    """An event for operators (Controller.events.add(kind, **dict(fields)))."""

    kind: str
    fields: tuple


@dataclass(frozen=True)
class Metric:
    """A metric update: "registrations" (inc by value) or "reaction" (observe value, s)."""

    name: str
    value: float


# ---- the step -------------------------------------------------------------------------------


def step(state: AgentState, registry: CoflowRegistry, event: object, now: float) -> list:
    """Handle one event: update `state`, return the effects in the order to apply them.

    Args:
        state: the channel's AgentState (changed in place).
        registry: the coflow registry (read only).
        event: one of the event classes above.
        now: monotonic seconds.

    Raises:
        TypeError: not an event.
    """
    handler = _HANDLERS.get(type(event))
    if handler is None:
        raise TypeError(f"not an agent event: {event!r}")
    return handler(state, registry, event, now)


def replay(state: AgentState, registry: CoflowRegistry, record: list) -> list[list]:
    """Feed a record [(now, event)] into `state`; returns each event's effects, in order."""
    return [step(state, registry, event, now) for now, event in record]


def new_id(state: AgentState, now: float) -> int:
    """A new message id (remembered with its time for its ack; the oldest half forgotten
    beyond MAX_SENT)."""
    msg_id = state.next_id
    state.next_id += 1
    state.sent_at[msg_id] = now
    if len(state.sent_at) > MAX_SENT:
        for old in list(state.sent_at)[: MAX_SENT // 2]:
            state.sent_at.pop(old, None)
            state.acks.pop(old, None)
    return msg_id


# ---- registration ---------------------------------------------------------------------------


def _register(state: AgentState, registry: CoflowRegistry, ev: Register, now: float) -> list:
    """Check the peer and the data address; RefuseRegistration for a peer that is not an
    agent or not the named one, a second agent on one connection or a refused data_addr."""
    identity = ev.identity
    if not identity.may(Role.AGENT):
        return [RefuseRegistration(f"{identity.role.value} {identity.name!r} is not an agent")]
    if not identity.insecure and ev.agent != identity.name:
        why = f"certificate of {identity.name!r} cannot register as {ev.agent!r}"
        return [RefuseRegistration(why)]
    if ev.bound is not None and ev.bound != ev.agent:
        return [RefuseRegistration("one connection cannot register two agents")]
    try:
        data_addr = check_data_addr(ev.data_addr, ev.peer_host, state.data_prefixes)
    except RegistrationRefused as exc:
        return [RefuseRegistration(str(exc))]
    return [RecordAgent(ev.agent, ev.dc, data_addr, ev.inflight, ev.generation)]


def _recorded(state: AgentState, registry: CoflowRegistry, ev: AgentRecorded, now: float) -> list:
    """The agent is registered: its inflight rows (acked offsets of a sender, delivered
    offsets and completions of a receiver) as reports, then "registered". The rates last
    sent to it are forgotten (its connection may be new)."""
    state.sent_rates[ev.agent] = {}
    effects: list = []
    for item in ev.inflight:
        tag = item.get("k", "")
        digest = item.get("digest")  # optional: a receiving flow that completed
        then = None
        if item["role"] == "recv" and isinstance(digest, str) and digest:
            args = (digest, None, tag)
            then = Report(ev.agent, "complete", item["coflow"], item["flow"], args, "inflight row")
        row = Report(ev.agent, "progress", item["coflow"], item["flow"], (item["offset"], tag),
                     "inflight row", then)  # fmt: skip
        effects += _report(state, registry, row, now)
    effects += [
        Log(logging.INFO, f"agent {ev.agent} registered in {ev.dc} at {ev.data_addr}"),
        Note("agent_registered", (("agent", ev.agent), ("dc", ev.dc))),
        Metric("registrations", 1),
        Send(ev.agent, {"t": "registered", "agent": ev.agent, "generation": ev.generation}),
    ]
    return effects


def _disconnect(state: AgentState, registry: CoflowRegistry, ev: Disconnect, now: float) -> list:
    state.last_seen[ev.agent] = ev.last_seen
    state.sent_rates.pop(ev.agent, None)
    return [
        Log(logging.INFO, f"agent {ev.agent} disconnected"),
        Note("agent_lost", (("agent", ev.agent),)),
    ]


# ---- reports --------------------------------------------------------------------------------


def check_endpoint(registry: CoflowRegistry, agent: str, coflow: str, flow: str, role: str):
    """Raise RegistryError("forbidden") unless `agent` is the flow's sender (role "send"), its
    receiver ("recv") or either ("any"); an unknown coflow/flow raises "unknown_coflow" /
    "unknown_flow"."""
    f = registry.flow(parse_coflow_key(coflow), flow)
    endpoints = {"send": (f.src_agent,), "recv": (f.dst_agent,)}.get(
        role, (f.src_agent, f.dst_agent)
    )
    if agent not in endpoints:
        raise RegistryError(
            "forbidden", f"agent {agent!r} is not the {role} endpoint of {coflow}/{flow}"
        )


def _role(report: Report) -> str:
    if report.kind == "progress":
        return "any"
    if report.kind == "failed" and report.args[1] == "source":
        return "send"
    return "recv"


def unknown(coflow: object, known: dict) -> bool:
    """True when `coflow` is a well-formed id of a coflow not in `known` (a report about it
    is kept)."""
    try:
        cid = parse_coflow_key(coflow)
    except RegistryError:
        return False
    return cid not in known


def _report(state: AgentState, registry: CoflowRegistry, r: Report, now: float) -> list:
    """Check the reporter is the flow's endpoint; keep a report about a coflow not known
    yet; otherwise ApplyReport."""
    try:
        check_endpoint(registry, r.agent, r.coflow, r.flow, _role(r))
    except RegistryError as exc:
        if exc.code != "forbidden" and unknown(r.coflow, registry.coflows):
            _keep(state, r)
            return _then(state, registry, r, now)
        return [Refused(r.agent, r.label or r.kind, exc.code, str(exc))]
    return [ApplyReport(r)]


def _then(state: AgentState, registry: CoflowRegistry, r: Report, now: float) -> list:
    return [] if r.then is None else _report(state, registry, r.then, now)


def _keep(state: AgentState, r: Report) -> None:
    """Keep a report about a coflow not known yet (at most MAX_PENDING_PER_AGENT per agent,
    its oldest dropped first: one agent cannot push out another's). A progress report keeps
    the highest offset of the same attempt."""
    agent, args = r.agent, r.args
    mine = state.pending.setdefault(agent, OrderedDict())
    group = mine.setdefault(r.coflow, {})
    old = group.get((r.kind, r.flow))
    if r.kind == "progress" and old is not None and old[1] == args[1] and old[0] > args[0]:
        args = old  # the same attempt: keep the highest offset
    group[(r.kind, r.flow)] = args
    state.pending_agents.setdefault(r.coflow, set()).add(agent)
    count = state.pending_count.get(agent, 0) + (old is None)
    while count > MAX_PENDING_PER_AGENT:
        oldest, first = next(iter(mine.items()))
        first.pop(next(iter(first)))
        count -= 1
        if not first:
            del mine[oldest]
            holders = state.pending_agents.get(oldest, set())
            holders.discard(agent)
            if not holders:
                state.pending_agents.pop(oldest, None)
    state.pending_count[agent] = count


def _applied(state: AgentState, registry: CoflowRegistry, ev: ReportApplied, now: float) -> list:
    """A progress report about a flow of a failed or cancelled coflow gets "drop" back; a
    failure that changed the flow is logged; then the chained report."""
    r = ev.report
    effects: list = []
    if r.kind == "progress" and ev.result is False:
        effects += [Send(r.agent, m) for m in protocol.drop_messages(r.coflow, [r.flow])]
    elif r.kind == "failed" and ev.result != "ignored":
        reason, cause = r.args[0], r.args[1]
        text = f"agent {r.agent}: flow {r.coflow}/{r.flow} cannot run ({cause}): {reason}"
        effects.append(Log(logging.WARNING, text))
    return effects + _then(state, registry, r, now)


def _refused(state: AgentState, registry: CoflowRegistry, ev: ReportRefused, now: float) -> list:
    """Log the refusal; a report about another attempt than the flow's current one
    resynchronizes the flow's agents (`resync`)."""
    r = ev.report
    effects: list = [Refused(r.agent, r.label or r.kind, ev.code, ev.message)]
    tag = r.args[-1] if r.args else ""
    if ev.code == "stale_attempt" and tag:  # a report without one: refused
        effects += resync(state, registry, r.coflow, r.flow, tag, ev.connected, now)
    return effects


def resync(
    state: AgentState,
    registry: CoflowRegistry,
    coflow: str,
    flow: str,
    tag: object,
    connected: frozenset,
    now: float,
) -> list:
    """An endpoint reported on `flow` with a tag of no attempt this controller made (it holds
    the flow from before a controller restart that lost the coflow's secret, or from an
    earlier coflow with the same ids): both endpoints get "drop" and the current descriptor,
    receiver first (as for a restart; at most once per RESYNC_S per flow attempt). A tag of
    one of the flow's earlier attempts (a late report) changes nothing: no effects."""
    try:
        f = registry.flow(parse_coflow_key(coflow), flow)
        c = registry.get(parse_coflow_key(coflow))
    except RegistryError:
        return []
    if c.state.final or f.ended or _earlier_attempt(c, f, tag):
        return []
    key = (coflow, f.id, f.restarts)
    if state.resynced.get(key, -RESYNC_S) > now - RESYNC_S:
        return []
    state.resynced[key] = now
    state.resynced.move_to_end(key)
    while len(state.resynced) > MAX_RESYNCED:
        state.resynced.popitem(last=False)
    text = f"flow {coflow}/{flow}: an agent holds another attempt: sent again"
    return [Log(logging.WARNING, text)] + restart_flows(state, c, [f], connected, now)


def _earlier_attempt(coflow: CoflowState, flow: FlowState, tag: object) -> bool:
    """True when `tag` is the report tag of one of the flow's attempts before the current."""
    if not isinstance(tag, str):
        return False
    for attempt in range(flow.restarts):
        want = protocol.report_tag(flow_key(coflow.secret, flow.id, attempt))
        if hmac.compare_digest(tag.encode(), want.encode()):
            return True
    return False


def _apply_kept(state: AgentState, registry: CoflowRegistry, ev: ApplyKept, now: float) -> list:
    """The reports kept about coflows known now, as reports: progress first, then
    completions, then failures (labelled "kept KIND"); the others stay kept."""
    if not state.pending_agents:
        return []
    known = registry.coflows
    chosen = list(state.pending_agents if ev.coflows is None else ev.coflows)
    ready: list[Report] = []
    for coflow in [c for c in chosen if not unknown(c, known)]:
        for agent in sorted(state.pending_agents.pop(coflow, ())):
            mine = state.pending.get(agent, {})
            group = mine.pop(coflow, {})
            if not mine:
                state.pending.pop(agent, None)
            state.pending_count[agent] = state.pending_count.get(agent, 0) - len(group)
            ready += [
                Report(agent, k, coflow, f, args, f"kept {k}") for (k, f), args in group.items()
            ]
    ready.sort(key=lambda r: REPORT_ORDER[r.kind])
    effects: list = []
    for r in ready:
        effects += _report(state, registry, r, now)
    return effects


# ---- drops, restarts and acknowledgements ---------------------------------------------------


def _drop(state: AgentState, registry: CoflowRegistry, ev: Drop, now: float) -> list:
    """ "drop" to both endpoints of each flow (restart False), or each flow's restart
    (`restart_flows`) for the flows still in the registry."""
    if not ev.restart:
        per_agent: dict[str, list[str]] = {}
        for fid, src, dst in ev.flows:
            for agent in (src, dst):
                per_agent.setdefault(agent, []).append(fid)
        return [
            Send(agent, m)
            for agent, ids in per_agent.items()
            for m in protocol.drop_messages(ev.coflow, ids)
        ]
    coflow = registry.get(parse_coflow_key(ev.coflow))
    flows = [coflow.flows[fid] for fid, _, _ in ev.flows if fid in coflow.flows]
    return restart_flows(state, coflow, flows, ev.connected, now)


def restart_flows(
    state: AgentState, coflow: CoflowState, flows: list, connected: frozenset, now: float
) -> list:
    """Each flow starts again from byte 0 (attempt = flow.restarts): its receiver gets "drop"
    and the new descriptor at once, its sender only once the receiver acknowledged them
    (state.after_ack; or RESTART_ACK_S later, or at once when the receiver is not in
    `connected`). The rates last sent to the sender's FlowGroup are forgotten, so the next
    round sends them afresh."""
    cid = coflow_key(coflow.id)
    effects: list = []
    for f in flows:
        spec = flow_spec(coflow, f, state.leaf_mac)
        state.sent_rates.get(f.src_agent, {}).pop((cid, f.dst_dc), None)
        sender_part = tuple(_restart_at(f.src_agent, spec))
        if f.dst_agent not in connected:
            effects += sender_part
            continue
        msg_id = new_id(state, now)
        state.after_ack[msg_id] = (now + RESTART_ACK_S, sender_part)
        effects += _restart_at(f.dst_agent, spec, msg_id)
    return effects


def _restart_at(agent: str, spec: protocol.FlowSpec, msg_id: int | None = None) -> list:
    """ "drop" and the new descriptor of a restarted flow, to one of its agents."""
    drops = [Send(agent, m) for m in protocol.drop_messages(spec.coflow, [spec.flow])]
    return drops + [Send(agent, protocol.flows_message([spec], msg_id=msg_id))]


def _ack(state: AgentState, registry: CoflowRegistry, ev: Ack, now: float) -> list:
    """Remember the ack of a message this controller sent; complete the reactions waiting
    for it; release what waited for it (after_ack)."""
    msg_id = ev.msg_id
    if msg_id not in state.sent_at or msg_id in state.acks:
        return []  # not a message we sent (or acked already): nothing to remember
    state.acks[msg_id] = now
    effects: list = []
    for reaction in state.reactions:
        if msg_id in reaction.pending:
            reaction.pending.discard(msg_id)
            if not reaction.pending:
                reaction.applied_at = now
                effects.append(Metric("reaction", now - reaction.event_at))
    after = state.after_ack.pop(msg_id, None)
    return effects + (list(after[1]) if after is not None else [])


def _tick(state: AgentState, registry: CoflowRegistry, ev: Tick, now: float) -> list:
    due = [k for k, (deadline, _) in state.after_ack.items() if deadline <= now]
    return [e for k in due for e in state.after_ack.pop(k)[1]]


# ---- tunnels and rates ----------------------------------------------------------------------


def _tunnels(state: AgentState, registry: CoflowRegistry, ev: Tunnels, now: float) -> list:
    """A "tunnels" message with a new id to each agent of `tables`."""
    return [
        Send(agent, protocol.tunnels_message(specs, listen, msg_id=new_id(state, now), keys=keys))
        for agent, specs, listen, keys in ev.tables
    ]


def _rates(state: AgentState, registry: CoflowRegistry, ev: Rates, now: float) -> list:
    """Each connected agent gets its changed FlowGroup rates (a group that lost its rates:
    no paths = paused), in messages of bounded size; a round answering a WAN event records a
    Reaction over these messages and the tunnel messages."""
    for agent in ev.fresh:
        state.sent_rates[agent] = {}
    effects: list = []
    sent_to = dict(ev.tunnel_ids)
    for agent in ev.connected:
        want = ev.wanted.get(agent, {})
        last = state.sent_rates.get(agent, {})
        changed = [
            protocol.GroupRates(c, d, p) for (c, d), p in want.items() if last.get((c, d)) != p
        ]
        changed += [
            protocol.GroupRates(c, d, {}) for (c, d), p in last.items() if (c, d) not in want and p
        ]
        for batch in batches(changed):
            msg_id = new_id(state, now)
            effects.append(Send(agent, protocol.rates_message(batch, msg_id=msg_id)))
            sent_to[msg_id] = agent
        state.sent_rates[agent] = dict(want)
    if ev.event_at is not None:
        reaction = Reaction(ev.event_at, now, set(sent_to), set(sent_to.values()))
        reaction.pending -= set(state.acks)  # acks that raced ahead
        if not reaction.pending:
            reaction.applied_at = now
            effects.append(Metric("reaction", now - reaction.event_at))
        state.reactions.append(reaction)
        state.reaction_count += 1
    return effects


_HANDLERS = {
    Register: _register,
    AgentRecorded: _recorded,
    Report: _report,
    ReportApplied: _applied,
    ReportRefused: _refused,
    ApplyKept: _apply_kept,
    Ack: _ack,
    Disconnect: _disconnect,
    Drop: _drop,
    Tunnels: _tunnels,
    Rates: _rates,
    Tick: _tick,
}
