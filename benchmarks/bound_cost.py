"""Cost of the CCT lower bound's cut search (terra_sim/cct_bound.py) on the FB trace.

    uv run python benchmarks/bound_cost.py --topology bigswitch --limit 100 [--memory]

Prints one JSON line: the cut bound (seconds), cuts searched, wall and CPU seconds of
avg_cct_lower_bound alone (the trace and topology are loaded before the clock starts;
the isolation bound, whose LPs the simulator needs anyway, is left out), the process's
peak RSS (MB) and the load average. With ``--memory`` a second call runs under
tracemalloc and adds the peak of Python/numpy allocations during the bound (MB); its
time is not reported (tracemalloc slows it down).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import time
import tracemalloc

from terra_sim.cct_bound import avg_cct_lower_bound
from topologies import load_topology
from workloads import load_workload


def main(argv: list[str] | None = None) -> int:
    """Measure the bound once (and once more under tracemalloc with --memory); print JSON."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--topology", default="bigswitch")
    p.add_argument("--link-gbps", type=float, default=None, help="default: the topology's own")
    p.add_argument("--limit", type=int, default=None, help="only the first N coflows")
    p.add_argument("--memory", action="store_true", help="also measure peak allocations")
    args = p.parse_args(argv)
    topo = load_topology(args.topology, link_gbps=args.link_gbps)
    coflows = load_workload("fb", topo, limit=args.limit)
    before, start = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
    bound = avg_cct_lower_bound(coflows, topo)
    wall, after = time.perf_counter() - start, resource.getrusage(resource.RUSAGE_SELF)
    out = {
        "topology": args.topology,
        "limit": args.limit,
        "coflows": bound.coflows,
        "cut_avg_cct_s": bound.cut_avg_cct_s,
        "cut_size": len(bound.cut),
        "cuts_searched": bound.cuts_searched,
        "wall_s": round(wall, 3),
        "cpu_s": round(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime, 3),
        "peak_rss_mb": round(after.ru_maxrss / 1024, 1),
        "loadavg": os.getloadavg(),
    }
    if args.memory:
        tracemalloc.start()
        avg_cct_lower_bound(coflows, topo)
        out["peak_alloc_mb"] = round(tracemalloc.get_traced_memory()[1] / 2**20, 1)
        tracemalloc.stop()
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
