"""The operator's link states and capacities: replicated state, and how they combine with
what the switches report.

`terra-controller ctl link-down A B`, `link-up A B` and `capacity A B BYTES_PER_S` (the API
requests "link_state" and "capacity") are kept in the coflow journal (journal.py "l" lines:
the state directory's file, or the `links` key in etcd), like the coflows. A controller
restarted on the same state directory, and a standby elected leader after a failover, apply
them to its topology when it is made (`restore`), before its first round, so it schedules
around the same links at the same capacities as the controller before it.

Precedence against the switches (OpenFlow PortStatus and the ports read when a switch
connects; not journaled, the switches say it again to every new leader): a link is used
only while neither says it is down. An operator's link-down holds whatever the ports say
(a port coming up does not bring the link back; only `link-up` does), and a port that goes
down takes the link down whatever the operator said (`link-up` does not lift it; the port
coming up does). Capacities come from the operator only (the topology file's until then).

`ControllerLinkEvents` is the part of `Controller` (terra_controller/controller.py) that
takes these link events and asks for a round when the policy judges the WAN changed.
"""

from __future__ import annotations

import logging
import math

import trio

from terra_controller.coflow_state import RegistryError
from terra_controller.core_log import core_event
from topologies import Topology, TopologyError

LOG = logging.getLogger("terra.links")

OPERATOR = "operator"
SWITCH = "switch"


def link_key(a: str, b: str) -> tuple[str, str]:
    """The undirected link a-b as (lower name, higher name)."""
    return (a, b) if a <= b else (b, a)


class LinkStates:
    """Who says which link is down: the operator (journaled) and the switches (in memory).

    Args:
        journal: the CoflowJournal (its `links` and `link_set`).

    Attributes:
        switch_down: undirected links (link_key) a switch reported down.
    """

    def __init__(self, journal) -> None:
        self.journal = journal
        self.switch_down: set[tuple[str, str]] = set()

    def operator_up(self, a: str, b: str) -> bool:
        """False when the operator set a-b down."""
        return self.journal.links.get(link_key(a, b), {}).get("up", True)

    def record(self, a: str, b: str, up: bool, source: str) -> bool:
        """Record what `source` (OPERATOR: journaled; SWITCH) says of a-b; return whether
        the link is up now (module docstring: up only while neither says down)."""
        key = link_key(a, b)
        if source == OPERATOR:
            self.journal.link_set(a, b, up=up)
        elif up:
            self.switch_down.discard(key)
        else:
            self.switch_down.add(key)
        return self.operator_up(a, b) and key not in self.switch_down


def restore(topology: Topology, links: dict[tuple[str, str], dict]) -> int:
    """Apply the journaled operator states `links` ({(A, B): {"up", "cap"}}) to `topology`
    (both directions). A link the topology no longer has, or a capacity it refuses, is
    logged and skipped.

    Returns:
        how many links were changed.
    """
    changed = 0
    for (a, b), state in links.items():
        try:
            if not state["up"]:
                topology.set_link_state(a, b, False)
            if state.get("cap") is not None:
                topology.set_capacity(a, b, state["cap"])
        except TopologyError as exc:
            LOG.warning("operator state of link %s-%s not applied: %s", a, b, exc)
            continue
        changed += 1
        LOG.info("link %s-%s %s%s (operator, from the journal)", a, b,
                 "up" if state["up"] else "down",
                 "" if state.get("cap") is None else f", {state['cap']:g} bytes/s")  # fmt: skip
    return changed


def restore_before_first_round(controller) -> None:
    """Apply the journal's operator link states to the controller's topology; tell its
    policy when it is made already (a policy made later reads the topology then)."""
    from terra_controller.deferred import Deferred

    if not restore(controller.topology, controller.journal.links):
        return
    policy = controller.policy
    if not isinstance(policy, Deferred) or policy.made:
        policy.wan_changed(controller.now())


