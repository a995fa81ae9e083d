"""What the controller core's events ask of others, as values (docs/runtime.md "Events,
recorded and replayed").

A handler of a core event (core_log.core_event) changes the controller's state and
`emit`s effects; it calls nothing outside the core. Once the handler returned (or
raised), the shell around it (the `core_event` wrapper) records the effects with the
event and performs them in order (`perform`): the agent channel's listeners learn which
flows to drop or restart, the round runner learns that a round is wanted, the timer's
listeners run, and a round's applied rates go to the rate listeners (the agent channel
sends each agent its changed FlowGroup rates). A replay compares the effects with the
log's and performs none.

An effect emitted outside an event (a method called directly on the loop) is performed
at once.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from terra_controller.coflow_state import CoflowState, FlowState

LOG = logging.getLogger("terra.controller")


@dataclass(frozen=True)
class DropFlows:
    """The agents must forget `flows` of `coflow`: the coflow failed or was cancelled
    (restart False), or one flow runs again from byte 0 (restart True: its descriptor is
    sent again, attempt = flow.restarts, receiver first)."""

    coflow: CoflowState
    flows: tuple[FlowState, ...]
    restart: bool

    def logged(self) -> list:
        """The effect in the core's log: ["drop", coflow id, [flow ids], restart]."""
        return ["drop", self.coflow.id, [f.id for f in self.flows], self.restart]


@dataclass(frozen=True)
class AskRound:
    """A scheduling round is wanted (`wan`: the WAN changed, so the tunnel table is sent
    first); the controller's state already says so (round_wanted, wan_dirty)."""

    wan: bool

    def logged(self) -> list:
        """The effect in the core's log: ["round", wan]."""
        return ["round", self.wan]


@dataclass(frozen=True)
class TimerTick:
    """The timer's check ran: the timer's listeners (the agent channel's deferred sends)
    run after it."""

    def logged(self) -> list:
        """The effect in the core's log: ["tick"]."""
        return ["tick"]


@dataclass(frozen=True)
class PushRates:
    """A round's rates were applied ("round_applied"): every `on_rates` listener gets them
    (the agent channel sends each agent its changed FlowGroup rates; `wan`: the WAN changed
    since the last round, so the tunnel table goes first).

    Attributes:
        rates: {coflow id: {flow id: [(path, bytes/s)]}} (controller_round.FlowRates).
        wan: the WAN changed since the last round.
    """

    rates: dict
    wan: bool

    def logged(self) -> list:
        """The effect in the core's log: ["push", wan] (the rates are the event's digest)."""
        return ["push", self.wan]


Effect = DropFlows | AskRound | TimerTick | PushRates


def emit(controller: Any, effect: Effect) -> None:
    """Hand `effect` to the event being handled (performed once its handler returns), or
    perform it at once when no event is being handled."""
    if controller.effects is not None:
        controller.effects.append(effect)
    else:
        perform(controller, [effect])


def perform(controller: Any, effects: list[Effect]) -> None:
    """Perform `effects` in order, on the loop: DropFlows calls every `on_drop` listener
    with (coflow, flows, restart), AskRound wakes the round runner, TimerTick calls every
    `on_tick` listener, PushRates every `on_rates` listener with (rates, wan). A listener
    that raises is logged; the others still run."""
    for effect in effects:
        if isinstance(effect, AskRound):
            controller.round_asked.set()
            continue
        if isinstance(effect, DropFlows):
            listeners, args = controller.on_drop, (effect.coflow, list(effect.flows),
                                                   effect.restart)  # fmt: skip
        elif isinstance(effect, PushRates):
            listeners, args = controller.on_rates, (effect.rates, effect.wan)
        else:
            listeners, args = controller.on_tick, ()
        for listener in list(listeners):
            try:
                listener(*args)
            except Exception:
                LOG.exception("%s listener failed", type(effect).__name__)


def logged(effects: list[Effect] | None) -> list:
    """`effects` as the core's log writes them (each one's `logged()`)."""
    return [e.logged() for e in effects or []]
