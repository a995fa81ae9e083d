"""The testbed's processes: terra-controller in its own process group, the PKI, and the WAN's
byte counters read from the controller and from Open vSwitch."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from terra_controller.client import TerraClient
from topologies import Topology
from topologies.binding import Binding

# Log level of terra-controller and the agents (their logs go to the workdir); INFO adds
# per-coflow completion (controller) and per-flow completion / tunnel link events (agents).
LOG_LEVEL = os.environ.get("TERRA_TESTBED_LOG_LEVEL", "WARNING")


class TestbedError(RuntimeError):
    """The testbed could not be brought up or a run did not finish; the message says why."""


class Processes:
    """Process groups started by the testbed; stop_all() ends each group (TERM, then KILL)."""

    def __init__(self) -> None:
        self.procs: list[subprocess.Popen] = []

    def add(self, proc: subprocess.Popen) -> subprocess.Popen:
        """Remember a process that leads its own process group (setsid / mnexec -d)."""
        self.procs.append(proc)
        return proc

    def stop(self, procs: list[subprocess.Popen]) -> None:
        """SIGTERM each process group, wait up to 5 s, then SIGKILL what is left."""
        for p in procs:
            _signal_group(p, signal.SIGTERM)
        end = time.monotonic() + 5
        for p in procs:
            try:
                p.wait(timeout=max(0.1, end - time.monotonic()))
            except subprocess.TimeoutExpired:
                _signal_group(p, signal.SIGKILL)
                p.wait()
            _signal_group(p, signal.SIGKILL)  # children left in the group
            if p in self.procs:
                self.procs.remove(p)

    def stop_all(self) -> None:
        """Stop every remembered process group (latest first)."""
        self.stop(list(reversed(self.procs)))


def _signal_group(proc: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(proc.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


JOB_NAME = "testbed-job"
OPERATOR_NAME = "testbed-operator"


def make_pki(workdir: Path, agent_names: list[str], tenants: list[str] = ()) -> Path:
    """A fresh PKI for one testbed run in workdir/pki: CA and controller, one certificate per
    agent, the job master (JOB_NAME), one job per tenant (job_name(tenant), of that tenant)
    and the operator reading REST (OPERATOR_NAME).

    Returns:
        the PKI directory.
    """
    import shutil

    from terra_security.pki import Role, init_ca, issue

    pki = workdir / "pki"
    shutil.rmtree(pki, ignore_errors=True)
    init_ca(pki)
    for name in agent_names:
        issue(pki, Role.AGENT, name)
    issue(pki, Role.JOB, JOB_NAME)
    for tenant in tenants:
        issue(pki, Role.JOB, job_name(tenant), tenant=tenant)
    issue(pki, Role.OPERATOR, OPERATOR_NAME)
    return pki


def job_name(tenant: str | None) -> str:
    """The job certificate submitting `tenant`'s coflows (JOB_NAME without a tenant)."""
    return JOB_NAME if tenant is None else f"{JOB_NAME}-{tenant}"


