"""The operator's web page (/ of the REST address) in headless Chromium against a live system:
a real controller (--no-openflow, mutual TLS, --rest-public), two real agents moving bytes
and two coflows (benchmarks/web_page.py). The page's tables and SVG are compared with the
REST JSON read over CA-verified TLS; a link set down through the operator API shows down.
Skips only when Debian's chromium / chromium-driver are not installed."""

import urllib.request

import pytest

from benchmarks.web_page import BIG, SWAN_LINKS, MapSession, PageSession
from mininet_scenarios.browser import browser_missing


def ends(link: dict) -> tuple[str, str]:
    """A REST link's (a, b), whether named a/b or src/dst."""
    return link.get("a", link.get("src")), link.get("b", link.get("dst"))


pytestmark = pytest.mark.skipif(browser_missing() is not None, reason=str(browser_missing()))


@pytest.fixture(scope="module")
def session(tmp_path_factory):
    with PageSession(tmp_path_factory.mktemp("web")) as s:
        s.wait_updates(2)
        yield s


def test_page_and_static_files_come_from_the_package_with_a_strict_policy(session):
    ctl = session.ctl
    with urllib.request.urlopen(ctl.rest + "/", timeout=10, context=ctl.rest_tls) as reply:
        html = reply.read().decode()
        policy = reply.headers["Content-Security-Policy"]
    assert reply.headers["Content-Type"].startswith("text/html")
    assert "default-src 'self'" in policy and "script-src 'self'" in policy
    assert '<script src="/static/app.js"' in html and "http" not in html.split("<body>")[1]
    for path in ("/static/app.js", "/static/style.css"):
        with urllib.request.urlopen(ctl.rest + path, timeout=10, context=ctl.rest_tls) as r:
            assert r.status == 200 and len(r.read()) > 500
    # Nothing but the page's own origin was fetched by the browser.
    urls = session.js("return performance.getEntriesByType('resource').map(e => e.name)")
    assert urls and all(u.startswith(ctl.rest) for u in urls)
    # The page's weight: its own files as the browser fetched them, under 200 kB.
    weight = session.page_weight()
    assert set(weight) == {"/", "/static/app.js", "/static/style.css", "total"}
    assert 10_000 < weight["total"] < 200_000


def test_page_shows_what_rest_says(session, tmp_path):
    ctl = session.ctl
    session.wait_updates(2)
    status, topology = ctl.get("/status"), ctl.get("/topology")
    assert status["coflows"].get("done") == 1
    assert session.driver.find_element("id", "topology-name").text == status["topology"] == "swan"
    # Links: one table row and one SVG line per directed link, one node per DC.
    links = session.rows("links")
    assert len(links) == len(topology["links"]) == 14
    assert session.js("return document.querySelectorAll('#wan line.link').length") == 14
    assert session.js("return document.querySelectorAll('#wan g.node').length") == 5
    rest_links = {"{}>{}".format(*ends(x)): x for x in topology["links"]}
    for row in links:
        assert row["data"]["state"] == rest_links[row["data"]["link"]]["state"] == "up"
        assert row["cells"][2] == "2.00 MB/s"  # the operator's capacity, formatted
    # Coflows: the finished one exactly as REST has it; the big one active with its bytes.
    session.wait(
        lambda: (
            {r["data"]["coflow"] for r in session.rows("coflows")}
            >= {str(session.small), str(session.big)}
        ),
        10,
    )
    rows = {int(r["data"]["coflow"]): r for r in session.rows("coflows")}
    small = ctl.get(f"/coflows/{session.small}")
    assert small["state"] == rows[session.small]["data"]["state"] == "done"
    assert rows[session.small]["cells"][2] == "200.0 kB / 200.0 kB (100.0 %)"
    assert rows[session.small]["cells"][4].endswith(" s")  # a CCT
    assert rows[session.big]["data"]["state"] in ("queued", "running", "preempted")
    assert rows[session.big]["cells"][2].split(" / ")[1].startswith(f"{BIG / 1e6:.1f} MB")
    assert rows[session.big]["cells"][5] == "3600.0 s"  # the deadline
    summary = session.driver.find_element("id", "summary").text
    assert "agents 2/2 connected" in summary and "1 done" in summary
    # Bytes move: the big coflow's measured rate and some link's measured load show up.
    session.wait(
        lambda: (
            any(r["cells"][4] not in ("–", "0 B/s") for r in session.rows("links"))
            and session.rows("coflows")[0]["cells"][3] not in ("–", "0 B/s")
        ),
        30,
        "measured rates",
    )
    # Round-time history: one polyline point per recent round.
    n = len(ctl.get("/status")["recent_round_ms"])
    points = session.js("return document.querySelector('#rounds .round')"
                        ".getAttribute('points').split(' ').length")  # fmt: skip
    assert n >= 1 and points >= min(n, 100) - 5
    assert session.screenshot(tmp_path / "page.png").stat().st_size > 10_000


