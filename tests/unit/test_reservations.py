"""Guaranteed reservations (terra_core/reservations.py, docs/design.md 4.5): admission under
every single link failure the tunnels route around, the guarantee enforced in the tenant
round with borrowing up to the ceiling, and deadline admission counting other tenants'
guarantees.

The WAN of most cases is a triangle A, B, C with every link 100 bytes/s each way and K = 2,
so pair A->C has two tunnels, A-C and A-B-C (200 bytes/s together; 100 with one link down).
"""

from __future__ import annotations

import math

import pytest

from terra_core.reservations import (
    Reservation,
    ReservationError,
    admission,
    cap_ceilings,
    floors,
    overlapping_sets,
)
from terra_core.tenant_policy import TenantPolicy, TenantSpec
from terra_model import Coflow, Flow
from tests.unit.test_tenant_policy import wan
from topologies import Topology


def triangle(cap: float = 100.0) -> Topology:
    links = {}
    for u, v in (("A", "B"), ("B", "C"), ("A", "C")):
        links[(u, v)] = links[(v, u)] = cap
    return Topology("tri", ["A", "B", "C"], links)


def line() -> Topology:
    return Topology("line", ["A", "B", "C"], {("A", "B"): 100.0, ("B", "A"): 100.0,
                                              ("B", "C"): 100.0, ("C", "B"): 100.0})  # fmt: skip


def test_fits_with_every_failure_covered():
    # 60 B/s A->C: 60 <= 200 with every link up; with A-C down, A-B-C carries 60 <= 100;
    # with A-B or B-C down, A-C carries 60 <= 100.
    got = admission([Reservation("gold", "A", "C", 60.0)], triangle(), k=2)
    assert got.ok and got.reason is None
    assert got.covered == [("A", "B"), ("A", "C"), ("B", "C")]
    assert got.uncovered == {}


def test_does_not_fit_with_every_link_up():
    # 250 B/s > 200 B/s of the two tunnels: fits 200/250 = 80.0 %.
    got = admission([Reservation("gold", "A", "C", 250.0)], triangle(), k=2)
    assert not got.ok
    assert "with every link up" in got.reason and "80.0 %" in got.reason


def test_fits_without_failure_but_not_with_one_link_down():
    # 150 B/s fits 200 with every link up; with any one link down one tunnel is left,
    # 100/150 = 66.7 %: the first failure (A-B) named, the two others counted.
    got = admission([Reservation("gold", "A", "C", 150.0)], triangle(), k=2)
    assert not got.ok
    assert "with link A-B down (and 2 other failures)" in got.reason and "66.7 %" in got.reason
    assert "gold A->C 150 B/s" in got.reason


def test_two_tenants_on_crossing_pairs():
    # gold A->C 60 and silver B->C 60. With A-C down, A->C goes A-B-C and B-C carries
    # 60 + 60 = 120 > 100: fits 100/120 = 83.3 %, bottleneck B->C (B-C down is the same on
    # A-C; A-B down fits). At 40 each the worst link carries 80 <= 100: fits everywhere.
    big = [Reservation("gold", "A", "C", 60.0), Reservation("silver", "B", "C", 60.0)]
    got = admission(big, triangle(), k=2)
    assert not got.ok
    assert "with link A-C down (and 1 other failures)" in got.reason
    assert "83.3 %; bottleneck link B->C" in got.reason
    small = [Reservation("gold", "A", "C", 40.0), Reservation("silver", "B", "C", 40.0)]
    assert admission(small, triangle(), k=2).ok


def test_windows_that_do_not_overlap_are_checked_apart():
    # 80 each: together 160 > 100 once A-C is down; one at a time 80 <= 100.
    apart = [Reservation("a", "A", "C", 80.0, start=0.0, end=10.0),
             Reservation("b", "A", "C", 80.0, start=10.0, end=20.0)]  # fmt: skip
    assert admission(apart, triangle(), k=2).ok
    together = [apart[0], Reservation("b", "A", "C", 80.0, start=5.0, end=20.0)]
    assert not admission(together, triangle(), k=2).ok
    assert len(overlapping_sets(together)) == 1 and len(overlapping_sets(apart)) == 2


