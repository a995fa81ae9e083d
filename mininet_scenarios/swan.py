"""The SWAN testbed experiment: Terra vs per-flow TCP on an emulated WAN.

One run, everything real:

1. terra-controller (OpenFlow mode, its own process group) in the root namespace;
   its topology is topologies/data/swan_testbed.json with the links' capacity set to
   CAPACITY_FRACTION of the HTB rate (headers: Ethernet, IP, TCP, MPLS, chunk headers).
2. Mininet (mininet_scenarios.wan_net.build_wan): one userspace OVS per DC, the 7 WAN
   links shaped with HTB, one or more hosts per DC, an out-of-band management network.
3. Wait until the controller has installed the tunnel rules (REST /tunnels), start one
   terra-agent per host (reaching the controller over the management network), wait
   until all are registered.
4. Scheduler run (Terra, or each of `schedulers` in turn: the controller and the agents
   are restarted with `--scheduler NAME`, the WAN stays): a job master (TerraClient)
   submits the coflows at their arrival times and polls progress; with a failure link,
   that link goes down at `fail_at_s` and up again at `recover_at_s` (seconds after the
   first arrival); the reaction time is
   measured from the link-down command to the moment the controller reports the
   round's new rates acknowledged by every agent (REST /status, polled every 10 ms).
5. Per-flow TCP run (mininet_scenarios.tcp_baseline) on the same WAN and rules (the agents
   stay up, idle): same flows, same bytes, same arrival times, same failure.
   Steps 4 and 5 are repeated `repeats` times (the machine is shared and has 2 cores, so
   single runs are noisy; per-flow TCP alternates with the first scheduler's runs);
   results.summary pools the repeats.
6. Switch port counters before and after each run give the WAN utilization: bytes sent
   on WAN ports / (available link rate x busy time), busy time = the time during which at
   least one coflow is active (`busy_time`); while the failure link is down its rate is
   not available (`RunResult.capacity_time`, the simulator's definition). The counters
   come from the controller's OpenFlow port statistics (REST /links); `ovs-ofctl -O
   OpenFlow13 dump-ports` reads them too, for comparison (`wan_utilization_ofctl`).

Everything is torn down in `finally` (also on Ctrl-C / SIGTERM, which the CLI turns into
KeyboardInterrupt): the process groups started here, then Mininet; `mn -c` only if
Mininet's own stop failed (it removes every bridge on the machine).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from mininet_scenarios.observe import AGENT_METRICS_PORT, SCRAPE_S, Observer, PageShots
from mininet_scenarios.tcp_baseline import BASELINE_PORT
from mininet_scenarios.workload import TestbedCoflow
from terra_agent.sources import SYNTHETIC_PERIOD, SyntheticSource, flow_key
from terra_controller.client import TerraClient
from topologies import Topology, load_topology
from topologies.binding import Binding, load_binding

TESTBED_TOPOLOGY = Path(__file__).resolve().parent.parent / "topologies/data/swan_testbed.json"
CAPACITY_FRACTION = 0.92
AGENT_DATA_PORT = 19000
POLL_S = 0.25
# Congestion control of the agents' tunnel connections (terra-agent --tcp-congestion). The
# hosts' default here is BBR, which held tunnels below their rates on these links (no
# propagation delay, so BBR's window of 2 x bandwidth x smallest RTT is a few packets, and
# queueing delay then caps the rate): with cubic the utilization against the simulated twin
# rose 0.901-0.908 -> 0.920-0.927 (docs/results.md 3.3). Per-flow TCP keeps the default.
TUNNEL_CONGESTION = "cubic"
AGENT_SETTLE_S = 1.0
# Log level of terra-controller and the agents (their logs go to the workdir); INFO adds
# per-coflow completion (controller) and per-flow completion / tunnel link events (agents).
LOG_LEVEL = os.environ.get("TERRA_TESTBED_LOG_LEVEL", "WARNING")


class TestbedError(RuntimeError):
    """The testbed could not be brought up or a run did not finish; the message says why."""


@dataclass
class Failure:
    """A WAN link that goes down at `down_s` and up at `up_s` (seconds after the first arrival)."""

    a: str
    b: str
    down_s: float
    up_s: float


@dataclass
class RunResult:
    """What one run (Terra or per-flow TCP) measured.

    Attributes:
        cct_s: coflow trace id -> CCT (seconds), for completed coflows.
        duration_s: first arrival to last completion (seconds).
        wan_bytes_sent: bytes sent on WAN switch ports during the run, from the controller's
            OpenFlow port statistics (REST /links).
        wan_bytes_sent_ofctl: the same from `ovs-ofctl dump-ports` text, for comparison.
        wan_capacity_bps: sum of the directed WAN links' HTB rates (bytes/s).
        failed_capacity_bps: HTB rates of the failure link's two directions (bytes/s), set
            when it goes down; 0 without a failure.
        bytes_lost: expected bytes not delivered (unfinished flows, short flows).
        digest_mismatches: flows whose received digest differs from the expected one.
        throughput: coflow trace id -> [(t seconds after start, bytes delivered so far)].
        failure_down_s / failure_up_s: when the link went down / up (s after start), or None.
        reaction_s: link-down command to new rates acknowledged by all agents, or None.
        rounds / round_ms: Terra only: scheduling rounds the controller ran during the run
            and the wall ms of each (up to the last 100; REST /status), else None / [].
    """

    cct_s: dict = field(default_factory=dict)
    arrival_s: dict = field(default_factory=dict)
    duration_s: float = 0.0
    wan_bytes_sent: int = 0
    wan_bytes_sent_ofctl: int = 0
    wan_capacity_bps: float = 0.0
    failed_capacity_bps: float = 0.0
    bytes_lost: int = 0
    digest_mismatches: int = 0
    throughput: dict = field(default_factory=dict)
    failure_down_s: float | None = None
    failure_up_s: float | None = None
    reaction_s: float | None = None
    controller_reaction_ms: float | None = None
    rounds: int | None = None
    round_ms: list = field(default_factory=list)

    @property
    def busy_s(self) -> float:
        """Seconds during which at least one coflow was active (see `busy_time`)."""
        return busy_time(self.arrival_s, self.cct_s)

    @property
    def capacity_time(self) -> float:
        """Bytes the WAN could carry while a coflow was active: wan_capacity_bps x busy_s,
        less failed_capacity_bps x the busy seconds while the failure link was down (from
        failure_down_s to failure_up_s, or to the end when it never came back up in the run).
        A down link counts 0 capacity, as in the simulator (terra_sim/simulator.py), so the
        testbed's utilization and its simulated twin's use the same denominator.

        E.g. 10 B/s of links, 4 B/s of them failed over [1, 3], busy [0, 2] and [2.5, 4]:
        10 x 3.5 - 4 x (1 + 0.5) = 29 bytes.
        """
        total = self.wan_capacity_bps * self.busy_s
        if self.failure_down_s is None or not self.failed_capacity_bps:
            return total
        up = self.failure_up_s if self.failure_up_s is not None else float("inf")
        down_busy = sum(
            max(0.0, min(hi, up) - max(lo, self.failure_down_s))
            for lo, hi in busy_intervals(self.arrival_s, self.cct_s)
        )
        return total - self.failed_capacity_bps * down_busy

    @property
    def wan_utilization(self) -> float:
        """wan_bytes_sent / capacity_time: the WAN's use while there is demand.

        The port counters are read at the run's start and end, so bytes sent while no coflow
        is active (none: agents and TCP nodes are idle then) would only raise the figure.
        Idle gaps between arrivals (the same in both runs, set by the workload) are left out.
        0 for an empty run.
        """
        return self._per_capacity_time(self.wan_bytes_sent)

    @property
    def wan_utilization_ofctl(self) -> float:
        """`wan_utilization` from the `ovs-ofctl dump-ports` counters (for comparison)."""
        return self._per_capacity_time(self.wan_bytes_sent_ofctl)

    def _per_capacity_time(self, sent: int) -> float:
        denom = self.capacity_time
        return sent / denom if denom > 0 else 0.0


def busy_intervals(arrival_s: dict, cct_s: dict) -> list[tuple[float, float]]:
    """The union of the intervals [arrival, arrival + CCT] (seconds) of completed coflows, as
    sorted disjoint (start, end) pairs.

    E.g. arrivals {a: 0, b: 1, c: 5} and CCTs {a: 2, b: 2, c: 1}: [(0, 3), (5, 6)].
    """
    merged: list[tuple[float, float]] = []
    for lo, hi in sorted((arrival_s[c], arrival_s[c] + cct) for c, cct in cct_s.items()):
        if merged and lo <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], hi))
        else:
            merged.append((lo, hi))
    return merged


def busy_time(arrival_s: dict, cct_s: dict) -> float:
    """Length (s) of the union of the intervals [arrival, arrival + CCT] of completed coflows.

    E.g. arrivals {a: 0, b: 1, c: 5} and CCTs {a: 2, b: 2, c: 1}: [0, 3] and [5, 6] -> 4 s.
    """
    return sum(hi - lo for lo, hi in busy_intervals(arrival_s, cct_s))


def verified_by_agents(flow: dict) -> bool:
    """A Terra flow's status row shows its bytes verified end to end: state "done" with a keyed
    flow digest (64 hex chars). The digest cannot be recomputed here: its key stays inside the
    controller and the flow's two agents (terra_security/integrity.py); the receiver reports "done"
    only when its digest equals the sender's."""
    digest = flow.get("digest")
    return (
        flow.get("state") == "done"
        and isinstance(digest, str)
        and len(digest) == 64
        and all(c in "0123456789abcdef" for c in digest)
    )


