"""End to end on loopback: terra-controller --no-openflow, three terra-agents, a TerraClient.

Real processes, real TCP and mutual TLS (the session's PKI, see conftest.py): the
controller (TerraPolicy, API, agent channel, REST) runs as
`python -m terra_controller.cli`, the agents as `python -m terra_agent.cli` on
127.0.0.21-23, each in its own DC of a triangle WAN whose links carry 20 MB/s (0.16 Gbps) each way.
"""

from __future__ import annotations

import json
import re
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from benchmarks.harness import free_port, free_port_block, stop_processes
from terra_controller.client import TerraClient
from terra_security.pki import client_context

AGENTS = [("a1", "A", "127.0.0.21"), ("b1", "B", "127.0.0.22"), ("c1", "C", "127.0.0.23")]
K = 2


def is_flow_digest(value) -> bool:
    """A keyed flow digest as agents report it: 32 bytes of lowercase hex. Its value cannot be
    recomputed here: the flow key stays inside the controller and the flow's two agents (the
    receiver reports "complete" only when its digest equals the sender's)."""
    return isinstance(value, str) and re.fullmatch(r"[0-9a-f]{64}", value) is not None


def wait_until(predicate, timeout: float, what: str) -> None:
    end = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > end:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


class System:
    """The controller and three agents as subprocesses; stop() ends exactly those.

    The controller listens on fixed free ports so that it can be killed and
    restarted where the agents and the client look for it.
    """

    def __init__(
        self, workdir: Path, pki: Path, scheduler: str = "terra", extra: tuple[str, ...] = ()
    ) -> None:
        self.workdir = workdir
        self.extra = list(extra)  # more controller options
        self.scheduler = scheduler
        self.pki = pki
        self.rest_tls = client_context(pki, "operator1")
        self.rest_tls.check_hostname = False  # dials 127.0.0.1; the CA is still verified
        self.agents: dict[str, subprocess.Popen] = {}
        self.data_ports: dict[str, int] = {}
        self.topo = workdir / "tri.json"
        self.topo.write_text(
            json.dumps(
                {
                    "name": "tri",
                    "dcs": ["A", "B", "C"],
                    "default_capacity_gbps": 0.16,
                    "links": [{"a": "A", "b": "B"}, {"a": "B", "b": "C"}, {"a": "A", "b": "C"}],
                }
            )
        )
        self.api, self.agents_addr, rest = (f"127.0.0.1:{free_port()}" for _ in range(3))
        self.rest = "https://" + rest
        self.ctl_log = open(workdir / "controller.log", "a")  # noqa: SIM115
        self.start_controller()
        for agent, _, _ in AGENTS:
            self.start_agent(agent)
        self.wait_agents()
        host, port = self.api.split(":")
        self.client = TerraClient(host, int(port), pki=pki, name="operator1", timeout=20)

    def start_controller(self) -> None:
        self.ctl = subprocess.Popen(
            [sys.executable, "-m", "terra_controller.cli", "--topology", str(self.topo),
             "--no-openflow", "--k", str(K), "--api", self.api, "--agents", self.agents_addr,
             "--rest", self.rest[len("https://"):], "--pki", str(self.pki),
             "--scheduler", self.scheduler, "--state-dir", str(self.workdir / "state"),
             *self.extra],
            stdout=subprocess.PIPE, stderr=self.ctl_log, text=True,
        )  # fmt: skip
        line = self.ctl.stdout.readline()
        if not line.startswith("terra-controller ready"):
            self.ctl_log.flush()
            code = self.ctl.poll() if line else self.ctl.wait(timeout=10)
            tail = (self.workdir / "controller.log").read_text()[-3000:]
            raise AssertionError(f"controller did not start: {line!r} (exit status {code}); "
                                 f"its log ends:\n{tail}")  # fmt: skip

    def stop_controller(self) -> None:
        self.ctl.terminate()  # SIGTERM: it ends at once, closing the agents' channels
        self.ctl.wait(timeout=10)

    def start_agent(self, agent: str) -> None:
        _, dc, host = next(a for a in AGENTS if a[0] == agent)
        if agent not in self.data_ports:
            self.data_ports[agent] = free_port_block(host, K + 8)
        log = open(self.workdir / f"{agent}.log", "a")  # noqa: SIM115
        self.agents[agent] = subprocess.Popen(
            [sys.executable, "-m", "terra_agent.cli", "--controller", self.agents_addr,
             "--dc", dc, "--id", agent, "--data-addr", f"{host}:{self.data_ports[agent]}",
             "--spill-dir", str(self.workdir), "--pki", str(self.pki)],
            stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip

    def kill_agent(self, agent: str) -> None:
        self.agents[agent].kill()
        self.agents[agent].wait()

    def wait_agents(self, timeout: float = 20.0) -> None:
        def registered() -> bool:
            try:
                agents = self.get("/status")["agents"]
            except (urllib.error.URLError, ConnectionError):  # REST opens just after the
                return False  # "ready" line, and answers 503 until its controller is attached
            return sum(a["connected"] for a in agents) == len(AGENTS)

        wait_until(registered, timeout, "agents to register")

    def get(self, path: str):
        with urllib.request.urlopen(self.rest + path, timeout=5, context=self.rest_tls) as reply:
            return json.loads(reply.read())

    def stop(self) -> None:
        self.client.close()
        stop_processes([self.ctl, *self.agents.values()])
        self.ctl_log.close()


@pytest.fixture(scope="module")
def system(tmp_path_factory, pki):
    s = System(tmp_path_factory.mktemp("e2e"), pki)
    yield s
    s.stop()


def flow(fid, src, dst, size):
    return {"id": fid, "src": src, "dst": dst, "bytes": size}


def assert_digests(status: dict) -> None:
    assert status["state"] == "done"
    assert status["bytes_delivered"] == status["bytes_total"]
    for f in status["flows"]:
        assert is_flow_digest(f["digest"]), f["id"]
    digests = [f["digest"] for f in status["flows"]]
    assert len(set(digests)) == len(digests)  # one key per flow: no two digests alike


def test_coflows_complete_smaller_first_and_rest_agrees(system):
    c = system.client
    big = c.submit_coflow([flow("f1", "a1", "b1", 60_000_000), flow("f2", "c1", "b1", 30_000_000)])
    time.sleep(0.3)
    small = c.submit_coflow([flow("g", "a1", "b1", 6_000_000)])
    # The small coflow arrived later, but its Γ is smaller: it preempts the big one.
    s_small = c.wait(small, timeout=60)
    s_big = c.wait(big, timeout=120)
    assert_digests(s_small)
    assert_digests(s_big)
    finished_small = s_small["cct_s"] + 0.3  # it was submitted ~0.3 s after the big one
    assert finished_small < s_big["cct_s"]
    # REST agrees with checkStatus.
    for cid, status in ((big, s_big), (small, s_small)):
        rest = system.get(f"/coflows/{cid}")
        for key in ("state", "bytes_total", "bytes_delivered", "cct_s"):
            assert rest[key] == status[key], key
        listed = {x["id"]: x for x in system.get("/coflows")}
        assert listed[cid]["state"] == "done" and listed[cid]["cct_s"] == status["cct_s"]


@pytest.mark.parametrize("name", ["per-flow", "multipath", "swan-mcf", "varys", "rapier"])
def test_every_baseline_runs_live_and_delivers_every_byte(tmp_path, pki, name):
    # `terra-controller --scheduler NAME`: the registry's policy drives real agents; two
    # coflows over the triangle (one crossing two DC pairs) finish with matching digests.
    live = System(tmp_path, pki, scheduler=name)
    try:
        assert live.get("/status")["scheduler"] == name
        c = live.client
        first = c.submit_coflow(
            [flow("f1", "a1", "b1", 8_000_000), flow("f2", "c1", "b1", 4_000_000)]
        )
        second = c.submit_coflow([flow("g", "b1", "c1", 5_000_000)])
        for cid in (first, second):
            assert_digests(c.wait(cid, timeout=60))
    finally:
        live.stop()


def test_unmeetable_deadline_returns_minus_one(system):
    # 200 MB A->B over two 20 MB/s paths: Γ = 200e6 / 40e6 = 5 s > 1 s.
    assert system.client.submit_coflow([flow("d", "a1", "b1", 200_000_000)], deadline=1.0) == -1


def test_update_coflow_adds_flows_that_complete(system):
    c = system.client
    cid = c.submit_coflow([flow("f1", "a1", "c1", 8_000_000)])
    c.update_coflow(cid, [flow("f2", "b1", "a1", 8_000_000), flow("f3", "c1", "b1", 4_000_000)])
    status = c.wait(cid, timeout=60)
    assert [f["id"] for f in status["flows"]] == ["f1", "f2", "f3"]
    assert_digests(status)


def test_bad_peers_do_not_take_the_controller_down(system):
    host, port = system.agents_addr.split(":")
    for junk in (b"\x00\x00\x00\x05\xc1\xc1\xc1\xc1\xc1", b"\xff\xff\xff\xff", b"\x00\x00"):
        with socket.create_connection((host, int(port)), timeout=5) as s:
            s.sendall(junk)
    host, port = system.api.split(":")
    with socket.create_connection((host, int(port)), timeout=5) as s:
        s.sendall(b"\x00\x00\x00\x03abc")
    cid = system.client.submit_coflow([flow("x", "b1", "c1", 1_000_000)])
    assert_digests(system.client.wait(cid, timeout=30))
    assert sum(a["connected"] for a in system.get("/status")["agents"]) == 3


def test_link_down_mid_transfer_reroutes_and_loses_nothing(system):
    c = system.client
    cid = c.submit_coflow([flow("big", "a1", "b1", 80_000_000)])
    deadline = time.monotonic() + 30
    while c.check_status(cid)["bytes_delivered"] < 10_000_000:
        assert time.monotonic() < deadline, "no progress"
        time.sleep(0.05)
    assert c.set_link_state("A", "B", False)
    try:
        time.sleep(0.3)
        links = {(x["a"], x["b"]): x for x in system.get("/topology")["links"]}
        assert links[("A", "B")]["state"] == "down"
        assert links[("A", "B")]["allocated_bytes_per_s"] == 0
        rest = system.get(f"/coflows/{cid}")
        assert rest["state"] != "done"  # 80 MB at <= 40 MB/s: still running
        # Every path with a rate now avoids A-B, and the coflow still moves.
        rated = [p for p in rest["flowgroups"][0]["paths"] if p["rate_bytes_per_s"] > 0]
        assert rated and all(p["path"] == ["A", "C", "B"] for p in rated)
        status = c.wait(cid, timeout=60)
        assert_digests(status)
    finally:
        c.set_link_state("A", "B", True)
    tunnels = system.get("/tunnels")["tunnels"]
    assert all(t["up"] for t in tunnels)


def ctl(system, *args) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "terra_controller.cli", "ctl", "--api", system.api,
         "--pki", str(system.pki), "--name", "operator1", *args],
        capture_output=True, text=True, timeout=30,
    )  # fmt: skip


