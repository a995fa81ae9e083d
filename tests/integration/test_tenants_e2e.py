"""Tenants live: `terra-controller --tenants FILE --no-openflow` with three loopback agents
(test_controller_e2e.System). Two job certificates of two tenants (weights 3:1) submit
coflows over the same DC pair; the rates the controller gives follow the weights; a job of
a tenant not in the file is refused; `ctl tenant set` changes the split live, a bad value
changes nothing, and a restart or a failover to a standby on etcd keeps the change (and a
reservation);
`ctl tenant reserve` gives a tenant its guaranteed rate (up to its ceiling) and refuses one
that does not fit with the reason."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest
from test_controller_e2e import System, flow

from terra_controller.client import TerraClient, TerraError
from terra_security.pki import Role, issue

TENANTS = "[tenants.gold]\nweight = 3\n\n[tenants.bronze]\nweight = 1\n"
JOBS = {"gold-etl": "gold", "bronze-adhoc": "bronze", "stranger": "silver"}
SIZE = 4_000_000_000  # bytes per coflow: far more than the test lets through (40 MB/s)


@pytest.fixture(scope="module")
def system(tmp_path_factory, pki):
    for name, tenant in JOBS.items():
        if not (pki / f"{name}.crt").exists():
            issue(pki, Role.JOB, name, tenant=tenant)
    workdir = tmp_path_factory.mktemp("tenants")
    (workdir / "tenants.toml").write_text(TENANTS)
    s = System(workdir, pki, extra=("--tenants", str(workdir / "tenants.toml")))
    yield s
    s.stop()


def client(system: System, name: str) -> TerraClient:
    host, port = system.api.split(":")
    return TerraClient(host, int(port), pki=system.pki, name=name, timeout=20)


def ctl(system: System, *argv: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "terra_controller.cli", "ctl", "--api", system.api,
         "--pki", str(system.pki), "--name", "operator1", *argv],
        capture_output=True, text=True, timeout=30,
    )  # fmt: skip


def tenant_rates(system: System) -> dict[str, float]:
    return {r["name"]: r["allocated_bytes_per_s"] for r in system.get("/tenants")["tenants"]}


def ratio_settles(system: System, expected: float, timeout: float = 15.0) -> dict:
    """Wait until gold/bronze rates are `expected` (within 5 %); the last /tenants rates."""
    end = time.monotonic() + timeout
    while True:
        rates = tenant_rates(system)
        gold, bronze = rates["gold"], rates["bronze"]
        if bronze > 0 and abs(gold / bronze - expected) < 0.05 * expected:
            return rates
        if time.monotonic() > end:
            raise AssertionError(f"gold/bronze never {expected}: {rates}")
        time.sleep(0.2)


def own_rate(c: TerraClient, cid: int) -> float:
    """The coflow's rate (bytes/s) as its job sees it in its status."""
    return sum(f["rate_bytes_per_s"] for f in c.check_status(cid)["flows"])


def test_rates_follow_tenant_weights_and_change_live(system):
    gold, bronze = client(system, "gold-etl"), client(system, "bronze-adhoc")
    g = gold.submit_coflow([flow("g", "a1", "b1", SIZE)])
    b = bronze.submit_coflow([flow("b", "a1", "b1", SIZE)])
    try:
        rates = ratio_settles(system, 3.0)
        # the pair A->B has two paths of 20 MB/s: together the tenants use both
        assert sum(rates.values()) == pytest.approx(40e6, rel=0.05)
        assert own_rate(gold, g) / own_rate(bronze, b) == pytest.approx(3.0, rel=0.05)
        assert gold.check_status(g)["tenant"] == "gold"
        mine = gold.tenant_request({"op": "tenant"})["tenant"]
        assert (mine["name"], mine["weight"], mine["active_coflows"]) == ("gold", 3.0, 1)
        metrics = urlopen_text(system, "/metrics")
        assert 'terra_tenant_allocated_bytes_per_second{tenant="gold"}' in metrics

        bad = ctl(system, "tenant", "set", "bronze", "--weight", "-1")
        assert bad.returncode == 1 and len(bad.stderr.strip().splitlines()) == 1
        assert "weight" in bad.stderr
        assert system.get("/tenants")["tenants"][1]["weight"] == 1.0

        done = ctl(system, "tenant", "set", "bronze", "--weight", "3",
                   "--max-reserved-bytes-per-s", "1e8")  # fmt: skip
        assert done.returncode == 0, done.stderr
        assert system.get("/tenants")["tenants"][1]["max_reserved_bytes_per_s"] == 1e8
        ratio_settles(system, 1.0)
    finally:
        gold.cancel_coflow(g)
        bronze.cancel_coflow(b)
        gold.close()
        bronze.close()