def expected_digest(coflow: str, flow: str, size: int) -> str:
    """BLAKE2b (hex) of a flow's synthetic bytes, computed independently of the receivers of
    the TCP baseline (Terra's agents use keyed digests: verified_by_agents)."""
    source = SyntheticSource(flow_key(coflow, flow), size)
    h = hashlib.blake2b()
    for offset in range(0, size, SYNTHETIC_PERIOD):
        h.update(source.read(offset, min(SYNTHETIC_PERIOD, size - offset)))
    return h.hexdigest()


def testbed_topology(workdir: Path, link_mbps: float, hosts_per_dc: int = 1) -> Path:
    """Write the SWAN testbed topology for this run; return its path (workdir/swan_testbed.json).

    Links get capacity CAPACITY_FRACTION * link_mbps. With hosts_per_dc > 1, DC d (DPID i)
    gets hosts "h<d><j>" (j = 1..n) with IPs 10.0.<i>.<j> on switch ports 100 + j - 1,
    extending the file's one host per DC ("hHK1", 10.0.1.1, port 100).

    Raises:
        ValueError: hosts_per_dc not in 1..50.
    """
    if not 1 <= hosts_per_dc <= 50:
        raise ValueError("hosts per DC must be in 1..50")
    doc = json.loads(TESTBED_TOPOLOGY.read_text())
    doc["default_capacity_gbps"] = link_mbps * CAPACITY_FRACTION / 1000
    for dc, sw in doc["switches"].items():
        sw["hosts"] = [
            {"name": f"h{dc}{j + 1}", "ip": f"10.0.{sw['dpid']}.{j + 1}", "port": 100 + j}
            for j in range(hosts_per_dc)
        ]
    workdir.mkdir(parents=True, exist_ok=True)
    path = workdir / "swan_testbed.json"
    path.write_text(json.dumps(doc))
    return path