class ControllerLinkEvents:
    """Link events of `Controller` (its attributes: owner, policy, topology,
    links (LinkStates), journal, events, _switch_links: the link task's channel or None)."""

    def set_link_state(self, a: object, b: object, up: object, source: str = OPERATOR) -> bool:
        """Set the undirected link a-b up or down (both directions), as the operator says
        (journaled: it survives restarts and failovers) or a switch (source "switch"); the
        link is up only while neither says down (terra_controller/operator_links.py).

        Returns:
            True when the link's state changed (a round is then asked for).

        Raises:
            RegistryError("bad_request"): unknown link or bad arguments; "unavailable": the
            shared state cannot be written now (an operator's change; nothing changed).
        """
        if not isinstance(up, bool):
            raise RegistryError("bad_request", "up must be true or false")
        if source == OPERATOR:
            self._check_state_writable()
        changed = self.owner.run_with_policy(self._set_link_on_loop, a, b, up, source)
        if source == OPERATOR:
            self._durable(f"link {a}-{b}")
        return changed

    def switch_link_change(self, a: str, b: str, up: bool) -> None:
        """A switch's word on link a-b, from os-ken's handler thread: handed to the loop
        through a channel without waiting, so os-ken goes on with its events. The loop's
        link task applies the changes one after the other, in the order they came, each
        once no round holds the policy (as `set_link_state` with source "switch")."""
        self.owner.call_soon(self._queue_switch_link, (a, b, up))

    def _queue_switch_link(self, change: tuple[str, str, bool]) -> None:
        """On the loop: put `change` in the link task's channel (the task starts with the
        first change)."""
        if self._switch_links is None:
            send, receive = trio.open_memory_channel[tuple[str, str, bool]](math.inf)
            self._switch_links = send
            self.owner.start_task(self._apply_switch_links, receive)
        self._switch_links.send_nowait(change)

    async def _apply_switch_links(self, receive) -> None:
        """The loop's link task: each switch link change as a "link" core event, holding
        the policy (a failing one is logged; the next ones still apply)."""
        async for a, b, up in receive:
            try:
                async with self.owner.policy_for_loop():
                    self._set_link_on_loop(a, b, up, SWITCH)
            except Exception:
                LOG.exception("link %s-%s from a switch could not be applied", a, b)

    @core_event("link")
    def _set_link_on_loop(self, a: object, b: object, up: bool, source: str) -> bool:
        try:
            self.topology.available((a, b))  # raises for an unknown link
            self.topology.available((b, a))
            up = self.links.record(a, b, up, source)
            was_up = (a, b) not in self.topology.down
            if was_up == up and ((b, a) not in self.topology.down) == up:
                changed = False
            else:
                self.topology.set_link_state(a, b, up)
                changed = True
        except (TopologyError, TypeError) as exc:
            raise RegistryError("bad_request", str(exc)) from exc
        if changed and self.policy.wan_changed(self.now()):
            self.want_round(wan=True)
        if changed:
            LOG.info("link %s-%s %s (%s)", a, b, "up" if up else "down", source)
            self.events.add("link_up" if up else "link_down", a=a, b=b, source=source)
        return changed

    def set_capacity(self, a: object, b: object, bytes_per_s: object) -> bool:
        """Set the capacity of the undirected link a-b (bytes/s).

        The capacity is journaled (it survives restarts and failovers).

        Returns:
            True when the policy judged the change large enough (δ) for a new round.

        Raises:
            RegistryError("bad_request"): unknown link or bad capacity; "unavailable": the
            shared state cannot be written now (nothing changed).
        """
        self._check_state_writable()
        changed = self.owner.run_with_policy(self._set_capacity_on_loop, a, b, bytes_per_s)
        self._durable(f"link {a}-{b}")
        return changed

    @core_event("capacity")
    def _set_capacity_on_loop(self, a: object, b: object, bytes_per_s: object) -> bool:
        try:
            self.topology.set_capacity(a, b, bytes_per_s)
        except (TopologyError, TypeError) as exc:
            raise RegistryError("bad_request", str(exc)) from exc
        self.journal.link_set(a, b, cap=bytes_per_s)
        changed = self.policy.wan_changed(self.now())
        if changed:
            self.want_round(wan=True)
        self.events.add("capacity", a=a, b=b, bytes_per_s=self.topology.capacity[(a, b)])
        return changed
