"""`terra-controller`: the controller process, `terra-controller ctl` and `terra-controller pki`.

Run:
    terra-controller --topology {swan,gscale,att,PATH} (--pki DIR | --insecure) [--k K]
        [--scheduler NAME] [--alpha A] [--epsilon E] [--delta D] [--of-port 6653]
        [--port-stats-s S] [--api HOST:PORT]
        [--agents HOST:PORT] [--rest HOST:PORT] [--rest-public] [--no-openflow]
        [--agent-timeout S] [--keep-finished N] [--keep-finished-s S] [--max-restarts N]
        [--tenants FILE] [--isolation {none,tenants}] [--log-level LEVEL] [--version]

Certificates (docs/security.md):

    terra-controller pki init DIR [--host NAME_OR_IP ...]   CA + controller certificate
    terra-controller pki issue DIR --role {agent,job,operator} NAME [--tenant TENANT]

Every option and operand is described by `terra-controller --help`,
`terra-controller pki issue --help`, `terra-controller ctl --help`,
`terra-controller ctl capacity --help`, ...; docs/operations.md describes a deployment.

It starts the coflow API, the agent channel and the REST server on os-ken's hub
(threads), a round runner, and (without --no-openflow) os-ken's AppManager with
the tunnel app (docs/design.md section 10); the topology file then needs a switch
binding (topologies/binding.py). Addresses default to 127.0.0.1; port 0 picks a
free port. The servers answer as soon as they listen; the tunnel table (without
switches) and the scheduling policy are made right after (deferred.py: their imports are
most of the start-up time) and requests that need them (agent registration, submit,
update, link changes) wait for them. Once both are made and the round runner runs, it
prints one line on stdout:

    terra-controller ready api=HOST:PORT agents=HOST:PORT rest=HOST:PORT

Running the controller needs the 'controller' extra (networkx, HiGHS, numpy, numba,
os-ken); `pki` and `ctl` need only the agent's packages.

With --no-openflow there are no switches: tunnels are logical and link state
changes come from the operator:

    terra-controller ctl --api HOST:PORT --pki DIR --name NAME link-down A B
    terra-controller ctl ... link-up A B
    terra-controller ctl ... capacity A B BYTES_PER_S
    terra-controller ctl ... list | status ID | cancel ID

(the same operations are API requests "link_state" / "capacity", see api_server.py;
docs/operations.md lists them).
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import logging
import os
import signal
import sys
import time

from terra_controller.client_args import client_args, make_client, parse_addr
from terra_controller.pki_cli import add_pki_parser, run_pki
from terra_controller.replay_cli import add_replay_parser, recorder_of, run_replay
from terra_controller.tenant_cli import (
    add_tenant_arguments,
    add_tenant_ctl,
    attach_tenants,
    check_at_start,
    run_tenant_ctl,
    scheduler_factory,
    tenant_book_of,
)
from terra_core.cli_support import (
    HelpFormatter,
    MissingExtra,
    add_common_args,
    report_crashes,
    require,
    setup_logging,
)
from terra_core.registry import add_scheduler_arguments, options_from_args
from terra_security.integrity import ALGORITHMS
from topologies import TopologyError, load_topology

LOG = logging.getLogger("terra.cli")


def _cidr(text: str) -> str:
    """An IP prefix "ADDR/LEN" (argparse type); ArgumentTypeError if malformed."""
    try:
        return str(ipaddress.ip_network(text, strict=False))
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def build_parser() -> argparse.ArgumentParser:
    """The parser of `terra-controller`: the run options, and the `pki` and `ctl` commands.

    Without a command it runs the controller; --topology and one of --pki / --insecure are
    then required (checked by `main`, since the commands do not take them).
    """
    p = argparse.ArgumentParser(
        prog="terra-controller",
        usage="%(prog)s --topology T (--pki DIR | --insecure) [options]\n"
        "       %(prog)s pki {init,issue} ...\n"
        "       %(prog)s ctl [--api HOST:PORT] (--pki DIR --name NAME | --insecure) OP ...\n"
        "       %(prog)s replay LOG [--topology T]",
        description="Terra's controller (coflow API, agents, switches, REST); docs/operations.md.",
        formatter_class=HelpFormatter,
    )
    commands = p.add_subparsers(
        dest="command", title="commands", metavar="{pki,ctl,replay}", prog="terra-controller"
    )
    add_pki_parser(commands)
    add_ctl_parser(commands)
    add_replay_parser(commands)
    p.add_argument(
        "--topology", metavar="T", help="swan, gscale, att, or a JSON/GraphML file (required)"
    )
    add_scheduler_arguments(p)  # --scheduler, --k, --alpha, --epsilon, --delta (registry)
    add_listen_arguments(p)
    auth = p.add_mutually_exclusive_group()
    auth.add_argument(
        "--pki", metavar="DIR", help="PKI directory (ca.crt, controller.crt, controller.key)"
    )
    auth.add_argument(
        "--insecure", action="store_true", help="plain TCP, no authentication (labs only)"
    )
    p.add_argument("--rest-public", action="store_true", help="REST without a client certificate")
    p.add_argument("--no-openflow", action="store_true", help="no switches: logical tunnels")
    add_coflow_arguments(p)
    add_state_arguments(p)
    p.add_argument(
        "--leaf-mac", choices=("auto", *ALGORITHMS), default="auto", metavar="MAC",
        help="chunk MAC (docs/design.md 5.1)",
    )  # fmt: skip
    add_tenant_arguments(p)  # --tenants FILE, --isolation (tenant_cli.py)
    add_common_args(p)
    return p


def add_listen_arguments(p: argparse.ArgumentParser) -> None:
    """Where the controller listens: --of-host, --of-port (OpenFlow), --port-stats-s (s),
    --api, --agents, --rest (HOST:PORT)."""
    p.add_argument("--of-host", metavar="HOST", default="127.0.0.1", help="OpenFlow listen address")
    p.add_argument("--of-port", type=int, metavar="PORT", default=6653, help="OpenFlow listen port")
    p.add_argument(
        "--port-stats-s", type=float, default=1.0, metavar="S",
        help="port counters' poll period (0: never)",
    )  # fmt: skip
    p.add_argument(
        "--api", type=parse_addr, default="127.0.0.1:6700", metavar="HOST:PORT",
        help="coflow API",
    )  # fmt: skip
    p.add_argument(
        "--agents", type=parse_addr, default="127.0.0.1:6701", metavar="HOST:PORT",
        help="agent channel",
    )  # fmt: skip
    p.add_argument(
        "--rest", type=parse_addr, default="127.0.0.1:8080", metavar="HOST:PORT",
        help="REST and /metrics (HTTPS)",
    )  # fmt: skip


def add_coflow_arguments(p: argparse.ArgumentParser) -> None:
    """How coflows are kept and failed: --agent-timeout (s), --keep-finished,
    --keep-finished-s (s), --data-prefix (CIDR, repeatable), --max-restarts."""
    p.add_argument(
        "--agent-timeout", type=float, default=60.0, metavar="S",
        help="agent absence (s) failing coflows",
    )  # fmt: skip
    p.add_argument(
        "--keep-finished", type=int, default=10_000, metavar="N",
        help="finished coflows kept for status",
    )  # fmt: skip
    p.add_argument(
        "--keep-finished-s", type=float, default=None, metavar="S",
        help="seconds finished coflows are kept (default: no limit)",
    )  # fmt: skip
    p.add_argument(
        "--data-prefix", action="append", type=_cidr, metavar="CIDR",
        help="agents' data addresses may also lie in it (repeatable)",
    )  # fmt: skip
    p.add_argument(
        "--max-restarts", type=int, default=3, metavar="N",
        help="re-transfers after digest mismatches",
    )  # fmt: skip


def add_state_arguments(p: argparse.ArgumentParser) -> None:
    """Where the coflow state lives: --state-dir (journal) or --etcd with --cluster,
    --lease-ttl (s), --liveness-port, --advertise (docs/runtime.md)."""
    p.add_argument("--state-dir", metavar="DIR", help="coflow journal (docs/runtime.md)")
    p.add_argument("--etcd", metavar="HOST:PORT,...",
                   help="state in etcd; lead when elected (docs/runtime.md)")  # fmt: skip
    p.add_argument("--cluster", default="terra", metavar="NAME", help="etcd key prefix")
    p.add_argument("--lease-ttl", type=int, default=2, metavar="S", help="leader lease (s)")
    p.add_argument("--liveness-port", type=int, default=0, metavar="PORT",
                   help="port standbys watch the leader on (0: any)")  # fmt: skip
    p.add_argument("--advertise", metavar="HOST", help="host standbys name as the leader's")
    p.add_argument("--record", metavar="LOG", help="record the core's events (`replay`)")


def main(argv: list[str] | None = None) -> int:
    """Console entry point (`terra-controller`)."""
    p = build_parser()
    args = p.parse_args(argv)
    if args.command == "ctl":
        return run_ctl(args)
    if args.command == "pki":
        return run_pki(args)
    if args.command == "replay":
        return run_replay(args)
    if args.topology is None:
        p.error("the following arguments are required: --topology")
    if args.pki is None and not args.insecure:
        p.error("one of the arguments --pki --insecure is required")
    setup_logging(args.log_level)
    report_crashes()
    if args.k < 1:
        raise SystemExit("terra-controller: --k must be >= 1")
    if args.agent_timeout <= 0 or args.keep_finished < 0 or args.max_restarts < 0:
        raise SystemExit("terra-controller: --agent-timeout must be > 0, --keep-finished and "
                         "--max-restarts >= 0")  # fmt: skip
    check_controller_extra()
    args.tenant_book = tenant_book_of(args, p)  # a bad tenants file exits 2
    try:
        topology = load_topology(args.topology)
    except (TopologyError, OSError) as exc:
        raise SystemExit(f"terra-controller: {exc}") from exc
    check_at_start(args.tenant_book, topology, args.k, p)  # guarantees that do not fit: exit 2
    run(args, topology, server_security(args))
    return 0


CONTROLLER_MODULES = ("networkx", "highspy", "numpy", "numba", "os_ken")  # 'controller' extra


def check_controller_extra() -> None:
    """Check that the packages of the 'controller' extra are installed, without importing them
    (they load later, most of them with the policy).

    Raises:
        SystemExit: one is missing; the message names the extra (cli_support.require's).
    """
    import importlib.util

    for module in CONTROLLER_MODULES:
        if importlib.util.find_spec(module) is None:
            try:
                require(module, "controller")
            except MissingExtra as exc:
                raise SystemExit(f"terra-controller: {exc}") from exc


INSECURE_WARNING = (
    "--insecure: plain TCP, no authentication or authorization: anyone who reaches the "
    "agent port can register as an agent, receive flows and their digest keys and report "
    "on them; digests then detect accidental corruption only, not an attacker (labs only)"
)


def server_security(args):
    """The ServerSecurity of the API and agent channel from --pki / --insecure.

    Raises:
        SystemExit: the PKI directory lacks a file or holds invalid PEM.
    """
    import ssl

    from terra_controller.transport import ServerSecurity
    from terra_security.pki import PkiError, server_context

    if args.insecure:
        LOG.warning(INSECURE_WARNING)
        return ServerSecurity(None)
    try:
        return ServerSecurity(server_context(args.pki))
    except (PkiError, ssl.SSLError, OSError) as exc:
        raise SystemExit(f"terra-controller: {exc}") from exc


def capped(security, which: str):
    """`security` with the connection caps of server `which` ("api", "agents", "rest")
    derived from this process's open-file limit (connection_caps.caps_for_file_limit).

    Raises:
        SystemExit: the open-file limit is too small.
    """
    import dataclasses

    from terra_controller.connection_caps import caps_for_file_limit, file_limit

    nofile = file_limit()
    try:
        total, per_address = caps_for_file_limit(nofile)[which]
    except ValueError as exc:
        raise SystemExit(f"terra-controller: {exc}") from exc
    LOG.info("%s: at most %d connections, %d per address (open-file limit %d)", which, total,
             per_address, nofile)  # fmt: skip
    return dataclasses.replace(security, max_connections=total, max_per_address=per_address)


def cannot_listen(host: str, port: int, which: str, exc: BaseException, opened) -> None:
    """Report a port that cannot be bound, close the listeners in `opened`, exit status 1.

    Prints `terra-controller: cannot listen on HOST:PORT (WHICH): ERROR` on stderr.
    """
    exit_closing(f"terra-controller: cannot listen on {host}:{port} ({which}): {exc}", opened)


def exit_closing(message: str, opened) -> None:
    """Close the listeners in `opened`, print `message` on stderr and end the process at
    once with exit status 1 (os-ken's threads would keep it alive)."""
    from terra_controller.transport import stop_listener

    for listener in opened:
        stop_listener(listener)
    print(message, file=sys.stderr, flush=True)
    logging.shutdown()
    os._exit(1)


def probe_port(host: str, port: int) -> None:
    """Bind host:port once and release it (a port in use raises before os-ken starts).

    Raises:
        OSError: the address cannot be bound.
    """
    import socket

    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))


