"""Leader election among terra-controller instances that share one etcd cluster.

Every instance started with `--etcd` campaigns (EtcdState.campaign: create the leader key on
a lease of `ttl_s` seconds, only if none exists). The winner is the leader: it loads the
shared state, schedules, answers the API and talks to the agents and switches; the others
are standbys that try again every `poll_s` and meanwhile name the leader to whoever asks
(standby.py). The leader refreshes its lease every ttl_s / 3 seconds. It stops being the
leader, and starts over as a standby, when:

- its lease expired (etcd answered that it is gone), or a guarded write found another
  leader key (EtcdState.deposed);
- no refresh succeeded for ttl_s seconds, counted from the sending of the last request
  that succeeded (its lease may have expired: a standby may lead by now). The count starts
  before etcd renews the lease and a watcher thread checks it every 50 ms, whatever a slow
  request does, so the old leader gives up within 50 ms of the earliest moment its lease
  can expire (up to clock-rate drift).

- etcd reports its leader key deleted or created again (takeover.KeyWatch: a standby
  revoked its lease, or the lease expired), within one etcd event.

With ttl_s = 2 (the default, close to etcd's minimum lease TTL of 1.5 s at its default
election timeout) a killed leader's lease expires within 2 s and a standby polling every
0.1 s takes over within about 2.1 s plus its start-up. When the leader's process ends on a
host that stays up, its kernel closes the connection every standby holds to its liveness
port: the first standby to see it revokes the lease and campaigns at once (takeover.py),
well before the lease would expire.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from terra_controller.etcd_state import EtcdState, StateStoreError
from terra_controller.takeover import KeyWatch, LeaderFollower

LOG = logging.getLogger("terra.leadership")

LEASE_TTL_S = 2
POLL_S = 0.1


class Leadership:
    """One controller's part in the election.

    Args:
        state: the EtcdState of the cluster.
        member: this controller's {"id", "api", "agents", "rest", "liveness"} addresses (the
            leader key's value with the lease id, what standbys name and follow).
        ttl_s: lease TTL in whole seconds (>= 1). poll_s: a standby's retry period (s).

    Attributes:
        role: "standby" until elected, then "leader". leader: the leader's member map as
        last read (None: none known). generation: our generation once elected. failovers:
        times this controller became the leader. before_start_over: callables run before a
        controller that lost the leadership starts over (standby.start_over). revoked:
        leases of dead leaders this standby revoked.
    """

    def __init__(
        self, state: EtcdState, member: dict, ttl_s: int = LEASE_TTL_S, poll_s: float = POLL_S
    ) -> None:
        if ttl_s < 1 or poll_s <= 0:
            raise ValueError("the lease TTL must be >= 1 s and the poll period > 0")
        self.state, self.member = state, member
        self.ttl_s, self.poll_s = ttl_s, poll_s
        self.role = "standby"
        self.leader: dict | None = None
        self.generation: int | None = None
        self.failovers = 0
        self.before_start_over: list[Callable[[], None]] = []
        self._unreachable_logged = 0.0
        self.wake = threading.Event()  # a leader's process ended: revoke, campaign now
        self.follower = LeaderFollower(self._leader_closed)
        self.revoked: list[int] = []
        self._dead: dict | None = None  # a leader whose liveness connection closed

    def campaign(self) -> int:
        """Block until this controller is the leader; return its generation."""
        while True:
            self.wake.clear()
            try:
                self._revoke_dead()
                generation = self.state.campaign(self.member, self.ttl_s)
                if generation is not None:
                    self.follower.follow(None)
                    self.role, self.generation = "leader", generation
                    self.leader = self.member
                    self.failovers += 1
                    LOG.info("elected leader (generation %d)", generation)
                    return generation
                self.leader = self.state.leader()
                self.follower.follow(self.leader)
            except StateStoreError as exc:
                now = time.monotonic()
                if now - self._unreachable_logged > 10:
                    LOG.warning("standby: %s", exc)
                    self._unreachable_logged = now
            self.wake.wait(self.poll_s)

    def _leader_closed(self, leader: dict) -> None:
        """The leader `leader` (as etcd named it) closed its liveness connection: its
        process ended. Wake the campaign, which revokes its lease first (takeover.py)."""
        self._dead = leader
        self.wake.set()

    def _revoke_dead(self) -> None:
        """Revoke the lease of the leader whose liveness connection closed, if any."""
        leader, self._dead = self._dead, None
        if leader is None:
            return
        try:
            self.state.revoke(leader["lease"])
            self.revoked.append(leader["lease"])
            LOG.warning("revoked the lease of leader %s", leader.get("id"))
        except StateStoreError as exc:  # already gone (expired, revoked), etcd unreachable
            LOG.warning("revoking the lease of leader %s: %s", leader.get("id"), exc)

    def keep(self, on_lost: Callable[[str], None]) -> None:
        """Refresh the lease in a daemon thread, and watch it in another: `on_lost(reason)`
        is called once, from the watcher, when the leadership is lost (module docstring)."""
        self._last_ok = time.monotonic()
        self._lost: str | None = None
        self._lost_now = threading.Event()  # wakes the watcher at once
        KeyWatch(self.state.endpoints, self.state.prefix + "leader", self.generation,
                 self._key_lost)  # fmt: skip
        for target, name in ((self._refresh, "terra-lease"), (self._watch, "terra-lease-watch")):
            threading.Thread(target=target, name=name, daemon=True).start()
        self._on_lost = on_lost

    def _key_lost(self, reason: str) -> None:
        if self._lost is None:
            self._lost = reason
        self._lost_now.set()

    def _refresh(self) -> None:
        while self._lost is None:
            sent = time.monotonic()
            try:
                if not self.state.keep_alive():
                    self._key_lost("the leader lease expired")
                    return
                self._last_ok = sent
            except StateStoreError as exc:
                LOG.warning("lease refresh: %s", exc)
            time.sleep(max(0.0, self.ttl_s / 3 - (time.monotonic() - sent)))

    def _watch(self) -> None:
        while True:
            self._lost_now.wait(0.05)
            reason = self._lost
            if reason is None and self.state.deposed:
                reason = "another controller leads (a write was refused)"
            if reason is None and time.monotonic() - self._last_ok >= self.ttl_s:
                reason = f"etcd did not renew the lease for {self.ttl_s} s"
            if reason is not None:
                self._lost = reason
                self.role = "standby"
                LOG.error("leadership lost: %s", reason)
                self._on_lost(reason)
                return
