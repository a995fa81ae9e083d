"""`terra-controller`: the controller process (issue 4 item 1), and `terra-controller ctl`.

Run:
    terra-controller --topology {swan,gscale,att,PATH} [--k K] [--alpha A] [--epsilon E]
        [--delta D] [--of-port 6653] [--api HOST:PORT] [--agents HOST:PORT] [--rest HOST:PORT]
        [--token-file FILE] [--no-openflow] [--log-level LEVEL]

It starts the coflow API, the agent channel and the REST server on os-ken's hub
(threads), a round runner, and (without --no-openflow) os-ken's AppManager with
the tunnel app (DESIGN.md section 10); the topology file then needs a switch
binding (topologies/binding.py). Addresses default to 127.0.0.1; port 0 picks a
free port. Once everything listens it prints one line on stdout:

    terra-controller ready api=HOST:PORT agents=HOST:PORT rest=HOST:PORT

With --no-openflow there are no switches: tunnels are logical and link state
changes come from the operator:

    terra-controller ctl --api HOST:PORT [--token-file FILE] link-down A B
    terra-controller ctl --api HOST:PORT link-up A B
    terra-controller ctl --api HOST:PORT capacity A B BYTES_PER_S
    terra-controller ctl --api HOST:PORT list | status ID

(the same operations are API requests "link_state" / "capacity", see api_server.py).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys

from topologies import TopologyError, load_topology

LOG = logging.getLogger("terra.cli")


def parse_addr(text: str) -> tuple[str, int]:
    """Parse "HOST:PORT" (port 0..65535) for argparse.

    Raises:
        argparse.ArgumentTypeError: malformed.
    """
    host, _, port = text.rpartition(":")
    if not host or not port.isdigit() or int(port) > 65535:
        raise argparse.ArgumentTypeError(f"expected HOST:PORT, got {text!r}")
    return host.strip("[]"), int(port)


def read_token(path: str | None) -> str | None:
    """Return the token in `path` (stripped), or None without a file.

    Raises:
        SystemExit: unreadable or empty file (a clear message on stderr).
    """
    if path is None:
        return None
    try:
        with open(path, encoding="utf-8") as fh:
            token = fh.read().strip()
    except OSError as exc:
        raise SystemExit(f"terra-controller: cannot read token file: {exc}") from exc
    if not token:
        raise SystemExit(f"terra-controller: token file {path} is empty")
    return token


def build_parser() -> argparse.ArgumentParser:
    """The controller's argument parser."""
    p = argparse.ArgumentParser(prog="terra-controller", description=__doc__.splitlines()[0])
    p.add_argument("--topology", required=True, help="swan, gscale, att, or a JSON/GraphML file")
    p.add_argument("--k", type=int, default=4, help="paths (tunnels) per DC pair (default 4)")
    p.add_argument("--alpha", type=float, default=0.1, help="starvation share α (default 0.1)")
    p.add_argument("--epsilon", type=float, default=0.1, help="deadline slack ε (default 0.1)")
    p.add_argument("--delta", type=float, default=0.1, help="capacity change threshold δ")
    p.add_argument("--of-host", default="127.0.0.1", help="OpenFlow listen address")
    p.add_argument("--of-port", type=int, default=6653, help="OpenFlow listen port")
    p.add_argument("--api", type=parse_addr, default=("127.0.0.1", 6700), help="coflow API")
    p.add_argument("--agents", type=parse_addr, default=("127.0.0.1", 6701), help="agent channel")
    p.add_argument("--rest", type=parse_addr, default=("127.0.0.1", 8080), help="REST (HTTP)")
    p.add_argument("--token-file", help="file holding the shared token for API and agents")
    p.add_argument("--no-openflow", action="store_true", help="no switches: logical tunnels")
    p.add_argument("--log-level", default="INFO", help="DEBUG, INFO, WARNING, ...")
    return p


def main(argv: list[str] | None = None) -> int:
    """Console entry point (`terra-controller`)."""
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "ctl":
        return ctl_main(argv[1:])
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=getattr(logging, str(args.log_level).upper(), logging.INFO),
        format="%(asctime)s %(name)s %(levelname)s %(message)s",
        stream=sys.stderr,
    )
    if args.k < 1:
        raise SystemExit("terra-controller: --k must be >= 1")
    try:
        topology = load_topology(args.topology)
    except (TopologyError, OSError) as exc:
        raise SystemExit(f"terra-controller: {exc}") from exc
    token = read_token(args.token_file)
    run(args, topology, token)
    return 0


