"""Shared fixtures, and the tiers: tests/unit (one process), tests/integration (real processes
or agents on loopback), tests/system (Open vSwitch and Mininet); each test is marked with its tier.

`ovs`: a test needs root, Open vSwitch (started here if installed but not running) and
Debian's Mininet (mnexec). Such tests skip only when not root or when OVS/Mininet is not
installed; CI runs as root with both (.ci/run installs them), so they run there.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess

import pytest

OVS_CTL = "/usr/share/openvswitch/scripts/ovs-ctl"


@pytest.fixture(autouse=True)
def _keep_root_logger():
    """Tests that call a tool's main() in-process configure the root logger
    (cli_support.setup_logging); put its handlers and level back afterwards."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    for handler in root.handlers:
        if handler not in handlers:
            root.removeHandler(handler)
    for handler in handlers:
        if handler not in root.handlers:
            root.addHandler(handler)
    root.setLevel(level)


@pytest.fixture(autouse=True)
def _own_state_directory(tmp_path_factory, monkeypatch):
    """Every controller a test starts as a process keeps its coflow journal in a directory
    of that test (terra-controller reads $STATE_DIRECTORY), not in the user's."""
    monkeypatch.setenv("STATE_DIRECTORY", str(tmp_path_factory.mktemp("state")))


TIERS = ("unit", "integration", "system")


def pytest_collection_modifyitems(config, items):
    """Mark every test with its tier, the directory it is in (tests/unit, tests/integration,
    tests/system): `pytest -m unit` runs the fast tier alone."""
    for item in items:
        tier = item.path.parent.name
        if tier not in TIERS:
            raise pytest.UsageError(f"{item.nodeid}: tests live in tests/{{{','.join(TIERS)}}}/")
        item.add_marker(getattr(pytest.mark, tier))
        if tier == "system" or "ovs" in getattr(item, "fixturenames", ()):
            # Mininet and Open vSwitch are one per machine: such tests share one worker when
            # the suite runs in parallel (pytest-xdist, --dist loadgroup).
            item.add_marker(pytest.mark.xdist_group("ovs"))


@pytest.fixture(scope="session")
def ovs():
    """Make sure OVS is running; skip when not root or OVS/Mininet are not installed."""
    if os.geteuid() != 0:
        pytest.skip("needs root (Open vSwitch, Mininet)")
    if not shutil.which("ovs-vsctl") or not os.path.exists(OVS_CTL):
        pytest.skip("Open vSwitch is not installed (apt-get install openvswitch-switch)")
    if not shutil.which("mnexec"):
        pytest.skip("Mininet is not installed (apt-get install mininet)")
    if subprocess.run([OVS_CTL, "status"], capture_output=True).returncode != 0:
        subprocess.run([OVS_CTL, "start", "--system-id=random"], capture_output=True)
    subprocess.run(["ovs-vsctl", "--timeout=10", "show"], check=True, capture_output=True)


@pytest.fixture(scope="session")
def pki(tmp_path_factory):
    """A PKI directory for the whole session: CA, controller, jobs job1/job2, operator1 and
    the agents of tests/tls_helpers.AGENTS (tls_helpers.ensure issues more)."""
    from tls_helpers import make_pki

    return make_pki(tmp_path_factory.mktemp("pki"))