# ---- processes ---------------------------------------------------------------------------


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


def make_pki(workdir: Path, agent_names: list[str]) -> Path:
    """A fresh PKI for one testbed run in workdir/pki: CA and controller, one certificate per
    agent, the job master (JOB_NAME) and the operator reading REST (OPERATOR_NAME).

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
    issue(pki, Role.OPERATOR, OPERATOR_NAME)
    return pki


class Controller:
    """terra-controller (OpenFlow mode, mutual TLS with `pki`, `--scheduler scheduler`) as a
    subprocess in its own session.

    Attributes: api (host, port), agents_port, rest ("https://host:port"), pki (directory),
    scheduler (registry name), proc (the Popen).
    """

    def __init__(
        self, topo_path: Path, k: int, of_port: int, log: Path, procs: Processes, pki: Path,
        scheduler: str = "terra", rest_public: bool = False,
    ):  # fmt: skip
        import ssl

        from terra_security.pki import client_context

        self.pki = pki
        self.scheduler = scheduler
        self.rest_tls: ssl.SSLContext = client_context(pki, OPERATOR_NAME)
        self.rest_tls.check_hostname = False  # urllib dials an IP; the CA still verifies it
        self.log = open(log, "a")  # noqa: SIM115 (closed in close())
        self.proc = procs.add(
            subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "terra_controller.cli",
                    "--topology",
                    str(topo_path),
                    "--k",
                    str(k),
                    "--of-port",
                    str(of_port),
                    "--api",
                    "127.0.0.1:0",
                    "--agents",
                    "0.0.0.0:0",
                    "--data-prefix",  # agents reach it over mgmt0, their data is on 10.0.x.y
                    "10.0.0.0/16",
                    "--rest",
                    "127.0.0.1:0",
                    "--log-level",
                    LOG_LEVEL,
                    "--pki",
                    str(pki),
                    "--scheduler",
                    scheduler,
                    *(["--rest-public"] if rest_public else []),
                ],
                stdout=subprocess.PIPE,
                stderr=self.log,
                text=True,
                start_new_session=True,
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

    def client(self, timeout: float) -> TerraClient:
        """A TerraClient of the job master (certificate JOB_NAME)."""
        return TerraClient(*self.api, pki=self.pki, name=JOB_NAME, timeout=timeout)

    def get(self, path: str):
        """GET a REST path over TLS with the operator's certificate, decoded JSON."""
        with urllib.request.urlopen(self.rest + path, timeout=5, context=self.rest_tls) as reply:
            return json.loads(reply.read())

    def close(self) -> None:
        """Close the log file (the process itself is stopped through Processes)."""
        self.log.close()