def run(args, topology, security) -> None:
    """Start every part of the controller and block until SIGINT/SIGTERM.

    With --etcd it first serves as a standby until elected (standby.lead_when_elected); the
    parts' modules are imported before that, off the takeover's time.
    """
    from terra_controller.agent_channel import AgentChannel, start_agent_server
    from terra_controller.api_server import ApiHandler, start_api_server
    from terra_controller.controller_round import RoundRunner
    from terra_controller.rest import RestApp, start_rest_server
    from terra_security.data_keys import DataKeys

    tunnels, policy, binding, shared = tunnels_and_policy(args, topology)
    rest_security = rest_security_of(args, security)
    store = leadership = None
    if args.etcd:
        store, leadership = wait_for_election(args, security, rest_security, tunnels, policy)
    controller = make_controller(args, topology, policy, store, leadership)
    if args.record:
        controller.recorder = recorder_of(args, controller)
    openflow_info = ports = None
    threads = []
    if not args.no_openflow:
        app, of_threads = start_openflow_app(args, topology, binding, controller, shared)
        threads += of_threads
        openflow_info, ports = openflow_views(app)
    # pair keys of the agents' data connections travel only over the mutual-TLS channel
    data_keys = DataKeys() if security.context is not None else None
    prefixes = args.data_prefix or ()
    leaf_mac = None if args.leaf_mac == "auto" else args.leaf_mac
    channel = AgentChannel(
        controller, tunnels, data_keys=data_keys, data_prefixes=prefixes, leaf_mac=leaf_mac
    )
    rest_app = RestApp(controller, channel, openflow_info, ports)
    servers = [
        ("coflow API", args.api, lambda h, p: start_api_server(
            ApiHandler(controller), h, p, capped(security, "api"))),
        ("agent channel", args.agents, lambda h, p: start_agent_server(
            channel, h, p, capped(security, "agents"))),
        ("REST", args.rest, lambda h, p: start_rest_server(
            rest_app, h, p, capped(rest_security, "rest"), args.rest_public,
            owner=controller.owner)),
    ]  # fmt: skip
    opened, started = start_listeners(servers)
    (t_api, api), (t_agents, agents), (t_rest, rest) = started
    build_deferred(controller, [tunnels, policy], args.scheduler, opened)
    LOG.info("scheduler %s (K=%d)", args.scheduler, args.k)
    tune_gc()
    RoundRunner(controller).start()
    print(
        f"terra-controller ready api={api[0]}:{api[1]} agents={agents[0]}:{agents[1]} "
        f"rest={rest[0]}:{rest[1]}",
        flush=True,
    )
    serve_until_signalled(channel, leadership, [t_api, t_agents, t_rest, *threads])


