"""Agents and coflows coming back after a controller restart or a failover.

`ControllerResumption` is the part of `Controller` (terra_controller/controller.py) that
waits for returning agents (`await_agents`: a submit naming agents not yet back waits for
them for a while) and admits the journal's unfinished coflows again once their agents are
back (`resume`), failing those that cannot come back (terra_controller/resume.py has the
journal's side).
"""

from __future__ import annotations

import logging
import time

import trio

from terra_controller.coflow_state import RegistryError
from terra_controller.request_checks import named_agents
from terra_controller.resume import failed_summary, missing_agents, resume_request
from terra_model.states import CoflowStatus

LOG = logging.getLogger("terra.controller")


class ControllerResumption:
    """Returning agents and resumed coflows of `Controller` (its attributes: owner,
    registry, journal, resuming, agents_back, started_mono, agent_return_s,
    agent_timeout_s, stats, metrics, events)."""

    def await_agents(self, flows: object, window_s: float | None = None) -> None:
        """Wait until every agent that `flows` names as "src" or "dst" is registered, for at
        most what is left of the controller's first `window_s` seconds (monotonic; None:
        `agent_return_s`, AGENT_RETURN_S when the controller started with a journal that
        holds coflows, else 0: a controller without a past expects no agent back).

        A restarted controller, or a new leader after a failover, has no agents until they
        connect again (within a second of its listening); a submit arriving meanwhile waits
        for them instead of being refused "unknown_agent". After the window (or for names
        that are not strings) it returns at once and the submit's own checks decide.
        """
        names = named_agents(flows)
        end = self.started_mono + (self.agent_return_s if window_s is None else window_s)
        if self.owner.on_loop:  # (the API answers on the loop only when `agents_here`)
            return
        self.owner.run_async(self._agents_back_on_loop, names, end)

    async def _agents_back_on_loop(self, names: set, end: float) -> None:
        """Wait on the loop until every agent of `names` is registered, at most until `end`
        (monotonic s); each registration sets `agents_back` (a new event after each)."""
        with trio.move_on_after(max(0.0, end - time.monotonic())):
            while names - self.registry.agents.keys():
                await self.agents_back.wait()

    def agents_here(self, flows: object) -> bool:
        """Whether `await_agents(flows)` would return at once (on the loop): every agent the
        flows name is registered, or the controller's window for returning agents is over."""
        names = named_agents(flows)
        if not names - self.registry.agents.keys():
            return True
        return time.monotonic() >= self.started_mono + self.agent_return_s

    def agent_registered(self) -> list[int]:
        """An agent registered: wake submits waiting for it (`await_agents`), then resume the
        journal's coflows whose agents are all back (`resume`)."""
        self.owner.run(self._wake_agent_waiters)
        return self.resume()

    def _wake_agent_waiters(self) -> None:
        """On the loop: wake the submits waiting for agents (they check again)."""
        self.agents_back.set()
        self.agents_back = trio.Event()

    def resume(self) -> list[int]:
        """Admit again the journal's coflows that had not ended (terra_controller/resume.py)
        once every agent their flows name is registered; fail those whose agents are not
        all back `agent_timeout_s` after the controller's start, whose deadline passed, or
        that cannot be admitted again. The agent channel calls this after each
        registration, `check_timeouts` on every tick.

        Returns:
            ids of the coflows admitted again by this call.
        """
        resumed = []
        for cid in self.owner.run(lambda: list(self.resuming)):
            entry, missing = self.owner.run(self._resumable, cid)
            if entry is None or missing:
                continue
            request = resume_request(entry, time.time())
            if isinstance(request, str):
                self.owner.run(self._abandon, cid, request)
                continue
            try:
                got = self.submit(coflow_id=cid, **request)
            except RegistryError as exc:
                got, why = -1, f"cannot be admitted again after a controller restart: {exc}"
            else:
                why = "its deadline cannot be met any more after a controller restart"
            if got < 0:
                self.owner.run(self._abandon, cid, why)
            else:
                LOG.info("coflow %s resumed after the controller's restart", cid)
                resumed.append(cid)
        return resumed

    def _resumable(self, cid: int) -> tuple[object, list[str]]:
        """(the journal entry of `cid` still to resume or None, the agents it waits for); a
        coflow whose agents are not back `agent_timeout_s` after the start is abandoned
        (on the loop)."""
        entry = self.resuming.get(cid)
        if entry is None or cid in self.registry.coflows:
            self.resuming.pop(cid, None)
            return None, []
        missing = missing_agents(entry, self.registry.agents)
        if missing and self.now() >= self.agent_timeout_s:
            why = f"agents {', '.join(missing)} did not register within "
            why += f"{self.agent_timeout_s:g} s"
            self._abandon(cid, why + " of the controller's start")
        return entry, missing

    def _abandon(
        self, coflow_id: int, reason: str, state: CoflowStatus = CoflowStatus.FAILED
    ) -> None:
        """A journaled coflow will not be resumed: it ends in `state` (on the loop)."""
        entry = self.resuming.pop(coflow_id, None)
        if entry is None:
            return
        self.journal.ended(coflow_id, failed_summary(entry, reason) | {"state": state.value})
        self.stats[state.value] += 1
        self.metrics.finished.labels(state.value).inc()
        LOG.warning("coflow %s %s: %s", coflow_id, state.value, reason)
        self.events.add(state.value, coflow=coflow_id, reason=reason)