def wait_until(predicate, timeout: float, what: str, poll_s: float = 0.1) -> None:
    """Poll `predicate()` until true. Raises TestbedError after `timeout` seconds."""
    end = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > end:
            raise TestbedError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(poll_s)


# ---- port counters ---------------------------------------------------------------------------

_PORT_RE = re.compile(r"port\s+\"?(\w+)\"?:.*?tx pkts=\d+, bytes=(\d+)", re.S)


def openflow_tx_bytes(ctl: Controller, timeout: float = 10.0) -> int:
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


def read_wan_bytes(wan, ctl: Controller | None) -> tuple[int, int]:
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


# ---- failure -------------------------------------------------------------------------------


class FailureThread(threading.Thread):
    """Sets the failure link down and up at its times; measures the reaction (Terra run).

    Args:
        wan: the WanNet. failure: the Failure. t0: time.monotonic() of the run's start.
        controller: the Controller to watch for the reaction, or None (baseline run).
        result: RunResult receiving failure_down_s / failure_up_s / reaction_s.
        on_event: called with "down" (after the reaction was measured) and "up".
    """

    def __init__(self, wan, failure: Failure, t0: float, controller, result: RunResult,
                 on_event=None):  # fmt: skip
        super().__init__(daemon=True)
        self.on_event = on_event or (lambda kind: None)
        self.wan, self.failure, self.t0 = wan, failure, t0
        self.controller, self.result = controller, result
        self.stop_event = threading.Event()
        self.error: BaseException | None = None
        self.flow_mods_before: int | None = None

    def run(self) -> None:
        try:
            self._run()
        except BaseException as exc:  # reported by the caller
            self.error = exc

    def _run(self) -> None:
        f = self.failure
        if self.stop_event.wait(max(0.0, self.t0 + f.down_s - time.monotonic())):
            return
        before = 0
        if self.controller is not None:
            before = self.controller.get("/status")["reactions_total"]
            self.flow_mods_before = self.controller.get("/tunnels")["switches"]["flow_mods"]
        t_down = time.monotonic()
        self.result.failed_capacity_bps = _link_capacity(self.wan, f.a, f.b)
        self.wan.set_link(f.a, f.b, up=False)
        self.result.failure_down_s = t_down - self.t0
        if self.controller is not None:
            self._measure_reaction(before, t_down)
        self.on_event("down")
        if self.stop_event.wait(max(0.0, self.t0 + f.up_s - time.monotonic())):
            self.wan.set_link(f.a, f.b, up=True)
            return
        self.result.failure_up_s = time.monotonic() - self.t0
        self.wan.set_link(f.a, f.b, up=True)
        self.on_event("up")

    def _measure_reaction(self, before: int, t_down: float) -> None:
        end = t_down + 10
        while time.monotonic() < end:
            status = self.controller.get("/status")
            if status["reactions_total"] > before:
                last = status["reactions"][-1]
                if last["event_to_applied_ms"] is not None:
                    self.result.reaction_s = time.monotonic() - t_down
                    self.result.controller_reaction_ms = last["event_to_applied_ms"]
                    return
            time.sleep(0.01)


# ---- the two runs -----------------------------------------------------------------------------


