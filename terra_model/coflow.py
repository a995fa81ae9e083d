"""Coflows and flows as workloads describe them (docs/design.md section 2)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field


class WorkloadError(ValueError):
    """A workload is invalid; the message names the file and the line or field."""


@dataclass(frozen=True)
class Flow:
    """One flow of a coflow.

    Attributes:
        id: flow id, unique within its coflow.
        src, dst: source and destination DC names.
        bytes: size in bytes (> 0).
    """

    id: str
    src: str
    dst: str
    bytes: float

    @property
    def intra_dc(self) -> bool:
        """True when the flow stays inside one DC (it does not use the WAN)."""
        return self.src == self.dst


@dataclass
class Coflow:
    """A set of flows with a shared fate.

    Attributes:
        id: coflow id (unique in a workload).
        arrival_s: submission time, seconds from the start of the workload.
        flows: the flows (ids unique within the coflow).
        deadline_s: optional deadline, seconds relative to arrival (> 0).
    """

    id: str
    arrival_s: float
    flows: list[Flow] = field(default_factory=list)
    deadline_s: float | None = None

    @property
    def wan_bytes(self) -> float:
        """Total bytes of the flows that cross the WAN."""
        return sum(f.bytes for f in self.flows if not f.intra_dc)

    def flowgroups(self) -> dict[tuple[str, str], float]:
        """Return {(src DC, dst DC): total bytes} over the coflow's WAN flows (Lemma 3.1)."""
        groups: dict[tuple[str, str], float] = {}
        for f in self.flows:
            if not f.intra_dc:
                groups[(f.src, f.dst)] = groups.get((f.src, f.dst), 0.0) + f.bytes
        return groups


def check_size(value: object, where: str) -> float:
    """Return `value` as a float if it is a positive finite number of bytes.

    Raises:
        WorkloadError: naming `where`, for non-numeric, non-positive or non-finite values.
    """
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise WorkloadError(f"{where}: size must be a number of bytes, got {value!r}")
    if not value > 0 or not math.isfinite(value):
        raise WorkloadError(f"{where}: size must be positive and finite, got {value!r}")
    return float(value)
