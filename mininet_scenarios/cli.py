"""`terra-testbed`: Terra against per-flow TCP on an emulated WAN (Mininet + Open vSwitch).

    terra-testbed swan [--quick] [--fail-link LA-NY | --no-failure] [--json OUT] [--plots DIR]
        [--link-mbps M] [--workload fb|PATH] [--first I] [--coflows N] [--speedup S]
        [--load L] [--repeats R] [--hosts-per-dc H] [--k K] [--timeout S] [--workdir DIR]
        [--schedulers A,B,...] [--observe] [--controllers N [--kill-leader-at S]]
        [--tenants N [--greedy-tenant] [--reserve T:A:B:M] [--sharing S]] [--log-level LEVEL]
    terra-testbed --version

Defaults (full run, about 2 min): the 12-coflow FB burst (mininet_scenarios.workload) on
10 Mbit/s WAN links at load 2, played at half speed (bytes x 0.04, arrivals x 2), LA-NY
down 4 s after the first arrival and up 6 s later, 3 repeats of (Terra, per-flow TCP)
pooled. --quick (~40 s): the burst's first 6 coflows, LA-NY down at 2 s for 3 s, one repeat.
The same bytes, arrival times and failure are played to both systems. docs/results.md (3.5) records
the measurements behind these defaults.

Needs root, Open vSwitch (started if installed but not running) and Mininet (the 'testbed'
extra). Prints a table of average / p95 CCT, WAN utilization and FoIs; exit status 0 when
the run finished, 1 on a testbed error, 2 on bad arguments, 130 on Ctrl-C. Everything it
started is torn down in every case.

--tenants N: coflow i goes to tenant t(i mod N) (terra-sim's rule), submitted with that
tenant's job certificate to a controller running N equal tenants; the summary adds each
tenant's average CCT. --greedy-tenant [P]: each repeat runs Terra a second time with the
last tenant's coflows split into P coflows each (default 10; same bytes and arrival) and
reports how much the honest tenants' average CCT changed (mininet_scenarios.testbed_tenants).
--sharing cooperative|strict|static: how the tenants share the WAN (the tenants file's
`sharing`, docs/design.md 4.5; default cooperative).
--reserve t0:HK:BA:3: the tenants file gives tenant t0 a guaranteed 3 Mbit/s of payload from
DC HK to DC BA (no window: in every Terra run), and every run gets t0's probe, one flow
from HK to BA of 8 s of the guarantee arriving with the first coflow; each Terra run
(honest and greedy) measures the rate t0's flows on HK->BA delivered while they had bytes,
from the agents' reports, and the summary gives it against the guarantee (target >= 90 %;
testbed_reservation).
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

from mininet_scenarios import results
from mininet_scenarios.observe import ObserveError
from mininet_scenarios.ports import free_port
from mininet_scenarios.run_result import Failure
from mininet_scenarios.sim_twin import simulate_testbed
from mininet_scenarios.swan import TestbedOptions, run_swan, testbed_topology
from mininet_scenarios.testbed_processes import TestbedError
from mininet_scenarios.testbed_reservation import Reserve, parse_reserve, probe_coflow
from mininet_scenarios.testbed_tenants import (
    PIECES,
    assign,
    split_greedy,
    tenant_lines,
    tenant_names,
    tenant_summary,
)
from mininet_scenarios.workload import DEFAULT_COUNT, DEFAULT_FIRST, scales, testbed_coflows
from terra_core.cli_support import (
    LOG_LEVELS,
    HelpFormatter,
    MissingExtra,
    add_common_args,
    require,
    setup_logging,
)
from terra_core.registry import scheduler_names
from terra_core.tenant_shares import DEFAULT_SHARING, SHARINGS
from terra_model import WorkloadError
from topologies import TopologyError, load_topology
from topologies.binding import load_binding

OVS_CTL = "/usr/share/openvswitch/scripts/ovs-ctl"
DEFAULT_LINK_MBPS = 10.0
FULL = {
    "coflows": DEFAULT_COUNT, "speedup": 0.5, "load": 2.0, "fail_at": 4.0, "fail_for": 6.0,
    "repeats": 3,
}  # fmt: skip
QUICK = {
    "coflows": 6, "speedup": 0.5, "load": 2.0, "fail_at": 2.0, "fail_for": 3.0, "repeats": 1
}  # fmt: skip


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of terra-testbed (one scenario: `swan`)."""
    p = argparse.ArgumentParser(
        prog="terra-testbed",
        description="Run Terra and per-flow TCP on an emulated WAN (Mininet, Open vSwitch, "
        "HTB-shaped links) with the same workload and link failure, and compare their "
        "coflow completion times and WAN utilization. Needs root.",
        formatter_class=HelpFormatter,
    )
    add_common_args(p, log_level=False)
    sub = p.add_subparsers(dest="scenario", required=True, title="scenarios", metavar="SCENARIO")
    add_swan_parser(sub)
    return p


