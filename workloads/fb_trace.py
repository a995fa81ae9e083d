"""The coflow-benchmark trace format (Facebook 2010 trace; docs/design.md section 8).

Line 1: ``<racks> <coflows>``. Then one coflow per line::

    <id> <arrival ms> <#mappers> <mapper racks...> <#reducers> <rack:MB ...>

A reducer's MB (1 MB = 1,048,576 bytes) is the total it receives, split equally
over the coflow's mappers, with no flow smaller than 1 MB (the CoflowSim
convention). Rack r maps to DC ``dcs[r % len(dcs)]`` unless a mapping is given
(workloads.load_workload gives the identity on a topology with a node per rack,
such as bigswitch).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from pathlib import Path

from terra_model.coflow import Coflow, Flow, WorkloadError

MB_BYTES = 1_048_576


def load_fb_trace(
    path: Path | str,
    dcs: Sequence[str],
    rack_to_dc: Callable[[int], str] | None = None,
    limit: int | None = None,
) -> list[Coflow]:
    """Parse a coflow-benchmark trace into coflows over the given DCs.

    Args:
        path: the trace file.
        dcs: DC names in topology order (used by the default ``r mod N`` mapping).
        rack_to_dc: optional rack -> DC mapping replacing ``r mod N``.
        limit: keep only the first `limit` coflows.

    Returns:
        Coflows in file order, ids as in the trace, arrival in seconds; flow ids
        ``"m<i>r<j>"`` for mapper i -> reducer j.

    Raises:
        WorkloadError: naming the file and line, for a malformed header or
            coflow line (wrong counts, non-numeric fields, bad rack, size <= 0),
            or an empty trace.
    """
    path = Path(path)
    if not dcs:
        raise WorkloadError(f"{path}: no DCs to map racks onto")
    mapping = rack_to_dc or (lambda r: dcs[r % len(dcs)])
    racks, lines = read_trace(path, limit)
    return [_parse_line(line, racks, mapping, where) for where, line in lines]


def read_trace(path: Path, limit: int | None = None) -> tuple[int, list[tuple[str, str]]]:
    """The number of racks of a trace and its first `limit` (all when None) coflow lines.

    Returns:
        (racks, [(where, line)]) with where = "file:line" for messages; blank lines skipped.

    Raises:
        WorkloadError: unreadable file, a malformed header, or no coflow line.
    """
    try:
        lines = path.read_text().splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise WorkloadError(f"{path}: cannot read: {exc}") from exc
    if not lines:
        raise WorkloadError(f"{path}: empty trace")
    racks, _count = _ints(lines[0].split(), 2, f"{path}:1: header '<racks> <coflows>'")
    out: list[tuple[str, str]] = []
    for lineno, line in enumerate(lines[1:], start=2):
        if not line.strip():
            continue
        if limit is not None and len(out) >= limit:
            break
        out.append((f"{path}:{lineno}", line))
    if not out:
        raise WorkloadError(f"{path}: the trace has no coflows")
    return racks, out


def _parse_line(line: str, racks: int, mapping: Callable[[int], str], where: str) -> Coflow:
    cid, arrival_ms, mappers, reducers = parse_fields(line, racks, where)
    flows = []
    for j, (rrack, mb) in enumerate(reducers):
        per_flow = max(MB_BYTES, mb * MB_BYTES / len(mappers))
        for i, mrack in enumerate(mappers):
            try:
                src, dst = mapping(mrack), mapping(rrack)
            except WorkloadError as exc:
                raise WorkloadError(f"{where}: {exc}") from exc
            flows.append(Flow(f"m{i}r{j}", src, dst, per_flow))
    return Coflow(cid, arrival_ms / 1000.0, flows)


def parse_fields(
    line: str, racks: int, where: str
) -> tuple[str, float, list[int], list[tuple[int, float]]]:
    """Split and check one coflow line of a trace with `racks` racks.

    Returns:
        (coflow id, arrival in ms, mapper racks, [(reducer rack, MB)]) in file order.

    Raises:
        WorkloadError: naming `where`, for wrong counts, non-numeric fields, an arrival
            that is not a finite number >= 0, a rack outside 0..racks-1 or a reducer size
            that is not > 0 with a finite number of bytes (MB x 1,048,576).
    """
    tok = line.split()
    try:
        cid, arrival_ms, n_map = tok[0], float(tok[1]), int(tok[2])
        mappers = [int(t) for t in tok[3 : 3 + n_map]]
        n_red = int(tok[3 + n_map])
        reducers = [_reducer(t) for t in tok[4 + n_map :]]
    except (IndexError, ValueError) as exc:
        raise WorkloadError(f"{where}: malformed coflow line: {exc}") from exc
    if n_map < 1 or len(mappers) != n_map:
        raise WorkloadError(f"{where}: expected {n_map} mapper racks")
    if n_red < 1 or len(reducers) != n_red:
        raise WorkloadError(f"{where}: expected {n_red} reducers, found {len(reducers)}")
    if not (math.isfinite(arrival_ms) and arrival_ms >= 0):
        raise WorkloadError(f"{where}: arrival must be a finite number >= 0 ms, got {arrival_ms}")
    for j, (_, mb) in enumerate(reducers):
        if not (math.isfinite(mb * MB_BYTES) and mb > 0):  # 1e308 MB: finite, not in bytes
            raise WorkloadError(
                f"{where}: reducer {j} size must be a number of MB > 0 whose bytes "
                f"(x {MB_BYTES}) are finite, got {mb}"
            )
    for rack in [*mappers, *(r for r, _ in reducers)]:
        if not 0 <= rack < racks:
            raise WorkloadError(f"{where}: rack {rack} outside 0..{racks - 1}")
    return cid, arrival_ms, mappers, reducers


def _reducer(token: str) -> tuple[int, float]:
    rack, _, mb = token.partition(":")
    if not mb:
        raise ValueError(f"reducer {token!r} is not '<rack>:<MB>'")
    return int(rack), float(mb)


def _ints(tokens: list[str], n: int, where: str) -> list[int]:
    try:
        if len(tokens) != n:
            raise ValueError(f"expected {n} fields")
        return [int(t) for t in tokens]
    except ValueError as exc:
        raise WorkloadError(f"{where}: {exc}") from exc
