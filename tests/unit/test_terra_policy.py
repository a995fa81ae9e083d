"""TerraPolicy (terra_core/terra_policy.py): online operation, docs/design.md 4.3.

End-to-end cases run the real simulator (terra_sim/simulator.py).
"""

import math

import pytest

from terra_core.terra_policy import TerraPolicy
from terra_model import Coflow, Flow
from terra_sim.simulator import WanChange, simulate
from topologies import Topology, path_links


def line() -> Topology:
    """Two DCs, one undirected link of 10 bytes/s (each direction)."""
    return Topology("line", ["A", "B"], {("A", "B"): 10.0, ("B", "A"): 10.0})


def triangle() -> Topology:
    """A, B, C fully connected, every directed link 10 bytes/s."""
    cap = {(u, v): 10.0 for u in "ABC" for v in "ABC" if u != v}
    return Topology("triangle", ["A", "B", "C"], cap)


def coflow(cid, src, dst, size, arrival=0.0, deadline=None, n_flows=1):
    flows = [Flow(f"{cid}f{i}", src, dst, size / n_flows) for i in range(n_flows)]
    return Coflow(cid, arrival, flows, deadline)


def rate_of(alloc, cid):
    return sum(r for lst in alloc.get(cid, {}).values() for _, r in lst)


def test_order_decides_the_average_cct():
    # One 10 B/s link, α = 0. c1 (100 bytes) and c2 (10 bytes) arrive together. Terra runs c2
    # first (Γ 1 s < 10 s): c2 finishes at 1 s, c1 at 1 + 100/10 = 11 s; average 6 s
    # (arrival order would give (10 + 11) / 2 = 10.5 s).
    policy = TerraPolicy(line(), alpha=0.0)
    res = simulate(policy, [coflow("c1", "A", "B", 100.0), coflow("c2", "A", "B", 10.0)])
    cct = {c.id: c.cct_s for c in res.coflows}
    assert cct == pytest.approx({"c1": 11.0, "c2": 1.0})
    assert res.avg_cct_s == pytest.approx(6.0)
    assert policy.stats["rounds"] >= 2 and len(policy.stats["round_ms"]) == policy.stats["rounds"]


def test_round_order_puts_deadlines_first_then_smallest_gamma():
    # big (100 bytes), small (10 bytes) and a deadline coflow of 50 bytes due at 100 s,
    # admitted in that order: the round serves the deadline coflow first (step 1), then
    # small (Γ 1 s) before big (Γ 10 s on what is left); no round yet: [].
    policy = TerraPolicy(line(), alpha=0.0)
    assert policy.round_order() == []
    coflows = [coflow("big", "A", "B", 100.0), coflow("small", "A", "B", 10.0),
               coflow("dl", "A", "B", 50.0, deadline=100.0)]  # fmt: skip
    for c in coflows:
        assert policy.add_coflow(c, 0.0)
    policy.group_rates(0.0, {c.id: c.flowgroups() for c in coflows})
    assert policy.round_order() == ["dl", "small", "big"]


def test_round_order_puts_the_starving_coflow_before_smaller_ones():
    # aged guard: big (100 bytes, Γ 10 s) arrives at 0 and starves from 2 x 10 = 20 s on;
    # small (10 bytes) arrives at 24 s. At 25 s big is served first (step 2'), then small.
    policy = TerraPolicy(line(), alpha=0.1)
    big, small = coflow("big", "A", "B", 100.0), coflow("small", "A", "B", 10.0, arrival=24.0)
    assert policy.add_coflow(big, 0.0) and policy.add_coflow(small, 24.0)
    policy.group_rates(25.0, {"big": big.flowgroups(), "small": small.flowgroups()})
    assert policy.starving(25.0) == ["big"]
    assert policy.round_order() == ["big", "small"]


def test_flows_of_a_flowgroup_split_by_remaining_bytes():
    # Two flows of 30 and 10 bytes A->B share the FlowGroup's 10 B/s as 7.5 and 2.5 B/s,
    # so both finish at 40/10 = 4 s.
    policy = TerraPolicy(line(), alpha=0.0)
    c = Coflow("c", 0.0, [Flow("big", "A", "B", 30.0), Flow("small", "A", "B", 10.0)])
    assert policy.add_coflow(c, 0.0)
    assert policy.state("c") == "queued"
    alloc = policy.allocate(0.0, {"c": {"big": 30.0, "small": 10.0}})
    assert sum(r for _, r in alloc["c"]["big"]) == pytest.approx(7.5)
    assert sum(r for _, r in alloc["c"]["small"]) == pytest.approx(2.5)
    assert policy.state("c") == "running"


