"""docs/operations.md documents every field the REST views return (names with units)."""

from __future__ import annotations

import re
from pathlib import Path

from terra_controller.agent_channel import AgentChannel
from terra_controller.controller import Controller
from terra_controller.rest import RestApp
from terra_controller.tunnel_table import TunnelTable
from terra_core.terra_policy import TerraPolicy
from topologies import Topology

DOC = (Path(__file__).resolve().parents[2] / "docs" / "operations.md").read_text()
NAME = r"[a-z_][a-z0-9_]*"
DOCUMENTED = set(re.findall(rf"`({NAME})`", DOC)) | {
    name for span in re.findall(r"`([^`]*)`", DOC) for name in re.findall(rf'"({NAME})"', span)
}


def app_with_a_coflow() -> tuple[RestApp, int]:
    links = {}
    for u, v in [("A", "B"), ("B", "C"), ("A", "C")]:
        links[(u, v)] = links[(v, u)] = 1e8
    topology = Topology("tri", ["A", "B", "C"], links)
    controller = Controller(topology, TerraPolicy(topology, k=2))
    for agent, dc in [("a1", "A"), ("b1", "B")]:
        controller.registry.register_agent(agent, dc, "127.0.0.1:30000")
    app = RestApp(controller, AgentChannel(controller, TunnelTable(topology, 2)))
    cid = controller.submit([{"id": "f", "src": "a1", "dst": "b1", "bytes": 10**9}])
    controller.run_round()
    return app, cid


def test_every_rest_field_is_documented():
    app, cid = app_with_a_coflow()
    status, links, tunnels, coflow = app.status(), app.links(), app.tunnels(), app.coflow(cid)
    rows = [
        status, *status["agents"], *links["links"], app.topology(), tunnels,
        *tunnels["tunnels"], *app.coflows(), coflow, *coflow["flows"], *coflow["flowgroups"],
        *[p for g in coflow["flowgroups"] for p in g["paths"]],
    ]  # fmt: skip
    fields = {key for row in rows for key in row}
    assert {"a", "b", "capacity_bytes_per_s", "rate_bytes_per_s", "bytes_remaining"} <= fields
    missing = sorted(fields - DOCUMENTED)
    assert not missing, f"fields not in docs/operations.md: {missing}"


def test_units_are_in_the_names():
    """Rates and sizes say their unit: no bare "rate", "capacity", "allocated", "delivered"."""
    app, cid = app_with_a_coflow()
    coflow = app.coflow(cid)
    rows = [*app.links()["links"], *coflow["flows"], *coflow["flowgroups"]]
    for row in rows:
        assert not {"rate", "capacity", "allocated", "delivered", "remaining"} & set(row)


def test_the_systemd_units_shipped_are_the_documented_ones_and_fit_the_caps():
    """deploy/systemd/ holds the units docs/operations.md shows, and the controller's file
    limit leaves its servers their full caps (connection_caps.caps_for_file_limit)."""
    from terra_controller.connection_caps import caps_for_file_limit
    from terra_controller.transport import MAX_CONNECTIONS, REST_CAP

    deploy = Path(__file__).resolve().parents[2] / "deploy" / "systemd"
    units = dict(re.findall(r"`/etc/systemd/system/(terra-[^`]+)`.*?```ini\n(.*?)```", DOC, re.S))
    assert set(units) == {"terra-controller.service", "terra-agent@.service"}
    assert {p.name for p in deploy.iterdir()} == set(units)
    for name, body in units.items():
        assert (deploy / name).read_text() == body, f"deploy/systemd/{name} differs from the doc"
        assert re.search(r"^LimitNOFILE=\d+$", body, re.M), f"{name} sets no file limit"
    limit = int(re.search(r"^LimitNOFILE=(\d+)$", units["terra-controller.service"], re.M)[1])
    caps = caps_for_file_limit(limit)
    assert caps["api"][0] == caps["agents"][0] == MAX_CONNECTIONS
    assert caps["rest"] == REST_CAP
    assert f"LimitNOFILE={limit}" in DOC and str(MAX_CONNECTIONS) in DOC
