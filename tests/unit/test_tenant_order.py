"""The Γ order inside each tenant's share (tenant_shares.ORDERS, docs/design.md 4.5): "share"
orders a tenant's coflows by Γ on its share, "wan" by Γ on the whole WAN (Terra's cached Γ);
the option is parsed and checked wherever tenants are configured, and with one tenant either
order is plain Terra."""

from __future__ import annotations

import argparse
import json
from typing import get_args

import pytest

from terra_controller.tenant_cli import scheduler_factory
from terra_controller.tenants import TenantBook
from terra_controller.tenants_config import Order, TenantsError, parse_tenants
from terra_core.policy import PolicyState
from terra_core.registry import SchedulerOptions, make_scheduler
from terra_core.tenant_policy import TenantPolicy, TenantSpec
from terra_core.tenant_shares import DEFAULT_ORDER, ORDERS
from terra_core.terra_policy import TerraPolicy
from terra_model import Coflow, Flow
from terra_sim import cli
from terra_sim.simulator import simulate
from topologies import Topology, load_topology

# ---- the option ---------------------------------------------------------------------------


def test_the_spec_takes_each_order_and_refuses_others_in_one_line():
    assert TenantSpec({"a": 1.0}).order == DEFAULT_ORDER == "wan"
    for order in ORDERS:
        assert TenantSpec({"a": 1.0}, order=order).order == order
    with pytest.raises(ValueError) as err:
        TenantSpec({"a": 1.0}, order="fast")
    assert str(err.value) == "tenant order must be one of share, wan, got 'fast'"
    with pytest.raises(ValueError, match="order must be one of share, wan"):
        TerraPolicy(line()).group_rates(0.0, {}, line().capacity, order="fast")


def test_changing_weights_or_reservations_keeps_the_order():
    policy = TenantPolicy(line(), TenantSpec({"a": 1.0}, order="share"))
    policy.set_weights({"a": 1.0, "b": 2.0})
    policy.set_reservations([])
    assert policy.spec.order == "share" and policy.spec.weights == {"a": 1.0, "b": 2.0}


def test_terra_sim_parses_the_order_and_refuses_a_bad_one(tmp_path, capsys):
    argv = ["--topology", "swan", "--workload", "fb", "--scheduler", "terra", "--limit", "3"]
    assert cli.build_parser().parse_args(argv).tenant_order == "wan"
    out = tmp_path / "r.json"
    assert cli.main([*argv, "--tenants", "2", "--tenant-order", "share", "--json", str(out)]) == 0
    assert json.loads(out.read_text())["meta"]["tenant_order"] == "share"
    capsys.readouterr()
    with pytest.raises(SystemExit) as stop:
        cli.main([*argv, "--tenants", "2", "--tenant-order", "fast"])
    assert stop.value.code == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last == (
        "terra-sim: error: argument --tenant-order: invalid choice: 'fast' "
        "(choose from 'share', 'wan')"
    )


TWO = "[tenants.gold]\nweight = 3\n\n[tenants.bronze]\nweight = 1\n"


def test_the_tenants_file_takes_the_order_and_the_controller_uses_it():
    assert get_args(Order) == ORDERS  # the file's names are the policy's
    assert parse_tenants(TWO).order == "wan"
    config = parse_tenants('order = "share"\n' + TWO, "t.toml")
    book = TenantBook(config, b"")
    assert book.view()["order"] == "share"
    factory = scheduler_factory(argparse.Namespace(scheduler="terra"), load_topology("swan"),
                                SchedulerOptions(), book)  # fmt: skip
    assert factory().inner.spec.order == "share"
    with pytest.raises(TenantsError) as err:
        parse_tenants('order = "fast"\n' + TWO, "t.toml")
    assert str(err.value) == "t.toml: line 1: order: invalid enum value 'fast'"


# ---- what the orders do -------------------------------------------------------------------


def line() -> Topology:
    """A - B - C, 10 bytes/s each way: one path per DC pair."""
    cap = {}
    for u, v in (("A", "B"), ("B", "C")):
        cap[(u, v)] = cap[(v, u)] = 10.0
    return Topology("line", ["A", "B", "C"], cap)


