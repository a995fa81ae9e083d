"""The operator's web page in a real browser: a live system on loopback, headless Chromium.

`PageSession` starts terra-controller --no-openflow on SWAN with mutual TLS (a fresh
PKI) and --rest-public (the browser has no client certificate; it is told to accept the
controller's certificate from that fresh CA), two real terra-agent processes (hk1 in HK,
la1 in LA), and Debian's chromium driven by Selenium through the system chromedriver
(nothing is downloaded). tests/integration/test_web_page.py asserts on it; run as a script it
replays the same scenario and saves the screenshots to docs/img/:

    1. every SWAN link capped at 2 MB/s (operator API "capacity"), a 200 kB coflow that
       finishes and a 400 MB coflow that keeps running, the page open;
    2. link HK-LA set down (operator API "link_state"), tunnels HK -> LA selected.

    3. the coflow view of the running coflow, opened by clicking a link of the map it uses
       and then the coflow in that link's list (web_page.png shows it).

`map_session` loads a built-in topology (swan, gscale, att) with control-protocol agents in
every DC (benchmarks/loopback_system.FakeAgent: no bytes move) and coflows between many DC
pairs, so that most links carry an allocation and a label: web_page_map_<topology>.png (the
map panel only).

It also prints the page weight: the bytes the browser fetched for the page's own files
(document, app.js, style.css; Resource Timing transferSize), target under 200 kB.

Run: uv run python benchmarks/web_page.py [--out docs/img] [--weight (the weight alone)]
Needs: apt-get install chromium chromium-driver (scripts/install.sh).
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from benchmarks.loopback_system import ControllerProcess, FakeAgent, start_agents, stop_all
from mininet_scenarios.browser import browser_missing, start_browser

SWAN_LINKS = [("HK", "LA"), ("HK", "NY"), ("LA", "NY"), ("LA", "FL"), ("NY", "FL"),
              ("NY", "BA"), ("FL", "BA")]  # fmt: skip
AGENTS = [("hk1", "HK", "127.0.0.1"), ("la1", "LA", "127.0.0.1")]
LINK_CAP = 2e6  # bytes/s on every link while the page is looked at
LOG_INFO = ["--log-level", "INFO"]  # the controller's log names every handshake not done
APP_WAIT_S = 20.0  # the page's script runs within this after a load, or the page is loaded again
SMALL, BIG = 200_000, 400_000_000  # bytes (BIG runs > 100 s at the capped rates)


class PageDriver:
    """The operator page open in a browser, driven as a user would: waits, table rows,
    clicks, the map's links, screenshots.

    Args:
        driver: a Selenium WebDriver with the page loaded (browser.start_browser).
        ctl: anything with `get(path)` returning a REST route's decoded JSON (the page's
            content is compared with it).
    """

    def __init__(self, driver, ctl) -> None:
        self.driver, self.ctl = driver, ctl

    @staticmethod
    def wait(predicate, timeout: float, what: str = "condition") -> None:
        """Poll `predicate` every 0.1 s; TimeoutError after `timeout` seconds."""
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            try:
                if predicate():
                    return
            except Exception:  # the page may be redrawing: ask again
                pass
            time.sleep(0.1)
        raise TimeoutError(f"{what} not seen within {timeout} s")

    def updates(self) -> int:
        """How many polls the page has drawn (body data-updated)."""
        return int(self.driver.find_element("tag name", "body").get_attribute("data-updated")
                   or 0)  # fmt: skip

    def wait_updates(self, n: int = 2, timeout: float = 60) -> None:
        """Wait until the page has drawn `n` more polls."""
        start = self.updates()
        try:
            self.wait(lambda: self.updates() >= start + n, timeout, f"{n} page updates")
        except TimeoutError as exc:
            raise TimeoutError(f"{exc}; {self.page_state()}{self.log_excerpt()}") from None

    def log_excerpt(self) -> str:
        """What the controller logged about its connections, for a failure message ("" when
        the driver has no controller log to read)."""
        return ""

    def page_state(self) -> str:
        """What the browser shows of the page, for a failure message: its connection line
        ("updated ..." or why the last poll failed), document.readyState, whether app.js
        ran, and the first 3 and last 9 resources it fetched with their HTTP status (0: no
        reply)."""
        try:
            return str(self.js(
                "return {conn: document.getElementById('conn').textContent,"
                " ready: document.readyState, app: typeof poll,"
                " fetched: ((e) => [...e.slice(0, 3), ...e.slice(3).slice(-9)])("
                "performance.getEntriesByType('resource')).map("
                "e => e.name.replace(location.origin, '') + ' ' + e.responseStatus)};"
            ))  # fmt: skip
        except Exception as exc:  # the browser itself may be what is stuck
            return f"(page unreadable: {type(exc).__name__}: {exc})"

    def js(self, script: str):
        """Run `script` in the page and return its value."""
        return self.driver.execute_script(script)

    def rows(self, table: str) -> list[dict]:
        """The rows of a page table (#links, #tunnels, #coflows): data attributes and cells."""
        return self.js(
            f"return [...document.querySelectorAll('#{table} tbody tr')].map(r => "
            "({data: {...r.dataset}, cells: [...r.cells].map(c => c.textContent)}));"
        )

    def select_pair(self, src: str, dst: str) -> None:
        """Choose the DC pair of the tunnel table (as a user would, firing change)."""
        from selenium.webdriver.support.ui import Select

        Select(self.driver.find_element("id", "tunnel-src")).select_by_value(src)
        Select(self.driver.find_element("id", "tunnel-dst")).select_by_value(dst)

    def click(self, css: str) -> None:
        """Click the element `css` selects where a user would (its centre), as a mouse does.
        The page redraws every second: an element replaced between finding it and moving to
        it (StaleElementReferenceException, raised before any click) is found again."""
        from selenium.common.exceptions import StaleElementReferenceException
        from selenium.webdriver.common.action_chains import ActionChains

        for attempt in range(5):
            element = self.driver.find_element("css selector", css)
            try:
                ActionChains(self.driver).move_to_element(element).click().perform()
                return
            except StaleElementReferenceException:
                if attempt == 4:
                    raise

    def busy_link(self, coflow: int) -> str:
        """A link ("A>B") REST /links says `coflow` has a rate on now (waits up to 30 s)."""
        found: list[str] = []

        def on_a_link() -> bool:
            found[:] = [f"{x['a']}>{x['b']}" for x in self.ctl.get("/links")["links"]
                        if coflow in x["coflows"]]  # fmt: skip
            return bool(found)

        self.wait(on_a_link, 30, f"coflow {coflow} on a link")
        return found[0]

    def open_coflow_from_map(self, coflow: int) -> str:
        """Click a link of the map `coflow` uses, then the coflow in the link's list: the
        coflow view opens. Returns the link clicked."""
        link = self.busy_link(coflow)
        self.click_link(link, coflow)
        self.open_listed_coflow(coflow)
        return link

    def click_link(self, link: str, coflow: int, timeout: float = 45) -> None:
        """Click `link` ("A>B") on the map (unless it is the link selected already: a second
        click unselects it); wait until its list of coflows shows `coflow`.

        Raises:
            TimeoutError: `coflow` not listed within `timeout` seconds.
        """
        if self.js("return state.selectedLink") != link:
            self.click(f'#wan line.hit[data-link="{link}"]')
        button = f'#link-coflows button[data-coflow="{coflow}"]'
        self.wait(lambda: self.driver.find_element("css selector", button).is_displayed(),
                  timeout, "the link's coflow list")  # fmt: skip

    def open_listed_coflow(self, coflow: int, tries: int = 3) -> None:
        """Click `coflow` in the clicked link's list; wait until its view shows its flows.

        The list is redrawn every poll (sorted ids): a coflow joining the link between the
        pointer's move and its click shifts the buttons, and the click opens a neighbour, as
        it would for a person. Then the button is clicked again (`tries` clicks at most).

        Raises:
            TimeoutError: no flows shown, or another coflow's view after `tries` clicks.
        """
        title = self.driver.find_element("id", "coflow-title")
        for _ in range(tries):
            self.click(f'#link-coflows button[data-coflow="{coflow}"]')
            self.wait(lambda: self.rows("coflow-flows"), 45, "the coflow's flows")
            if title.text == str(coflow):
                return
        raise TimeoutError(f"coflow {coflow}'s view not opened in {tries} clicks ({title.text})")

    def sign_in(self, token: str, topology: str, timeout: float = 60) -> None:
        """Sign in with an operator token (`terra-controller ctl login`) in the page's login
        box, as an operator pastes it; wait until the page shows `topology`'s data.

        Raises:
            TimeoutError: no login box, or no data after signing in, within `timeout` s.
        """
        self.wait(lambda: self.driver.find_element("id", "login").is_displayed(), timeout,
                  "the login box")  # fmt: skip
        self.driver.find_element("id", "login-token").send_keys(token)
        self.driver.find_element("id", "login-button").click()
        self.wait(lambda: self.driver.find_element("id", "topology-name").text == topology,
                  timeout, "the page's data")  # fmt: skip

    def panel_screenshot(self, panel: str, path: Path) -> Path:
        """Save a PNG of one panel of the page (`#panel-<panel>`) to `path`."""
        self.driver.find_element("id", f"panel-{panel}").screenshot(str(path))
        return path

    def page_weight(self) -> dict[str, int]:
        """Bytes the browser fetched for the page's own files (the document and /static/*,
        not the JSON it polls), per path and "total": Navigation and Resource Timing's
        transferSize (body as sent plus response headers; 0 when served from the cache, so
        measure on a fresh load)."""
        entries = self.js(
            "return [...performance.getEntriesByType('navigation'),"
            " ...performance.getEntriesByType('resource')]"
            ".map(e => [new URL(e.name).pathname, e.transferSize]);"
        )
        own = {path: size for path, size in entries if path == "/" or path.startswith("/static/")}
        return {**own, "total": sum(own.values())}

    def label_overlaps(self) -> list:
        """Pairs of link labels (#wan text.load) whose boxes on screen overlap, and labels
        drawn smaller than 10 px: [] when every label is readable."""
        return self.js("""
            const boxes = [...document.querySelectorAll('#wan text.load')].map(t =>
              [t.dataset.link, t.getBoundingClientRect()]);
            const bad = [];
            for (const [k, b] of boxes) if (b.height < 10) bad.push([k, 'height', b.height]);
            for (let i = 0; i < boxes.length; i++) for (let j = i + 1; j < boxes.length; j++) {
              const [p, a] = boxes[i], [q, b] = boxes[j];
              if (a.left < b.right && b.left < a.right && a.top < b.bottom && b.top < a.bottom)
                bad.push([p, q]);
            }
            return bad;""")

    def screenshot(self, path: Path) -> Path:
        """Save a PNG of the whole page to `path` (the window grown to the page's height)."""
        height = self.js("return document.documentElement.scrollHeight")
        self.driver.set_window_size(1400, min(4000, height + 140))
        self.driver.save_screenshot(str(path))
        return path


class PageSession(PageDriver):
    """Controller + agents + browser on the page; use as a context manager.

    Args:
        workdir: directory for the agents' logs and spill files.

    Attributes:
        ctl: the ControllerProcess. client: an operator TerraClient. driver: the WebDriver.
        small, big: the two coflows' ids.
    """

    def __init__(self, workdir: Path) -> None:
        self.workdir = Path(workdir)
        self.ctl = ControllerProcess("swan", extra=["--rest-public", *LOG_INFO],
                                     log=self.workdir / "ctl.log")  # fmt: skip
        self.procs, self.driver, self.client = [], None, None
        try:
            self.procs = start_agents(self.ctl, AGENTS, self.workdir, tunnels=4)
            self.ctl.wait_agents(len(AGENTS))
            self.client = self.ctl.client()
            for a, b in SWAN_LINKS:
                self.client.set_capacity(a, b, LINK_CAP)
            self.small = self.client.submit_coflow(
                [{"id": "s", "src": "hk1", "dst": "la1", "bytes": SMALL}]
            )
            self.big = self.client.submit_coflow(
                [{"id": "b", "src": "hk1", "dst": "la1", "bytes": BIG}], deadline=3600
            )
            self.wait(lambda: self.client.check_status(self.small)["state"] == "done", 60)
            self.open_page()
        except BaseException:
            self.close()
            raise

    def log_excerpt(self) -> str:
        """The controller log's last 15 lines about connections (handshakes not done,
        refusals, evictions, REST), prefixed "; controller log: "."""
        try:
            lines = (self.workdir / "ctl.log").read_text(errors="replace").splitlines()
        except OSError as exc:
            return f"; controller log unreadable: {exc}"
        words = ("authenticated", "refused", "evicted", "REST", "rest", "handshake")
        picked = [line for line in lines if any(w in line for w in words)][-15:]
        return "; controller log: " + " | ".join(picked)

    def open_page(self) -> None:
        """Start the browser on the controller's page; if its script has not run within
        APP_WAIT_S (a file of it failed with ERR_NETWORK_CHANGED: Chromium fails the requests
        waiting for a connection whenever an address of the machine's network namespace
        changes, as Mininet's interfaces do while tests/system runs: tests/conftest.py keeps
        the browser tests apart from it), start a new browser on the page and keep what the
        first load showed in `first_load` (None when one load was enough)."""
        self.driver = start_browser()
        self.driver.get(self.ctl.rest + "/")
        self.first_load = None
        try:
            self.wait(lambda: self.js("return typeof poll") == "function", APP_WAIT_S)
        except TimeoutError:
            self.first_load = self.page_state() + self.log_excerpt()
            print(f"web page: the first load did not run app.js: {self.first_load}")
            self.driver.quit()
            self.driver = start_browser()
            self.driver.get(self.ctl.rest + "/")

    def __enter__(self) -> PageSession:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        """Quit the browser, cancel the running coflow, stop agents and controller."""
        if self.driver is not None:
            self.driver.quit()
            self.driver = None
        if self.client is not None:
            try:
                self.client.cancel_coflow(self.big)
            except Exception:
                pass
            self.client.close()
            self.client = None
        stop_all(self.procs)
        self.ctl.stop()


class MapSession(PageSession):
    """A controller on `topology` (more command-line arguments in `extra`) with a FakeAgent
    in every DC, a coflow from each DC to the DC `stride` positions on (in the topology's
    order) and the page open; a context manager like PageSession (attributes ctl, client,
    driver; agents: the FakeAgents)."""

    def __init__(self, workdir: Path, topology: str, stride: int = 3, extra=()) -> None:
        self.workdir = Path(workdir)
        self.ctl = ControllerProcess(topology, extra=["--rest-public", *LOG_INFO, *extra],
                                     log=self.workdir / "ctl.log")  # fmt: skip
        self.procs, self.driver, self.client, self.agents, self.big = [], None, None, [], None
        try:
            dcs = self.ctl.get("/topology")["dcs"]
            self.agents = [FakeAgent(self.ctl, f"a{i}", dc, complete=False)
                           for i, dc in enumerate(dcs)]  # fmt: skip
            self.ctl.wait_agents(len(dcs))
            self.client = self.ctl.client()
            for i in range(len(dcs)):
                dst = (i + stride) % len(dcs)
                self.client.submit_coflow([{"id": "f", "src": f"a{i}", "dst": f"a{dst}",
                                            "bytes": BIG}])  # fmt: skip
            self.open_page()
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        """PageSession.close, and the fake agents' connections."""
        for agent in self.agents:
            agent.close()
        super().close()


def main() -> None:
    """Replay the scenario and save docs/img/web_page.png and web_page_link_down.png."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=Path(__file__).resolve().parent.parent / "docs"
                   / "img")  # fmt: skip
    p.add_argument("--weight", action="store_true",
                   help="only print the page weight (its own files), no screenshots")  # fmt: skip
    args = p.parse_args()
    reason = browser_missing()
    if reason:
        raise SystemExit(f"web_page.py: {reason}")
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="terra-web-") as tmp, PageSession(Path(tmp)) as s:
        s.wait_updates(2)
        weight = s.page_weight()
        print(f"page weight: {weight['total'] / 1000:.1f} kB (target < 200 kB): {weight}")
        if args.weight:
            return
        s.wait_updates(2)
        s.open_coflow_from_map(s.big)
        s.wait_updates(6)
        print(s.screenshot(args.out / "web_page.png"))
        s.client.set_link_state("HK", "LA", False)
        s.select_pair("HK", "LA")
        s.wait_updates(3)
        print(s.screenshot(args.out / "web_page_link_down.png"))
    for topology in ("swan", "gscale", "att"):
        with (
            tempfile.TemporaryDirectory(prefix="terra-web-") as tmp,
            MapSession(Path(tmp), topology) as s,
        ):
            s.wait_updates(3)
            labels = s.js("return document.querySelectorAll('#wan text.load').length")
            path = args.out / f"web_page_map_{topology}.png"
            s.driver.find_element("id", "panel-wan").screenshot(str(path))  # the map only
            print(path, f"{labels} labels, overlaps: {s.label_overlaps()}")


if __name__ == "__main__":
    main()