def add_swan_parser(sub) -> argparse.ArgumentParser:
    """Add the `swan` scenario and its options to the subparsers `sub`."""
    s = sub.add_parser(
        "swan",
        help="Terra vs per-flow TCP on the emulated SWAN testbed",
        description="Terra vs per-flow TCP on the emulated SWAN WAN: one OVS switch and one "
        "agent host per DC, the controller in OpenFlow mode. Defaults (full run, about 2 "
        "minutes): the 12-coflow FB burst on 10 Mbit/s links at load 2, played at half "
        "speed, LA-NY down 4 s after the first arrival for 6 s, 3 repeats pooled. --quick "
        "(about 40 s): 6 coflows, LA-NY down at 2 s for 3 s, one repeat. Exit status 0 when "
        "the run finished, 1 on a testbed error, 2 on bad arguments, 130 on Ctrl-C.",
        formatter_class=HelpFormatter,
    )
    add_failure_arguments(s)
    s.add_argument("--json", metavar="OUT", type=Path, help="write the results JSON here")
    s.add_argument("--plots", metavar="DIR", type=Path, help="write PNG plots into this directory")
    add_workload_arguments(s)
    add_run_arguments(s)
    return s


def add_failure_arguments(s: argparse.ArgumentParser) -> None:
    """--quick and the link failure: --fail-link, --no-failure, --fail-at, --fail-for (s)."""
    s.add_argument("--quick", action="store_true", help="fewer coflows, shorter failure")
    s.add_argument("--fail-link", metavar="A-B", default="LA-NY", help="WAN link A-B to fail")
    s.add_argument("--no-failure", action="store_true", help="no link failure")
    s.add_argument(
        "--fail-at",
        metavar="S",
        type=float,
        help="seconds after the first arrival (default: 4; quick: 2)",
    )
    s.add_argument(
        "--fail-for",
        metavar="S",
        type=float,
        help="seconds the link stays down (default: 6; quick: 3)",
    )


def add_workload_arguments(s: argparse.ArgumentParser) -> None:
    """The WAN and the workload played on it: --link-mbps (Mbit/s), --workload, --first,
    --coflows, --speedup, --load, --hosts-per-dc, --repeats, --k."""
    s.add_argument(
        "--link-mbps",
        metavar="M",
        type=float,
        default=DEFAULT_LINK_MBPS,
        help="HTB rate of WAN links (Mbit/s)",
    )
    s.add_argument(
        "--workload", metavar="W", default="fb", help="fb, a coflow-benchmark trace or a .json"
    )
    s.add_argument(
        "--first", metavar="I", type=int, default=DEFAULT_FIRST, help="first coflow (position)"
    )
    s.add_argument(
        "--coflows",
        metavar="N",
        type=int,
        help="number of coflows in the slice (default: 12; quick: 6)",
    )
    s.add_argument(
        "--speedup",
        metavar="S",
        type=float,
        help="play the slice this many times faster (default: 0.5)",
    )
    s.add_argument(
        "--load",
        metavar="L",
        type=float,
        help="multiply every flow's bytes (offered load; default: 2)",
    )
    s.add_argument("--hosts-per-dc", metavar="H", type=int, default=1, help="agent hosts per DC")
    s.add_argument(
        "--repeats", metavar="R", type=int, help="Terra + TCP runs, pooled (default: 3; quick: 1)"
    )
    s.add_argument("--k", metavar="K", type=int, default=4, help="tunnels per DC pair")


