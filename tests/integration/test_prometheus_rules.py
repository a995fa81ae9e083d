"""deploy/prometheus/terra-rules.yml: promtool accepts the rules, and its unit tests (input
series -> expected alerts and recorded values) pass."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

RULES = Path(__file__).resolve().parents[2] / "deploy" / "prometheus"

promtool = pytest.mark.skipif(
    shutil.which("promtool") is None, reason="promtool missing (apt-get install prometheus)"
)


@promtool
def test_promtool_accepts_the_rules():
    out = subprocess.run(["promtool", "check", "rules", str(RULES / "terra-rules.yml")],
                         capture_output=True, text=True, timeout=60)  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr
    assert "SUCCESS" in out.stdout


@promtool
def test_the_alerts_fire_on_the_series_that_should_raise_them():
    # Link LA->NY down for 10 s, a failed coflow, an agent gone for a minute, the
    # controller's scrape failing, rounds at p95 2.37 s: see terra-rules.test.yml.
    out = subprocess.run(["promtool", "test", "rules", "terra-rules.test.yml"], cwd=RULES,
                         capture_output=True, text=True, timeout=60)  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr
