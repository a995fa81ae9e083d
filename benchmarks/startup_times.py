"""Start-up times: importing the client, the controller answering its API (and ready), an agent
registered.

    python benchmarks/startup_times.py [--repeats 5] [--tree DIR ...] [--topology swan]
                                       [--as-is]

Four figures, each the median over --repeats runs (seconds of wall-clock time, and the CPU
seconds the measured process used by then):

- client import: `python -c "import terra_controller.client"`, spawn to exit;
- controller API: spawn of `python -m terra_controller.cli --topology T --no-openflow
  --insecure` until a TerraClient request (connect, hello, list) has been answered;
- controller ready: the same process until its "terra-controller ready" line (policy and
  tunnel table made, round runner started);
- agent registered: spawn of `python -m terra_agent.cli --insecure ...` until the REST
  /status of a running controller (one that has printed its ready line) lists it as
  connected.

Each --tree is a checkout of the code (default: this one), put first on PYTHONPATH of every
process it measures; with two trees (e.g. a copy of the previous code from `git archive`) the
runs interleave (tree A, tree B, tree A, ...) so that the shared machine's load falls on both
alike. The load average is printed before and after.

By default the measured processes write and read bytecode under a private cache directory
(PYTHONPYCACHEPREFIX, one untimed warm-up run first), as an installed package does (pip
compiles it at install); --as-is keeps the environment's settings (PYTHONDONTWRITEBYTECODE
makes every import compile from source).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from benchmarks.harness import free_port, stop_processes
from terra_controller.client import TerraClient

ROOT = Path(__file__).resolve().parent.parent
POLL_S = 0.005


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a live process so far (/proc/PID/stat)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def child_env(tree: Path, cache: Path | None) -> dict[str, str]:
    """The environment of a measured process: `tree` first on PYTHONPATH; with `cache`,
    bytecode written and read there."""
    path = os.pathsep.join([str(tree), os.environ.get("PYTHONPATH", "")])
    env = dict(os.environ, PYTHONPATH=path)
    if cache is not None:
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        env["PYTHONPYCACHEPREFIX"] = str(cache)
    return env


def client_import(tree: Path, env: dict[str, str]) -> tuple[float, float]:
    """(wall s, CPU s) of a process that imports terra_controller.client and exits."""
    start = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, "-c", "import terra_controller.client"], cwd=tree, env=env
    )
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode:
        raise RuntimeError(f"import failed in {tree}")
    return wall, usage.ru_utime + usage.ru_stime


class Controller:
    """A controller process of `tree` on free loopback ports (--insecure, --no-openflow)."""

    def __init__(self, tree: Path, env: dict[str, str], topology: str, state: Path) -> None:
        self.api = ("127.0.0.1", free_port())
        self.agents = f"127.0.0.1:{free_port()}"
        self.rest = f"127.0.0.1:{free_port()}"
        shutil.rmtree(state, ignore_errors=True)
        self.started = time.perf_counter()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "terra_controller.cli", "--topology", topology,
             "--no-openflow", "--insecure", "--api", f"{self.api[0]}:{self.api[1]}",
             "--agents", self.agents, "--rest", self.rest, "--state-dir", str(state),
             "--log-level", "ERROR"],
            cwd=tree, env=env, stdout=subprocess.PIPE, text=True,
        )  # fmt: skip

    def ready(self) -> tuple[float, float]:
        """Wait for the "terra-controller ready" line (everything started); (wall s since
        spawn, CPU s of the process)."""
        line = self.proc.stdout.readline()
        if not line.startswith("terra-controller ready"):
            raise RuntimeError(f"controller did not start: {line!r}")
        return time.perf_counter() - self.started, cpu_seconds(self.proc.pid)

    def answered(self, timeout_s: float = 60.0) -> tuple[float, float]:
        """Wait until the API answers a request; (wall s since spawn, CPU s of the process)."""
        end = time.monotonic() + timeout_s
        while time.monotonic() < end:
            if self.proc.poll() is not None:
                raise RuntimeError("controller exited")
            try:
                socket.create_connection(self.api, timeout=1).close()
            except OSError:
                time.sleep(POLL_S)
                continue
            with TerraClient(*self.api, insecure=True, timeout=10) as client:
                client.list_coflows()
            return time.perf_counter() - self.started, cpu_seconds(self.proc.pid)
        raise RuntimeError("controller did not answer")

    def connected(self) -> set[str]:
        """Ids of the agents REST /status shows connected."""
        url = f"http://{self.rest}/status"
        with urllib.request.urlopen(url, timeout=10) as reply:
            agents = json.loads(reply.read())["agents"]
        return {a["id"] for a in agents if a["connected"]}

    def stop(self) -> None:
        """Terminate (kill after 5 s)."""
        stop_processes([self.proc])


def agent_registered(
    tree: Path, env: dict[str, str], ctl: Controller, agent: str, work: Path
) -> tuple[float, float]:
    """Spawn terra-agent `agent` (DC of the topology's first) until `ctl` shows it connected;
    (wall s, CPU s of the agent by then). The agent is stopped afterwards."""
    started = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, "-m", "terra_agent.cli", "--controller", ctl.agents, "--dc", "HK",
         "--id", agent, "--data-addr", f"127.0.0.1:{free_port()}", "--spill-dir", str(work),
         "--insecure", "--log-level", "ERROR"],
        cwd=tree, env=env, stdout=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        end = time.monotonic() + 60
        while time.monotonic() < end:
            if proc.poll() is not None:
                raise RuntimeError(f"agent of {tree} exited with status {proc.returncode}")
            if agent in ctl.connected():
                return time.perf_counter() - started, cpu_seconds(proc.pid)
            time.sleep(POLL_S)
        raise RuntimeError("agent did not register")
    finally:
        proc.terminate()
        proc.wait()


def measure(tree: Path, env: dict[str, str], topology: str, work: Path, trial: int) -> dict:
    """One trial of the three figures for `tree`: {figure: (wall s, CPU s)}."""
    out = {"client import": client_import(tree, env)}
    ctl = Controller(tree, env, topology, work / "state")
    try:
        out["controller API"] = ctl.answered()
        out["controller ready"] = ctl.ready()
        out["agent registered"] = agent_registered(tree, env, ctl, f"probe{trial}", work)
    finally:
        ctl.stop()
    return out


def main(argv: list[str] | None = None) -> int:
    """Run the trials and print the medians per tree."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeats", type=int, default=5, help="timed runs per tree (default 5)")
    p.add_argument("--tree", action="append", type=Path, help="code checkout (repeatable)")
    p.add_argument("--topology", default="swan", help="controller topology (default swan)")
    p.add_argument("--as-is", action="store_true", help="no private bytecode cache")
    args = p.parse_args(argv)
    logging.getLogger("terra.client").setLevel(logging.ERROR)  # its --insecure warning
    trees = [t.resolve() for t in (args.tree or [ROOT])]
    work = Path(tempfile.mkdtemp(prefix="terra-startup-"))
    results: dict[Path, list[dict]] = {t: [] for t in trees}
    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)
    try:
        envs = {}
        for i, tree in enumerate(trees):
            envs[tree] = child_env(tree, None if args.as_is else work / f"pycache{i}")
            measure(tree, envs[tree], args.topology, work, -1 - i)  # warm-up (bytecode)
        for trial in range(args.repeats):
            for tree in trees:
                results[tree].append(measure(tree, envs[tree], args.topology, work, trial))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"load average after:  {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    for tree in trees:
        print(f"{tree} (median of {args.repeats}; wall s, CPU s):")
        for figure in results[tree][0]:
            walls = [r[figure][0] for r in results[tree]]
            cpus = [r[figure][1] for r in results[tree]]
            print(f"  {figure:17s} {statistics.median(walls):6.3f} s  "
                  f"cpu {statistics.median(cpus):6.3f} s  "
                  f"(min {min(walls):.3f}, max {max(walls):.3f})")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
