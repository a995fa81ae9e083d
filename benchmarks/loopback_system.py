"""Shared helpers of the controller benchmarks: a controller process, agents, fake agents.

- `ControllerProcess`: `python -m terra_controller.cli --no-openflow` on free
  loopback ports (reads the "ready" line for the addresses); `.stop()` ends it.
- `start_agents`: real `terra-agent` processes, one per (id, DC, host).
- `FakeAgent`: a thread speaking the real control protocol (overlay/protocol.py)
  that registers, acknowledges every message and, with `complete=True`, reports
  every flow it receives as complete at once (no bytes move): it lets the API
  and the scheduler be measured without data transfer.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

from overlay import protocol
from terra_agent.harness import free_port_block
from terra_agent.harness import stop_processes as stop_all  # noqa: F401 (re-export)
from terra_controller.agent_channel import read_control, send_parts


class ControllerProcess:
    """terra-controller --no-openflow as a subprocess.

    Args:
        topology: name or path. k: tunnels per DC pair. log: file for its stderr.

    Attributes:
        api, agents: "host:port"; rest: "http://host:port".
    """

    def __init__(self, topology: str, k: int = 4, log: Path | None = None) -> None:
        self.log = open(log or "/dev/null", "w")  # noqa: SIM115
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "terra_controller.cli", "--topology", topology,
             "--no-openflow", "--k", str(k), "--api", "127.0.0.1:0",
             "--agents", "127.0.0.1:0", "--rest", "127.0.0.1:0", "--log-level", "WARNING"],
            stdout=subprocess.PIPE, stderr=self.log, text=True,
        )  # fmt: skip
        line = self.proc.stdout.readline()
        if not line.startswith("terra-controller ready"):
            self.stop()
            raise RuntimeError(f"controller did not start: {line!r}")
        addrs = dict(part.split("=") for part in line.split()[2:])
        self.api, self.agents, self.rest = addrs["api"], addrs["agents"], "http://" + addrs["rest"]

    @property
    def api_addr(self) -> tuple[str, int]:
        """(host, port) of the coflow API."""
        host, port = self.api.split(":")
        return host, int(port)

    def get(self, path: str):
        """GET a REST path and decode its JSON."""
        with urllib.request.urlopen(self.rest + path, timeout=10) as reply:
            return json.loads(reply.read())

    def wait_agents(self, n: int, timeout: float = 30.0) -> None:
        """Wait until n agents are connected (RuntimeError after `timeout`)."""
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if sum(a["connected"] for a in self.get("/status")["agents"]) >= n:
                return
            time.sleep(0.1)
        raise RuntimeError(f"fewer than {n} agents registered")

    def stop(self) -> None:
        """Terminate the process (kill after 5 s)."""
        self.proc.terminate()
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()


def start_agents(ctl: ControllerProcess, agents: list[tuple[str, str, str]], workdir: Path,
                 tunnels: int = 8) -> list[subprocess.Popen]:  # fmt: skip
    """Start real terra-agent processes [(agent id, DC, host)]; returns the Popen objects."""
    procs = []
    for agent, dc, host in agents:
        port = free_port_block(host, tunnels + 2)
        log = open(workdir / f"{agent}.log", "w")  # noqa: SIM115
        procs.append(
            subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "terra_agent.cli",
                    "--controller",
                    ctl.agents,
                    "--dc",
                    dc,
                    "--id",
                    agent,
                    "--data-addr",
                    f"{host}:{port}",
                    "--spill-dir",
                    str(workdir),
                    "--log-level",
                    "WARNING",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
            )  # fmt: skip
        )
    return procs


class FakeAgent:
    """A control-channel peer in a thread (see module docstring).

    Args:
        addr: the controller's agent channel "host:port". agent, dc: identity.
        complete: report every flow of which it is the receiver as complete at once.
    """

    def __init__(self, addr: str, agent: str, dc: str, complete: bool = True) -> None:
        host, port = addr.split(":")
        self.agent, self.complete = agent, complete
        self.sock = socket.create_connection((host, int(port)))
        self.lock = threading.Lock()
        self.messages = 0
        self.send(protocol.register_message(dc, agent, f"127.0.0.1:{40000 + hash(agent) % 9999}"))
        self.thread = threading.Thread(target=self._loop, daemon=True)
        self.thread.start()
        threading.Thread(target=self._heartbeats, daemon=True).start()

    def _heartbeats(self) -> None:
        try:
            while True:
                time.sleep(2.0)
                self.send({"t": "heartbeat"})
        except OSError:
            return

    def send(self, header: dict) -> None:
        """Send one control message."""
        with self.lock:
            send_parts(self.sock, header)

    def _loop(self) -> None:
        try:
            while True:
                m = read_control(self.sock)
                if m is None:
                    return
                self.messages += 1
                if "id" in m:
                    self.send({"t": "ack", "id": m["id"]})
                if self.complete and m["t"] == "flows":
                    for f in m["flows"]:
                        if f["dst_agent"] == self.agent:
                            self.send(protocol.complete_message(f["coflow"], f["flow"], "0",
                                                                f["size"]))  # fmt: skip
        except OSError:
            return

    def close(self) -> None:
        """Close the connection."""
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()