def run(args, topology, token: str | None) -> None:
    """Start every part of the controller and block until SIGINT/SIGTERM."""
    from terra_controller.agent_channel import (
        AgentChannel,
        InstalledPathsPolicy,
        TunnelTable,
        start_agent_server,
    )
    from terra_controller.api_server import ApiHandler, start_api_server
    from terra_controller.controller import Controller, RoundRunner
    from terra_controller.rest import RestApp, start_rest_server
    from terra_controller.terra_policy import TerraPolicy

    params = {"k": args.k, "alpha": args.alpha, "epsilon": args.epsilon, "delta": args.delta}
    if args.no_openflow:
        tunnels = TunnelTable(topology, args.k, logical=True)
        policy = TerraPolicy(topology, **params)
    else:
        binding = load_switch_binding(topology)
        tunnels = TunnelTable(topology, args.k, binding.base_port, logical=False)
        policy = InstalledPathsPolicy(topology, tunnels, **params)
    controller = Controller(topology, policy)
    openflow_info = None
    threads = []
    if not args.no_openflow:
        app, of_threads = start_openflow_app(args, topology, binding, controller)
        threads += of_threads

        def openflow_info():
            with app.lock:
                entries = list(app.entries)
            rules: dict[str, list] = {}
            for e in entries:
                rules.setdefault(str(e.dpid), []).append(
                    {"table": e.table_id, "priority": e.priority, "match": e.match,
                     "actions": [list(a) for a in e.actions], "cookie": e.cookie}
                )  # fmt: skip
            return {
                "installed": app.installed,
                "rules_per_switch": app.rules_per_switch(),
                "flow_mods": app.flow_mods_sent,
                "flow_mods_at_install": app.flow_mods_at_install,
                "rules": rules,
            }

    channel = AgentChannel(controller, tunnels, token)
    try:
        _, t_api, api = start_api_server(ApiHandler(controller, token), *args.api)
        _, t_agents, agents = start_agent_server(channel, *args.agents)
        _, t_rest, rest = start_rest_server(RestApp(controller, channel, openflow_info), *args.rest)
    except OSError as exc:
        raise SystemExit(f"terra-controller: cannot listen: {exc}") from exc
    RoundRunner(controller).start()
    print(
        f"terra-controller ready api={api[0]}:{api[1]} agents={agents[0]}:{agents[1]} "
        f"rest={rest[0]}:{rest[1]}",
        flush=True,
    )

    def stop(signum, frame):
        LOG.info("signal %d: exiting", signum)
        channel.close_all()
        logging.shutdown()
        os._exit(0)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    for thread in [t_api, t_agents, t_rest, *threads]:
        thread.join()


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


def start_openflow_app(args, topology, binding, controller):
    """Start os-ken with the tunnel app; PortStatus link changes reach the controller.

    The app keeps its own copy of the topology (it flips link state on PortStatus);
    the controller's copy changes under the controller's lock via set_link_state.

    Returns:
        (TunnelApp, os-ken threads).
    """
    from terra_controller.openflow_app import TunnelConfig, start_openflow

    def link_changed(change) -> None:
        controller.set_link_state(change.link[0], change.link[1], change.up)

    config = TunnelConfig(topology.copy(), binding, args.k, on_link_change=link_changed)
    return start_openflow(config, args.of_host, args.of_port)


def ctl_main(argv: list[str]) -> int:
    """`terra-controller ctl`: operator commands through the coflow API."""
    from terra_controller.client import TerraClient, TerraError

    p = argparse.ArgumentParser(prog="terra-controller ctl", description="operator commands")
    p.add_argument("--api", type=parse_addr, default=("127.0.0.1", 6700))
    p.add_argument("--token-file")
    p.add_argument("command", choices=["link-down", "link-up", "capacity", "list", "status"])
    p.add_argument("operands", nargs="*")
    args = p.parse_args(argv)
    client = TerraClient(*args.api, token=read_token(args.token_file), timeout=5.0)
    need = {"link-down": 2, "link-up": 2, "capacity": 3, "list": 0, "status": 1}[args.command]
    if len(args.operands) != need:
        p.error(f"{args.command} takes {need} operands")
    ops = args.operands
    try:
        if args.command in ("link-down", "link-up"):
            result = {"changed": client.set_link_state(ops[0], ops[1], args.command == "link-up")}
        elif args.command == "capacity":
            result = {"changed": client.set_capacity(ops[0], ops[1], float(ops[2]))}
        elif args.command == "list":
            result = client.list_coflows()
        else:
            result = client.check_status(int(ops[0]))
    except (TerraError, ConnectionError, ValueError) as exc:
        print(f"terra-controller ctl: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
