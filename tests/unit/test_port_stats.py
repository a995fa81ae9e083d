"""Port statistics (terra_controller/port_stats.py) and REST /links without a switch: hand-fed
samples, the rates stated in each test."""

from __future__ import annotations

import json

import pytest

from terra_controller.controller import Controller
from terra_controller.port_stats import PortSample, PortStats
from terra_controller.rest import RestApp
from terra_core.registry import make_scheduler
from topologies import load_topology
from topologies.binding import load_binding

TESTBED = "topologies/data/swan_testbed.json"


def sample(t, tx, rx=0, dropped=0):
    return PortSample(t, tx, rx, tx // 1000, rx // 1000, dropped, 0)


@pytest.fixture
def binding():
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    return load_binding(load_topology(str(root / TESTBED)))


def test_link_load_is_the_sending_port_and_its_rate_between_polls(binding):
    stats = PortStats(binding)
    dpid, port = binding.dpid_of("LA"), binding.port_to("LA", "NY")
    stats.record(dpid, port, sample(10.0, 1_000_000))
    stats.record(dpid, port, sample(12.0, 3_000_000, dropped=4))
    stats.record(dpid, 1234, sample(12.0, 9_999_999))  # not a WAN port: ignored
    loads = stats.wan_links(now_s=12.5)
    assert set(loads) == {("LA", "NY")}
    la_ny = loads[("LA", "NY")]
    # (3e6 - 1e6) bytes over (12 - 10) s = 1e6 bytes/s; the sample is 0.5 s old.
    assert la_ny.tx_bytes_per_s == pytest.approx(1e6)
    assert (la_ny.tx_bytes, la_ny.tx_dropped, la_ny.sampled_s) == (3_000_000, 4, 0.5)
    assert stats.wan_tx_bytes() == 3_000_000


def test_a_counter_that_goes_backwards_gives_no_rate(binding):
    # A restarted switch starts its counters at 0 again: no negative rate is computed.
    stats = PortStats(binding)
    dpid, port = binding.dpid_of("HK"), binding.port_to("HK", "LA")
    stats.record(dpid, port, sample(1.0, 5_000))
    stats.record(dpid, port, sample(2.0, 100))
    assert stats.wan_links(2.0)[("HK", "LA")].tx_bytes_per_s is None
    stats.record(dpid, port, sample(3.0, 1_100))
    assert stats.wan_links(3.0)[("HK", "LA")].tx_bytes_per_s == pytest.approx(1_000)


def call(app, path):
    status = {}

    def start_response(code, headers):
        status["code"] = int(code.split()[0])

    body = b"".join(app({"REQUEST_METHOD": "GET", "PATH_INFO": path}, start_response))
    return status["code"], body


def test_rest_links_carry_allocation_and_measured_counters(binding):
    swan = load_topology("swan")
    controller = Controller(swan, make_scheduler("terra", swan))
    stats = PortStats(binding)
    dpid, port = binding.dpid_of("LA"), binding.port_to("LA", "NY")
    stats.record(dpid, port, sample(0.0, 0))
    stats.record(dpid, port, sample(1.0, 2_500_000))
    app = RestApp(controller, ports=lambda: stats.wan_links(1.0))
    code, body = call(app, "/links")
    assert code == 200
    rows = {(r["a"], r["b"]): r for r in json.loads(body)["links"]}
    assert set(rows) == set(swan.links)  # every directed link
    la_ny = rows[("LA", "NY")]
    assert la_ny["measured_bytes_per_s"] == pytest.approx(2.5e6)
    assert (la_ny["tx_bytes"], la_ny["dpid"], la_ny["port"]) == (2_500_000, dpid, port)
    assert la_ny["capacity_bytes_per_s"] > 0 and la_ny["allocated_bytes_per_s"] == 0
    assert rows[("NY", "LA")]["tx_bytes"] is None  # never sampled
    code, body = call(app, "/metrics")
    assert code == 200
    assert b'terra_link_tx_bytes_total{a="LA",b="NY"' in body
    assert b"terra_link_measured_bytes_per_second" in body
    # Without switches the measured fields are null.
    code, body = call(RestApp(controller), "/links")
    assert all(r["tx_bytes"] is None for r in json.loads(body)["links"])
