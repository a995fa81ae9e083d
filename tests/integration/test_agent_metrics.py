"""`terra-agent --metrics HOST:PORT`: real agents on loopback (controller with TLS), one
coflow, then each agent's /metrics shows what it sent and received."""

from __future__ import annotations

import re
import urllib.request

import pytest

from benchmarks.harness import free_port, stop_processes
from benchmarks.loopback_system import ControllerProcess, start_agents

AGENTS = [("hk1", "HK", "127.0.0.41"), ("ba1", "BA", "127.0.0.42")]


def scrape(addr: str) -> str:
    with urllib.request.urlopen(f"http://{addr}/metrics", timeout=5) as reply:
        return reply.read().decode()


def value(text: str, name: str, **labels) -> float:
    """Sum of the samples of `name` whose labels include `labels`."""
    total, found = 0.0, False
    for line in text.splitlines():
        m = re.match(rf"^{name}(?:\{{(.*)\}})? (\S+)$", line)
        if not m:
            continue
        have = dict(re.findall(r'(\w+)="([^"]*)"', m.group(1) or ""))
        if all(have.get(k) == v for k, v in labels.items()):
            total += float(m.group(2))
            found = True
    assert found, f"no {name} {labels} in the scrape"
    return total


@pytest.fixture
def system(tmp_path):
    ctl = ControllerProcess("swan", k=2, log=tmp_path / "controller.log")
    metrics = {agent: f"{host}:{free_port(host)}" for agent, _, host in AGENTS}
    procs = start_agents(ctl, AGENTS, tmp_path, tunnels=2,
                         extra={a: ["--metrics", addr] for a, addr in metrics.items()})  # fmt: skip
    try:
        ctl.wait_agents(len(AGENTS))
        yield ctl, metrics
    finally:
        stop_processes(procs)
        ctl.stop()


def test_agent_metrics_count_the_bytes_of_a_transfer(system):
    ctl, metrics = system
    before = scrape(metrics["ba1"])
    assert value(before, "terra_agent_received_bytes_total") == 0
    assert value(before, "terra_agent_control_connects_total") == 1
    size = 6_000_000
    with ctl.client() as client:
        cid = client.submit_coflow([{"id": "f", "src": "hk1", "dst": "ba1", "bytes": size}])
        assert client.wait(cid, timeout=60)["state"] == "done"
    sender, receiver = scrape(metrics["hk1"]), scrape(metrics["ba1"])
    # Every payload byte was sent on some tunnel connection to ba1 and received there
    # (resends would only add to both).
    assert value(sender, "terra_agent_link_sent_bytes_total", peer="ba1") >= size
    assert value(receiver, "terra_agent_received_bytes_total") >= size
    assert value(sender, "terra_agent_link_up", peer="ba1") >= 1
    assert value(sender, "terra_agent_flows", direction="out", state="done") == 1
    assert value(receiver, "terra_agent_flows", direction="in", state="done") == 1
    assert value(receiver, "terra_agent_rejected_chunks_total", reason="mac") == 0
    # the receiver's data port holds hk1's authenticated tunnel connections; none refused
    assert value(receiver, "terra_agent_connections_open", server="data port") >= 1
    assert value(receiver, "terra_agent_connections_refused_total", server="data port") == 0
    assert value(receiver, "terra_agent_connections_evicted_total", server="metrics port") == 0
