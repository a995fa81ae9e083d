"""The operator's link states and capacities survive a SIGKILL of the controller: a lone
controller restarted on the same --state-dir, and a standby elected leader on etcd, show the
same link states and capacities on REST /links and schedule the next coflow around them.

Real processes on loopback: the systems of test_controller_e2e.py (a lone controller and
three agents) and test_controller_ha.py (a one-member etcd, two controllers, three agents).
"""

from __future__ import annotations

import json
import urllib.request

import pytest
from test_controller_e2e import System, assert_digests, flow, wait_until
from test_controller_ha import Cluster

from terra_controller.client import TerraClient
from terra_security.pki import client_context

MB = 1_000_000
SLOW = 10 * MB  # bytes/s the operator gives link A-C (the topology's default: 20 MB/s)


def set_links(client: TerraClient) -> None:
    """The operator takes A-B down and slows A-C down."""
    assert client.set_link_state("A", "B", False) is True
    client.set_capacity("C", "A", SLOW)


def rest_get(pki, rest_port: int, path: str):
    ctx = client_context(pki, "operator1")
    ctx.check_hostname = False
    url = f"https://127.0.0.1:{rest_port}{path}"
    with urllib.request.urlopen(url, timeout=5, context=ctx) as reply:
        return json.loads(reply.read())


def check_links_and_routing(pki, rest_port: int, client: TerraClient) -> None:
    """/links shows A-B down and A-C at SLOW; a coflow from A to B goes by C at SLOW."""
    links = {(r["a"], r["b"]): r for r in rest_get(pki, rest_port, "/links")["links"]}
    assert links[("A", "B")]["state"] == links[("B", "A")]["state"] == "down"
    assert links[("A", "C")]["capacity_bytes_per_s"] == SLOW
    assert links[("C", "A")]["capacity_bytes_per_s"] == SLOW
    assert links[("B", "C")]["state"] == "up" and links[("B", "C")]["capacity_bytes_per_s"] > SLOW
    cid = client.submit_coflow([flow("x", "a1", "b1", 30 * MB)], name="around")

    def paths() -> dict:
        groups = rest_get(pki, rest_port, f"/coflows/{cid}")["flowgroups"]
        return {tuple(p["path"]): p["rate_bytes_per_s"] for g in groups for p in g["paths"]}

    wait_until(lambda: bool(paths()), 30, "rates for the coflow")
    got = paths()
    assert list(got) == [("A", "C", "B")], got
    assert got[("A", "C", "B")] == pytest.approx(SLOW, rel=1e-6)
    assert_digests(client.wait(cid, timeout=60))


def test_a_lone_controller_restarted_on_its_state_dir_keeps_the_operators_links(tmp_path, pki):
    system = System(tmp_path, pki)
    try:
        set_links(system.client)
        system.ctl.kill()  # SIGKILL: nothing written at exit
        system.ctl.wait(timeout=10)
        system.start_controller()
        system.wait_agents(30)
        rest_port = int(system.rest.rsplit(":", 1)[1])
        check_links_and_routing(pki, rest_port, system.client)
    finally:
        system.stop()


def test_a_new_leader_after_a_failover_keeps_the_operators_links(tmp_path, pki):
    cluster = Cluster(tmp_path, pki)
    try:
        cluster.start_controller(0)
        cluster.ready(0, 60)
        cluster.start_controller(1)
        cluster.start_agents()
        first = cluster.client(0)
        set_links(first)
        first.close()
        cluster.controllers[0].kill()  # SIGKILL: its lease simply expires
        cluster.ready(1, 60)
        second = cluster.client(1)
        connected = lambda: sum(a["connected"] for a in second.list_agents()["agents"])  # noqa: E731
        wait_until(lambda: connected() == 3, 30, "agents on the new leader")
        check_links_and_routing(pki, cluster.addrs[1]["rest"], second)
        second.close()
    finally:
        cluster.stop()