def test_deadline_coflow_admitted_and_second_rejected():
    # d1: 100 bytes, deadline 20 s. Γ = 100/10 = 10 s; 10 x (1 + ε=0.1) = 11 <= 20: admitted,
    # stretched to 100/20 = 5 B/s. d2: 100 bytes, deadline 15 s, sees 10 - 5 = 5 B/s left:
    # Γ = 20 s, 22 > 15: rejected. d3 (deadline 30 s): 22 <= 30: admitted.
    policy = TerraPolicy(line(), alpha=0.0)
    assert policy.add_coflow(coflow("d1", "A", "B", 100.0, deadline=20.0), 0.0) is True
    assert policy.add_coflow(coflow("d2", "A", "B", 100.0, deadline=15.0), 0.0) is False
    assert policy.add_coflow(coflow("d3", "A", "B", 100.0, deadline=30.0), 0.0) is True
    with pytest.raises(KeyError):
        policy.state("d2")
    alloc = policy.allocate(0.0, {"d1": {"d1f0": 100.0}, "d3": {"d3f0": 100.0}})
    # d1 stretched to 5 B/s; d3 on the 5 B/s left needs 100/30 = 3.33 B/s, and work
    # conservation hands the rest of the link (1.67 B/s) to the earliest deadline, d1.
    assert rate_of(alloc, "d1") + rate_of(alloc, "d3") == pytest.approx(10.0)
    assert rate_of(alloc, "d3") >= 100.0 / 30.0 * (1 - 1e-9)
    assert rate_of(alloc, "d1") >= 5.0 * (1 - 1e-9)


def test_admitted_deadlines_are_met_in_the_simulator():
    policy = TerraPolicy(line(), alpha=0.1)
    workload = [
        coflow("d1", "A", "B", 100.0, deadline=20.0),
        coflow("c1", "A", "B", 50.0, arrival=1.0),
        coflow("d2", "A", "B", 30.0, arrival=2.0, deadline=12.0),
    ]
    res = simulate(policy, workload)
    by_id = {c.id: c for c in res.coflows}
    assert by_id["d1"].admitted and by_id["d1"].met_deadline
    assert by_id["d2"].admitted and by_id["d2"].met_deadline
    assert by_id["c1"].finish_s is not None


def two_routes() -> Topology:
    """A->C over A-B-C (B->C 10 bytes/s) or A-D-E-C (10 bytes/s), one way only."""
    cap = {("A", "B"): 20.0, ("B", "C"): 10.0, ("A", "D"): 10.0, ("D", "E"): 10.0,
           ("E", "C"): 10.0}  # fmt: skip
    return Topology("two-routes", ["A", "B", "C", "D", "E"], cap)


def test_an_admitted_coflow_keeps_its_split_when_a_newcomer_is_due_sooner():
    # Y: 80 B B->C (one path) due in 10 s, admitted on 8 B/s of B->C. X: 100 B A->C due in
    # 9.9 s, over A-B-C (2 links) and A-D-E-C. Step 1 serves the admitted coflows in their
    # admitted splits first, so X gets what Y leaves: 2 B/s over A-B-C and 10 over
    # A-D-E-C, 12 >= 100 / 9.9 = 10.1 B/s: admitted. Were X served first by deadline with
    # a fewest-link-bytes split, it would take 10 B/s of B->C and leave Y nothing. Both
    # end in time. X3 (due in 9.9 s too, after X) finds too little left: refused.
    policy = TerraPolicy(two_routes(), k=2)
    assert policy.add_coflow(coflow("Y", "B", "C", 80.0, deadline=10.0), 0.0)
    assert policy.add_coflow(coflow("X", "A", "C", 100.0, deadline=9.9), 0.0)
    assert not policy.add_coflow(coflow("X3", "A", "C", 100.0, deadline=9.9), 0.0)
    work = [coflow("Y", "B", "C", 80.0, deadline=10.0), coflow("X", "A", "C", 100.0, deadline=9.9)]
    res = simulate(TerraPolicy(two_routes(), k=2), work)
    assert all(c.admitted and c.met_deadline for c in res.coflows)


