"""Prometheus watching the SWAN testbed (`terra-testbed swan --observe`).

A real Prometheus (Debian's `prometheus`) runs in the root namespace for the whole
testbed run. It scrapes, every second, the controller's `/metrics` over mutual TLS (the
operator certificate of the testbed's PKI; the controller's name `terra-controller`) and
every agent's `/metrics` over the out-of-band management network (`terra-agent
--metrics MGMT_IP:AGENT_METRICS_PORT`), and evaluates deploy/prometheus/terra-rules.yml.
Targets come from file-based service discovery, so a controller restarted on another
port (one per scheduler) is followed without restarting Prometheus.

After the run `report()` asks Prometheus's HTTP API which targets were up, whether every
series the rules and the web page use has data, and which alerts went pending or fired
(the LA-NY failure raises TerraLinkDown).

`PageShots` opens the controller's operator page (REST `/`; the testbed's controller
then runs with `--rest-public`) in headless Chromium and saves screenshots while the
failure is on and after it, recording which links the page showed down and the load it
showed on each.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
import urllib.parse
import urllib.request
from pathlib import Path

from mininet_scenarios.ports import free_port

RULES = Path(__file__).resolve().parent.parent / "deploy" / "prometheus" / "terra-rules.yml"
AGENT_METRICS_PORT = 9101
SCRAPE_S = 1
# Series the rules (deploy/prometheus) and the web page read; each must have data.
CONTROLLER_SERIES = (
    "terra_round_duration_seconds_bucket", "terra_link_up",
    "terra_link_capacity_bytes_per_second", "terra_link_allocated_bytes_per_second",
    "terra_link_measured_bytes_per_second", "terra_coflows_finished_total",
    "terra_agent_connections", "terra_agents_registered",
)  # fmt: skip
AGENT_SERIES = ("terra_agent_link_sent_bytes_total", "terra_agent_tunnel_rate_bytes_per_second")


class ObserveError(RuntimeError):
    """Prometheus is missing, did not start, or its API did not answer."""


class Observer:
    """A Prometheus process scraping the testbed (module docstring).

    Args:
        workdir: where its configuration, targets and data go (workdir/prometheus).
        pki: the testbed's PKI directory (ca.crt and the operator's certificate).
        operator: the operator certificate's name.
        agents: {agent name: management IP} of the agents to scrape.

    Raises:
        ObserveError: prometheus is not installed or does not become ready in 30 s.
    """

    def __init__(self, workdir: Path, pki: Path, operator: str, agents: dict[str, str]):
        exe = shutil.which("prometheus")
        if exe is None:
            raise ObserveError("prometheus missing: apt-get install prometheus")
        self.dir = workdir / "prometheus"
        self.dir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.agents = agents
        self._write_targets("controller.json", [])
        self._write_targets("agents.json", [])
        config = self.dir / "prometheus.yml"
        config.write_text(_config(self.dir, pki, operator))
        self.log = open(self.dir / "prometheus.log", "w")  # noqa: SIM115 (closed in stop)
        self.proc = subprocess.Popen(
            [exe, f"--config.file={config}", f"--storage.tsdb.path={self.dir / 'data'}",
             f"--web.listen-address=127.0.0.1:{self.port}", "--log.level=warn"],
            stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
        self._wait_ready()

    def watch_controller(self, rest: str) -> None:
        """Scrape the controller at `rest` ("https://host:port") from now on."""
        self._write_targets("controller.json", [rest.removeprefix("https://")])

    def watch_agents(self) -> None:
        """Scrape the agents from now on (call once they are up)."""
        self._write_targets(
            "agents.json", [f"{ip}:{AGENT_METRICS_PORT}" for ip in self.agents.values()]
        )

    def report(self, settle_s: float = 3.0) -> dict:
        """What Prometheus saw (call after the run, before stop()).

        Returns:
            {"targets": {instance: "up" | "down" | ...} (last scrape of each),
             "series": {name: number of series with data}, "missing": [names without
             data], "alerts": {alert name: states seen ("pending", "firing")}}.

        Raises:
            ObserveError: the API did not answer.
        """
        time.sleep(settle_s)  # one more scrape of everything
        targets = self._get("/api/v1/targets")["activeTargets"]
        health = {t["labels"]["instance"]: t["health"] for t in targets}
        series = {}
        for name in (*CONTROLLER_SERIES, *AGENT_SERIES):
            series[name] = len(self._get("/api/v1/series", {"match[]": name, "start": "0"}))
        alerts: dict[str, list[str]] = {}
        found = self._get("/api/v1/series", {"match[]": "ALERTS", "start": "0"})
        for labels in found:
            states = alerts.setdefault(labels["alertname"], [])
            if labels["alertstate"] not in states:
                states.append(labels["alertstate"])
        return {"targets": health, "series": series,
                "missing": [n for n, count in series.items() if count == 0],
                "alerts": alerts}  # fmt: skip

    def stop(self) -> None:
        """Stop Prometheus (SIGTERM, then SIGKILL after 10 s) and close its log."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()

    def _write_targets(self, name: str, targets: list[str]) -> None:
        tmp = self.dir / f"{name}.tmp"
        tmp.write_text(json.dumps([{"targets": targets, "labels": {}}]))
        tmp.rename(self.dir / name)  # atomic: Prometheus never reads half a file

    def _wait_ready(self) -> None:
        end = time.monotonic() + 30
        while time.monotonic() < end:
            if self.proc.poll() is not None:
                raise ObserveError(f"prometheus exited (see {self.dir / 'prometheus.log'})")
            try:
                with urllib.request.urlopen(self.url + "/-/ready", timeout=2) as reply:
                    if reply.status == 200:
                        return
            except OSError:
                time.sleep(0.2)
        self.stop()
        raise ObserveError("prometheus not ready after 30 s")

    def _get(self, path: str, params: dict | None = None):
        query = f"?{urllib.parse.urlencode(params)}" if params else ""
        try:
            with urllib.request.urlopen(self.url + path + query, timeout=10) as reply:
                body = json.loads(reply.read())
        except (OSError, ValueError) as exc:
            raise ObserveError(f"prometheus API {path}: {exc}") from exc
        if body.get("status") != "success":
            raise ObserveError(f"prometheus API {path}: {body}")
        return body["data"]