def run_terra(
    wan, ctl: Controller, coflows: list[TestbedCoflow], failure: Failure | None, timeout: float,
    on_event=None,
) -> tuple[RunResult, int | None]:  # fmt: skip
    """Submit the coflows at their arrival times through TerraClient; wait for all.
    `on_event`: see FailureThread.

    Returns:
        (RunResult, flow-mods counted by the controller just before the link went down, or
        None without a failure).

    Raises:
        TestbedError: coflows not done within `timeout` seconds of the last arrival.
    """
    result = RunResult(wan_capacity_bps=_wan_capacity(wan))
    client = ctl.client(timeout=30)
    ids: dict[int, TestbedCoflow] = {}
    tx0, tx0_ofctl = read_wan_bytes(wan, ctl)
    rounds0 = ctl.get("/status")["rounds"]
    t0 = time.monotonic()
    fail = _start_failure(wan, failure, t0, ctl, result, on_event)
    pending = list(coflows)
    last_end = t0
    try:
        while pending or len(result.cct_s) < len(coflows):
            now = time.monotonic()
            while pending and pending[0].arrival_s <= now - t0:
                c = pending.pop(0)
                cid = client.submit_coflow([dict(f) for f in c.flows])
                ids[cid] = c
                result.arrival_s[c.trace_id] = time.monotonic() - t0
                result.throughput[c.trace_id] = [(result.arrival_s[c.trace_id], 0)]
            for row in client.list_coflows():
                c = ids.get(row["id"])
                if c is None or c.trace_id in result.cct_s:
                    continue
                result.throughput[c.trace_id].append((now - t0, row["bytes_delivered"]))
                if row["state"] == "done":
                    result.cct_s[c.trace_id] = row["cct_s"]
                    last_end = time.monotonic()
            if not pending and now - t0 > coflows[-1].arrival_s + timeout:
                raise TestbedError(f"Terra run: coflows not done after {timeout} s")
            _sleep_until_poll_or_arrival(now, t0, pending)
        result.duration_s = last_end - t0
        tx1, tx1_ofctl = read_wan_bytes(wan, ctl)
        result.wan_bytes_sent, result.wan_bytes_sent_ofctl = tx1 - tx0, tx1_ofctl - tx0_ofctl
        status = ctl.get("/status")
        result.rounds = status["rounds"] - rounds0
        recent = status["recent_round_ms"]
        result.round_ms = recent[max(0, len(recent) - result.rounds) :]
        for cid in ids:
            status = client.check_status(cid)
            for f in status["flows"]:
                result.digest_mismatches += not verified_by_agents(f)
                delivered = f.get("bytes_delivered", f["bytes"])
                result.bytes_lost += f["bytes"] - min(f["bytes"], delivered)
    finally:
        client.close()
        flow_mods = _finish_failure(fail)
    return result, flow_mods


def _sleep_until_poll_or_arrival(now: float, t0: float, pending: list[TestbedCoflow]) -> None:
    """Sleep POLL_S, or less when the next coflow arrives sooner (submitted on time, as the
    per-flow TCP nodes start their flows on time; a 0.25 s poll alone delayed Terra's
    submissions by up to 0.25 s)."""
    wake = now + POLL_S
    if pending:
        wake = min(wake, t0 + pending[0].arrival_s)
    time.sleep(max(0.0, wake - time.monotonic()))


def run_per_flow_tcp(
    wan,
    coflows: list[TestbedCoflow],
    failure: Failure | None,
    timeout: float,
    workdir: Path,
    procs: Processes,
    ctl: Controller | None = None,
) -> RunResult:
    """The per-flow TCP baseline (mininet_scenarios.tcp_baseline) on the same WAN; `ctl`:
    the controller whose OpenFlow port statistics count the WAN bytes (else ovs-ofctl's).

    Raises:
        TestbedError: flows not received within `timeout` s of the last arrival.
    """
    result = RunResult(wan_capacity_bps=_wan_capacity(wan))
    workdir.mkdir(parents=True, exist_ok=True)
    ip = {h.name: h.ip for _, h in wan.binding.all_hosts()}
    start_file = workdir / "start"
    start_file.unlink(missing_ok=True)
    nodes, outs = [], {}
    for name, host in wan.hosts.items():
        schedule = [
            {"coflow": str(c.trace_id), "flow": f["id"], "dst_ip": ip[f["dst"]],
             "bytes": f["bytes"], "arrival_s": c.arrival_s}
            for c in coflows for f in c.flows if f["src"] == name
        ]  # fmt: skip
        (workdir / f"tcp_{name}.json").write_text(json.dumps(schedule))
        outs[name] = workdir / f"tcp_{name}.out"
        outs[name].write_text("")
        Path(f"{outs[name]}.ready").unlink(missing_ok=True)
        nodes.append(
            procs.add(
                host.popen(
                    [
                        sys.executable,
                        "-m",
                        "mininet_scenarios.tcp_baseline",
                        "node",
                        "--listen",
                        f"{ip[name]}:{BASELINE_PORT}",
                        "--schedule",
                        str(workdir / f"tcp_{name}.json"),
                        "--start-file",
                        str(start_file),
                        "--out",
                        str(outs[name]),
                    ],
                    stdout=open(workdir / f"tcp_{name}.log", "w"),
                    stderr=subprocess.STDOUT,
                )  # fmt: skip
            )
        )
    try:
        wait_until(
            lambda: all(Path(f"{out}.ready").exists() for out in outs.values()), 60, "TCP nodes"
        )
        tx0, tx0_ofctl = read_wan_bytes(wan, ctl)
        start_wall = time.time() + 0.2
        tmp = workdir / "start.tmp"
        tmp.write_text(repr(start_wall))
        tmp.rename(start_file)  # atomic: nodes never read a partial time
        time.sleep(max(0.0, start_wall - time.time()))
        t0 = time.monotonic()
        fail = _start_failure(wan, failure, t0, None, result)
        expected = {(str(c.trace_id), f["id"]): f["bytes"] for c in coflows for f in c.flows}
        received: dict = {}
        try:
            while len(received) < len(expected):
                for out in outs.values():
                    for line in out.read_text().splitlines():
                        rec = json.loads(line)
                        received[(rec["coflow"], rec["flow"])] = rec
                if time.monotonic() - t0 > coflows[-1].arrival_s + timeout:
                    break
                time.sleep(POLL_S)
            end_mono = time.monotonic()
            tx1, tx1_ofctl = read_wan_bytes(wan, ctl)
            result.wan_bytes_sent_ofctl = tx1_ofctl - tx0_ofctl
            result.wan_bytes_sent = tx1 - tx0 if ctl is not None else result.wan_bytes_sent_ofctl
        finally:
            _finish_failure(fail)
    finally:
        procs.stop(nodes)
    _score_baseline(result, coflows, expected, received, start_wall)
    ends = [result.cct_s[c.trace_id] + c.arrival_s for c in coflows if c.trace_id in result.cct_s]
    result.duration_s = max(ends) if ends else end_mono - t0
    if len(received) < len(expected):
        raise TestbedError(
            f"per-flow TCP: {len(expected) - len(received)} flows not received after {timeout} s"
        )
    return result


