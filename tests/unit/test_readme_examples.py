"""The README's examples work as shown: its JSON workload is the file under workloads/examples/
that terra-sim runs on a built-in topology, and its terra-sim command lines parse."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest

from terra_agent import cli as agent_cli
from terra_controller import cli as controller_cli
from terra_controller import job_cli
from terra_sim import cli as sim_cli
from topologies import load_topology
from workloads import load_workload

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()
EXAMPLE = ROOT / "workloads" / "examples" / "swan_two_coflows.json"


def readme_blocks(lang: str) -> list[str]:
    """The README's fenced code blocks of language `lang`."""
    return re.findall(rf"```{lang}\n(.*?)```", README, re.DOTALL)


def test_readme_shows_the_example_workload_file():
    shown = [json.loads(b) for b in readme_blocks("json") if '"coflows"' in b]
    assert shown, "the README shows no JSON workload"
    assert json.loads(EXAMPLE.read_text()) in shown
    assert "workloads/examples/swan_two_coflows.json" in README


def test_every_json_workload_in_the_readme_loads_on_swan(tmp_path):
    swan = load_topology("swan")
    for i, block in enumerate(b for b in readme_blocks("json") if '"coflows"' in b):
        path = tmp_path / f"w{i}.json"
        path.write_text(block)
        coflows = load_workload(str(path), swan)  # raises WorkloadError on an unknown DC
        assert coflows and all(f.src in swan.dcs for c in coflows for f in c.flows)


def test_the_example_runs_in_terra_sim(capsys):
    argv = ["--topology", "swan", "--workload", str(EXAMPLE), "--scheduler", "terra"]
    assert sim_cli.main(argv) == 0
    out = capsys.readouterr().out
    row = next(line for line in out.splitlines() if line.startswith("terra "))
    assert float(row.split()[1]) > 0  # an average CCT was measured


def test_readme_terra_sim_commands_parse():
    commands = [
        shlex.split(line.split("#")[0])
        for block in readme_blocks("sh")
        for line in block.splitlines()
        if line.startswith("uv run terra-sim ")
    ]
    assert commands
    for cmd in commands:
        args = sim_cli.build_parser().parse_args(cmd[3:])
        if args.workload.endswith(".json"):
            assert (ROOT / args.workload).is_file(), args.workload


@pytest.mark.parametrize(
    "tool, parser",
    [("terra-controller", controller_cli.build_parser), ("terra-agent", agent_cli.build_parser),
     ("terra-job", job_cli.build_parser)],
)  # fmt: skip
def test_readme_runtime_commands_parse(tool, parser):
    """Every `uv run terra-controller ...` / `terra-agent ...` / `terra-job ...` README line is a
    valid command line (options, subcommands and operands as the tools define them)."""
    commands = [
        shlex.split(line.split("#")[0].rstrip().rstrip("&"))
        for block in readme_blocks("sh")
        for line in block.splitlines()
        if line.startswith(f"uv run {tool} ")
    ]
    assert commands
    for cmd in commands:
        parser().parse_args(cmd[3:])  # SystemExit (usage error) fails the test
