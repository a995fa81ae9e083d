"""The SWAN testbed experiment: Terra vs per-flow TCP on an emulated WAN.

One run, everything real:

1. terra-controller (OpenFlow mode, its own process group) in the root namespace;
   its topology is topologies/data/swan_testbed.json with the links' capacity set to
   CAPACITY_FRACTION of the HTB rate (headers: Ethernet, IP, TCP, MPLS, chunk headers).
   With `controllers` > 1: that many controllers on a three-member etcd, one leading
   (controller_cluster.ControllerCluster); with `kill_leader_at` the leader is killed in
   the last repeat and the takeover measured (controller_cluster.LeaderKill).
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

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from mininet_scenarios.controller_cluster import ControllerCluster, LeaderKill, takeover_checks
from mininet_scenarios.link_failure import finish_failure, start_failure
from mininet_scenarios.observe import AGENT_METRICS_PORT, SCRAPE_S, Observer, PageShots
from mininet_scenarios.run_result import Failure, RunResult, expected_digest, verified_by_agents
from mininet_scenarios.tcp_baseline import BASELINE_PORT
from mininet_scenarios.testbed_processes import (
    LOG_LEVEL,
    OPERATOR_NAME,
    Processes,
    TestbedController,
    TestbedError,
    console_line,
    make_pki,
    read_wan_bytes,
    replay_core_log,
    wait_until,
    wan_capacity,
)
from mininet_scenarios.testbed_reservation import PairWatch, Reserve
from mininet_scenarios.testbed_tenants import (
    JobClients,
    pieces_of_one,
    submit_together,
    tenants_toml,
)
from mininet_scenarios.workload import TestbedCoflow
from terra_wire.api_session import TerraError
from topologies import Topology, load_topology
from topologies.binding import Binding, load_binding

TESTBED_TOPOLOGY = Path(__file__).resolve().parent.parent / "topologies/data/swan_testbed.json"
CAPACITY_FRACTION = 0.92
AGENT_DATA_PORT = 19000
POLL_S = 0.25
SUBMIT_RETRY_S = 30.0
# Congestion control of the agents' tunnel connections (terra-agent --tcp-congestion). The
# hosts' default here is BBR, which held tunnels below their rates on these links (no
# propagation delay, so BBR's window of 2 x bandwidth x smallest RTT is a few packets, and
# queueing delay then caps the rate): with cubic the utilization against the simulated twin
# rose 0.901-0.908 -> 0.920-0.927 (docs/results.md 3.3). Per-flow TCP keeps the default.
TUNNEL_CONGESTION = "cubic"
AGENT_SETTLE_S = 1.0


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


def run_terra(
    wan, ctl: TestbedController, coflows: list[TestbedCoflow], failure: Failure | None,
    timeout: float,
    on_event=None,
    kill_leader_at: float | None = None,
    reserve: Reserve | None = None,
) -> tuple[RunResult, int | None]:  # fmt: skip
    """Submit the coflows at their arrival times through TerraClient; wait for all.
    `on_event`: see FailureThread. `kill_leader_at` (a ControllerCluster `ctl`): kill its
    leader that many seconds after the first arrival (controller_cluster.LeaderKill; its
    report goes to RunResult.takeover). `reserve`: sample what the reserved pair delivers
    (testbed_reservation.PairWatch, into RunResult.reserved_pair).

    Returns:
        (RunResult, flow-mods counted by the controller just before the link went down, or
        None without a failure).

    Raises:
        TestbedError: coflows not done within `timeout` seconds of the last arrival.
    """
    result = RunResult(wan_capacity_bps=wan_capacity(wan))
    clients = JobClients(ctl, coflows, timeout=30)
    watch = PairWatch(reserve, clients.of)
    ids: dict[int, TestbedCoflow] = {}
    tx0, tx0_ofctl = read_wan_bytes(wan, ctl)
    rounds0 = ctl.get("/status")["rounds"]
    t0 = time.monotonic()
    fail = start_failure(wan, failure, t0, ctl, result, on_event)
    killer, due = None, (DueTimes() if isinstance(ctl, ControllerCluster) else None)
    if kill_leader_at is not None:
        killer = LeaderKill(ctl, kill_leader_at, t0, len(wan.hosts))
        killer.start()
    pending = list(coflows)
    last_end = t0
    try:
        while pending or len(result.cct_s) < len(coflows):
            now = time.monotonic()
            while pending and pending[0].arrival_s <= now - t0:
                n = 1 if due is not None else pieces_of_one(pending, 0)
                group, pending = pending[:n], pending[n:]
                for cid, c in _submit_due(ctl, clients, group, t0, result, due):
                    ids[cid] = c
                    watch.submitted(cid, c.tenant)
            for row in clients.list_coflows():
                c = ids.get(row["id"])
                if c is None or c.trace_id in result.cct_s:
                    continue
                result.throughput[c.trace_id].append((now - t0, row["bytes_delivered"]))
                if row["state"] == "done":
                    waited = due.waited.get(c.trace_id, 0.0) if due else 0.0
                    result.cct_s[c.trace_id] = row["cct_s"] + waited
                    last_end = time.monotonic()
            watch.poll(time.monotonic() - t0)
            if not pending and now - t0 > coflows[-1].arrival_s + timeout:
                raise TestbedError(f"Terra run: coflows not done after {timeout} s")
            _sleep_until_poll_or_arrival(now, t0, pending)
        result.duration_s = last_end - t0
        if killer is not None:
            result.takeover = killer.finish()
            killer = None
        tx1, tx1_ofctl = read_wan_bytes(wan, ctl)
        result.wan_bytes_sent, result.wan_bytes_sent_ofctl = tx1 - tx0, tx1_ofctl - tx0_ofctl
        status = ctl.get("/status")
        result.rounds = status["rounds"] - rounds0
        if result.takeover and "kill_s" in result.takeover:  # the new leader counts from 0
            result.rounds += result.takeover["rounds_before_kill"]
            takeover_checks(result.takeover, ctl, clients.default, ids)
            result.takeover["submit_wait_max_s"] = max(due.waited.values(), default=0.0)
            result.takeover["submits_refused"] = due.refused
        recent = status["recent_round_ms"]
        result.round_ms = recent[max(0, len(recent) - result.rounds) :]
        result.reserved_pair = watch.samples
        _score_terra(result, clients, ids)
    finally:
        clients.close()
        flow_mods = finish_failure(fail)
        if killer is not None:
            killer.finish()
    return result, flow_mods


def _score_terra(result: RunResult, clients: JobClients, ids: dict) -> None:
    """Add every flow's digest mismatch and bytes not delivered (per the agents' reports in
    check_status) of the coflows `ids` ({coflow id: TestbedCoflow}) to `result`."""
    for cid, c in ids.items():
        status = clients.of(c.tenant).check_status(cid)
        for f in status["flows"]:
            result.digest_mismatches += not verified_by_agents(f)
            delivered = f.get("bytes_delivered", f["bytes"])
            result.bytes_lost += f["bytes"] - min(f["bytes"], delivered)


@dataclass
class DueTimes:
    """With several controllers, CCTs count from each coflow's due time (see _submit).

    Attributes: waited ({trace id: seconds from the due time until the submit was
    accepted}), refused (submits refused "unknown_agent" and sent again).
    """

    waited: dict = field(default_factory=dict)
    refused: int = 0


def _submit(client, c: TestbedCoflow, t0: float, result: RunResult, due: DueTimes | None) -> int:
    """Submit coflow `c`, record its arrival; returns its id. `due` (several controllers):
    the arrival is the workload's (when the job master was due to submit it), and
    due.waited[trace id] the seconds from then until the submit was accepted, which the
    caller adds to the controller's CCT: a coflow due while no controller leads (the job
    master waits for the new leader) has its CCT counted from its due time. A new leader
    refuses a coflow naming an agent that has not registered with it yet ("unknown_agent");
    such a submit is sent again every 0.1 s for up to SUBMIT_RETRY_S."""
    flows = [dict(f) for f in c.flows]
    end = time.monotonic() + SUBMIT_RETRY_S
    while True:
        try:
            cid = client.submit_coflow(flows)
            break
        except TerraError as exc:
            if due is None or exc.code != "unknown_agent" or time.monotonic() > end:
                raise
            due.refused += 1
            time.sleep(0.1)
    accepted = time.monotonic()
    if due is not None:
        due.waited[c.trace_id], accepted = accepted - (t0 + c.arrival_s), t0 + c.arrival_s
    _arrived(result, c, accepted - t0)
    return cid


def _submit_due(ctl, clients: JobClients, group: list[TestbedCoflow], t0: float,
                result: RunResult, due: DueTimes | None) -> list:  # fmt: skip
    """Submit a coflow that is due (`_submit`), or a greedy tenant's pieces of one coflow
    at once (testbed_tenants.submit_together), and record their arrivals; [(coflow id,
    coflow)]."""
    if len(group) == 1:
        return [(_submit(clients.of(group[0].tenant), group[0], t0, result, due), group[0])]
    out = []
    for (cid, accepted), c in zip(submit_together(ctl, group), group, strict=True):
        _arrived(result, c, accepted - t0)
        out.append((cid, c))
    return out


def _arrived(result: RunResult, c: TestbedCoflow, at_s: float) -> None:
    """Record coflow `c`'s arrival `at_s` seconds after the run's start (its submit
    accepted) in `result`."""
    result.arrival_s[c.trace_id] = at_s
    result.throughput[c.trace_id] = [(at_s, 0)]


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
    ctl: TestbedController | None = None,
) -> RunResult:
    """The per-flow TCP baseline (mininet_scenarios.tcp_baseline) on the same WAN; `ctl`:
    the controller whose OpenFlow port statistics count the WAN bytes (else ovs-ofctl's).

    Raises:
        TestbedError: flows not received within `timeout` s of the last arrival.
    """
    result = RunResult(wan_capacity_bps=wan_capacity(wan))
    start_file = workdir / "start"
    nodes, outs = _start_tcp_nodes(wan, coflows, workdir, procs, start_file)
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
        fail = start_failure(wan, failure, t0, None, result)
        expected = {(str(c.trace_id), f["id"]): f["bytes"] for c in coflows for f in c.flows}
        try:
            received = _tcp_records(outs, len(expected), t0 + coflows[-1].arrival_s + timeout)
            end_mono = time.monotonic()
            tx1, tx1_ofctl = read_wan_bytes(wan, ctl)
            result.wan_bytes_sent_ofctl = tx1_ofctl - tx0_ofctl
            result.wan_bytes_sent = tx1 - tx0 if ctl is not None else result.wan_bytes_sent_ofctl
        finally:
            finish_failure(fail)
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


def _start_tcp_nodes(
    wan, coflows: list[TestbedCoflow], workdir: Path, procs: Processes, start_file: Path
) -> tuple[list, dict[str, Path]]:
    """One tcp_baseline node per host, each with the flows it sends; they wait for
    `start_file`. Returns (the node processes, {host: its output file})."""
    workdir.mkdir(parents=True, exist_ok=True)
    ip = {h.name: h.ip for _, h in wan.binding.all_hosts()}
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
        cmd = [sys.executable, "-m", "mininet_scenarios.tcp_baseline", "node",
               "--listen", f"{ip[name]}:{BASELINE_PORT}",
               "--schedule", str(workdir / f"tcp_{name}.json"),
               "--start-file", str(start_file), "--out", str(outs[name])]  # fmt: skip
        log = open(workdir / f"tcp_{name}.log", "w")  # noqa: SIM115 (the node writes it)
        nodes.append(procs.add(host.popen(cmd, stdout=log, stderr=subprocess.STDOUT)))
    return nodes, outs


def _tcp_records(outs: dict[str, Path], count: int, deadline: float) -> dict:
    """{(coflow, flow): record} the nodes wrote, polled until `count` are in or the
    time.monotonic() `deadline` passed."""
    received: dict = {}
    while len(received) < count:
        for out in outs.values():
            for line in out.read_text().splitlines():
                rec = json.loads(line)
                received[(rec["coflow"], rec["flow"])] = rec
        if time.monotonic() > deadline:
            break
        time.sleep(POLL_S)
    return received


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


# ---- the experiment ---------------------------------------------------------------------------


@dataclass
class TestbedOptions:
    """Options of `run_swan` (see mininet_scenarios.cli for their meaning and defaults).

    `schedulers`: registry names (terra_core/registry.py) the controller runs, one after
    the other, each `repeats` times on the same WAN; the first is the one the targets judge.
    `observe`: Prometheus scrapes the controller and every agent (mininet_scenarios.observe).
    `controllers` > 1: that many controllers on a three-member etcd (controller_cluster);
    `kill_leader_at`: their leader is killed (SIGKILL) that many seconds after the first
    arrival of the last repeat (the repeats before it are the runs without the kill).
    `tenants`: tenant names (mininet_scenarios.testbed_tenants; each coflow's tenant is in
    `coflows`); `greedy_coflows`: the workload with the greedy (last) tenant's coflows
    split, run after each honest Terra run; `reserve`: a guaranteed reservation in the
    tenants file, its pair's delivered rate sampled in every Terra run
    (testbed_reservation); `sharing`: how the tenants share the WAN (tenant_shares.SHARINGS).
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
    controllers: int = 1
    kill_leader_at: float | None = None
    tenants: list[str] = field(default_factory=list)
    greedy_coflows: list[TestbedCoflow] | None = None
    reserve: Reserve | None = None
    sharing: str = "cooperative"


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
    from mininet_scenarios.wan_net import cleanup

    mininet_log.setLogLevel("critical")
    opts.workdir.mkdir(parents=True, exist_ok=True)
    topo_path = testbed_topology(opts.workdir, opts.link_mbps, opts.hosts_per_dc)
    topology = load_topology(str(topo_path))
    binding = load_binding(topology)
    check_names_free([f"s{sw.dpid}" for sw in binding.switches.values()] + ["mgmt0"])
    bed = _Testbed(opts, topo_path, topology, binding, log)
    raw: dict = {"schedulers": list(opts.schedulers), "per_flow_tcp": []}
    try:
        bed.pki = make_pki(opts.workdir, [host.name for _, host in binding.all_hosts()],
                           opts.tenants)  # fmt: skip
        if opts.tenants:
            raw.update(tenant_coflows=opts.coflows, greedy_runs=[], reserve=opts.reserve)
        if opts.greedy_coflows:
            raw.update(greedy_coflows=opts.greedy_coflows, greedy_tenant=opts.tenants[-1])
        for phase, name in enumerate(opts.schedulers):
            _scheduler_phase(bed, phase, name, raw)
        return raw
    finally:
        bed.tear_down(cleanup)


@dataclass
class _Testbed:
    """What `run_swan` has brought up, for its scheduler phases and its teardown: the
    processes it started, the PKI directory, the Mininet WAN (None until the first phase
    builds it), the running controller (or ControllerCluster; None between phases) and the
    Observer (with opts.observe)."""

    opts: TestbedOptions
    topo_path: Path
    topology: Topology
    binding: Binding
    log: Callable[[str], None]
    procs: Processes = field(default_factory=Processes)
    pki: Path | None = None
    wan: object = None
    ctl: object = None
    observer: Observer | None = None

    def tear_down(self, cleanup) -> None:
        """Stop the observer and every process started, close the controller, stop Mininet
        (`cleanup`, i.e. `mn -c`, only when Mininet's own stop failed)."""
        if self.observer is not None:
            self.observer.stop()
        self.procs.stop_all()
        if self.ctl is not None:
            self.ctl.close()
        if self.wan is not None:
            try:
                self.wan.stop()
            except Exception:
                cleanup()


def _scheduler_phase(bed: _Testbed, phase: int, name: str, raw: dict) -> None:
    """Phase `phase` of run_swan: start the controller(s) running scheduler `name` (the first
    phase also builds the WAN and the observer), bring up the agents, run the scheduler
    `opts.repeats` times into raw[name] (the first phase with per-flow TCP runs, the install
    time, rules and flow-mods, the page's shots and a takeover), then stop that controller
    and its agents (the last phase reports what Prometheus saw first).

    Raises:
        TestbedError: bring-up failed or a run did not finish.
    """
    opts = bed.opts
    bed.ctl = ctl = _start_controllers(opts, bed.topo_path, bed.procs, bed.pki, name)
    bed.log(console_line(ctl, bed.pki))
    t_start = time.monotonic()
    if bed.wan is None:
        _build_wan(bed, ctl)
    if bed.observer is not None:
        bed.observer.watch_controller(ctl.rest)
    agents = _bring_up(bed.wan, bed.binding, ctl, opts.workdir, bed.procs, bed.log, bed.observer)
    if phase == 0:
        raw["install_s"] = time.monotonic() - t_start
        at_install = ctl.get("/tunnels")["switches"]["flow_mods_at_install"]
    shots = None
    if bed.observer is not None and phase == 0:
        shots = PageShots(ctl.rest, opts.workdir / "page")
    try:
        raw[name], flow_mods_before = _scheduler_runs(
            bed.wan, ctl, opts, raw, phase == 0, bed.procs, bed.log, shots
        )
    finally:
        if shots is not None:
            time.sleep(2.5)  # a timed shot may still be pending
            shots.close()
            raw["page"] = {"shots": shots.shots, "error": shots.error}
    of = ctl.get("/tunnels")["switches"]
    if phase == 0:
        raw["rules_per_switch"] = of["rules_per_switch"]
        raw["flow_mods_after_startup"] = flow_mods_before - at_install
        takeovers = [r.takeover for r in raw[name] if r.takeover]
        if takeovers:
            raw["takeover"] = takeovers[-1]
    if bed.observer is not None and phase == len(opts.schedulers) - 1:
        time.sleep(2 * SCRAPE_S)  # the agents' last counters scraped
        raw["observe"] = bed.observer.report()  # before the last agents stop
    bed.procs.stop([*agents, *ctl.proc_list])
    ctl.close()
    bed.ctl = None
    if opts.controllers == 1:  # its core's events, handled again offline
        raw.setdefault("core_replay", {})[name] = replay_core_log(core_log_path(opts.workdir, name))


def core_log_path(workdir: Path, scheduler: str) -> Path:
    """Where the testbed's controller running `scheduler` records its core's events."""
    return workdir / f"core-{scheduler}.log"


def _build_wan(bed: _Testbed, ctl) -> None:
    """Build the Mininet WAN (wan_net.build_wan: switches pointed at `ctl`'s OpenFlow
    port(s), the management network) into bed.wan, and with opts.observe the Observer."""
    from mininet_scenarios.wan_net import build_wan

    opts = bed.opts
    bed.wan = build_wan(bed.topology, bed.binding, of_port=opts.of_port,
                        link_mbps=opts.link_mbps, mgmt=True,
                        of_ports=getattr(ctl, "of_ports", None))  # fmt: skip
    if opts.observe:
        bed.observer = Observer(opts.workdir, bed.pki, OPERATOR_NAME, bed.wan.mgmt_ips)


def _start_controllers(opts: TestbedOptions, topo_path: Path, procs: Processes, pki: Path,
                       scheduler: str):  # fmt: skip
    """One TestbedController, or a ControllerCluster with opts.controllers > 1."""
    if opts.controllers > 1:
        return ControllerCluster(topo_path, opts.k, opts.controllers, opts.workdir, procs, pki,
                                 scheduler, rest_public=opts.observe)  # fmt: skip
    extra: tuple[str, ...] = ("--record", str(core_log_path(opts.workdir, scheduler)))
    if opts.tenants:
        toml = tenants_toml(opts.tenants, opts.workdir / "tenants.toml", opts.reserve,
                            opts.sharing)  # fmt: skip
        extra += ("--tenants", str(toml))
    return TestbedController(topo_path, opts.k, opts.of_port, opts.workdir / "controller.log",
                             procs, pki, scheduler=scheduler, rest_public=opts.observe,
                             extra=extra)  # fmt: skip


def _bring_up(wan, binding, ctl: TestbedController, workdir: Path, procs: Processes, log,
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


def _scheduler_runs(wan, ctl: TestbedController, opts: TestbedOptions, raw: dict, with_tcp: bool,
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

        kill = opts.kill_leader_at if i == opts.repeats - 1 else None
        run, before = run_terra(wan, ctl, opts.coflows, opts.failure, opts.timeout_s, on_event,
                                kill, opts.reserve)  # fmt: skip
        runs.append(run)
        if flow_mods_before is None:  # the first failure; without one: after the run
            flow_mods_before = _flow_mods_before(run, before, ctl)
        log(f"[{i + 1}] {ctl.scheduler} done in {run.duration_s:.1f} s")
        if with_tcp and opts.greedy_coflows:
            greedy, _ = run_terra(wan, ctl, opts.greedy_coflows, opts.failure, opts.timeout_s,
                                  reserve=opts.reserve)  # fmt: skip
            raw["greedy_runs"].append(greedy)
            log(f"[{i + 1}] {ctl.scheduler} with {raw['greedy_tenant']} greedy done in "
                f"{greedy.duration_s:.1f} s")  # fmt: skip
        if with_tcp:
            tcp = run_per_flow_tcp(
                wan, opts.coflows, opts.failure, opts.timeout_s, opts.workdir / f"tcp{i}", procs,
                ctl,
            )  # fmt: skip
            raw["per_flow_tcp"].append(tcp)
            log(f"[{i + 1}] per-flow TCP done in {tcp.duration_s:.1f} s")
    return runs, flow_mods_before


def _flow_mods(ctl: TestbedController) -> int:
    return ctl.get("/tunnels")["switches"]["flow_mods"]


def _flow_mods_before(run: RunResult, before: int | None, ctl) -> int:
    """The first controller's flow-mods before the run's link failure (`before`), or after
    the run without one; in a run whose leader was killed first, those before the kill."""
    kill = run.takeover
    if (
        kill
        and "kill_s" in kill
        and (before is None or kill["kill_s"] < (run.failure_down_s or float("inf")))
    ):
        return kill["flow_mods_before_kill"]
    return before if before is not None else _flow_mods(ctl)


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
                        ctl.agent_targets(mgmt_ip),
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
