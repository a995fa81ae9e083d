"""`terra-agent`: the Terra overlay agent of one host (moves a DC's flows over its tunnels).

    terra-agent --controller HOST:PORT[,HOST:PORT...] --dc DC --id AGENT_ID --data-addr HOST:PORT
                (--pki DIR | --insecure) [--spill-dir DIR] [--memory-limit BYTES]
                [--log-level LEVEL] [--data-root DIR] [--encrypt-data] [--max-ahead BYTES]
                [--metrics HOST:PORT] [--rate-limiter {bucket,pacing}]
                [--tcp-congestion NAME] [--version]

--pki DIR: the agent authenticates to the controller with DIR/AGENT_ID.crt and .key (made by
`terra-controller pki issue DIR --role agent AGENT_ID`) and verifies the controller against
DIR/ca.crt; its id is its certificate's name. The same certificate authenticates its data
connections: each starts with a mutual TLS handshake (the receiver presents its certificate as
server, the sender as client; each checks the other is the agent it should be), then carries
hello and chunks in clear (terra_security/data_auth.py); with --encrypt-data every frame is an
AES-GCM record keyed per connection and flow attempt (terra_security/data_records.py; every
agent of a deployment must use the same setting). Either way
every chunk carries a MAC keyed with its flow's key (terra_security/integrity.py). --insecure: plain
TCP everywhere, unauthenticated data connections (labs only).

--controller: the controller's agent channel; a highly available controller's instances as a
comma-separated list (the leader and its standbys, in any order): the agent tries them in
turn until one accepts it (standbys refuse agents), and the next one whenever the control
channel is lost (ControlSession._control_loop has the backoff rule); it logs the one it
registered with.

--max-ahead BYTES: the spill bound per flow: a chunk may end at most this far past the flow's
in-order point (default 1G); chunks beyond are refused (their connection is closed, the sender
resends them).

--data-root DIR: the only directory whose files this agent reads (flow sources) and writes
(flow sinks); flow file paths are relative to it and may not leave it. Without it every file
flow is refused (synthetic / digest-only flows still run).

--rate-limiter: how the controller's per-path rates are enforced: "bucket" (default, a trio
token bucket per FlowGroup and path) or "pacing" (the kernel paces each FlowGroup's own tunnel
connections with SO_MAX_PACING_RATE; docs/design.md section 5.1 "Rate limiting").

--tcp-congestion NAME: the kernel TCP congestion control of the tunnel connections this agent
opens (e.g. cubic; default: the system's, net.ipv4.tcp_congestion_control). The controller's
rates already share the links, so a tunnel's congestion control only has to keep up with its
rate; docs/design.md section 5.1 "Tunnel congestion control" says when BBR does not. A name the
kernel refuses is an error at start.

--spill-dir DIR: where out-of-order bytes beyond --memory-limit go; created (mode 0700) when
it does not exist.

Exit status: 0 on Ctrl-C, 2 on bad arguments (argparse; a missing certificate or data root),
1 when the data port cannot be bound, the spill directory cannot be created or the controller
refuses the registration for good (unknown --dc, a certificate of another name, a data address
that is not the agent's own; the reason is printed). Other control-channel failures are retried.
"""

from __future__ import annotations

import argparse
import logging
import os
import socket
import ssl
import sys
from pathlib import Path

import trio

from overlay.rate_limit import RATE_LIMITERS
from terra_core.cli_support import HelpFormatter, add_common_args, report_crashes, setup_logging
from terra_security.pki import (
    PkiError,
    client_context,
    data_client_context,
    data_server_context,
)
from terra_wire.control import ProtocolError, parse_addr
from terra_wire.frames import MAX_PAYLOAD_BYTES

from .agent import Agent, AgentConfig
from .config import RegistrationRefused, parse_memory
from .receiver import MAX_AHEAD_BYTES
from .tcp_options import set_congestion_control


def _addr(text: str) -> tuple[str, int]:
    try:
        return parse_addr(text)
    except ProtocolError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _addrs(text: str) -> list[tuple[str, int]]:
    """--controller: "HOST:PORT[,HOST:PORT...]" as a list of (host, port), duplicates dropped."""
    addrs = [_addr(part.strip()) for part in text.split(",")]
    return list(dict.fromkeys(addrs))


