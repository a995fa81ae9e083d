"""deploy/grafana/terra-dashboard.json: every query names only series the controller exports
(collected from its metrics registry in-process) or the recording rules of
deploy/prometheus/terra-rules.yml record, and the dashboard has the panels operators need."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from terra_controller.controller import Controller
from terra_controller.rest import RestApp
from terra_core.terra_policy import TerraPolicy
from topologies import Topology

yaml = pytest.importorskip("yaml")

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
DASHBOARD = DEPLOY / "grafana" / "terra-dashboard.json"
RULES = DEPLOY / "prometheus" / "terra-rules.yml"

# PromQL words that are not series: operators, modifiers (functions are followed by "(")
KEYWORDS = {"and", "or", "unless", "by", "without", "on", "ignoring", "group_left",
            "group_right", "bool", "offset", "inf", "nan"}  # fmt: skip


def series_in(expr: str) -> set[str]:
    """The series names a PromQL expression reads: identifiers outside strings, label
    matchers {...}, range / subquery brackets [...], grouping lists (by (...) etc.) and
    Grafana variables ($name), that are not functions (followed by "(") or keywords."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"', "", expr)
    text = re.sub(r"\{[^}]*\}", "", text)
    text = re.sub(r"\[[^\]]*\]", "", text)
    text = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", text)
    text = re.sub(r"\$\{?\w+\}?", "", text)
    names = set()
    for m in re.finditer(r"[A-Za-z_:][A-Za-z0-9_:]*", text):
        rest = text[m.end() :].lstrip()
        word = m.group(0)
        if rest.startswith("(") or word.lower() in KEYWORDS:
            continue
        if m.start() > 0 and (text[m.start() - 1].isdigit() or text[m.start() - 1] == "."):
            continue  # the exponent or unit of a number (1e9, 5m)
        names.add(word)
    return names


def exported_series() -> set[str]:
    """Every sample name the controller's registry yields (histogram buckets, counters'
    _total included), with a controller and its REST app's collector, in-process."""
    links = {}
    for u, v in [("A", "B"), ("B", "C"), ("A", "C")]:
        links[(u, v)] = links[(v, u)] = 1e8
    topology = Topology("tri", ["A", "B", "C"], links)
    controller = Controller(topology, TerraPolicy(topology, k=2))
    app = RestApp(controller)
    return {s.name for family in app.metrics.collect() for s in family.samples}


def recorded_series() -> set[str]:
    """The names the recording rules of terra-rules.yml record."""
    rules = yaml.safe_load(RULES.read_text())
    return {r["record"] for g in rules["groups"] for r in g["rules"] if "record" in r}


def queries(dashboard: dict) -> list[tuple[str, str]]:
    """(panel title, expr) of every target of every panel (rows' panels included)."""
    out = []
    for panel in dashboard["panels"]:
        for p in [panel, *panel.get("panels", [])]:
            out += [(p["title"], t["expr"]) for t in p.get("targets", [])]
    return out


def test_the_series_parser_finds_names_and_skips_the_rest():
    expr = ('histogram_quantile(0.95, sum by (le) (rate(terra_x_bucket{a="b c"}[5m]))) '
            "/ ignoring(dpid, port) group_left terra:y:ratio > 1e9 or vector(0) "
            "and rate(z_total[$__rate_interval])")  # fmt: skip
    assert series_in(expr) == {"terra_x_bucket", "terra:y:ratio", "z_total"}


def test_every_dashboard_query_names_existing_series():
    dashboard = json.loads(DASHBOARD.read_text())
    known = exported_series() | recorded_series()
    assert "terra_round_duration_seconds_bucket" in known
    assert "terra:link_allocated:ratio" in known
    used = set()
    for title, expr in queries(dashboard):
        names = series_in(expr)
        assert names, (title, expr)
        assert names <= known, (title, expr, sorted(names - known))
        used |= names
    assert used & recorded_series()  # the recording rules are used too


def test_the_dashboard_has_the_operators_panels():
    dashboard = json.loads(DASHBOARD.read_text())
    titles = {p["title"] for p in dashboard["panels"]}
    for wanted in ("Scheduling rounds", "LP solves", "Link allocation vs capacity",
                   "Coflows by state", "Bytes acknowledged", "Agents", "Role"):  # fmt: skip
        assert wanted in titles
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    assert dashboard["uid"] == "terra-controller"
