"""Static checks in the test run: the type checker, the linter and the formatter pass on the
checkout.

`python -m mypy` checks the packages with the flags of pyproject.toml's [tool.mypy]
(terra_model, terra_wire, terra_security and terra_core with the flags of `mypy --strict`);
`ruff check .` the whole tree with [tool.ruff]'s rules, and `ruff format --check .` its layout.
All run from the repository root, in a subprocess of this interpreter, so they see this
checkout's packages and configuration.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TIMEOUT_S = 600  # a first mypy run, without its cache, takes ~7 s


def _run(module: str, *args: str) -> subprocess.CompletedProcess[str]:
    """Run `python -m module args` at the repository root; skip when it is not installed."""
    if importlib.util.find_spec(module) is None:
        pytest.skip(f"{module} is not installed (it is in pyproject's dev group: uv sync)")
    return subprocess.run(
        [sys.executable, "-m", module, *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
    )


def test_the_typed_layers_pass_mypy():
    done = _run("mypy")
    assert done.returncode == 0, f"mypy found errors:\n{done.stdout}{done.stderr}"
    assert "Success" in done.stdout, done.stdout


def test_the_tree_passes_ruff_check():
    done = _run("ruff", "check", ".")
    assert done.returncode == 0, f"ruff check found problems:\n{done.stdout}{done.stderr}"


def test_the_tree_is_formatted():
    done = _run("ruff", "format", "--check", ".")
    assert done.returncode == 0, f"run `ruff format .`:\n{done.stdout}{done.stderr}"
