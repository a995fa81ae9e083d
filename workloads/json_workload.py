"""The JSON workload format for hand-made cases (docs/design.md section 8)::

    {"coflows": [{"id": "c1", "arrival_s": 0.0, "deadline_s": null,
                  "flows": [{"id": "f1", "src": "A", "dst": "C", "bytes": 2e9}]}]}

`src`/`dst` are DC names; `deadline_s` is relative to arrival. The fields are the msgspec
Structs below (ids: non-empty strings or integers; sizes, times: finite numbers); keys they
do not name are ignored. A wrong value is reported with its field, e.g.
``w.json: coflows[2].flows[0].bytes: must be a number > 0, got -5``.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Annotated

import msgspec

from terra_model.coflow import Coflow, Flow, WorkloadError
from topologies.typed_json import Name, NonNegativeNumber, PositiveNumber, convert, read_json


class FlowSpec(msgspec.Struct):
    """One flow: `bytes` from DC `src` to DC `dst`."""

    id: Name | int
    src: str
    dst: str
    bytes: PositiveNumber


class CoflowSpec(msgspec.Struct, kw_only=True):
    """One coflow: its flows, arrival (s from the start) and deadline (s after arrival)."""

    id: Name | int
    arrival_s: NonNegativeNumber = 0.0
    deadline_s: PositiveNumber | None = None
    flows: Annotated[list[FlowSpec], msgspec.Meta(min_length=1)]


class WorkloadFile(msgspec.Struct):
    """A workload file: its coflows (checked non-empty by the loader)."""

    coflows: list[CoflowSpec]


def load_json_workload(path: Path | str, dcs: Sequence[str]) -> list[Coflow]:
    """Parse a JSON workload file.

    Args:
        path: the JSON file.
        dcs: the DC names flows may use.

    Returns:
        The coflows, sorted by arrival time (stable).

    Raises:
        WorkloadError: naming the file and the field (e.g. ``coflows[2].flows[0].bytes``)
            for invalid JSON, missing fields, duplicate ids, unknown DCs,
            non-positive or non-numeric sizes, a negative arrival, a
            non-positive deadline, or an empty workload.
    """
    path = Path(path)
    spec = convert(read_json(path, WorkloadError), WorkloadFile, WorkloadError, str(path), True)
    if not spec.coflows:
        raise WorkloadError(f"{path}: the workload has no coflows")
    coflows = [_coflow(c, dcs, f"{path}: coflows[{i}]") for i, c in enumerate(spec.coflows)]
    seen: set[str] = set()
    for i, c in enumerate(coflows):
        if c.id in seen:
            raise WorkloadError(f"{path}: coflows[{i}].id: duplicate coflow id {c.id!r}")
        seen.add(c.id)
    return sorted(coflows, key=lambda c: c.arrival_s)


def parse_coflow(item: object, dcs: Sequence[str], where: str) -> Coflow:
    """Validate one coflow object of the JSON format (CoflowSpec) and return it as a Coflow.

    Raises:
        WorkloadError: naming `where` and the offending field.
    """
    return _coflow(convert(item, CoflowSpec, WorkloadError, where, top=False), dcs, where)


def parse_flow(item: object, dcs: Sequence[str], where: str) -> Flow:
    """Validate one flow object ``{"id", "src", "dst", "bytes"}`` (FlowSpec).

    Raises:
        WorkloadError: naming `where` and the field: missing id, unknown DC,
            non-positive or non-numeric bytes.
    """
    return _flow(convert(item, FlowSpec, WorkloadError, where, top=False), dcs, where)


def _coflow(spec: CoflowSpec, dcs: Sequence[str], where: str) -> Coflow:
    flows = [_flow(f, dcs, f"{where}.flows[{j}]") for j, f in enumerate(spec.flows)]
    ids = [f.id for f in flows]
    if len(set(ids)) != len(ids):
        raise WorkloadError(f"{where}.flows: duplicate flow ids")
    return Coflow(str(spec.id), spec.arrival_s, flows, spec.deadline_s)


def _flow(spec: FlowSpec, dcs: Sequence[str], where: str) -> Flow:
    for key in ("src", "dst"):
        if getattr(spec, key) not in dcs:
            raise WorkloadError(f"{where}.{key}: unknown DC {getattr(spec, key)!r} "
                                f"(known: {list(dcs)})")  # fmt: skip
    return Flow(str(spec.id), spec.src, spec.dst, spec.bytes)
