"""The operator's link states and capacities are journaled like the coflows: a controller
restarted on the same state directory applies them before its first round; a link is up
only while neither the operator nor a switch says it is down.

In-process controllers over one journal directory (no agents run: agents are registered in
the registry as the agent channel would); tests/integration/test_operator_links_ha.py does
the same with real processes, on a lone controller and across a failover on etcd.
"""

from __future__ import annotations

import pytest
from test_resume import controller

from terra_controller.coflow_state import RegistryError
from terra_controller.journal import CoflowJournal
from terra_controller.operator_links import SWITCH, restore
from topologies import Topology

FLOW = [{"id": "f", "src": "a1", "dst": "b1", "bytes": 10**9}]


def paths_of(c, cid: int) -> dict[tuple, float]:
    rates, _ = c.run_round()
    return {tuple(path): rate for path, rate in rates[cid]["f"]}


def test_the_journal_replays_the_operators_last_state_of_each_link(tmp_path):
    first = CoflowJournal(tmp_path)
    first.link_set("B", "A", up=False)
    first.link_set("A", "C", cap=5e7)
    first.link_set("A", "B", cap=2e7)
    first.link_set("C", "A", up=False)
    first.link_set("A", "C", up=True)
    first.close()
    again = CoflowJournal(tmp_path)
    want = {("A", "B"): {"up": False, "cap": 2e7}, ("A", "C"): {"up": True, "cap": 5e7}}
    assert again.links == want
    again._rewrite()  # compaction keeps them
    again.close()
    third = CoflowJournal(tmp_path)
    assert third.links == want
    third.close()


def test_a_restarted_controller_schedules_around_the_operators_links(tmp_path):
    first = controller(tmp_path)
    assert first.set_link_state("A", "B", False)
    first.set_capacity("A", "C", 4e7)
    first.close()
    second = controller(tmp_path)
    topo = second.topology
    assert ("A", "B") in topo.down and ("B", "A") in topo.down
    assert topo.capacity[("A", "C")] == topo.capacity[("C", "A")] == 4e7
    links = {(a, b): (cap, state) for a, b, cap, state, _ in second.snapshot().links}
    assert links[("A", "B")] == (1e8, "down") and links[("A", "C")] == (4e7, "up")
    cid = second.submit(FLOW)
    paths = paths_of(second, cid)  # the first round already goes round A-B, at 40 MB/s
    assert list(paths) == [("A", "C", "B")] and paths[("A", "C", "B")] == pytest.approx(4e7)
    second.close()


def test_an_operators_link_down_holds_whatever_the_switches_say_and_the_other_way(tmp_path):
    c = controller(tmp_path)
    assert c.set_link_state("A", "B", False)
    assert not c.set_link_state("A", "B", True, source=SWITCH)  # a port up does not lift it
    assert ("A", "B") in c.topology.down
    assert c.set_link_state("A", "B", True)
    assert not c.set_link_state("A", "B", True, source=SWITCH)
    assert c.set_link_state("A", "B", False, source=SWITCH)  # the port went down
    assert not c.set_link_state("A", "B", True)  # the operator's link-up does not lift it
    assert ("A", "B") in c.topology.down
    assert c.set_link_state("A", "B", True, source=SWITCH)
    assert ("A", "B") not in c.topology.down
    c.close()
    again = controller(tmp_path)  # the switches' word is not journaled: they say it again
    assert not again.topology.down
    again.close()


def test_a_refused_link_change_is_not_journaled(tmp_path):
    c = controller(tmp_path)
    with pytest.raises(RegistryError, match="no link A-Z") as refused:
        c.set_link_state("A", "Z", False)
    assert refused.value.code == "bad_request"
    with pytest.raises(RegistryError, match="capacity"):
        c.set_capacity("A", "B", -1)
    assert c.journal.links == {}
    c.close()


def test_restore_skips_a_link_the_topology_no_longer_has():
    topology = Topology("ab", ["A", "B"], {("A", "B"): 1e8, ("B", "A"): 1e8})
    links = {("A", "X"): {"up": False, "cap": None}, ("A", "B"): {"up": True, "cap": 3e7}}
    assert restore(topology, links) == 1
    assert topology.capacity[("B", "A")] == 3e7 and not topology.down


def test_switch_link_changes_do_not_wait_for_a_round_and_apply_in_order(tmp_path):
    """os-ken's thread hands a switch's link changes to the loop without waiting, even
    while a round holds the policy; the loop applies them in the order they came, and a
    bad one is logged without stopping the next."""
    import time

    c = controller(tmp_path)
    with c.owner.policy_held():  # (a round holding the policy)
        t0 = time.monotonic()
        for a, b, up in [("A", "B", False), ("X", "Y", False), ("A", "B", True),
                         ("A", "B", False)]:  # fmt: skip
            c.switch_link_change(a, b, up)
        assert time.monotonic() - t0 < 0.5  # (handed over, not applied yet)
        time.sleep(0.2)
        assert ("A", "B") not in c.topology.down
    end = time.monotonic() + 5
    while time.monotonic() < end:
        kinds = [e["kind"] for e in c.owner.run(lambda: c.events.since(0))["events"]]
        if len(kinds) >= 3:
            break
        time.sleep(0.02)
    assert kinds == ["link_down", "link_up", "link_down"]
    assert ("A", "B") in c.topology.down and ("B", "A") in c.topology.down
