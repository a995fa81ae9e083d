"""Controllers sharing a real etcd: one leads, a standby names it, and when the leader is
killed (SIGKILL) in the middle of a transfer the standby takes over and the coflow completes
with no client resubmitting it.

Real processes on loopback: a one-member etcd (benchmarks/harness.start_etcd), two
`terra-controller --etcd` processes (--no-openflow), the three agents of
tests/integration/test_controller_e2e.py given both controllers' agent ports, mutual TLS.
"""

from __future__ import annotations

import http.client
import json
import signal
import ssl
import subprocess
import sys
import time
import urllib.request

import pytest
from test_controller_e2e import AGENTS, K, assert_digests, flow, wait_until

from benchmarks.harness import free_port, free_port_block, start_etcd, stop_processes
from terra_controller.client import TerraClient

MB = 1_000_000


class Cluster:
    """etcd, two controllers and three agents; stop() ends exactly those processes."""

    def __init__(self, workdir, pki, members: int = 1, extra: tuple[str, ...] = ()) -> None:
        self.workdir, self.pki = workdir, pki
        self.extra = list(extra)  # more controller options
        self.procs: list[subprocess.Popen] = []
        self.etcd, addrs = start_etcd(workdir, members)
        self.etcd_addr = ",".join(addrs)
        self.procs += self.etcd
        self.topo = workdir / "tri.json"
        self.topo.write_text(json.dumps({
            "name": "tri", "dcs": ["A", "B", "C"], "default_capacity_gbps": 0.16,
            "links": [{"a": "A", "b": "B"}, {"a": "B", "b": "C"}, {"a": "A", "b": "C"}],
        }))  # fmt: skip
        self.addrs = [{k: free_port() for k in ("api", "agents", "rest")} for _ in range(2)]
        self.controllers: list[subprocess.Popen | None] = [None, None]
        self.agents: dict[str, subprocess.Popen] = {}

    def start_controller(self, i: int) -> None:
        a = self.addrs[i]
        log = open(self.workdir / f"controller{i}.log", "a")  # noqa: SIM115
        proc = subprocess.Popen(
            [sys.executable, "-m", "terra_controller.cli", "--topology", str(self.topo),
             "--no-openflow", "--k", str(K), "--pki", str(self.pki),
             "--api", f"127.0.0.1:{a['api']}", "--agents", f"127.0.0.1:{a['agents']}",
             "--rest", f"127.0.0.1:{a['rest']}", "--etcd", self.etcd_addr,
             "--cluster", "failover", *self.extra],
            stdout=subprocess.PIPE, stderr=log, text=True,
        )  # fmt: skip
        log.close()
        self.controllers[i] = proc
        self.procs.append(proc)
        line = proc.stdout.readline()
        assert line.startswith("terra-controller standby"), self.log_tail(i)

    def log_tail(self, i: int) -> str:
        """The last lines controller i wrote to its log (for a failed assertion)."""
        text = (self.workdir / f"controller{i}.log").read_text(errors="replace")
        return "controller log:\n" + "\n".join(text.splitlines()[-30:])

    def start_agents(self) -> None:
        controllers = ",".join(f"127.0.0.1:{a['agents']}" for a in self.addrs)
        for agent, dc, host in AGENTS:
            port = free_port_block(host, K + 8)
            log = open(self.workdir / f"{agent}.log", "a")  # noqa: SIM115
            self.agents[agent] = subprocess.Popen(
                [sys.executable, "-m", "terra_agent.cli", "--controller", controllers,
                 "--dc", dc, "--id", agent, "--data-addr", f"{host}:{port}",
                 "--spill-dir", str(self.workdir), "--pki", str(self.pki)],
                stdout=log, stderr=subprocess.STDOUT,
            )  # fmt: skip
            log.close()
            self.procs.append(self.agents[agent])

    def health(self, i: int) -> dict | None:
        """/healthz of controller i, without a client certificate (None: no answer, or a
        reply cut off by a controller starting over)."""
        ctx = ssl.create_default_context(cafile=str(self.pki / "ca.crt"))
        ctx.check_hostname = False
        url = f"https://127.0.0.1:{self.addrs[i]['rest']}/healthz"
        try:
            with urllib.request.urlopen(url, timeout=2, context=ctx) as reply:
                return json.loads(reply.read())
        except (OSError, http.client.HTTPException, ValueError):
            return None

    def ready(self, i: int, timeout: float) -> None:
        """Wait for controller i's "ready" line (it leads and schedules)."""
        proc = self.controllers[i]
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            line = proc.stdout.readline()
            if line.startswith("terra-controller ready"):
                return
            if not line and proc.poll() is not None:
                break
        raise AssertionError(f"controller {i} did not become ready; {self.log_tail(i)}")

    def client(self, i: int, timeout: float = 20) -> TerraClient:
        return TerraClient("127.0.0.1", self.addrs[i]["api"], pki=self.pki, name="operator1",
                           timeout=timeout)  # fmt: skip

    def stop(self) -> None:
        stop_processes([p for p in self.procs if p.poll() is None])


@pytest.fixture
def cluster(tmp_path, pki):
    c = Cluster(tmp_path, pki)
    yield c
    c.stop()


