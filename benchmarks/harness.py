"""Loopback harness: agents on 127.0.0.x addresses, an in-test controller peer, K tunnels per pair.

ControllerPeer is a small trio server speaking the real control protocol
(terra_wire/control.py): it accepts registrations, keeps the tunnel table, flow descriptors and
rates
it was given, re-sends them (with acknowledged offsets) whenever an agent (re-)registers, and
records progress, completions and errors. LoopbackHarness starts agents in this process (Agent.run
under its own cancel scope, so a test can stop and restart one) or as `terra-agent` subprocesses
(so a benchmark uses more than one core), and builds tunnel tables where tunnel i from A to B is
B's port base + 1 + i (on loopback, distinct ports are the distinct tunnels).
"""

from __future__ import annotations

import functools
import logging
import math
import resource
import ssl
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import trio

from mininet_scenarios.etcd_cluster import etcd_healthy, start_etcd  # noqa: F401 (re-exported)
from mininet_scenarios.ports import free_port, free_port_block  # noqa: F401 (re-exported)
from overlay.framing import FrameReader, FrameWriter
from terra_agent.agent import Agent, AgentConfig
from terra_security.data_keys import DataKeys
from terra_security.pki import (
    client_context,
    data_client_context,
    data_server_context,
    server_context,
)
from terra_wire.control import (
    FlowSpec,
    GroupRates,
    ProtocolError,
    TunnelSpec,
    flows_message,
    rates_message,
    tunnels_message,
    validate_control,
)
from terra_wire.frames import FrameError

log = logging.getLogger(__name__)

FLOWS_PER_MESSAGE = 200  # flow descriptors per "flows" message (keeps headers < 64 KiB)


