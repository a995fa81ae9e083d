"""Coflow and flow states, and the range of coflow ids (docs/api.md).

The state strings are what the API, REST and metrics show.
"""

from __future__ import annotations

from enum import StrEnum


class CoflowStatus(StrEnum):
    """A coflow's state; the value is the string on the wire, in REST and in metrics.

    queued / running / preempted: active (the policy's view after each round).
    done: every WAN flow delivered. rejected: its deadline could not be met at submission.
    failed: a flow cannot run (source or sink error, digest mismatch after the allowed
    re-transfers), an endpoint agent was gone too long, or its deadline passed unfinished
    (CoflowState.reason says which). cancelled: the job master cancelled it.
    """

    QUEUED = "queued"
    RUNNING = "running"
    PREEMPTED = "preempted"
    DONE = "done"
    REJECTED = "rejected"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def final(self) -> bool:
        """True for done, rejected, failed and cancelled (the state never changes again)."""
        return self in FINAL_STATES


class FlowStatus(StrEnum):
    """A flow's state (same words as CoflowStatus): queued (nothing acknowledged yet),
    running (bytes acknowledged), done, failed (FlowState.reason says why), cancelled
    (its coflow was cancelled, or failed because of another flow)."""

    QUEUED = "queued"
    RUNNING = "running"
    DONE = "done"
    FAILED = "failed"
    CANCELLED = "cancelled"


FINAL_STATES = frozenset(
    {CoflowStatus.DONE, CoflowStatus.REJECTED, CoflowStatus.FAILED, CoflowStatus.CANCELLED}
)
STATES = tuple(s.value for s in CoflowStatus)
MAX_COFLOW_ID = 2**63 - 1  # coflow ids are 0..2**63-1 (int64 everywhere: msgpack, REST, logs)
MAX_CLIENT_ID = MAX_COFLOW_ID - 2**32  # a client may ask for ids up to this (ids never wrap)
