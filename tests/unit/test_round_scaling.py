"""benchmarks/round_scaling.py: the synthetic WANs, the coflow generator and the JSON shape."""

import importlib.util
import json
import random
from pathlib import Path

import networkx as nx
import pytest

_SPEC = importlib.util.spec_from_file_location(
    "round_scaling", Path(__file__).resolve().parents[2] / "benchmarks" / "round_scaling.py"
)
round_scaling = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(round_scaling)


@pytest.mark.parametrize("dcs", [10, 25, 100])
def test_synthetic_wan_is_connected_with_degree_3_5_and_seeded(dcs):
    topo = round_scaling.synthetic_wan(dcs, seed=3)
    graph = nx.Graph(list(topo.capacity))
    assert graph.number_of_nodes() == dcs and nx.is_connected(graph)
    # round(3.5 * dcs / 2) undirected links, each two directed links of 1 Gbps = 1.25e8 B/s
    assert graph.number_of_edges() == round(3.5 * dcs / 2)
    assert set(topo.capacity.values()) == {1.25e8}
    assert round_scaling.synthetic_wan(dcs, seed=3).capacity == topo.capacity
    assert round_scaling.synthetic_wan(dcs, seed=4).capacity != topo.capacity


def test_coflow_widths_and_sizes_stay_in_their_bounds():
    rng = random.Random(0)
    dcs = [f"S{i}" for i in range(10)]
    coflows = [round_scaling.random_coflow(f"c{i}", dcs, rng, 0.0) for i in range(500)]
    widths = [len(c.flows) for c in coflows]
    assert min(widths) >= 1 and max(widths) <= round_scaling.MAX_WIDTH
    assert max(widths) > 5  # heavy tail: some wide coflows among 500
    sizes = [f.bytes for c in coflows for f in c.flows]
    assert min(sizes) >= round_scaling.MIN_BYTES and max(sizes) <= round_scaling.MAX_BYTES
    assert all(f.src != f.dst for c in coflows for f in c.flows)


def test_main_writes_the_cells(tmp_path, capsys):
    out = tmp_path / "r.json"
    argv = ["--topologies", "synth10", "swan", "--coflows", "5", "20", "--rounds", "3"]
    assert round_scaling.main([*argv, "--json", str(out)]) == 0
    cells = json.loads(out.read_text())["cells"]
    assert [(c["topology"], c["dcs"], c["coflows"]) for c in cells] == [
        ("synth10", 10, 5),
        ("synth10", 10, 20),
        ("swan", 5, 5),
        ("swan", 5, 20),
    ]
    for c in cells:
        assert 0 < c["round_ms_median"] <= c["round_ms_p95"]
        assert c["lps_per_round"] >= 0
    assert "growth in N on swan" in capsys.readouterr().out


def test_tenants_run_assigns_coflow_i_to_tenant_i_mod_n_and_reports_both(tmp_path, capsys):
    run = round_scaling._Run(round_scaling.make_topology("swan"), 7, seed=1, tenants=3)
    assert run.policy.spec.tenant_of == {f"c{i}": f"t{i % 3}" for i in range(7)}
    run.step()
    assert len(run.remaining) == 7  # finished coflows are replaced at once
    out = tmp_path / "t.json"
    argv = ["--topologies", "swan", "--coflows", "6", "--rounds", "3", "--tenants", "3"]
    assert round_scaling.main([*argv, "--json", str(out)]) == 0
    (cell,) = json.loads(out.read_text())["cells"]
    assert cell["tenants"] == 3
    assert 0 < cell["tenant_round_ms_median"] <= cell["tenant_round_ms_p95"]
    # Step A alone solves an LP per active tenant: more LPs a round than plain Terra
    assert cell["tenant_lps_per_round"] > cell["lps_per_round"]
    assert cell["ratio"] == pytest.approx(cell["tenant_round_ms_median"] / cell["round_ms_median"])
    # HiGHS's seconds are part of the round's: more than none (LPs ran), less than the round
    assert 0 < cell["tenant_solver_s"] < 3 * cell["tenant_round_ms_p95"] / 1000.0
    assert "| " in capsys.readouterr().out


def test_both_tenant_orders_run_interleaved_in_one_cell(tmp_path, capsys):
    out = tmp_path / "o.json"
    argv = ["--topologies", "swan", "--coflows", "6", "--rounds", "2", "--tenants", "3"]
    assert round_scaling.main([*argv, "--tenant-order", "share", "wan", "--json", str(out)]) == 0
    (cell,) = json.loads(out.read_text())["cells"]
    for key, suffix in (("tenant_", ""), ("tenant_share_", "_share")):  # wan: the default
        assert cell[key + "round_ms_median"] > 0 and cell[key + "cpu_s"] > 0
        assert cell["ratio" + suffix] == pytest.approx(
            cell[key + "round_ms_median"] / cell["round_ms_median"]
        )
        assert cell["cpu_ratio" + suffix] == pytest.approx(cell[key + "cpu_s"] / cell["cpu_s"])
    assert " share " in capsys.readouterr().out
    run = round_scaling._Run(round_scaling.make_topology("swan"), 4, tenants=2, order="share")
    assert run.policy.spec.order == "share"
    with pytest.raises(SystemExit):
        round_scaling.main([*argv, "--tenant-order", "fast"])