def test_a_deadline_coflow_stays_in_its_split_when_an_earlier_one_ends():
    # Links of 10 B/s: A->M, M->B, A->C, C->D, D->B. Z (50 B A->M, due in 5 s) fills A->M,
    # so Y (80 B A->B, due in 10 s) is admitted on A-C-D-B, and X (80 B M->B, due in 10.5 s)
    # on M->B, which Y leaves free. When Z ends, a split recomputed with the fewest
    # link-bytes would move Y to A-M-B and leave X 2 B/s; Y keeps its admitted split.
    links = [("A", "M"), ("M", "B"), ("A", "C"), ("C", "D"), ("D", "B")]
    work = [coflow("Z", "A", "M", 50.0, deadline=5.0), coflow("Y", "A", "B", 80.0, deadline=10.0),
            coflow("X", "M", "B", 80.0, deadline=10.5),
            Coflow("W", 0.0, [Flow("f", "M", "B", 1e3), Flow("g", "C", "D", 1e3)])]  # fmt: skip
    for k in (2, 3):
        topo = Topology("d", ["A", "M", "B", "C", "D"], dict.fromkeys(links, 10.0))
        res = simulate(TerraPolicy(topo, k=k, epsilon=0.0), work)
        assert all(c.met_deadline for c in res.coflows if c.deadline_s), k


def test_flows_added_to_a_deadline_coflow_end_its_guarantee():
    # One 10 B/s link, ε = 0. a (40 B, due in 10 s) and b (60 B, due in 11 s) are admitted:
    # 4 + 5.45 B/s. a grows by 50 B: kept as a deadline coflow in its split it would need
    # 9 B/s and leave b 1. It is an ordinary coflow now: b keeps the 60 / 11 B/s it needs.
    policy = TerraPolicy(line(), k=1, epsilon=0.0)
    assert policy.add_coflow(coflow("a", "A", "B", 40.0, deadline=10.0), 0.0)
    assert policy.add_coflow(coflow("b", "A", "B", 60.0, deadline=11.0), 0.0)
    policy.add_flows("a", [Flow("g", "A", "B", 50.0)], 0.0)
    assert "a" not in policy.admitted_deadlines() and "a" not in policy.pins()
    rates = policy.group_rates(0.0, {"a": {("A", "B"): 90.0}, "b": {("A", "B"): 60.0}})
    assert sum(x for _, x in rates["b"][("A", "B")]) >= 60.0 / 11.0 * (1 - 1e-9)


def test_a_newcomer_that_sets_no_one_back_is_admitted_beside_a_coflow_behind():
    # Two disjoint links X->Y, Z->W of 10 B/s, K = 1. d1 (100 B X->Y, due in 20 s) is
    # admitted at 5 B/s; X->Y then drops to 2 B/s: d1 is behind (Γ 50 s). A newcomer due
    # sooner on Z->W takes nothing from it: admitted; one on X->Y would: refused.
    topo = Topology("2", ["X", "Y", "Z", "W"], {("X", "Y"): 10.0, ("Z", "W"): 10.0})
    policy = TerraPolicy(topo, k=1)
    assert policy.add_coflow(coflow("d1", "X", "Y", 100.0, deadline=20.0), 0.0)
    topo.capacity[("X", "Y")] = 2.0
    policy.wan_changed(0.0)
    assert policy.add_coflow(coflow("n", "Z", "W", 10.0, deadline=5.0), 0.0)
    assert not policy.add_coflow(coflow("o", "X", "Y", 10.0, deadline=5.0), 0.0)


def test_a_flowgroup_of_zero_bytes_is_no_error():
    # A coflow whose FlowGroup has 0 bytes (a 0-byte flow between two DCs) next to others:
    # the round's Γ hints divide by its earlier volume; it ends at once, the others run.
    work = [Coflow("z", 0.0, [Flow("f", "A", "B", 0.0), Flow("g", "A", "C", 50.0)]),
            coflow("c", "A", "C", 100.0, arrival=1.0),
            coflow("e", "A", "B", 30.0, arrival=2.0)]  # fmt: skip
    res = simulate(TerraPolicy(triangle(), k=2), work)
    assert all(c.finish_s is not None for c in res.coflows)


