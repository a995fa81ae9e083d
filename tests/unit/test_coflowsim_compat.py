"""CoflowSim compatibility (docs/design.md section 7): the coflowsim-fair rate rule, epoch
admission, MiB rounding, the split big switch, 8-ms steps, and the default model unchanged."""

import json
from pathlib import Path

import pytest

from terra_core.coflowsim_fair import CoflowSimFairPolicy
from terra_core.registry import make_scheduler
from terra_model import Coflow, Flow, WorkloadError
from terra_sim import cli as sim_cli
from terra_sim.engine import on_grid
from terra_sim.simulator import simulate
from topologies import load_topology
from topologies.bigswitch import split_bigswitch_topology
from workloads import MB_BYTES, load_workload
from workloads.coflowsim_trace import epoch_start_ms, load_coflowsim_trace, reducer_bytes

MIB = MB_BYTES
DATA = Path(__file__).parent / "data"


def test_coflowsim_fair_is_min_of_port_over_flows_without_redistribution():
    # 3 racks, ports of 120 B/s. Flows: A 0->1, B 0->2, C 1->2, D 2->2 (within rack 2).
    # Uplink counts: rack 0: 2 (A, B), rack 1: 1 (C), rack 2: 1 (D).
    # Downlink counts: rack 1: 1 (A), rack 2: 3 (B, C, D).
    # A = min(120/2, 120/1) = 60; B = min(120/2, 120/3) = 40; C = min(120/1, 120/3) = 40;
    # D = min(120/1, 120/3) = 40. Rack 0's uplink carries 100 of 120: max-min would give
    # A the 20 left (80), CoflowSim's FAIR does not.
    topo = split_bigswitch_topology(racks=3, port_bytes_per_s=120.0)
    policy = CoflowSimFairPolicy(topo)
    flows = [
        Flow("A", "0", "1.rx", 1e3),
        Flow("B", "0", "2.rx", 1e3),
        Flow("C", "1", "2.rx", 1e3),
        Flow("D", "2", "2.rx", 1e3),
    ]
    policy.add_coflow(Coflow("x", 0.0, flows[:2]), 0.0)
    policy.add_coflow(Coflow("y", 0.0, flows[2:]), 0.0)
    alloc = policy.allocate(0.0, {"x": {"A": 1e3, "B": 1e3}, "y": {"C": 1e3, "D": 1e3}})
    rate = {fid: sum(r for _, r in paths) for c in alloc.values() for fid, paths in c.items()}
    assert rate == {"A": 60.0, "B": 40.0, "C": 40.0, "D": 40.0}
    assert alloc["y"]["D"] == [(("2", "core", "2.rx"), 40.0)]
    # once B is done: rack 0 has 1 flow, rack 2's downlink 2: A = 120, C = D = 60
    alloc = policy.allocate(1.0, {"x": {"A": 1e3}, "y": {"C": 1e3, "D": 1e3}})
    rate = {fid: sum(r for _, r in paths) for c in alloc.values() for fid, paths in c.items()}
    assert rate == {"A": 120.0, "C": 60.0, "D": 60.0}


@pytest.mark.parametrize(
    ("arrival_ms", "admitted_ms"),
    [(0, 0), (1, 0), (10240, 0), (10240.5, 10240), (10833, 10240), (20480, 10240),
     (20481, 20480)],
)  # fmt: skip
def test_epoch_admission(arrival_ms, admitted_ms):
    # CoflowSim admits at epoch start T every coflow arriving up to T + 10240 (inclusive)
    assert epoch_start_ms(arrival_ms) == admitted_ms


@pytest.mark.parametrize(
    ("mb", "mappers", "mib"),
    [([1.0], 1, 1), ([5.0], 2, 6), ([1.5, 2.0], 3, 6), ([0.1], 4, 4), ([9.0], 3, 9),
     ([7.2], 1, 8)],
)  # fmt: skip
def test_reducer_bytes_rounded_up_to_mapper_count_mib(mb, mappers, mib):
    # each reducer up to whole MiB, the rack's sum up to a multiple of the mappers:
    # [1.5, 2] from 3 mappers: 2 + 2 = 4 MiB -> 6 MiB; 7.2 MB -> 8 MiB
    assert reducer_bytes(mb, mappers) == mib * MIB


