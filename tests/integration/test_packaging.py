"""Packaging: what `pip install .` pulls (an agent host's packages: no controller, testbed,
plotting or benchmark dependencies), what each extra adds, the license and authors metadata,
and benchmarks that run without sys.path edits."""

from __future__ import annotations

import importlib
import re
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
    return {re.split(r"[<>=!~\[; ]", r, maxsplit=1)[0].lower() for r in requirements}


AGENT_DISTRIBUTIONS = {
    "trio", "msgpack", "msgspec", "cryptography", "blake3", "isal", "prometheus-client",
}  # fmt: skip
SCHEDULER_DISTRIBUTIONS = {"networkx", "highspy", "numpy", "numba"}
# OpenFlow, REST, the shared state of several controllers (etcd)
CONTROLLER_DISTRIBUTIONS = SCHEDULER_DISTRIBUTIONS | {"os-ken", "webob", "routes", "h11", "etcd3gw"}


def test_core_dependencies_are_the_agents():
    """`pip install .` is an agent host's install: no controller, testbed, plotting or
    benchmark package (no numba, llvmlite or os-ken)."""
    assert names(PYPROJECT["project"]["dependencies"]) == AGENT_DISTRIBUTIONS
    extras = PYPROJECT["project"]["optional-dependencies"]
    assert names(extras["controller"]) == CONTROLLER_DISTRIBUTIONS
    assert names(extras["sim"]) == SCHEDULER_DISTRIBUTIONS | {"tqdm", "distributed"}
    assert names(extras["testbed"]) == CONTROLLER_DISTRIBUTIONS | {"mininet"}
    assert names(extras["plots"]) == {"matplotlib"}
    assert names(extras["bench"]) == CONTROLLER_DISTRIBUTIONS | {"psutil", "tqdm", "distributed"}
    # The development environment (plain `uv sync`) still has every extra's packages.
    dev = names(PYPROJECT["dependency-groups"]["dev"])
    assert set().union(*(names(v) for v in extras.values())) <= dev
    assert "uv sync --all-extras" in (ROOT / "scripts" / "install.sh").read_text()


def requirement_closure(roots: set[str]) -> set[str]:
    """The installed distributions `roots` need, recursively (their own extras left out;
    environment markers not evaluated, so a superset), as normalized lower-case names."""
    from importlib.metadata import PackageNotFoundError, requires

    seen: set[str] = set()
    todo = list(roots)
    while todo:
        name = re.sub(r"[-_.]+", "-", todo.pop().lower())
        if name in seen:
            continue
        seen.add(name)
        try:
            needs = requires(name) or []
        except PackageNotFoundError:
            continue
        todo += [next(iter(names([r]))) for r in needs if "extra ==" not in r]
    return seen


def test_agent_and_client_import_only_the_core_dependencies():
    """Every module of the agent's layers (terra_agent, overlay, terra_wire, terra_security,
    terra_model) and the client imports only distributions of the core dependencies."""
    code = (
        "import sys, pkgutil, importlib; base = set(sys.modules)\n"
        "import terra_controller.client, terra_security.pki\n"
        "for p in ('terra_agent', 'overlay', 'terra_wire', 'terra_security', 'terra_model'):\n"
        "    for m in pkgutil.walk_packages(importlib.import_module(p).__path__, p + '.'):\n"
        "        importlib.import_module(m.name)\n"
        "from cryptography import x509\n"  # terra_security.pki's, imported where it is used
        "print(' '.join(sorted({m.split('.')[0] for m in set(sys.modules) - base})))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=ROOT
    )
    assert done.returncode == 0, done.stderr
    from importlib.metadata import packages_distributions

    owners = packages_distributions()
    imported = {d.lower() for m in done.stdout.split() for d in owners.get(m, [])} - {"terra"}
    assert imported, done.stdout
    allowed = requirement_closure(AGENT_DISTRIBUTIONS)
    normalized = {re.sub(r"[-_.]+", "-", d) for d in imported}
    assert normalized <= allowed, normalized - allowed
    assert not normalized & (CONTROLLER_DISTRIBUTIONS | {"llvmlite"})


def test_controller_without_its_extra_names_it():
    """A missing package of the 'controller' extra stops terra-controller with a message
    naming the extra (exit status 1); `ctl` and `pki` do not need it."""
    hide = "import sys; sys.modules.update(dict.fromkeys(['numba', 'networkx', 'os_ken']))"
    run = (
        f"{hide}; from terra_controller.cli import main; "
        "sys.exit(main(['--topology', 'swan', '--insecure', '--no-openflow']))"
    )
    done = subprocess.run(
        [sys.executable, "-c", run], capture_output=True, text=True, timeout=60, cwd=ROOT
    )
    assert done.returncode == 1
    assert "install the 'controller' extra: pip install 'terra[controller]'" in done.stderr
    ctl = f"{hide}; from terra_controller.cli import main; main(['ctl', '--help'])"
    done = subprocess.run(
        [sys.executable, "-c", ctl], capture_output=True, text=True, timeout=60, cwd=ROOT
    )
    assert done.returncode == 0, done.stderr
    assert "usage:" in done.stdout


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


@pytest.mark.parametrize(
    "name", ["foi_ceiling", "api_throughput", "controller_memory", "startup_times"]
)
def test_benchmark_runs_as_a_script(name):
    """`uv run python benchmarks/NAME.py` (scripts that share code with other modules)."""
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / f"{name}.py"), "--help"],
        capture_output=True, text=True, timeout=60, cwd=ROOT,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "usage:" in done.stdout
