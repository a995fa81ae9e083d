"""What a simulation run measured: per coflow (CoflowResult) and per run (SimResult), with
the statistics terra-sim prints (terra_sim/simulator.py's docstring defines them).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass
class CoflowResult:
    """Outcome of one coflow.

    Attributes:
        id, arrival_s: as in the workload (seconds).
        finish_s: when its last byte was delivered (None = rejected or unfinished).
        cct_s: finish_s - arrival_s (None likewise).
        admitted: False when the policy rejected it (deadline admission).
        met_deadline: None without a deadline; else finished within it (1e-9 relative slack).
        wan: False for coflows with only intra-DC flows (left out of statistics).
        deadline_s: deadline relative to arrival, or None.
        gamma_empty_s: Γ on the empty WAN, or None when not computed.
    """

    id: str
    arrival_s: float
    finish_s: float | None = None
    cct_s: float | None = None
    admitted: bool = True
    met_deadline: bool | None = None
    wan: bool = True
    deadline_s: float | None = None
    gamma_empty_s: float | None = None

    def to_json(self) -> dict:
        """Return {"id", "arrival_s", "finish_s", "cct_s", "admitted", "met_deadline", "wan"}
        ("wan" false: only intra-DC flows, finished at arrival, CCT 0)."""
        return {
            "id": self.id,
            "arrival_s": self.arrival_s,
            "finish_s": self.finish_s,
            "cct_s": self.cct_s,
            "admitted": self.admitted,
            "met_deadline": self.met_deadline,
            "wan": self.wan,
        }


@dataclass
class SimResult:
    """What one simulation run measured (see the module docstring for definitions).

    Attributes:
        scheduler: the policy's name.
        coflows: one CoflowResult per coflow, in workload order.
        wan_utilization: fraction in [0, 1], None when no WAN flow ever ran.
        rounds: scheduling rounds (the policy's own count when it keeps
            `stats["rounds"]`, else allocate() calls).
        round_ms: wall milliseconds per round (policy's `stats["round_ms"]` or
            measured around allocate()).
        lps_per_round: LPs solved per round (policy's `stats["lps"]` / rounds),
            None for policies that do not count LPs.
        bytes_total, bytes_delivered: WAN bytes of admitted coflows, and delivered.
        end_s: simulated time at which the run ended (seconds).
        wall_s: wall-clock seconds the run took.
        byte_hops: bytes x hops carried over WAN links (wan_utilization's numerator).
    """

    scheduler: str
    coflows: list[CoflowResult]
    wan_utilization: float | None = None
    rounds: int = 0
    round_ms: list[float] = field(default_factory=list)
    lps_per_round: float | None = None
    bytes_total: float = 0.0
    bytes_delivered: float = 0.0
    end_s: float = 0.0
    wall_s: float = 0.0
    byte_hops: float = 0.0

    def _done(self) -> list[CoflowResult]:
        return [c for c in self.coflows if c.wan and c.admitted and c.cct_s is not None]

    @property
    def unfinished(self) -> list[str]:
        """Ids of admitted coflows that never finished."""
        return [c.id for c in self.coflows if c.admitted and c.finish_s is None]

    @property
    def avg_cct_s(self) -> float | None:
        """Mean CCT in seconds over finished, admitted WAN coflows (None if none)."""
        done = self._done()
        return float(np.mean([c.cct_s for c in done])) if done else None

    @property
    def p95_cct_s(self) -> float | None:
        """95th percentile (linear interpolation) of the same CCTs, seconds."""
        done = self._done()
        return float(np.percentile([c.cct_s for c in done], 95)) if done else None

    @property
    def avg_slowdown(self) -> float | None:
        """Mean of CCT / Γ_empty over finished, admitted WAN coflows with a known Γ > 0."""
        ratios = [c.cct_s / c.gamma_empty_s for c in self._done() if c.gamma_empty_s]
        return float(np.mean(ratios)) if ratios else None

    @property
    def deadlines_met(self) -> int:
        """WAN coflows with a deadline that finished within it."""
        return sum(1 for c in self.coflows if c.wan and c.met_deadline)

    @property
    def intra_dc_coflows(self) -> int:
        """Coflows with only intra-DC flows: finished at arrival (CCT 0), not in the
        statistics."""
        return sum(1 for c in self.coflows if not c.wan)

    @property
    def admitted(self) -> int:
        """WAN coflows the policy admitted."""
        return sum(1 for c in self.coflows if c.wan and c.admitted)

    def round_ms_quantile(self, q: float) -> float | None:
        """The q-quantile (0..1) of round_ms, None without rounds."""
        return float(np.quantile(self.round_ms, q)) if self.round_ms else None

    def to_json(self) -> dict:
        """Return the per-scheduler object of `terra-sim --json` (plus wall_s)."""
        return {
            "avg_cct_s": self.avg_cct_s,
            "p95_cct_s": self.p95_cct_s,
            "wan_utilization": self.wan_utilization,
            "avg_slowdown": self.avg_slowdown,
            "deadlines_met": self.deadlines_met,
            "admitted": self.admitted,
            "intra_dc_coflows": self.intra_dc_coflows,
            "rounds": self.rounds,
            "round_ms_median": self.round_ms_quantile(0.5),
            "round_ms_p95": self.round_ms_quantile(0.95),
            "lps_per_round": self.lps_per_round,
            "wall_s": self.wall_s,
            "coflows": [c.to_json() for c in self.coflows],
        }
