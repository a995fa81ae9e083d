"""A Dask cluster on loopback for tests and benchmarks: one ``dask scheduler`` and N
``dask worker`` processes, each on a port from harness.free_port (below the ephemeral range).

    with loopback_dask_cluster(workers=2, directory=tmp) as cluster:
        terra-sim ... --dask cluster.address

Every process runs this interpreter's ``python -m dask`` (the ``dask`` command) with the
checkout root first on PYTHONPATH, so the workers import the same terra_sim (and
benchmarks) as the caller. Workers run without a nanny (one process each, nothing
spawned behind the caller's back) and with one thread (one simulation at a time each). Their
output goes to ``<directory>/<name>.log``. On exit exactly the processes started here are
stopped (harness.stop_processes), the workers before the scheduler.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from benchmarks.harness import free_port, stop_processes

ROOT = Path(__file__).resolve().parent.parent  # the checkout the workers import
HOST = "127.0.0.1"


@dataclass
class DaskCluster:
    """A started loopback cluster: the scheduler's `address` (``tcp://127.0.0.1:PORT``) and
    the processes (`procs`: scheduler first, then the workers)."""

    address: str
    procs: list[subprocess.Popen] = field(default_factory=list)


def _start(args: list[str], directory: Path, name: str) -> subprocess.Popen:
    """Start ``python -m dask ARGS`` with the checkout on PYTHONPATH, output to name.log."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    with open(directory / f"{name}.log", "wb") as log:
        return subprocess.Popen(
            [sys.executable, "-m", "dask", *args],
            cwd=ROOT,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
        )


def wait_for_workers(address: str, workers: int, timeout_s: float) -> None:
    """Return once `workers` workers are connected to the scheduler at `address`.

    Raises:
        TimeoutError / OSError: not within `timeout_s` seconds (from dask.distributed).
    """
    from distributed import Client

    deadline = time.monotonic() + timeout_s
    with Client(address, timeout=timeout_s, set_as_default=False) as client:
        client.wait_for_workers(workers, timeout=max(1.0, deadline - time.monotonic()))


@contextmanager
def loopback_dask_cluster(
    workers: int, directory: Path, timeout_s: float = 60.0
) -> Iterator[DaskCluster]:
    """Start a scheduler and `workers` workers on 127.0.0.1, wait until every worker has
    joined, yield the DaskCluster; stop those processes on exit.

    Raises:
        TimeoutError / OSError: the cluster was not up within `timeout_s` seconds (the logs in
            `directory` say why); the processes are stopped first.
    """
    directory.mkdir(parents=True, exist_ok=True)
    port = free_port(HOST)
    cluster = DaskCluster(f"tcp://{HOST}:{port}")
    try:
        scheduler = ["scheduler", "--host", HOST, "--port", str(port), "--no-dashboard"]
        cluster.procs.append(_start(scheduler, directory, "scheduler"))
        for i in range(workers):
            worker = ["worker", cluster.address, "--host", HOST]
            worker += ["--worker-port", str(free_port(HOST)), "--no-nanny", "--nthreads", "1"]
            worker += ["--no-dashboard", "--name", f"worker{i}"]
            worker += ["--local-directory", str(directory / f"worker{i}")]
            cluster.procs.append(_start(worker, directory, f"worker{i}"))
        wait_for_workers(cluster.address, workers, timeout_s)
        yield cluster
    finally:  # the workers first: a worker told to close while its scheduler goes can hang
        stop_processes(cluster.procs[1:], timeout_s=10.0)
        stop_processes(cluster.procs[:1], timeout_s=10.0)
