"""The operator console's views beyond the plain listings: agents and one coflow's flows.

`agent_rows` answers REST /agents (every registered agent, its DC, when it was last heard
of and the flows it sends or receives now); `flow_paths` adds to a coflow's status the
paths each flow uses now, with their tunnel ids and rates (REST /coflows/{id});
`link_coflows` names the coflows on each link (REST /links); `CoflowListing` renders REST
/coflows (every coflow in memory) reusing the JSON of done coflows. They read
the controller on its owner loop briefly and cost O(active flows) / O(the coflow's flows).
"""

from __future__ import annotations

import json
import time

from terra_model.states import CoflowStatus


def agent_rows(controller, channel) -> dict:
    """{"agents": [{"id", "dc", "data_addr", "connected": bool, "last_seen": wall-clock
    UNIX s of its last control message (None if never heard from since the controller
    started), "sending" / "receiving": unfinished WAN flows of active coflows it is the
    sender / receiver of, "coflows": ids of those coflows}]}, sorted by agent id.

    Args:
        controller: the Controller. channel: the AgentChannel or None (no connections:
            every agent disconnected, last_seen None).
    """
    now = time.time()
    rows = controller.owner.run(_agent_rows_now, controller, channel)
    for row in rows.values():
        row["coflows"] = sorted(row["coflows"])
        if row["last_seen"] is not None:
            row["last_seen_s"] = max(0.0, now - row["last_seen"])
    return {"agents": [rows[k] for k in sorted(rows)]}


def _agent_rows_now(controller, channel) -> dict[str, dict]:
    """agent_rows' rows, copied on the controller's loop."""
    seen: dict[str, float] = {}
    connected: set[str] = set()
    if channel is not None:
        seen.update(channel.last_seen)
        for agent, conn in channel.connections.items():
            connected.add(agent)
            seen[agent] = conn.last_seen
    reg = controller.registry
    rows = {
        a.id: {"id": a.id, "dc": a.dc, "data_addr": a.data_addr, "connected": a.id in connected,
               "last_seen": seen.get(a.id), "last_seen_s": None, "sending": 0,
               "receiving": 0, "coflows": set()}
        for a in reg.agents.values()
    }  # fmt: skip
    for coflow in reg.active():
        for f in coflow.flows.values():
            if f.intra_dc or f.done or f.ended:
                continue
            for agent, key in ((f.src_agent, "sending"), (f.dst_agent, "receiving")):
                row = rows.get(agent)
                if row is not None:
                    row[key] += 1
                    row["coflows"].add(coflow.id)
    return rows


def flow_paths(controller, channel, status: dict) -> dict:
    """`status` (a coflow's status map) with "paths": [{"path": [DC, ...], "tunnel": id or
    None (no tunnel table, or a path without a tunnel), "rate_bytes_per_s"}] added to
    each of its "flows": the paths the last round gave the flow (empty: paused or
    finished). Returns `status`."""

    def copy() -> tuple[dict[tuple, int], dict]:
        tunnel_of: dict[tuple, int] = {}
        if channel is not None and channel.tunnels is not None:
            tunnel_of = {p: tid for p, (tid, _) in channel.tunnels.by_path.items()}
        return tunnel_of, dict(controller.rates.get(status["id"], {}))

    tunnel_of, rates = controller.owner.run(copy)
    for flow in status.get("flows", []):
        flow["paths"] = [
            {"path": list(path), "tunnel": tunnel_of.get(tuple(path)), "rate_bytes_per_s": rate}
            for path, rate in rates.get(flow["id"], [])
        ]
    return status


def link_coflows(controller) -> dict[tuple[str, str], list[int]]:
    """{directed link: sorted ids of the coflows the last round gave a rate > 0 across it}
    (REST /links "coflows"); O(active flows' paths)."""
    out: dict[tuple[str, str], set[int]] = {}

    def walk() -> None:
        for cid, flows in controller.rates.items():
            for paths in flows.values():
                for path, rate in paths:
                    if rate <= 0:
                        continue
                    for link in zip(path[:-1], path[1:], strict=False):
                        out.setdefault(link, set()).add(cid)

    controller.owner.run(walk)
    return {link: sorted(ids) for link, ids in out.items()}


def to_json(value) -> bytes:
    """`value` as JSON bytes (sets and tuples as lists, other non-JSON values as strings),
    as every REST answer is encoded."""
    text = json.dumps(value, default=lambda v: list(v) if isinstance(v, set | tuple) else str(v))
    return text.encode()


class CoflowListing:
    """The JSON of REST /coflows: the summary (CoflowState.summary()) of every coflow in
    memory, in submission order.

    A done coflow's summary never changes again, so its JSON is made once and kept (ids are
    never reused); a request then encodes only the coflows that are not done, and the
    controller's loop walks the ids and makes those encodings (about 1 ms for
    10,000 done coflows, instead of a summary and an encoding each; benchmarks/rest_latency.py).
    Entries of coflows dropped from memory are forgotten once they outnumber the kept ones.
    """

    def __init__(self, controller) -> None:
        self.controller = controller
        self.done: dict[int, bytes] = {}

    def render(self) -> bytes:
        """The JSON array (bytes)."""
        parts: list[bytes] = []
        self.controller.owner.run(self._walk, parts)
        return b"[" + b", ".join(parts) + b"]"

    def _walk(self, parts: list[bytes]) -> None:
        """Append each coflow's JSON to `parts` (on the controller's loop)."""
        done = self.done
        coflows = self.controller.registry.coflows
        for cid, coflow in coflows.items():
            part = done.get(cid)
            if part is None:
                part = to_json(coflow.summary())
                if coflow.state is CoflowStatus.DONE:
                    done[cid] = part
            parts.append(part)
        if len(done) > 2 * len(coflows) + 100:
            self.done = {cid: b for cid, b in done.items() if cid in coflows}