def test_a_standby_names_the_leader_and_takes_over_a_transfer_when_it_is_killed(cluster):
    cluster.start_controller(0)
    cluster.ready(0, 60)
    cluster.start_controller(1)
    assert cluster.health(0)["role"] == "leader"
    leader_api = f"127.0.0.1:{cluster.addrs[0]['api']}"
    wait_until(lambda: (cluster.health(1) or {}).get("leader") == leader_api, 20, "standby")
    assert cluster.health(1)["role"] == "standby"
    standby = cluster.client(1)  # given the standby only: it follows the leader named
    assert standby.list_coflows() == []
    standby.close()
    cluster.start_agents()
    first = cluster.client(0)
    connected = lambda: sum(a["connected"] for a in first.list_agents()["agents"])  # noqa: E731
    wait_until(lambda: connected() == 3, 30, "agents")
    start = time.monotonic()
    cid = first.submit_coflow(
        [flow("r1", "a1", "b1", 80 * MB), flow("r2", "c1", "a1", 30 * MB)], name="ha"
    )
    wait_until(lambda: first.check_status(cid)["bytes_delivered"] >= 10 * MB, 30, "progress")
    first.close()
    cluster.controllers[0].kill()  # SIGKILL: no goodbye, its lease simply expires
    killed = time.monotonic()
    cluster.ready(1, 60)
    took_over = time.monotonic() - killed
    assert cluster.health(1)["role"] == "leader"
    second = cluster.client(1)
    status = second.wait(cid, timeout=120)
    assert_digests(status)
    assert status["name"] == "ha" and status["bytes_total"] == 110 * MB
    assert status["cct_s"] > killed - start  # counted from the first submission
    assert [c["id"] for c in second.list_coflows()] == [cid]  # nothing submitted twice
    assert all(p.poll() is None for p in cluster.agents.values())
    second.close()
    print(f"standby leading {took_over:.2f} s after the kill")


def start_transfer(cluster: Cluster) -> tuple[TerraClient, int]:
    """Controller 0 leads, 1 stands by, the agents are connected; a 110 MB coflow runs."""
    cluster.start_controller(0)
    cluster.ready(0, 60)
    cluster.start_controller(1)
    cluster.start_agents()
    client = cluster.client(0)
    connected = lambda: sum(a["connected"] for a in client.list_agents()["agents"])  # noqa: E731
    wait_until(lambda: connected() == 3, 30, "agents")
    cid = client.submit_coflow([flow("r1", "a1", "b1", 80 * MB), flow("r2", "c1", "a1", 30 * MB)])
    wait_until(lambda: client.check_status(cid)["bytes_delivered"] >= 5 * MB, 30, "progress")
    return client, cid


@pytest.fixture
def cluster3(tmp_path, pki):
    c = Cluster(tmp_path, pki, members=3)
    yield c
    c.stop()


def test_one_etcd_member_killed_loses_nothing(cluster3):
    """The member the controllers ask first dies (if it led etcd, etcd elects another leader
    meanwhile; when that takes longer than the lease the controllers fail over too)."""
    client, cid = start_transfer(cluster3)
    cluster3.etcd[0].kill()
    cluster3.etcd[0].wait()
    # written to another member; etcd's election (if the member led it) and then the
    # controllers' may take more than the usual 20 s on a loaded machine: 60 s to find a leader
    patient = cluster3.client(0, timeout=60)
    second = patient.submit_coflow([flow("s1", "b1", "c1", 5 * MB)])
    patient.close()
    assert_digests(client.wait(cid, timeout=120))
    assert_digests(client.wait(second, timeout=60))
    roles = lambda: sorted((cluster3.health(i) or {}).get("role", "") for i in (0, 1))  # noqa: E731
    wait_until(lambda: roles() == ["leader", "standby"], 30, "one leader, one standby")
    assert sorted(c["id"] for c in client.list_coflows()) == sorted([cid, second])
    client.close()


def test_etcd_unavailable_for_10_s_refuses_submissions_and_recovers_by_itself(cluster):
    client, cid = start_transfer(cluster)
    client.close()
    for member in cluster.etcd:
        member.send_signal(signal.SIGSTOP)  # etcd answers nothing for 10 s
    try:
        # the leader cannot renew its lease: within ~3 s it starts over as a standby, and
        # nobody can lead while etcd is away
        wait_until(lambda: (cluster.health(0) or {}).get("role") == "standby", 15, "step down")
        refused = cluster.client(0)
        with pytest.raises(Exception, match="not_leader.*no leader is known"):
            refused.submit_coflow([flow("x", "a1", "c1", MB)])
        refused.close()
        time.sleep(max(0.0, 10 - 3))
    finally:
        for member in cluster.etcd:
            member.send_signal(signal.SIGCONT)
    wait_until(lambda: "leader" in {(cluster.health(i) or {}).get("role") for i in (0, 1)},
               30, "a leader again")  # fmt: skip
    leader = next(i for i in (0, 1) if cluster.health(i)["role"] == "leader")
    cluster.ready(leader, 60)
    after = cluster.client(leader)
    status = after.wait(cid, timeout=120)
    assert_digests(status)
    assert [c["id"] for c in after.list_coflows()] == [cid]
    after.close()


def test_a_controller_that_cannot_reach_etcd_never_leads(tmp_path, pki):
    cluster = Cluster(tmp_path, pki)
    try:
        cluster.etcd_addr = f"127.0.0.1:{free_port()}"  # nothing listens there
        cluster.start_controller(0)
        time.sleep(3)
        assert cluster.health(0) == {"role": "standby", "leader": None, "state_version": None}
        client = cluster.client(0)
        with pytest.raises(Exception, match="not_leader.*no leader is known"):
            client.list_coflows()
        client.close()
    finally:
        cluster.stop()
