"""Several controllers on etcd in the testbed (`terra-testbed swan --controllers N
--kill-leader-at S`), and the leader's SIGKILL in the middle of a run.

Everything listens in the root namespace: a three-member etcd cluster on 127.0.0.1 (the
testbed starts and stops it), N `terra-controller --etcd` processes, each with its own
--state-dir and its own API, agents, REST and OpenFlow ports (API, REST and OpenFlow on
127.0.0.1, --advertise 127.0.0.1; agents on 0.0.0.0, reached over the management network).
Controller 0 is started first and leads; the others start as standbys. Every switch gets
all N OpenFlow targets (only the leader listens on its OpenFlow port, standbys do not);
agents get every agents' port; the job master (TerraClient) every API address, and REST
reads follow the leader (its /healthz says role "leader").

`LeaderKill` kills the current leader with SIGKILL at S seconds after a run's first arrival
and measures the takeover. Takeover: from the SIGKILL to the first poll (every POLL_S) of
the new leader's REST /status that shows every agent registered and a scheduling round
run since the previous poll (so the round is at most one poll older than the last agent's
registration): the new leader is scheduling the resumed coflows. Also recorded: when its
/healthz first said "leader" and when its agents were all back.
"""

from __future__ import annotations

import http.client
import json
import signal
import subprocess
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

from mininet_scenarios.etcd_cluster import start_etcd
from mininet_scenarios.ports import free_port
from mininet_scenarios.testbed_processes import (
    JOB_NAME,
    OPERATOR_NAME,
    Processes,
    TestbedError,
    controller_argv,
)
from terra_controller.client import TerraClient

ETCD_MEMBERS = 3
# etcd lease of the leader (terra-controller --lease-ttl) and etcd's election timeout. A
# killed leader's lease is revoked by a standby that sees its liveness connection closed
# (terra_controller/takeover.py); without that close (a dead host) it expires within one TTL
# of the death (it is refreshed every TTL / 3) plus etcd's 0.5 s expiry check. etcd grants
# no lease below 1.5 election timeouts, so its default 1 s timeout allows 2 s at least; the
# testbed's members share one host's loopback, where a 500 ms election timeout (50 ms
# heartbeats) is ample and allows a 1 s lease.
LEASE_TTL_S = 1
ETCD_ELECTION_MS = 500
POLL_S = 0.02
TAKEOVER_TIMEOUT_S = 60.0
# A controller that does not answer a REST read: refused or reset, an HTTP error (a standby's
# 503), a reply cut off when the process dies mid-answer (IncompleteRead), or no JSON.
NO_ANSWER = (OSError, ValueError, http.client.HTTPException)


class CountingClient(TerraClient):
    """A TerraClient counting the coflows it resubmitted (`resubmitted`) after seeing a new
    controller instance."""

    resubmitted = 0

    def _resubmit(self) -> None:
        self.resubmitted += len(self.session.resubmissions())
        super()._resubmit()