def add_run_arguments(s: argparse.ArgumentParser) -> None:
    """How the run goes: --observe, --schedulers, --controllers, --kill-leader-at,
    --timeout (s), --of-port, --workdir, --log-level."""
    s.add_argument(
        "--observe", action="store_true",
        help="run Prometheus (deploy/prometheus/terra-rules.yml); report its targets, "
        "series, alerts",
    )  # fmt: skip
    s.add_argument(
        "--schedulers", type=parse_schedulers, default=["terra"], metavar="A,B,...",
        help="schedulers to play the workload under, one controller each, comma-separated "
        f"({','.join(scheduler_names())}); the first is the one the FoIs compare",
    )  # fmt: skip
    s.add_argument(
        "--controllers", metavar="N", type=int, default=1,
        help="N controllers on a three-member etcd (127.0.0.1), known to every switch, "
        "agent and client",
    )  # fmt: skip
    s.add_argument(
        "--kill-leader-at", metavar="S", type=float,
        help="SIGKILL the leader S s after the first arrival of the last repeat (earlier "
        "repeats: without the kill); report the takeover",
    )  # fmt: skip
    s.add_argument(
        "--tenants", metavar="N", type=int, default=0,
        help="N equal tenants, coflow i to tenant i mod N, each its own job certificate",
    )  # fmt: skip
    s.add_argument(
        "--greedy-tenant", nargs="?", type=int, const=PIECES, metavar="P",
        help=f"rerun with the last tenant's coflows split in P ({PIECES})",
    )  # fmt: skip
    s.add_argument(
        "--reserve", metavar="T:A:B:M",
        help="with --tenants: guarantee T M Mbit/s from DC A to B",
    )  # fmt: skip
    s.add_argument(
        "--sharing", choices=SHARINGS, metavar="S",
        help=f"with --tenants: {DEFAULT_SHARING} (default), "
        + ", ".join(x for x in SHARINGS if x != DEFAULT_SHARING),
    )  # fmt: skip
    s.add_argument(
        "--timeout",
        metavar="S",
        type=float,
        default=300.0,
        help="run limit (s) after the last arrival",
    )
    s.add_argument(
        "--of-port", metavar="PORT", type=int, default=0, help="OpenFlow port (default: a free one)"
    )
    s.add_argument(
        "--workdir", metavar="DIR", type=Path, help="logs and scratch files (default: a temp dir)"
    )
    s.add_argument(
        "--log-level", type=str.upper, choices=LOG_LEVELS, default="INFO",
        help="this process's (controller, agents: $TERRA_TESTBED_LOG_LEVEL)",
    )  # fmt: skip


def parse_schedulers(text: str) -> list[str]:
    """ "terra,varys" -> ["terra", "varys"] (registry names, no repeats).

    Raises:
        argparse.ArgumentTypeError: an unknown or repeated name, or none.
    """
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in scheduler_names()]
    if not names or unknown or len(set(names)) != len(names):
        raise argparse.ArgumentTypeError(
            f"{text!r}: give distinct names among {', '.join(scheduler_names())}"
        )
    return names


