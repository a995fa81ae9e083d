"""Tenants on the SWAN testbed (`terra-testbed swan --tenants N [--greedy-tenant]`).

The testbed's coflows (in workload order) go to N equal tenants t0..t{N-1} by the rule
terra-sim uses for `--tenants N` (terra_sim/tenants.py): coflow i to tenant i mod N. Each
tenant gets a job certificate (JOB_NAME-tN, `--tenant tN`) and its coflows are submitted
with that job's client; the controller runs with a tenants file of equal weights
(`--tenants FILE`, isolation "tenants", docs/design.md 4.5).

With the greedy tenant (the last one, t{N-1}, as in docs/results.md 1.8) Terra runs the
workload twice per repeat: all honest, then with the greedy tenant's coflows each replayed
as PIECES coflows of the same arrival and the same bytes (every flow cut into PIECES
parts, the remainder in the last; piece ids "<coflow id>/j"). A tenant's average CCT
counts each original coflow once, ended when its last piece ends; the summary gives each
honest tenant's change between the two runs.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

from mininet_scenarios.testbed_processes import job_name
from mininet_scenarios.testbed_reservation import (
    PROBE_ID,
    Reserve,
    reservation_lines,
    reservation_summary,
    reservation_toml,
)
from mininet_scenarios.workload import TestbedCoflow
from terra_controller.async_client import AsyncTerraClient

PIECES = 10  # coflows a greedy tenant makes of each of its own (every piece is real TCP)
SPLIT = "/"  # between a greedy tenant's coflow id and its piece number
TARGET_CHANGE = 0.10  # an honest tenant's average CCT moves at most this much


def pieces_of_one(coflows: list[TestbedCoflow], i: int) -> int:
    """How many of `coflows` from index i on are pieces of the same coflow as coflows[i]
    ("<id>/j" ids, consecutive, as split_greedy lays them out); 1 for a whole coflow."""
    head = str(coflows[i].trace_id)
    if SPLIT not in head:
        return 1
    stem = head.split(SPLIT, 1)[0] + SPLIT
    n = 1
    while i + n < len(coflows) and str(coflows[i + n].trace_id).startswith(stem):
        n += 1
    return n


def submit_together(ctl, coflows: list[TestbedCoflow]) -> list[tuple[int, float]]:
    """Submit one tenant's `coflows` (a greedy tenant's pieces of one coflow) at once, as a
    job master splitting its work would: pipelined on one AsyncTerraClient connection with
    the tenant's job certificate. [(coflow id, time.monotonic() its submit was accepted)],
    in order.

    Raises:
        TerraError, ConnectionError: as AsyncTerraClient.submit_coflow.
    """
    name = job_name(coflows[0].tenant)

    async def submit_all() -> list[tuple[int, float]]:
        async with AsyncTerraClient(*ctl.api, pki=ctl.pki, name=name, timeout=30) as client:

            async def one(c: TestbedCoflow) -> tuple[int, float]:
                cid = await client.submit_coflow([dict(f) for f in c.flows])
                return cid, time.monotonic()

            return list(await asyncio.gather(*(one(c) for c in coflows)))

    return asyncio.run(submit_all())


def tenant_names(n: int) -> list[str]:
    """["t0", ..., "t{n-1}"].

    Raises:
        ValueError: n < 1.
    """
    if n < 1:
        raise ValueError(f"--tenants must be >= 1, got {n}")
    return [f"t{i}" for i in range(n)]


def assign(coflows: list[TestbedCoflow], names: list[str]) -> list[TestbedCoflow]:
    """The coflows with coflow i (workload order) given to tenant names[i mod N]."""
    return [replace(c, tenant=names[i % len(names)]) for i, c in enumerate(coflows)]


def split_greedy(
    coflows: list[TestbedCoflow], greedy: str, pieces: int = PIECES
) -> list[TestbedCoflow]:
    """Each coflow of tenant `greedy` replaced by `pieces` ones (module docstring); the
    others unchanged, the order kept.

    Raises:
        ValueError: `greedy` owns no coflow, or pieces < 1.
    """
    if pieces < 1:
        raise ValueError(f"pieces must be >= 1, got {pieces}")
    if not any(c.tenant == greedy for c in coflows):
        raise ValueError(f"greedy tenant {greedy!r} owns no coflow (more tenants than coflows?)")
    out: list[TestbedCoflow] = []
    for c in coflows:
        if c.tenant != greedy:
            out.append(c)
            continue
        for j in range(pieces):
            last = j == pieces - 1
            flows = tuple(
                dict(f, bytes=f["bytes"] // pieces + (f["bytes"] % pieces if last else 0))
                for f in c.flows
            )
            out.append(replace(c, trace_id=f"{c.trace_id}{SPLIT}{j}", flows=flows))
    return out


def tenants_toml(
    names: list[str], path: Path, reserve: Reserve | None = None, sharing: str = "cooperative"
) -> Path:
    """Write a tenants file (TOML, terra_controller/tenants_config.py) with `sharing`
    (tenant_shares.SHARINGS), giving every tenant weight 1, with `reserve`'s guarantee
    (testbed_reservation); return its path."""
    weights = "".join(f"[tenants.{n}]\nweight = 1\n\n" for n in names)
    path.write_text(f'sharing = "{sharing}"\n\n' + weights + reservation_toml(reserve))
    return path


def per_tenant(runs: list, coflows: list[TestbedCoflow]) -> dict[str, dict]:
    """{tenant: {"avg_cct_s", "coflows"}} pooled over `runs` (RunResults of `coflows`);
    pieces "<id>/j" join into coflow <id> (from its earliest arrival to its last piece's
    end; counted only when every piece finished). A reservation's probe is left out
    (testbed_reservation.PROBE_ID: the testbed's measuring transfer, not the tenant's work)."""
    coflows = [c for c in coflows if c.trace_id != PROBE_ID]
    owner = {c.trace_id: c.tenant for c in coflows}
    ccts: dict[str, list[float]] = {t: [] for t in dict.fromkeys(owner.values())}
    for run in runs:
        spans: dict[tuple, list] = {}
        for c in coflows:
            key = (owner[c.trace_id], str(c.trace_id).split(SPLIT, 1)[0])
            span = spans.setdefault(key, [float("inf"), 0.0, True])
            cct = run.cct_s.get(c.trace_id)
            if cct is None:
                span[2] = False
                continue
            arrival = run.arrival_s[c.trace_id]
            span[0], span[1] = min(span[0], arrival), max(span[1], arrival + cct)
        for (tenant, _), (start, end, done) in spans.items():
            if done:
                ccts[tenant].append(end - start)
    return {
        t: {"avg_cct_s": float(np.mean(v)) if v else None, "coflows": len(v)}
        for t, v in ccts.items()
    }


def tenant_summary(raw: dict) -> dict | None:
    """{"honest": per_tenant of the honest runs, "greedy_tenant", "greedy": per_tenant of
    the greedy runs, "greedy_bytes_lost", "greedy_digest_mismatches" (their sums over the
    greedy runs), "change": {honest tenant: greedy avg / honest avg - 1},
    "change_per_repeat": [change of each repeat's pair of runs], "max_change": the
    largest |change|, "target_met", and with a reservation "reservation"
    (testbed_reservation.reservation_summary)} from run_swan's output (its
    "tenant_coflows", "greedy_coflows", "greedy_runs" and "reserve"); without greedy runs
    only "honest" (and "reservation"). None without tenants."""
    coflows = raw.get("tenant_coflows")
    if not coflows:
        return None
    name = raw["schedulers"][0]
    out: dict = {"honest": per_tenant(raw[name], coflows)}
    if raw.get("reserve") is not None:
        out["reservation"] = reservation_summary(raw["reserve"], raw[name],
                                                 raw.get("greedy_runs", []))  # fmt: skip
    if not raw.get("greedy_runs"):
        return out
    greedy = raw["greedy_tenant"]
    out["greedy_tenant"] = greedy
    out["greedy"] = per_tenant(raw["greedy_runs"], raw["greedy_coflows"])
    out["change_per_repeat"] = [
        _changes(per_tenant([h], coflows), per_tenant([g], raw["greedy_coflows"]), greedy)
        for h, g in zip(raw[name], raw["greedy_runs"], strict=False)
    ]
    out["greedy_submit_span_s"] = submit_span(raw["greedy_runs"], greedy, raw["greedy_coflows"])
    out["greedy_bytes_lost"] = sum(r.bytes_lost for r in raw["greedy_runs"])
    out["greedy_digest_mismatches"] = sum(r.digest_mismatches for r in raw["greedy_runs"])
    out["change"] = _changes(out["honest"], out["greedy"], greedy)
    out["max_change"] = max((abs(v) for v in out["change"].values()), default=None)
    if out["max_change"] is not None:
        out["target_met"] = out["max_change"] <= TARGET_CHANGE
    return out


def submit_span(runs: list, greedy: str, coflows: list[TestbedCoflow]) -> float:
    """The longest time (s) from the first to the last accepted submission of the pieces
    of one of the `greedy` tenant's coflows, over `runs` (RunResults of `coflows`)."""
    spans: dict[tuple[int, str], list[float]] = {}
    for i, run in enumerate(runs):
        for c in coflows:
            if c.tenant == greedy and c.trace_id in run.arrival_s:
                key = (i, str(c.trace_id).split(SPLIT, 1)[0])
                spans.setdefault(key, []).append(run.arrival_s[c.trace_id])
    return max((max(v) - min(v) for v in spans.values()), default=0.0)


