"""Tunnel rule compiler (terra_controller.tunnels) and topology binding, without switches."""

from __future__ import annotations

import json

import pytest

from terra_controller.tunnels import (
    ETH_IPV4,
    ETH_MPLS,
    build_tunnels,
    compile_rules,
    diff_rules,
    paths_up,
    rules_per_switch,
    trace,
    tunnels_up,
)
from topologies import Topology, TopologyError, load_topology, path_links
from topologies.binding import load_binding, make_binding
from topologies.loaders import load_json_topology

DEFAULT_K = 4
TESTBED = "topologies/data/swan_testbed.json"


@pytest.fixture(scope="module")
def swan():
    topo = load_topology(TESTBED)
    binding = load_binding(topo)
    tunnels = build_tunnels(topo, DEFAULT_K, binding.base_port)
    return topo, binding, tunnels, compile_rules(tunnels, binding)


def tcp(dst_ip: str, dst_port: int, src_port: int) -> dict:
    return {
        "eth_type": ETH_IPV4,
        "ip_proto": 6,
        "ipv4_dst": dst_ip,
        "tcp_dst": dst_port,
        "tcp_src": src_port,
    }


def test_every_swan_tunnel_forwards_both_ways(swan):
    topo, binding, tunnels, entries = swan
    # SWAN has 20 ordered DC pairs with 4 to 7 paths each, so K=4 gives 80 tunnels.
    assert len(tunnels) == 80
    for t in tunnels:
        dst_host = binding.hosts(t.dst)[0]
        src_host = binding.hosts(t.src)[0]
        hops, host = trace(entries, binding, t.src, tcp(dst_host.ip, t.tcp_port, 40000))
        assert (tuple(hops), host) == (t.path, dst_host.name), t
        # The ACK of that connection: from the agent's port back to the client's port.
        hops, host = trace(entries, binding, t.dst, tcp(src_host.ip, 40000, t.tcp_port))
        assert (tuple(hops), host) == (t.path[::-1], src_host.name), t


def test_rule_counts_match_paths_and_fit_the_paper_bound(swan):
    topo, binding, tunnels, entries = swan
    counts = rules_per_switch(entries)
    for dc, sw in binding.switches.items():
        hosts = len(sw.hosts)
        # Static: 2 table-miss + 2 per local host (local goto + table-1 delivery).
        expected = 2 + 2 * hosts
        for t in tunnels:
            for path in (t.path, t.path[::-1]):
                if path[0] == dc:  # classification, one per host of the far end
                    expected += len(binding.hosts(path[-1]))
                elif dc in path:  # label forwarding (transit) or pop (egress)
                    expected += 1
            if t.index == 0 and t.src == dc:  # default route of the pair
                expected += len(binding.hosts(t.dst))
        assert counts[sw.dpid] == expected, dc
    assert max(counts.values()) <= 168  # the paper's figure for SWAN (docs/design.md 5)
    assert len({e.key() for e in entries}) == len(entries)


def test_labelled_packets_are_not_reclassified(swan):
    topo, binding, tunnels, entries = swan
    for e in entries:
        if e.match.get("eth_type") == ETH_MPLS:
            assert set(e.match) == {"eth_type", "mpls_label"}
    labels = [t.label for t in tunnels] + [t.reverse_label for t in tunnels]
    assert len(set(labels)) == len(labels) and min(labels) >= 16


def test_plain_ip_takes_the_default_route_and_unknown_traffic_drops(swan):
    topo, binding, tunnels, entries = swan
    ny = binding.hosts("NY")[0]
    # A ping (no TCP ports) from HK to NY follows the pair's path 0: HK-NY directly.
    hops, host = trace(entries, binding, "HK", {"eth_type": ETH_IPV4, "ipv4_dst": ny.ip})
    assert (hops, host) == (["HK", "NY"], ny.name)
    hops, host = trace(entries, binding, "HK", {"eth_type": ETH_IPV4, "ipv4_dst": "10.9.9.9"})
    assert host is None and hops == ["HK"]
    hops, host = trace(entries, binding, "HK", {"eth_type": 0x0806})  # ARP: static on hosts
    assert host is None


def test_link_down_removes_exactly_the_tunnels_that_cross_it(swan):
    topo, binding, tunnels, entries = swan
    topo = topo.copy()
    topo.set_link_state("LA", "NY", up=False)
    up = tunnels_up(tunnels, topo)
    crossing = {t.tunnel_id for t in tunnels if t.uses(("LA", "NY"))}
    assert up == {t.tunnel_id for t in tunnels} - crossing and crossing
    new = compile_rules(tunnels, binding, up)
    to_delete, to_add = diff_rules(entries, new)
    assert {e.cookie for e in to_delete} <= {
        t.tunnel_id + 1 for t in tunnels if t.tunnel_id in crossing
    }
    # A pair whose path 0 crosses LA-NY moves its default route to its first tunnel
    # still up (same match and priority: an OpenFlow ADD that replaces the entry).
    moved = {}
    for t in tunnels:
        if t.index == 0 and t.tunnel_id in crossing:
            moved[(t.src, t.dst)] = next(
                u for u in tunnels if (u.src, u.dst) == (t.src, t.dst) and u.tunnel_id in up
            )
    assert ("LA", "NY") in moved and ("NY", "LA") in moved
    assert {e.cookie for e in to_add} == {u.cookie for u in moved.values()}
    la_ny = [t for t in tunnels if (t.src, t.dst) == ("LA", "NY")]
    assert la_ny[0].path == ("LA", "NY") and moved[("LA", "NY")] == la_ny[1]
    ny = binding.hosts("NY")[0]
    hops, host = trace(new, binding, "LA", {"eth_type": ETH_IPV4, "ipv4_dst": ny.ip})
    assert tuple(hops) == la_ny[1].path and host == ny.name
    for t in tunnels:
        hops, host = trace(new, binding, t.src, tcp(binding.hosts(t.dst)[0].ip, t.tcp_port, 40000))
        # A tunnel that is down falls back to its pair's default route (first tunnel up).
        first_up = next(
            u for u in tunnels if (u.src, u.dst) == (t.src, t.dst) and u.tunnel_id in up
        )
        expected = t.path if t.tunnel_id in up else first_up.path
        assert (tuple(hops), host) == (expected, binding.hosts(t.dst)[0].name)
        assert ("LA", "NY") not in path_links(tuple(hops))
    assert paths_up(tunnels, topo)[("LA", "NY")] == [t.path for t in la_ny[1:]]
    # Recovery restores the original entries: nothing to delete, the removed entries and
    # the original default routes to add.
    back_delete, back_add = diff_rules(new, entries)
    assert back_delete == []
    moved_back = [
        e
        for e in entries
        if e.priority == 100
        and e.table_id == 0
        and e.cookie in {t.cookie for t in tunnels if t.tunnel_id in crossing}
    ]
    assert len(moved_back) == len(moved)
    assert sorted(e.key() for e in back_add) == sorted(e.key() for e in to_delete + moved_back)


