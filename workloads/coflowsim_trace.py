"""A coflow-benchmark trace read the way CoflowSim reads it (docs/design.md sections 7, 8).

CoflowSim (github.com/coflow/coflowsim: CoflowBenchmarkTraceProducer, Job, ReduceTask,
Simulator) turns a trace line into a coflow differently from `fb_trace.load_fb_trace`:

- Racks: the mappers of one rack become one mapper and the reducers of one rack one
  reducer with their bytes summed (Job.coalesceMappers / coalesceReducers).
- Bytes: each reducer's MB are rounded up to whole MiB (ReduceTask's constructor), the
  rack's sum then up to a multiple of the mapper count in MiB (roundToNearestNMB), and
  split equally over the mappers (createFlows): every flow is a whole number of MiB.
- Admission: coflows are admitted at the start of 10,240-ms epochs (Simulator.simulate
  with CoflowSim's 10 x 1024-ms step): a coflow arriving at t ms is admitted, and its CCT
  counted, from max(0, ceil(t / 10240) - 1) x 10240 ms, the start of the epoch that
  admits every coflow arriving up to its end (inclusive).
- Ports: a flow whose mapper and reducer share a rack still uses that rack's uplink and
  downlink; here a flow leaves its mapper rack's sending node and enters its reducer
  rack's receiving node (`send_dc`, `recv_dc`: topologies.bigswitch's split fabric), so
  no flow is intra-DC.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path

from terra_model.coflow import Coflow, Flow, WorkloadError
from workloads.fb_trace import MB_BYTES, parse_fields, read_trace

EPOCH_MS = 10_240  # CoflowSim's admission epoch: 10 simulated "seconds" of 1024 ms


def epoch_start_ms(arrival_ms: float) -> float:
    """The time (ms) CoflowSim admits a coflow arriving at `arrival_ms` (>= 0): the start
    of the epoch [T, T + 10240] holding it, T a multiple of 10240 (T = 0 up to 10240
    inclusive, then T = 10240 up to 20480, ...)."""
    return max(0, math.ceil(arrival_ms / EPOCH_MS) - 1) * EPOCH_MS


def reducer_bytes(mb: list[float], mappers: int) -> int:
    """Bytes CoflowSim gives a reducer rack receiving the reducers of `mb` (MB each, > 0)
    from `mappers` mapper racks: each rounded up to whole MiB, summed, then rounded up to
    a multiple of `mappers` MiB (ReduceTask.roundToNearestNMB). E.g. [1.5, 2] from 3
    mappers: 2 + 2 = 4 MiB, up to 6 MiB (3 flows of 2 MiB)."""
    total = sum(_round_up(int(m * MB_BYTES), MB_BYTES) for m in mb)
    return _round_up(total, mappers * MB_BYTES)


def _round_up(value: int, unit: int) -> int:
    return -(-value // unit) * unit


def load_coflowsim_trace(
    path: Path | str,
    send_dc: Callable[[int], str],
    recv_dc: Callable[[int], str],
    limit: int | None = None,
) -> list[Coflow]:
    """Parse a coflow-benchmark trace into coflows as CoflowSim simulates them (module
    docstring).

    Args:
        path: the trace file.
        send_dc: mapper rack -> the DC its flows leave from.
        recv_dc: reducer rack -> the DC its flows enter (distinct from every send_dc, so
            flows within a rack use both of the rack's ports).
        limit: keep only the first `limit` coflows.

    Returns:
        Coflows in file order, ids as in the trace, arrival = the admitting epoch's start
        in seconds; one flow ``"m<i>r<j>"`` per (mapper rack i, reducer rack j) in order of
        first appearance, of reducer_bytes / mapper racks bytes.

    Raises:
        WorkloadError: as load_fb_trace (names the file and line), a rack the mappings
            reject, or reducers of one rack whose bytes sum beyond a float.
    """
    path = Path(path)
    racks, lines = read_trace(path, limit)
    return [_coflow(line, racks, send_dc, recv_dc, where) for where, line in lines]


def _coflow(line: str, racks: int, send_dc, recv_dc, where: str) -> Coflow:
    cid, arrival_ms, mappers, reducers = parse_fields(line, racks, where)
    mapper_racks = list(dict.fromkeys(mappers))
    by_rack: dict[int, list[float]] = {}
    for rack, mb in reducers:
        by_rack.setdefault(rack, []).append(mb)
    flows = []
    try:
        for j, (rrack, mbs) in enumerate(by_rack.items()):
            try:
                per_flow = reducer_bytes(mbs, len(mapper_racks)) / len(mapper_racks)
            except OverflowError:  # reducers of one rack summing beyond a float
                raise WorkloadError(
                    f"reducers of rack {rrack}: {sum(mbs):g} MB in all, too large"
                ) from None
            dst = recv_dc(rrack)
            for i, mrack in enumerate(mapper_racks):
                flows.append(Flow(f"m{i}r{j}", send_dc(mrack), dst, float(per_flow)))
    except WorkloadError as exc:
        raise WorkloadError(f"{where}: {exc}") from exc
    return Coflow(cid, epoch_start_ms(arrival_ms) / 1000.0, flows)
