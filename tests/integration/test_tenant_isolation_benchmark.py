"""benchmarks/tenant_isolation.py end to end on a small slice (SWAN, the first 12 FB
coflows, 3 tenants, the greedy tenant in 3 pieces): every policy runs and its cell has
the JSON the README documents, with figures that could be wrong."""

from __future__ import annotations

import json

import pytest

from benchmarks import tenant_isolation


def test_every_policy_gives_its_cell_and_ours_reaches_the_optimum(tmp_path):
    out = tmp_path / "cells.json"
    argv = ["--topology", "swan", "--tenants", "3", "--limit", "12", "--pieces", "3"]
    assert tenant_isolation.main([*argv, "--json", str(out)]) == 0
    cells = {c["policy"]: c for c in json.loads(out.read_text())["cells"]}
    assert list(cells) == ["terra", "static", "maxmin", "tenants"]
    for c in cells.values():
        assert set(c["per_tenant"]) == {"t0", "t1", "t2"}
        assert c["multi_tenant_rounds"] > 0
        assert 0 < c["jain_index"] <= 1 + 1e-12
        assert c["greedy_honest_avg_cct_change"] is not None
    ours = cells["tenants"]
    assert ours["min_isolation_guarantee"] == pytest.approx(
        ours["optimal_isolation_guarantee"], abs=1e-6
    )
    # Progress in proportion to the weights: ours and the static partition near 1; plain
    # Terra serves one tenant's coflow at a time, far from it.
    assert ours["jain_index"] > 0.95 and cells["static"]["jain_index"] > 0.95
    assert cells["terra"]["jain_index"] < 0.8


def test_jain_index_of_equal_and_of_one_sided_values():
    assert tenant_isolation.jain_index([2.0, 2.0, 2.0]) == pytest.approx(1.0)
    assert tenant_isolation.jain_index([3.0, 0.0, 0.0]) == pytest.approx(1 / 3)
