"""The controller's event log (terra_controller/events.py): bounded, numbered, read since N;
and the controller appending link, capacity and coflow events where they happen."""

from __future__ import annotations

import json

import pytest

from terra_controller.console_views import CoflowListing, agent_rows, flow_paths, link_coflows
from terra_controller.controller import Controller
from terra_controller.events import EventLog
from terra_core.terra_policy import TerraPolicy
from topologies import Topology


def controller() -> Controller:
    links = {}
    for u, v in [("A", "B"), ("B", "C"), ("A", "C")]:
        links[(u, v)] = links[(v, u)] = 1e8
    topology = Topology("tri", ["A", "B", "C"], links)
    c = Controller(topology, TerraPolicy(topology, k=2))
    for agent in ("a1", "b1", "c1"):
        c.registry.register_agent(agent, agent[0].upper(), "127.0.0.1:30000")
    return c


def test_the_log_is_numbered_bounded_and_read_since_a_number():
    log = EventLog(capacity=3, clock=lambda: 5.0)
    for i in range(5):
        log.add("capacity", a="A", b="B", bytes_per_s=i)
    got = log.since(0)
    assert [e["seq"] for e in got["events"]] == [3, 4, 5]
    assert got["last"] == 5 and got["dropped"] == 2
    assert got["events"][0] == {"seq": 3, "t": 5.0, "kind": "capacity", "a": "A", "b": "B",
                                "bytes_per_s": 2}  # fmt: skip
    assert log.since(4) == {"events": [got["events"][2]], "last": 5, "dropped": 0}
    assert log.since(5)["events"] == [] and log.since(99)["events"] == []
    assert [e["seq"] for e in log.since(2, limit=1)["events"]] == [3]
    with pytest.raises(ValueError):
        EventLog(capacity=0)


def test_the_controller_logs_link_capacity_and_coflow_events():
    c = controller()
    c.set_link_state("A", "B", False)
    c.set_link_state("A", "B", False)  # no change: no event
    c.set_link_state("A", "B", True)
    c.set_capacity("B", "C", 5e7)
    done = c.submit([{"id": "f", "src": "a1", "dst": "b1", "bytes": 100}])
    gone = c.submit([{"id": "g", "src": "b1", "dst": "c1", "bytes": 10**9}])
    failed = c.submit([{"id": "h", "src": "c1", "dst": "a1", "bytes": 10**9}])
    c.run_round()
    # While they run: the links and the flows name the coflows and their paths.
    on_link = link_coflows(c)
    assert gone in on_link[("B", "C")] or gone in on_link[("B", "A")]
    paths = flow_paths(c, None, c.status(gone))["flows"][0]["paths"]
    assert paths and paths[0]["path"][0] == "B" and paths[0]["tunnel"] is None
    rows = {r["id"]: r for r in agent_rows(c, None)["agents"]}
    assert rows["b1"]["sending"] == 1 and rows["b1"]["receiving"] == 1
    assert rows["c1"]["coflows"] == sorted([gone, failed]) and rows["a1"]["connected"] is False
    c.complete(done, "f", "00")
    c.cancel(gone)
    c.fail_flow(failed, "h", "disk full")
    events = c.events.since(0)["events"]
    assert [e["kind"] for e in events] == [
        "link_down", "link_up", "capacity", "admitted", "admitted", "admitted", "done",
        "cancelled", "failed",
    ]  # fmt: skip
    want = {"seq": 1, "t": 0, "kind": "link_down", "a": "A", "b": "B", "source": "operator"}
    assert events[0] | {"t": 0} == want
    assert events[2]["bytes_per_s"] == 5e7
    assert events[3]["coflow"] == done and events[6]["coflow"] == done
    assert events[7]["reason"] == "cancelled by the job master"
    assert events[8]["coflow"] == failed and "disk full" in events[8]["reason"]


def test_the_coflow_listing_matches_the_summaries_and_reuses_only_done_coflows():
    c = controller()
    listing = CoflowListing(c)
    done = c.submit([{"id": "f", "src": "a1", "dst": "b1", "bytes": 100}])
    c.complete(done, "f", "00")
    running = c.submit([{"id": "g", "src": "b1", "dst": "c1", "bytes": 10**9}])
    c.run_round()
    assert json.loads(listing.render()) == [x.summary() for x in c.registry.coflows.values()]
    assert set(listing.done) == {done}
    c.progress(running, "g", 5000)
    c.cancel(running)
    rows = {r["id"]: r for r in json.loads(listing.render())}
    assert rows[running]["state"] == "cancelled" and rows[running]["bytes_delivered"] == 5000
    assert set(listing.done) == {done}  # a cancelled coflow is encoded again each time
