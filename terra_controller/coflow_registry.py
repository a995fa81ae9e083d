"""The controller's coflow state: ids, flows, agents, progress, states and CCTs.

The registry is the controller's truth about what job masters submitted
(docs/design.md sections 4.3 and 6): coflow ids, flows with their agent endpoints
mapped to DCs, per-flow bytes total and delivered, coflow states
(`CoflowStatus`: queued, running, preempted, done, rejected, failed, cancelled),
flow states (`FlowStatus`) and CCTs. Every request is validated in full before
anything changes: a bad request raises `RegistryError` and leaves the registry
exactly as it was.

Finished coflows (done, failed, cancelled) are kept for status requests until
`prune_finished` drops the oldest beyond a count or an age; a status request
for a dropped coflow then answers "unknown_coflow".

Times are seconds on the controller's clock (whatever `now` the caller passes).
"""

from __future__ import annotations

from collections import OrderedDict

from terra_controller.coflow_state import (
    AgentInfo,
    CoflowState,
    FlowState,
    RegistryError,
    assign_keys,
    coflow_key,
    flow_key,
    sink_key,
)
from terra_controller.request_checks import (
    MAX_FLOW_BYTES,
    MAX_FLOWS_PER_REQUEST,
    MAX_ID_CHARS,
    MAX_OPEN_FLOWS,
    check_coflow_id,
    check_deadline,
    check_id,
    check_path,
)
from terra_model.states import FINAL_STATES, MAX_COFLOW_ID, CoflowStatus, FlowStatus

MAX_REASON_CHARS = 1024  # failure reasons kept (longer ones are cut)