def _score_baseline(result, coflows, expected, received, start_wall) -> None:
    for c in coflows:
        ends = []
        for f in c.flows:
            rec = received.get((str(c.trace_id), f["id"]))
            if rec is None:
                result.bytes_lost += f["bytes"]
                result.digest_mismatches += 1
                continue
            result.bytes_lost += max(0, f["bytes"] - rec["received"])
            want = expected_digest(str(c.trace_id), f["id"], f["bytes"])
            result.digest_mismatches += rec["digest"] != want
            ends.append(rec["end_wall"])
        result.arrival_s[c.trace_id] = c.arrival_s
        if len(ends) == len(c.flows):
            result.cct_s[c.trace_id] = max(ends) - (start_wall + c.arrival_s)


def _wan_capacity(wan) -> float:
    """Sum of the directed WAN links' HTB rates in bytes/s."""
    return sum(_htb_rate(intf) for intf in _wan_intfs(wan))


def _htb_rate(intf) -> float:
    """The HTB rate of a WAN interface in bytes/s (0 for an unshaped one)."""
    return intf.params.get("bw", 0) * 1e6 / 8


def _link_capacity(wan, a: str, b: str) -> float:
    """HTB rates (bytes/s) of the WAN link between DCs a and b, both directions summed."""
    ends = {wan.switches[a], wan.switches[b]}
    return sum(
        _htb_rate(intf)
        for link in wan.net.links
        if {link.intf1.node, link.intf2.node} == ends
        for intf in (link.intf1, link.intf2)
    )


def _wan_intfs(wan):
    for link in wan.net.links:
        if "bw" in link.intf1.params:
            yield link.intf1
            yield link.intf2


def _start_failure(wan, failure, t0, ctl, result, on_event=None) -> FailureThread | None:
    if failure is None:
        return None
    thread = FailureThread(wan, failure, t0, ctl, result, on_event)
    thread.start()
    return thread


def _finish_failure(thread: FailureThread | None) -> int | None:
    """Stop the failure thread (the link is set up again if it was down); re-raise its error."""
    if thread is None:
        return None
    thread.stop_event.set()
    thread.join(timeout=30)
    if thread.error is not None:
        raise TestbedError(f"link failure thread: {thread.error!r}") from thread.error
    return thread.flow_mods_before


# ---- the experiment ---------------------------------------------------------------------------


@dataclass
class TestbedOptions:
    """Options of `run_swan` (see mininet_scenarios.cli for their meaning and defaults).

    `schedulers`: registry names (terra_core/registry.py) the controller runs, one after
    the other, each `repeats` times on the same WAN; the first is the one the targets judge.
    `observe`: Prometheus scrapes the controller and every agent (mininet_scenarios.observe).
    """

    coflows: list[TestbedCoflow]
    link_mbps: float = 20.0
    k: int = 4
    failure: Failure | None = None
    timeout_s: float = 300.0
    repeats: int = 1
    hosts_per_dc: int = 1
    of_port: int = 6653
    workdir: Path = Path("/tmp/terra-testbed")
    schedulers: list[str] = field(default_factory=lambda: ["terra"])
    observe: bool = False