def test_failure_that_cuts_every_tunnel_is_listed_not_refused():
    got = admission([Reservation("gold", "A", "C", 60.0)], line(), k=2)
    assert got.ok
    assert got.uncovered == {("A", "B"): "A->C", ("B", "C"): "A->C"} and got.covered == []


@pytest.mark.parametrize(
    "bad, words",
    [
        (Reservation("g", "A", "Z", 1.0), "unknown DC 'Z'"),
        (Reservation("g", "A", "A", 1.0), "g A->A: dst: same DC as src"),
        (Reservation("g", "A", "C", 0.0), "rate_bytes_per_s: must be a finite number > 0"),
        (Reservation("g", "A", "C", math.inf), "rate_bytes_per_s: must be a finite number"),
        (Reservation("g", "A", "C", True), "rate_bytes_per_s: must be a finite number"),
        (
            Reservation("g", "A", "C", 10.0, ceil=5.0),
            r"ceil_bytes_per_s: must be finite and >= rate_bytes_per_s \(10\), got 5",
        ),
        (Reservation("g", "A", "C", 10.0, start=5.0, end=5.0), "end_s: must be after start_s"),
        (Reservation("g", "A", "C", 10.0, start=math.nan), "end_s: must be after start_s"),
    ],
)
def test_bad_reservation_is_one_line(bad, words):
    with pytest.raises(ReservationError, match=words) as err:
        admission([bad], triangle(), k=2)
    assert "\n" not in str(err.value)


def test_floors_exact_and_scaled():
    paths = {("A", "C"): [("A", "C"), ("A", "B", "C")]}
    got = floors({("g", ("A", "C")): 150.0}, paths, triangle().capacity)
    assert sum(x for _, x in got[("g", ("A", "C"))]) == pytest.approx(150.0)
    cap = {e: c for e, c in triangle().capacity.items() if set(e) != {"A", "C"}}
    got = floors({("g", ("A", "C")): 150.0}, paths, cap)  # A-C down: 100 of 150
    assert sum(x for _, x in got[("g", ("A", "C"))]) == pytest.approx(100.0)


def test_cap_ceilings_scales_only_the_capped_pair():
    rates = {"c1": {("A", "C"): [(("A", "C"), 90.0), (("A", "B", "C"), 30.0)]},
             "c2": {("A", "B"): [(("A", "B"), 50.0)]}}  # fmt: skip
    got = cap_ceilings(rates, {"c1": "g", "c2": "g"}, {("g", ("A", "C")): 60.0})
    assert sum(x for _, x in got["c1"][("A", "C")]) == pytest.approx(60.0)
    assert got["c2"] == rates["c2"]


# ---- enforcement in the tenant round --------------------------------------------------------


def pair_rate(rates, cids, pair):
    return sum(x for c in cids for _, x in rates.get(c, {}).get(pair, ()))


def flood_policy(topology, reservations=()):
    """gold (weight 1) has one coflow A->C; bulk (weight 9) floods every pair."""
    gold = Coflow("g1", 0.0, [Flow("f", "A", "C", 1e6)])
    pairs = [("A", "C"), ("A", "B"), ("B", "C"), ("C", "A")]
    bulk = [Coflow(f"b{i}", 0.0, [Flow("f", s, d, 1e6)]) for i, (s, d) in enumerate(pairs)]
    owner = {"g1": "gold"} | {c.id: "bulk" for c in bulk}
    spec = TenantSpec({"gold": 1.0, "bulk": 9.0}, owner, "cooperative", tuple(reservations))
    policy = TenantPolicy(topology, spec, k=2)
    for c in [gold, *bulk]:
        assert policy.add_coflow(c, 0.0)
    volumes = {c.id: c.flowgroups() for c in [gold, *bulk]}
    return policy, volumes


def check_capacity(rates, capacity):
    load = {}
    for per in rates.values():
        for lst in per.values():
            for p, x in lst:
                for e in zip(p, p[1:], strict=False):
                    load[e] = load.get(e, 0.0) + x
    for e, x in load.items():
        assert x <= capacity[e] * (1 + 1e-9)