def test_a_job_of_an_unknown_tenant_is_refused(system):
    stranger = client(system, "stranger")
    try:
        with pytest.raises(TerraError) as refused:
            stranger.submit_coflow([flow("s", "a1", "b1", 1000)])
        assert refused.value.code == "unknown_tenant"
    finally:
        stranger.close()


def settles(system: System, check, timeout: float = 15.0) -> dict:
    """Wait until check(/tenants rates) holds; the last rates."""
    end = time.monotonic() + timeout
    while True:
        rates = tenant_rates(system)
        if check(rates):
            return rates
        if time.monotonic() > end:
            raise AssertionError(f"rates never settled: {rates}")
        time.sleep(0.2)


def test_a_reservation_holds_live_and_one_that_does_not_fit_is_refused(system):
    # A->B has two tunnels of 20 MB/s (A-B, A-C-B): 40 MB/s, 20 MB/s with one link down.
    gold, bronze = client(system, "gold-etl"), client(system, "bronze-adhoc")
    g = gold.submit_coflow([flow("g", "a1", "b1", SIZE)])
    b = bronze.submit_coflow([flow("b", "a1", "b1", SIZE)])
    try:
        settles(system, lambda r: r["bronze"] > 0 and r["gold"] > 0)
        done = ctl(system, "tenant", "reserve", "bronze", "--src", "A", "--dst", "B",
                   "--rate-bytes-per-s", "15e6", "--ceil-bytes-per-s", "16e6")  # fmt: skip
        assert done.returncode == 0, done.stderr
        # at least its 15 MB/s, at most its ceiling of 16 MB/s, whatever the weights
        settles(system, lambda r: 15e6 * 0.98 <= r["bronze"] <= 16e6 * 1.02 and r["gold"] > 0)
        # 15 + 10 = 25 MB/s > 20 MB/s once A-B (or A-C, C-B) fails: refused, nothing changed
        refused = ctl(system, "tenant", "reserve", "gold", "--src", "A", "--dst", "B",
                      "--rate-bytes-per-s", "10e6")  # fmt: skip
        assert refused.returncode == 1 and len(refused.stderr.strip().splitlines()) == 1
        assert "does not fit with link" in refused.stderr and "fit only 80.0 %" in refused.stderr
        rows = {r["name"]: r for r in system.get("/tenants")["tenants"]}
        assert rows["gold"]["reservations"] == []
        assert rows["bronze"]["reservations"][0]["rate_bytes_per_s"] == 15e6
    finally:
        ctl(system, "tenant", "unreserve", "bronze", "--src", "A", "--dst", "B")
        gold.cancel_coflow(g)
        bronze.cancel_coflow(b)
        gold.close()
        bronze.close()


def test_a_restart_keeps_the_live_change(system):
    assert ctl(system, "tenant", "set", "silver", "--weight", "2").returncode == 0
    system.stop_controller()
    system.start_controller()
    system.wait_agents()
    weights = {r["name"]: r["weight"] for r in system.get("/tenants")["tenants"]}
    assert weights["silver"] == 2.0
    listed = ctl(system, "tenant", "list")
    assert listed.returncode == 0 and '"silver"' in listed.stdout


def urlopen_text(system: System, path: str) -> str:
    import urllib.request

    with urllib.request.urlopen(system.rest + path, timeout=5, context=system.rest_tls) as r:
        return r.read().decode()


def test_a_new_leader_keeps_the_live_change(tmp_path, pki):
    from test_controller_ha import Cluster

    (tmp_path / "tenants.toml").write_text(TENANTS)
    cluster = Cluster(tmp_path, pki, extra=("--tenants", str(tmp_path / "tenants.toml")))
    try:
        cluster.start_controller(0)
        cluster.ready(0, 60)
        cluster.start_controller(1)
        first = cluster.client(0)
        changed = first.tenant_request({"op": "tenant_set", "name": "bronze", "weight": 2.5,
                                        "max_coflows": 7})  # fmt: skip
        assert changed["tenant"]["weight"] == 2.5
        reserved = first.tenant_request({"op": "tenant_reserve", "name": "gold", "src": "A",
                                         "dst": "C", "rate_bytes_per_s": 5e6})  # fmt: skip
        assert reserved["tenant"]["reservations"][0]["rate_bytes_per_s"] == 5e6
        first.close()
        cluster.controllers[0].kill()  # SIGKILL: its lease expires, the standby leads
        cluster.ready(1, 60)
        second = cluster.client(1)
        rows = {r["name"]: r for r in second.tenant_request({"op": "tenants"})["tenants"]}
        second.close()
        assert (rows["bronze"]["weight"], rows["bronze"]["max_coflows"]) == (2.5, 7)
        assert rows["gold"]["weight"] == 3.0
        assert [(x["src"], x["dst"]) for x in rows["gold"]["reservations"]] == [("A", "C")]
    finally:
        cluster.stop()