def run_swan(opts: TestbedOptions, log=print) -> dict:
    """Bring up the SWAN testbed; for each scheduler start a controller running it and the
    agents, run it `opts.repeats` times; run per-flow TCP `opts.repeats` times (interleaved
    with the first scheduler's runs); tear down.

    Returns:
        {"schedulers": [names], name: [RunResult per repeat] for each scheduler,
         "per_flow_tcp": [RunResult per repeat], "rules_per_switch": {dpid: n} (first
         controller), "flow_mods_after_startup": flow-mods the first controller sent after
         installing the tunnels and before the first link failure (after its first run
         without a failure), "install_s": seconds from Mininet start to rules installed,
         "observe": observe.Observer.report() with opts.observe}.

    Raises:
        TestbedError: bring-up failed or a run did not finish (after teardown).
        KeyboardInterrupt: passed on after teardown.
    """
    from terra_core.cli_support import MissingExtra, require

    try:
        mininet_log = require("mininet.log", "testbed")
    except MissingExtra as exc:
        raise TestbedError(str(exc)) from exc
    from mininet_scenarios.wan_net import build_wan, cleanup

    mininet_log.setLogLevel("critical")
    opts.workdir.mkdir(parents=True, exist_ok=True)
    topo_path = testbed_topology(opts.workdir, opts.link_mbps, opts.hosts_per_dc)
    topology = load_topology(str(topo_path))
    binding = load_binding(topology)
    check_names_free([f"s{sw.dpid}" for sw in binding.switches.values()] + ["mgmt0"])
    procs, wan, ctl, observer = Processes(), None, None, None
    raw: dict = {"schedulers": list(opts.schedulers), "per_flow_tcp": []}
    try:
        pki = make_pki(opts.workdir, [host.name for _, host in binding.all_hosts()])
        for phase, name in enumerate(opts.schedulers):
            ctl = Controller(topo_path, opts.k, opts.of_port, opts.workdir / "controller.log",
                             procs, pki, scheduler=name, rest_public=opts.observe)  # fmt: skip
            t_start = time.monotonic()
            if wan is None:
                wan = build_wan(topology, binding, of_port=opts.of_port,
                                link_mbps=opts.link_mbps, mgmt=True)  # fmt: skip
                if opts.observe:
                    observer = Observer(opts.workdir, pki, OPERATOR_NAME, wan.mgmt_ips)
            if observer is not None:
                observer.watch_controller(ctl.rest)
            agents = _bring_up(wan, binding, ctl, opts.workdir, procs, log, observer)
            if phase == 0:
                raw["install_s"] = time.monotonic() - t_start
            shots = None
            if observer is not None and phase == 0:
                shots = PageShots(ctl.rest, opts.workdir / "page")
            try:
                raw[name], flow_mods_before = _scheduler_runs(
                    wan, ctl, opts, raw, phase == 0, procs, log, shots
                )
            finally:
                if shots is not None:
                    time.sleep(2.5)  # a timed shot may still be pending
                    shots.close()
                    raw["page"] = {"shots": shots.shots, "error": shots.error}
            of = ctl.get("/tunnels")["switches"]
            if phase == 0:
                raw["rules_per_switch"] = of["rules_per_switch"]
                raw["flow_mods_after_startup"] = flow_mods_before - of["flow_mods_at_install"]
            if observer is not None and phase == len(opts.schedulers) - 1:
                time.sleep(2 * SCRAPE_S)  # the agents' last counters scraped
                raw["observe"] = observer.report()  # before the last agents stop
            procs.stop([*agents, ctl.proc])
            ctl.close()
            ctl = None
        return raw
    finally:
        if observer is not None:
            observer.stop()
        procs.stop_all()
        if ctl is not None:
            ctl.close()
        if wan is not None:
            try:
                wan.stop()
            except Exception:
                cleanup()