def test_reserved_pair_gets_its_rate_while_another_tenant_floods():
    topo = triangle()
    policy, volumes = flood_policy(topo)
    without = pair_rate(policy.group_rates(0.0, volumes), ["g1"], ("A", "C"))
    assert without < 60.0  # weight 1 of 10: HUG alone gives gold less than 60
    policy, volumes = flood_policy(topo, [Reservation("gold", "A", "C", 60.0)])
    rates = policy.group_rates(0.0, volumes)
    assert pair_rate(rates, ["g1"], ("A", "C")) >= 60.0 * (1 - 1e-9)
    check_capacity(rates, topo.capacity)
    bulk = sum(pair_rate(rates, ["b0", "b1", "b2", "b3"], k) for k in [("A", "C"), ("A", "B")])
    gold = pair_rate(rates, ["g1"], ("A", "C"))
    assert bulk > 0 and gold + bulk == pytest.approx(200.0)  # A's 200 B/s out all used


def test_covered_failure_keeps_the_guarantee():
    topo = triangle()
    policy, volumes = flood_policy(topo, [Reservation("gold", "A", "C", 60.0)])
    topo.set_link_state("A", "C", up=False)
    policy.wan_changed(1.0)
    rates = policy.group_rates(1.0, volumes)
    assert pair_rate(rates, ["g1"], ("A", "C")) >= 60.0 * (1 - 1e-9)  # over A-B-C
    check_capacity(rates, {e: c for e, c in topo.capacity.items() if e not in topo.down})


def test_borrowing_up_to_the_ceiling():
    topo = triangle()
    gold = Coflow("g1", 0.0, [Flow("f", "A", "C", 1e6)])
    for ceil, most in ((None, 200.0), (80.0, 80.0)):
        spec = TenantSpec({"gold": 1.0, "bulk": 9.0}, {"g1": "gold"}, "cooperative",
                          (Reservation("gold", "A", "C", 60.0, ceil=ceil),))  # fmt: skip
        policy = TenantPolicy(topo, spec, k=2)
        assert policy.add_coflow(gold, 0.0)
        got = pair_rate(policy.group_rates(0.0, {"g1": gold.flowgroups()}), ["g1"], ("A", "C"))
        assert got == pytest.approx(most)  # alone: borrows both tunnels, or up to the ceiling
    policy, volumes = flood_policy(topo, [Reservation("gold", "A", "C", 60.0, ceil=65.0)])
    rates = policy.group_rates(0.0, volumes)
    got = pair_rate(rates, ["g1"], ("A", "C"))
    assert 60.0 * (1 - 1e-9) <= got <= 65.0 * (1 + 1e-9)
    # what the ceiling took from gold goes to bulk: A's 200 B/s out are all used
    bulk = sum(pair_rate(rates, ["b0", "b1"], k) for k in [("A", "C"), ("A", "B")])
    assert got + bulk == pytest.approx(200.0)
    check_capacity(rates, topo.capacity)


@pytest.mark.parametrize("arrivals", [("big", "small"), ("small", "big")])
def test_guarantee_goes_to_the_tenants_smallest_coflow_on_the_pair(arrivals):
    # gold's big coflow (1e6 bytes A->C) and small one (1e3 bytes A->C), admitted in
    # either order; bulk floods. Gold's Terra serves the small one first (smallest Γ), so
    # the 60 B/s guarantee goes to it on top of its share, whatever the admission order;
    # the big one keeps only what Terra gave it (less than 60: weight 1 of 10).
    topo = triangle()
    size = {"big": 1e6, "small": 1e3}
    gold = [Coflow(n, 0.0, [Flow("f", "A", "C", size[n])]) for n in arrivals]
    bulk = [Coflow("b0", 0.0, [Flow("f", "A", "C", 1e6)]),
            Coflow("b1", 0.0, [Flow("f", "A", "B", 1e6)])]  # fmt: skip
    owner = {c.id: "gold" for c in gold} | {c.id: "bulk" for c in bulk}
    spec = TenantSpec({"gold": 1.0, "bulk": 9.0}, owner, "cooperative",
                      (Reservation("gold", "A", "C", 60.0),))  # fmt: skip
    policy = TenantPolicy(topo, spec, k=2)
    for c in [*gold, *bulk]:
        assert policy.add_coflow(c, 0.0)
    rates = policy.group_rates(0.0, {c.id: c.flowgroups() for c in [*gold, *bulk]})
    assert pair_rate(rates, ["small"], ("A", "C")) >= 60.0 * (1 - 1e-9)
    assert pair_rate(rates, ["big"], ("A", "C")) < 60.0
    assert policy._policies["gold"].round_order() == ["small", "big"]
    check_capacity(rates, topo.capacity)