def test_click_through_from_the_map_to_a_coflow_and_its_flows(session, tmp_path):
    big = session.big
    link = session.open_coflow_from_map(big)
    assert session.driver.find_element("id", "coflow-title").text == str(big)

    # The flow, its agents and the tunnels it uses now are those REST has for the coflow.
    # (Compared in one go: a round may move the flow between the page's poll and REST's.)
    def flows_agree() -> bool:
        rest = session.ctl.get(f"/coflows/{big}")["flows"]
        rows = session.rows("coflow-flows")
        paths = rest[0]["paths"]
        shown = rows[0]["cells"][2]
        return (
            [r["data"]["flow"] for r in rows] == [f["id"] for f in rest] == ["b"]
            and rows[0]["data"]["tunnels"].split(",") == [str(p["tunnel"]) for p in paths]
            and all(f"#{p['tunnel']} " + "→".join(p["path"]) in shown for p in paths)
            and bool(paths)
            and rows[0]["cells"][3] not in ("–", "0 B/s")  # a current rate
        )

    session.wait(flows_agree, 60, "the coflow's flows, tunnels and rate as REST has them")
    assert session.rows("coflow-flows")[0]["cells"][1] == "hk1 (HK) → la1 (LA)"
    assert link in session.js("return Object.keys(state.linkCoflows)")
    # Progress over time: the chart gets a point per poll while bytes move, and climbs.
    session.wait(lambda: int(session.js(
        "return document.querySelector('#coflow-progress polyline').dataset.points")) >= 3,
        60, "progress points")  # fmt: skip
    ys = session.js(
        "return document.querySelector('#coflow-progress polyline')"
        ".getAttribute('points').split(' ').map(p => Number(p.split(',')[1]))"
    )
    assert ys[-1] < ys[0]  # more bytes delivered: higher on the chart (smaller y)
    assert session.screenshot(tmp_path / "coflow.png").stat().st_size > 10_000


def test_agents_view_and_event_log(session):
    session.wait_updates(1)
    agents = {r["data"]["agent"]: r["cells"] for r in session.rows("agents")}
    assert set(agents) == {"hk1", "la1"}
    assert agents["hk1"][1] == "HK" and agents["hk1"][2] == "connected"
    assert agents["hk1"][4] == "1" and agents["la1"][5] == "1"  # the big coflow's flow
    assert str(session.big) in agents["hk1"][6]
    assert agents["la1"][3] in ("now", "1 s ago", "2 s ago", "3 s ago")
    events = session.ctl.get("/events")
    kinds = [e["kind"] for e in events["events"]]
    assert kinds.count("agent_registered") == 2 and kinds.count("capacity") == len(SWAN_LINKS)
    assert kinds.count("admitted") == 2 and "done" in kinds
    shown = [r["data"]["kind"] for r in session.rows("events")]
    assert sorted(shown) == sorted(kinds)  # every event, newest first
    assert [int(r["data"]["seq"]) for r in session.rows("events")] == sorted(
        (e["seq"] for e in events["events"]), reverse=True
    )
    after = session.ctl.get(f"/events?since={events['last'] - 1}")
    assert [e["seq"] for e in after["events"]] == [events["last"]]
    # Without tenants there is no tenant table.
    assert session.ctl.get("/tenants") == {"isolation": "none", "tenants": []}
    assert session.js("return document.getElementById('panel-tenants').hidden") is True


TENANTS = """[default]
action = "map"
tenant = "batch"

[tenants.analytics]
weight = 3
max_coflows = 100

[tenants.batch]
weight = 1
"""


def test_tenant_table_shows_what_rest_says(tmp_path):
    # Two tenants (3:1); the operator's five coflows go to the default tenant, batch.
    (tmp_path / "tenants.toml").write_text(TENANTS)
    with MapSession(tmp_path, "swan", extra=["--tenants", str(tmp_path / "tenants.toml")]) as s:

        def agrees() -> bool:
            rest = {t["name"]: t for t in s.ctl.get("/tenants")["tenants"]}
            shown = {r["data"]["tenant"]: r["cells"] for r in s.rows("tenants")}
            return set(shown) == set(rest) and all(
                cells[1] == str(rest[n]["weight"]).removesuffix(".0")
                and cells[3] == str(rest[n]["active_coflows"])
                for n, cells in shown.items()
            )

        try:
            s.wait(agrees, 60, "the tenant table as REST has it")
        except TimeoutError as exc:  # say what the page last showed
            rows = [r["cells"] for r in s.rows("tenants")]
            raise TimeoutError(f"{exc}; page: {s.page_state()}{s.log_excerpt()}, rows {rows}, REST "
                               f"{s.ctl.get('/tenants')['tenants']}") from None  # fmt: skip
        shown = {r["data"]["tenant"]: r["cells"] for r in s.rows("tenants")}
        assert list(shown) == ["analytics", "batch"]
        assert shown["analytics"][1:4] == ["3", "75.0 %", "0"]
        assert shown["batch"][1:4] == ["1", "25.0 %", "5"]
        assert shown["analytics"][6] == "at most 100 coflows" and shown["batch"][6] == "none"
        assert shown["batch"][5] != "0 B/s"  # the last round's rate of its coflows
        assert "cooperative sharing" in s.driver.find_element("id", "tenant-note").text
        # A coflow's view names its tenant.
        s.click(f'#coflows tr[data-coflow="{s.ctl.get("/coflows")[0]["id"]}"]')
        s.wait(lambda: "tenant batch · " in s.driver.find_element("id", "coflow-summary").text,
               30, "the coflow's tenant")  # fmt: skip


