"""The triangle WAN of the tests with switches: DCs A, B, C, 20 Mbit/s links, and its switch
binding (topologies.binding.make_binding: DPIDs, WAN ports, hosts) in the same file."""

from __future__ import annotations

import json
from pathlib import Path

from topologies.binding import make_binding
from topologies.loaders import load_json_topology


def bound_triangle(directory: Path) -> Path:
    """Write `directory`/triangle.json (20 Mbit/s HTB links: 2.5 MB/s) with its binding and
    return its path."""
    doc = {"name": "triangle", "default_capacity_gbps": 0.02, "dcs": ["A", "B", "C"],
           "links": [{"a": "A", "b": "B"}, {"a": "B", "b": "C"}, {"a": "A", "b": "C"}]}  # fmt: skip
    path = directory / "triangle.json"
    path.write_text(json.dumps(doc))
    doc.update(make_binding(load_json_topology(path)))
    path.write_text(json.dumps(doc))
    return path
