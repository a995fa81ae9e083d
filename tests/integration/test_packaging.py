"""Packaging: what `pip install .` pulls (no testbed, plotting or benchmark dependencies), the
license and authors metadata, and benchmarks that run without sys.path edits."""

from __future__ import annotations

import importlib
import subprocess
import sys
import tomllib
from importlib.metadata import metadata
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
BENCHMARKS = sorted(p.stem for p in (ROOT / "benchmarks").glob("*.py") if p.stem != "__init__")


def names(requirements: list[str]) -> set[str]:
    """Distribution names of PEP 508 requirement strings (lower case)."""
    import re

    return {re.split(r"[<>=!~\[; ]", r, maxsplit=1)[0].lower() for r in requirements}


def test_core_dependencies_leave_out_the_extras():
    core = names(PYPROJECT["project"]["dependencies"])
    assert not core & {"mininet", "matplotlib", "tqdm", "psutil"}
    extras = PYPROJECT["project"]["optional-dependencies"]
    assert names(extras["testbed"]) == {"mininet"}
    assert names(extras["plots"]) == {"matplotlib"}
    assert "tqdm" in names(extras["sim"])
    # The development environment (plain `uv sync`) still has every extra's packages.
    dev = names(PYPROJECT["dependency-groups"]["dev"])
    assert set().union(*(names(v) for v in extras.values())) <= dev
    assert "uv sync --all-extras" in (ROOT / "scripts" / "install.sh").read_text()


def test_license_and_authors():
    meta = metadata("terra")
    assert meta["License-Expression"] == "MIT" or meta["License"] == "MIT"
    assert "MIT License" in (ROOT / "LICENSE").read_text()
    assert PYPROJECT["project"]["authors"]


def test_agent_and_controller_import_no_optional_dependency():
    code = (
        "import sys; import terra_agent.cli, terra_controller.cli, terra_controller.rest, "
        "terra_sim.cli, mininet_scenarios.cli; "
        "bad = [m for m in ('mininet', 'matplotlib', 'tqdm', 'psutil') if m in sys.modules]; "
        "print(bad); sys.exit(1 if bad else 0)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.parametrize("name", BENCHMARKS)
def test_benchmark_imports_without_sys_path_edits(name):
    assert "sys.path" not in (ROOT / "benchmarks" / f"{name}.py").read_text()
    module = importlib.import_module(f"benchmarks.{name}")
    assert module.__doc__


@pytest.mark.parametrize("name", ["foi_ceiling", "api_throughput", "controller_memory"])
def test_benchmark_runs_as_a_script(name):
    """`uv run python benchmarks/NAME.py` (scripts that share code with other modules)."""
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / f"{name}.py"), "--help"],
        capture_output=True, text=True, timeout=60, cwd=ROOT,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "usage:" in done.stdout