def test_admission_counts_what_the_last_round_sent_since():
    # d1: 100 B A->B due in 20 s, served at 5 B/s from t = 0. At t = 10 s 50 B are left:
    # d1 still needs 5 B/s. d2 (40 B, due in 9 s at t = 10) needs 40/5 = 8 s x 1.1 = 8.8 <= 9
    # on the 5 B/s left, and d1 still fits before its deadline: admitted. Counted with d1's
    # volume of t = 0 (100 B due in 10 s: 10 B/s, the whole link), it would be refused.
    policy = TerraPolicy(line(), alpha=0.0)
    assert policy.add_coflow(coflow("d1", "A", "B", 100.0, deadline=20.0), 0.0)
    policy.served(0.0, {"d1": {("A", "B"): [(("A", "B"), 5.0)]}})
    assert policy.admitted_deadlines(10.0)["d1"][0] == {("A", "B"): pytest.approx(50.0)}
    assert policy.add_coflow(coflow("d2", "A", "B", 40.0, arrival=10.0, deadline=9.0), 10.0)


def test_link_failure_mid_transfer_moves_rates_to_surviving_paths():
    # 200 bytes A->C over A-C and A-B-C at 10 B/s each (α = 0): 10 s. At t = 5 s link A-C
    # fails with 100 bytes left; the paths are recomputed and only A-B-C remains: 100/10 =
    # 10 s more, so the coflow finishes at 15 s.
    topo = triangle()
    policy = TerraPolicy(topo, alpha=0.0)
    res = simulate(
        policy, [coflow("c", "A", "C", 200.0)], changes=[WanChange(5.0, "A", "C", up=False)]
    )
    assert res.coflows[0].finish_s == pytest.approx(15.0)
    assert policy.paths("A", "C") == [("A", "B", "C")]


def test_link_failure_recomputes_paths_and_recovery_restores_them():
    topo = triangle()
    policy = TerraPolicy(topo, alpha=0.0)
    assert policy.add_coflow(coflow("c", "A", "C", 200.0), 0.0)
    alloc = policy.allocate(0.0, {"c": {"cf0": 200.0}})
    assert dict(alloc["c"]["cf0"]) == pytest.approx({("A", "C"): 10.0, ("A", "B", "C"): 10.0})
    topo.set_link_state("A", "C", False)
    assert policy.wan_changed(5.0) is True
    alloc = policy.allocate(5.0, {"c": {"cf0": 100.0}})
    assert dict(alloc["c"]["cf0"]) == pytest.approx({("A", "B", "C"): 10.0})
    topo.set_link_state("A", "C", True)
    assert policy.wan_changed(6.0) is True
    alloc = policy.allocate(6.0, {"c": {"cf0": 90.0}})
    assert dict(alloc["c"]["cf0"]) == pytest.approx({("A", "C"): 10.0, ("A", "B", "C"): 10.0})


def test_capacity_change_threshold_delta():
    topo = line()
    policy = TerraPolicy(topo, delta=0.1)
    topo.set_capacity("A", "B", 9.5)  # 5% < δ = 10%
    assert policy.wan_changed(0.0) is False
    topo.set_capacity("A", "B", 8.0)  # 20% below the 10 B/s last taken into account
    assert policy.wan_changed(0.0) is True
    # allocations always respect the current capacity
    assert policy.add_coflow(coflow("c", "A", "B", 100.0), 0.0)
    topo.set_capacity("A", "B", 7.5)  # 6.25% below 8: filtered, but still obeyed
    assert policy.wan_changed(0.0) is False
    assert rate_of(policy.allocate(0.0, {"c": {"cf0": 100.0}}), "c") == pytest.approx(7.5)


def test_add_flows_joins_the_flowgroups():
    policy = TerraPolicy(triangle(), alpha=0.0)
    assert policy.add_coflow(coflow("c", "A", "B", 100.0), 0.0)
    policy.add_flows("c", [Flow("late", "B", "C", 50.0)], 1.0)
    alloc = policy.allocate(1.0, {"c": {"cf0": 90.0, "late": 50.0}})
    assert set(alloc["c"]) == {"cf0", "late"}
    for fid, (src, dst) in {"cf0": ("A", "B"), "late": ("B", "C")}.items():
        assert all(p[0] == src and p[-1] == dst for p, _ in alloc["c"][fid])
    with pytest.raises(ValueError, match="duplicate flow id"):
        policy.add_flows("c", [Flow("late", "B", "C", 1.0)], 1.0)
    with pytest.raises(KeyError):
        policy.add_flows("nope", [], 1.0)