def test_window_outside_now_changes_nothing():
    topo = triangle()
    late = Reservation("gold", "A", "C", 60.0, start=100.0, end=200.0)
    plain, volumes = flood_policy(topo)
    policy, _ = flood_policy(topo, [late])
    assert policy.group_rates(0.0, volumes) == plain.group_rates(0.0, volumes)
    assert pair_rate(policy.group_rates(150.0, volumes), ["g1"], ("A", "C")) >= 60.0 * (1 - 1e-9)


def test_deadline_admission_counts_every_overlapping_guarantee():
    # A deadline coflow: 1800 bytes A->C in 10 s. Alone on 200 B/s: Γ = 9 s,
    # 9 x 1.1 = 9.9 <= 10 admitted. With a 60 B/s guarantee held: 1800 / 140 = 12.9 s
    # refused, whoever holds it: a round takes the guarantees before the deadline
    # coflows' floors, so the tenant's own guarantee is taken too.
    for reservations, admitted in (((), True), ((Reservation("gold", "A", "C", 60.0),), False)):
        spec = TenantSpec({"gold": 1.0, "bulk": 1.0}, {"d": "bulk", "g": "gold"},
                          "cooperative", reservations)  # fmt: skip
        for cid in ("d", "g"):
            policy = TenantPolicy(triangle(), spec, k=2)
            coflow = Coflow(cid, 0.0, [Flow("f", "A", "C", 1800.0)], 10.0)
            assert policy.add_coflow(coflow, 0.0) is admitted
    spec = TenantSpec({"gold": 1.0, "bulk": 1.0}, {"d": "bulk"}, "cooperative",
                      (Reservation("gold", "A", "C", 60.0, start=20.0, end=30.0),))  # fmt: skip
    policy = TenantPolicy(triangle(), spec, k=2)  # the guarantee starts after the deadline
    assert policy.add_coflow(Coflow("d", 0.0, [Flow("f", "A", "C", 1800.0)], 10.0), 0.0)


def test_reservation_of_unknown_tenant_is_refused():
    with pytest.raises(ValueError, match="reservations of tenants without a weight"):
        TenantSpec({"a": 1.0}, {}, "cooperative", (Reservation("zz", "A", "C", 1.0),))


@pytest.mark.parametrize("seed", range(6))
def test_what_admission_admits_the_round_delivers_under_every_covered_failure(seed):
    """Random 5-DC WANs and reservations: when admitted, every guarantee is routed in full
    with every link up and after each single link failure, on the K paths recomputed over
    the links left (the tunnels the controller would use then), but for the pairs a
    failure that is not covered cuts off."""
    import random

    from topologies.paths import all_pairs_paths

    topo = wan(seed)  # test_tenant_policy's random 5-DC WANs
    dcs, cap = topo.dcs, topo.capacity
    rng = random.Random(seed + 1000)
    admitted: list[Reservation] = []
    for j in range(8):  # ask one by one; keep what is admitted
        src, dst = rng.sample(dcs, 2)
        ask = Reservation(f"t{j % 3}", src, dst, float(rng.randint(1, 8)))
        if admission([*admitted, ask], topo, k=3).ok:
            admitted.append(ask)
    got = admission(admitted, topo, k=3)
    assert got.ok and admitted
    links = sorted({(u, v) for u, v in cap if u < v})
    assert sorted([*got.covered, *got.uncovered]) == links
    for failed in [None, *links]:
        now = topo.copy()
        if failed is not None:
            now.set_link_state(*failed, up=False)
        up = {e: c for e, c in now.capacity.items() if e not in now.down}
        paths = all_pairs_paths(now, 3)
        targets: dict = {}
        cut = got.uncovered.get(failed, "").split(", ")
        for r in admitted:
            if f"{r.src}->{r.dst}" not in cut:  # a pair an uncovered failure cut: no promise
                targets[(r.tenant, r.pair)] = targets.get((r.tenant, r.pair), 0.0) + r.rate
        routed = floors(targets, paths, up)
        for key, rate in targets.items():
            assert sum(x for _, x in routed[key]) == pytest.approx(rate, rel=1e-6), (failed, key)
        check_capacity({str(k): {k[1]: v} for k, v in routed.items()}, up)