def test_operator_ctl_commands(system):
    down = ctl(system, "link-down", "B", "C")
    assert down.returncode == 0 and json.loads(down.stdout) == {"changed": True}
    links = {(x["a"], x["b"]): x["state"] for x in system.get("/topology")["links"]}
    assert links[("B", "C")] == links[("C", "B")] == "down"
    assert json.loads(ctl(system, "link-up", "B", "C").stdout) == {"changed": True}
    assert all(x["state"] == "up" for x in system.get("/topology")["links"])
    listed = json.loads(ctl(system, "list").stdout)
    assert [c["id"] for c in listed] == [c["id"] for c in system.get("/coflows")]
    bad = ctl(system, "link-down", "B", "Mars")
    assert bad.returncode == 1 and "no link" in bad.stderr


def test_agent_restarted_mid_transfer_gets_its_state_back(system):
    c = system.client
    cid = c.submit_coflow([flow("r1", "a1", "c1", 60_000_000)])
    wait_until(lambda: c.check_status(cid)["bytes_delivered"] >= 10_000_000, 30, "progress")
    system.kill_agent("a1")  # the sender dies
    system.start_agent("a1")  # re-registers: tunnels, flows (acked offsets) and rates again
    status = c.wait(cid, timeout=120)
    assert_digests(status)
    system.wait_agents()