def tunnels_and_policy(args, topology):
    """The tunnel table and the scheduling policy (`Deferred`: made once the listeners are up,
    their imports of networkx, HiGHS, numpy and numba being most of the start-up time).
    Without --no-openflow the tunnel table is made now, over the tunnels it shares with the
    OpenFlow app, after checking the OpenFlow port can be bound.

    Returns:
        (TunnelTable or Deferred of one, Deferred policy, switch binding or None, the shared
        tunnels (tunnels.startup_tunnels) or None).

    Raises:
        SystemExit: the topology has no valid switch binding; exit status 1 when the
            OpenFlow port cannot be bound (`cannot_listen`).
    """
    from terra_controller.deferred import Deferred
    from terra_controller.tunnel_table import TunnelTable, installed_path_source
    from terra_controller.tunnels import startup_tunnels

    binding = shared = None
    if args.no_openflow:
        tunnels = Deferred(lambda: TunnelTable(topology, args.k, logical=True))
        options = options_from_args(args)
    else:
        binding = load_switch_binding(topology)
        try:
            probe_port(args.of_host, args.of_port)
        except OSError as exc:
            cannot_listen(args.of_host, args.of_port, "OpenFlow", exc, [])
        shared = startup_tunnels(topology, args.k, binding.base_port)  # rules and agents
        tunnels = TunnelTable(topology, args.k, binding.base_port, logical=False, tunnels=shared)
        options = options_from_args(args, installed_path_source(tunnels))
    policy = Deferred(
        scheduler_factory(args, topology, options, args.tenant_book),
        before={"name": args.scheduler, "stats": None},  # REST status, metrics meanwhile
    )
    return tunnels, policy, binding, shared