def test_a_request_the_controller_never_answers_does_not_stop_the_page(session):
    """The browser holds every /status request unanswered (Chrome DevTools' Fetch domain
    pauses them): the page gives the request up after FETCH_TIMEOUT_MS (10 s) and says the
    controller is unreachable instead of waiting for it forever, and once requests are
    answered again it updates as before. (Polls run one at a time, so without the timeout
    the first held request would stop every later poll.)"""
    driver = session.driver
    session.wait_updates(1)
    driver.execute_cdp_cmd("Fetch.enable", {"patterns": [{"urlPattern": "*/status*"}]})
    try:
        # (a poll already under way when the Fetch domain was enabled may fail at once,
        # "Failed to fetch"; the held ones after it are given up after the timeout)
        session.wait(lambda: "no answer within" in session.js(
            "return document.getElementById('conn').textContent"), 30,
            "the page giving a held request up")  # fmt: skip
        conn = session.js("return document.getElementById('conn').textContent")
        assert conn == "controller unreachable: /status: no answer within 10 s", conn
    finally:
        driver.execute_cdp_cmd("Fetch.disable", {})
    session.wait_updates(2, timeout=40)
    assert session.js("return document.getElementById('conn').textContent").startswith("updated")


def test_link_labels_are_readable(session):
    session.wait(lambda: session.js("return document.querySelectorAll('#wan text.load').length"),
                 15, "link labels")  # fmt: skip
    assert session.label_overlaps() == []


def test_link_down_through_the_operator_api_shows_down(session, tmp_path):
    session.client.set_link_state("HK", "LA", False)
    try:
        session.select_pair("HK", "LA")

        def shown_down() -> bool:
            rows = {r["data"]["link"]: r for r in session.rows("links")}
            line = session.js(
                "return document.querySelector('#wan line[data-link=\"HK>LA\"]')"
                ".getAttribute('class')"
            )
            return (
                rows["HK>LA"]["data"]["state"] == rows["LA>HK"]["data"]["state"] == "down"
                and rows["HK>NY"]["data"]["state"] == "up"
                and "down" in line.split()
            )

        session.wait(shown_down, 15, "HK-LA down on the page")
        assert {x["state"] for x in session.ctl.get("/topology")["links"]
                if set(ends(x)) == {"HK", "LA"}} == {"down"}  # fmt: skip
        # The HK -> LA tunnels: the direct one is down, the others up; the page agrees with
        # /tunnels and highlights the selected pair's links on the graph.
        session.wait_updates(1)
        tunnels = [t for t in session.ctl.get("/tunnels")["tunnels"]
                   if (t["src"], t["dst"]) == ("HK", "LA")]  # fmt: skip
        rows = session.rows("tunnels")
        assert len(rows) == len(tunnels) == 4
        shown = {r["cells"][1]: r["cells"][2] for r in rows}
        assert shown == {" → ".join(t["path"]): "up" if t["up"] else "down" for t in tunnels}
        assert shown["HK → LA"] == "down"
        assert session.js("return document.querySelectorAll('#wan line.hl').length") >= 2
        session.wait(lambda: "link_down" in [r["data"]["kind"] for r in session.rows("events")],
                     15, "the link_down event")  # fmt: skip
        assert session.screenshot(tmp_path / "link_down.png").stat().st_size > 10_000
    finally:
        session.client.set_link_state("HK", "LA", True)


@pytest.mark.parametrize("topology", ["gscale", "att"])
def test_link_labels_are_readable_on_the_larger_topologies(tmp_path, topology):
    # A control-protocol agent in every DC and a coflow from each DC: most links carry an
    # allocation; every label drawn is >= 10 px on screen and overlaps no other.
    with MapSession(tmp_path, topology) as s:
        s.wait_updates(3)
        labels = s.js("return document.querySelectorAll('#wan text.load').length")
        loaded = sum(x["allocated_bytes_per_s"] >= 1 for x in s.ctl.get("/links")["links"])
        assert loaded >= 10 and labels >= 10
        assert s.label_overlaps() == []
        # A label left out (no room) still has its figures in its link's tooltip.
        assert s.js("return document.querySelectorAll('#wan g.edge title').length") == len(
            s.ctl.get("/links")["links"]
        )