class TestbedController:
    """terra-controller (OpenFlow mode, mutual TLS with `pki`, `--scheduler scheduler`) as a
    subprocess in its own session.

    Attributes: api (host, port), agents_port, rest ("https://host:port"), pki (directory),
    scheduler (registry name), proc (the Popen).
    """

    def __init__(
        self, topo_path: Path, k: int, of_port: int, log: Path, procs: Processes, pki: Path,
        scheduler: str = "terra", rest_public: bool = False, extra: tuple[str, ...] = (),
    ):  # fmt: skip
        import ssl

        from terra_security.pki import client_context

        self.pki = pki
        self.scheduler = scheduler
        self.rest_tls: ssl.SSLContext = client_context(pki, OPERATOR_NAME)
        self.rest_tls.check_hostname = False  # urllib dials an IP; the CA still verifies it
        self.log = open(log, "a")  # noqa: SIM115 (closed in close())
        argv = controller_argv(topo_path, k, of_port, pki, scheduler, log.parent, rest_public,
                               extra=extra)  # fmt: skip
        self.proc = procs.add(
            subprocess.Popen(
                argv, stdout=subprocess.PIPE, stderr=self.log, text=True, start_new_session=True
            )  # fmt: skip
        )
        line = self.proc.stdout.readline()
        if not line.startswith("terra-controller ready"):
            raise TestbedError(f"terra-controller did not start (see {log}): {line!r}")
        addrs = dict(part.split("=") for part in line.split()[2:])
        host, port = addrs["api"].rsplit(":", 1)
        self.api = (host, int(port))
        self.agents_port = int(addrs["agents"].rsplit(":", 1)[1])
        self.rest = "https://" + addrs["rest"]

    @property
    def proc_list(self) -> list[subprocess.Popen]:
        """The controller's process, as a list (ControllerCluster has several)."""
        return [self.proc]

    def agent_targets(self, host: str) -> str:
        """terra-agent's --controller value: the agents' port on `host`."""
        return f"{host}:{self.agents_port}"

    def console(self) -> tuple[str, str]:
        """(REST base URL of the operator page, coflow API "host:port" for `ctl login`)."""
        return self.rest, f"{self.api[0]}:{self.api[1]}"

    def client(self, timeout: float, tenant: str | None = None) -> TerraClient:
        """A TerraClient of the job master (certificate JOB_NAME), or of `tenant`'s job."""
        return TerraClient(*self.api, pki=self.pki, name=job_name(tenant), timeout=timeout)

    def get(self, path: str):
        """GET a REST path over TLS with the operator's certificate, decoded JSON."""
        with urllib.request.urlopen(self.rest + path, timeout=5, context=self.rest_tls) as reply:
            return json.loads(reply.read())

    def close(self) -> None:
        """Close the log file (the process itself is stopped through Processes)."""
        self.log.close()


def controller_argv(
    topo_path: Path, k: int, of_port: int, pki: Path, scheduler: str, workdir: Path,
    rest_public: bool = False, api: str = "127.0.0.1:0", agents: str = "0.0.0.0:0",
    rest: str = "127.0.0.1:0", extra: tuple[str, ...] = (),
) -> list[str]:  # fmt: skip
    """The testbed's terra-controller command line (OpenFlow mode, listen addresses `api`,
    `agents`, `rest`, a fresh --state-dir under `workdir`, then `extra`)."""
    return [
        sys.executable, "-m", "terra_controller.cli", "--topology", str(topo_path),
        "--k", str(k), "--of-port", str(of_port), "--api", api, "--agents", agents,
        # agents reach it over mgmt0, their data is on 10.0.x.y
        "--data-prefix", "10.0.0.0/16", "--rest", rest, "--log-level", LOG_LEVEL,
        "--pki", str(pki), "--scheduler", scheduler,
        # its own journal: nothing of another run is resumed
        "--state-dir", tempfile.mkdtemp(prefix="controller-state-", dir=workdir),
        *(["--rest-public"] if rest_public else []), *extra,
    ]  # fmt: skip


def replay_core_log(log: Path, timeout_s: float = 300.0) -> dict:
    """`terra-controller replay LOG` on a testbed controller's core log (its --record):
    {"events": n, "rounds": n, "identical": every outcome, effect and round as recorded,
    "lines": what it printed}.

    Raises:
        TestbedError: the log could not be read, or the replay did not end in `timeout_s`.
    """
    try:
        done = subprocess.run(
            [sys.executable, "-m", "terra_controller.cli", "replay", str(log)],
            capture_output=True, text=True, timeout=timeout_s,
        )  # fmt: skip
    except subprocess.TimeoutExpired as exc:
        raise TestbedError(f"replaying {log} took over {timeout_s} s") from exc
    if done.returncode not in (0, 1):
        raise TestbedError(f"replaying {log}: {done.stderr.strip()}")
    lines = done.stdout.splitlines()
    counts = re.match(r"(\d+) events, (\d+) rounds", lines[0] if lines else "")
    if counts is None:
        raise TestbedError(f"replaying {log}: unexpected output {done.stdout!r:.200}")
    events, rounds = map(int, counts.groups())
    return {"events": events, "rounds": rounds, "identical": done.returncode == 0, "lines": lines}