def wait_for_election(args, security, rest_security, tunnels, policy):
    """Serve as a standby until elected on etcd (standby.lead_when_elected), making the
    Deferred `tunnels` and `policy` (and importing os-ken's app, with switches) and
    freezing what they made (tune_gc) meanwhile.

    Returns:
        (EtcdState, Leadership) of the elected leader.

    Raises:
        SystemExit: see standby.lead_when_elected.
    """
    from terra_controller.deferred import Deferred
    from terra_controller.standby import lead_when_elected

    def warm_up() -> None:
        for part in (tunnels, policy):
            if isinstance(part, Deferred):
                part.build()
        if not args.no_openflow:  # os-ken's imports (about 1 s) off the takeover's time
            import terra_controller.openflow_app  # noqa: F401
        tune_gc()  # the full collection of all that, off the takeover's time too

    return lead_when_elected(args, security, rest_security, warm_up)


def make_controller(args, topology, policy, store, leadership):
    """The Controller over `topology` and `policy`, its state in `store` (etcd) or else in
    the journal of `state_dir`, with the tenants of --tenants (tenant_cli.attach_tenants);
    as the elected leader when `leadership` is given.

    Raises:
        SystemExit: the journal or the shared state cannot be opened or read.
    """
    from terra_controller.controller import Controller
    from terra_controller.etcd_state import StateStoreError
    from terra_controller.journal import JournalError

    try:
        controller = Controller(
            topology, policy, agent_timeout_s=args.agent_timeout,
            keep_finished=args.keep_finished, keep_finished_s=args.keep_finished_s,
            max_restarts=args.max_restarts,
            state_dir=None if store else state_dir(args.state_dir), store=store,
        )  # fmt: skip
    except (JournalError, StateStoreError) as exc:
        raise SystemExit(f"terra-controller: {exc}") from exc
    attach_tenants(controller, args.tenant_book)
    if leadership is not None:
        controller.role, controller.leader_addr = "leader", leadership.member["api"]
        controller.generation = leadership.generation or 0
    return controller


