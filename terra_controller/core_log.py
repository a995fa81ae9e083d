"""The controller core's events, recorded and replayed (docs/runtime.md "Events, recorded
and replayed").

Every change of the controller's coflow state is one event handled on its owner loop
(owner_loop.py): an API request (submit, update, cancel), an agent's report (register,
progress, complete, fail), an operator's or a switch's link event (state, capacity), the
timer's timeout check, and a scheduling round, which is two events: its snapshot of the
remaining bytes ("round") and, once the policy answered in the loop's worker thread, the
rates it applies ("round_applied"); tenant changes are events too. A handler reads the
time once, from its event (`Controller.now()` returns the event's time while it runs),
and nothing else that varies between runs: the submit's secret, the agents' answers
about files and the owner's tenant are part of its event (submission.py).

`CoreRecorder` writes each event, once handled, as one JSON line
`[seq, at, kind, args, outcome, effects]` (`at`: controller seconds; `outcome`: what the
handler answered, or `{"error": code}`; a round's outcome is a SHA-256 over its rates;
`effects`: what it asked of others, see `CoreEvent`). `replay` feeds a log into a fresh
controller (same topology, policy and options, no agents): it handles the same events in
the same order at the same times, solves each round again and checks every outcome and
effect against the log. So a controller's decisions can be reproduced offline
(`terra-controller replay LOG`, replay_cli.py), and the events are the unit a replicated
controller would persist.

What a log does not hold: coflows resumed from the journal at a start (replay_cli.py
refuses such a log), the tenants file itself (read again from its recorded path), and
the agents' data connections (outside the core).
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec

from terra_controller.coflow_state import RegistryError
from terra_controller.core_effects import logged, perform
from terra_controller.submission import replayed_args

LOG = logging.getLogger("terra.controller")

_BYTES = "$bytes"  # {"$bytes": hex}: bytes in a JSON log
_SET = "$set"  # {"$set": [...]}: a set


def _plain(value: Any) -> Any:
    """`value` with its bytes and sets as tagged maps, lists and maps walked (JSON keeps
    neither: msgspec would write bytes as base64 text)."""
    if isinstance(value, bytes | bytearray):
        return {_BYTES: bytes(value).hex()}
    if isinstance(value, set | frozenset):
        return {_SET: [_plain(v) for v in sorted(value, key=repr)]}
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


def _restore(value: Any) -> Any:
    """The inverse of `_plain` over a decoded JSON value (lists and maps walked)."""
    if isinstance(value, dict):
        if len(value) == 1 and _BYTES in value:
            return bytes.fromhex(value[_BYTES])
        if len(value) == 1 and _SET in value:
            return set(_restore(value[_SET]))
        return {k: _restore(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_restore(v) for v in value]
    return value


def rates_digest(allocation: dict) -> str:
    """SHA-256 (hex) over a round's rates {coflow key: {flow id: [(path, bytes/s)]}} in a
    canonical order (keys sorted; paths in the policy's order; floats as their repr)."""
    h = hashlib.sha256()
    for cid in sorted(allocation):
        for fid in sorted(allocation[cid]):
            h.update(f"{cid}\x00{fid}\x00".encode())
            for path, rate in allocation[cid][fid]:
                h.update(f"{'-'.join(path)}={rate!r};".encode())
    return h.hexdigest()


class CoreRecorder:
    """Appends the core's events to a JSON-lines file (one line per event, flushed at once).

    A log already at `path` is kept as `path` + ".1" (replacing an older one). The file is
    created mode 0600 (it holds the coflows' secrets), not through a symbolic link. A write
    that fails (a full disk) ends the recording, logged once: the controller goes on, and
    `failed` says why the log stops there. Its one writer is the controller's loop (or
    a replay), so it holds no lock.

    Args:
        path: the log file.

    Raises:
        OSError: the file cannot be created.
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        if self.path.exists() and not self.path.is_symlink():
            self.path.replace(self.path.with_name(self.path.name + ".1"))
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW
        fd = os.open(self.path, flags, 0o600)
        os.fchmod(fd, 0o600)  # (a file that existed keeps no wider mode)
        self._file = os.fdopen(fd, "wb")
        self._encode = msgspec.json.Encoder().encode
        self.seq = 0
        self.failed: str | None = None

    def write(
        self, at: float, kind: str, args: list, outcome: object, effects: list | None = None
    ) -> None:
        """Append one event: its time (controller seconds), kind, arguments, outcome and
        effects (what it asked of others: flows dropped at agents, rounds)."""
        if self._file.closed or self.failed is not None:
            return
        try:
            line = self._encode([self.seq, at, kind, _plain(args), _plain(outcome), effects or []])
        except TypeError:  # (an in-process caller's odd argument: kept as text)
            text = [repr(a) for a in args]
            line = self._encode([self.seq, at, kind, text, repr(outcome), effects or []])
        try:
            self._file.write(line + b"\n")
            self._file.flush()
        except OSError as exc:  # (the controller goes on; the log ends here)
            self.failed = str(exc)
            LOG.error("core log %s: writing failed, recording stopped: %s", self.path, exc)
            return
        self.seq += 1

    def close(self) -> None:
        """Close the file (later events are not written)."""
        try:
            self._file.close()
        except OSError:  # (what a failed write left in the buffer)
            pass


@dataclass
class CoreEvent:
    """One recorded event: `seq` (0, 1, ...), `at` (controller seconds), `kind`, `args`
    (its arguments, plain values), `outcome` (what the handler answered), `effects` (what
    it asked of others, in order, core_effects.py: ["drop", coflow id, [flow ids], restart]
    for flows the agents must drop or restart, ["round", wan] for a round asked for,
    ["tick"] for the timer's listeners, ["push", wan] for a round's rates sent)."""

    seq: int
    at: float
    kind: str
    args: list
    outcome: object
    effects: list = field(default_factory=list)


def read_events(path: str | Path) -> Iterator[CoreEvent]:
    """The events of a log written by `CoreRecorder`, in order.

    Raises:
        ValueError: a line that is not an event (its number in the message).
    """
    with open(path, "rb") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                seq, at, kind, args, outcome, effects = msgspec.json.decode(line)
                event = CoreEvent(int(seq), float(at), str(kind), _restore(args), outcome,
                                  list(effects))  # fmt: skip
            except (msgspec.DecodeError, ValueError, TypeError) as exc:
                raise ValueError(f"{path}:{number}: not an event of the core's log") from exc
            yield event


def core_event(kind: str, encode: Callable[..., list] | None = None,
               outcome: Callable[[Any], object] | None = None) -> Callable:  # fmt: skip
    """Decorator: the Controller method is the handler of events `kind` (on the loop).

    While it runs, `Controller.now()` is the event's time (read once, at its start) and the
    effects it emits (core_effects.emit) are kept; once it returns (or raises), the event
    and its effects go to the controller's recorder, if any, and the effects are performed
    in order (core_effects.perform; not while replaying).

    Args:
        kind: the event's name in the log.
        encode: (the controller, the handler's arguments) -> the plain list recorded
            (default: the arguments as given).
        outcome: the handler's result -> the plain value recorded (default: as given).
    """

    def mark(method: Callable) -> Callable:
        @functools.wraps(method)
        def handle(self: Any, *args: Any) -> Any:
            if self.event_at is not None:  # (an event handled inside another one)
                return method(self, *args)
            self.event_at = at = self.clock() - self.t0
            recorder, plain = self.recorder, None
            self.effects = effects = []
            try:
                plain = None if recorder is None else (encode or _as_list)(self, *args)
                result = method(self, *args)
            except Exception as exc:
                if recorder is not None:
                    recorder.write(at, kind, plain, error_outcome(exc), logged(effects))
                raise
            else:
                if recorder is not None:
                    recorder.write(at, kind, plain, (outcome or _same)(result), logged(effects))
            finally:
                self.event_at = None
                self.last_effects, self.effects = effects, None
                if not self.replaying:
                    perform(self, effects)
            return result

        handle.core_event = kind  # type: ignore[attr-defined]
        handle.core_outcome = outcome  # type: ignore[attr-defined]
        return handle

    return mark


def error_outcome(exc: BaseException) -> dict:
    """The outcome recorded for a handler that raised: {"error": code} for a refusal
    (RegistryError), {"error": "internal:TYPE"} for anything else."""
    if isinstance(exc, RegistryError):
        return {"error": exc.code}
    return {"error": f"internal:{type(exc).__name__}"}


def _as_list(controller: Any, *args: Any) -> list:
    return list(args)


def _same(value: Any) -> Any:
    return value


@dataclass
class ReplayReport:
    """What `replay` found: events handled, rounds solved again, and the events whose
    outcome differs from the log's (`mismatches`: [(seq, kind, logged, replayed)])."""

    events: int = 0
    rounds: int = 0
    mismatches: list[tuple[int, str, object, object]] = field(default_factory=list)

    @property
    def identical(self) -> bool:
        """Every outcome as logged."""
        return not self.mismatches


def replay(controller: Any, events: Iterator[CoreEvent] | list[CoreEvent]) -> ReplayReport:
    """Handle recorded events on a fresh `controller`, in order, at their recorded times.

    The controller must be built as the recorded one was (topology, policy and its
    options, tenants) and have no agents connected; its rounds are solved again at each
    "round" event and applied at its "round_applied" event.

    Returns:
        the ReplayReport (the controller then holds the replayed state).

    Raises:
        ValueError: an event kind this controller does not handle, or a "round_applied"
            without its "round".
    """
    return controller.owner.run(_replay_on_loop, controller, list(events))


def _replay_on_loop(controller: Any, events: list[CoreEvent]) -> ReplayReport:
    handlers = _handlers(type(controller))
    report = ReplayReport()
    pending: tuple | None = None
    controller.t0 = 0.0  # (each event's time is then its `at`, to the bit)
    for ev in events:
        report.events += 1
        if ev.kind == "start":  # (the options the controller was built with)
            continue
        if ev.kind == "round":
            try:
                pending = controller.replay_round_begin(ev.at)
            except Exception:  # (a live round that failed has no round_applied either)
                pending = None
            got: object = None
        elif ev.kind == "round_applied":
            if pending is None:
                raise ValueError(f"event {ev.seq}: round_applied without its round")
            got, effects = controller.replay_round_end(ev.at, pending)
            pending = None
            report.rounds += 1
            if effects != ev.effects:
                report.mismatches.append((ev.seq, ev.kind, ev.effects, effects))
        else:
            handler = handlers.get(ev.kind)
            if handler is None:
                raise ValueError(f"event {ev.seq}: unknown kind {ev.kind!r}")
            got, effects = _handle_at(controller, handler, ev)
            if effects != ev.effects:
                report.mismatches.append((ev.seq, ev.kind, ev.effects, effects))
        if ev.kind != "round" and got != ev.outcome:
            report.mismatches.append((ev.seq, ev.kind, ev.outcome, got))
    return report


def _handle_at(controller: Any, handler: Callable, ev: CoreEvent) -> tuple[object, list]:
    """Run `handler` for `ev` at its time: (its outcome as recorded, or {"error": code};
    its effects)."""
    clock, recorder = controller.clock, controller.recorder
    controller.clock, controller.recorder = (lambda: ev.at), None
    controller.replaying = True
    try:
        args = replayed_args(controller, ev.kind, ev.args)
        result = _as_logged((getattr(handler, "core_outcome", None) or _same)(
            handler(controller, *args)))  # fmt: skip
    except Exception as exc:
        result = error_outcome(exc)
    finally:
        controller.clock, controller.recorder = clock, recorder
        controller.replaying = False
    return result, _as_logged(logged(controller.last_effects))


def _as_logged(value: object) -> Any:
    """`value` as a log gives it back (through JSON and `_restore`)."""
    return _restore(msgspec.json.decode(msgspec.json.encode(_plain(value))))


def _handlers(cls: type) -> dict[str, Callable]:
    """{event kind: the method of `cls` marked with `core_event` for it}."""
    out = {}
    for name in dir(cls):
        kind = getattr(getattr(cls, name, None), "core_event", None)
        if isinstance(kind, str):
            out[kind] = getattr(cls, name)
    return out