class ControllerCluster:
    """etcd and `count` terra-controllers on it (module docstring); the interface of
    testbed_processes.TestbedController (client, get, agent_targets, pki, scheduler).

    Attributes: of_ports (OpenFlow port of each controller), procs (their Popens; None once
    killed), ports ([{"api", "agents", "rest", "of"}]), leader (index of the controller
    believed to lead), etcd (the members' "HOST:PORT").

    Raises:
        TestbedError: etcd or a controller did not start (what was started stays in `procs`
            of the Processes given, for its teardown).
    """

    def __init__(
        self, topo_path: Path, k: int, count: int, workdir: Path, procs: Processes, pki: Path,
        scheduler: str = "terra", rest_public: bool = False,
    ):  # fmt: skip
        from terra_security.pki import client_context

        self.pki, self.scheduler, self.workdir = pki, scheduler, workdir
        self.rest_tls = client_context(pki, OPERATOR_NAME)
        self.rest_tls.check_hostname = False  # urllib dials an IP; the CA still verifies it
        try:
            data = Path(tempfile.mkdtemp(prefix="etcd-", dir=workdir))  # no earlier run's
            members, self.etcd = start_etcd(
                data, ETCD_MEMBERS, new_session=True, election_ms=ETCD_ELECTION_MS
            )
        except (FileNotFoundError, RuntimeError) as exc:
            raise TestbedError(f"etcd: {exc}") from exc
        for m in members:
            procs.add(m)
        self.ports = [{p: free_port() for p in ("api", "agents", "rest", "of")}
                      for _ in range(count)]  # fmt: skip
        self.of_ports = [p["of"] for p in self.ports]
        self.logs = [open(workdir / f"controller{i}.log", "a") for i in range(count)]  # noqa: SIM115
        self.procs: list[subprocess.Popen | None] = []
        self.leader = 0
        self.lock = threading.Lock()
        for i in range(count):
            argv = controller_argv(
                topo_path, k, self.ports[i]["of"], pki, scheduler, workdir, rest_public,
                api=f"127.0.0.1:{self.ports[i]['api']}",
                agents=f"0.0.0.0:{self.ports[i]['agents']}",
                rest=f"127.0.0.1:{self.ports[i]['rest']}",
                extra=("--etcd", ",".join(self.etcd), "--cluster", "testbed",
                       "--lease-ttl", str(LEASE_TTL_S), "--advertise", "127.0.0.1"),
            )  # fmt: skip
            proc = procs.add(subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=self.logs[i],
                                              text=True, start_new_session=True))  # fmt: skip
            self.procs.append(proc)
            self._wait_line(i, "terra-controller ready" if i == 0 else "terra-controller standby")

    def _wait_line(self, i: int, prefix: str) -> None:
        while True:
            line = self.procs[i].stdout.readline()
            if line.startswith(prefix):
                return
            if not line:
                raise TestbedError(f"controller {i} did not print {prefix!r} "
                                   f"(see {self.workdir}/controller{i}.log)")  # fmt: skip

    @property
    def proc_list(self) -> list[subprocess.Popen]:
        """The controllers still running."""
        return [p for p in self.procs if p is not None]

    def agent_targets(self, host: str) -> str:
        """terra-agent's --controller value: every controller's agents' port on `host`."""
        return ",".join(f"{host}:{p['agents']}" for p in self.ports)

    def console(self) -> tuple[str, str]:
        """(REST base URL, coflow API "host:port") of the controller believed to lead."""
        ports = self.ports[self.leader]
        return f"https://127.0.0.1:{ports['rest']}", f"127.0.0.1:{ports['api']}"

    def client(self, timeout: float) -> CountingClient:
        """A TerraClient of the job master given every controller. It keeps no coflow for
        resubmission (max_open=0): a coflow survives a failover only when the new leader
        resumed it from etcd."""
        return CountingClient(controllers=[f"127.0.0.1:{p['api']}" for p in self.ports],
                           pki=self.pki, name=JOB_NAME, timeout=timeout, max_open=0)  # fmt: skip

    def health(self, i: int) -> dict | None:
        """/healthz of controller i (None: no answer)."""
        try:
            return self._get(i, "/healthz", timeout=1)
        except NO_ANSWER:
            return None

    def _get(self, i: int, path: str, timeout: float = 5):
        url = f"https://127.0.0.1:{self.ports[i]['rest']}{path}"
        with urllib.request.urlopen(url, timeout=timeout, context=self.rest_tls) as reply:
            return json.loads(reply.read())

    def find_leader(self, timeout: float = TAKEOVER_TIMEOUT_S) -> int:
        """Index of the controller whose /healthz says role leader (polled every POLL_S).

        Raises:
            TestbedError: none within `timeout` seconds.
        """
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            for i, proc in enumerate(self.procs):
                if proc is not None and (self.health(i) or {}).get("role") == "leader":
                    with self.lock:
                        self.leader = i
                    return i
            time.sleep(POLL_S)
        raise TestbedError(f"no controller leads after {timeout} s")

    def get(self, path: str):
        """GET a REST path at the leader (found again when the one known stops answering),
        decoded JSON.

        Raises:
            TestbedError: no leader answered within TAKEOVER_TIMEOUT_S.
        """
        end = time.monotonic() + TAKEOVER_TIMEOUT_S
        while True:
            try:
                return self._get(self.leader, path)
            except NO_ANSWER as exc:  # a standby answers 503 (HTTPError, an OSError)
                if time.monotonic() > end:
                    raise TestbedError(f"REST {path}: no leader answered: {exc}") from exc
                self.find_leader(max(0.1, end - time.monotonic()))

    def kill_leader(self) -> tuple[int, float]:
        """SIGKILL the current leader; returns (its index, time.monotonic() of the kill)."""
        i = self.leader
        proc = self.procs[i]
        proc.send_signal(signal.SIGKILL)
        killed = time.monotonic()
        proc.wait()
        self.procs[i] = None
        return i, killed

    def close(self) -> None:
        """Close the log files (the processes are stopped through Processes)."""
        for log in self.logs:
            log.close()


