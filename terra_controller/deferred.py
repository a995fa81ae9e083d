"""Objects made on first use, so that the controller listens before it makes them.

The scheduling policy (terra_core.registry.make_scheduler) and, without switches, the tunnel
table (K shortest paths per DC pair) import the scheduler's solvers and kernels and
networkx: most of the controller's start-up time. The controller's CLI wraps their
factories in `Deferred`, starts its listeners, then calls `build()` on each: requests that
need neither (hello, status, list) are answered meanwhile; one that needs one waits in its
first attribute access until it is made (the same object, made once). Attributes given as
`before` (the policy's name and counters, for REST status and metrics) are answered without
waiting while the object is not made.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable
from typing import Any


class Deferred:
    """Stands for the object `factory()` returns: every attribute is that object's.

    Args:
        factory: makes the object (called once, by `build` or by the first attribute access).
        before: {attribute: value} answered while the object is not made yet.

    Raises (from `build` and every attribute access but those of `before` before it is
    made): whatever `factory` raised (e.g. ValueError for an option out of range), again on
    every later access.

    No lock: the first caller (whichever thread; `next` on a counter is one step) makes the
    object, the others wait for its `ready` event and read what it left.
    """

    def __init__(self, factory: Callable[[], Any], before: dict[str, Any] | None = None) -> None:
        self._factory = factory
        self._before = dict(before or {})
        self._made: Any = None
        self._done = False
        self._error: BaseException | None = None
        self._claims = itertools.count()
        self._ready = threading.Event()

    @property
    def made(self) -> bool:
        """True once the object exists."""
        return self._done

    def build(self) -> Any:
        """The object, made now if it was not yet (threads asking meanwhile wait for it)."""
        if self._done:
            return self._made
        if next(self._claims) == 0:
            try:
                self._made = self._factory()
                self._done = True
            except BaseException as exc:
                self._error = exc
            finally:
                self._ready.set()
        self._ready.wait()
        if self._error is not None:
            raise self._error
        return self._made

    def __getattr__(self, attr: str) -> Any:
        if attr.startswith("__"):  # copy/pickle probes: not the object's
            raise AttributeError(attr)
        if not self._done and attr in self._before:
            return self._before[attr]
        return getattr(self.build(), attr)
