"""What the client, the agent and the controller load at start: the job master's client and the
agent none of the scheduler's packages; the controller builds its policy (HiGHS, numpy,
numba) and its tunnel table (networkx) only once it listens (terra_controller/deferred.py)."""

from __future__ import annotations

import json
import select
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from benchmarks.harness import free_port
from terra_controller.client import TerraClient
from terra_controller.deferred import Deferred

ROOT = Path(__file__).resolve().parents[2]
SCHEDULER_PACKAGES = ("numpy", "highspy", "networkx", "numba", "llvmlite", "os_ken")


def loaded(statement: str, names: tuple[str, ...]) -> list[str]:
    """Run `statement` in a fresh interpreter; the modules of `names` (or their submodules)
    it left in sys.modules."""
    code = (
        f"import sys; {statement}; names = {names!r}; "
        "print(' '.join(sorted(m for m in sys.modules if m in names or m.startswith("
        "tuple(n + '.' for n in names)))))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=ROOT
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.split()


@pytest.mark.parametrize("client", ["terra_controller.client", "terra_controller.async_client"])
def test_client_loads_no_scheduler_and_no_controller(client):
    names = (*SCHEDULER_PACKAGES, "trio", "terra_controller.controller", "terra_core")
    assert loaded(f"import {client}", names) == []


def test_job_command_line_runs_on_an_agent_install():
    """terra-job (replay included) needs none of the controller extra's packages."""
    statement = "import terra_controller.job_cli, terra_controller.job_replay"
    found = loaded(statement, (*SCHEDULER_PACKAGES, "terra_controller.controller"))
    assert found == []


def test_agent_loads_no_scheduler_package():
    found = loaded("import terra_agent.cli", (*SCHEDULER_PACKAGES, "terra_core", "topologies"))
    assert found in ([], ["terra_core", "terra_core.cli_support"])  # only the CLI helpers


def test_controller_cli_loads_no_solver_before_it_runs():
    assert loaded("import terra_controller.cli", ("numpy", "highspy", "numba", "os_ken")) == []


def test_controller_with_an_option_out_of_range_exits_without_ready_line(tmp_path):
    ports = [f"127.0.0.1:{free_port()}" for _ in range(3)]
    done = subprocess.run(
        [sys.executable, "-m", "terra_controller.cli", "--topology", "swan", "--no-openflow",
         "--insecure", "--alpha", "2", "--api", ports[0], "--agents", ports[1], "--rest",
         ports[2], "--state-dir", str(tmp_path)],
        capture_output=True, text=True, timeout=60, cwd=ROOT,
    )  # fmt: skip
    assert done.returncode == 1
    assert "terra-controller: alpha must be in [0, 1), got 2.0" in done.stderr
    assert "ready" not in done.stdout


HELD_BUILD = """
import os, sys, time
import terra_controller.cli as cli
import terra_controller.tunnel_table as tables
Table = tables.TunnelTable
def held(*args, **kwargs):  # made (first of the deferred parts) once the gate file exists
    heavy = [m for m in ('numpy', 'highspy', 'networkx', 'numba') if m in sys.modules]
    with open(sys.argv[1] + '.part', 'w') as out:
        out.write(' '.join(heavy))
    os.replace(sys.argv[1] + '.part', sys.argv[1] + '.loaded')
    while not os.path.exists(sys.argv[1]):
        time.sleep(0.01)
    return Table(*args, **kwargs)
tables.TunnelTable = held
sys.exit(cli.main(sys.argv[2:]))
"""


def test_controller_answers_before_it_makes_its_tunnels_and_policy(tmp_path):
    api, agents, rest = free_port(), free_port(), free_port()
    gate = tmp_path / "gate"
    proc = subprocess.Popen(
        [sys.executable, "-c", HELD_BUILD, str(gate), "--topology", "swan", "--no-openflow",
         "--insecure", "--api", f"127.0.0.1:{api}", "--agents", f"127.0.0.1:{agents}",
         "--rest", f"127.0.0.1:{rest}", "--state-dir", str(tmp_path / "state"),
         "--log-level", "ERROR"],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, cwd=ROOT,
    )  # fmt: skip
    try:
        with TerraClient("127.0.0.1", api, insecure=True, timeout=60) as client:
            assert client.list_coflows() == []
        with urllib.request.urlopen(f"http://127.0.0.1:{rest}/status", timeout=30) as reply:
            status = json.loads(reply.read())
        assert status["scheduler"] == "terra" and status["lps"] == 0
        assert not select.select([proc.stdout], [], [], 0.2)[0]  # no ready line yet
        # listening, answering, and none of the scheduler's packages loaded yet
        loaded_then = tmp_path / "gate.loaded"
        end = time.monotonic() + 30
        while not loaded_then.exists() and time.monotonic() < end:
            time.sleep(0.01)
        assert loaded_then.read_text() == ""
        gate.touch()
        assert proc.stdout.readline().startswith("terra-controller ready")
    finally:
        proc.terminate()
        proc.wait(10)
        proc.stdout.close()


class Made:
    name = "made"
    stats = {"lps": 0}
    paths = {("A", "B"): [("A", "B")]}


def test_deferred_object_is_made_once_for_concurrent_callers():
    calls = []
    gate = threading.Event()

    def factory():
        calls.append(1)
        gate.wait(5)
        return Made()

    policy = Deferred(factory, before={"name": "requested", "stats": None})
    assert policy.name == "requested" and policy.stats is None  # answered without making it
    assert not policy.made
    seen = []
    threads = [threading.Thread(target=lambda: seen.append(policy.paths)) for _ in range(4)]
    for t in threads:
        t.start()
    gate.set()
    for t in threads:
        t.join(5)
    assert calls == [1]
    assert len(seen) == 4 and all(s is Made.paths for s in seen)
    assert policy.name == "made" and policy.stats is Made.stats
    assert policy.made and policy.build() is policy.build()


def test_deferred_object_raises_its_factory_error_every_time():
    calls = []

    def factory():
        calls.append(1)
        raise ValueError("alpha must be in [0, 1)")

    policy = Deferred(factory, before={"name": "terra"})
    for _ in range(2):
        with pytest.raises(ValueError, match="alpha"):
            policy.build()
    with pytest.raises(ValueError, match="alpha"):
        policy.allocate  # noqa: B018 (the attribute access builds)
    assert calls == [1]
