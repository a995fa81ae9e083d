"""The operator console in headless Chromium during a real transfer on the SWAN testbed.

`terra-testbed swan --quick --no-failure --coflows 12 --link-mbps 2 --load 40` (Mininet, Open
vSwitch, five real agents moving real bytes on 2 Mbit/s links) runs as a subprocess. Once
its agents are registered, an operator token comes from `terra-controller ctl login` (the
testbed's operator certificate), and Debian's chromium, driven by Selenium
through the system chromedriver, opens the page the testbed printed (REST of the
controller, in the root namespace) and signs in with the token, as an operator without a
client certificate does. Then, as a user: a link of the map carrying a coflow that moves
bytes, that coflow in the link's list, its view (flows, sender and receiver agents,
tunnels, rates, progress, compared with REST read over CA-verified TLS with the same
token), the agents and the event log. SIGTERM then ends the run mid-transfer (a second test,
on the same run; it runs without a browser too): everything the testbed started must be gone.

Screenshots of the panels go to $TERRA_SCREENSHOTS when set (docs/img/testbed_console_*.png
come from `TERRA_SCREENSHOTS=docs/img`), else to the test's temporary directory. The
click-through skips when chromium / chromium-driver are missing; both tests skip without
root, Open vSwitch or Mininet.
"""

from __future__ import annotations

import json
import os
import re
import signal
import ssl
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest
from test_testbed_runs import OUR_BRIDGES, _bridges, _processes_mentioning

from benchmarks.web_page import PageDriver
from mininet_scenarios.browser import browser_missing, start_browser

pytestmark = pytest.mark.ovs

# 12 coflows at load 40 on 2 Mbit/s links: Terra's run of them lasts about 4 minutes (at
# load 8 it took 44 s, and a machine loaded by two busy processes clicked through for longer
# than that), so coflows keep moving while a loaded machine's browser clicks through several
# of them in turn, at a fifth of the packets a second of 10 Mbit/s links (Open vSwitch's
# userspace datapath spent 54 CPU s on this test at 10 Mbit/s). SIGTERM ends the run once
# the test is done: its length does not add to the test's.
TESTBED_ARGS = ["swan", "--quick", "--no-failure", "--coflows", "12", "--link-mbps", "2",
                "--load", "40", "--timeout", "900"]  # fmt: skip
TOPOLOGY = "swan-testbed"  # the testbed topology's name, shown in the page's header
DCS = {"HK", "LA", "NY", "FL", "BA"}
CONSOLE_RE = re.compile(r"operator page (\S+)/ .*--api (\S+) --pki (\S+) --name (\S+) login")
BRING_UP_S = 150  # controller, Mininet, tunnel rules, five agents (a loaded 2-core machine)
STEP_S = 60  # each step of the click-through
IDLE = ("–", "0 B/s")
ATTEMPTS = 6  # coflows tried in turn (click_through_a_moving_coflow)


class SwanRun:
    """`terra-testbed swan` as a subprocess; its output lines are collected by a thread."""

    def __init__(self, workdir: Path) -> None:
        self.lines: list[str] = []
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "mininet_scenarios.cli", *TESTBED_ARGS,
             "--workdir", str(workdir)],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )  # fmt: skip
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))

    def output(self) -> str:
        return "\n".join(self.lines)

    def wait_line(self, pattern: re.Pattern | str, timeout: float) -> re.Match:
        """The first output line matching `pattern`; fails when the testbed exits first or
        after `timeout` seconds."""
        pattern = re.compile(pattern)
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            for line in list(self.lines):
                found = pattern.search(line)
                if found:
                    return found
            if self.proc.poll() is not None and not self.reader.is_alive():
                pytest.fail(f"terra-testbed exited ({self.proc.returncode}):\n{self.output()}")
            time.sleep(0.2)
        pytest.fail(f"no line {pattern.pattern!r} within {timeout} s:\n{self.output()}")

    def stop(self, timeout: float = 90) -> int:
        """SIGTERM (the testbed tears everything down and exits 130); its exit status.
        SIGKILL only if it did not exit within `timeout` seconds."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.reader.join(timeout=10)
        return self.proc.returncode


class TokenRest:
    """REST of the controller as the page reads it: CA-verified TLS, no client certificate,
    the operator's token as Bearer."""

    def __init__(self, rest: str, ca: Path, token: str) -> None:
        self.rest, self.token = rest, token
        self.context = ssl.create_default_context(cafile=str(ca))
        self.context.check_hostname = False  # the URL names 127.0.0.1; the CA is checked

    def get(self, path: str):
        request = urllib.request.Request(
            self.rest + path, headers={"Authorization": f"Bearer {self.token}"}
        )
        with urllib.request.urlopen(request, timeout=10, context=self.context) as reply:
            return json.loads(reply.read())


