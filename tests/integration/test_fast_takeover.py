"""A takeover shorter than the leader's lease (terra_controller/takeover.py): a standby that
sees the leader's kernel close its liveness connection revokes the leader's lease and leads
before the lease would have expired; a partition or a standby's restart revokes nothing; a
live leader whose lease was revoked stops acting at once.

Real processes on loopback: a one-member etcd and two `terra-controller --etcd` processes
(test_controller_ha.py's Cluster), a 5 s lease so that "before the lease would have
expired" leaves seconds of margin; the partition test holds a liveness connection through a
TCP relay this test owns.
"""

from __future__ import annotations

import threading
import time

import pytest
from test_controller_e2e import wait_until
from test_controller_ha import Cluster

from benchmarks.tcp_relay import TcpRelay
from terra_controller.etcd_state import EtcdState, parse_endpoints
from terra_controller.takeover import LeaderFollower, LivenessServer

LEASE_S = 5


@pytest.fixture
def cluster(tmp_path, pki):
    c = Cluster(tmp_path, pki, extra=("--lease-ttl", str(LEASE_S)))
    c.state = EtcdState(parse_endpoints(c.etcd_addr), "failover")
    yield c
    c.stop()


def time_to_live(state: EtcdState, lease: int) -> dict:
    """etcd's LeaseTimeToLive of `lease`: {"TTL": whole seconds left (-1: gone),
    "grantedTTL"}."""
    reply = state._call(lambda c: c.post(c.get_url("/kv/lease/timetolive"), json={"ID": lease}))
    return {"TTL": int(reply.get("TTL", -1)), "grantedTTL": int(reply.get("grantedTTL", 0))}


def leader_and_standby(cluster: Cluster) -> dict:
    """Controller 0 leads, 1 stands by and holds its liveness connection; the leader key."""
    cluster.start_controller(0)
    cluster.ready(0, 60)
    cluster.start_controller(1)
    leader_api = f"127.0.0.1:{cluster.addrs[0]['api']}"
    wait_until(lambda: (cluster.health(1) or {}).get("leader") == leader_api, 20, "standby")
    holding(cluster, 1, 1)
    key = cluster.state.leader()
    assert isinstance(key["lease"], int) and key["liveness"].startswith("127.0.0.1:")
    return key


def log_of(cluster: Cluster, i: int) -> str:
    return (cluster.workdir / f"controller{i}.log").read_text(errors="replace")


def holding(cluster: Cluster, i: int, times: int) -> None:
    """Wait until standby i logged holding a leader's liveness connection `times` times."""
    line = "holding the liveness connection of leader"
    wait_until(lambda: log_of(cluster, i).count(line) >= times, 60, "the liveness connection")


def test_a_killed_leader_is_replaced_before_its_lease_would_expire(cluster):
    key = leader_and_standby(cluster)
    cluster.controllers[1].kill()  # a standby's restart revokes nothing
    cluster.controllers[1].wait()
    cluster.start_controller(1)
    holding(cluster, 1, 2)  # the restarted standby holds it again
    assert cluster.state.leader()["lease"] == key["lease"]
    assert cluster.health(0)["role"] == "leader"
    asked = time.monotonic()
    ttl = time_to_live(cluster.state, key["lease"])
    assert ttl["grantedTTL"] == LEASE_S and ttl["TTL"] >= 2, ttl
    expires_earliest = asked + ttl["TTL"]  # etcd rounds the seconds left down
    cluster.controllers[0].kill()  # SIGKILL: its kernel closes the liveness connection
    killed = time.monotonic()
    while (cluster.state.leader() or {}).get("lease") in (None, key["lease"]):
        assert time.monotonic() < killed + 3 * LEASE_S, "no new leader"
        time.sleep(0.01)
    elected = time.monotonic()
    assert elected < expires_earliest, (elected - killed, ttl)
    assert time_to_live(cluster.state, key["lease"])["TTL"] == -1  # revoked
    cluster.ready(1, 60)
    assert cluster.health(1)["role"] == "leader"
    assert "revoked the lease of leader" in log_of(cluster, 1)
    print(f"new leader elected {elected - killed:.3f} s after the kill; the old lease had "
          f">= {expires_earliest - killed:.1f} s left")  # fmt: skip


def test_a_live_leader_whose_lease_is_revoked_stops_acting(cluster):
    key = leader_and_standby(cluster)
    cluster.start_agents()
    client = cluster.client(0)
    connected = lambda: sum(a["connected"] for a in client.list_agents()["agents"])  # noqa: E731
    wait_until(lambda: connected() == 3, 30, "agents at the first leader")
    client.close()
    roles: list[tuple[str | None, str | None]] = []
    stop = threading.Event()

    def watch_roles() -> None:
        while not stop.is_set():
            roles.append(((cluster.health(0) or {}).get("role"),
                          (cluster.health(1) or {}).get("role")))  # fmt: skip

    watcher = threading.Thread(target=watch_roles, daemon=True)
    watcher.start()
    cluster.state.revoke(key["lease"])  # as a standby would; the leader still runs
    try:
        cluster.ready(1, 60)
        second = cluster.client(1)
        wait_until(lambda: sum(a["connected"] for a in second.list_agents()["agents"]) == 3,
                   30, "agents at the new leader")  # fmt: skip
        second.close()
    finally:
        stop.set()
        watcher.join()
    assert "leadership lost: the leader key is gone" in log_of(cluster, 0)
    assert ("leader", "leader") not in roles
    assert cluster.controllers[0].poll() is None  # it runs on, as a standby
    wait_until(lambda: (cluster.health(0) or {}).get("role") == "standby", 30, "standby")
    assert cluster.state.leader()["id"] != key["id"]


def test_only_a_closed_liveness_connection_counts_as_a_death():
    server = LivenessServer("127.0.0.1", 0)
    server.serve(lease=42)
    relay = TcpRelay(f"127.0.0.1:{server.bound[1]}")
    closed: list[dict] = []
    follower = LeaderFollower(closed.append)
    leader = {"id": "x", "lease": 42, "liveness": relay.addr}
    try:
        follower.follow({**leader, "lease": 41})  # a hello naming another lease: no hold
        time.sleep(0.5)
        follower.follow(leader)
        wait_until(lambda: server.peers >= 1, 5, "held")
        time.sleep(0.5)
        relay.cut()  # a partition: silence, no FIN
        time.sleep(2.0)
        assert closed == []
        follower.follow(None)  # the standby stops following (it leads, or restarts)
        time.sleep(1.0)
        assert closed == []
        relay.heal()
        follower.follow(leader)
        wait_until(lambda: server.peers >= 1, 5, "held again")
        time.sleep(0.5)
        server.close()  # what the leader's process death does to its sockets
        wait_until(lambda: closed == [leader], 5, "the close seen")
    finally:
        follower.follow(None)
        relay.close()
        server.close()