def _bring_up(wan, binding, ctl: Controller, workdir: Path, procs: Processes, log,
              observer=None) -> list:  # fmt: skip
    """Wait for the controller's tunnel rules, start the agents (serving /metrics on their
    management address when observed), wait until all registered.

    Returns the agents' Popens. Raises TestbedError on a timeout.
    """
    from mininet_scenarios.wan_net import MGMT_ROOT_IP

    # switches reconnect to a restarted controller within OVS's backoff (up to 8 s)
    wait_until(lambda: ctl.get("/tunnels")["switches"].get("installed"), 30, "tunnel rules")
    of = ctl.get("/tunnels")["switches"]
    log(f"{ctl.scheduler}: tunnels installed, {of['flow_mods_at_install']} flow-mods")
    metrics = wan.mgmt_ips if observer is not None else {}
    agents = _start_agents(wan, binding, ctl, MGMT_ROOT_IP, workdir, procs, metrics)
    n = len(agents)
    wait_until(lambda: sum(a["connected"] for a in ctl.get("/status")["agents"]) == n, 30,
               "agents")  # fmt: skip
    time.sleep(AGENT_SETTLE_S)  # agents open their tunnel connections to each other
    if observer is not None:
        observer.watch_agents()
    log(f"{ctl.scheduler}: {n} agents registered")
    return agents


def _scheduler_runs(wan, ctl: Controller, opts: TestbedOptions, raw: dict, with_tcp: bool,
                    procs: Processes, log, shots=None):  # fmt: skip
    """`opts.repeats` runs of the controller's scheduler; with_tcp: each followed by a
    per-flow TCP run (appended to raw["per_flow_tcp"]; the agents stay up, idle).
    `shots` (observe.PageShots): screenshots of the operator page 2 s after the link went
    down and 2 s after it came back, in the first run.

    Returns ([RunResult per repeat], flow-mods counted before the first link failure, or
    after the first run without a failure).
    """
    runs, flow_mods_before = [], None
    for i in range(opts.repeats):
        on_event = None
        if shots is not None and i == 0:
            def on_event(kind):
                threading.Timer(2.0, shots.shoot, [f"link_{kind}"]).start()
        run, before = run_terra(wan, ctl, opts.coflows, opts.failure, opts.timeout_s, on_event)
        runs.append(run)
        if flow_mods_before is None:  # the first failure; without one: after the run
            flow_mods_before = before if before is not None else _flow_mods(ctl)
        log(f"[{i + 1}] {ctl.scheduler} done in {run.duration_s:.1f} s")
        if with_tcp:
            tcp = run_per_flow_tcp(
                wan, opts.coflows, opts.failure, opts.timeout_s, opts.workdir / f"tcp{i}", procs,
                ctl,
            )  # fmt: skip
            raw["per_flow_tcp"].append(tcp)
            log(f"[{i + 1}] per-flow TCP done in {tcp.duration_s:.1f} s")
    return runs, flow_mods_before


def _flow_mods(ctl: Controller) -> int:
    return ctl.get("/tunnels")["switches"]["flow_mods"]


def check_names_free(bridges: list[str]) -> None:
    """Make sure no OVS bridge or interface of these names exists (another Mininet run or the
    leftovers of a killed one would clash with ours).

    Raises:
        TestbedError: naming what exists and how to remove leftovers (`mn -c`, which removes
            every bridge on the machine, so only when no other Mininet run is active).
    """
    out = subprocess.run(["ovs-vsctl", "list-br"], capture_output=True, text=True, timeout=10)
    taken = sorted(set(out.stdout.split()) & set(bridges))
    taken += sorted(
        i for i in os.listdir("/sys/class/net") if any(i.startswith(b + "-") for b in bridges)
    )
    if taken:
        raise TestbedError(
            f"{', '.join(taken[:6])} already exist: another Mininet run is active, or leftovers "
            "of a killed one (remove them with `mn -c` when no other run is active)"
        )


def _start_agents(wan, binding, ctl, mgmt_ip, workdir, procs, metrics: dict | None = None
                  ) -> list[subprocess.Popen]:  # fmt: skip
    """Start one terra-agent per host; `metrics`: {host: IP} where an agent serves /metrics."""
    agents = []
    for dc, host in binding.all_hosts():
        extra = []
        if metrics and host.name in metrics:
            extra = ["--metrics", f"{metrics[host.name]}:{AGENT_METRICS_PORT}"]
        agents.append(
            procs.add(
                wan.hosts[host.name].popen(
                    [
                        sys.executable,
                        "-m",
                        "terra_agent.cli",
                        "--controller",
                        f"{mgmt_ip}:{ctl.agents_port}",
                        "--dc",
                        dc,
                        "--id",
                        host.name,
                        "--data-addr",
                        f"{host.ip}:{AGENT_DATA_PORT}",
                        "--spill-dir",
                        str(workdir),
                        "--log-level",
                        LOG_LEVEL,
                        "--pki",
                        str(ctl.pki),
                        "--tcp-congestion",
                        TUNNEL_CONGESTION,
                        *extra,
                    ],
                    stdout=open(workdir / f"agent_{host.name}.log", "a"),
                    stderr=subprocess.STDOUT,
                )  # fmt: skip
            )
        )
    return agents