def two_tenants(order: str) -> tuple[TenantPolicy, dict]:
    """Tenant x: c1 (A->B 10 B, B->C 1 B; Γ on the WAN 1 s) and c2 (B->C 15 B; 1.5 s); tenant
    y: A->B 1000 B. Step A (s = 1/2 each; Γ_x = 1.6 s, Γ_y = 100 s) gives x the rates
    3.125μ on A->B and 5μ on B->C, y 5μ on A->B: μ* = 10/8.125, x's share 3.846 B/s of A->B
    and 6.154 of B->C. On it Γ(c1) = 10/3.846 = 2.6 s > Γ(c2) = 15/6.154 = 2.44 s: the share
    orders c2 first, the WAN c1 first (strict sharing: no leftover blurs the rates)."""
    coflows = [
        Coflow("c1", 0.0, [Flow("a", "A", "B", 10.0), Flow("b", "B", "C", 1.0)]),
        Coflow("c2", 0.0, [Flow("a", "B", "C", 15.0)]),
        Coflow("y1", 0.0, [Flow("a", "A", "B", 1000.0)]),
    ]
    owner = {"c1": "x", "c2": "x", "y1": "y"}
    spec = TenantSpec({"x": 1.0, "y": 1.0}, owner, "strict", order=order)
    policy = TenantPolicy(line(), spec, measure=True)
    for c in coflows:
        assert policy.add_coflow(c, 0.0)
    return policy, {c.id: c.flowgroups() for c in coflows}


def rate_on(rates, cid, pair) -> float:
    return sum(x for _, x in rates.get(cid, {}).get(pair, ()))


def test_share_order_serves_the_smaller_gamma_on_the_share_first():
    policy, vols = two_tenants("share")
    rates = policy.group_rates(0.0, vols)
    # c2 took x's whole share of B->C; c1, whose B->C FlowGroup can then get nothing, waits
    assert policy.state("c2") == PolicyState.RUNNING
    assert policy.state("c1") == PolicyState.PREEMPTED
    assert rate_on(rates, "c1", ("B", "C")) == 0.0
    assert rate_on(rates, "c2", ("B", "C")) == pytest.approx(10 * 5 / 8.125, rel=1e-6)


def test_wan_order_serves_the_smaller_gamma_on_the_wan_first():
    policy, vols = two_tenants("wan")
    rates = policy.group_rates(0.0, vols)
    # c1 first: its min-CCT on the share (A->B bottleneck: λ = 3.846 / 10), then c2 the rest
    assert policy.state("c1") == PolicyState.RUNNING
    assert policy.state("c2") == PolicyState.RUNNING
    lam = 10 * 3.125 / 8.125 / 10.0
    assert rate_on(rates, "c1", ("A", "B")) == pytest.approx(10 * lam, rel=1e-6)
    assert rate_on(rates, "c1", ("B", "C")) == pytest.approx(1 * lam, rel=1e-6)
    assert rate_on(rates, "c2", ("B", "C")) == pytest.approx(10 * 5 / 8.125 - lam, rel=1e-6)
    # the order changes nothing of the guarantee: it is Step A's
    assert policy.stats["achieved"][-1] >= policy.stats["guarantee"][-1] * (1 - 1e-9)


def test_wan_order_keeps_the_gammas_between_rounds():
    """The second round on the same volumes needs no ordering LP with "wan" (Γ cached on the
    WAN), while "share" solves them again."""
    lps = {}
    for order in ORDERS:
        policy, vols = two_tenants(order)
        policy.group_rates(0.0, vols)
        first = policy.stats["lps"]
        policy.group_rates(0.0, vols)
        lps[order] = policy.stats["lps"] - first
    assert lps["wan"] < lps["share"]


# ---- one tenant is Terra ------------------------------------------------------------------


def workload() -> list[Coflow]:
    """Six coflows on SWAN arriving over 2 s, overlapping on HK->NY."""
    pairs = [("HK", "NY"), ("HK", "LA"), ("NY", "BA"), ("LA", "FL"), ("HK", "NY"), ("BA", "HK")]
    return [
        Coflow(f"c{i}", 0.4 * i, [Flow("f0", src, dst, 2e9 * (6 - i)), Flow("f1", "HK", "NY", 1e9)])
        for i, (src, dst) in enumerate(pairs)
    ]


@pytest.mark.parametrize("order", ORDERS)
def test_one_tenant_is_terra_with_either_order(order):
    swan = load_topology("swan")
    coflows = workload()
    spec = TenantSpec({"only": 1.0}, {c.id: "only" for c in coflows}, order=order)
    a = simulate(make_scheduler("terra", swan.copy()), coflows)
    b = simulate(make_scheduler("terra", swan.copy(), SchedulerOptions(tenants=spec)), coflows)
    assert [(c.id, c.finish_s) for c in a.coflows] == [(c.id, c.finish_s) for c in b.coflows]


def test_a_share_equal_to_the_wan_ordered_on_the_wan_is_terras_round():
    """With the share the whole WAN, the "wan" order's round is plain Terra's, bit for bit."""
    swan = load_topology("swan")
    coflows = workload()
    vols = {c.id: c.flowgroups() for c in coflows}
    plain, shared = TerraPolicy(swan.copy()), TerraPolicy(swan.copy())
    for c in coflows:
        plain.add_coflow(c, 0.0)
        shared.add_coflow(c, 0.0)
    for _ in range(2):  # the second round with the Γ cache
        want = plain.group_rates(1.0, vols)
        assert shared.group_rates(1.0, vols, dict(swan.capacity), order="wan") == want
