"""Asking agents about files before a coflow is scheduled ("list" and "check", blocking).

`FileRequests` sends the requests of terra_wire/file_messages.py over the agents' control
connections and waits for the "listing" replies, which the agent channel's reader hands to
`answer`: its state is the controller's loop's, and a submit's worker thread waits on it
through the loop (OwnerLoop.run_async). `resolve` is what a submit runs before it
parses flows: it lists the senders' files (terra_controller/file_flows.py says which), expands
the request, and for a sync coflow asks the receivers which destinations already hold the
same bytes (size and SHA-256).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass, field

import trio

from terra_controller.coflow_state import FlowState, RegistryError
from terra_controller.file_flows import expand, listing_key, needs_listing, strip_sha256
from terra_controller.request_checks import check_path
from terra_model.states import FlowStatus
from terra_wire.file_messages import check_messages, list_message

LIST_TIMEOUT_S = 300.0  # a listing of many files with their SHA-256 reads them all


@dataclass
class _Waiting:
    agent: str
    left: int  # requests (pages) not answered in full yet
    rows: list = field(default_factory=list)
    error: str | None = None
    done: trio.Event = field(default_factory=trio.Event)  # answered in full, or refused


@dataclass
class FileInfo:
    """What `resolve` learned: {flow id: the sender's SHA-256} (sync only) and the ids of the
    flows whose destination already holds those bytes (sync: counted done, not sent)."""

    sha256: dict[str, str] = field(default_factory=dict)
    skipped: set[str] = field(default_factory=set)

    def apply(self, parsed: list[FlowState]) -> list[FlowState]:
        """Mark the skipped flows of `parsed` done (all bytes delivered, skipped, their
        SHA-256); returns `parsed`."""
        for f in parsed:
            if f.id in self.skipped:
                f.state = FlowStatus.DONE
                f.delivered = f.bytes
                f.skipped = True
                f.sha256 = self.sha256.get(f.id)
        return parsed


class FileRequests:
    """Listing requests in flight on the agents' control connections, owned by the
    controller's loop: `ask` (from a worker thread: the API server's, for a submit that
    waits) hands the requests to the loop, which sends them and waits for the replies on
    trio events; `answer` (the agent channel's reader, on the loop) fills them in.

    Args:
        owner: the controller's OwnerLoop.
        send: (agent id, [headers]) -> whether they were queued on the agent's control
            connection (False: it is not connected); called on the loop.
        timeout_s: how long `ask` waits for the last reply.
    """

    def __init__(
        self, owner, send: Callable[[str, list[dict]], bool], timeout_s: float = LIST_TIMEOUT_S
    ) -> None:
        self.owner = owner
        self.send = send
        self.timeout_s = timeout_s
        self._ids = itertools.count(1)
        self._waiting: dict[str, _Waiting] = {}

    def ask(self, requests: list[tuple[str, list[dict]]]) -> list[list]:
        """Send every (agent, [request headers without id]) and wait for all their replies
        (from a thread other than the loop's).

        Returns:
            the rows ([path, size, sha256]) answering each request, in order.

        Raises:
            RegistryError: "unknown_agent" (an agent is not connected), "bad_request" (an
                agent refused: its one-line reason), "unavailable" (no answer in timeout_s).
        """
        return self.owner.run_async(self._ask_on_loop, requests)

    async def _ask_on_loop(self, requests: list[tuple[str, list[dict]]]) -> list[list]:
        ids = []
        try:
            for agent, headers in requests:
                msg_id = f"files-{next(self._ids)}"
                self._waiting[msg_id] = _Waiting(agent, len(headers))
                ids.append(msg_id)
                if not self.send(agent, [dict(header, id=msg_id) for header in headers]):
                    raise RegistryError("unknown_agent", f"agent {agent} is not connected")
            with trio.move_on_after(self.timeout_s):
                for msg_id in ids:  # (in order; a refusal answers at once)
                    await self._waiting[msg_id].done.wait()
                    if self._waiting[msg_id].error is not None:
                        break
            return [self._rows(msg_id) for msg_id in ids]
        finally:
            for msg_id in ids:
                self._waiting.pop(msg_id, None)

    def _rows(self, msg_id: str) -> list:
        """The rows answering request `msg_id`, or its error."""
        waiting = self._waiting[msg_id]
        if waiting.error is not None:
            raise RegistryError("bad_request", f"agent {waiting.agent}: {waiting.error}")
        if waiting.left > 0:
            raise RegistryError(
                "unavailable", f"agent {waiting.agent} did not answer a file listing"
            )
        return waiting.rows

    def answer(self, agent: str, msg: dict) -> None:
        """A validated "listing" from `agent` (on the loop; ignored unless it answers its
        own request)."""
        waiting = self._waiting.get(msg["id"]) if isinstance(msg["id"], str) else None
        if waiting is None or waiting.agent != agent:
            return
        waiting.rows += [tuple(r) for r in msg.get("files", [])]
        if msg.get("error"):
            waiting.error = msg["error"]
        elif not msg.get("more", False):
            waiting.left -= 1
        if waiting.error is not None or waiting.left <= 0:
            waiting.done.set()

    def resolve(self, flows: object, sync: bool = False) -> tuple[object, FileInfo]:
        """A submit's flows with file sizes and expansions from the senders (file_flows), and
        for `sync` the flows whose destination already matches.

        Raises:
            RegistryError: a bad src_path, a sender's refusal or silence (see `ask`), or
                anything file_flows.expand refuses; nothing was changed anywhere.
        """
        info = FileInfo()
        if not isinstance(flows, list):
            return flows, info
        todo: dict[tuple[str, str], None] = {}
        for i, item in enumerate(flows):
            if needs_listing(item, sync):
                check_path(item["src_path"], f"flows[{i}].src_path")
                todo[listing_key(item)] = None
        if not todo:
            return flows, info
        keys = list(todo)
        answers = self.ask([(a, [list_message(p, 0, sync)]) for a, p in keys])
        expanded, info.sha256 = strip_sha256(expand(flows, dict(zip(keys, answers, strict=True))))
        if sync:
            info.skipped = self._same_at_receivers(expanded, info.sha256)
        return expanded, info

    def _same_at_receivers(self, flows: list, shas: dict[str, str]) -> set[str]:
        """Ids of the flows whose dst_path at the receiver has their size and SHA-256."""
        per_agent: dict[str, dict[tuple[str, int, str], str]] = {}
        for item in flows:
            fid = str(item.get("id"))
            if fid in shas and isinstance(item.get("dst_path"), str):
                row = (item["dst_path"], item["bytes"], shas[fid])
                per_agent.setdefault(str(item.get("dst")), {})[row] = fid
        agents = list(per_agent)
        answers = self.ask([(a, check_messages(list(per_agent[a]), 0)) for a in agents])
        same = set()
        for agent, rows in zip(agents, answers, strict=True):
            for row in rows:
                fid = per_agent[agent].get(tuple(row))
                if fid is not None:
                    same.add(fid)
        return same