def openflow_views(app):
    """What REST reads from the OpenFlow app (openflow_app.TunnelApp `app`).

    Returns:
        (openflow_info(detail=True) -> {"installed", "rules_per_switch", "flow_mods",
        "flow_mods_per_switch", "flow_mods_at_install", "rules": {dpid: [rule]} (empty
        without detail)}, ports() -> {(a, b): port_stats.LinkLoad} of the WAN links).
    """

    from terra_controller.tunnels import rules_per_switch

    def ports():
        return app.port_stats.wan_links(time.monotonic())

    def openflow_info(detail: bool = True):
        """The OpenFlow app's rules and counters for REST (detail: every rule too). Called
        on the controller's loop, it takes no lock: os-ken's handlers hold the app's lock
        while they send flow-mods, which can wait on a slow switch. It reads what the app
        replaces whole (its list of rules) or copies in one step (its counters)."""
        entries = app.entries  # (replaced, never changed in place)
        per_switch = dict(app.flow_mods_per_switch)
        rules: dict[str, list] = {}
        for e in entries if detail else ():
            rules.setdefault(str(e.dpid), []).append(
                {"table": e.table_id, "priority": e.priority, "match": e.match,
                 "actions": [list(a) for a in e.actions], "cookie": e.cookie}
            )  # fmt: skip
        return {
            "installed": app.installed,
            "rules_per_switch": rules_per_switch(entries),
            "flow_mods": app.flow_mods_sent,
            "flow_mods_per_switch": per_switch,
            "flow_mods_at_install": app.flow_mods_at_install,
            "rules": rules,
        }

    return openflow_info, ports


