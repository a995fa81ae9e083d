"""How a coflow leaves the schedule unfinished (docs/design.md 4.3, docs/runtime.md).

`CoflowEndings` is the part of `Controller` (terra_controller/controller.py) that fails,
restarts or cancels: a flow its agents cannot run (`fail_flow`: source or sink error,
digest mismatch after `max_restarts` re-transfers), an endpoint agent disconnected longer
than `agent_timeout_s`, a deadline passed unfinished (`check_timeouts`), or the job
master's `cancel`. The policy forgets the coflow, its rates are dropped, and the event's
effects (core_effects.py) ask for a round and tell the `on_drop` listeners which flows to
forget.
"""

from __future__ import annotations

import logging

from terra_controller.coflow_state import CoflowState, FlowState, RegistryError, coflow_key
from terra_controller.core_effects import DropFlows, TimerTick, emit
from terra_controller.core_log import core_event
from terra_controller.resume import ended_summary
from terra_model.states import CoflowStatus, FlowStatus

LOG = logging.getLogger("terra.controller")


class CoflowEndings:
    """Failing, restarting and cancelling coflows of `Controller` (its attributes: owner,
    registry, journal, policy, rates, allocation, stats, metrics, events, on_drop)."""

    def cancel(self, coflow_id: object) -> dict:
        """cancelCoflow: stop an unfinished coflow for good (state "cancelled").

        The policy forgets it, its rates are dropped and a round is asked for (its capacity
        goes to the other coflows in that round); its agents are told to drop its flows.
        Cancelling a cancelled coflow again changes nothing.

        Returns:
            the coflow's status map (see `status`).

        Raises:
            RegistryError("unknown_coflow"): no such coflow (or dropped from memory).
            RegistryError("coflow_done"): it is already done, failed or rejected.
        """
        return self.owner.run(self._cancel_on_loop, coflow_id)

    @core_event("cancel", outcome=lambda status: status["state"])
    def _cancel_on_loop(self, coflow_id: object) -> dict:
        entry = self._journal_only(coflow_id)
        if entry is not None and entry.ended is not None:
            raise RegistryError("coflow_done", f"coflow {coflow_id} already {entry.ended['state']}")
        if entry is not None:  # waiting to be resumed: it ends here
            self._abandon(coflow_id, "cancelled by the job master", CoflowStatus.CANCELLED)
            return self._journal_status(coflow_id)
        coflow = self.registry.get(coflow_id)
        if coflow.state is not CoflowStatus.CANCELLED:
            if coflow.state.final:
                raise RegistryError(
                    "coflow_done", f"coflow {coflow.id} already {coflow.state.value}"
                )
            self._end(coflow, CoflowStatus.CANCELLED, "cancelled by the job master")
        out = coflow.status()  # (it may be dropped from memory already: keep_finished)
        for f in out["flows"]:
            f["rate_bytes_per_s"] = 0.0
        return out

    def fail_flow(
        self,
        coflow_id: object,
        flow_id: object,
        reason: str,
        retry: bool = False,
        attempt: int | None = None,
        tag: object = None,
    ) -> str:
        """A flow cannot run (an agent's report): fail it and its coflow, or restart it.

        Args:
            reason: what the agent said (kept as the flow's and the coflow's reason).
            retry: the flow may be transferred again from byte 0 (a digest mismatch at the
                receiver): it is, up to `max_restarts` times; after that it fails.
            attempt: the flow's attempt the report is about (None: the current one); a
                report about an earlier attempt is ignored.
            tag: an agent's report tag (see `check_report`); None: an in-process caller.

        Returns:
            "restarted" (agents get "drop" then the flow's descriptor again, attempt + 1),
            "failed" (the flow and its coflow are failed now), or "ignored" (the flow is
            done or its coflow already final: a late or repeated report).

        Raises:
            RegistryError: unknown coflow or flow.
        """
        return self.owner.run(
            self._fail_flow_on_loop, coflow_id, flow_id, reason, retry, attempt, tag
        )

    @core_event("fail_flow")
    def _fail_flow_on_loop(
        self,
        coflow_id: object,
        flow_id: object,
        reason: str,
        retry: bool,
        attempt: int | None,
        tag: object,
    ) -> str:
        flow = self.registry.flow(coflow_id, flow_id)
        coflow = self.registry.get(coflow_id)
        if coflow.state.final or flow.state not in (FlowStatus.QUEUED, FlowStatus.RUNNING):
            return "ignored"
        if attempt is not None and attempt != flow.restarts:
            return "ignored"  # about an attempt before the flow's last restart
        self.check_report(flow, tag)
        text = str(reason)
        if retry:
            if flow.restarts < self.max_restarts:
                self.registry.restart_flow(coflow, flow)
                self.journal.attempt(coflow.id, flow.id, flow.restarts)
                self.stats["restarts"] += 1
                self.metrics.restarts.inc()
                LOG.warning(
                    "coflow %s flow %s: %s; transferring it again (attempt %d of %d)",
                    coflow.id, flow.id, text, flow.restarts, self.max_restarts,
                )  # fmt: skip
                self._notify_drop(coflow, [flow], True)
                self.want_round()
                return "restarted"
            text = f"{text} (after {flow.restarts} re-transfers)"
        self._end(coflow, CoflowStatus.FAILED, f"flow {flow.id}: {text}", flow)
        return "failed"

    def _end(
        self,
        coflow: CoflowState,
        state: CoflowStatus,
        reason: str,
        culprit: FlowState | None = None,
    ) -> None:
        """Fail or cancel `coflow` (on the loop): release its capacity, tell its agents."""
        now = self.now()
        dropped = self.registry.end(coflow, state, reason, now, culprit)
        self.journal.ended(coflow.id, ended_summary(coflow))
        self._leaving.append(coflow.id)
        self.rates.pop(coflow.id, None)
        self.allocation.pop(coflow_key(coflow.id), None)
        self.stats[state.value] += 1
        self.metrics.finished.labels(state.value).inc()
        level = logging.WARNING if state is CoflowStatus.FAILED else logging.INFO
        LOG.log(level, "coflow %s %s: %s", coflow.id, state.value, coflow.reason)
        self.events.add(state.value, coflow=coflow.id, reason=coflow.reason)
        if dropped:
            self._notify_drop(coflow, dropped, False)
        self.want_round()
        self._prune(now)

    def _notify_drop(self, coflow: CoflowState, flows: list[FlowState], restart: bool) -> None:
        emit(self, DropFlows(coflow, tuple(flows), restart))

    def _prune(self, now: float) -> None:
        """Drop the oldest finished coflows beyond keep_finished / keep_finished_s."""
        if self.keep_finished is None and self.keep_finished_s is None:
            return
        for coflow in self.registry.prune_finished(now, self.keep_finished, self.keep_finished_s):
            self.journal.forgotten(coflow.id)
            self.rates.pop(coflow.id, None)
            self.stats["dropped_bytes_delivered"] += coflow.bytes_delivered

    def check_timeouts(self) -> list[int]:
        """Fail coflows that cannot finish any more; drop finished coflows past keep_finished_s.

        A coflow whose deadline passed unfinished fails ("deadline missed"); one with an
        unfinished WAN flow whose sender or receiver agent has been disconnected for
        `agent_timeout_s` or longer fails ("agent X gone ..."). Agents count as
        disconnected from the first call that finds them missing from `connected_agents()`
        (no check without it). RoundRunner calls this every `tick_s` seconds.

        Returns:
            ids of the coflows failed by this call.
        """
        if self.resuming:
            self.resume()
        connected = None
        if self.connected_agents is not None:
            try:
                connected = set(self.connected_agents())
            except Exception:
                LOG.exception("connected_agents failed")
        return self.owner.run(self._timeouts_on_loop, connected)

    @core_event("timeouts")
    def _timeouts_on_loop(self, connected: set | None) -> list[int]:
        failed = []
        now = self.now()
        gone: dict[str, float] = {}
        if connected is not None:
            for agent in self.registry.agents:
                if agent in connected:
                    self.agent_gone_since.pop(agent, None)
                else:
                    since = self.agent_gone_since.setdefault(agent, now)
                    if now - since >= self.agent_timeout_s:
                        gone[agent] = now - since
        for coflow in self.registry.active():
            reason = None
            if coflow.deadline_s is not None and now > coflow.submitted_s + coflow.deadline_s:
                reason = f"deadline missed ({coflow.deadline_s:g} s after arrival)"
            elif gone:
                for f in coflow.flows.values():
                    if f.intra_dc or f.done:
                        continue
                    agent = f.src_agent if f.src_agent in gone else f.dst_agent
                    if agent in gone:
                        reason = f"agent {agent} gone for {gone[agent]:.0f} s"
                        break
            if reason is not None:
                self._end(coflow, CoflowStatus.FAILED, reason)
                failed.append(coflow.id)
        self._prune(now)
        emit(self, TimerTick())
        return failed
