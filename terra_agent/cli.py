"""`terra-agent` command line (issue 3 item 2).

    terra-agent --controller HOST:PORT --dc DC --id AGENT_ID --data-addr HOST:PORT
                [--spill-dir DIR] [--memory-limit BYTES] [--token-file FILE] [--log-level LEVEL]

Exit status: 0 on Ctrl-C, 2 on bad arguments (argparse), 1 when the data port cannot be bound.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

import trio

from overlay.protocol import ProtocolError, parse_addr

from .agent import Agent, AgentConfig, parse_memory


def _addr(text: str) -> tuple[str, int]:
    try:
        return parse_addr(text)
    except ProtocolError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _memory(text: str) -> int:
    try:
        return parse_memory(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of terra-agent."""
    p = argparse.ArgumentParser(prog="terra-agent", description="Terra overlay agent (trio)")
    p.add_argument("--controller", required=True, type=_addr, help="controller HOST:PORT")
    p.add_argument("--dc", required=True, help="this agent's datacenter name")
    p.add_argument("--id", required=True, dest="agent_id", help="unique agent id")
    p.add_argument("--data-addr", required=True, type=_addr, help="HOST:PORT for tunnel data")
    p.add_argument("--spill-dir", default="/tmp", help="directory for reorder spill files")
    p.add_argument(
        "--memory-limit",
        type=_memory,
        default=64 << 20,
        help="out-of-order bytes kept in memory (all flows together) before spilling (e.g. 64M)",
    )
    p.add_argument("--token-file", type=Path, help="file holding the registration token")
    p.add_argument("--log-level", default="INFO", help="logging level (default INFO)")
    return p


def main(argv: list[str] | None = None) -> int:
    """Run the agent until interrupted; returns the exit status."""
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(),
        format=f"%(asctime)s {args.agent_id} %(levelname)s %(name)s: %(message)s",
    )
    token = None
    if args.token_file is not None:
        try:
            token = args.token_file.read_text().strip()
        except OSError as exc:
            print(f"terra-agent: cannot read token file: {exc}", file=sys.stderr)
            return 2
    if not Path(args.spill_dir).is_dir():
        print(f"terra-agent: spill dir {args.spill_dir!r} is not a directory", file=sys.stderr)
        return 2
    config = AgentConfig(
        controller=args.controller,
        dc=args.dc,
        agent_id=args.agent_id,
        data_addr=args.data_addr,
        spill_dir=args.spill_dir,
        memory_limit=args.memory_limit,
        token=token,
    )
    try:
        trio.run(Agent(config).run)
    except KeyboardInterrupt:
        return 0
    except BaseExceptionGroup as group:
        if group.split(KeyboardInterrupt)[1] is None:  # nothing but Ctrl-C
            return 0
        raise
    except OSError as exc:
        host, port = args.data_addr
        print(f"terra-agent: cannot listen on {host}:{port}: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
