"""What the command-line tools share (terra_core/cli_support.py): --version, --log-level,
the log format, help texts, progress bars and optional extras; and `terra-controller ctl` /
`pki` as argparse subcommands."""

from __future__ import annotations

import io
import logging
import re
import subprocess
import sys

import pytest

from mininet_scenarios import cli as testbed_cli
from terra_agent import cli as agent_cli
from terra_controller import cli as controller_cli
from terra_controller import job_cli
from terra_core import cli_support
from terra_core.cli_support import LOG_FORMAT, MissingExtra, package_version, progress, require
from terra_sim import cli as sim_cli

MAINS = {
    "terra-controller": controller_cli.main,
    "terra-agent": agent_cli.main,
    "terra-sim": sim_cli.main,
    "terra-testbed": testbed_cli.main,
    "terra-job": job_cli.main,
}
# Every help page of the tools (arguments before --help).
HELP_PAGES = [
    ("terra-controller", []),
    ("terra-controller", ["pki"]),
    ("terra-controller", ["pki", "init"]),
    ("terra-controller", ["pki", "issue"]),
    ("terra-controller", ["ctl"]),
    *[("terra-controller", ["ctl", op]) for op in controller_cli.CTL_OPS],
    ("terra-agent", []),
    ("terra-sim", []),
    ("terra-testbed", []),
    ("terra-testbed", ["swan"]),
    ("terra-job", []),
    *[("terra-job", [cmd]) for cmd in ("submit", "watch", "list", "agents", "cancel", "replay")],
]


def run_main(tool: str, argv: list[str], capsys) -> tuple[int, str, str]:
    """Run a tool's main in-process; return (exit status, stdout, stderr)."""
    try:
        code = MAINS[tool](argv)
    except SystemExit as exc:
        code = exc.code
    out, err = capsys.readouterr()
    return code, out, err


def help_text(tool: str, prefix: list[str], capsys) -> str:
    code, out, err = run_main(tool, [*prefix, "--help"], capsys)
    assert code == 0, err
    return out


@pytest.mark.parametrize("tool", list(MAINS))
def test_version_comes_from_package_metadata(tool, capsys):
    code, out, _ = run_main(tool, ["--version"], capsys)
    assert code == 0
    assert out.strip() == f"{tool} {package_version()}"
    assert re.fullmatch(r"\d+\.\d+\.\d+.*", package_version())  # installed: not "unknown"


@pytest.mark.parametrize(
    "tool, argv",
    [
        ("terra-controller", ["--topology", "swan", "--insecure"]),
        ("terra-agent", ["--controller", "h:1", "--dc", "HK", "--id", "a",
                         "--data-addr", "h:2", "--insecure"]),
        ("terra-sim", ["--topology", "swan", "--workload", "fb"]),
        ("terra-testbed", ["swan"]),
    ],
)  # fmt: skip
def test_unknown_log_level_is_a_usage_error(tool, argv, capsys):
    code, _, err = run_main(tool, [*argv, "--log-level", "LOUD"], capsys)
    assert code == 2
    assert "argument --log-level: invalid choice: 'LOUD'" in err
    assert "DEBUG" in err and "CRITICAL" in err  # the message lists the real levels


def test_log_level_is_case_insensitive():
    args = sim_cli.build_parser().parse_args(
        ["--topology", "swan", "--workload", "fb", "--log-level", "debug"]
    )
    assert args.log_level == "DEBUG"


@pytest.mark.parametrize("tool, prefix", HELP_PAGES)
def test_help_describes_the_tool_not_its_history(tool, prefix, capsys):
    text = help_text(tool, prefix, capsys)
    # ("pki issue" is a command; "issue" or "session" with a number after it is history)
    assert not re.search(r"\b(issue|session)s?\s*#?\d|\bitem\s+\d", text, re.IGNORECASE), text
    assert not re.search(r"20\d\d-\d\d-\d\d", text)  # no dated lab notes
    assert "load average" not in text
    assert len(text.splitlines()) <= 60


def test_controller_help_lists_commands_and_defaults(capsys):
    text = help_text("terra-controller", [], capsys)
    for word in ("pki", "ctl", "--log-level", "--version"):
        assert word in text
    flat = " ".join(text.split())
    for default in ("127.0.0.1:6700", "127.0.0.1:6701", "127.0.0.1:8080", "(default: 0.1)",
                    "(default: 6653)", "(default: 4)"):  # fmt: skip
        assert default in flat, default


