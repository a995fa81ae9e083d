"""`terra-job`: a job's command line to a running controller's coflow API.

    terra-job [--api HOST:PORT[,HOST:PORT...]] (--pki DIR --name NAME | --insecure) [--json]
              COMMAND ...

    submit FILE.json [--wait] [--progress] [--timeout S]   submit a coflow (FILE: see below)
           [--coflow-name NAME] [--tag TAG ...]            (its name and tags: as in FILE)
           [--sync]                                        (skip files already there)
    watch ID [--timeout S]                                   follow a coflow until it ends
    list                                                     the coflows this client may see
    agents                                                   the agents and DCs flows may name
    cancel ID                                                cancel an unfinished coflow
    replay WORKLOAD.json --map DC=AGENT,...                  replay a simulator workload live

A coflow file (FILE.json) is either a list of flows or a map with "flows" and optionally
"deadline_s" (seconds from submission), "name", "tags" and "sync"::

    {"name": "etl-daily", "tags": ["nightly"], "deadline_s": 120,
     "flows": [{"id": "f1", "src": "hk1", "dst": "ba1", "bytes": 50000000,
                "src_path": "in/part-0", "dst_path": "out/part-0"}]}

Flows are the API's: "src" and "dst" are agent ids (`terra-job agents` lists them), "bytes" an
integer > 0, "src_path" / "dst_path" optional files under the agents' data roots. A flow with
a "src_path" may leave out "bytes" (the sender reports the file's size); a "src_path" that is
a directory ("logs/") or a glob ("logs/2026-11-*/") becomes one flow per file, the tree
recreated under "dst_path". "sync": true skips files whose destination already has the same
size and SHA-256. Once done, every file flow's line shows the SHA-256 of what arrived.

Exit status: 0 done (or request answered), 1 the coflow failed, was cancelled or rejected, or
the controller refused or could not be reached (the reason on stderr), 2 usage error (bad
option, unreadable or invalid file).
"""

from __future__ import annotations

import argparse
import json
import sys

from terra_controller.client_args import client_args, make_client
from terra_controller.job_follow import final_report, follow
from terra_core.cli_support import HelpFormatter, add_common_args
from terra_wire.api_session import label_error

PROG = "terra-job"
CONNECT_TIMEOUT_S = 10.0  # seconds to (re)connect and for each reply


class JobFileError(ValueError):
    """A coflow file cannot be read or does not have the shape described in the module."""


def load_coflow_file(path: str) -> dict:
    """Read a coflow file.

    Returns:
        {"flows": [flow maps as the API takes them], "deadline": s or None, "name": str or
        None, "tags": [str]}; the controller checks the flows' values.

    Raises:
        JobFileError: unreadable, not JSON, or not a list of flow maps / a map with "flows"
            (unknown top-level keys included).
    """
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise JobFileError(f"cannot read {path}: {exc}") from exc
    if isinstance(data, list):
        data = {"flows": data}
    if not isinstance(data, dict) or "flows" not in data:
        raise JobFileError(f'{path}: expected a list of flows or a map with "flows"')
    unknown = set(data) - {"flows", "deadline_s", "name", "tags", "sync"}
    if unknown:
        raise JobFileError(f"{path}: unknown keys {sorted(unknown)}")
    flows = data["flows"]
    if not isinstance(flows, list) or not flows or not all(isinstance(f, dict) for f in flows):
        raise JobFileError(f'{path}: "flows" must be a non-empty list of flow maps')
    tags = data.get("tags", [])
    if not isinstance(tags, list):
        raise JobFileError(f'{path}: "tags" must be a list of strings')
    sync = data.get("sync", False)
    if not isinstance(sync, bool):
        raise JobFileError(f'{path}: "sync" must be true or false')
    return {"flows": flows, "deadline": data.get("deadline_s"), "name": data.get("name"),
            "tags": tags, "sync": sync}  # fmt: skip


