"""CPU seconds of Terra's rounds in one terra-sim run, with the figures to compare two
checkouts side by side (run it once from each checkout's root, one after the other).

    uv run python benchmarks/round_cpu.py TERRA-SIM-ARGUMENTS...
    e.g. uv run python benchmarks/round_cpu.py --topology bigswitch --workload fb \\
        --link-gbps 1 --scheduler terra --limit 20

Runs `terra-sim` with the given arguments in this process and prints one line: the
checkout whose terra_core ran (the one installed; `python -m benchmarks.round_cpu` from
a checkout's root runs that checkout's), the rounds (calls of the simulator's
GroupAllocator.allocate), the process CPU seconds inside allocate (the policy's round
plus the split of its rates among the flows), inside the policy's group_rate_arrays alone and
in the whole run, the CPU milliseconds per round and the 1-minute load average.

With `--cost-model` first, it also fits the CPU seconds inside allocate of the rounds
without an LP to a fixed cost plus a cost per active FlowGroup without a rate and one per
FlowGroup with a rate, and prints the fit and the mean extra cost of a round with an LP
(docs/results.md 2.2):

    uv run python -m benchmarks.round_cpu --cost-model --topology synth40.json \\
        --workload fb --link-gbps 1 --scheduler terra --limit 150

CPU is time.process_time (user + system of this process), so other processes move it less than
wall time, though a loaded machine still adds a few % (caches, frequency): compare runs
made one after the other.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import numpy as np

import terra_core
from terra_core.terra_policy import TerraPolicy
from terra_sim import cli
from terra_sim.group_allocation import GroupAllocator


def main(argv: list[str]) -> int:
    """Run terra-sim with `argv` (after an optional leading `--cost-model`), timing the
    rounds; print the figures (module docstring)."""
    model = bool(argv) and argv[0] == "--cost-model"
    argv = argv[1:] if model else argv
    spent = {"allocate": 0.0, "policy": 0.0, "rounds": 0}
    rows: list[tuple[float, int, int, int]] = []  # (CPU s, FlowGroups, with a rate, LPs)
    allocate, group_rates = GroupAllocator.allocate, TerraPolicy.group_rate_arrays

    def timed_allocate(self, now, active):
        lps = self.policy.stats.get("lps", 0) if model else 0
        start = time.process_time()
        try:
            return allocate(self, now, active)
        finally:
            cpu = time.process_time() - start
            spent["allocate"] += cpu
            spent["rounds"] += 1
            if model and self._layout is not None:
                groups = self._layout[1]
                rated = len(np.unique(groups.gid[self.flows.rate[groups.pos] > 0]))
                rows.append((cpu, groups.count, rated, self.policy.stats.get("lps", 0) - lps))

    def timed_group_rates(self, *args, **kwargs):
        start = time.process_time()
        try:
            return group_rates(self, *args, **kwargs)
        finally:
            spent["policy"] += time.process_time() - start

    GroupAllocator.allocate = timed_allocate
    TerraPolicy.group_rate_arrays = timed_group_rates
    start = time.process_time()
    try:
        status = cli.main(argv)
    finally:
        GroupAllocator.allocate, TerraPolicy.group_rate_arrays = allocate, group_rates
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
    if model:
        print(cost_model(rows), file=sys.stderr)
    return status


def cost_model(rows: list[tuple[float, int, int, int]]) -> str:
    """One line: the least-squares fit of the CPU seconds of the rounds without an LP to
    a + b x (FlowGroups without a rate) + c x (FlowGroups with a rate), and the mean CPU a
    round with an LP spends beyond that fit. `rows`: (CPU s, active FlowGroups, those with
    a rate, LPs) per round."""
    if not rows:
        return "cost model: no rounds"
    cpu, groups, rated, lps = (np.asarray(col, dtype=float) for col in zip(*rows, strict=True))
    x = np.column_stack([np.ones(len(cpu)), groups - rated, rated])
    plain = lps == 0
    if plain.sum() < 3:
        return "cost model: fewer than 3 rounds without an LP"
    (a, b, c), *_ = np.linalg.lstsq(x[plain], cpu[plain], rcond=None)
    extra = float((cpu[~plain] - x[~plain] @ (a, b, c)).mean()) if (~plain).any() else 0.0
    share = rated.sum() / max(groups.sum(), 1.0)
    return (
        f"cost model ({int(plain.sum())} rounds without an LP of {len(cpu)}): "
        f"{a * 1e3:.2f} ms + {b * 1e6:.2f} us per FlowGroup without a rate + "
        f"{c * 1e6:.2f} us per FlowGroup with a rate; a round with an LP {extra * 1e3:.1f} ms "
        f"more; {100 * share:.0f} % of the FlowGroup-rounds have a rate"
    )


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
