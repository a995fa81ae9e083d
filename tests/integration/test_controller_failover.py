"""Agents and clients given several controllers find the leader (terra_wire/failover.py).

A real `terra-controller --no-openflow` process (mutual TLS, the session's PKI) is the
leader; two real `terra-agent` processes are given a dead address (nothing listens there)
before it. The standbys are in-test mutual-TLS servers speaking the real coflow API framing:
one answers every request with the "not_leader" reply naming the leader, one relays a
submit to the leader and then drops the client's connection without the reply (a leader
lost right after executing it). Clients given only dead addresses fail within their
timeout with one line naming them.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_api import daemon_spawn
from test_controller_e2e import wait_until
from tls_helpers import security, tls_socket

from benchmarks.harness import free_port, free_port_block, stop_processes
from terra_controller import cli as controller_cli
from terra_controller.async_client import AsyncTerraClient
from terra_controller.client import TerraClient
from terra_controller.transport import listen_and_serve, read_message, stop_listener
from terra_wire.api import pack_message
from terra_wire.failover import parse_address

AGENTS = [("a1", "A", "127.0.0.21"), ("b1", "B", "127.0.0.22")]
JOB = "job1"


class Leader:
    """The real controller and two agents, each agent given "DEAD:PORT,LIVE:PORT"."""

    def __init__(self, workdir: Path, pki: Path) -> None:
        self.workdir, self.pki = workdir, pki
        topo = workdir / "pair.json"
        topo.write_text(json.dumps({"name": "pair", "dcs": ["A", "B"],
                                    "default_capacity_gbps": 0.16,
                                    "links": [{"a": "A", "b": "B"}]}))  # fmt: skip
        self.api, self.agents_addr, rest, self.dead_agents = (
            f"127.0.0.1:{free_port()}" for _ in range(4)
        )
        self.ctl_log = open(workdir / "controller.log", "a")  # noqa: SIM115
        self.ctl = subprocess.Popen(
            [sys.executable, "-m", "terra_controller.cli", "--topology", str(topo),
             "--no-openflow", "--k", "1", "--api", self.api, "--agents", self.agents_addr,
             "--rest", rest, "--pki", str(pki), "--state-dir", str(workdir / "state")],
            stdout=subprocess.PIPE, stderr=self.ctl_log, text=True,
        )  # fmt: skip
        line = self.ctl.stdout.readline()
        if not line.startswith("terra-controller ready"):
            stop_processes([self.ctl])
            self.ctl_log.close()
            tail = (workdir / "controller.log").read_text()[-2000:]
            raise AssertionError(f"controller did not start: {line!r}; its log ends:\n{tail}")
        self.agents: list[subprocess.Popen] = []
        for agent, dc, host in AGENTS:
            log = open(workdir / f"{agent}.log", "a")  # noqa: SIM115
            port = free_port_block(host, 8)
            self.agents.append(subprocess.Popen(
                [sys.executable, "-m", "terra_agent.cli",
                 "--controller", f"{self.dead_agents},{self.agents_addr}", "--dc", dc,
                 "--id", agent, "--data-addr", f"{host}:{port}",
                 "--spill-dir", str(workdir), "--pki", str(pki)],
                stdout=log, stderr=subprocess.STDOUT,
            ))  # fmt: skip
            log.close()

    def client(self, **kwargs) -> TerraClient:
        host, port = self.api.split(":")
        return TerraClient(host, int(port), pki=self.pki, name=JOB, timeout=10, **kwargs)

    def connected_agents(self) -> set[str]:
        with self.client() as c:
            return {a["id"] for a in c.list_agents()["agents"] if a["connected"]}

    def coflows_named(self, name: str) -> list[dict]:
        with self.client() as c:
            return [x for x in c.list_coflows() if x["name"] == name]

    def stop(self) -> None:
        stop_processes([self.ctl, *self.agents])
        self.ctl_log.close()


@pytest.fixture(scope="module")
def leader(tmp_path_factory, pki):
    system = Leader(tmp_path_factory.mktemp("failover"), pki)
    try:
        wait_until(lambda: system.connected_agents() == {"a1", "b1"}, 30, "agents to register")
    except BaseException:
        system.stop()
        raise
    yield system
    system.stop()


class Standby:
    """An in-test controller peer on the coflow API port (mutual TLS, real framing).

    answer(request) -> the reply map to send, or None to close the connection without one.
    Every request received is recorded in `requests`. echo_req: replies echo the request's
    "req" (False: a reply a pipelining client cannot match to its call).
    """

    def __init__(self, pki: Path, answer, echo_req: bool = True) -> None:
        self.requests: list[dict] = []
        self.answer = answer

        def serve(sock, addr, identity):
            while (request := read_message(sock, 5.0)) is not None:
                self.requests.append(request)
                reply = self.answer(request)
                if reply is None:
                    return
                if echo_req:
                    reply = dict(reply, req=request.get("req"))
                sock.sendall(pack_message(dict(reply, v=1)))

        self.listener, _, (host, port) = listen_and_serve(
            "127.0.0.1", 0, serve, security(pki), daemon_spawn
        )
        self.addr = f"{host}:{port}"

    def stop(self) -> None:
        stop_listener(self.listener)


def not_leader(leader_addr: str | None):
    """A standby's answer to every request: "not_leader", naming `leader_addr`."""
    text = f"the leader is {leader_addr}" if leader_addr else "the leader is not known yet"
    return lambda request: {"ok": False, "code": "not_leader", "leader": leader_addr,
                            "error": f"this controller is a standby; {text}"}  # fmt: skip


def flows(tag: str) -> list[dict]:
    return [{"id": f"{tag}-f", "src": "a1", "dst": "b1", "bytes": 1_000_000}]


