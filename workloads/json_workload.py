"""The JSON workload format for hand-made cases (docs/design.md section 8)::

    {"coflows": [{"id": "c1", "arrival_s": 0.0, "deadline_s": null,
                  "flows": [{"id": "f1", "src": "A", "dst": "C", "bytes": 2e9}]}]}

`src`/`dst` are DC names; `deadline_s` is relative to arrival.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path

from terra_model.coflow import Coflow, Flow, WorkloadError, check_size


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
    try:
        doc = json.loads(Path(path).read_text())
    except (OSError, UnicodeDecodeError) as exc:
        raise WorkloadError(f"{path}: cannot read: {exc}") from exc
    except json.JSONDecodeError as exc:
        raise WorkloadError(f"{path}: line {exc.lineno}: invalid JSON: {exc.msg}") from exc
    items = doc.get("coflows") if isinstance(doc, dict) else None
    if not isinstance(items, list):
        raise WorkloadError(f"{path}: top level must be an object with a 'coflows' list")
    if not items:
        raise WorkloadError(f"{path}: the workload has no coflows")
    coflows = [parse_coflow(item, dcs, f"{path}: coflows[{i}]") for i, item in enumerate(items)]
    seen: set[str] = set()
    for i, c in enumerate(coflows):
        if c.id in seen:
            raise WorkloadError(f"{path}: coflows[{i}].id: duplicate coflow id {c.id!r}")
        seen.add(c.id)
    return sorted(coflows, key=lambda c: c.arrival_s)


def parse_coflow(item: object, dcs: Sequence[str], where: str) -> Coflow:
    """Validate one coflow object of the JSON format and return it as a Coflow.

    Raises:
        WorkloadError: naming `where` and the offending field.
    """
    if not isinstance(item, dict):
        raise WorkloadError(f"{where}: must be an object")
    cid = item.get("id")
    if not isinstance(cid, str | int) or isinstance(cid, bool) or cid == "":
        raise WorkloadError(f"{where}.id: must be a non-empty string")
    arrival = item.get("arrival_s", 0.0)
    if not _number(arrival) or arrival < 0:
        raise WorkloadError(f"{where}.arrival_s: must be a non-negative number, got {arrival!r}")
    deadline = item.get("deadline_s")
    if deadline is not None and (not _number(deadline) or deadline <= 0):
        raise WorkloadError(f"{where}.deadline_s: must be a positive number, got {deadline!r}")
    raw = item.get("flows")
    if not isinstance(raw, list) or not raw:
        raise WorkloadError(f"{where}.flows: must be a non-empty list")
    flows = [parse_flow(f, dcs, f"{where}.flows[{j}]") for j, f in enumerate(raw)]
    ids = [f.id for f in flows]
    if len(set(ids)) != len(ids):
        raise WorkloadError(f"{where}.flows: duplicate flow ids")
    return Coflow(str(cid), float(arrival), flows, None if deadline is None else float(deadline))


def parse_flow(item: object, dcs: Sequence[str], where: str) -> Flow:
    """Validate one flow object ``{"id", "src", "dst", "bytes"}``.

    Raises:
        WorkloadError: naming `where` and the field: missing id, unknown DC,
            non-positive or non-numeric bytes.
    """
    if not isinstance(item, dict):
        raise WorkloadError(f"{where}: must be an object")
    fid = item.get("id")
    if not isinstance(fid, str | int) or isinstance(fid, bool) or fid == "":
        raise WorkloadError(f"{where}.id: must be a non-empty string")
    for key in ("src", "dst"):
        if item.get(key) not in dcs:
            raise WorkloadError(f"{where}.{key}: unknown DC {item.get(key)!r} (known: {list(dcs)})")
    size = check_size(item.get("bytes"), f"{where}.bytes")
    return Flow(str(fid), item["src"], item["dst"], size)


def _number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