class CoflowRegistry:
    """All coflows and agents the controller knows about.

    Args:
        dcs: DC names of the topology (agents must register in one of them).

    Coflow ids are integers assigned in submission order from `next_id` (0, or where the
    controller's journal says the last run stopped), never reused; a resubmission after a
    controller restart may ask for its old id; clients may ask for ids up to MAX_CLIENT_ID.

    A file path at an agent is the sink of one unfinished flow at a time (`sinks`).

    Attributes:
        agents: {agent id: AgentInfo}. coflows: {coflow id: CoflowState}, active and
            finished ones still kept. finished: ids of finished coflows, oldest end first.
        dropped: {final state value: finished coflows dropped by prune_finished}.
        kept: {final state value: finished coflows still in memory} (state counts without
            walking `coflows`).
        sinks: {(dst agent, normalized dst_path): (coflow id, flow id)} of unfinished flows.
        open_flows: {owner: flows of its unfinished coflows} (owner None: in-process).
    """

    def __init__(self, dcs: list[str]) -> None:
        self.dcs = list(dcs)
        self.agents: dict[str, AgentInfo] = {}
        self.coflows: dict[int, CoflowState] = {}
        self.next_id = 0
        # {coflow id: {flow id: bytes left}} of unfinished WAN flows with bytes left,
        # kept up to date by every change so that `remaining` is a cheap copy.
        self._left: dict[int, dict[str, float]] = {}
        self._open: dict[int, CoflowState] = {}  # coflows not in a final state
        self.finished: OrderedDict[int, None] = OrderedDict()
        self.dropped: dict[str, int] = {s.value: 0 for s in FINAL_STATES}
        self.kept: dict[str, int] = {s.value: 0 for s in FINAL_STATES}
        self.sinks: dict[tuple[str, str], tuple[int, str]] = {}
        self.open_flows: dict[str | None, int] = {}
        # {coflow id: {(src DC, dst DC): WAN flows not done}}: FlowGroup and coflow completion
        # without walking every flow of a many-flow coflow at each completion
        self.undone: dict[int, dict[tuple[str, str], int]] = {}

    # ---- agents -------------------------------------------------------------------------

    def register_agent(self, agent_id: object, dc: object, data_addr: object = "") -> AgentInfo:
        """Record (or re-record) an agent in a DC.

        Raises:
            RegistryError("bad_request"): empty/non-string id or address, an id or address
                longer than MAX_ID_CHARS, or unknown DC.
        """
        agent_id = check_id(agent_id, "agent")
        if not isinstance(dc, str) or dc not in self.dcs:
            raise RegistryError("bad_request", f"agent {agent_id}: unknown DC {dc!r}")
        if not isinstance(data_addr, str) or len(data_addr) > MAX_ID_CHARS:
            raise RegistryError(
                "bad_request", f"agent {agent_id}: data_addr must be a string of <= 256 chars"
            )
        info = AgentInfo(agent_id, dc, data_addr)
        self.agents[agent_id] = info
        return info

    # ---- requests -----------------------------------------------------------------------

    def parse_flows(
        self,
        flows: object,
        existing: dict[str, FlowState] | None = None,
        agents: dict[str, AgentInfo] | None = None,
    ) -> list:
        """Validate a request's flows and return them as new FlowStates (nothing is stored).

        Args:
            flows: list of {"id": str|int, "src": agent id, "dst": agent id, "bytes": int > 0,
                "src_path"?: str, "dst_path"?: str} (paths relative to the agents' data
                roots, checked by check_path); at most MAX_FLOWS_PER_REQUEST.
            existing: flows already in the coflow (ids must not repeat them).
            agents: the agents to check endpoints against (default `self.agents`; a copy
                lets a caller parse without holding the controller's lock).

        Raises:
            RegistryError: "bad_request" (not a list, empty, too many, not a map, bad field
                types, a bad src_path / dst_path, a file flow within one DC),
                "duplicate_flow", "unknown_agent", "bad_size", "path_busy" (two flows of the
                request write the same file).
        """
        if not isinstance(flows, list) or not flows:
            raise RegistryError("bad_request", "flows must be a non-empty list")
        if len(flows) > MAX_FLOWS_PER_REQUEST:
            raise RegistryError("bad_request", f"more than {MAX_FLOWS_PER_REQUEST} flows")
        agents = self.agents if agents is None else agents
        seen = set(existing or ())
        sinks: set[tuple[str, str]] = set()
        parsed = []
        for i, item in enumerate(flows):
            flow = self._parse_flow(item, f"flows[{i}]", agents)
            if flow.id in seen:
                raise RegistryError("duplicate_flow", f"flows[{i}]: duplicate flow id {flow.id!r}")
            seen.add(flow.id)
            sink = sink_key(flow)
            if sink is not None:
                if sink in sinks:
                    raise RegistryError(
                        "path_busy", f"flows[{i}]: another flow of the request writes {sink[1]!r}"
                    )
                sinks.add(sink)
            parsed.append(flow)
        return parsed

    def check_sinks(self, flows: list[FlowState]) -> None:
        """Refuse flows whose file is the sink of an unfinished flow already (nothing changes).

        Raises:
            RegistryError("path_busy"): names the path, its agent and the flow writing it.
        """
        for f in flows:
            sink = sink_key(f)
            holder = self.sinks.get(sink) if sink is not None else None
            if holder is not None:
                raise RegistryError(
                    "path_busy",
                    f"flow {f.id}: {sink[1]!r} at agent {sink[0]} is being written by flow "
                    f"{holder[0]}/{holder[1]}",
                )

    def check_open_flows(self, owner: str | None, adding: int) -> None:
        """Refuse `adding` more flows to a job client's unfinished coflows beyond MAX_OPEN_FLOWS.

        Raises:
            RegistryError("too_many_flows").
        """
        have = self.open_flows.get(owner, 0)
        if have + adding > MAX_OPEN_FLOWS:
            raise RegistryError(
                "too_many_flows",
                f"{have} flows of unfinished coflows plus {adding} is over {MAX_OPEN_FLOWS}",
            )

    def _parse_flow(self, item: object, where: str, agents: dict[str, AgentInfo]) -> FlowState:
        if not isinstance(item, dict):
            raise RegistryError("bad_request", f"{where}: must be a map")
        unknown = set(item) - {"id", "src", "dst", "bytes", "src_path", "dst_path"}
        if unknown:
            raise RegistryError("bad_request", f"{where}: unknown fields {sorted(unknown)}")
        fid = check_id(item.get("id"), f"{where}.id")
        ends = []
        for key in ("src", "dst"):
            agent = item.get(key)
            if not isinstance(agent, str) or agent not in agents:
                raise RegistryError("unknown_agent", f"{where}.{key}: unknown agent {agent!r}")
            ends.append(agents[agent])
        size = item.get("bytes")
        if isinstance(size, bool) or not isinstance(size, int):
            raise RegistryError("bad_size", f"{where}.bytes: must be an integer, got {size!r}")
        if not 0 < size <= MAX_FLOW_BYTES:
            raise RegistryError("bad_size", f"{where}.bytes: must be in 1..2**50, got {size}")
        paths = {
            key: check_path(item.get(key), f"{where}.{key}") for key in ("src_path", "dst_path")
        }
        src, dst = ends
        if src.dc == dst.dc and (paths["src_path"] or paths["dst_path"]):
            raise RegistryError(
                "bad_request",
                f"{where}: a file flow must cross DCs ({src.id} and {dst.id} are both in "
                f"{src.dc}): Terra moves file bytes between DCs only",
            )
        return FlowState(fid, src.id, dst.id, src.dc, dst.dc, size, **paths)

    def submit(
        self,
        flows: list[FlowState],
        deadline_s: float | None,
        now: float,
        coflow_id=None,
        owner: str | None = None,
        secret: bytes | None = None,
        keyed: bool = False,
        labels: tuple[str | None, tuple[str, ...]] = (None, ()),
    ) -> CoflowState:
        """Store a new coflow built from already parsed flows (see `parse_flows`).

        Args:
            deadline_s: seconds relative to `now`, > 0, or None.
            now: the coflow's arrival time (s, controller clock; earlier than the current
                time for a resubmission that keeps its first submission's arrival).
            coflow_id: ask for a specific id (resubmission after a controller restart).
            owner: the submitting job client's name (None: in-process).
            secret: the coflow's secret (a resubmission: the first submission's; None: new).
            keyed: the flows' keys are already derived from `secret` (assign_keys, done by
                the caller outside its locks).
            labels: (name, tags) as check_labels returns them.

        Returns:
            the new CoflowState (state "queued"); its flows get their attempt keys and
            their files (dst_path) become busy until they end.

        Raises:
            RegistryError("bad_request"): bad deadline, or the requested id is in use / not
                an integer in 0..MAX_COFLOW_ID, or no id is left.
            RegistryError("path_busy"): see check_sinks.
        """
        deadline_s = check_deadline(deadline_s)
        if coflow_id is None:
            coflow_id = self.new_id()
        check_coflow_id(coflow_id)
        if coflow_id in self.coflows:
            raise RegistryError("bad_request", f"coflow id {coflow_id} is in use")
        self.check_sinks(flows)
        coflow = CoflowState(coflow_id, now, deadline_s, {f.id: f for f in flows}, owner=owner,
                             name=labels[0], tags=labels[1])  # fmt: skip
        if secret is not None:
            coflow.secret = secret
        if not keyed:
            assign_keys(coflow.secret, flows)
        self.coflows[coflow_id] = coflow
        self._open[coflow_id] = coflow
        self._adopt(coflow, flows)
        self.next_id = max(self.next_id, coflow_id + 1)
        return coflow

    def new_id(self) -> int:
        """The id a new coflow gets: `next_id` (ids are never reused).

        Raises:
            RegistryError("bad_request"): every id was used (2**63 of them).
        """
        if self.next_id > MAX_COFLOW_ID:
            raise RegistryError("bad_request", "no coflow id left")
        return self.next_id

    def get(self, coflow_id: object) -> CoflowState:
        """Return a coflow by id.

        Raises:
            RegistryError("unknown_coflow"): no such coflow (or not an integer id).
        """
        if isinstance(coflow_id, bool) or not isinstance(coflow_id, int):
            raise RegistryError("unknown_coflow", f"unknown coflow {coflow_id!r}")
        coflow = self.coflows.get(coflow_id)
        if coflow is None:
            raise RegistryError("unknown_coflow", f"unknown coflow {coflow_id!r}")
        return coflow

    def add_flows(self, coflow: CoflowState, flows: list[FlowState]) -> None:
        """Append parsed flows to an unfinished coflow (updateCoflow).

        Raises:
            RegistryError("coflow_done"): the coflow already finished (done, failed, ...).
            RegistryError("duplicate_flow"): a flow id already in the coflow.
        """
        if coflow.state.final:
            raise RegistryError("coflow_done", f"coflow {coflow.id} already finished")
        for f in flows:
            if f.id in coflow.flows:
                raise RegistryError("duplicate_flow", f"duplicate flow id {f.id!r}")
        self.check_sinks(flows)
        assign_keys(coflow.secret, flows)
        for f in flows:
            coflow.flows[f.id] = f
        self._adopt(coflow, flows)

    def _adopt(self, coflow: CoflowState, flows: list[FlowState]) -> None:
        """Give new flows of `coflow` their busy sinks and bytes to schedule."""
        cid, sinks = coflow.id, self.sinks
        undone = self.undone.setdefault(cid, {})
        for f in flows:
            if not f.intra_dc and not f.done:
                pair = (f.src_dc, f.dst_dc)
                undone[pair] = undone.get(pair, 0) + 1
                if f.dst_path is not None:
                    sinks[sink_key(f)] = (cid, f.id)
        self.open_flows[coflow.owner] = self.open_flows.get(coflow.owner, 0) + len(flows)
        self._track(coflow, flows)

    def _release(self, coflow_id: int, flow: FlowState) -> None:
        """The flow ended: its file (dst_path) is free for another flow."""
        if flow.dst_path is not None:
            key = sink_key(flow)
            if self.sinks.get(key) == (coflow_id, flow.id):
                del self.sinks[key]

    def _track(self, coflow: CoflowState, flows: list[FlowState]) -> None:
        left = {
            f.id: float(f.bytes - f.delivered)
            for f in flows
            if f.src_dc != f.dst_dc and f.state is not FlowStatus.DONE and f.bytes > f.delivered
        }
        if left:
            self._left.setdefault(coflow.id, {}).update(left)

    def _untrack(self, coflow_id: int, flow: FlowState) -> None:
        left = self._left.get(coflow_id)
        if left is None:
            return
        if flow.remaining > 0:
            if flow.id in left:
                left[flow.id] = float(flow.remaining)
            return
        left.pop(flow.id, None)
        if not left:
            del self._left[coflow_id]

    # ---- progress -----------------------------------------------------------------------

    def flow(self, coflow_id: object, flow_id: object) -> FlowState:
        """Return one flow.

        Raises:
            RegistryError("unknown_coflow" / "unknown_flow").
        """
        coflow = self.get(coflow_id)
        flow = coflow.flows.get(str(flow_id)) if isinstance(flow_id, str | int) else None
        if flow is None:
            raise RegistryError("unknown_flow", f"coflow {coflow.id}: unknown flow {flow_id!r}")
        return flow

    def record_progress(self, coflow_id: object, flow_id: object, acked: object) -> FlowState:
        """Record that the receiver acknowledged `acked` bytes of a flow (never goes back).

        Raises:
            RegistryError: unknown coflow/flow, or `acked` not an integer in 0..size.
        """
        flow = self.flow(coflow_id, flow_id)
        if isinstance(acked, bool) or not isinstance(acked, int) or not 0 <= acked <= flow.bytes:
            raise RegistryError("bad_request", f"flow {flow.id}: bad acked offset {acked!r}")
        if flow.state is not FlowStatus.QUEUED and flow.state is not FlowStatus.RUNNING:
            return flow  # done, failed or cancelled: a late report changes nothing
        flow.delivered = max(flow.delivered, acked)
        if flow.delivered > 0:
            flow.state = FlowStatus.RUNNING
        self._untrack(int(coflow_id), flow)
        return flow

    def record_complete(
        self, coflow_id: object, flow_id: object, digest: object, now: float
    ) -> CoflowState:
        """Mark a flow done; mark its coflow done (with `finished_s = now`) when its WAN part is.

        Returns:
            the flow's coflow (check `.state is CoflowStatus.DONE`).

        Raises:
            RegistryError: unknown coflow/flow.
        """
        flow = self.flow(coflow_id, flow_id)
        coflow = self.get(coflow_id)
        if coflow.state.final:
            return coflow  # failed / cancelled meanwhile: a late completion changes nothing
        undone = self.undone.get(coflow.id, {})
        pair = (flow.src_dc, flow.dst_dc)
        if not flow.done and pair in undone and not flow.intra_dc:
            undone[pair] -= 1
        flow.state = FlowStatus.DONE
        flow.delivered = flow.bytes
        flow.digest = digest if isinstance(digest, str) else None
        self._untrack(int(coflow_id), flow)
        self._release(coflow.id, flow)
        self.finish_if_done(coflow, now)
        return coflow

    def finish_if_done(self, coflow: CoflowState, now: float) -> bool:
        """Mark `coflow` done at `now` if every WAN flow is done; intra-DC flows count as done.

        Returns:
            True when the coflow became done by this call.
        """
        if coflow.state.final or any(self.undone.get(coflow.id, {}).values()):
            return False
        for f in coflow.flows.values():
            if f.intra_dc:
                f.state = FlowStatus.DONE
                f.delivered = f.bytes
        coflow.state = CoflowStatus.DONE
        self._left.pop(coflow.id, None)
        coflow.finished_s = now
        self._ended(coflow, now)
        return True

    def end(
        self,
        coflow: CoflowState,
        state: CoflowStatus,
        reason: str,
        now: float,
        culprit: FlowState | None = None,
    ) -> list[FlowState]:
        """Put an unfinished coflow in a final state other than done (failed or cancelled).

        Every flow not done becomes failed (`culprit`, the flow that could not run, with
        `reason`) or cancelled (the others, and all of them for a cancelled coflow); the
        coflow no longer appears in `remaining`.

        Args:
            state: CoflowStatus.FAILED or CoflowStatus.CANCELLED.
            reason: why (kept, cut to MAX_REASON_CHARS characters).
            now: seconds, controller clock (ended_s).

        Returns:
            the WAN flows that were not done (their agents are told to drop them).

        Raises:
            ValueError: `state` is not failed/cancelled, or the coflow is already final.
        """
        if state not in (CoflowStatus.FAILED, CoflowStatus.CANCELLED) or coflow.state.final:
            raise ValueError(f"coflow {coflow.id}: cannot go from {coflow.state} to {state}")
        reason = reason[:MAX_REASON_CHARS]
        unfinished = []
        for f in coflow.flows.values():
            if f.done:
                continue
            if not f.intra_dc:
                unfinished.append(f)
            if f is culprit:
                f.state, f.reason = FlowStatus.FAILED, reason
            else:
                f.state = FlowStatus.CANCELLED
                f.reason = f.reason or f"coflow {state.value}: {reason}"
        coflow.state, coflow.reason = state, reason
        self._left.pop(coflow.id, None)
        self._ended(coflow, now)
        return unfinished

    def restart_flow(self, coflow: CoflowState, flow: FlowState) -> None:
        """Start an unfinished flow again from byte 0 (after a digest mismatch): delivered
        goes back to 0, restarts grows by one and the flow's bytes are scheduled again.

        Raises:
            ValueError: the flow is done, failed or cancelled, or its coflow is final.
        """
        if coflow.state.final or flow.state not in (FlowStatus.QUEUED, FlowStatus.RUNNING):
            raise ValueError(f"flow {coflow.id}/{flow.id} cannot restart ({flow.state})")
        flow.delivered = 0
        flow.state = FlowStatus.QUEUED
        flow.restarts += 1
        # the old attempt's chunks, digest and reports match nothing
        flow.digest_key = flow_key(coflow.secret, flow.id, flow.restarts)
        self._track(coflow, [flow])

    def _ended(self, coflow: CoflowState, now: float) -> None:
        coflow.ended_s = now
        self.undone.pop(coflow.id, None)
        self._open.pop(coflow.id, None)
        for f in coflow.flows.values():
            self._release(coflow.id, f)
        left = self.open_flows.get(coflow.owner, 0) - len(coflow.flows)
        if left > 0:
            self.open_flows[coflow.owner] = left
        else:
            self.open_flows.pop(coflow.owner, None)
        self.finished[coflow.id] = None
        self.kept[coflow.state.value] = self.kept.get(coflow.state.value, 0) + 1

    def prune_finished(
        self, now: float, keep: int | None, keep_s: float | None = None
    ) -> list[CoflowState]:
        """Forget the oldest finished coflows beyond `keep` of them or older than `keep_s`.

        Args:
            now: seconds, controller clock.
            keep: finished coflows kept at most (None: no count bound).
            keep_s: seconds a finished coflow is kept after it ended (None: no age bound).

        Returns:
            the dropped coflows (counted in `dropped` per final state); status requests
            for them answer "unknown_coflow" from now on.
        """
        out = []
        while self.finished:
            cid = next(iter(self.finished))
            coflow = self.coflows.get(cid)
            too_many = keep is not None and len(self.finished) > keep
            too_old = (
                keep_s is not None
                and coflow is not None
                and coflow.ended_s is not None
                and now - coflow.ended_s > keep_s
            )
            if coflow is not None and not too_many and not too_old:
                break
            del self.finished[cid]
            if coflow is None:
                continue
            del self.coflows[cid]
            self._left.pop(cid, None)
            self.dropped[coflow.state.value] = self.dropped.get(coflow.state.value, 0) + 1
            self.kept[coflow.state.value] -= 1
            out.append(coflow)
        return out

    def state_counts(self) -> dict[str, int]:
        """{state value: coflows in memory in that state} (states with none left out);
        O(active coflows)."""
        out = {k: n for k, n in self.kept.items() if n}
        for coflow in self._open.values():
            out[coflow.state.value] = out.get(coflow.state.value, 0) + 1
        return out

    def active(self) -> list[CoflowState]:
        """Coflows not in a final state (in submission order)."""
        return list(self._open.values())

    def remaining(self, connected=None) -> dict[str, dict[str, float]]:
        """Return the policy's Remaining map: {str(coflow id): {flow id: bytes}}, WAN flows only.

        Args:
            connected: optional predicate (src DC, dst DC) -> bool; flows between DCs
                it rejects (cut off by link failures) are left out for now.

        Only unfinished flows with bytes left appear; coflows without any are left out.
        The maps are fresh copies (the caller may keep them).
        """
        if connected is None:
            return {coflow_key(cid): dict(left) for cid, left in self._left.items()}
        out = {}
        for cid, left in self._left.items():
            flows = self.coflows[cid].flows
            kept = {
                fid: b for fid, b in left.items() if connected(flows[fid].src_dc, flows[fid].dst_dc)
            }
            if kept:
                out[coflow_key(cid)] = kept
        return out
