"""CPU seconds of Terra's rounds in one terra-sim run, with the figures to compare two
checkouts side by side (run it once from each checkout's root, one after the other).

    uv run python benchmarks/round_cpu.py TERRA-SIM-ARGUMENTS...
    e.g. uv run python benchmarks/round_cpu.py --topology bigswitch --workload fb \\
        --link-gbps 1 --scheduler terra --limit 20

Runs `terra-sim` with the given arguments in this process and prints one line: the
checkout whose terra_core ran (the one installed; `python -m benchmarks.round_cpu` from
a checkout's root runs that checkout's), the rounds (calls of the simulator's
GroupAllocator.allocate), the process CPU seconds inside allocate (the policy's round
plus the split of its rates among the flows), inside the policy's group_rates alone and
in the whole run, the CPU milliseconds per round and the 1-minute load average. CPU is
time.process_time (user + system of this process), so other processes move it less than
wall time, though a loaded machine still adds a few % (caches, frequency): compare runs
made one after the other.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import terra_core
from terra_core.terra_policy import TerraPolicy
from terra_sim import cli
from terra_sim.group_allocation import GroupAllocator


def main(argv: list[str]) -> int:
    """Run terra-sim with `argv`, timing the rounds; print the figures (module docstring)."""
    spent = {"allocate": 0.0, "policy": 0.0, "rounds": 0}
    allocate, group_rates = GroupAllocator.allocate, TerraPolicy.group_rates

    def timed_allocate(self, now, active):
        start = time.process_time()
        try:
            return allocate(self, now, active)
        finally:
            spent["allocate"] += time.process_time() - start
            spent["rounds"] += 1

    def timed_group_rates(self, *args, **kwargs):
        start = time.process_time()
        try:
            return group_rates(self, *args, **kwargs)
        finally:
            spent["policy"] += time.process_time() - start

    GroupAllocator.allocate = timed_allocate
    TerraPolicy.group_rates = timed_group_rates
    start = time.process_time()
    try:
        status = cli.main(argv)
    finally:
        GroupAllocator.allocate, TerraPolicy.group_rates = allocate, group_rates
    total = time.process_time() - start
    rounds = spent["rounds"]
    print(
        f"{Path(terra_core.__file__).parent.parent}: {rounds} rounds, "
        f"allocate {spent['allocate']:.2f} CPU s "
        f"(policy {spent['policy']:.2f}, split {spent['allocate'] - spent['policy']:.2f}), "
        f"run {total:.2f} CPU s, {1000 * spent['allocate'] / max(rounds, 1):.2f} ms per "
        f"round, load {os.getloadavg()[0]:.1f}",
        file=sys.stderr,
    )
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