def test_ctl_help_lists_every_operation_and_its_operands(capsys):
    text = help_text("terra-controller", ["ctl"], capsys)
    for op in controller_cli.CTL_OPS:
        assert op in text
    for op, (_, operands) in controller_cli.CTL_OPS.items():
        page = help_text("terra-controller", ["ctl", op], capsys)
        assert f"terra-controller ctl {op}" in page
        for operand in operands:
            assert operand in page
    capacity = help_text("terra-controller", ["ctl", "capacity"], capsys)
    assert "bytes per second" in capacity


def test_ctl_operands_are_checked_by_argparse(capsys):
    code, _, err = run_main("terra-controller", ["ctl", "--insecure", "status", "x"], capsys)
    assert code == 2 and "invalid int value: 'x'" in err
    code, _, err = run_main("terra-controller", ["ctl", "--insecure", "link-down", "LA"], capsys)
    assert code == 2 and "B" in err
    code, _, err = run_main("terra-controller", ["ctl", "--insecure", "reboot"], capsys)
    assert code == 2 and "invalid choice: 'reboot'" in err
    code, _, err = run_main("terra-controller", ["ctl", "list"], capsys)
    assert code == 2 and "--pki DIR --name NAME" in err  # neither PKI nor --insecure


def test_ctl_parses_operands_into_typed_fields():
    args = controller_cli.build_parser().parse_args(
        ["ctl", "--api", "10.0.0.1:7000", "--insecure", "capacity", "LA", "NY", "1.25e8"]
    )
    assert (args.command, args.op, args.a, args.b) == ("ctl", "capacity", "LA", "NY")
    assert args.bytes_per_s == 1.25e8 and args.api == [("10.0.0.1", 7000)]


def test_ctl_unreachable_controller_exits_1(capsys):
    code, _, err = run_main(
        "terra-controller", ["ctl", "--insecure", "--api", "127.0.0.1:1", "list"], capsys
    )
    assert code == 1 and "unreachable" in err


def test_controller_run_needs_topology_and_auth(capsys):
    code, _, err = run_main("terra-controller", ["--insecure"], capsys)
    assert code == 2 and "--topology" in err
    code, _, err = run_main("terra-controller", ["--topology", "swan"], capsys)
    assert code == 2 and "--pki --insecure" in err


def test_pki_commands_write_files(tmp_path, capsys):
    code, out, _ = run_main("terra-controller", ["pki", "init", str(tmp_path / "p")], capsys)
    assert code == 0 and "ca.crt" in out
    code, out, _ = run_main(
        "terra-controller", ["pki", "issue", str(tmp_path / "p"), "--role", "agent", "hk1"], capsys
    )
    assert code == 0 and "hk1.crt" in out and (tmp_path / "p" / "hk1.key").exists()
    code, _, err = run_main("terra-controller", ["pki", "init", str(tmp_path / "p")], capsys)
    assert code == 2 and "terra-controller pki:" in err  # the CA exists already


def test_setup_logging_uses_the_shared_format():
    stream = io.StringIO()
    cli_support.setup_logging("INFO", stream=stream)  # conftest restores the root logger
    logging.getLogger("terra.test").info("hello %d", 7)
    logging.getLogger("terra.test").debug("hidden")
    line = stream.getvalue().strip()
    assert LOG_FORMAT == "%(asctime)s %(name)s %(levelname)s %(message)s"
    assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} terra\.test INFO hello 7", line)
    with pytest.raises(ValueError):
        cli_support.setup_logging("LOUD")


def test_default_log_stream_follows_sys_stderr(capsys):
    """The handler writes to sys.stderr as it is at each record, not as it was at setup."""
    cli_support.setup_logging("WARNING")
    logging.getLogger("terra.test").warning("first")
    assert "terra.test WARNING first" in capsys.readouterr().err
    replaced = io.StringIO()
    saved, sys.stderr = sys.stderr, replaced
    try:
        logging.getLogger("terra.test").warning("second")
    finally:
        sys.stderr = saved
    assert "terra.test WARNING second" in replaced.getvalue()


class _Stream(io.StringIO):
    def __init__(self, tty: bool) -> None:
        super().__init__()
        self.tty = tty

    def isatty(self) -> bool:
        return self.tty