def ctl_login(api: str, pki: str, name: str) -> str:
    """The operator token `terra-controller ctl login` prints."""
    out = subprocess.run(
        [sys.executable, "-m", "terra_controller.cli", "ctl", "--api", api, "--pki", pki,
         "--name", name, "login"],
        capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    granted = json.loads(out.stdout)
    assert granted["role"] == "operator"
    return granted["token"]


def moving_coflows(rest: TokenRest) -> list[int]:
    """Running coflows that have delivered bytes and have a rate on some link now, the ones
    with the most bytes left first (they keep moving longest while the page is looked at)."""
    on_links = {c for x in rest.get("/links")["links"] for c in x["coflows"]}
    rows = [
        c
        for c in rest.get("/coflows")
        if c["state"] == "running" and c["bytes_delivered"] > 0 and c["id"] in on_links
    ]
    rows.sort(key=lambda c: c["bytes_total"] - c["bytes_delivered"], reverse=True)
    return [c["id"] for c in rows]


def next_coflow(rest: TokenRest, tried: list[int]) -> int:
    """A moving coflow not tried yet (waits up to STEP_S seconds for one)."""
    found: list[int] = []

    def any_moving() -> bool:
        found[:] = [c for c in moving_coflows(rest) if c not in tried]
        return bool(found)

    PageDriver.wait(any_moving, STEP_S, "a running coflow moving bytes")
    return found[0]


def click_through_a_moving_coflow(page: PageDriver, rest: TokenRest, shots: Path) -> int:
    """The click-through of a coflow moving bytes now; returns that coflow.

    Terra's rounds preempt and finish coflows while the page is read: when the coflow
    chosen stops moving before a step has seen it (it finished, or a round gave it no rate
    on any link), the click-through starts over with another coflow, at most ATTEMPTS times.
    A step that fails while its coflow is still moving fails the test.
    """
    from selenium.common.exceptions import NoSuchElementException

    tried: list[int] = []
    for attempt in range(ATTEMPTS):
        coflow = next_coflow(rest, tried)
        tried.append(coflow)
        try:
            click_through(page, rest, coflow, shots)
            agents_and_events(page, rest, coflow, shots)
            return coflow
        except (TimeoutError, NoSuchElementException):
            if attempt == ATTEMPTS - 1 or coflow in moving_coflows(rest):
                raise
            print(f"coflow {coflow} stopped moving before the page showed it: another")
    raise AssertionError("unreachable")


def shots_dir(tmp_path: Path) -> Path:
    out = Path(os.environ.get("TERRA_SCREENSHOTS") or tmp_path / "shots")
    out.mkdir(parents=True, exist_ok=True)
    return out


@pytest.fixture(scope="module")
def transfer(ovs, tmp_path_factory):
    """The testbed run both tests use, its agents registered (coflows moving from then on);
    stopped with SIGTERM at the end if a test has not stopped it.

    Returns:
        (the SwanRun, its --workdir, the operator page's match of CONSOLE_RE).
    """
    work = tmp_path_factory.mktemp("console-testbed") / "work"
    testbed = SwanRun(work)
    try:
        console = testbed.wait_line(CONSOLE_RE, BRING_UP_S)
        testbed.wait_line("agents registered", BRING_UP_S)
        yield testbed, work, console
    finally:
        testbed.stop()


@pytest.mark.skipif(browser_missing() is not None, reason=str(browser_missing()))
def test_click_through_from_the_map_to_a_coflow_during_a_testbed_transfer(transfer, tmp_path):
    testbed, _, console = transfer
    shots = shots_dir(tmp_path)
    started = time.monotonic()
    driver = None
    try:
        rest_url, api, pki, operator = console.groups()
        token = ctl_login(api, pki, operator)
        rest = TokenRest(rest_url, Path(pki) / "ca.crt", token)
        driver = start_browser(1400, 1000)
        driver.get(rest_url + "/")
        page = PageDriver(driver, rest)
        page.sign_in(token, TOPOLOGY, STEP_S)
        coflow = click_through_a_moving_coflow(page, rest, shots)
        # Still a real transfer when the click-through ended: the coflow moved bytes and
        # is live or done (a round may have preempted it since: that is Terra's order).
        end = rest.get(f"/coflows/{coflow}")
        assert end["state"] in ("running", "preempted", "done"), end
        assert end["bytes_delivered"] > 0, end
        progress = f"coflow {coflow} at {100 * end['bytes_delivered'] / end['bytes_total']:.0f} %"
    finally:
        if driver is not None:
            driver.quit()
    assert testbed.proc.poll() is None, testbed.output()  # the transfer goes on
    print(
        f"console click-through on the testbed: {time.monotonic() - started:.0f} s "
        f"({progress} at its end), screenshots in {shots}"
    )


def test_sigterm_mid_run_tears_everything_down(transfer):
    """SIGTERM while the testbed's coflows move (after the click-through, or 1 s after the
    agents registered without a browser): exit status 130, no bridge or process left."""
    testbed, work, _ = transfer
    time.sleep(1.0)  # Terra's run under way
    assert testbed.proc.poll() is None, testbed.output()  # load 40: minutes of transfer left
    code = testbed.stop()
    assert code == 130, testbed.output()
    assert not (_bridges() & OUR_BRIDGES)
    assert _processes_mentioning(str(work)) == []


def click_busy_link(page: PageDriver, coflow: int, tries: int = 3) -> str:
    """Click a link of the map REST says `coflow` has a rate on, until the link's list
    shows it (a round may move the coflow off a link before the page shows it there; then
    another link); returns the link."""
    for last in [False] * (tries - 1) + [True]:
        link = page.busy_link(coflow)
        try:
            page.click_link(link, coflow, timeout=STEP_S / tries)
            return link
        except TimeoutError:
            if last:
                raise
    return link


def click_through(page: PageDriver, rest: TokenRest, coflow: int, shots: Path) -> None:
    """A link of the map the coflow uses, the coflow in the link's list, then its view:
    flows, agents and tunnels as REST has them, a current rate, progress climbing."""
    from selenium.common.exceptions import NoSuchElementException

    for last in (False, False, True):  # a redraw may take the coflow off the link before
        link = click_busy_link(page, coflow)  # its button is clicked: then another link
        title = page.driver.find_element("id", "link-title").text
        name = re.escape(link.replace(">", " → "))
        assert re.fullmatch(rf"Link {name}: (1 coflow with a rate|\d+ coflows with rates) on it",
                            title)  # fmt: skip
        page.panel_screenshot("wan", shots / "testbed_console_map.png")
        try:
            page.open_listed_coflow(coflow)
            break
        except NoSuchElementException:
            if last:
                raise
    assert page.driver.find_element("id", "coflow-title").text == str(coflow)

    def flows_agree() -> bool:
        # One REST read and one page read, compared: a round may move a flow between the
        # page's poll and ours, so this is asked again until both agree.
        flows = {f["id"]: f for f in rest.get(f"/coflows/{coflow}")["flows"]}
        rows = {r["data"]["flow"]: r for r in page.rows("coflow-flows")}
        if set(rows) != set(flows):
            return False
        moving = 0
        for fid, row in rows.items():
            f = flows[fid]
            cells = row["cells"]
            assert cells[1] == f"{f['src']} ({f['src_dc']}) → {f['dst']} ({f['dst_dc']})"
            if f["state"] != "running" or not f["paths"]:
                continue
            tunnels = [str(p["tunnel"]) for p in f["paths"]]
            if row["data"]["tunnels"].split(",") != tunnels:
                return False
            if not all(f"#{p['tunnel']} " + "→".join(p["path"]) in cells[2] for p in f["paths"]):
                return False
            delivered = cells[4].split(" / ")[0]
            moving += cells[3] not in IDLE and delivered not in ("0 B", "–")
        return moving >= 1

    page.wait(flows_agree, STEP_S, "the coflow's flows, agents, tunnels and rates as REST has them")
    summary = page.driver.find_element("id", "coflow-summary").text
    # (a coflow the starvation guard keeps on its reserve moves bytes as "preempted",
    # docs/design.md 4.2)
    assert summary.split(" · ")[0] in ("running", "preempted") and " flows · " in summary
    # Progress over time: a point per poll while bytes move, climbing (smaller y).
    page.wait(lambda: int(page.js(
        "return document.querySelector('#coflow-progress polyline').dataset.points")) >= 5,
        STEP_S, "five progress points")  # fmt: skip
    ys = page.js(
        "return document.querySelector('#coflow-progress polyline')"
        ".getAttribute('points').split(' ').map(p => Number(p.split(',')[1]))"
    )
    assert ys[-1] < ys[0]

    def listed_moving() -> bool:
        row = next(r for r in page.rows("coflows") if r["data"]["coflow"] == str(coflow))
        return row["data"]["state"] == "running" and row["cells"][3] not in IDLE

    page.wait(listed_moving, STEP_S, f"coflow {coflow} listed running with a rate")
    page.panel_screenshot("coflow", shots / "testbed_console_coflow.png")


def agents_and_events(page: PageDriver, rest: TokenRest, coflow: int, shots: Path) -> None:
    """The agents view (one per DC, connected, the coflow's senders sending) and the event
    log (every event REST has, newest first)."""
    page.wait_updates(1)
    senders = {f["src"] for f in rest.get(f"/coflows/{coflow}")["flows"]
               if f["state"] == "running"}  # fmt: skip

    def agents_shown() -> bool:
        agents = {r["data"]["agent"]: r["cells"] for r in page.rows("agents")}
        return (
            {cells[1] for cells in agents.values()} == DCS
            and all(cells[2] == "connected" for cells in agents.values())
            and any(int(agents[s][4]) >= 1 and str(coflow) in agents[s][6].split(", ")
                    for s in senders)
        )  # fmt: skip

    page.wait(agents_shown, STEP_S, "five connected agents, the coflow's senders sending")
    page.panel_screenshot("agents", shots / "testbed_console_agents.png")

    def events_shown() -> bool:
        events = rest.get("/events")["events"]
        shown = page.rows("events")
        return [int(r["data"]["seq"]) for r in shown] == [e["seq"] for e in reversed(events)] and [
            r["data"]["kind"] for r in shown
        ] == [e["kind"] for e in reversed(events)]

    page.wait(events_shown, STEP_S, "every event REST has, newest first")
    kinds = [r["data"]["kind"] for r in page.rows("events")]
    assert kinds.count("agent_registered") == len(DCS) and "admitted" in kinds
    page.panel_screenshot("events", shots / "testbed_console_events.png")
