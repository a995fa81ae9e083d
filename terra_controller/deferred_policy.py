"""A scheduling policy built on first use, so that the controller listens before it is built.

Making the policy (terra_core.registry.make_scheduler) imports the scheduler's solvers and
kernels: HiGHS, numpy, numba, networkx, most of the controller's start-up time. The
controller's CLI wraps the factory in a `DeferredPolicy`, starts its listeners, then calls
`build()`: requests that do not need the policy (hello, status, list, agent registration)
are answered meanwhile; one that needs it waits in its first attribute access until the
build is done (the result is the same policy, made once). Its name and counters (REST
status, metrics) are answered without waiting.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from terra_core.policy import Policy


class DeferredPolicy:
    """Stands for the policy `factory()` returns: every attribute is the policy's, `name` and
    `stats` answered without building it (the requested name, None).

    Args:
        factory: makes the policy (called once, by `build` or by the first attribute access).
        name: the scheduler's registry name, answered by `name` before the policy exists.

    Raises (from `build` and every attribute access): whatever `factory` raised (e.g.
    ValueError for an option out of range), again on every later access.
    """

    def __init__(self, factory: Callable[[], Policy], name: str) -> None:
        self._factory = factory
        self._requested_name = name
        self._policy: Policy | None = None
        self._error: BaseException | None = None
        self._lock = threading.Lock()

    def build(self) -> Policy:
        """The policy, made now if it was not yet (threads asking meanwhile wait for it)."""
        policy = self._policy
        if policy is not None:
            return policy
        with self._lock:
            if self._error is not None:
                raise self._error
            if self._policy is None:
                try:
                    self._policy = self._factory()
                except BaseException as exc:
                    self._error = exc
                    raise
            return self._policy

    @property
    def name(self) -> str:
        """The policy's name; the requested scheduler name while it is not built."""
        policy = self._policy
        return self._requested_name if policy is None else getattr(policy, "name", None)

    @property
    def stats(self):
        """The policy's counters (its `stats`); None while it is not built (nothing counted
        yet), so that REST status and metrics scrapes do not wait for the build."""
        policy = self._policy
        return None if policy is None else policy.stats

    def __getattr__(self, attr: str):
        if attr.startswith("__"):  # copy/pickle probes: not the policy's
            raise AttributeError(attr)
        return getattr(self.build(), attr)
