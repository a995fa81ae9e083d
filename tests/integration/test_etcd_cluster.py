"""The throw-away etcd of tests, benchmarks and the testbed: a member whose port another
process takes between pick and bind is started again on new ports, and an etcd that cannot
start says why (its log's last lines), not only where its logs are.

Real etcd processes; the port is taken by a socket this test holds.
"""

from __future__ import annotations

import socket
import time

import pytest

from mininet_scenarios import etcd_cluster
from mininet_scenarios.etcd_cluster import etcd_healthy, start_etcd
from mininet_scenarios.ports import free_port, free_port_block


@pytest.fixture
def taken_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen()
    yield s.getsockname()[1]
    s.close()


def _stop(procs) -> None:
    for p in procs:
        p.kill()
        p.wait()


def test_a_member_whose_port_was_taken_starts_again_on_new_ports(tmp_path, monkeypatch, taken_port):
    picks = []

    def first_pick_taken(host):
        picks.append(taken_port if not picks else free_port(host))
        return picks[-1]  # the first try's client port is taken

    monkeypatch.setattr(etcd_cluster, "free_port", first_pick_taken)
    procs, addrs = start_etcd(tmp_path, 1)
    try:
        assert len(picks) == 4
        assert addrs == [f"127.0.0.1:{picks[2]}"]
        assert etcd_healthy(addrs[0], 5)
        assert "address already in use" in (tmp_path / "try0" / "etcd-0.log").read_text()
    finally:
        _stop(procs)


def test_an_etcd_that_cannot_start_says_why(tmp_path, monkeypatch, taken_port):
    monkeypatch.setattr(etcd_cluster, "free_port", lambda host: taken_port)
    with pytest.raises(RuntimeError, match="m0 exited: .*address already in use"):
        start_etcd(tmp_path, 1)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["try0", "try1", "try2"]


def test_a_process_is_never_handed_the_same_port_twice():
    picks = [free_port() for _ in range(300)] + [
        free_port_block("127.0.0.1", 3) + i for _ in range(30) for i in range(3)
    ]
    assert len(set(picks)) == len(picks)


def test_a_second_member_that_exits_is_retried_without_waiting_for_the_first(
    tmp_path, monkeypatch, taken_port
):
    picks = []

    def second_members_port_taken(host):
        picks.append(taken_port if len(picks) == 2 else free_port(host))
        return picks[-1]  # the first try's m1 client port is taken

    monkeypatch.setattr(etcd_cluster, "free_port", second_members_port_taken)
    start = time.monotonic()
    procs, addrs = start_etcd(tmp_path, 2, timeout_s=60)
    try:
        assert len(picks) == 8 and len(addrs) == 2
        assert time.monotonic() - start < 30  # not the first try's whole timeout
        assert all(etcd_healthy(addr, 5) for addr in addrs)
    finally:
        _stop(procs)
