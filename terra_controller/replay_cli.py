"""`terra-controller --record LOG` and `terra-controller replay LOG`: a controller's core
events written to a log, and handled again offline by a controller built with the same
options, which checks every outcome, effect and round against the log (core_log.py;
docs/runtime.md "Events, recorded and replayed").

The log's first event ("start") holds the options the controller ran with (topology,
scheduler and its parameters, tenants file, coflow options, switches or not), so
`replay` needs only the log; --topology names the topology file when it moved.
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter

from terra_core.cli_support import HelpFormatter

# The run options a replay needs: what the policy and the controller's core depend on.
RECORDED_OPTIONS = (
    "topology", "scheduler", "k", "alpha", "guard", "guard_factor", "guard_floor_s",
    "epsilon", "delta", "no_openflow", "agent_timeout", "keep_finished", "keep_finished_s",
    "max_restarts", "tenants", "isolation",
)  # fmt: skip


def recorder_of(args: argparse.Namespace, controller):
    """The CoreRecorder of --record, its "start" event holding RECORDED_OPTIONS of `args`
    and what `controller` took from its journal (`start_state`).

    Raises:
        SystemExit: the log cannot be written (one line).
    """
    from terra_controller.core_log import CoreRecorder

    try:
        recorder = CoreRecorder(args.record)
    except OSError as exc:
        raise SystemExit(f"terra-controller: --record {args.record}: {exc}") from exc
    options = {name: getattr(args, name, None) for name in RECORDED_OPTIONS}
    recorder.write(0.0, "start", [options, start_state(controller)], None)
    return recorder


def start_state(controller) -> dict:
    """What a controller took from its journal before its first event, for a replay: the
    next coflow id, the operator's link states, the tenants' record (live changes), how
    many coflows wait to be resumed (not in a log), and the UNIX time of its time 0."""
    book = getattr(controller, "tenants", None)
    return {
        "next_id": controller.registry.next_id,
        "links": [[a, b, state] for (a, b), state in controller.journal.links.items()],
        "tenants": None if book is None else book.record(),
        "resuming": len(controller.resuming),
        "wall_offset": controller.wall_offset,
    }


def add_replay_parser(commands) -> argparse.ArgumentParser:
    """Add `replay LOG [--topology T]` to `commands`."""
    p = commands.add_parser(
        "replay",
        help="replay a --record log and check it",
        description="Build a controller with the options LOG was recorded with (no agents, "
        "no listeners), handle its events at their recorded times, solve every round again "
        "and compare each outcome with the log. Prints a summary; exit status 0 when every "
        "outcome is the log's, 1 when one differs, 2 for a log or topology it cannot read.",
        formatter_class=HelpFormatter,
    )
    p.add_argument("log", metavar="LOG", help="a log written by terra-controller --record")
    p.add_argument("--topology", metavar="T", help="topology file (default: the recorded one)")
    p.add_argument("--show", type=int, default=10, metavar="N", help="differences printed")
    return p


def run_replay(args: argparse.Namespace) -> int:
    """Carry out a parsed `replay`: see `add_replay_parser`. Returns the exit status."""
    from terra_controller.core_log import read_events, replay

    try:
        events = list(read_events(args.log))
        controller = _controller_for(events, args.topology)
        report = replay(controller, events)
    except (OSError, ValueError) as exc:
        print(f"terra-controller replay: {exc}", file=sys.stderr)
        return 2
    states = Counter(c.state.value for c in controller.registry.coflows.values())
    print(f"{report.events} events, {report.rounds} rounds replayed; coflows: "
          + (", ".join(f"{n} {s}" for s, n in sorted(states.items())) or "none"))  # fmt: skip
    if report.identical:
        print("every outcome, effect and round as recorded")
        return 0
    print(f"{len(report.mismatches)} outcomes differ from the log:")
    for seq, kind, logged, got in report.mismatches[: args.show]:
        print(f"  event {seq} ({kind}): recorded {logged!r:.80}, replayed {got!r:.80}")
    return 1


def _controller_for(events: list, topology_path: str | None):
    """A Controller built as the recorded one was (the log's "start" options).

    Raises:
        ValueError: no "start" event, or a topology or tenants file that cannot be read.
    """
    from terra_controller.controller import Controller
    from terra_controller.operator_links import restore
    from terra_controller.tenant_cli import attach_tenants, scheduler_factory
    from terra_core.registry import options_from_args
    from topologies import TopologyError, load_topology

    if not events or events[0].kind != "start":
        raise ValueError("the log has no start event (not written by --record)")
    options, state = events[0].args
    if state["resuming"]:
        raise ValueError(f"the recorded controller resumed {state['resuming']} coflows of its "
                         "journal at its start: they are not in the log")  # fmt: skip
    ns = argparse.Namespace(**options)
    ns.topology = topology_path or ns.topology
    try:
        topology = load_topology(ns.topology)
    except TopologyError as exc:
        raise ValueError(str(exc)) from exc
    links = {(a, b): st for a, b, st in state["links"]}
    restore(topology, links)  # (the operator's link states of its journal, before the policy)
    book = _tenant_book(ns)
    if ns.no_openflow:
        options = options_from_args(ns)
    else:  # the tunnels installed at start: the same from the same topology and K
        from terra_controller.tunnel_table import TunnelTable, installed_path_source
        from topologies.binding import load_binding

        try:
            base_port = load_binding(topology).base_port
        except (TopologyError, KeyError) as exc:
            raise ValueError(f"no switch binding: {exc}") from exc
        table = TunnelTable(topology, ns.k, base_port, logical=False)
        options = options_from_args(ns, installed_path_source(table))
    policy = scheduler_factory(ns, topology, options, book)()
    controller = Controller(
        topology, policy, agent_timeout_s=ns.agent_timeout, keep_finished=ns.keep_finished,
        keep_finished_s=ns.keep_finished_s, max_restarts=ns.max_restarts, state_dir=None,
    )  # fmt: skip
    controller.journal.links.update(links)
    controller.registry.next_id = state["next_id"]
    controller.wall_offset = state["wall_offset"]
    attach_tenants(controller, book)
    if book is not None and state["tenants"] is not None:  # its journal's live changes
        controller.owner.run(book.restore, state["tenants"])
    return controller


def _tenant_book(ns: argparse.Namespace):
    """The TenantBook of the recorded --tenants / --isolation, or None.

    Raises:
        ValueError: the tenants file cannot be read or is invalid.
    """
    from terra_controller.tenant_cli import tenant_book_of

    parser = argparse.ArgumentParser(prog="terra-controller replay")
    try:
        return tenant_book_of(ns, parser)
    except SystemExit as exc:
        raise ValueError(f"the recorded tenants file {ns.tenants}: cannot be used") from exc