def test_add_flows_leaves_the_volumes_a_round_was_given_unchanged():
    # The caller may hand the same dict to the next round (the simulator does, for a
    # coflow that got no rate): flows added in between must not write into it.
    policy = TerraPolicy(triangle(), alpha=0.0)
    assert policy.add_coflow(coflow("c", "A", "B", 100.0), 0.0)
    given = {("A", "B"): 90.0}
    policy.group_rates(1.0, {"c": given})
    policy.add_flows("c", [Flow("late", "B", "C", 50.0)], 1.0)
    assert given == {("A", "B"): 90.0}
    rates = policy.group_rates(1.0, {"c": {("A", "B"): 90.0, ("B", "C"): 50.0}})
    assert set(rates["c"]) == {("A", "B"), ("B", "C")}


def test_a_coflow_with_no_bytes_left_gets_no_rate():
    # Its cached Γ bounds nothing (no FlowGroup): no hint, no rate, no error.
    policy = TerraPolicy(triangle(), alpha=0.0)
    assert policy.add_coflow(coflow("c", "A", "B", 100.0), 0.0)
    assert rate_of(policy.allocate(0.0, {"c": {"cf0": 100.0}}), "c") > 0
    assert policy.allocate(1.0, {"c": {"cf0": 0.0}}) == {}


def test_gamma_empty_uses_every_link_up():
    # A->C 200 bytes over A-C and A-B-C on the empty WAN: 200/20 = 10 s, even while A-C is down.
    topo = triangle()
    topo.set_link_state("A", "C", False)
    policy = TerraPolicy(topo)
    assert policy.gamma_empty(coflow("c", "A", "C", 200.0)) == pytest.approx(10.0)


def test_bad_input():
    topo = Topology("split", ["A", "B", "C"], {("A", "B"): 10.0, ("B", "A"): 10.0})
    policy = TerraPolicy(topo)
    with pytest.raises(ValueError, match=r"'x'.*no path from A to C"):
        policy.add_coflow(coflow("x", "A", "C", 1.0), 0.0)
    assert policy.add_coflow(coflow("y", "A", "B", 1.0), 0.0)
    with pytest.raises(ValueError, match="duplicate coflow id"):
        policy.add_coflow(coflow("y", "A", "B", 1.0), 0.0)
    with pytest.raises(ValueError, match="unknown DC"):
        policy.add_coflow(coflow("z", "A", "Q", 1.0), 0.0)
    with pytest.raises(ValueError):
        TerraPolicy(topo, alpha=1.5)
    with pytest.raises(KeyError):
        policy.allocate(0.0, {"ghost": {"f": 1.0}})


def test_link_loss_of_every_path_leaves_the_pair_waiting_at_rate_0():
    topo = line()
    policy = TerraPolicy(topo)
    assert policy.add_coflow(coflow("c", "A", "B", 100.0), 0.0)
    topo.set_link_state("A", "B", False)
    policy.wan_changed(1.0)
    alloc = policy.allocate(1.0, {"c": {"cf0": 50.0}})
    rates = [r for flows in alloc.values() for lst in flows.values() for _, r in lst]
    assert sum(rates) == 0.0


def test_rates_only_on_up_links():
    topo = triangle()
    policy = TerraPolicy(topo, alpha=0.1)
    for i, (s, d) in enumerate([("A", "C"), ("B", "C"), ("C", "A")]):
        assert policy.add_coflow(coflow(f"c{i}", s, d, 100.0 * (i + 1)), 0.0)
    topo.set_link_state("A", "B", False)
    policy.wan_changed(0.0)
    alloc = policy.allocate(0.0, {f"c{i}": {f"c{i}f0": 100.0 * (i + 1)} for i in range(3)})
    for flows in alloc.values():
        for lst in flows.values():
            for path, r in lst:
                assert r > 0 and not math.isnan(r)
                assert all(link not in topo.down for link in path_links(path))
