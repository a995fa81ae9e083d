"""Sweeps on a Dask cluster (terra_sim/sweep.py): a real `dask scheduler` and two `dask worker`
processes on loopback give the results of a serial run, and only those processes are stopped."""

import importlib
import json
import subprocess
import sys

import pytest

from benchmarks.dask_cluster import loopback_dask_cluster
from benchmarks.fb_table3 import without_times
from terra_core.registry import scheduler_names
from terra_sim.sweep import open_sweep

ROOT_ARGS = ["--topology", "swan", "--workload", "fb", "--limit", "5"]


def tasks_run(address: str, prefix: str) -> int:
    """How many tasks of prefix `prefix` (dask.utils.key_split of the key: the submitted
    function's name without leading underscores) the scheduler at `address` has seen
    finish (its task prefix's count of entries to "memory")."""
    from distributed import Client

    def count(dask_scheduler, prefix=prefix):
        found = dask_scheduler.task_prefixes.get(prefix)
        return 0 if found is None else found.state_counts["memory"]

    with Client(address, timeout=30, set_as_default=False) as client:
        return client.run_on_scheduler(count)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    directory = tmp_path_factory.mktemp("dask")
    with loopback_dask_cluster(workers=2, directory=directory) as started:
        yield started
    # exactly the processes started: all stopped now, and each was ours (a child of this one)
    assert len(started.procs) == 3
    assert all(p.poll() is not None for p in started.procs)


def test_terra_sim_on_dask_equals_serial(cluster, tmp_path):
    runs = {}
    for name, extra in (("serial", []), ("dask", ["--dask", cluster.address])):
        out = tmp_path / f"{name}.json"
        done = subprocess.run(
            [sys.executable, "-m", "terra_sim.cli", *ROOT_ARGS, "--json", str(out), *extra],
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert done.returncode == 0, done.stderr
        runs[name] = json.loads(out.read_text())
    serial, dask = (without_times(runs[n]["results"]) for n in ("serial", "dask"))
    assert list(dask) == list(serial) == scheduler_names()  # every scheduler, in order
    assert dask == serial
    assert serial["terra"]["coflows"]  # not vacuous
    # the cells ran on the cluster
    assert tasks_run(cluster.address, "run_one") == len(scheduler_names())


def test_fb_table3_on_dask_equals_serial(cluster, tmp_path):
    fb_table3 = importlib.import_module("benchmarks.fb_table3")
    argv = ["--topology", "swan", "gscale", "--limit", "5", "--schedulers", "terra", "varys"]
    for name, extra in (("serial", ["--jobs", "1"]), ("dask", ["--dask", cluster.address])):
        assert fb_table3.main([*argv, *extra, "--reuse", str(tmp_path / name)]) == 0
    serial, dask = (sorted((tmp_path / n).iterdir()) for n in ("serial", "dask"))
    assert [p.name for p in dask] == [p.name for p in serial] and len(serial) == 4
    for a, b in zip(serial, dask, strict=True):
        assert without_times(json.loads(a.read_text())) == without_times(json.loads(b.read_text()))
    assert tasks_run(cluster.address, "run_part") == 4


def test_unreachable_scheduler_is_an_error():
    from benchmarks.harness import free_port

    address = f"tcp://127.0.0.1:{free_port()}"  # nothing listens there
    with pytest.raises(OSError, match="127.0.0.1"):
        with open_sweep(dask=address, connect_timeout_s=2):
            pass