def console_line(ctl, pki: Path) -> str:
    """What the testbed prints for an operator once `ctl` (TestbedController or
    ControllerCluster) runs: the page's address in the root namespace and the command
    whose token signs the page in (the controller accepts only its own tokens)."""
    rest, api = ctl.console()
    return (
        f"{ctl.scheduler}: operator page {rest}/ (sign in with the token of `terra-controller "
        f"ctl --api {api} --pki {pki} --name {OPERATOR_NAME} login`)"
    )


def wait_until(predicate, timeout: float, what: str, poll_s: float = 0.1) -> None:
    """Poll `predicate()` until true. Raises TestbedError after `timeout` seconds."""
    end = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > end:
            raise TestbedError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(poll_s)


# ---- port counters ---------------------------------------------------------------------------

_PORT_RE = re.compile(r"port\s+\"?(\w+)\"?:.*?tx pkts=\d+, bytes=(\d+)", re.S)


def openflow_tx_bytes(ctl: TestbedController, timeout: float = 10.0) -> int:
    """Sum of tx_bytes over every WAN port from the controller's OpenFlow port statistics
    (REST /links), waiting for samples taken after this call began (the controller polls
    every switch every --port-stats-s seconds).

    Raises:
        TestbedError: no fresh sample of every WAN port within `timeout` seconds.
    """
    start = time.monotonic()
    while True:
        asked = time.monotonic()
        links = ctl.get("/links")["links"]
        ages = [row["sampled_s"] for row in links]
        if all(age is not None and asked - age > start for age in ages):
            return sum(row["tx_bytes"] for row in links)
        if asked - start > timeout:
            raise TestbedError(f"no fresh OpenFlow port statistics within {timeout} s")
        time.sleep(0.05)


def read_wan_bytes(wan, ctl: TestbedController | None) -> tuple[int, int]:
    """(bytes sent on WAN ports per OpenFlow port statistics, per `ovs-ofctl dump-ports`);
    the first is 0 without a controller."""
    ofctl = wan_tx_bytes(wan.switches, wan.binding, wan.topology)
    return (openflow_tx_bytes(ctl) if ctl is not None else 0), ofctl


def wan_tx_bytes(switches: dict, binding: Binding, topology: Topology) -> int:
    """Sum of tx_bytes over every WAN port of every switch (`ovs-ofctl dump-ports`).

    Args:
        switches: DC -> Mininet switch (its .name is the bridge).

    Raises:
        TestbedError: ovs-ofctl failed.
    """
    total = 0
    for dc, sw in switches.items():
        out = subprocess.run(
            ["ovs-ofctl", "-O", "OpenFlow13", "dump-ports", sw.name],
            capture_output=True, text=True, timeout=10,
        )  # fmt: skip
        if out.returncode != 0:
            raise TestbedError(f"ovs-ofctl dump-ports {sw.name}: {out.stderr.strip()}")
        wan_ports = {str(binding.port_to(dc, v)) for (u, v) in topology.capacity if u == dc}
        for port, tx in _PORT_RE.findall(out.stdout):
            if port in wan_ports:
                total += int(tx)
    return total


def wan_capacity(wan) -> float:
    """Sum of the directed WAN links' HTB rates in bytes/s."""
    return sum(htb_rate(intf) for intf in wan_intfs(wan))


def htb_rate(intf) -> float:
    """The HTB rate of a WAN interface in bytes/s (0 for an unshaped one)."""
    return intf.params.get("bw", 0) * 1e6 / 8


def link_capacity(wan, a: str, b: str) -> float:
    """HTB rates (bytes/s) of the WAN link between DCs a and b, both directions summed."""
    ends = {wan.switches[a], wan.switches[b]}
    return sum(
        htb_rate(intf)
        for link in wan.net.links
        if {link.intf1.node, link.intf2.node} == ends
        for intf in (link.intf1, link.intf2)
    )


def wan_intfs(wan):
    """The shaped (HTB) interfaces of the WAN's links, both ends of each."""
    for link in wan.net.links:
        if "bw" in link.intf1.params:
            yield link.intf1
            yield link.intf2
