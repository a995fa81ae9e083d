"""Workloads: coflow model, the coflow-benchmark (Facebook) trace and the JSON format."""

from __future__ import annotations

from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING

from workloads.coflow import Coflow, Flow, WorkloadError, check_size
from workloads.fb_trace import MB_BYTES, load_fb_trace
from workloads.json_workload import load_json_workload, parse_coflow, parse_flow

if TYPE_CHECKING:
    from topologies import Topology

FB_TRACE = "FB2010-1Hr-150-0.txt"


def fb_trace_path() -> Path:
    """Return the packaged Facebook 2010 coflow-benchmark trace."""
    return Path(str(resources.files("workloads") / "data" / FB_TRACE))


def load_workload(spec: str, topology: Topology, limit: int | None = None) -> list[Coflow]:
    """Load "fb" (the packaged FB trace), a coflow-benchmark .txt trace, or a JSON workload.

    Args:
        spec: "fb", or a path ending in .json (JSON format) or anything else (trace format).
        topology: racks / DC names are mapped onto its DCs.
        limit: keep only the first `limit` coflows (in arrival order).

    Raises:
        WorkloadError: unreadable or invalid workload (names the file and line or field).
    """
    if spec == "fb":
        coflows = load_fb_trace(fb_trace_path(), topology.dcs, limit=limit)
    elif spec.endswith(".json"):
        coflows = load_json_workload(spec, topology.dcs)[:limit]
    else:
        coflows = load_fb_trace(spec, topology.dcs, limit=limit)
    return coflows


__all__ = [
    "MB_BYTES",
    "Coflow",
    "Flow",
    "WorkloadError",
    "check_size",
    "fb_trace_path",
    "load_fb_trace",
    "load_json_workload",
    "load_workload",
    "parse_coflow",
    "parse_flow",
]