def _config(directory: Path, pki: Path, operator: str) -> str:
    """prometheus.yml: two jobs from file-based discovery, our rules, 1 s scrapes."""
    return f"""global:
  scrape_interval: {SCRAPE_S}s
  evaluation_interval: {SCRAPE_S}s
rule_files:
  - {RULES}
scrape_configs:
  - job_name: terra-controller
    scheme: https
    tls_config:
      ca_file: {pki / "ca.crt"}
      cert_file: {pki / f"{operator}.crt"}
      key_file: {pki / f"{operator}.key"}
      server_name: terra-controller
    file_sd_configs:
      - files: [{directory / "controller.json"}]
        refresh_interval: 1s
  - job_name: terra-agents
    file_sd_configs:
      - files: [{directory / "agents.json"}]
        refresh_interval: 1s
"""


class PageShots:
    """The operator page of a controller in headless Chromium, for screenshots.

    Args:
        rest: the controller's REST base URL ("https://host:port", `--rest-public`).
        out_dir: where the PNGs go.

    Attributes:
        shots: [{"name", "path", "links_down": ["A>B", ...], "load": {"A>B": text shown},
            "coflow": id of the coflow whose view is open or None, "flows": [[cells of its
            flow rows]]}]: before each shot the page's first running coflow is clicked
            (its coflow view: flows, agents, tunnels, rates, bytes over time).
        error: why the browser could not be used, or None.
    """

    def __init__(self, rest: str, out_dir: Path) -> None:
        self.rest, self.out_dir = rest, out_dir
        self.shots: list[dict] = []
        self.error: str | None = None
        self.driver = None
        try:
            from mininet_scenarios.browser import browser_missing, start_browser

            missing = browser_missing()
            if missing:
                raise ObserveError(missing)
            self.driver = start_browser()
            self.driver.get(rest + "/")
        except Exception as exc:  # no browser: the run goes on without screenshots
            self.error = f"no page screenshots: {exc}"

    def shoot(self, name: str) -> None:
        """Save out_dir/NAME.png and what the page's link table shows (errors are kept in
        `error`, never raised: the run must not fail for a screenshot)."""
        if self.driver is None:
            return
        try:
            self.out_dir.mkdir(parents=True, exist_ok=True)
            path = self.out_dir / f"{name}.png"
            rows = self.driver.execute_script(
                "return [...document.querySelectorAll('#links tbody tr')].map(r => "
                "({link: r.dataset.link, state: r.dataset.state, "
                "cells: [...r.cells].map(c => c.textContent)}));"
            )
            coflow, flows = self._open_running_coflow()
            height = self.driver.execute_script("return document.documentElement.scrollHeight")
            self.driver.set_window_size(1400, min(4000, height + 140))
            self.driver.save_screenshot(str(path))
            self.shots.append({
                "name": name, "path": str(path),
                "links_down": sorted(r["link"] for r in rows if r["state"] == "down"),
                "load": {r["link"]: " | ".join(r["cells"][1:]) for r in rows},
                "coflow": coflow, "flows": flows,
            })  # fmt: skip
        except Exception as exc:
            self.error = f"screenshot {name}: {exc}"

    def _open_running_coflow(self) -> tuple[int | None, list[list[str]]]:
        """Click the first running coflow's row (as a user would), wait up to 3 s for its
        flows; (its id or None, the cells of its flow rows)."""
        from selenium.webdriver.common.action_chains import ActionChains

        rows = self.driver.find_elements("css selector", '#coflows tr[data-state="running"]')
        if not rows:
            return None, []
        coflow = int(rows[0].get_attribute("data-coflow"))
        ActionChains(self.driver).move_to_element(rows[0]).click().perform()
        end = time.monotonic() + 3.0
        flows: list[list[str]] = []
        while time.monotonic() < end and not flows:
            time.sleep(0.2)
            flows = self.driver.execute_script(
                "return [...document.querySelectorAll('#coflow-flows tbody tr')]"
                ".map(r => [...r.cells].map(c => c.textContent));"
            )
        return coflow, flows

    def close(self) -> None:
        """Quit the browser."""
        if self.driver is not None:
            self.driver.quit()
            self.driver = None
