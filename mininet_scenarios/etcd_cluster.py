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
    """Start an etcd cluster of `members` processes on free ports of `host`; wait until
    every member answers /health.

    Args:
        new_session: start each member in its own session (process group), as the testbed
            starts everything it stops with killpg.
        election_ms: etcd's --election-timeout (heartbeat a tenth of it); None: etcd's
            default 1,000 ms. etcd grants no lease shorter than 1.5 election timeouts
            (rounded up to whole seconds): 500 ms allows a 1 s lease.

    A member that exits before it is healthy (a port taken between pick and bind) is
    retried with new ports, up to three tries; each try's logs and data are in
    workdir/tryT/etcd-N.log and workdir/tryT/etcd-N.

    Returns:
        ([the members' Popen], ["HOST:PORT" client address of each member]).

    Raises:
        FileNotFoundError: no `etcd` on PATH (scripts/install.sh installs etcd-server).
        RuntimeError: a member did not answer within `timeout_s`, or exited on every try; the
            message ends with the last lines of its log. The members started are stopped
            first.
    """
    etcd = shutil.which("etcd")
    if etcd is None:
        raise FileNotFoundError("etcd is not installed (apt-get install etcd-server)")
    timing = []
    if election_ms is not None:
        timing = ["--election-timeout", str(election_ms),
                  "--heartbeat-interval", str(max(election_ms // 10, 10))]  # fmt: skip
    for attempt in range(_ATTEMPTS):
        logs = [workdir / f"try{attempt}" / f"etcd-{i}.log" for i in range(members)]
        procs, addrs = _launch(etcd, logs, host, timing, new_session)
        failed = _wait_healthy(procs, addrs, timeout_s)
        if failed is None:
            return procs, addrs
        exited = procs[failed].poll() is not None
        for p in procs:
            _kill(p, new_session)
        why = ("exited" if exited else "not healthy") + ": " + _log_tail(logs[failed])
        if not exited:  # alive but not healthy in time: new ports would not help
            break
    raise RuntimeError(f"etcd did not start; see {workdir}/try*/etcd-*.log; m{failed} {why}")


_ATTEMPTS = 3  # a member that exits at once (a port taken between pick and bind) gets new ports


def _launch(etcd: str, logs: list[Path], host: str, timing: list[str],
            new_session: bool) -> tuple[list[subprocess.Popen], list[str]]:  # fmt: skip
    """Start one etcd member per log path on fresh free ports, its data beside its log."""
    logs[0].parent.mkdir(parents=True, exist_ok=True)
    ports = [free_port(host) for _ in range(2 * len(logs))]
    pairs = list(zip(ports[::2], ports[1::2], strict=True))
    initial = ",".join(f"m{i}=http://{host}:{peer}" for i, (_, peer) in enumerate(pairs))
    procs = []
    for i, (client, peer) in enumerate(pairs):
        with open(logs[i], "ab") as log:
            procs.append(subprocess.Popen(
                [etcd, "--name", f"m{i}", "--data-dir", str(logs[i].with_suffix("")),
                 "--listen-client-urls", f"http://{host}:{client}",
                 "--advertise-client-urls", f"http://{host}:{client}",
                 "--listen-peer-urls", f"http://{host}:{peer}",
                 "--initial-advertise-peer-urls", f"http://{host}:{peer}",
                 "--initial-cluster", initial, *timing],
                stdout=log, stderr=subprocess.STDOUT, start_new_session=new_session,
            ))  # fmt: skip
    return procs, [f"{host}:{client}" for client, _ in pairs]


def _wait_healthy(procs: list[subprocess.Popen], addrs: list[str],
                  timeout_s: float) -> int | None:  # fmt: skip
    """None once every member answers /health within timeout_s; else the index of a member
    that exited (as soon as one does) or of the first that did not answer in time."""
    end = time.monotonic() + timeout_s
    waiting = list(range(len(procs)))
    while waiting:
        exited = [i for i in range(len(procs)) if procs[i].poll() is not None]
        if exited:
            return exited[0]
        waiting = [i for i in waiting if not _healthy_once(addrs[i])]
        if waiting and time.monotonic() >= end:
            return waiting[0]
        if waiting:
            time.sleep(0.1)
    return None


def _healthy_once(addr: str) -> bool:
    try:
        with urllib.request.urlopen(f"http://{addr}/health", timeout=1) as reply:
            return b'"true"' in reply.read()
    except OSError:
        return False


def _log_tail(log: Path, lines: int = 3) -> str:
    """The last lines of a member's log, on one line, for an error message."""
    try:
        text = log.read_text(errors="replace")
    except OSError:
        return "(no log)"
    return " | ".join(text.strip().splitlines()[-lines:])[-600:]


def etcd_healthy(addr: str, timeout_s: float) -> bool:
    """Whether the etcd member at `addr` answers /health with health true within timeout_s."""
    end = time.monotonic() + timeout_s
    while not _healthy_once(addr):
        if time.monotonic() >= end:
            return False
        time.sleep(0.1)
    return True


def _kill(proc: subprocess.Popen, group: bool) -> None:
    try:
        if group:
            os.killpg(proc.pid, signal.SIGKILL)
        else:
            proc.kill()
    except ProcessLookupError:
        pass
    proc.wait()
