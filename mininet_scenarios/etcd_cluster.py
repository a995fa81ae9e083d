"""A throw-away etcd cluster (Debian's etcd-server) for controllers on etcd: the testbed's
`--controllers N` and the loopback tests and benchmarks (benchmarks/harness.py)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
import urllib.request
from pathlib import Path

from mininet_scenarios.ports import free_port


def start_etcd(
    workdir: Path, members: int = 1, host: str = "127.0.0.1", timeout_s: float = 30.0,
    new_session: bool = False, election_ms: int | None = None,
):  # fmt: skip
    """Start an etcd cluster of `members` processes, data in workdir/etcd-N, on free ports of
    `host`; wait until every member answers /health.

    Args:
        new_session: start each member in its own session (process group), as the testbed
            starts everything it stops with killpg.
        election_ms: etcd's --election-timeout (heartbeat a tenth of it); None: etcd's
            default 1,000 ms. etcd grants no lease shorter than 1.5 election timeouts
            (rounded up to whole seconds): 500 ms allows a 1 s lease.

    Returns:
        ([the members' Popen], ["HOST:PORT" client address of each member]).

    Raises:
        FileNotFoundError: no `etcd` on PATH (scripts/install.sh installs etcd-server).
        RuntimeError: a member did not answer within `timeout_s` (logs: workdir/etcd-N.log);
            the members started are stopped first.
    """
    etcd = shutil.which("etcd")
    if etcd is None:
        raise FileNotFoundError("etcd is not installed (apt-get install etcd-server)")
    ports = [(free_port(host), free_port(host)) for _ in range(members)]
    initial = ",".join(f"m{i}=http://{host}:{peer}" for i, (_, peer) in enumerate(ports))
    timing = []
    if election_ms is not None:
        timing = ["--election-timeout", str(election_ms),
                  "--heartbeat-interval", str(max(election_ms // 10, 10))]  # fmt: skip
    procs = []
    for i, (client, peer) in enumerate(ports):
        with open(workdir / f"etcd-{i}.log", "ab") as log:
            procs.append(subprocess.Popen(
                [etcd, "--name", f"m{i}", "--data-dir", str(workdir / f"etcd-{i}"),
                 "--listen-client-urls", f"http://{host}:{client}",
                 "--advertise-client-urls", f"http://{host}:{client}",
                 "--listen-peer-urls", f"http://{host}:{peer}",
                 "--initial-advertise-peer-urls", f"http://{host}:{peer}",
                 "--initial-cluster", initial, *timing],
                stdout=log, stderr=subprocess.STDOUT, start_new_session=new_session,
            ))  # fmt: skip
    addrs = [f"{host}:{client}" for client, _ in ports]
    if not all(etcd_healthy(addr, timeout_s) for addr in addrs):
        for p in procs:
            _kill(p, new_session)
        raise RuntimeError(f"etcd did not start; see {workdir}/etcd-*.log")
    return procs, addrs


def etcd_healthy(addr: str, timeout_s: float) -> bool:
    """Whether the etcd member at `addr` answers /health with health true within timeout_s."""
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        try:
            with urllib.request.urlopen(f"http://{addr}/health", timeout=1) as reply:
                if b'"true"' in reply.read():
                    return True
        except OSError:
            pass
        time.sleep(0.1)
    return False


def _kill(proc: subprocess.Popen, group: bool) -> None:
    try:
        if group:
            os.killpg(proc.pid, signal.SIGKILL)
        else:
            proc.kill()
    except ProcessLookupError:
        pass
    proc.wait()