def test_agents_given_a_dead_address_first_register_with_the_live_controller(leader):
    assert leader.connected_agents() == {"a1", "b1"}
    log = (leader.workdir / "a1.log").read_text()
    assert f"registered with the controller at {leader.agents_addr} as a1" in log
    assert leader.dead_agents in log  # it was tried (refused) first


async def test_an_agent_moves_to_the_next_controller_when_its_channel_is_lost(tmp_path):
    """In-test controllers speaking the real control protocol: the agent, given a dead
    address first, registers with the first live one and, when that one goes, with the
    next (no agent restart)."""
    import trio

    from benchmarks.harness import ControllerPeer
    from terra_agent.agent import Agent, AgentConfig

    first, second = ControllerPeer(), ControllerPeer()
    first_scope = trio.CancelScope()

    async def serve_first(task_status=trio.TASK_STATUS_IGNORED):
        with first_scope:
            await first.serve(task_status)

    dead = ("127.0.0.1", free_port())
    async with trio.open_nursery() as nursery:
        await nursery.start(serve_first)
        await nursery.start(second.serve)
        agent = Agent(AgentConfig(
            controller=dead, controllers=((first.host, first.port), (second.host, second.port)),
            dc="A", agent_id="a1", data_addr=("127.0.0.1", free_port_block("127.0.0.1", 9)),
            spill_dir=str(tmp_path),
        ))  # fmt: skip
        nursery.start_soon(agent.run)
        with trio.fail_after(10):
            await first.wait_until(lambda: first.connected("a1"))
        assert agent.controller_addr == (first.host, first.port)
        first_scope.cancel()  # the first controller goes: its listener and session close
        with trio.fail_after(10):
            await second.wait_until(lambda: second.connected("a1"))
        assert agent.controller_addr == (second.host, second.port)
        assert first.registrations == {"a1": 1} and second.registrations == {"a1": 1}
        assert agent.control_connects == 2  # the dead address never connected
        nursery.cancel_scope.cancel()


def test_a_client_sent_on_by_a_standby_submits_once_to_the_leader(leader, pki):
    standby = Standby(pki, not_leader(leader.api))
    try:
        with TerraClient(controllers=[standby.addr, leader.api], pki=pki, name=JOB,
                         timeout=10) as c:  # fmt: skip
            cid = c.submit_coflow(flows("sync"), name="via-standby")
            assert c.addr == parse_address(leader.api)
            assert c.check_status(cid)["name"] == "via-standby"
    finally:
        standby.stop()
    assert [r["op"] for r in standby.requests] == ["hello"]  # nothing else went there
    assert [x["id"] for x in leader.coflows_named("via-standby")] == [cid]


@pytest.mark.parametrize("echo_req", [True, False])
def test_an_async_client_sent_on_by_a_standby_that_does_not_know_the_leader(leader, pki, echo_req):
    standby = Standby(pki, not_leader(None), echo_req)  # no leader named: the next address

    async def submit() -> list[int]:
        async with AsyncTerraClient(controllers=[standby.addr, leader.api], pki=pki,
                                    name=JOB, timeout=10) as c:  # fmt: skip
            return list(await asyncio.gather(
                *(c.submit_coflow(flows(f"async{i}"), name=f"async-via-standby-{echo_req}")
                  for i in range(5))
            ))  # fmt: skip

    started = time.monotonic()
    try:
        ids = asyncio.run(submit())
    finally:
        standby.stop()
    assert time.monotonic() - started < 5  # not a reply timeout (10 s)
    assert {r["op"] for r in standby.requests} == {"hello"}
    listed = leader.coflows_named(f"async-via-standby-{echo_req}")
    assert sorted(x["id"] for x in listed) == sorted(ids)
    assert len(set(ids)) == 5


def test_a_submit_resent_after_its_leader_was_lost_runs_once(leader, pki):
    """The relay executes the submit at the leader (as the client's identity, so its "ref"
    counts as the client's), then drops the client without the reply: the client fails over
    to the leader and resends the same submit, which must not run a second time."""
    relay_sock = tls_socket(*parse_address(leader.api), pki, JOB)
    executed: list[dict] = []

    def relay(request: dict) -> dict | None:
        relay_sock.sendall(pack_message(request))
        reply = read_message(relay_sock, 5.0)
        if request["op"] == "submit":
            executed.append(reply)
            return None  # lost before the client heard the reply
        return reply

    lost = Standby(pki, relay)
    try:
        with TerraClient(controllers=[lost.addr, leader.api], pki=pki, name=JOB,
                         timeout=10) as c:  # fmt: skip
            cid = c.submit_coflow(flows("relay"), name="resent-once")
    finally:
        lost.stop()
        relay_sock.close()
    assert len(executed) == 1 and executed[0]["ok"] and executed[0]["coflow"] == cid
    submits = [r for r in lost.requests if r["op"] == "submit"]
    assert len(submits) == 1 and submits[0]["ref"]  # it carried a ref
    assert [x["id"] for x in leader.coflows_named("resent-once")] == [cid]


def test_a_client_given_only_dead_addresses_fails_within_its_timeout(pki):
    dead = [f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"]
    started = time.monotonic()
    with pytest.raises(ConnectionError) as info:
        TerraClient(controllers=dead, pki=pki, name=JOB, timeout=1.5).list_coflows()
    assert time.monotonic() - started < 3.0
    message = str(info.value)
    assert "\n" not in message and "unreachable" in message
    assert all(addr in message for addr in dead)


def test_ctl_given_only_dead_addresses_says_so_in_one_line(capsys):
    dead = [f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"]
    code = controller_cli.main(["ctl", "--insecure", "--api", ",".join(dead), "list"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 1
    line = next(x for x in err if x.startswith("terra-controller ctl:"))
    assert "unreachable" in line and all(addr in line for addr in dead)
