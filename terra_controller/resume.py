"""Coflows resumed after a controller restart, from the coflow journal.

A restarted controller (the same state directory) finds in its journal (journal.py) every
coflow that had not ended: its flows, owner, secret, name and tags, the attempts of flows
restarted from byte 0, its arrival (Unix time) and its deadline. It admits each again by
itself, under its id, as soon as every agent its flows name has registered again: the
arrival stays the first submission's (its CCT counts from then), the deadline stays the
same instant, and the flows' keys are the same (same secret and attempts), so the reports
the agents kept about their progress and completions match and are applied (agent_channel:
the kept reports of a coflow not known yet). No client resubmits anything; a client that
does (it saw a new controller instance) gets the same id back.

A coflow whose agents have not all registered `agent_timeout_s` after the controller's
start, whose deadline passed while the controller was down, or that cannot be admitted
again (a path now busy, a deadline that cannot be met) fails with that reason. Until it is
resumed a coflow answers status requests from the journal ("queued", with what it waits
for); an ended one answers with its final state, CCT and bytes.

The functions here are pure: the Controller calls them and does the admitting.
"""

from __future__ import annotations

from collections.abc import Container, Iterable

from terra_controller.coflow_state import CoflowState, FlowState
from terra_controller.journal import FlowRow, JournalEntry
from terra_model.states import CoflowStatus, FlowStatus


def flow_rows(flows: Iterable[FlowState]) -> list[FlowRow]:
    """Flows as the journal keeps them: [[id, src agent, dst agent, bytes, src_path,
    dst_path], ...] (paths None when not given)."""
    return [[f.id, f.src_agent, f.dst_agent, f.bytes, f.src_path, f.dst_path] for f in flows]


def flow_requests(rows: list[FlowRow]) -> list[dict]:
    """Journal flow rows back as the submit request's flows ({"id", "src", "dst", "bytes",
    "src_path"?, "dst_path"?})."""
    out = []
    for fid, src, dst, size, src_path, dst_path in rows:
        item = {"id": fid, "src": src, "dst": dst, "bytes": size}
        if src_path is not None:
            item["src_path"] = src_path
        if dst_path is not None:
            item["dst_path"] = dst_path
        out.append(item)
    return out


def missing_agents(entry: JournalEntry, registered: Container[str]) -> list[str]:
    """The agents `entry`'s flows name that are not registered, sorted."""
    named = {row[1] for row in entry.flows} | {row[2] for row in entry.flows}
    return sorted(a for a in named if a not in registered)


def resume_request(entry: JournalEntry, now_unix: float) -> dict | str:
    """The submit arguments that admit `entry` again at `now_unix` (Unix time, s):
    {"flows", "deadline" (s from now, or None), "age_s" (s since its arrival), "owner",
    "name", "tags"}; or, when its deadline passed meanwhile, the reason it fails (str)."""
    age = max(0.0, now_unix - entry.arrival_unix)
    deadline = None
    if entry.deadline_s is not None:
        deadline = entry.deadline_s - age
        if deadline <= 0:
            return (
                f"deadline missed ({entry.deadline_s:g} s after arrival) while the controller "
                "was down"
            )
    return {
        "flows": flow_requests(entry.flows),
        "deadline": deadline,
        "age_s": age,
        "owner": entry.owner,
        "name": entry.name,
        "tags": list(entry.tags),
    }


def ended_summary(coflow: CoflowState) -> dict:
    """What the journal keeps of an ended coflow: {"state", "reason", "cct_s",
    "bytes_total", "bytes_delivered"}."""
    return {
        "state": coflow.state.value,
        "reason": coflow.reason,
        "cct_s": coflow.cct_s,
        "bytes_total": coflow.bytes_total,
        "bytes_delivered": coflow.bytes_delivered,
    }


def failed_summary(entry: JournalEntry, reason: str) -> dict:
    """The ended summary of a journaled coflow that failed before it could be resumed."""
    total = sum(row[3] for row in entry.flows)
    return {"state": CoflowStatus.FAILED.value, "reason": reason, "cct_s": None,
            "bytes_total": total, "bytes_delivered": 0}  # fmt: skip


def journal_status(coflow_id: int, entry: JournalEntry, waiting: str | None = None) -> dict:
    """The status map (CoflowState.status's shape) of a coflow known only from the journal:
    an ended one (its final state, CCT and bytes; no flows kept), or one waiting to be
    resumed (state "queued", reason `waiting`, its flows with nothing delivered)."""
    if entry.ended is not None:
        ended = entry.ended
        return {"id": coflow_id, **ended, "deadline_s": entry.deadline_s, "name": entry.name,
                "tags": list(entry.tags), "flows": []}  # fmt: skip
    flows = [
        {"id": fid, "src": src, "dst": dst, "src_dc": None, "dst_dc": None, "bytes": size,
         "bytes_delivered": 0, "done": False, "digest": None,
         "state": FlowStatus.QUEUED.value, "reason": None,
         "restarts": entry.attempts.get(fid, 0), "rate_bytes_per_s": 0.0}
        for fid, src, dst, size, _, _ in entry.flows
    ]  # fmt: skip
    return {
        "id": coflow_id,
        "state": CoflowStatus.QUEUED.value,
        "reason": waiting,
        "bytes_total": sum(f["bytes"] for f in flows),
        "bytes_delivered": 0,
        "cct_s": None,
        "deadline_s": entry.deadline_s,
        "name": entry.name,
        "tags": list(entry.tags),
        "flows": flows,
    }