def check_environment() -> None:
    """Root, Open vSwitch running (started when installed), Mininet's mnexec present.

    Raises:
        TestbedError: what is missing and how to get it.
    """
    if os.geteuid() != 0:
        raise TestbedError("needs root (Mininet, Open vSwitch)")
    if not shutil.which("ovs-vsctl") or not os.path.exists(OVS_CTL):
        raise TestbedError("Open vSwitch missing: apt-get install openvswitch-switch")
    if not shutil.which("mnexec"):
        raise TestbedError("Mininet missing: apt-get install mininet")
    try:
        require("mininet.net", "testbed")
    except MissingExtra as exc:
        raise TestbedError(str(exc)) from exc
    if subprocess.run([OVS_CTL, "status"], capture_output=True).returncode != 0:
        subprocess.run([OVS_CTL, "start", "--system-id=random"], capture_output=True)
    if subprocess.run(["ovs-vsctl", "--timeout=10", "show"], capture_output=True).returncode:
        raise TestbedError("Open vSwitch does not answer (ovs-ctl start failed?)")


def options_from_args(args, workdir: Path) -> tuple[TestbedOptions, dict]:
    """TestbedOptions and a description of the workload from parsed arguments.

    Raises:
        WorkloadError, TopologyError, ValueError: bad workload, link or numbers.
    """
    preset = QUICK if args.quick else FULL
    count = args.coflows if args.coflows is not None else preset["coflows"]
    speedup = args.speedup if args.speedup is not None else preset["speedup"]
    load = args.load if args.load is not None else preset["load"]
    byte_scale, time_scale = scales(args.link_mbps, speedup, load)
    topology = load_topology("swan")
    testbed = load_topology(str(testbed_topology(workdir, args.link_mbps, args.hosts_per_dc)))
    binding = load_binding(testbed)
    coflows = testbed_coflows(
        args.workload, topology, binding, args.first, count, byte_scale, time_scale
    )
    failure = None
    if not args.no_failure:
        a, sep, b = args.fail_link.partition("-")
        if not sep or (a, b) not in topology.capacity:
            raise TopologyError(f"--fail-link {args.fail_link!r}: not a SWAN link (e.g. LA-NY)")
        down = args.fail_at if args.fail_at is not None else preset["fail_at"]
        up = down + (args.fail_for if args.fail_for is not None else preset["fail_for"])
        failure = Failure(a, b, down, up)
    workload = {
        "spec": args.workload,
        "first": args.first,
        "coflows": len(coflows),
        "flows": sum(len(c.flows) for c in coflows),
        "bytes": sum(c.bytes for c in coflows),
        "byte_scale": byte_scale,
        "time_scale": time_scale,
        "load": load,
        "last_arrival_s": coflows[-1].arrival_s,
        "failure": None if failure is None else vars(failure),
    }
    repeats = args.repeats if args.repeats is not None else preset["repeats"]
    if repeats < 1:
        raise ValueError("--repeats must be >= 1")
    check_controllers(args)
    names, coflows, greedy_coflows = tenant_workload(args, coflows)
    reserve = reserve_option(args, names, testbed)
    if reserve is not None:  # every run carries the reservation's probe (testbed_reservation)
        probe = probe_coflow(reserve, binding)
        coflows = [probe, *coflows]
        greedy_coflows = None if greedy_coflows is None else [probe, *greedy_coflows]
    opts = TestbedOptions(
        coflows=coflows,
        repeats=repeats,
        hosts_per_dc=args.hosts_per_dc,
        link_mbps=args.link_mbps,
        k=args.k,
        failure=failure,
        timeout_s=args.timeout,
        of_port=args.of_port or free_port(),
        workdir=workdir,
        schedulers=args.schedulers,
        observe=args.observe,
        controllers=args.controllers,
        kill_leader_at=args.kill_leader_at,
        tenants=names,
        greedy_coflows=greedy_coflows,
        reserve=reserve,
        sharing=args.sharing or DEFAULT_SHARING,
    )
    if names:
        workload["tenants"] = names
        workload["sharing"] = opts.sharing
    if reserve is not None:
        workload["reserve"] = vars(reserve)
        workload["reserve_probe"] = {"trace_id": probe.trace_id, "flows": list(probe.flows)}
    return opts, workload


