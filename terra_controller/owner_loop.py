"""The one owner of the controller's state: a trio event loop in a thread of its own.

The coflow registry, the current rates, the stats, the agents' channel state and the
journal's in-memory index belong to `Controller` and are read and changed only on this
loop (docs/runtime.md, "One owner"). The threads around it (the coflow API's and the
agent channel's connections, REST, os-ken's OpenFlow handlers) hand it work and wait for
the answer: `run(fn, *args)` runs `fn` on the loop and returns its result (or raises its
exception) in the calling thread; called on the loop itself it runs at once. Work that
also needs the scheduling policy (an admission, a link event, a tenant change) goes through
`run_with_policy`, which first waits until no scheduling round holds the policy.

A round takes the policy for its whole length (`holding_policy`), copies the remaining bytes
on the loop, lets `policy.allocate` run in a worker thread (`in_worker`) while the loop
goes on serving reports and status requests, and applies the rates on the loop again: the
round's result comes back to the loop as the worker's return value.

Every task is owned by the loop's nursery (`start_task`); `stop` cancels them and ends the
thread.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Awaitable, Callable
from contextlib import asynccontextmanager, contextmanager
from typing import Any

import trio

LOG = logging.getLogger("terra.controller")


class OwnerLoop:
    """A trio loop in a daemon thread, started at construction.

    Args:
        name: the thread's name (in stack dumps and logs).

    Raises:
        RuntimeError: the loop did not start within 10 s.
    """

    def __init__(self, name: str = "terra-controller") -> None:
        self._ready = threading.Event()
        self._token: trio.lowlevel.TrioToken | None = None
        self._nursery: trio.Nursery | None = None
        self._stop: trio.Event | None = None
        self._policy: trio.Semaphore | None = None
        self._loop_holds_policy = False
        self.failed: BaseException | None = None  # why the loop ended, unless `stop` ended it
        self._work: queue.SimpleQueue = queue.SimpleQueue()
        self.thread = threading.Thread(target=self._run, name=name, daemon=True)
        self.thread.start()
        threading.Thread(target=self._worker, name=f"{name}-worker", daemon=True).start()
        if not self._ready.wait(10.0):
            raise RuntimeError("the controller's event loop did not start")

    def _run(self) -> None:
        try:
            trio.run(self._main)
        except BaseException as exc:  # a task failed: no one owns the state any more
            self.failed = exc
            LOG.critical("the controller's event loop failed", exc_info=exc)
        finally:
            self._work.put(None)  # ends the worker thread

    async def _main(self) -> None:
        self._token = trio.lowlevel.current_trio_token()
        self._stop = trio.Event()
        self._policy = trio.Semaphore(1)
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            self._ready.set()
            await self._stop.wait()
            nursery.cancel_scope.cancel()

    @property
    def on_loop(self) -> bool:
        """True in the loop's own thread."""
        return threading.current_thread() is self.thread

    @property
    def running(self) -> bool:
        """True until `stop` ended the loop."""
        return self.thread.is_alive()

    def run(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Run `fn(*args)` on the loop and return its result (its exception is raised here).
        Once `stop` has ended the loop (the controller is shutting down) `fn` runs in the
        calling thread.

        Raises:
            RuntimeError: the loop ended because a task failed (`failed`).
        """
        if self.on_loop:
            return fn(*args)
        if self.thread.is_alive():
            try:
                return trio.from_thread.run_sync(fn, *args, trio_token=self._live_token())
            except trio.RunFinishedError:  # ended meanwhile
                self.thread.join(5.0)
        if self.failed is not None:
            raise RuntimeError("the controller's event loop failed") from self.failed
        return fn(*args)

    def run_with_policy(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Run `fn(*args)` on the loop once no round holds the scheduling policy.

        Raises:
            RuntimeError: the loop has stopped; or called on the loop while a round holds
                the policy (the loop cannot wait for itself).
        """
        sem = self._policy
        assert sem is not None
        if self.on_loop and self._loop_holds_policy:
            return fn(*args)  # the task that runs this holds it (policy_for_loop)
        if self.on_loop:
            sem.acquire_nowait()  # raises trio.WouldBlock while a round holds it
            try:
                return fn(*args)
            finally:
                sem.release()

        async def with_policy() -> Any:
            async with sem:
                return fn(*args)

        return trio.from_thread.run(with_policy, trio_token=self._live_token())

    def run_async(self, fn: Callable[..., Awaitable[Any]], *args: Any) -> Any:
        """Run the async `fn(*args)` on the loop from another thread and return its result.

        Raises:
            RuntimeError: the loop has stopped, or called on the loop itself.
        """
        if self.on_loop:
            raise RuntimeError("run_async from the loop itself: await it instead")
        return trio.from_thread.run(fn, *args, trio_token=self._live_token())

    @contextmanager
    def policy_held(self):
        """Hold the scheduling policy from a thread other than the loop's for the `with`
        block (building it, for one): admissions, link events and rounds wait meanwhile."""
        sem = self._policy
        assert sem is not None
        trio.from_thread.run(sem.acquire, trio_token=self._live_token())
        try:
            yield
        finally:
            trio.from_thread.run_sync(sem.release, trio_token=self._live_token())

    @asynccontextmanager
    async def policy_for_loop(self):
        """On the loop: hold the policy for the `async with` block, in which `run_with_policy`
        runs at once (the block must not await while it relies on that)."""
        assert self._policy is not None
        async with self._policy:
            self._loop_holds_policy = True
            try:
                yield
            finally:
                self._loop_holds_policy = False

    async def holding_policy(self, work: Callable[[], Awaitable[Any]]) -> Any:
        """On the loop: await `work()` while holding the policy (a round)."""
        assert self._policy is not None
        async with self._policy:
            return await work()

    async def in_worker(self, fn: Callable[..., Any], *args: Any) -> Any:
        """On the loop: run the blocking `fn(*args)` in the loop's worker thread (one, started
        with the loop, so a round starts no thread) and await its result or exception; the
        loop serves other work meanwhile. Calls queue one after another."""
        done = trio.Event()
        box: list = []
        token = self._live_token()

        def work() -> None:
            try:
                box.append((True, fn(*args)))
            except BaseException as exc:  # handed back to the awaiting task
                box.append((False, exc))
            try:
                token.run_sync_soon(done.set)
            except trio.RunFinishedError:
                pass

        self._work.put(work)
        await done.wait()
        ok, value = box[0]
        if not ok:
            raise value
        return value

    def _worker(self) -> None:
        while True:
            work = self._work.get()
            if work is None:
                return
            work()

    def start_task(self, fn: Callable[..., Awaitable[Any]], *args: Any) -> None:
        """Start the task `fn(*args)` in the loop's nursery (from any thread)."""
        nursery = self._nursery
        assert nursery is not None
        self.run(nursery.start_soon, fn, *args)

    def call_soon(self, fn: Callable[..., Any], *args: Any) -> None:
        """Queue `fn(*args)` to run on the loop without waiting for it (from any thread;
        nothing happens once the loop has stopped)."""
        token = self._token
        if token is None:
            return
        try:
            token.run_sync_soon(fn, *args)
        except trio.RunFinishedError:
            pass

    def stop(self) -> None:
        """Cancel every task and end the loop's thread (idempotent)."""
        if self.thread.is_alive() and self._stop is not None:
            self.call_soon(self._stop.set)
            if not self.on_loop:
                self.thread.join(5.0)

    def _live_token(self) -> trio.lowlevel.TrioToken:
        if self._token is None or not self.thread.is_alive():
            raise RuntimeError("the controller's event loop has stopped")
        return self._token