def build_parser() -> argparse.ArgumentParser:
    """The parser of `terra-job` (one subparser per command)."""
    p = argparse.ArgumentParser(
        prog=PROG,
        description="Submit, follow and cancel coflows on a running Terra controller (the "
        "coflow API, mutual TLS with a job certificate). Exit status 0 done, 1 failed, "
        "cancelled, rejected or refused (reason on stderr), 2 usage error.",
        formatter_class=HelpFormatter,
    )
    client_args(p)
    p.add_argument("--json", action="store_true", help="print results as JSON")
    add_common_args(p, log_level=False)
    commands = p.add_subparsers(dest="command", required=True, title="commands", metavar="CMD")
    submit = _command(commands, "submit", "submit a coflow from a JSON file (list of flows)")
    submit.add_argument("file", metavar="FILE", help="coflow file: flows, deadline_s, name, tags")
    submit.add_argument("--wait", action="store_true", help="wait until the coflow ends")
    submit.add_argument("--progress", action="store_true", help="show bytes, rate and ETA")
    submit.add_argument(
        "--sync", action="store_true",
        help="skip files whose destination already has the same size and SHA-256",
    )  # fmt: skip
    submit.add_argument("--coflow-name", metavar="NAME", help="the coflow's name (for people)")
    submit.add_argument(
        "--tag", action="append", metavar="TAG", help="a tag of the coflow (repeatable)"
    )
    _timeout_arg(submit)
    watch = _command(commands, "watch", "follow a coflow's progress until it ends")
    watch.add_argument("coflow_id", metavar="ID", type=int, help="the coflow's id")
    _timeout_arg(watch)
    _command(commands, "list", "the coflows this client may see (operators: all)")
    _command(commands, "agents", "the agents (id, DC, connected) and DCs flows may name")
    cancel = _command(commands, "cancel", "cancel an unfinished coflow")
    cancel.add_argument("coflow_id", metavar="ID", type=int, help="the coflow's id")
    replay = _command(commands, "replay", "replay a simulator JSON workload live")
    replay.add_argument("workload", metavar="WORKLOAD", help="JSON workload (terra-sim format)")
    replay.add_argument(
        "--map", required=True, type=parse_map, metavar="DC=AGENT,...",
        help="the agent that stands for each DC of the workload",
    )  # fmt: skip
    replay.add_argument(
        "--speed", type=float, default=1.0, metavar="X",
        help="arrival times divided by X",
    )  # fmt: skip
    _timeout_arg(replay)
    return p


def _command(commands, name: str, text: str) -> argparse.ArgumentParser:
    return commands.add_parser(name, help=text, description=text, formatter_class=HelpFormatter)


def _timeout_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--timeout", type=float, metavar="S", help="give up waiting after S seconds (exit 1)"
    )


def parse_map(text: str) -> dict[str, str]:
    """Parse "DC=AGENT,DC=AGENT" (argparse type).

    Raises:
        argparse.ArgumentTypeError: an item without "=", an empty side or a repeated DC.
    """
    mapping: dict[str, str] = {}
    for item in text.split(","):
        dc, sep, agent = item.strip().partition("=")
        if not sep or not dc or not agent or dc in mapping:
            raise argparse.ArgumentTypeError(f"expected DC=AGENT,... got {text!r}")
        mapping[dc] = agent
    return mapping


def main(argv: list[str] | None = None) -> int:
    """Console entry point (`terra-job`); returns the exit status."""
    p = build_parser()
    args = p.parse_args(argv)
    from terra_controller.client import TerraError

    if args.command == "replay":
        from terra_controller.job_replay import load_replay

        try:
            plan = load_replay(args.workload, args.map)
        except ValueError as exc:  # WorkloadError
            p.error(str(exc))
    elif args.command == "submit":
        try:
            job = load_coflow_file(args.file)
        except JobFileError as exc:
            p.error(str(exc))
        job["name"] = args.coflow_name or job["name"]
        job["tags"] = args.tag or job["tags"]
        job["sync"] = args.sync or job.get("sync", False)
        error = label_error(job["name"], job["tags"])
        if error is not None:
            p.error(error)
    client = make_client(p, args, timeout=CONNECT_TIMEOUT_S)
    try:
        if args.command == "replay":
            from terra_controller.job_replay import replay

            return replay(client, plan, args.speed, args.timeout, args.json)
        if args.command == "submit":
            return run_submit(client, job, args)
        return run_simple(client, args)
    except (TerraError, ConnectionError, TimeoutError) as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return 1
    finally:
        client.close()