class ControllerPeer:
    """In-test controller: ControllerPeer(host="127.0.0.1", tls=None); tls: a server
    ssl.SSLContext (terra_security.pki.server_context) to speak mutual TLS like the real
    controller, None: plain TCP.

    `await nursery.start(peer.serve)` returns the port it listens on. State it keeps and serves:
    tunnels {agent: ([TunnelSpec], [listen port])}, flows {(coflow, flow): FlowSpec},
    rates {agent: {(coflow, dst_dc): GroupRates}}. What it records: acked {(coflow, flow): bytes
    acknowledged, latest report}, completed {(coflow, flow): digest}, errors [error messages,
    and "failed" reports with "message" = their reason], failed [the "failed" reports],
    registrations {agent: count}, register_msgs {agent: last register header}, synced {agent:
    trio.Event set once the agent acknowledged the state re-sent at its last registration}.
    data_keys: a terra_security.data_keys.DataKeys: every "tunnels" message then carries the
    agent's pair keys with every other agent that registered (as the controller's does);
    None (default): no keys.
    """

    def __init__(
        self,
        host: str = "127.0.0.1",
        tls: ssl.SSLContext | None = None,
        data_keys: DataKeys | None = None,
    ) -> None:
        self.host = host
        self.tls = tls
        self.data_keys = data_keys
        self.port: int | None = None
        self.tunnels: dict[str, tuple[list[TunnelSpec], list[int]]] = {}
        self.flows: dict[tuple[str, str], FlowSpec] = {}
        self.rates: dict[str, dict[tuple[str, str], GroupRates]] = {}
        self.acked: dict[tuple[str, str], int] = {}
        self.completed: dict[tuple[str, str], str] = {}
        self.errors: list[dict] = []
        self.failed: list[dict] = []
        self.registrations: dict[str, int] = {}
        self.register_msgs: dict[str, dict] = {}
        self.synced: dict[str, trio.Event] = {}
        self._writers: dict[str, FrameWriter] = {}
        self._acks: dict[int, trio.Event] = {}
        self._next_id = 1
        self._changed = trio.Event()

    async def serve(self, task_status=trio.TASK_STATUS_IGNORED) -> None:
        """Listen on an ephemeral port of `host`; task_status.started(port)."""
        listeners = await trio.open_tcp_listeners(0, host=self.host)
        self.port = listeners[0].socket.getsockname()[1]
        task_status.started(self.port)
        await trio.serve_listeners(self._session, listeners)

    def _notify(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    async def wait_until(self, predicate) -> None:
        """Wait until predicate() is true (re-checked on every message received)."""
        while not predicate():
            await self._changed.wait()

    async def _session(self, stream: trio.abc.Stream) -> None:
        agent = None
        try:
            if self.tls is not None:
                stream = trio.SSLStream(stream, self.tls, server_side=True)
                with trio.fail_after(10):
                    await stream.do_handshake()
            async with stream:
                reader = FrameReader(stream, max_payload=0)
                writer = FrameWriter(stream)
                frame = await reader.read()
                if frame is None:
                    return
                reg = validate_control(frame[0])
                if reg["t"] != "register":
                    raise ProtocolError(f"first message must be 'register', got {reg['t']!r}")
                agent = reg["agent"]
                self._writers[agent] = writer
                self.register_msgs[agent] = reg
                self.registrations[agent] = self.registrations.get(agent, 0) + 1
                await writer.send({"t": "registered", "agent": agent})
                await self._resend_state(agent, writer)
                self._notify()
                while True:
                    frame = await reader.read()
                    if frame is None:
                        return
                    self._record(agent, validate_control(frame[0]))
        except (
            FrameError,
            ProtocolError,
            trio.BrokenResourceError,
            trio.ClosedResourceError,
            trio.TooSlowError,
            OSError,
        ) as exc:
            log.warning("controller peer: session with %s ended: %s", agent, exc)
        finally:
            if agent is not None and self._writers.get(agent) is writer:
                del self._writers[agent]
            self._notify()

    async def _resend_state(self, agent: str, writer: FrameWriter) -> None:
        """Send the agent its tunnels, unfinished flows (offset = acked) and rates.

        synced[agent] is set once the agent acknowledged the last of them.
        """
        msgs = []
        if agent in self.tunnels:
            specs, listen = self.tunnels[agent]
            msgs.append(tunnels_message(specs, listen, keys=self.keys_for(agent)))
        mine = [self._resume(spec) for spec in self.flows.values() if agent in spec_agents(spec)]
        mine = [spec for spec in mine if spec.key not in self.completed]
        for i in range(0, len(mine), FLOWS_PER_MESSAGE):
            msgs.append(flows_message(mine[i : i + FLOWS_PER_MESSAGE]))
        if self.rates.get(agent):
            msgs.append(rates_message(list(self.rates[agent].values())))
        synced = trio.Event()
        self.synced[agent] = synced
        if not msgs:
            synced.set()
        for msg in msgs:
            msg["id"] = self._next_id
            self._next_id += 1
        if msgs:
            self._acks[msgs[-1]["id"]] = synced
        for msg in msgs:
            await writer.send(msg)

    def _resume(self, spec: FlowSpec) -> FlowSpec:
        acked = self.acked.get(spec.key, spec.offset)
        return FlowSpec(**{**spec.to_dict(), "offset": acked})

    def _record(self, agent: str, msg: dict) -> None:
        kind = msg["t"]
        if kind == "progress":
            for row in msg["flows"]:
                self.acked[(row["coflow"], row["flow"])] = row["acked"]
        elif kind == "complete":
            self.completed[(msg["coflow"], msg["flow"])] = msg["digest"]
        elif kind == "error":
            self.errors.append({**msg, "agent": agent})
            log.info("controller peer: error from %s: %s", agent, msg["message"])
        elif kind == "failed":
            self.failed.append({**msg, "agent": agent})
            self.errors.append({**msg, "agent": agent, "message": msg["reason"]})
            log.info("controller peer: %s reports %s/%s failed", agent, msg["coflow"], msg["flow"])
        elif kind == "ack":
            event = self._acks.pop(msg["id"], None)
            if event is not None:
                event.set()
        self._notify()

    async def send(self, agent: str, msg: dict, wait: bool = True) -> None:
        """Send a message to a connected agent; with wait, until the agent acknowledged it.

        Raises:
            KeyError: the agent is not connected.
        """
        msg = dict(msg)
        msg_id = self._next_id
        self._next_id += 1
        msg["id"] = msg_id
        event = trio.Event()
        self._acks[msg_id] = event
        await self._writers[agent].send(msg)
        if wait:
            await event.wait()

    def drop(self, agent: str) -> None:
        """Abort `agent`'s control connection (as a controller crash would); it will re-register."""
        writer = self._writers.get(agent)
        if writer is not None:
            writer.stream.socket.close()

    def connected(self, agent: str) -> bool:
        """True while `agent` has a registered control session."""
        return agent in self._writers

    async def set_tunnels(self, agent: str, specs: list[TunnelSpec], listen: list[int]) -> None:
        """Store and (if connected) send `agent`'s tunnel table; waits for its ack."""
        self.tunnels[agent] = (list(specs), list(listen))
        if self.connected(agent):
            await self.send(agent, tunnels_message(specs, listen, keys=self.keys_for(agent)))

    def keys_for(self, agent: str) -> dict[str, str] | None:
        """The "keys" of `agent`'s "tunnels" message (None without data_keys)."""
        if self.data_keys is None:
            return None
        return self.data_keys.keys_for(agent, list(self.registrations))

    async def add_flows(self, specs: list[FlowSpec]) -> None:
        """Store flow descriptors and send them: to receivers first, then to senders."""
        for spec in specs:
            self.flows[spec.key] = spec
        for role in ("dst_agent", "src_agent"):
            by_agent: dict[str, list[FlowSpec]] = {}
            for spec in specs:
                by_agent.setdefault(getattr(spec, role), []).append(spec)
            for agent, mine in by_agent.items():
                for i in range(0, len(mine), FLOWS_PER_MESSAGE):
                    if self.connected(agent):
                        await self.send(agent, flows_message(mine[i : i + FLOWS_PER_MESSAGE]))

    async def set_rates(self, agent: str, groups: list[GroupRates]) -> None:
        """Store and send per-FlowGroup per-path rates of sending `agent`; waits for its ack."""
        table = self.rates.setdefault(agent, {})
        for group in groups:
            table[group.key] = group
        if self.connected(agent):
            await self.send(agent, rates_message(groups))

    def all_complete(self, keys) -> bool:
        """True when every (coflow, flow) in keys has been reported complete."""
        return all(key in self.completed for key in keys)


async def delay_proxy(
    listen_host: str,
    target: tuple[str, int],
    delay_s: float,
    task_status=trio.TASK_STATUS_IGNORED,
) -> None:
    """A TCP proxy that delivers every byte `delay_s` seconds late, in both directions.

    Listens on an ephemeral port of listen_host (task_status.started(port)); each accepted
    connection is joined to a new connection to target (host, port). Models a long WAN path on
    loopback, so chunks striped over it and a direct path arrive out of order. Runs until
    cancelled; a connection ends when either side closes.
    """
    listeners = await trio.open_tcp_listeners(0, host=listen_host)
    task_status.started(listeners[0].socket.getsockname()[1])

    errors = (trio.BrokenResourceError, trio.ClosedResourceError, OSError)

    async def pump(src, dst, connection: trio.CancelScope) -> None:
        """Copy src -> dst, each piece delay_s late; a failure ends the whole connection."""
        send, recv = trio.open_memory_channel(math.inf)

        async def deliver():
            async for due, data in recv:
                await trio.sleep_until(due)
                await dst.send_all(data)
            await dst.send_eof()

        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(deliver)
                async with send:
                    while data := await src.receive_some(1 << 16):
                        send.send_nowait((trio.current_time() + delay_s, data))
        except BaseExceptionGroup as group:
            if group.split(errors)[1] is not None:
                raise
            connection.cancel()
        except errors:
            connection.cancel()

    async def handle(client: trio.SocketStream) -> None:
        try:
            upstream = await trio.open_tcp_stream(*target)
        except OSError as exc:
            log.info("delay proxy: cannot reach %s: %s", target, exc)
            await client.aclose()
            return
        async with client, upstream, trio.open_nursery() as nursery:
            nursery.start_soon(pump, client, upstream, nursery.cancel_scope)
            nursery.start_soon(pump, upstream, client, nursery.cancel_scope)

    await trio.serve_listeners(handle, listeners)


def spec_agents(spec: FlowSpec) -> tuple[str, str]:
    """(src_agent, dst_agent) of a flow descriptor."""
    return (spec.src_agent, spec.dst_agent)


@dataclass
class AgentHandle:
    """A harness agent: id, dc, host, base port (data port), tunnel ports base+1.., and either
    the in-process Agent (agent, scope) or the subprocess (process)."""

    agent_id: str
    dc: str
    host: str
    base_port: int
    max_tunnels: int
    agent: Agent | None = None
    scope: trio.CancelScope | None = None
    process: trio.Process | None = None
    stopped: trio.Event = field(default_factory=trio.Event)

    @property
    def data_addr(self) -> str:
        """ "host:port" of the data port."""
        return f"{self.host}:{self.base_port}"

    def tunnel_port(self, index: int) -> int:
        """Destination port of tunnel number `index` (0-based) towards this agent."""
        return self.base_port + 1 + index


class LoopbackHarness:
    """Agents and a controller peer on loopback, all owned by `nursery`.

    LoopbackHarness(nursery, workdir: Path, memory_limit=64 MiB, data_root="."):
    data_root is the agents' data root (AgentConfig.data_root, terra-agent --data-root), a
    directory relative to workdir (default ".": workdir itself) or absolute, created if missing,
    shared by all agents (they share one host); None: agents without one (file flows refused).
    self.data_root is the resolved Path (or None). pki: a PKI directory (terra_security.pki)
    holding a certificate per agent id (and the controller's): agents then authenticate their
    data connections (AgentConfig.data_tls_server / data_tls_client) and the control channel to
    the in-test controller peer is mutual TLS too (subprocess agents run with --pki);
    None (default): plain TCP everywhere. encrypt_data: data connections stay inside TLS
    (AgentConfig.encrypt_data, terra-agent --encrypt-data; needs pki). Call `await start()`
    first. Agent i normally gets host 127.0.0.(i+2). rate_limiter: every agent's
    AgentConfig.rate_limiter (terra-agent --rate-limiter): "bucket" (default) or "pacing".
    agent_nofile: the open-file limit (RLIMIT_NOFILE) subprocess agents run under (their
    connection caps follow from it); None (default): this process's. agent_args: extra
    terra-agent options given to every subprocess agent (e.g. ["--tcp-congestion", "cubic"]).
    own_sessions: each subprocess agent starts in a session of its own (setsid), as a service
    would run, so with Linux's scheduler autogroups (kernel.sched_autogroup_enabled) it gets
    its own share of the CPU instead of sharing this process's; False (default): this
    process's session (Ctrl-C reaches the agents too).
    """

    def __init__(
        self,
        nursery: trio.Nursery,
        workdir: Path,
        memory_limit: int = 64 << 20,
        data_root: str | Path | None = ".",
        pki: str | Path | None = None,
        encrypt_data: bool = False,
        rate_limiter: str = "bucket",
        agent_nofile: int | None = None,
        agent_args: list[str] | tuple[str, ...] = (),
        own_sessions: bool = False,
    ) -> None:
        if encrypt_data and pki is None:
            raise ValueError("encrypt_data needs a pki")
        self.nursery = nursery
        self.rate_limiter = rate_limiter
        self.agent_nofile = agent_nofile
        self.agent_args = list(agent_args)
        self.own_sessions = own_sessions
        self.pki = pki
        self.encrypt_data = encrypt_data
        self.workdir = Path(workdir)
        self.memory_limit = memory_limit
        self.data_root: Path | None = None
        if data_root is not None:
            self.data_root = (self.workdir / data_root).resolve()
            self.data_root.mkdir(parents=True, exist_ok=True)
        self.controller = ControllerPeer(tls=server_context(pki) if pki is not None else None)
        self.agents: dict[str, AgentHandle] = {}

    async def start(self) -> None:
        """Start the controller peer."""
        await self.nursery.start(self.controller.serve)

    async def add_agent(
        self,
        agent_id: str,
        dc: str,
        host: str | None = None,
        max_tunnels: int = 8,
        subprocess: bool = False,
    ) -> AgentHandle:
        """Create and start an agent; waits until it registered with the controller peer."""
        host = host or f"127.0.0.{len(self.agents) + 2}"
        base = free_port_block(host, max_tunnels + 1)
        handle = AgentHandle(agent_id, dc, host, base, max_tunnels)
        self.agents[agent_id] = handle
        await self.start_agent(agent_id, subprocess=subprocess)
        return handle

    def _config(self, handle: AgentHandle) -> AgentConfig:
        spill = self.workdir / f"spill-{handle.agent_id}"
        spill.mkdir(parents=True, exist_ok=True)
        return AgentConfig(
            controller=(self.controller.host, self.controller.port),
            dc=handle.dc,
            agent_id=handle.agent_id,
            data_addr=(handle.host, handle.base_port),
            spill_dir=str(spill),
            memory_limit=self.memory_limit,
            data_root=str(self.data_root) if self.data_root is not None else None,
            data_tls_server=data_server_context(self.pki, handle.agent_id) if self.pki else None,
            data_tls_client=data_client_context(self.pki, handle.agent_id) if self.pki else None,
            tls=client_context(self.pki, handle.agent_id) if self.pki else None,
            encrypt_data=self.encrypt_data,
            rate_limiter=self.rate_limiter,
        )

    async def start_agent(self, agent_id: str, subprocess: bool = False) -> None:
        """(Re)start agent `agent_id`; wait until it registered and applied the re-sent state."""
        handle = self.agents[agent_id]
        before = self.controller.registrations.get(agent_id, 0)
        handle.stopped = trio.Event()
        if subprocess:
            handle.process = await self.nursery.start(self._run_process, handle)
        else:
            handle.agent = Agent(self._config(handle))
            handle.scope = await self.nursery.start(self._run_inprocess, handle)
        await self.controller.wait_until(
            lambda: (
                self.controller.registrations.get(agent_id, 0) > before
                and self.controller.connected(agent_id)
            )
        )
        await self.controller.synced[agent_id].wait()

    async def _run_inprocess(self, handle: AgentHandle, task_status=trio.TASK_STATUS_IGNORED):
        try:
            with trio.CancelScope() as scope:
                task_status.started(scope)
                await handle.agent.run()
        finally:
            handle.stopped.set()

    async def _run_process(self, handle: AgentHandle, task_status=trio.TASK_STATUS_IGNORED):
        cfg = self._config(handle)
        cmd = [
            sys.executable,
            "-m",
            "terra_agent.cli",
            "--controller",
            f"{cfg.controller[0]}:{cfg.controller[1]}",
            "--dc",
            cfg.dc,
            "--id",
            cfg.agent_id,
            "--data-addr",
            handle.data_addr,
            "--spill-dir",
            cfg.spill_dir,
            "--memory-limit",
            str(cfg.memory_limit),
        ]
        cmd += ["--rate-limiter", cfg.rate_limiter]
        if self.pki is None:
            cmd.append("--insecure")  # ControllerPeer speaks plain TCP
        else:
            cmd += ["--pki", str(self.pki)]
        if self.encrypt_data:
            cmd.append("--encrypt-data")
        if cfg.data_root is not None:
            cmd += ["--data-root", cfg.data_root]
        cmd += self.agent_args
        options = {"start_new_session": self.own_sessions}
        if self.agent_nofile is not None:
            options["preexec_fn"] = functools.partial(_limit_files, self.agent_nofile)
        try:
            await trio.run_process(cmd, task_status=task_status, check=False, **options)
        finally:
            handle.stopped.set()

    async def stop_agent(self, agent_id: str) -> None:
        """Stop an agent (cancel it, or kill its process) and wait until it is gone."""
        handle = self.agents[agent_id]
        if handle.scope is not None:
            handle.scope.cancel()
        if handle.process is not None:
            handle.process.kill()
        await handle.stopped.wait()
        await self.controller.wait_until(lambda: not self.controller.connected(agent_id))

    def tunnel_specs(self, src: str, dst: str, k: int) -> list[TunnelSpec]:
        """K tunnels from agent `src` to `dst`: ids "<src dc>-<dst dc>-<i>", port dst base+1+i.

        Paths are nominal ([src dc, dst dc] plus the index as a via-name); on loopback only the
        distinct destination ports matter.
        """
        s, d = self.agents[src], self.agents[dst]
        if k > d.max_tunnels:
            raise ValueError(f"{dst} has room for {d.max_tunnels} tunnels, asked for {k}")
        return [
            TunnelSpec(
                tunnel=f"{s.dc}-{d.dc}-{i}",
                peer_agent=dst,
                peer_addr=d.data_addr,
                path=(s.dc, f"via{i}", d.dc) if i else (s.dc, d.dc),
                port=d.tunnel_port(i),
            )
            for i in range(k)
        ]

    async def install_tunnels(
        self, pairs: list[tuple[str, str, int]]
    ) -> dict[str, list[TunnelSpec]]:
        """Install tunnel tables for (src, dst, k) pairs; returns {src: [TunnelSpec]}.

        Receivers get their listen ports first, so senders find them open.
        """
        out: dict[str, list[TunnelSpec]] = {a: [] for a in self.agents}
        listen: dict[str, set[int]] = {a: set() for a in self.agents}
        for src, dst, k in pairs:
            specs = self.tunnel_specs(src, dst, k)
            out[src] += specs
            listen[dst] |= {s.port for s in specs}
        order = sorted(self.agents, key=lambda a: not listen[a])
        for agent in order:
            await self.controller.set_tunnels(agent, out[agent], sorted(listen[agent]))
        return out

    def flow(self, coflow: str, flow: str, src: str, dst: str, size: int, **kw) -> FlowSpec:
        """A FlowSpec between two harness agents (dst_dc filled in); kw: source, sink, offset."""
        return FlowSpec(coflow, flow, src, dst, self.agents[dst].dc, size, **kw)


def _limit_files(nofile: int) -> None:
    """Set this (child) process's open-file limit, soft and hard, to `nofile`."""
    resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))


def stop_processes(procs: list[subprocess.Popen], timeout_s: float = 5.0) -> None:
    """Terminate the given processes, then kill those still running after `timeout_s` seconds;
    close the pipes this process holds to them."""
    for p in procs:
        p.terminate()
    for p in procs:
        try:
            p.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
        for pipe in (p.stdin, p.stdout, p.stderr):
            if pipe is not None:
                pipe.close()
