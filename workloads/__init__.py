"""Workloads: coflow model, the coflow-benchmark (Facebook) trace and the JSON format."""

from __future__ import annotations

from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING

from terra_model.coflow import Coflow, Flow, WorkloadError, check_size
from workloads.coflowsim_trace import load_coflowsim_trace
from workloads.fb_trace import MB_BYTES, load_fb_trace
from workloads.json_workload import load_json_workload, parse_coflow, parse_flow

if TYPE_CHECKING:
    from topologies import Topology

FB_TRACE = "FB2010-1Hr-150-0.txt"


def fb_trace_path() -> Path:
    """Return the packaged Facebook 2010 coflow-benchmark trace."""
    return Path(str(resources.files("workloads") / "data" / FB_TRACE))


def load_workload(
    spec: str, topology: Topology, limit: int | None = None, coflowsim: bool = False
) -> list[Coflow]:
    """Load "fb" (the packaged FB trace), a coflow-benchmark .txt trace, or a JSON workload.

    Args:
        spec: "fb", or a path ending in .json (JSON format) or anything else (trace format).
        topology: racks / DC names are mapped onto its DCs. A trace's rack r goes to
            ``dcs[r % N]``, except on a topology with a node per rack
            (``attrs["rack_dcs"]``, e.g. bigswitch): there rack r is node
            ``rack_dcs[r]`` (identity), and a trace with more racks is an error.
        limit: keep only the first `limit` coflows (in arrival order).
        coflowsim: read a trace as CoflowSim does (workloads/coflowsim_trace.py): mapper
            rack r sends from ``rack_dcs[r]``, reducer rack r receives at
            ``rack_rx_dcs[r]`` (topologies.bigswitch's split fabric).

    Raises:
        WorkloadError: unreadable or invalid workload (names the file and line or field),
            a ``rack_dcs`` that is not a list of the topology's DCs, or `coflowsim` with a
            JSON workload or a topology without ``rack_dcs`` and ``rack_rx_dcs``.
    """
    if coflowsim:
        return _coflowsim_workload(spec, topology, limit)
    rack_dcs = topology.attrs.get("rack_dcs")
    if rack_dcs is not None and (
        not isinstance(rack_dcs, list) or not set(rack_dcs) <= set(topology.dcs)
    ):
        raise WorkloadError(f"topology {topology.name}: 'rack_dcs' must list DCs of it")
    mapping = None if rack_dcs is None else rack_mapping(rack_dcs)
    if spec == "fb":
        coflows = load_fb_trace(fb_trace_path(), topology.dcs, mapping, limit=limit)
    elif spec.endswith(".json"):
        coflows = load_json_workload(spec, topology.dcs)[:limit]
    else:
        coflows = load_fb_trace(spec, topology.dcs, mapping, limit=limit)
    return coflows


def _coflowsim_workload(spec: str, topology: Topology, limit: int | None) -> list[Coflow]:
    senders, receivers = topology.attrs.get("rack_dcs"), topology.attrs.get("rack_rx_dcs")
    if not isinstance(senders, list) or not isinstance(receivers, list):
        raise WorkloadError(
            f"topology {topology.name}: reading a trace as CoflowSim needs a sending and a "
            "receiving node per rack ('rack_dcs', 'rack_rx_dcs')"
        )
    if not set(senders) | set(receivers) <= set(topology.dcs):
        raise WorkloadError(f"topology {topology.name}: 'rack_dcs' must list DCs of it")
    if spec.endswith(".json"):
        raise WorkloadError(f"{spec}: only a coflow-benchmark trace can be read as CoflowSim")
    path = fb_trace_path() if spec == "fb" else spec
    return load_coflowsim_trace(path, rack_mapping(senders), rack_mapping(receivers), limit)


def rack_mapping(rack_dcs: list[str]):
    """Return rack r -> ``rack_dcs[r]``, a one-to-one rack mapping for load_fb_trace.

    The returned function raises WorkloadError for a rack beyond ``rack_dcs``
    (load_fb_trace adds the file and line).
    """

    def to_dc(rack: int) -> str:
        if not 0 <= rack < len(rack_dcs):
            raise WorkloadError(f"rack {rack}: the topology has racks 0..{len(rack_dcs) - 1}")
        return rack_dcs[rack]

    return to_dc


__all__ = [
    "MB_BYTES",
    "Coflow",
    "Flow",
    "WorkloadError",
    "check_size",
    "fb_trace_path",
    "load_coflowsim_trace",
    "load_fb_trace",
    "load_json_workload",
    "load_workload",
    "parse_coflow",
    "parse_flow",
]