def takeover_checks(report: dict, cluster: ControllerCluster, client: CountingClient,
                    submitted: dict) -> None:  # fmt: skip
    """Add to a LeaderKill report what the run's end shows (client: the run's job master;
    submitted: {coflow id: ...} it submitted): "resubmitted" (coflows it sent again),
    "coflows_submitted", "coflows_done" (submitted coflows the new leader answers "done"
    for), "coflows_unknown" (coflows it lists from the run's first id on that were never
    submitted: a coflow made twice would be one), "flow_mods_at_takeover" (the new
    leader's, bringing the switches in line), "flow_mods_after_takeover" (all it sent so
    far) and "link_events_after_takeover" (link changes it reacted to, which send
    flow-mods)."""
    first = min(submitted, default=0)
    rows = [row for row in client.list_coflows() if row["id"] >= first]  # not earlier runs'
    report["resubmitted"] = client.resubmitted
    report["coflows_submitted"] = len(submitted)
    report["coflows_done"] = sum(client.check_status(cid)["state"] == "done" for cid in submitted)
    report["coflows_unknown"] = sum(row["id"] not in submitted for row in rows)
    switches = cluster.get("/tunnels")["switches"]
    report["flow_mods_at_takeover"] = switches["flow_mods_at_install"]
    report["flow_mods_after_takeover"] = switches["flow_mods"]
    report["link_events_after_takeover"] = cluster.get("/status")["reactions_total"]


class LeaderKill(threading.Thread):
    """Kills the cluster's leader at `at_s` seconds after `t0` (time.monotonic() of the run's
    first arrival) and measures the takeover (module docstring); `agents`: agents to wait
    for. `report` (after finish()): {"kill_s", "leader_s", "agents_back_s", "takeover_s"
    (seconds after the kill; None: not seen within TAKEOVER_TIMEOUT_S), "coflows_active"
    (the old leader's running and queued coflows just before the kill), "old_leader",
    "new_leader", "rounds_before_kill", "flow_mods_before_kill" (the old leader's)}."""

    def __init__(self, cluster: ControllerCluster, at_s: float, t0: float, agents: int):
        super().__init__(daemon=True)
        self.cluster, self.at_s, self.t0, self.agents = cluster, at_s, t0, agents
        self.stop_event = threading.Event()
        self.report: dict = {}
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            if not self.stop_event.wait(max(0.0, self.t0 + self.at_s - time.monotonic())):
                self._kill_and_watch()
        except BaseException as exc:  # reported by finish()
            self.error = exc

    def _kill_and_watch(self) -> None:
        c, r = self.cluster, self.report
        status = c.get("/status")
        r["coflows_active"] = sum(status["coflows"].get(s, 0)
                                  for s in ("queued", "running", "preempted"))  # fmt: skip
        r["rounds_before_kill"] = status["rounds"]
        r["flow_mods_before_kill"] = c.get("/tunnels")["switches"]["flow_mods"]
        r["old_leader"], killed = c.kill_leader()
        r["kill_s"] = killed - self.t0
        r["new_leader"] = new = c.find_leader()
        r["leader_s"] = time.monotonic() - killed
        r["agents_back_s"] = r["takeover_s"] = None
        rounds = None
        while time.monotonic() - killed < TAKEOVER_TIMEOUT_S and not self.stop_event.is_set():
            try:
                status = c._get(new, "/status", timeout=2)
            except NO_ANSWER:
                time.sleep(POLL_S)
                continue
            back = sum(a["connected"] for a in status["agents"]) >= self.agents
            if back and r["agents_back_s"] is None:
                r["agents_back_s"] = time.monotonic() - killed
            if back and rounds is not None and status["rounds"] > rounds:
                r["takeover_s"] = time.monotonic() - killed
                return
            rounds = status["rounds"]
            time.sleep(POLL_S)

    def finish(self) -> dict:
        """Stop waiting (a kill not yet due is not done; a takeover not seen within 10 s
        more is not waited for); return `report`.

        Raises:
            TestbedError: the kill or the watch failed.
        """
        if "kill_s" in self.report:  # killed: let the watch see the takeover
            self.join(timeout=10)
        self.stop_event.set()
        self.join(timeout=TAKEOVER_TIMEOUT_S + 10)
        if self.error is not None:
            raise TestbedError(f"leader kill: {self.error!r}") from self.error
        return self.report