def _memory(text: str) -> int:
    try:
        return parse_memory(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def make_spill_dir(path: str) -> None:
    """Create the spill directory `path` (and its parents) with mode 0700 when it is missing;
    an existing directory is used as it is.

    Raises:
        OSError: it cannot be created, or it exists and is not a directory.
    """
    target = Path(path)
    if target.is_dir():
        return
    target.mkdir(mode=0o700, parents=True, exist_ok=False)
    os.chmod(target, 0o700)  # mkdir's mode is masked by the umask


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of terra-agent."""
    p = argparse.ArgumentParser(
        prog="terra-agent",
        description="Terra overlay agent: registers with the controller, sends its flows over "
        "the tunnels at the controller's per-path rates and receives, reorders and verifies "
        "the flows sent to it.",
        formatter_class=HelpFormatter,
    )
    p.add_argument(
        "--controller", required=True, type=_addrs, metavar="HOST:PORT[,HOST:PORT...]",
        help="the controller's agent channel (terra-controller --agents); several: a highly "
        "available controller's instances, tried in turn",
    )  # fmt: skip
    p.add_argument("--dc", required=True, metavar="DC", help="this agent's datacenter name")
    p.add_argument(
        "--id", required=True, dest="agent_id", metavar="AGENT_ID",
        help="unique agent id (with --pki: its certificate's name)",
    )  # fmt: skip
    p.add_argument(
        "--data-addr", required=True, type=_addr, metavar="HOST:PORT",
        help="address other agents reach this one at; without switches the tunnels listen "
        "on the ports right above PORT",
    )  # fmt: skip
    p.add_argument(
        "--spill-dir", default="/tmp", metavar="DIR",
        help="directory for reorder spill files (created, mode 0700, if missing)",
    )  # fmt: skip
    p.add_argument(
        "--memory-limit",
        type=_memory,
        default="64M",
        metavar="BYTES",
        help="out-of-order bytes kept in memory (all flows together) before spilling",
    )
    auth = p.add_mutually_exclusive_group(required=True)
    auth.add_argument(
        "--pki", metavar="DIR", help="PKI directory: ca.crt, AGENT_ID.crt, AGENT_ID.key"
    )
    auth.add_argument("--insecure", action="store_true", help="plain TCP to the controller")
    p.add_argument(
        "--data-root",
        metavar="DIR",
        help="directory whose files flows may read and write (paths are relative to it); "
        "without it, file flows are refused",
    )
    p.add_argument(
        "--encrypt-data",
        action="store_true",
        help="AES-GCM records on data connections after the handshake (needs --pki)",
    )
    p.add_argument(
        "--max-ahead",
        type=_memory,
        default=MAX_AHEAD_BYTES,
        help="bytes a chunk may end past its flow's in-order point (spill bound; e.g. 1G)",
    )
    p.add_argument(
        "--metrics", type=_addr, default=None, metavar="HOST:PORT",
        help="serve Prometheus metrics on http://HOST:PORT/metrics (plain HTTP: bind it to "
        "a management address)",
    )  # fmt: skip
    p.add_argument(
        "--rate-limiter",
        choices=RATE_LIMITERS,
        default="bucket",
        help="how per-path rates are enforced: bucket (a trio token bucket per FlowGroup and "
        "path) or pacing (the kernel's TCP pacing of a connection per FlowGroup and path)",
    )
    p.add_argument(
        "--tcp-congestion", metavar="NAME", default=None,
        help="kernel TCP congestion control of the tunnel connections this agent opens "
        "(e.g. cubic; default: the system's)",
    )  # fmt: skip
    add_common_args(p)
    return p


def check_congestion_control(name: str) -> str | None:
    """None if this process may use the kernel TCP congestion control `name` (tried on a
    throwaway socket, so a module the kernel loads on demand counts), else why not."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            set_congestion_control(sock, name)
        except (OSError, UnicodeEncodeError) as exc:
            return f"--tcp-congestion {name!r}: {getattr(exc, 'strerror', None) or exc}"
    return None


def _first_leaf(group: BaseExceptionGroup) -> BaseException:
    """The first exception inside `group` that is not itself a group."""
    while isinstance(group, BaseExceptionGroup):
        group = group.exceptions[0]
    return group


def _refused(exc: BaseException) -> int:
    """Print why the controller refused this agent; the exit status (1)."""
    print(f"terra-agent: the controller refused this agent: {exc}", file=sys.stderr)
    return 1


class CannotStart(Exception):
    """The options cannot run: the message (printed as `terra-agent: MESSAGE`) and the
    exit status (2: bad arguments, 1: a resource that cannot be had)."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status


def main(argv: list[str] | None = None) -> int:
    """Run the agent until interrupted; returns the exit status."""
    args = build_parser().parse_args(argv)
    setup_logging(args.log_level)
    report_crashes()
    try:
        config = agent_config(args)
    except CannotStart as exc:
        print(f"terra-agent: {exc}", file=sys.stderr)
        return exc.status
    return run_agent(Agent(config), args.data_addr)


def agent_config(args: argparse.Namespace) -> AgentConfig:
    """The AgentConfig of the parsed options, after checking them; creates the spill
    directory and binds the --metrics port.

    Raises:
        CannotStart: an option cannot run (see `check_options`, `tls_contexts`,
            `data_root_of`), the spill directory cannot be created or the metrics port
            bound (status 1).
    """
    check_options(args)
    tls, data_server, data_client = tls_contexts(args)
    try:
        make_spill_dir(args.spill_dir)
    except OSError as exc:
        raise CannotStart(f"spill dir {args.spill_dir!r}: {exc}", 1) from exc
    data_root = data_root_of(args)
    metrics_socket = None
    if args.metrics is not None:
        from .metrics import bind_metrics  # prometheus_client: only with --metrics

        try:
            metrics_socket = bind_metrics(*args.metrics)
        except OSError as exc:
            host, port = args.metrics
            raise CannotStart(f"--metrics {host}:{port}: {exc}", 1) from exc
    return AgentConfig(
        controller=args.controller[0],
        controllers=tuple(args.controller[1:]),
        dc=args.dc,
        agent_id=args.agent_id,
        data_addr=args.data_addr,
        spill_dir=args.spill_dir,
        memory_limit=args.memory_limit,
        tls=tls,
        data_root=data_root,
        data_tls_server=data_server,
        data_tls_client=data_client,
        encrypt_data=args.encrypt_data,
        max_ahead=args.max_ahead,
        rate_limiter=args.rate_limiter,
        tcp_congestion=args.tcp_congestion,
        metrics_socket=metrics_socket,
    )


def check_options(args: argparse.Namespace) -> None:
    """Check the options argparse cannot check alone.

    Raises:
        CannotStart (status 2): --encrypt-data with --insecure, --max-ahead below one chunk
            (MAX_PAYLOAD_BYTES), a --tcp-congestion the kernel refuses.
    """
    if args.encrypt_data and args.insecure:
        raise CannotStart("--encrypt-data needs --pki (TLS certificates)", 2)
    if args.max_ahead < MAX_PAYLOAD_BYTES:
        raise CannotStart(f"--max-ahead must be >= {MAX_PAYLOAD_BYTES}", 2)
    if args.tcp_congestion is not None:
        problem = check_congestion_control(args.tcp_congestion)
        if problem is not None:
            raise CannotStart(problem, 2)


def tls_contexts(args: argparse.Namespace) -> tuple:
    """(control channel, data server, data client) SSLContexts from --pki and --id; three
    Nones with --insecure (logged as a warning).

    Raises:
        CannotStart (status 2): a certificate or key is missing or invalid.
    """
    if args.insecure:
        logging.getLogger("terra_agent").warning(
            "--insecure: plain TCP to the controller, unauthenticated data connections"
        )
        return None, None, None
    try:
        return (
            client_context(args.pki, args.agent_id),
            data_server_context(args.pki, args.agent_id),
            data_client_context(args.pki, args.agent_id),
        )
    except (PkiError, ssl.SSLError, OSError) as exc:
        raise CannotStart(str(exc), 2) from exc


def data_root_of(args: argparse.Namespace) -> str | None:
    """--data-root as a real path (logged), or None without it (file flows refused).

    Raises:
        CannotStart (status 2): it is not a directory.
    """
    if args.data_root is None:
        logging.getLogger("terra_agent").info("no --data-root: file flows will be refused")
        return None
    if not Path(args.data_root).is_dir():
        raise CannotStart(f"data root {args.data_root!r} is not a directory", 2)
    data_root = os.path.realpath(args.data_root)
    logging.getLogger("terra_agent").info("serving flow files under %s", data_root)
    return data_root


def run_agent(agent: Agent, data_addr: tuple[str, int]) -> int:
    """Log the agent's connection caps and run it until interrupted.

    Returns:
        the exit status: 0 on Ctrl-C, 1 when the controller refuses the agent for good or
        the data port `data_addr` (host, port) cannot be bound (the reason on stderr).
    """
    data, metrics = agent.data_admission.caps, agent.metrics_admission.caps
    logging.getLogger("terra_agent").info(
        "connection caps: data %d (%d per address), metrics %d (%d per address)",
        data.max_connections, data.max_per_address,
        metrics.max_connections, metrics.max_per_address,
    )  # fmt: skip
    try:
        trio.run(agent.run)
    except KeyboardInterrupt:
        return 0
    except BaseExceptionGroup as group:
        refused = group.split(RegistrationRefused)[0]
        if refused is not None:
            return _refused(_first_leaf(refused))
        if group.split(KeyboardInterrupt)[1] is None:  # nothing but Ctrl-C
            return 0
        raise
    except RegistrationRefused as exc:
        return _refused(exc)
    except OSError as exc:
        host, port = data_addr
        print(f"terra-agent: cannot listen on {host}:{port}: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
