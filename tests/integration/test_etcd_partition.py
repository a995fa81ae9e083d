"""A controller cut off from etcd never acts as the leader, while the others go on.

Real processes on loopback: a one-member etcd and two `terra-controller --etcd` processes
(test_controller_ha.py's Cluster, no agents); one of them reaches etcd only through a TCP
relay this test owns. Cutting the relay drops every byte both ways (a partition: requests
time out, nothing is refused), healing it resets the connections it held.
"""

from __future__ import annotations

import time

import pytest
from test_controller_e2e import wait_until
from test_controller_ha import Cluster

from benchmarks.tcp_relay import TcpRelay
from terra_controller.leadership import LEASE_TTL_S
from terra_controller.transport import connect_tls, read_message
from terra_security.pki import client_context
from terra_wire.api import API_VERSION, pack_message


@pytest.fixture
def cluster(tmp_path, pki):
    c = Cluster(tmp_path, pki)
    relay = TcpRelay(c.etcd_addr)
    c.relay = relay
    yield c
    c.stop()
    relay.close()


def start(cluster: Cluster, i: int, through_relay: bool) -> None:
    direct = cluster.etcd_addr
    if through_relay:
        cluster.etcd_addr = cluster.relay.addr
    try:
        cluster.start_controller(i)
    finally:
        cluster.etcd_addr = direct


def role(cluster: Cluster, i: int) -> str | None:
    return (cluster.health(i) or {}).get("role")


def refuses_as_standby(cluster: Cluster, i: int) -> None:
    """Controller i's coflow API answers a request with "not_leader" (asked directly: a
    TerraClient would follow it to the leader it names)."""
    context = client_context(cluster.pki, "operator1")
    with connect_tls("127.0.0.1", cluster.addrs[i]["api"], context, 5) as sock:
        sock.sendall(pack_message({"v": API_VERSION, "op": "list", "req": 1}))
        reply = read_message(sock)
    assert reply["ok"] is False and reply["code"] == "not_leader", reply


def test_a_standby_cut_off_from_etcd_never_leads_and_rejoins_as_a_standby(cluster):
    start(cluster, 0, through_relay=False)
    cluster.ready(0, 60)
    start(cluster, 1, through_relay=True)
    leader_api = f"127.0.0.1:{cluster.addrs[0]['api']}"
    wait_until(lambda: (cluster.health(1) or {}).get("leader") == leader_api, 20, "standby")
    cluster.relay.cut()
    end = time.monotonic() + 4 * LEASE_TTL_S  # past any lease the standby could have seen end
    while time.monotonic() < end:
        assert role(cluster, 1) == "standby"
        assert role(cluster, 0) == "leader"
        time.sleep(0.2)
    refuses_as_standby(cluster, 1)
    leader = cluster.client(0)
    assert leader.list_coflows() == []  # the leader answers as the leader all along
    leader.close()
    cluster.relay.heal()
    wait_until(lambda: (cluster.health(1) or {}).get("leader") == leader_api, 20, "rejoined")
    assert role(cluster, 1) == "standby" and role(cluster, 0) == "leader"
    refuses_as_standby(cluster, 1)
    # it is a working standby again: it takes over when the leader is killed
    cluster.controllers[0].kill()
    cluster.ready(1, 60)
    assert role(cluster, 1) == "leader"


def test_a_leader_cut_off_from_etcd_stops_leading_before_the_standby_takes_over(cluster):
    start(cluster, 0, through_relay=True)
    cluster.ready(0, 60)
    start(cluster, 1, through_relay=False)
    wait_until(lambda: role(cluster, 1) == "standby", 20, "standby")
    cluster.relay.cut()
    cut = time.monotonic()
    stepped_down = took_over = None
    while time.monotonic() - cut < 10 * LEASE_TTL_S and took_over is None:
        second = role(cluster, 1)  # asked first: once it leads, it leads on
        first = role(cluster, 0)
        assert not (second == "leader" and first == "leader"), "two leaders"
        now = time.monotonic() - cut
        if stepped_down is None and first != "leader":
            stepped_down = now
        if second == "leader":
            took_over = now
        time.sleep(0.05)
    assert stepped_down is not None and stepped_down <= LEASE_TTL_S + 1.5
    assert took_over is not None and took_over >= stepped_down
    cluster.ready(1, 60)
    wait_until(lambda: role(cluster, 0) == "standby", 30, "the old leader back as a standby")
    refuses_as_standby(cluster, 0)
    cluster.relay.heal()
    new_api = f"127.0.0.1:{cluster.addrs[1]['api']}"
    wait_until(lambda: (cluster.health(0) or {}).get("leader") == new_api, 20, "rejoined")
    assert role(cluster, 0) == "standby" and role(cluster, 1) == "leader"
    print(f"old leader stepped down {stepped_down:.2f} s after the cut, standby led at "
          f"{took_over:.2f} s")  # fmt: skip
