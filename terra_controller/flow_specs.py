"""What agents are told about flows: a WAN flow's descriptor (FlowSpec) and the cutting of
descriptors and rates into control messages of bounded size (docs/design.md section 6).
"""

from __future__ import annotations

import msgpack

from terra_controller.coflow_state import CoflowState, FlowState, coflow_key
from terra_security.integrity import ALGORITHM
from terra_wire import control as protocol

BATCH_BYTES = 48 * 1024  # encoded entries per control message (headers stay below 64 KiB)


def flow_spec(coflow: CoflowState, f: FlowState, digest_alg: str = ALGORITHM) -> protocol.FlowSpec:
    """The descriptor agents get for a WAN flow: offset = bytes acknowledged so far,
    attempt = the flow's restarts, digest_key = the attempt's flow key, digest_alg = the
    deployment's leaf-MAC construction (AgentChannel.leaf_mac), "file:PATH" source / sink when
    it names paths."""
    return protocol.FlowSpec(
        coflow=coflow_key(coflow.id),
        flow=f.id,
        src_agent=f.src_agent,
        dst_agent=f.dst_agent,
        dst_dc=f.dst_dc,
        size=f.bytes,
        offset=min(f.delivered, f.bytes),
        source=f"file:{f.src_path}" if f.src_path else "synthetic",
        sink=f"file:{f.dst_path}" if f.dst_path else "digest",
        attempt=f.restarts,
        digest_key=f.digest_key,
        digest_alg=digest_alg,
    )


_SPEC_OVERHEAD = 256  # a FlowSpec's msgpack keys, ints, digest key and type bytes, at most


def spec_bytes(spec: protocol.FlowSpec) -> int:
    """An upper bound of a FlowSpec's msgpack encoding in bytes (no encoding needed)."""
    text = spec.coflow + spec.flow + spec.src_agent + spec.dst_agent + spec.dst_dc
    text += spec.source + spec.sink
    return _SPEC_OVERHEAD + (len(text) if text.isascii() else 4 * len(text))


def sized_batches(entries: list[tuple[object, int]], limit: int) -> list[list]:
    """Split (item, encoded bytes) entries into lists of items of at most `limit` bytes (a
    larger item travels alone)."""
    out: list[list] = []
    size = limit
    for item, n in entries:
        if size + n > limit:
            out.append([])
            size = 0
        out[-1].append(item)
        size += n
    return out


def batches(items: list, limit: int = BATCH_BYTES) -> list[list]:
    """Split FlowSpecs / GroupRates into lists whose msgpack encoding stays under `limit`
    bytes (a single larger item travels alone; the registry bounds their size)."""
    sized = [
        (item, spec_bytes(item))
        if isinstance(item, protocol.FlowSpec)
        else (item, len(msgpack.packb(item.to_dict(), use_bin_type=True)))
        for item in items
    ]
    return sized_batches(sized, limit)
