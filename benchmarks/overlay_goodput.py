"""Goodput of one agent pair over K tunnels on loopback, no rate limit (issue 3 target: 1.25 GB/s).

Two `terra-agent` subprocesses (sender on 127.0.0.2, receiver on 127.0.0.3) and the in-process
controller peer of terra_agent/harness.py. The sender moves synthetic flows to a digest-only sink;
the receiver reorders, hashes (BLAKE2b) and checks each flow's digest. Goodput = flow bytes / time
from the rates message to the last "complete" report. CPU seconds per GB = user + system CPU time
of both agent processes over the same interval (psutil) / GB moved (1 GB = 1e9 bytes); also
per agent, user and system apart.

    uv run python benchmarks/overlay_goodput.py [--gbytes 2] [--flows 4] [--tunnels 4] [--json OUT]

Prints the figures; --json OUT writes {"goodput_gbytes_per_s": x, "cpu_s_per_gb": x, ...}.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import tempfile
import time
from pathlib import Path

import psutil
import trio

from overlay.framing import crc32
from overlay.protocol import GroupRates
from terra_agent.harness import LoopbackHarness
from terra_core.cli_support import setup_logging

UNLIMITED = 1e12  # bytes/s: far above what loopback can do


def hashing_cost_s_per_gb() -> dict:
    """CPU seconds per GB of BLAKE2b and of the frame checksum (overlay.framing's crc32, ISA-L
    when installed) on this machine (one 1 MiB buffer, 256 MiB)."""
    buf = os.urandom(1 << 20)
    out = {}
    for name, fn in (("blake2b", hashlib.blake2b().update), ("crc32", crc32)):
        t = time.process_time()
        for _ in range(256):
            fn(buf)
        out[name] = (time.process_time() - t) / (256 * (1 << 20) / 1e9)
    return out


def cpu_times(procs: dict[str, psutil.Process]) -> dict[str, tuple[float, float]]:
    """{name: (user, system) CPU seconds} of the given processes."""
    return {name: (p.cpu_times().user, p.cpu_times().system) for name, p in procs.items()}


async def run(gbytes: float, flows: int, tunnels: int, workdir: Path) -> dict:
    """Run one transfer; returns the figures as a dict."""
    size = int(gbytes * 1e9 / flows)
    async with trio.open_nursery() as nursery:
        h = LoopbackHarness(nursery, workdir)
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
        a: {"user": (cpu1[a][0] - cpu0[a][0]) / gb, "system": (cpu1[a][1] - cpu0[a][1]) / gb}
        for a in procs
    }
    return {
        "goodput_gbytes_per_s": total / elapsed / 1e9,
        "cpu_s_per_gb": sum(v["user"] + v["system"] for v in by_agent.values()),
        "cpu_s_per_gb_by_agent": by_agent,
        "bytes": total,
        "seconds": elapsed,
        "flows": flows,
        "tunnels": tunnels,
    }


def main(argv: list[str] | None = None) -> int:
    """Parse arguments, run, print and optionally write JSON."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--gbytes", type=float, default=2.0, help="total bytes to move, in GB (1e9)")
    p.add_argument("--flows", type=int, default=4, help="flows in the FlowGroup")
    p.add_argument("--tunnels", type=int, default=4, help="tunnels (connections) a -> b")
    p.add_argument("--json", type=Path, help="write the figures as JSON to this file")
    args = p.parse_args(argv)
    setup_logging("WARNING")
    with tempfile.TemporaryDirectory() as tmp:
        figures = trio.run(run, args.gbytes, args.flows, args.tunnels, Path(tmp))
    cost = hashing_cost_s_per_gb()
    # both ends hash every byte (BLAKE2b) and checksum every chunk (crc32): CPU floor per GB
    floor = 2 * (cost["blake2b"] + cost["crc32"])
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
    )
    print(
        f"digest+checksum alone: {floor:.2f} CPU s/GB (BLAKE2b {cost['blake2b']:.2f}, crc32 "
        f"{cost['crc32']:.2f} per end) -> at most {os.cpu_count() / floor:.2f} GB/s on "
        f"{os.cpu_count()} cores; 1-min load average during the run {figures['load_avg_1min']:.1f}"
    )
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
