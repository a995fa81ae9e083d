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
from hypothesis import settings

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


@pytest.fixture(autouse=True, scope="module")
def _module_state_directory(tmp_path_factory):
    """Controllers started by a module's fixtures keep their coflow journal in a directory
    of that module, not in the user's (two workers' controllers would share it, and a
    controller would resume another module's coflows)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("STATE_DIRECTORY", str(tmp_path_factory.mktemp("module-state")))
        yield


@pytest.fixture(autouse=True)
def _own_state_directory(tmp_path_factory, monkeypatch):
    """Every controller a test starts as a process keeps its coflow journal in a directory
    of that test (terra-controller reads $STATE_DIRECTORY), not in the user's."""
    monkeypatch.setenv("STATE_DIRECTORY", str(tmp_path_factory.mktemp("state")))


# Hypothesis checks behaviour, not speed: with the suite on parallel workers of a shared
# machine, an example can take longer than the default 200 ms deadline.
settings.register_profile("terra-tests", deadline=None)
settings.load_profile("terra-tests")

TIERS = ("unit", "integration", "system")
# Open vSwitch and Mininet are one per machine: with the suite in parallel (pytest-xdist,
# addopts), every test of tests/system runs on one worker, one after the other, in
# collection order (so a module's tests, and its module-scoped Mininet, stay together).
# A module of tests/integration also stays on one worker (its module-scoped fixtures).
OVS_GROUP = "ovs"
MAX_WORKERS = 4  # each integration test runs a controller and agents: processes of their own
# Modules that drive headless Chromium join OVS_GROUP too: Mininet adds and removes interfaces
# and addresses in the machine's network namespace, Chromium takes each change for a network
# change and fails every request still waiting for a connection with ERR_NETWORK_CHANGED
# (never retried for a page's subresources: app.js not loaded, the page's script never ran).
BROWSER_MODULES = ("tests/integration/test_web_page.py", "tests/integration/test_console_login.py")


def pytest_collection_modifyitems(config, items):
    """Mark every test with its tier, the directory it is in (tests/unit, tests/integration,
    tests/system): `pytest -m unit` runs the fast tier alone. A test outside tests/system must
    not use the `ovs` fixture (the parallel run keeps only tests/system on one worker)."""
    for item in items:
        tier = item.path.parent.name
        if tier not in TIERS:
            raise pytest.UsageError(f"{item.nodeid}: tests live in tests/{{{','.join(TIERS)}}}/")
        if tier != "system" and "ovs" in getattr(item, "fixturenames", ()):
            raise pytest.UsageError(f"{item.nodeid}: tests using Open vSwitch go in tests/system/")
        item.add_marker(getattr(pytest.mark, tier))


def pytest_xdist_auto_num_workers(config):
    """`-n auto`: two workers per usable CPU, at most MAX_WORKERS. Most integration and system
    tests wait on real processes (start-up, bytes at the links' rates, timeouts), so two per
    CPU overlap those waits (docs/results.md 6: 263 s on 4 workers, 346 s on 2, 2 cores)."""
    return max(1, min(2 * len(os.sched_getaffinity(0)), MAX_WORKERS))


def pytest_xdist_make_scheduler(config, log):
    """`--dist loadgroup`: tests/system is one work unit (OVS_GROUP) that one worker runs in
    collection order, with the browser modules (BROWSER_MODULES: never while Mininet changes
    interfaces); each module of tests/integration is one unit (its module-scoped
    fixtures start controllers, agents, etcd: split over two workers, each worker would start
    them again); every unit test is a unit of its own. Units go to whichever worker is free;
    xdist sends the largest units first, so the system tier (minutes) starts at once.

    The group is decided here, on the test's path in the controller process, not by an
    `xdist_group` mark: xdist renames the marked tests' ids, which pytest 9 no longer allows
    (the mark is silently ignored)."""
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class SystemTierOnOneWorker(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            if nodeid.startswith(("tests/system/", *BROWSER_MODULES)):
                return OVS_GROUP
            if nodeid.startswith("tests/integration/"):
                return nodeid.split("::", 1)[0]  # the module
            return nodeid

    return SystemTierOnOneWorker(config, log)


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