def tenant_workload(args, coflows: list) -> tuple[list[str], list, list | None]:
    """(tenant names, the coflows with their tenants, the greedy run's coflows or None) of
    --tenants / --greedy-tenant; ([], coflows, None) without --tenants.

    Raises:
        ValueError: --tenants < 0, --greedy-tenant without --tenants, tenants with another
            scheduler than terra alone or with --controllers, a greedy tenant owning no coflow.
    """
    greedy_pieces = args.greedy_tenant
    if args.tenants < 0 or (greedy_pieces is not None and not args.tenants):
        raise ValueError("--tenants N needs N >= 1; --greedy-tenant needs --tenants")
    if greedy_pieces is not None and greedy_pieces < 1:
        raise ValueError(f"--greedy-tenant P must be >= 1, got {args.greedy_tenant}")
    if args.sharing is not None and not args.tenants:
        raise ValueError("--sharing needs --tenants")
    if not args.tenants:
        return [], coflows, None
    if args.schedulers != ["terra"] or args.controllers > 1:
        raise ValueError("--tenants runs the terra scheduler alone, on one controller")
    names = tenant_names(args.tenants)
    coflows = assign(coflows, names)
    greedy = None if greedy_pieces is None else split_greedy(coflows, names[-1], greedy_pieces)
    return names, coflows, greedy


def reserve_option(args, names: list[str], testbed) -> Reserve | None:
    """The Reserve of --reserve (testbed_reservation.parse_reserve on the testbed topology,
    capacities in bytes/s, and --k), or None without it.

    Raises:
        ValueError: --reserve without --tenants, or as parse_reserve.
    """
    if args.reserve is None:
        return None
    if not names:
        raise ValueError("--reserve needs --tenants")
    return parse_reserve(args.reserve, names, testbed, args.k)


def check_controllers(args) -> None:
    """Raises ValueError: --controllers / --kill-leader-at used wrongly."""
    if args.controllers < 1:
        raise ValueError("--controllers must be >= 1")
    if args.kill_leader_at is not None and (args.controllers < 2 or args.kill_leader_at < 0):
        raise ValueError("--kill-leader-at S needs --controllers 2 or more and S >= 0")
    if args.controllers > 1 and (len(args.schedulers) > 1 or args.observe):
        raise ValueError("--controllers N runs one scheduler, without --observe")


def main(argv: list[str] | None = None) -> int:
    """Console entry point (`terra-testbed`); returns the exit status."""
    args = build_parser().parse_args(argv)
    setup_logging(args.log_level)
    if args.plots:
        try:
            require("matplotlib", "plots")  # before the run, not after it
        except MissingExtra as exc:
            print(f"terra-testbed: --plots: {exc}", file=sys.stderr)
            return 1
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="terra-testbed-"))
    try:
        opts, workload, simulated = prepare_run(args, workdir)
    except (WorkloadError, TopologyError, ValueError) as exc:
        print(f"terra-testbed: {exc}", file=sys.stderr)
        return 2
    print(
        f"workload: {workload['coflows']} coflows, {workload['flows']} flows, "
        f"{workload['bytes'] / 1e6:.1f} MB, arrivals over {workload['last_arrival_s']:.1f} s "
        f"(bytes x {workload['byte_scale']:.4g}, time x {workload['time_scale']:.4g}); "
        f"logs in {workdir}",
        flush=True,
    )
    raw, status = run_testbed(opts, workdir)
    if raw is None:
        return status
    report(args, raw, workload, simulated)
    return 0


def prepare_run(args, workdir: Path) -> tuple[TestbedOptions, dict, dict]:
    """The run's TestbedOptions, the workload's description (`options_from_args`) and the
    simulated twin's results (sim_twin.simulate_testbed), before anything is started.

    Raises:
        WorkloadError, TopologyError, ValueError: bad workload, link or numbers.
    """
    opts, workload = options_from_args(args, workdir)
    testbed = testbed_topology(workdir, opts.link_mbps, opts.hosts_per_dc)
    binding = load_binding(load_topology(str(testbed)))
    simulated = simulate_testbed(
        opts.coflows, binding, opts.link_mbps, opts.k, opts.failure, opts.schedulers
    )
    return opts, workload, simulated


