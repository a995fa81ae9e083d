"""`terra-job replay`: a simulator JSON workload (workloads/json_workload.py) replayed on a
running controller, each coflow submitted at its arrival time.

Every DC of the workload stands for one agent (`--map DC=AGENT,...`); flow sizes are rounded
to whole bytes. Intra-DC flows are skipped (Terra schedules the WAN; they are counted), and a
coflow without a WAN flow is not submitted. Each coflow carries its workload id as its name
and the tag "replay". The replay prints one line per submission and per
finished coflow, then a summary; it ends when every submitted coflow is final.
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass, field

from terra_controller.client import FINAL
from terra_model import Coflow
from workloads.json_workload import load_json_workload

POLL_S = 0.5  # seconds between two `list` requests while coflows are open


@dataclass
class ReplayPlan:
    """A workload ready to replay.

    Attributes:
        coflows: [(arrival s, workload coflow id, deadline s or None, API flow maps)], by
            arrival; only coflows with at least one WAN flow.
        skipped_flows: intra-DC flows left out. skipped_coflows: coflows without a WAN flow.
    """

    coflows: list[tuple[float, str, float | None, list[dict]]] = field(default_factory=list)
    skipped_flows: int = 0
    skipped_coflows: int = 0


def load_replay(path: str, agent_of: dict[str, str]) -> ReplayPlan:
    """Read a JSON workload whose DCs are the keys of `agent_of` and map it onto agents.

    Raises:
        WorkloadError (a ValueError): unreadable or invalid file, or a DC missing from the map.
    """
    plan = ReplayPlan()
    for c in load_json_workload(path, list(agent_of)):
        flows = api_flows(c, agent_of)
        plan.skipped_flows += len(c.flows) - len(flows)
        if not flows:
            plan.skipped_coflows += 1
            continue
        plan.coflows.append((c.arrival_s, c.id, c.deadline_s, flows))
    return plan


def api_flows(coflow: Coflow, agent_of: dict[str, str]) -> list[dict]:
    """The coflow's WAN flows as API flow maps (agents for DCs, whole bytes >= 1)."""
    return [
        {"id": f.id, "src": agent_of[f.src], "dst": agent_of[f.dst],
         "bytes": max(1, round(f.bytes))}
        for f in coflow.flows
        if not f.intra_dc
    ]  # fmt: skip


def replay(client, plan: ReplayPlan, speed: float, timeout: float | None, as_json: bool) -> int:
    """Submit the plan's coflows at their arrival times (divided by `speed`) and wait until
    every one is final (or `timeout` seconds after the start).

    Returns:
        0 when every submitted coflow is done, else 1 (the others are listed on stderr).

    Raises:
        TerraError: a submit was refused (e.g. an unknown agent). ConnectionError.
        TimeoutError: coflows still open after `timeout` seconds.
    """
    print(f"replaying {len(plan.coflows)} coflows; skipped {plan.skipped_flows} intra-DC flows "
          f"({plan.skipped_coflows} coflows without a WAN flow)", flush=True)  # fmt: skip
    start = time.monotonic()
    pending = list(plan.coflows)
    names: dict[int, str] = {}
    final: dict[int, dict] = {}
    rejected: list[dict] = []
    last_poll = 0.0
    while pending or len(final) < len(names):
        now = time.monotonic() - start
        while pending and pending[0][0] / speed <= now:
            arrival, name, deadline, flows = pending.pop(0)
            cid = client.submit_coflow(flows, deadline, name=name, tags=["replay"])
            if cid < 0:
                rejected.append({"id": None, "state": "rejected", "name": name})
                print(f"t={now:.1f}s {name}: rejected (deadline cannot be met)", flush=True)
                continue
            names[cid] = name
            print(f"t={now:.1f}s {name}: coflow {cid}, {len(flows)} flows", flush=True)
        if names and now - last_poll >= POLL_S:
            last_poll = now
            _collect(client, names, final, now)
        if timeout is not None and now > timeout:
            raise TimeoutError(f"replay: {len(names) + len(pending) - len(final)} coflows "
                               f"not finished after {timeout} s")  # fmt: skip
        wait = POLL_S if not pending else min(POLL_S, max(0.0, pending[0][0] / speed - now))
        time.sleep(wait)
    return _summary([*final.values(), *rejected], as_json)


def _collect(client, names: dict[int, str], final: dict[int, dict], now: float) -> None:
    """Record (and print) the coflows that reached a final state since the last poll."""
    for c in client.list_coflows():
        cid = c["id"]
        if cid in names and cid not in final and c["state"] in FINAL:
            final[cid] = dict(c, name=names[cid])
            cct = "" if c.get("cct_s") is None else f", CCT {c['cct_s']:.2f} s"
            print(f"t={now:.1f}s {names[cid]}: coflow {cid} {c['state']}{cct}", flush=True)


def _summary(final: list[dict], as_json: bool) -> int:
    done = [c for c in final if c["state"] == "done"]
    ccts = [c["cct_s"] for c in done if c.get("cct_s") is not None]
    avg = sum(ccts) / len(ccts) if ccts else None
    if as_json:
        print(json.dumps({"coflows": final, "average_cct_s": avg}, indent=1))
    else:
        avg_text = "-" if avg is None else f"{avg:.2f} s"
        print(f"{len(done)} of {len(final)} coflows done, average CCT {avg_text}")
    for c in final:
        if c["state"] != "done":
            print(f"{c['name']}: coflow {c['id']} {c['state']}", file=sys.stderr)
    return 0 if len(done) == len(final) else 1
