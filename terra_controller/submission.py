"""A submit's checked parts on their way to the registry (`Controller.submit`), and the
submit and update core events as recorded and replayed (core_log.py).

A submit's event holds everything its handler reads that may differ between runs: the
flows after the agents resolved their files, what the agents said about the files, the
coflow's secret (its flows' keys derive from it) and the owner's tenant as its
certificate gave it (tenants.TenantBook.learn runs before the event). Its flows are parsed
again on replay against the agents registered then, which are the same.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from terra_controller.coflow_state import FlowState
from terra_controller.file_requests import FileInfo


@dataclass
class Submission:
    """A submit's checked parts: parsed flows, deadline (s from arrival) or None, age (s
    since first submission), labels (name, tags), the coflow's secret and {flow id:
    attempt} of a resumed coflow."""

    parsed: list[FlowState]
    deadline_s: float | None
    age: float
    labels: tuple[str | None, tuple[str, ...]]
    secret: bytes
    attempts: dict[str, int] = field(default_factory=dict)


def recorded_submit(controller: Any, flows: object, files: FileInfo, agents: dict,
                    sub: Submission, coflow_id: int | None, owner: str | None,
                    ref: str | None) -> list:  # fmt: skip
    """The submit handler's arguments as recorded: [flows, {"sha256", "skipped"}, {deadline_s,
    age, name, tags, secret, tenant}, coflow id, owner, ref] (the agents are not: a replay
    has the same ones registered)."""
    name, tags = sub.labels
    files_plain = {"sha256": files.sha256, "skipped": sorted(files.skipped)}
    book = getattr(controller, "tenants", None)
    learned = None if book is None or owner is None else book.owners.get(owner)
    checked = {"deadline_s": sub.deadline_s, "age": sub.age, "name": name, "tags": list(tags),
               "secret": sub.secret, "tenant": learned}  # fmt: skip
    return [flows, files_plain, checked, coflow_id, owner, ref]


def replayed_args(controller: Any, kind: str, args: list) -> list:
    """A recorded core event's arguments as its handler takes them: a submit's or an
    update's flows parsed against the agents registered now, a submit's Submission rebuilt
    and its owner's tenant noted; the other events' as recorded.

    Raises:
        RegistryError: the flows do not parse (a log that does not fit this controller).
    """
    registry = controller.registry
    agents = dict(registry.agents)
    if kind == "submit":
        flows, files_plain, c, coflow_id, owner, ref = args
        files = FileInfo(files_plain["sha256"], set(files_plain["skipped"]))
        book = getattr(controller, "tenants", None)
        if book is not None and c.get("tenant") is not None:  # what its certificate said
            book.owners[owner] = c["tenant"]
        parsed = files.apply(registry.parse_flows(flows, agents=agents))
        labels = (c["name"], tuple(c["tags"]))
        sub = Submission(parsed, c["deadline_s"], c["age"], labels, c["secret"])
        return [flows, files, agents, sub, coflow_id, owner, ref]
    if kind == "update":
        coflow_id, flows = args
        return [coflow_id, flows, agents, registry.parse_flows(flows, agents=agents)]
    return args