def run_testbed(opts: TestbedOptions, workdir: Path) -> tuple[dict | None, int]:
    """Check the environment and run the SWAN testbed (swan.run_swan, progress on stdout),
    Ctrl-C and SIGTERM ending it cleanly (also when started with SIGINT ignored, as
    background jobs of a non-interactive shell are).

    Returns:
        (run_swan's raw results, 0), or (None, exit status) after printing why on stderr:
        1 on a testbed error, 130 on Ctrl-C / SIGTERM.
    """
    previous = {
        sig: signal.signal(sig, _raise_interrupt) for sig in (signal.SIGINT, signal.SIGTERM)
    }
    try:
        check_environment()
        return run_swan(opts, log=lambda m: print(m, flush=True)), 0
    except (TestbedError, ObserveError) as exc:
        print(f"terra-testbed: {exc}", file=sys.stderr)
        return None, 1
    except KeyboardInterrupt:
        print("terra-testbed: interrupted; everything torn down", file=sys.stderr)
        return None, 130
    except Exception as exc:  # Mininet / OVS failures: clear message, torn down already
        print(f"terra-testbed: testbed error: {exc!r} (logs in {workdir})", file=sys.stderr)
        return None, 1
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def report(args, raw: dict, workload: dict, simulated: dict) -> None:
    """Print the run's tables (testbed against its simulated twin, FoIs per repeat, what was
    observed, the operator page's shots, the takeover) and write --json and --plots."""
    result = results.summary(raw)
    extra = results.details(raw, workload)
    extra["simulated"] = simulated
    result["utilization_vs_simulated"] = results.utilization_vs_simulated(result, simulated)
    print(results.table(result, simulated))
    print(results.simulated_line(extra["simulated"]))
    print(results.simulated_table(result, simulated))
    if len(extra["repeats"]) > 1:
        for key in ("foi_avg_cct", "foi_wan_utilization"):
            values = ", ".join(f"{rep[key]:.2f}" for rep in extra["repeats"])
            print(f"{key} per repeat: {values}")
    if raw.get("observe"):
        extra["observe"] = raw["observe"]
        print(results.observe_lines(raw["observe"]))
    if raw.get("page"):
        extra["page"] = raw["page"]
        print_page(raw["page"])
    tenants = tenant_summary(raw)
    if tenants is not None:
        result["tenants"] = tenants
        print(tenant_lines(tenants))
    if raw.get("core_replay"):
        result["core_replay"] = raw["core_replay"]
        for name, rep in raw["core_replay"].items():
            print(f"core log ({name}): {'; '.join(rep['lines'][:2])}")
    takeover = results.takeover_summary(raw)
    if takeover is not None:
        result["takeover"] = takeover
        print(results.takeover_lines(takeover))
    if args.json:
        results.write_json(result, args.json, extra)
    if args.plots:
        for path in results.plot(raw, args.plots):
            print(f"plot: {path}")


def print_page(page: dict) -> None:
    """One line per screenshot of the operator page (raw["page"] of run_swan: {"shots":
    [{name, links_down, coflow, flows, path}], "error": str or None}), then its error."""
    for shot in page["shots"]:
        down = ", ".join(shot["links_down"]) or "none"
        print(
            f"page {shot['name']}: links shown down: {down}; coflow view: "
            f"{shot.get('coflow')} ({len(shot.get('flows', []))} flows); {shot['path']}"
        )
    if page["error"]:
        print(f"page: {page['error']}")


def _raise_interrupt(signum, frame):
    raise KeyboardInterrupt


if __name__ == "__main__":
    sys.exit(main())