def test_two_hosts_per_dc_each_get_their_own_classification():
    topo = load_topology("swan")
    topo.attrs.update(make_binding(topo, hosts_per_dc=2))
    binding = load_binding(topo)
    tunnels = build_tunnels(topo, 2, binding.base_port)
    entries = compile_rules(tunnels, binding)
    for t in tunnels:
        for host in binding.hosts(t.dst):
            hops, got = trace(entries, binding, t.src, tcp(host.ip, t.tcp_port, 33000))
            assert (tuple(hops), got) == (t.path, host.name)
    # Two hosts of one DC talk through table 1 without touching the WAN.
    a, b = binding.hosts("FL")
    assert trace(entries, binding, "FL", tcp(b.ip, 20000, 40000)) == (["FL"], b.name)
    assert a.name != b.name


def test_tunnel_ports_and_labels_are_assigned_in_order(swan):
    topo, binding, tunnels, entries = swan
    hk_la = [t for t in tunnels if (t.src, t.dst) == ("HK", "LA")]
    # HK-LA paths by hops then names: HK-LA; HK-NY-LA; HK-NY-FL-LA; HK-NY-BA-FL-LA.
    assert [t.path for t in hk_la] == [
        ("HK", "LA"),
        ("HK", "NY", "LA"),
        ("HK", "NY", "FL", "LA"),
        ("HK", "NY", "BA", "FL", "LA"),
    ]
    assert [t.tcp_port for t in hk_la] == [20000, 20001, 20002, 20003]
    assert [(t.tunnel_id, t.label, t.reverse_label) for t in hk_la[:2]] == [
        (0, 16, 17),
        (1, 18, 19),
    ]


def write_topology(tmp_path, doc: dict) -> Topology:
    path = tmp_path / "t.json"
    path.write_text(json.dumps(doc))
    return load_json_topology(path)


BASE = {"dcs": ["A", "B"], "links": [{"a": "A", "b": "B"}]}
GOOD = {
    "A": {"dpid": 1, "ports": {"B": 1}, "hosts": [{"name": "hA", "ip": "10.0.0.1", "port": 2}]},
    "B": {"dpid": 2, "ports": {"A": 1}, "hosts": [{"name": "hB", "ip": "10.0.0.2", "port": 2}]},
}


@pytest.mark.parametrize(
    "switches, message",
    [
        (None, "no 'switches'"),
        ({"A": GOOD["A"]}, "DC 'B' has no switch"),
        ({**GOOD, "C": GOOD["A"]}, "unknown DCs ['C']"),
        ({**GOOD, "B": {**GOOD["B"], "dpid": 1}}, "duplicate dpid"),
        ({**GOOD, "B": {**GOOD["B"], "dpid": -3}}, "dpid: must be an integer"),
        ({**GOOD, "B": {**GOOD["B"], "ports": {}}}, "no port for the links to ['A']"),
        ({**GOOD, "B": {**GOOD["B"], "ports": {"A": 1, "Z": 3}}}, "not neighbours"),
        ({**GOOD, "B": {**GOOD["B"], "ports": {"A": 2}}}, "port used twice"),
        (
            {**GOOD, "B": {**GOOD["B"], "hosts": [{"name": "hB", "ip": "10.0.0.1", "port": 2}]}},
            "duplicate host ip",
        ),
        (
            {**GOOD, "B": {**GOOD["B"], "hosts": [{"name": "hB", "ip": "no", "port": 2}]}},
            "not an IPv4 address",
        ),
        (
            {**GOOD, "B": {**GOOD["B"], "hosts": [{"name": "hA", "ip": "10.0.0.9", "port": 2}]}},
            "duplicate host name",
        ),
    ],
)
def test_binding_errors_name_the_problem(tmp_path, switches, message):
    doc = dict(BASE) if switches is None else {**BASE, "switches": switches}
    topo = write_topology(tmp_path, doc)
    with pytest.raises(TopologyError, match=message.replace("[", r"\[").replace("]", r"\]")):
        load_binding(topo)


def test_binding_lookups(tmp_path):
    binding = load_binding(write_topology(tmp_path, {**BASE, "switches": GOOD}))
    assert binding.dc_of(2) == "B" and binding.dc_of(9) is None
    assert binding.link_of_port(1, 1) == ("A", "B")
    assert binding.link_of_port(1, 2) is None  # host port
    assert binding.base_port == 20000