def start_listeners(servers: list) -> tuple[list, list]:
    """Start each of `servers` ((name, (host, port), start(host, port) -> (listener, thread,
    bound (host, port)))) in order; a port that cannot be bound closes those started and
    ends the process with exit status 1 (`cannot_listen`).

    Returns:
        (the listening sockets, [(thread, bound (host, port))] in the order of `servers`).
    """
    opened, started = [], []
    for which, (host, port), start in servers:
        try:
            listener, thread, bound = start(host, port)
        except OSError as exc:
            cannot_listen(host, port, which, exc, opened)
        opened.append(getattr(listener, "listener", listener))
        started.append((thread, bound))
    return opened, started


def serve_until_signalled(channel, leadership, threads: list) -> None:
    """Block on `threads` (the servers' and os-ken's) until SIGTERM or SIGINT, which close
    the agents' control connections and end the process at once with exit status 0; a
    leader starting over (`leadership`, or None) closes them too."""

    def stop(signum, frame):
        LOG.info("signal %d: exiting", signum)
        channel.close_all()
        logging.shutdown()
        os._exit(0)

    if leadership is not None:
        leadership.before_start_over.append(channel.close_all)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    for thread in threads:
        thread.join()


def rest_security_of(args, security):
    """The REST server's ServerSecurity: the controller's certificate, client certificates
    optional (without an operator certificate only /healthz is served, unless
    --rest-public serves everything)."""
    if security.context is None:
        return security
    from terra_controller.transport import ServerSecurity
    from terra_security.pki import server_context

    return ServerSecurity(server_context(args.pki, require_client_cert=False))


def build_deferred(controller, parts: list, scheduler: str, opened) -> None:
    """Make the Deferred objects among `parts` (the tunnel table, the policy), in order,
    holding the controller's policy (so that no WAN change or submit reaches a half-made
    one; agent registrations wait for the tunnel table, submits for the policy).

    On failure it closes the listeners in `opened` and ends the process with exit status 1:
    an option out of range for the scheduler (ValueError) with `terra-controller: MESSAGE`,
    anything else with its traceback logged too.
    """
    from terra_controller.deferred import Deferred

    try:
        with controller.owner.policy_held():
            for part in parts:
                if isinstance(part, Deferred):
                    part.build()
    except ValueError as exc:
        exit_closing(f"terra-controller: {exc}", opened)
    except Exception as exc:  # the listeners' threads would keep a failed process alive
        LOG.exception("building the %s scheduler failed", scheduler)
        exit_closing(f"terra-controller: {exc!r}", opened)


def state_dir(chosen: str | None) -> str:
    """The controller's state directory: --state-dir, else $STATE_DIRECTORY (set by systemd's
    StateDirectory=; the first of a colon-separated list), else ~/.local/state/terra-controller."""
    if chosen:
        return chosen
    env = os.environ.get("STATE_DIRECTORY", "")
    if env:
        return env.split(":")[0]
    return os.path.join(os.path.expanduser("~"), ".local", "state", "terra-controller")


GC_THRESHOLDS = (100_000, 50, 100)  # gen-0 allocations between collections, gen-1, gen-2


def tune_gc() -> None:
    """Configure the cyclic garbage collector once, at start-up (it is never switched off).

    The registry keeps many long-lived objects and a round allocates many short-lived
    ones; with the default gen-0 threshold (700) collections cost about as much as a
    round. Objects alive after start-up are frozen (never scanned again) and gen-0
    collections run every GC_THRESHOLDS[0] allocations (docs/runtime.md).
    """
    import gc

    gc.collect()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)


def load_switch_binding(topology):
    """Return the topology's switch binding (topologies/binding.py).

    Raises:
        SystemExit: the topology has no valid binding (a clear message).
    """
    from topologies.binding import load_binding

    try:
        return load_binding(topology)
    except (TopologyError, KeyError, ValueError) as exc:
        raise SystemExit(
            f"terra-controller: {exc} (use --no-openflow for a topology without switches)"
        ) from exc


