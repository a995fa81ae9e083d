"""Shared helpers of the controller benchmarks: a controller process, agents, fake agents.

- `ControllerProcess`: `python -m terra_controller.cli --no-openflow` on free
  loopback ports (reads the "ready" line for the addresses); `.stop()` ends it.
  With TLS (the default) it makes a fresh PKI in a temporary directory and every
  helper here (client, REST, agents, fake agents) uses certificates from it.
- `start_agents`: real `terra-agent` processes, one per (id, DC, host).
- `FakeAgent`: a thread speaking the real control protocol (terra_wire/control.py)
  that registers, acknowledges every message and, with `complete=True`, reports
  every flow it receives as complete at once (no bytes move): it lets the API
  and the scheduler be measured without data transfer.
"""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

from benchmarks.harness import free_port_block
from benchmarks.harness import stop_processes as stop_all
from benchmarks.shared_socket import SharedSocket
from terra_controller.agent_connection import ChannelError, read_control, send_parts
from terra_controller.client import TerraClient
from terra_controller.transport import connect_tls
from terra_security.pki import Role, client_context, init_ca, issue
from terra_wire import control as protocol

OPERATOR = "bench-operator"


class ControllerProcess:
    """terra-controller --no-openflow as a subprocess.

    Args:
        topology: name or path. k: tunnels per DC pair. log: file for its stderr.
        tls: mutual TLS with a fresh PKI (False: --insecure).
        extra: more terra-controller arguments (e.g. ["--keep-finished", "100000"]).

    Attributes:
        api, agents: "host:port"; rest: "https://host:port" (http without TLS);
        pki: the PKI directory (None without TLS).
    """

    def __init__(
        self,
        topology: str,
        k: int = 4,
        log: Path | None = None,
        tls: bool = True,
        extra: list[str] | None = None,
    ) -> None:
        self.log = open(log or "/dev/null", "w")  # noqa: SIM115
        self.pki = Path(tempfile.mkdtemp(prefix="terra-bench-pki-")) if tls else None
        if tls:
            init_ca(self.pki)
            issue(self.pki, Role.OPERATOR, OPERATOR)
        auth = ["--pki", str(self.pki)] if tls else ["--insecure"]
        self.state = Path(tempfile.mkdtemp(prefix="terra-bench-state-"))  # its coflow journal
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "terra_controller.cli", "--topology", topology,
             "--no-openflow", "--k", str(k), "--api", "127.0.0.1:0",
             "--agents", "127.0.0.1:0", "--rest", "127.0.0.1:0", "--log-level", "WARNING",
             "--state-dir", str(self.state), *auth, *(extra or [])],
            stdout=subprocess.PIPE, stderr=self.log, text=True,
        )  # fmt: skip
        line = self.proc.stdout.readline()
        if line.startswith("terra-controller standby"):  # --etcd: it leads once elected
            line = self.proc.stdout.readline()
        if not line.startswith("terra-controller ready"):
            self.stop()
            raise RuntimeError(f"controller did not start: {line!r}")
        addrs = dict(part.split("=") for part in line.split()[2:])
        scheme = "https://" if tls else "http://"
        self.api, self.agents, self.rest = addrs["api"], addrs["agents"], scheme + addrs["rest"]
        self.rest_tls = None
        if tls:
            self.rest_tls = client_context(self.pki, OPERATOR)
            self.rest_tls.check_hostname = False  # dials 127.0.0.1; the CA is still verified

    def identity(self, role: Role, name: str) -> str:
        """Issue a certificate for `name` if missing (no-op without TLS); returns the name."""
        if self.pki is not None and not (self.pki / f"{name}.crt").exists():
            issue(self.pki, role, name)
        return name

    def client(self, timeout: float = 30.0, name: str = OPERATOR) -> TerraClient:
        """A TerraClient (operator certificate by default; insecure without TLS)."""
        if self.pki is None:
            return TerraClient(*self.api_addr, insecure=True, timeout=timeout)
        return TerraClient(*self.api_addr, pki=self.pki, name=name, timeout=timeout)

    def agent_args(self, agent: str) -> list[str]:
        """The authentication arguments of terra-agent `agent` (issuing its certificate)."""
        if self.pki is None:
            return ["--insecure"]
        self.identity(Role.AGENT, agent)
        return ["--pki", str(self.pki)]

    @property
    def api_addr(self) -> tuple[str, int]:
        """(host, port) of the coflow API."""
        host, port = self.api.split(":")
        return host, int(port)

    def get(self, path: str):
        """GET a REST path and decode its JSON."""
        with urllib.request.urlopen(self.rest + path, timeout=10, context=self.rest_tls) as reply:
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
        stop_all([self.proc])
        self.log.close()
        shutil.rmtree(self.state, ignore_errors=True)
        if self.pki is not None:
            shutil.rmtree(self.pki, ignore_errors=True)


def start_agents(ctl: ControllerProcess, agents: list[tuple[str, str, str]], workdir: Path,
                 tunnels: int = 8, extra: dict[str, list[str]] | None = None
                 ) -> list[subprocess.Popen]:  # fmt: skip
    """Start real terra-agent processes [(agent id, DC, host)]; returns the Popen objects.
    `extra`: {agent id: more terra-agent arguments}."""
    procs = []
    for agent, dc, host in agents:
        port = free_port_block(host, tunnels + 2)
        with open(workdir / f"{agent}.log", "w") as log:  # the child keeps its own copy
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
                        *ctl.agent_args(agent),
                        *(extra or {}).get(agent, []),
                    ],
                    stdout=log,
                    stderr=subprocess.STDOUT,
                )  # fmt: skip
            )
    return procs


class FakeAgent:
    """A control-channel peer in a thread (see module docstring).

    Args:
        ctl: the ControllerProcess (its agent channel address and PKI). agent, dc: identity.
        complete: report every flow of which it is the receiver as complete at once.
    """

    def __init__(self, ctl: ControllerProcess, agent: str, dc: str, complete: bool = True):
        host, port = ctl.agents.split(":")
        self.agent, self.complete = agent, complete
        context = None
        if ctl.pki is not None:
            context = client_context(ctl.pki, ctl.identity(Role.AGENT, agent))
        self.sock = SharedSocket(connect_tls(host, int(port), context, 10.0))
        self.sock.settimeout(None)
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
                            tag = protocol.report_tag(f["digest_key"])
                            self.send(protocol.complete_message(f["coflow"], f["flow"], "0",
                                                                f["size"], tag))  # fmt: skip
        except (OSError, ChannelError):  # closed (close()) or the controller went away
            return

    def close(self) -> None:
        """Close the connection."""
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()