def test_progress_bar_only_on_a_terminal():
    quiet = _Stream(tty=False)
    with progress(10, "x", stream=quiet) as bar:
        bar.update(3)
    assert quiet.getvalue() == ""
    tty = _Stream(tty=True)
    with progress(10, "terra", unit="coflow", stream=tty) as bar:
        bar.update(10)
    assert "terra" in tty.getvalue() and "10/10" in tty.getvalue()


def test_missing_extra_names_the_extra():
    with pytest.raises(MissingExtra, match=r"pip install 'terra\[plots\]'"):
        require("terra_no_such_module_xyz", "plots")
    assert require("json", "plots").dumps([1]) == "[1]"


def test_sim_delta_reaches_the_policy_and_the_json():
    args = sim_cli.build_parser().parse_args(
        ["--topology", "swan", "--workload", "fb", "--delta", "0.3"]
    )
    from topologies import load_topology

    policy = sim_cli.make_policy("terra", load_topology("swan"), args)
    assert policy.delta == 0.3
    assert sim_cli.run_meta(args)["delta"] == 0.3
    assert sim_cli.build_parser().parse_args(["--topology", "s", "--workload", "w"]).delta == 0.1


def test_sim_unreadable_workload_exits_1_with_a_clear_message(tmp_path, capsys):
    for missing in (tmp_path / "missing.json", tmp_path / "missing.txt", tmp_path):
        code, _, err = run_main(
            "terra-sim", ["--topology", "swan", "--workload", str(missing)], capsys
        )
        assert code == 1, (missing, err)
        lines = err.strip().splitlines()
        assert len(lines) == 1 and str(missing) in lines[0] and "cannot read" in lines[0]
    bad = tmp_path / "bad.json"
    bad.write_text('{"coflows": 3}')  # readable but invalid: still a usage error
    code, _, _ = run_main("terra-sim", ["--topology", "swan", "--workload", str(bad)], capsys)
    assert code == 2


def test_agent_creates_a_missing_spill_dir_0700(tmp_path, capsys):
    spill = tmp_path / "spill" / "agent1"
    base = ["--controller", "h:1", "--dc", "HK", "--id", "a", "--data-addr", "h:2", "--insecure"]
    # A missing data root stops the agent right after the spill dir was made.
    code = agent_cli.main([*base, "--spill-dir", str(spill), "--data-root", str(tmp_path / "x")])
    assert code == 2 and "data root" in capsys.readouterr().err
    assert spill.is_dir() and (spill.stat().st_mode & 0o777) == 0o700
    blocker = tmp_path / "file"
    blocker.write_text("")
    assert agent_cli.main([*base, "--spill-dir", str(blocker / "d")]) == 1
    assert "spill dir" in capsys.readouterr().err
    existing = tmp_path / "existing"
    existing.mkdir(mode=0o755)
    agent_cli.make_spill_dir(str(existing))  # an existing directory is left as it is
    assert (existing.stat().st_mode & 0o777) == 0o755


@pytest.mark.parametrize("tool", list(MAINS))
def test_console_scripts_answer_version_and_help(tool):
    module = {
        "terra-controller": "terra_controller.cli",
        "terra-agent": "terra_agent.cli",
        "terra-sim": "terra_sim.cli",
        "terra-testbed": "mininet_scenarios.cli",
        "terra-job": "terra_controller.job_cli",
    }[tool]
    done = subprocess.run(
        [sys.executable, "-m", module, "--help"], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert not re.search(r"\bissues?\s+#?\d", done.stdout, re.IGNORECASE)
    assert "--version" in done.stdout


def test_a_crashed_controller_leaves_its_tracebacks_in_its_log(tmp_path):
    """A fatal signal (a crash in compiled code, here SIGSEGV sent to it) makes the running
    controller write every thread's Python traceback to stderr before it dies, so its log
    says where it died instead of ending mid-line."""
    import signal

    from benchmarks.loopback_system import ControllerProcess

    log = tmp_path / "controller.log"
    ctl = ControllerProcess("swan", log=log)
    try:
        ctl.proc.send_signal(signal.SIGSEGV)
        assert ctl.proc.wait(timeout=30) == -signal.SIGSEGV
    finally:
        ctl.stop()
    text = log.read_text()
    assert "Fatal Python error: Segmentation fault" in text
    assert "Current thread" in text and 'File "' in text