def run_submit(client, job: dict, args) -> int:
    """`submit`: print the coflow id; with --wait follow it and report its outcome."""
    extra = {k: job[k] for k in ("name", "tags", "sync") if job.get(k)}
    cid = client.submit_coflow(job["flows"], job["deadline"], **extra)
    if cid < 0:
        print(f"{PROG}: coflow rejected: its deadline cannot be met", file=sys.stderr)
        return 1
    print(cid if not args.wait else f"coflow {cid} submitted", flush=True)
    if not args.wait:
        return 0
    return report(follow(client, cid, args.progress, args.timeout), args.json)


def run_simple(client, args) -> int:
    """`watch`, `list`, `agents`, `cancel`."""
    if args.command == "watch":
        return report(follow(client, args.coflow_id, True, args.timeout), args.json)
    if args.command == "cancel":
        client.cancel_coflow(args.coflow_id)
        print(json.dumps({"cancelled": args.coflow_id}) if args.json
              else f"coflow {args.coflow_id} cancelled")  # fmt: skip
        return 0
    if args.command == "agents":
        view = client.list_agents()
        if args.json:
            print(json.dumps(view, indent=1))
        else:
            print(agents_table(view))
        return 0
    coflows = client.list_coflows()
    print(json.dumps(coflows, indent=1) if args.json else coflows_table(coflows))
    return 0


def report(status: dict, as_json: bool) -> int:
    """Print a final status (JSON, or final_report's text); 0 if done, else 1."""
    if as_json:
        print(json.dumps(status, indent=1))
        if status["state"] != "done":
            print(f"{PROG}: coflow {status['id']} {status['state']}: {status.get('reason')}",
                  file=sys.stderr)  # fmt: skip
        return 0 if status["state"] == "done" else 1
    return final_report(status, sys.stdout, sys.stderr)


def agents_table(view: dict) -> str:
    """The `agents` reply as text: one "AGENT DC connected|disconnected" line per agent,
    then the DCs without a connected agent."""
    lines = [f"{'AGENT':<20} {'DC':<10} STATE"]
    for a in view["agents"]:
        lines.append(f"{a['id']:<20} {a['dc']:<10} "
                     f"{'connected' if a['connected'] else 'disconnected'}")  # fmt: skip
    served = {a["dc"] for a in view["agents"] if a["connected"]}
    idle = [dc for dc in view["dcs"] if dc not in served]
    lines.append(f"DCs: {', '.join(view['dcs'])}")
    if idle:
        lines.append(f"DCs without a connected agent: {', '.join(idle)}")
    return "\n".join(lines)


def coflows_table(coflows: list[dict]) -> str:
    """The `list` reply as text: id, state, bytes delivered/total, CCT, name and tags."""
    lines = [f"{'ID':>8} {'STATE':<10} {'DELIVERED':>14} {'TOTAL':>14} {'CCT_S':>8}  NAME TAGS"]
    for c in coflows:
        cct = "-" if c.get("cct_s") is None else f"{c['cct_s']:.2f}"
        tags = ",".join(c.get("tags") or [])
        lines.append(f"{c['id']:>8} {c['state']:<10} {c['bytes_delivered']:>14} "
                     f"{c['bytes_total']:>14} {cct:>8}  {c.get('name') or '-'} {tags}")  # fmt: skip
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