def test_controller_restarted_mid_transfer_rebuilds_state(system):
    c = system.client
    cid = c.submit_coflow([flow("k1", "a1", "b1", 60_000_000), flow("k2", "c1", "b1", 40_000_000)])
    # k3 joins k1's FlowGroup (A->B): all three share B's 40 MB/s ingress, so no flow
    # finishes before the crash (a flow completed before it is known to the dead
    # controller only; see the report's note on "register" inflight rows).
    c.update_coflow(cid, [flow("k3", "a1", "b1", 20_000_000)])
    wait_until(lambda: c.check_status(cid)["bytes_delivered"] >= 15_000_000, 30, "progress")
    system.stop_controller()
    time.sleep(0.5)  # agents keep sending at their last rates meanwhile
    system.start_controller()
    # The client's next call reconnects, sees a new controller instance and resubmits
    # the coflow (with k3) under its id; the agents re-register and report what they
    # acknowledged and completed, so nothing is resent from zero and nothing is lost.
    status = c.wait(cid, timeout=120)
    assert [f["id"] for f in status["flows"]] == ["k1", "k2", "k3"]
    assert_digests(status)
    system.wait_agents()
    assert system.get("/coflows")[0]["id"] == cid


def test_a_recorded_run_replays_to_the_same_outcomes_and_rounds(tmp_path, pki):
    # `--record LOG` while real agents move bytes (reports, rounds in the loop's worker,
    # a link failure and its repair, an update, a cancel), then `terra-controller replay
    # LOG`: a controller built from the log's options handles the same events and solves
    # every round again with the same rates.
    log = tmp_path / "core.log"
    live = System(tmp_path, pki, extra=("--record", str(log)))
    try:
        c = live.client
        big = c.submit_coflow(
            [flow("f1", "a1", "b1", 30_000_000), flow("f2", "c1", "b1", 9_000_000)]
        )
        small = c.submit_coflow([flow("g", "b1", "c1", 12_000_000)])
        c.update_coflow(small, [flow("g2", "a1", "c1", 2_000_000)])
        doomed = c.submit_coflow([flow("h", "c1", "a1", 400_000_000)])
        wait_until(lambda: c.check_status(big)["bytes_delivered"] > 5_000_000, 30, "progress")
        assert c.set_link_state("A", "B", False)
        time.sleep(0.3)
        assert c.set_link_state("A", "B", True)
        c.cancel_coflow(doomed)
        for cid in (big, small):
            assert_digests(c.wait(cid, timeout=90))
    finally:
        live.stop()
    replayed = subprocess.run(
        [sys.executable, "-m", "terra_controller.cli", "replay", str(log)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert replayed.returncode == 0, replayed.stdout + replayed.stderr
    summary = replayed.stdout.splitlines()
    assert (
        "1 cancelled, 2 done" in summary[0]
        and summary[1] == "every outcome, effect and round as recorded"
    )
    kinds = [json.loads(line)[2] for line in log.read_text().splitlines()]
    assert kinds[0] == "start" and {"agent", "submit", "progress", "complete", "link", "update",
                                    "cancel", "round", "round_applied"} <= set(kinds)  # fmt: skip
    cancel = next(json.loads(line) for line in log.read_text().splitlines() if '"cancel"' in line)
    assert ["drop", doomed, ["h"], False] in cancel[5]  # (its agents are told to drop it)
    # A log whose round differs is caught: exit status 1, the event named.
    lines = log.read_text().splitlines()
    at = next(i for i, line in enumerate(lines) if json.loads(line)[2] == "round_applied")
    seq, t, kind, args, _, effects = json.loads(lines[at])
    lines[at] = json.dumps([seq, t, kind, args, "0" * 64, effects])
    log.write_text("\n".join(lines) + "\n")
    forged = subprocess.run(
        [sys.executable, "-m", "terra_controller.cli", "replay", str(log)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert forged.returncode == 1 and f"event {seq} (round_applied)" in forged.stdout