def _changes(honest: dict, greedy_run: dict, greedy: str) -> dict[str, float]:
    """{honest tenant: its avg CCT in the greedy run / in the honest run - 1}."""
    change = {}
    for t, before in honest.items():
        after = greedy_run.get(t, {}).get("avg_cct_s")
        if t != greedy and before["avg_cct_s"] and after is not None:
            change[t] = after / before["avg_cct_s"] - 1
    return change


def tenant_lines(summary: dict) -> str:
    """The per-tenant lines of the testbed's printout."""
    greedy = summary.get("greedy_tenant")
    lines = []
    for t, honest in summary["honest"].items():
        line = f"tenant {t}: avg CCT {_s(honest['avg_cct_s'])} ({honest['coflows']} coflows)"
        if greedy is not None:
            after = summary["greedy"].get(t, {}).get("avg_cct_s")
            role = "greedy" if t == greedy else f"change {_pct(summary['change'].get(t))}"
            line += f"; with {greedy} greedy {_s(after)} ({role})"
        lines.append(line)
    if summary.get("max_change") is not None:
        met = "met" if summary["target_met"] else "MISSED"
        repeats = summary["change_per_repeat"]
        if len(repeats) > 1:
            per = ", ".join("/".join(_pct(v) for v in r.values()) for r in repeats)
            lines.append(f"honest tenants' change per repeat: {per}")
        lines.append(
            f"honest tenants' avg CCT change with {greedy} greedy: at most "
            f"{summary['max_change']:.1%} either way (target <= {TARGET_CHANGE:.0%}: {met}); "
            f"greedy runs: {summary['greedy_bytes_lost']} bytes lost, "
            f"{summary['greedy_digest_mismatches']} digest mismatches, a coflow's pieces "
            f"submitted within {summary['greedy_submit_span_s']:.2f} s"
        )
    if "reservation" in summary:
        lines.append(reservation_lines(summary["reservation"]))
    return "\n".join(lines)


def _s(value) -> str:
    return "-" if value is None else f"{value:.2f} s"


def _pct(value) -> str:
    return "-" if value is None else f"{value:+.1%}"


class JobClients:
    """The job clients of one Terra run: one per tenant of `coflows` (the job master alone
    without tenants), from `ctl.client(timeout[, tenant])`."""

    def __init__(self, ctl, coflows: list[TestbedCoflow], timeout: float):
        tenants = dict.fromkeys(c.tenant for c in coflows)
        self.clients = {
            t: ctl.client(timeout) if t is None else ctl.client(timeout, tenant=t) for t in tenants
        }

    def of(self, tenant: str | None):
        """The client submitting `tenant`'s coflows."""
        return self.clients[tenant]

    @property
    def default(self):
        """The first client (the job master without tenants)."""
        return next(iter(self.clients.values()))

    def list_coflows(self) -> list[dict]:
        """Every client's coflow rows, each coflow id once."""
        rows = {r["id"]: r for client in self.clients.values() for r in client.list_coflows()}
        return list(rows.values())

    def close(self) -> None:
        """Close every client."""
        for client in self.clients.values():
            client.close()
