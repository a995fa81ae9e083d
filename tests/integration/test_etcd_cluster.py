"""The throw-away etcd of tests, benchmarks and the testbed: a member whose port another
process takes between pick and bind is started again on new ports, and an etcd that cannot
start says why (its log's last lines), not only where its logs are.

Real etcd processes; the port is taken by a socket this test holds.
"""

from __future__ import annotations

import socket

import pytest

from mininet_scenarios import etcd_cluster
from mininet_scenarios.etcd_cluster import etcd_healthy, start_etcd


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
    real = etcd_cluster._distinct_ports

    def first_try_on_a_taken_port(host, count):
        ports = real(host, count)
        if not picks:
            ports[0] = taken_port  # the client port of the first try is taken
        picks.append(ports)
        return ports

    monkeypatch.setattr(etcd_cluster, "_distinct_ports", first_try_on_a_taken_port)
    procs, addrs = start_etcd(tmp_path, 1)
    try:
        assert len(picks) == 2
        assert addrs == [f"127.0.0.1:{picks[1][0]}"]
        assert etcd_healthy(addrs[0], 5)
        assert "address already in use" in (tmp_path / "try0" / "etcd-0.log").read_text()
    finally:
        _stop(procs)


def test_an_etcd_that_cannot_start_says_why(tmp_path, monkeypatch, taken_port):
    monkeypatch.setattr(etcd_cluster, "_distinct_ports", lambda host, count: [taken_port] * count)
    with pytest.raises(RuntimeError, match="m0 exited: .*address already in use"):
        start_etcd(tmp_path, 1)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["try0", "try1", "try2"]