def test_coflowsim_trace_coalesces_rounds_admits_and_keeps_rack_flows(tmp_path):
    # coflow 3 at 12000 ms: mappers on racks 0, 1, 1 (two mappers of rack 1 become one);
    # reducers rack 1 gets 2 MB, rack 2 gets 1.5 MB and 1 MB (one reducer of 2 + 1 MiB).
    # 2 mapper racks: rack 1 -> 2 MiB (1 MiB a flow), rack 2 -> 3 MiB up to 4 (2 a flow).
    path = tmp_path / "t.txt"
    path.write_text("4 1\n3 12000 3 0 1 1 3 1:2 2:1.5 2:1\n")
    topo = split_bigswitch_topology(racks=4)
    [c] = load_coflowsim_trace(path, lambda r: str(r), lambda r: f"{r}.rx")
    assert c.id == "3" and c.arrival_s == 10.24
    assert [(f.src, f.dst, f.bytes / MIB) for f in c.flows] == [
        ("0", "1.rx", 1.0), ("1", "1.rx", 1.0), ("0", "2.rx", 2.0), ("1", "2.rx", 2.0),
    ]  # fmt: skip
    assert not any(f.intra_dc for f in c.flows)
    assert load_workload(str(path), topo, coflowsim=True)[0].flows == c.flows
    with pytest.raises(WorkloadError, match="rack_rx_dcs"):
        load_workload(str(path), load_topology("bigswitch"), coflowsim=True)


@pytest.mark.parametrize(
    ("now", "step", "grid"),
    [(0.0, 0.003, 0.008), (0.0, 0.008, 0.008), (0.008, 0.0, 0.016), (0.016, 0.0161, 0.04)],
)
def test_on_grid_moves_events_up_to_the_next_8_ms_step(now, step, grid):
    assert now + on_grid(now, step, 0.008) == pytest.approx(grid, abs=1e-12)


def test_quantum_rounds_finishes_up_and_rack_flow_uses_its_ports():
    # rack 0 sends 1 MiB to itself (f) and 1 MiB to rack 1 (g); rack 1 sends 1.5 MiB to
    # rack 0 (h). Ports move 1 MiB per 8 ms.
    topo = split_bigswitch_topology(racks=2)
    coflows = [
        Coflow("a", 0.0, [Flow("f", "0", "0.rx", MIB), Flow("g", "0", "1.rx", MIB)]),
        Coflow("b", 0.0, [Flow("h", "1", "0.rx", 1.5 * MIB)]),
    ]
    result = simulate(make_scheduler("coflowsim-fair", topo.copy()), coflows, quantum_s=0.008)
    cct = {c.id: c.cct_s for c in result.coflows}
    # a: rack 0's downlink has f and h (2 flows): f gets 0.5 MiB / 8 ms, g too (uplink of 0
    # has 2): 16 ms; h: min(1 / 1 uplink, 1/2 downlink) = 0.5 MiB / 8 ms for 16 ms (1 MiB),
    # then alone: 0.5 MiB more in 4 ms, which ends at the 24-ms step
    assert cct == {"a": pytest.approx(0.016), "b": pytest.approx(0.024)}
    assert result.intra_dc_coflows == 0


def test_compat_off_gives_the_default_models_results():
    # the first 40 FB coflows on the default big switch, as computed before compatibility
    # mode existed: every CCT equal to the bit
    expected = json.loads((DATA / "bigswitch_fb40_ccts.json").read_text())["ccts"]
    args = sim_cli.build_parser().parse_args(
        ["--topology", "bigswitch", "--workload", "fb", "--limit", "40"]
    )
    inputs = sim_cli.load_inputs(args)
    assert inputs.quantum_s is None
    for name, ccts in expected.items():
        result = simulate(make_scheduler(name, inputs.topology.copy()), inputs.coflows)
        assert {c.id: c.cct_s for c in result.coflows} == ccts


def test_compat_needs_bigswitch():
    args = sim_cli.build_parser().parse_args(
        ["--topology", "swan", "--workload", "fb", "--coflowsim-compat"]
    )
    with pytest.raises(ValueError, match="needs --topology bigswitch"):
        sim_cli.load_inputs(args)