def start_openflow_app(args, topology, binding, controller, tunnels):
    """Start os-ken with the tunnel app; PortStatus link changes reach the controller.

    The app keeps its own copy of the topology (it flips link state on PortStatus);
    the controller's copy changes on the controller's loop, each change handed over
    through a channel (`switch_link_change`: os-ken does not wait for the loop; as the
    switches' word: an operator's link-down holds, terra_controller/operator_links.py).
    `tunnels` (tunnels.startup_tunnels) is the list the agent channel's TunnelTable
    holds too: built once, shared.

    Returns:
        (TunnelApp, os-ken threads).
    """
    from terra_controller.openflow_app import TunnelConfig, start_openflow

    def link_changed(change) -> None:  # (os-ken's thread: handed over, not waited for)
        controller.switch_link_change(change.link[0], change.link[1], change.up)

    config = TunnelConfig(
        topology.copy(), binding, args.k, on_link_change=link_changed, tunnels=tunnels,
        port_stats_s=args.port_stats_s, role_generation=controller.generation or None,
    )  # fmt: skip
    return start_openflow(config, args.of_host, args.of_port)


CTL_OPS = {
    "link-down": ("operator: the link A-B goes down (both directions)", ("A", "B")),
    "link-up": ("operator: the link A-B comes back up", ("A", "B")),
    "capacity": ("operator: set the link A-B's capacity", ("A", "B", "BYTES_PER_S")),
    "list": ("every coflow this client may see (operators: all)", ()),
    "status": ("one coflow's status map (JSON)", ("COFLOW_ID",)),
    "cancel": ("cancel an unfinished coflow", ("COFLOW_ID",)),
    "login": (
        "a 15-minute token for the web console (Authorization: Bearer; JSON "
        "{token, expires, name, role})",
        (),
    ),
}
OPERAND_HELP = {
    "A": ("DC at one end of the link", str),
    "B": ("DC at the other end", str),
    "BYTES_PER_S": ("new capacity in bytes per second (each direction)", float),
    "COFLOW_ID": ("the coflow's id (an integer)", int),
}


def add_ctl_parser(commands) -> argparse.ArgumentParser:
    """Add `ctl` (one subparser per operation, each with its operands) to `commands`."""
    ctl = commands.add_parser(
        "ctl",
        help="operator and job commands to a running controller",
        description="Send one request to a running controller's coflow API and print the "
        "answer as JSON. link-down, link-up and capacity need an operator certificate "
        "(with --no-openflow, link state comes only from these). Exit status 0, or 1 when "
        "the controller refused or could not be reached.",
        formatter_class=HelpFormatter,
    )
    client_args(ctl)
    ctl.set_defaults(ctl_parser=ctl)  # for usage errors found after parsing (make_client)
    ops = ctl.add_subparsers(dest="op", required=True, title="operations", metavar="OP")
    for name, (text, operands) in CTL_OPS.items():
        op = ops.add_parser(name, help=text, description=text, formatter_class=HelpFormatter)
        for operand in operands:
            help_text, kind = OPERAND_HELP[operand]
            op.add_argument(operand.lower(), metavar=operand, type=kind, help=help_text)
    add_tenant_ctl(ops)
    return ctl


def run_ctl(args: argparse.Namespace) -> int:
    """Carry out a parsed `ctl` command; print its answer (JSON) on stdout.

    Returns:
        0 on success, 1 when the controller refused or could not be reached (one line on
        stderr). Bad client options exit 2 (argparse).
    """
    client = make_client(args.ctl_parser, args, timeout=5.0)
    if args.op == "tenant":
        return run_tenant_ctl(client, args)
    from terra_controller.client import TerraError

    try:
        if args.op in ("link-down", "link-up"):
            result = {"changed": client.set_link_state(args.a, args.b, args.op == "link-up")}
        elif args.op == "capacity":
            result = {"changed": client.set_capacity(args.a, args.b, args.bytes_per_s)}
        elif args.op == "list":
            result = client.list_coflows()
        elif args.op == "login":
            result = client.login()
        elif args.op == "cancel":
            client.cancel_coflow(args.coflow_id)
            result = {"cancelled": args.coflow_id}
        else:
            result = client.check_status(args.coflow_id)
    except (TerraError, ConnectionError, ValueError) as exc:
        print(f"terra-controller ctl: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(result, indent=1))
    return 0


def ctl_main(argv: list[str]) -> int:
    """`terra-controller ctl ARGV...` (as `main(["ctl", *argv])`)."""
    return main(["ctl", *argv])


if __name__ == "__main__":
    sys.exit(main())
