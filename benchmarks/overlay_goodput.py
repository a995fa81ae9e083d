"""Goodput of one agent pair over K tunnels on loopback, no rate limit (target: 1.25 GB/s),
against iperf3 moving the same bytes.

Two `terra-agent` subprocesses (sender on 127.0.0.2, receiver on 127.0.0.3) and the in-process
controller peer of benchmarks/harness.py. The sender moves synthetic flows to a digest-only sink;
each chunk carries leaf MACs the receiver checks (this host's default construction, GMAC with
AES-NI, terra_security/integrity.py), both ends compute the keyed flow digest. Goodput = flow
bytes / time from the rates message to the last "complete" report. CPU seconds per GB = user +
system CPU time of both agent processes over the same interval (psutil) / GB moved (1 GB = 1e9
bytes); also per agent, user and system apart.
--encrypt: the agents run with a fresh PKI and --encrypt-data (chunks travel as AES-GCM records,
overlay/sealed.py; the control channel to the in-test controller peer is TLS as well).

Busy = CPU seconds / wall seconds of each agent over that interval (1.0: one core all the
time); it separates "the agent waits for something" (busy well below the CPU it could get)
from "the agent gets too little CPU" on a shared machine. The agents and iperf3's client and
server each run in a session of their own (setsid), as services would: with Linux's scheduler
autogroups (kernel.sched_autogroup_enabled=1) the CPU is shared fairly between sessions, so
processes sharing this benchmark's session would split one session's share between them
(--shared-session does that). --agent-arg ARG (repeatable) adds a terra-agent option.

--pairs N (default 1; 0: no iperf3): N interleaved pairs of (iperf3 -P <tunnels> moving the same
bytes between the same two loopback addresses, one agent run); iperf3's CPU s/GB is the user +
system time of its client and server (os.wait4 rusage). Medians over the pairs are printed with
the ratio agent / iperf3, and the 1-minute load average before each run (the machine is shared).

    uv run python -m benchmarks.overlay_goodput [--gbytes 2] [--flows 4] [--tunnels 4]
        [--pairs 3] [--encrypt] [--shared-session] [--agent-arg ARG ...] [--json OUT]

Prints the figures; --json OUT writes {"goodput_gbytes_per_s": x, "cpu_s_per_gb": x, ...,
"pairs": [...], "median": {...}}.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import psutil
import trio

from benchmarks.harness import LoopbackHarness, free_port_block
from terra_core.cli_support import setup_logging
from terra_security.integrity import FlowKeys, default_algorithm, new_flow_key
from terra_security.pki import Role, init_ca, issue
from terra_wire.control import GroupRates

UNLIMITED = 1e12  # bytes/s: far above what loopback can do


def hashing_cost_s_per_gb(algorithm: str | None = None) -> float:
    """CPU seconds per GB of the leaf MACs of 4 MiB chunks (terra_security/integrity.py,
    `algorithm`, None: this host's default; 64 KiB leaves) on this machine (256 MiB): each
    end's one pass over every byte."""
    buf = os.urandom(4 << 20)
    keys = FlowKeys(new_flow_key(), algorithm)
    t = time.process_time()
    for _ in range(64):
        keys.leaf_macs(0, buf)
    return (time.process_time() - t) / (64 * len(buf) / 1e9)


def cpu_times(procs: dict[str, psutil.Process]) -> dict[str, tuple[float, float]]:
    """{name: (user, system) CPU seconds} of the given processes."""
    return {name: (p.cpu_times().user, p.cpu_times().system) for name, p in procs.items()}


def make_pki(workdir: Path) -> Path:
    """A fresh CA with the controller's and the two agents' certificates."""
    pki = workdir / "pki"
    init_ca(pki)
    for name in ("snd", "rcv"):
        issue(pki, Role.AGENT, name)
    return pki


async def run(
    gbytes: float,
    flows: int,
    tunnels: int,
    workdir: Path,
    encrypt=False,
    agent_args=(),
    own_sessions=True,
) -> dict:
    """Run one transfer (`agent_args`: extra terra-agent options; own_sessions: each agent in
    a session of its own, LoopbackHarness); returns the figures as a dict."""
    size = int(gbytes * 1e9 / flows)
    pki = None
    if encrypt:
        pki = workdir / "pki"
        if not pki.exists():
            make_pki(workdir)
    async with trio.open_nursery() as nursery:
        h = LoopbackHarness(
            nursery,
            workdir,
            pki=pki,
            encrypt_data=encrypt,
            agent_args=agent_args,
            own_sessions=own_sessions,
        )
        await h.start()
        await h.add_agent("snd", "HK", subprocess=True)
        await h.add_agent("rcv", "LA", subprocess=True)
        specs = (await h.install_tunnels([("snd", "rcv", tunnels)]))["snd"]
        procs = {a: psutil.Process(h.agents[a].process.pid) for a in ("snd", "rcv")}
        specs_f = [h.flow("bench", f"f{i}", "snd", "rcv", size) for i in range(flows)]
        await h.controller.add_flows(specs_f)  # returns once both ends opened the flows
        cpu0, t0 = cpu_times(procs), time.perf_counter()
        rates = GroupRates("bench", "LA", {s.tunnel: UNLIMITED for s in specs})
        await h.controller.set_rates("snd", [rates])
        await h.controller.wait_until(lambda: h.controller.all_complete([f.key for f in specs_f]))
        elapsed, cpu1 = time.perf_counter() - t0, cpu_times(procs)
        nursery.cancel_scope.cancel()
    total = size * flows
    gb = total / 1e9
    by_agent = {
        a: {
            "user": (cpu1[a][0] - cpu0[a][0]) / gb,
            "system": (cpu1[a][1] - cpu0[a][1]) / gb,
            "utilisation": (sum(cpu1[a]) - sum(cpu0[a])) / elapsed,  # CPU s / wall s
        }
        for a in procs
    }
    return {
        "goodput_gbytes_per_s": total / elapsed / 1e9,
        "cpu_s_per_gb": sum(v["user"] + v["system"] for v in by_agent.values()),
        "utilisation": {a: v["utilisation"] for a, v in by_agent.items()},
        "cpu_s_per_gb_by_agent": by_agent,
        "bytes": total,
        "seconds": elapsed,
        "flows": flows,
        "tunnels": tunnels,
        "encrypt": encrypt,
    }


def run_iperf3(nbytes: int, streams: int, own_sessions: bool = True) -> dict:
    """iperf3 -P `streams` moving `nbytes` from 127.0.0.2 to 127.0.0.3 (a one-off server;
    own_sessions: client and server each in a session of its own, like the agents); returns
    GB/s (received bytes / the client's wall time) and CPU s/GB of client + server."""
    port = free_port_block("127.0.0.3", 1)
    server = subprocess.Popen(
        ["iperf3", "-s", "-1", "-B", "127.0.0.3", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=own_sessions,
    )
    time.sleep(0.3)  # the server binds its port
    t0 = time.perf_counter()
    client = subprocess.Popen(
        ["iperf3", "-c", "127.0.0.3", "-B", "127.0.0.2", "-p", str(port)]
        + ["-P", str(streams), "-n", str(nbytes), "-J"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        start_new_session=own_sessions,
    )
    out = client.stdout.read()
    _, _, client_usage = os.wait4(client.pid, 0)
    elapsed = time.perf_counter() - t0
    _, _, server_usage = os.wait4(server.pid, 0)
    received = json.loads(out)["end"]["sum_received"]["bytes"]
    cpu = sum(u.ru_utime + u.ru_stime for u in (client_usage, server_usage))
    return {
        "goodput_gbytes_per_s": received / elapsed / 1e9,
        "cpu_s_per_gb": cpu / (received / 1e9),
        "bytes": received,
        "seconds": elapsed,
    }


def _agent_options(args) -> tuple:
    """run()'s (encrypt, agent_args, own_sessions) from the parsed arguments."""
    return args.encrypt, args.agent_arg, not args.shared_session


def _busy(agents: dict) -> str:
    """Each agent's CPU s per wall s of a run, e.g. "snd 0.52 rcv 0.41"."""
    return " ".join(f"{a} {u:.2f}" for a, u in agents["utilisation"].items())


def run_pairs(args, workdir: Path) -> dict:
    """args.pairs interleaved (iperf3, agents) runs; medians and ratios."""
    pairs = []
    for _ in range(args.pairs):
        load = os.getloadavg()[0]
        perf = run_iperf3(int(args.gbytes * 1e9), args.tunnels, not args.shared_session)
        agents = trio.run(
            run, args.gbytes, args.flows, args.tunnels, workdir, *_agent_options(args)
        )
        pairs.append({"load_avg_1min": load, "iperf3": perf, "agents": agents})
        print(
            f"load {load:.2f}: iperf3 {perf['goodput_gbytes_per_s']:.3f} GB/s "
            f"{perf['cpu_s_per_gb']:.3f} CPU s/GB | agents "
            f"{agents['goodput_gbytes_per_s']:.3f} GB/s {agents['cpu_s_per_gb']:.3f} CPU s/GB, "
            f"busy {_busy(agents)}",
            flush=True,
        )

    def median(who: str, key: str) -> float:
        return statistics.median(p[who][key] for p in pairs)

    med = {
        f"{who}_{key}": median(who, key)
        for who in ("iperf3", "agents")
        for key in ("goodput_gbytes_per_s", "cpu_s_per_gb")
    }
    med["cpu_ratio"] = med["agents_cpu_s_per_gb"] / med["iperf3_cpu_s_per_gb"]
    for a in pairs[0]["agents"]["utilisation"]:
        med[f"utilisation_{a}"] = statistics.median(p["agents"]["utilisation"][a] for p in pairs)
    med["load_avg_1min"] = statistics.median(p["load_avg_1min"] for p in pairs)
    return {"pairs": pairs, "median": med}


def main(argv: list[str] | None = None) -> int:
    """Parse arguments, run, print and optionally write JSON."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--gbytes", type=float, default=2.0, help="total bytes to move, in GB (1e9)")
    p.add_argument("--flows", type=int, default=4, help="flows in the FlowGroup")
    p.add_argument("--tunnels", type=int, default=4, help="tunnels (connections) a -> b")
    p.add_argument("--json", type=Path, help="write the figures as JSON to this file")
    p.add_argument("--pairs", type=int, default=1, help="interleaved iperf3/agent pairs (0: none)")
    p.add_argument("--encrypt", action="store_true", help="agents with --encrypt-data")
    p.add_argument(
        "--agent-arg",
        action="append",
        default=[],
        metavar="ARG",
        help="extra terra-agent option for both agents (repeat: --agent-arg=--tcp-congestion "
        "--agent-arg=cubic)",
    )
    p.add_argument(
        "--shared-session",
        action="store_true",
        help="run the agents and iperf3 in this process's session (one scheduler autogroup "
        "for all of them) instead of a session each",
    )
    args = p.parse_args(argv)
    setup_logging("WARNING")
    if args.pairs and shutil.which("iperf3") is None:
        p.error("iperf3 not found (apt-get install -y iperf3, or --pairs 0)")
    # TERRA_SCRATCH: where the run's temporary directory goes (default: the system's)
    with tempfile.TemporaryDirectory(dir=os.environ.get("TERRA_SCRATCH")) as tmp:
        if args.pairs:
            paired = run_pairs(args, Path(tmp))
            figures = paired["pairs"][-1]["agents"] | paired
        else:
            figures = trio.run(
                run, args.gbytes, args.flows, args.tunnels, Path(tmp), *_agent_options(args)
            )
    cost = hashing_cost_s_per_gb()
    floor = 2 * cost  # both ends make one pass of leaf MACs over every byte: CPU floor per GB
    figures["hash_floor_cpu_s_per_gb"] = floor
    figures["cores"] = os.cpu_count()
    figures["load_avg_1min"] = os.getloadavg()[0]
    print(
        f"goodput {figures['goodput_gbytes_per_s']:.3f} GB/s "
        f"({figures['goodput_gbytes_per_s'] * 8:.2f} Gbit/s), "
        f"{figures['cpu_s_per_gb']:.2f} CPU s/GB, {figures['bytes'] / 1e9:.2f} GB in "
        f"{figures['seconds']:.2f} s over {args.tunnels} tunnels ({args.flows} flows)"
    )
    print(
        "CPU s/GB by agent: "
        + ", ".join(
            f"{a} {v['user']:.2f} user + {v['system']:.2f} system"
            for a, v in figures["cpu_s_per_gb_by_agent"].items()
        )
        + f"; busy (CPU s / wall s) {_busy(figures)}"
    )
    print(
        f"leaf MACs alone: {floor:.2f} CPU s/GB ({default_algorithm()}, {cost:.2f} per end) -> "
        f"at most "
        f"{os.cpu_count() / floor:.2f} GB/s on {os.cpu_count()} cores; "
        f"1-min load average after the run {figures['load_avg_1min']:.1f}"
    )
    if args.pairs:
        m = figures["median"]
        print(
            f"median of {args.pairs} pairs (load {m['load_avg_1min']:.2f}): iperf3 "
            f"{m['iperf3_goodput_gbytes_per_s']:.3f} GB/s {m['iperf3_cpu_s_per_gb']:.3f} CPU s/GB; "
            f"agents{' (encrypted)' if args.encrypt else ''} "
            f"{m['agents_goodput_gbytes_per_s']:.3f} GB/s {m['agents_cpu_s_per_gb']:.3f} CPU s/GB "
            f"= {m['cpu_ratio']:.2f}x iperf3's CPU per GB"
        )
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
