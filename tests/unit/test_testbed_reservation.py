"""The SWAN testbed's guaranteed reservation (mininet_scenarios/testbed_reservation.py)
without switches: the --reserve option, the tenants file it writes, the delivered rate of
the samples and the summary (tests/system/test_testbed_runs.py measures it with real bytes).
"""

from __future__ import annotations

import pytest

from mininet_scenarios import cli
from mininet_scenarios import workload as tb_workload
from mininet_scenarios.run_result import RunResult
from mininet_scenarios.testbed_reservation import (
    PROBE_ID,
    PROBE_S,
    Reserve,
    delivered_rate,
    reservation_lines,
    reservation_summary,
)
from mininet_scenarios.testbed_tenants import (
    per_tenant,
    tenant_lines,
    tenant_summary,
    tenants_toml,
)
from terra_controller.tenants_config import parse_tenants
from topologies import load_topology
from topologies.binding import load_binding

BASE = ["swan", "--quick", "--tenants", "2", "--greedy-tenant"]


def options(tmp_path, *extra):
    args = cli.build_parser().parse_args([*BASE, "--workdir", str(tmp_path), *extra])
    return cli.options_from_args(args, tmp_path)


def test_reserve_option_goes_into_the_tenants_file_in_bytes_per_s(tmp_path):
    opts, workload = options(tmp_path, "--reserve", "t0:HK:BA:4")
    assert opts.reserve == Reserve("t0", "HK", "BA", 500_000.0)  # 4 Mbit/s
    assert workload["reserve"]["rate_bytes_per_s"] == 500_000.0
    path = tenants_toml(opts.tenants, tmp_path / "tenants.toml", opts.reserve)
    config = parse_tenants(path.read_text(), str(path))
    (spec,) = config.tenants["t0"].reservations
    assert (spec.src, spec.dst, spec.rate_bytes_per_s) == ("HK", "BA", 500_000.0)
    assert config.tenants["t1"].reservations in (None, [], ())
    assert options(tmp_path)[0].reserve is None  # the plain tenants run is unchanged


def test_every_run_carries_the_reserved_tenants_probe_on_the_pair(tmp_path):
    """The probe: t0's, first, one flow HK -> BA of PROBE_S s of 4 Mbit/s in whole 64 KiB
    leaves, in the honest and the greedy runs alike (not split, though t1 is greedy)."""
    plain, _ = options(tmp_path)
    opts, workload = options(tmp_path, "--reserve", "t0:HK:BA:4")
    probe = opts.coflows[0]
    assert (probe.trace_id, probe.tenant, probe.arrival_s) == (PROBE_ID, "t0", 0.0)
    (flow,) = probe.flows
    testbed = cli.testbed_topology(tmp_path, opts.link_mbps, opts.hosts_per_dc)
    hosts = {h.name: dc for dc, h in load_binding(load_topology(str(testbed))).all_hosts()}
    assert (hosts[flow["src"]], hosts[flow["dst"]]) == ("HK", "BA")
    assert flow["bytes"] % 65536 == 0 and 0 <= 500_000 * PROBE_S - flow["bytes"] < 65536
    assert opts.coflows[1:] == plain.coflows
    assert opts.greedy_coflows[0] is probe and opts.greedy_coflows[1:] == plain.greedy_coflows
    assert workload["reserve_probe"]["flows"] == [flow]
    # its own figures are not a tenant's: the per-tenant averages leave it out
    run = RunResult(wan_capacity_bps=1.0)
    for c in opts.coflows:
        run.arrival_s[c.trace_id], run.cct_s[c.trace_id] = c.arrival_s, 1.0
    assert {t: v["coflows"] for t, v in per_tenant([run], opts.coflows).items()} == {
        "t0": 3, "t1": 3}  # fmt: skip


