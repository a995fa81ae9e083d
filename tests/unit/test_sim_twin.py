"""mininet_scenarios.sim_twin: the testbed workload in the flow-level simulator."""

import pytest

from mininet_scenarios import run_result, swan
from mininet_scenarios import workload as testbed_workload
from mininet_scenarios.sim_twin import simulate_testbed, to_coflows
from topologies import load_topology
from topologies.binding import load_binding

# 10 Mbit/s links x CAPACITY_FRACTION 0.92 = 9.2e6 bit/s = 1.15e6 bytes/s per direction.
CAP = 1.15e6


@pytest.fixture
def binding(tmp_path):
    return load_binding(load_topology(str(swan.testbed_topology(tmp_path, 10.0, 1))))


def one_flow(bytes_: int) -> list:
    return [
        testbed_workload.TestbedCoflow(
            "c1", 0.0, ({"id": "HK>LA", "src": "hHK1", "dst": "hLA1", "bytes": bytes_},)
        )
    ]


def test_one_flow_terra_uses_both_links_out_of_hk(binding):
    # 1.15e6 bytes HK -> LA. Per-flow TCP: the direct link only, 1.15e6 / 1.15e6 B/s = 1 s,
    # carrying 1.15e6 byte-hops over 14 directed links x 1.15e6 B/s x 1 s -> utilization 1/14.
    # Terra: HK's two links (HK-LA, and HK-NY on to LA) each at 1.15e6 B/s -> 0.5 s; at least
    # 0.575e6 bytes x 1 hop + 0.575e6 x 2 hops = 1.725e6 byte-hops over 14 x 1.15e6 x 0.5 s
    # -> utilization >= 1.725 / 8.05 = 0.2143.
    out = simulate_testbed(one_flow(1_150_000), binding, 10.0)
    assert out["per_flow_tcp"]["avg_cct_s"] == pytest.approx(1.0)
    assert out["terra"]["avg_cct_s"] == pytest.approx(0.5)
    assert out["foi_avg_cct"] == pytest.approx(2.0)
    assert out["per_flow_tcp"]["wan_utilization"] == pytest.approx(1 / 14)
    assert out["terra"]["wan_utilization"] >= 1.725 / 8.05 - 1e-9
    assert out["foi_wan_utilization"] >= 3.0 - 1e-9


def test_failure_moves_per_flow_to_the_next_shortest_path(binding):
    # 2.3e6 bytes HK -> LA, HK-LA down from 0.5 s to 5 s. Per-flow: 0.575e6 bytes on the
    # direct link by 0.5 s, then (the simulator re-routes, as IP routing would) the other
    # 1.725e6 over HK-NY-LA at 1.15e6 B/s -> 1.5 s more -> CCT 2.0 s. Terra: both links out
    # of HK until 0.5 s (1.15e6 bytes), then only HK-NY (1.15e6 more in 1 s) -> 1.5 s.
    failure = run_result.Failure("HK", "LA", 0.5, 5.0)
    out = simulate_testbed(one_flow(2_300_000), binding, 10.0, failure=failure)
    assert out["per_flow_tcp"]["avg_cct_s"] == pytest.approx(2.0)
    assert out["terra"]["avg_cct_s"] == pytest.approx(1.5)


def test_unknown_host_is_a_clear_error(binding):
    bad = [
        testbed_workload.TestbedCoflow(
            "c1", 0.0, ({"id": "x", "src": "hXX9", "dst": "hLA1", "bytes": 10},)
        )
    ]
    with pytest.raises(ValueError, match="hXX9"):
        to_coflows(bad, binding)
    with pytest.raises(ValueError, match="link_mbps"):
        simulate_testbed(one_flow(10), binding, 0.0)