@pytest.mark.parametrize(
    ("extra", "words"),
    [
        (("--reserve", "t0:HK:BA"), "give TENANT:SRC:DST:MBPS"),
        (("--reserve", "t7:HK:BA:4"), "tenant 't7' is not one of"),
        (("--reserve", "t0:HK:XX:4"), "unknown DC 'XX'"),
        (("--reserve", "t0:HK:BA:-1"), "MBPS must be a finite number > 0"),
        (("--reserve", "t0:HK:BA:fast"), "MBPS must be a finite number > 0"),
        # HK has two 9.2 Mbit/s links out: 40 Mbit/s does not fit with every link up
        (("--reserve", "t0:HK:BA:40"), "does not fit with every link up"),
    ],
)
def test_a_bad_reserve_is_refused_before_the_run(tmp_path, extra, words):
    with pytest.raises(ValueError, match=words):
        options(tmp_path, *extra)


def test_reserve_needs_tenants(tmp_path, capsys):
    assert cli.main(["swan", "--quick", "--workdir", str(tmp_path), "--reserve", "t0:HK:BA:4"]) == 2
    assert "--reserve needs --tenants" in capsys.readouterr().err


def test_delivered_rate_counts_only_the_time_a_flow_is_open_after_its_first_byte():
    # nothing delivered 0-1 s (start-up), open from 1 s to 3 s (1000 then 1000 more bytes),
    # idle until 5 s, open again 5-6 s (500 bytes): the rate is 1500 bytes over the 2 s after
    # the first byte was seen; the start-up and the idle 2 s do not count; 2500 bytes moved.
    samples = [(0.0, 0, 2), (1.0, 0, 2), (2.0, 1000, 2), (3.0, 2000, 0), (5.0, 2000, 1),
               (6.0, 2500, 0)]  # fmt: skip
    got = delivered_rate(samples)
    assert got == {"rate_bytes_per_s": pytest.approx(1500 / 2), "backlogged_s": 2.0,
                   "bytes": 2500, "first_byte_s": 2.0}  # fmt: skip
    assert delivered_rate([])["rate_bytes_per_s"] is None
    assert delivered_rate([(1.0, 5, 0), (2.0, 5, 0)])["rate_bytes_per_s"] is None
    assert delivered_rate([(0.0, 0, 1), (2.0, 900, 0)])["rate_bytes_per_s"] is None


def test_summary_judges_every_run_against_the_guarantee():
    reserve = Reserve("t0", "HK", "BA", 1000.0)
    honest = RunResult(reserved_pair=[(0.0, 10, 1), (2.0, 2410, 0)])  # 1200 B/s: 120 %
    greedy = RunResult(reserved_pair=[(0.0, 10, 1), (2.0, 1910, 0)])  # 950 B/s: 95 %
    out = reservation_summary(reserve, [honest], [greedy])
    assert out["honest"][0]["fraction"] == pytest.approx(1.2)
    assert out["min_fraction"] == pytest.approx(0.95) and out["target_met"]
    assert "95.0% of the guarantee" in reservation_lines(out)
    slow = RunResult(reserved_pair=[(0.0, 10, 1), (2.0, 1710, 0)])  # 85 %
    assert not reservation_summary(reserve, [honest], [slow])["target_met"]
    unseen = reservation_summary(reserve, [honest], [RunResult()])
    assert unseen["min_fraction"] is None and not unseen["target_met"]
    # tenant_summary carries it, also without greedy runs, and prints it
    honest.cct_s, honest.arrival_s = {1: 2.0}, {1: 0.0}
    raw = {"schedulers": ["terra"], "terra": [honest], "reserve": reserve,
           "tenant_coflows": [tb_workload.TestbedCoflow(1, 0.0, (), "t0")]}  # fmt: skip
    summary = tenant_summary(raw)
    assert summary["reservation"]["greedy"] == [] and summary["reservation"]["target_met"]
    assert "reservation t0 HK->BA 0.008 Mbit/s, honest run 1: 0.01 Mbit/s" in tenant_lines(summary)
