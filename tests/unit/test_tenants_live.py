"""Tenants in the controller, in one process: the tenants file's schema errors, the tenant
a job certificate carries, the policy with one tenant equal to Terra, weights followed,
limits, operator changes (bad values change nothing) and their journal."""

from __future__ import annotations

import argparse

import msgpack
import pytest

from terra_controller.api_server import ApiHandler
from terra_controller.cli import main
from terra_controller.controller import Controller
from terra_controller.tenant_cli import attach_tenants, scheduler_factory
from terra_controller.tenants import TenantBook
from terra_controller.tenants_config import TenantsError, parse_tenants
from terra_core.registry import SchedulerOptions
from terra_core.terra_policy import TerraPolicy
from terra_security.pki import Identity, PkiError, Role, init_ca, issue, peer_identity
from terra_wire.api import INVALID, decode_request
from topologies import load_topology

AGENTS = [("hk1", "HK"), ("hk2", "HK"), ("ba1", "BA"), ("ba2", "BA")]
TWO = "[tenants.gold]\nweight = 3\n\n[tenants.bronze]\nweight = 1\n"
OPERATOR = Identity("noc", Role.OPERATOR)


# ---- the file ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text, expected",
    [
        (TWO + "wieght = 2\n", "t.toml: line 6: tenants.bronze.wieght: unknown key"),
        (TWO.replace("weight = 1", "weight = -1"),
         "t.toml: line 5: tenants.bronze.weight: expected `float` > 0.0"),
        (TWO.replace("weight = 3", "weight = 0"),
         "t.toml: line 2: tenants.gold.weight: expected `float` > 0.0"),
        (TWO + "[tenants.Gold]\nweight = 1\n", "t.toml: line 6: duplicate tenant 'Gold' (first "
         "at line 1)"),
        ("colour = 1\n" + TWO, "t.toml: line 1: colour: unknown key"),
        ('[default]\naction = "map"\ntenant = "silver"\n' + TWO,
         "t.toml: line 3: default.tenant: action map needs a listed tenant, got 'silver'"),
        ("[tenants.gold]\nmax_coflows = 2\n", "t.toml: line 1: tenants.gold.weight: missing"),
        ("[tenants.gold]\nweight = inf\n",
         "t.toml: line 2: tenants.gold.weight: must be a finite number > 0"),
        ('sharing = "strict"\n', "t.toml: tenants: missing: at least one [tenants.NAME] table"),
    ],
)  # fmt: skip
def test_a_bad_tenants_file_is_one_line_naming_the_problem(text, expected):
    with pytest.raises(TenantsError) as err:
        parse_tenants(text, "t.toml")
    assert str(err.value) == expected


def test_a_bad_tenants_file_exits_2_before_the_controller_starts(tmp_path, capsys):
    bad = tmp_path / "t.toml"
    bad.write_text(TWO.replace("weight = 1", "weight = -1"))
    with pytest.raises(SystemExit) as exit_:
        main(["--topology", "swan", "--insecure", "--no-openflow", "--tenants", str(bad)])
    assert exit_.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err == f"terra-controller: {bad}: line 5: tenants.bronze.weight: expected `float` > 0.0"


# ---- certificates -----------------------------------------------------------------------


def test_the_tenant_comes_from_the_certificate_only(tmp_path):
    from cryptography import x509

    init_ca(tmp_path)
    issue(tmp_path, "job", "etl", tenant="gold")
    issue(tmp_path, "job", "adhoc")
    cert = x509.load_pem_x509_certificate((tmp_path / "etl.crt").read_bytes())
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.UniformResourceIdentifier) == ["urn:terra:tenant:gold"]
    with pytest.raises(PkiError, match="only job certificates"):
        issue(tmp_path, "operator", "noc2", tenant="gold")
    subject = ((("commonName", "etl"),), (("organizationalUnitName", "job"),))
    dns = (("DNS", "etl"),)
    assert peer_identity({"subject": subject, "subjectAltName": dns}).tenant == "etl"
    ident = peer_identity({"subject": subject, "subjectAltName": dns + (
        ("URI", "urn:terra:tenant:gold"),)})  # fmt: skip
    assert (ident.name, ident.tenant) == ("etl", "gold")
    with pytest.raises(PkiError, match="2 tenants"):
        peer_identity({"subject": subject, "subjectAltName": dns + (
            ("URI", "urn:terra:tenant:gold"), ("URI", "urn:terra:tenant:bronze"))})  # fmt: skip


def test_a_job_cannot_name_its_tenant_in_a_request():
    controller, _ = tenant_controller(TWO)
    handler = ApiHandler(controller)
    job = Identity("etl", Role.JOB, tenant="bronze")
    reply = handler.handle({"v": 1, "op": "submit", "flows": [flow("f")], "tenant": "gold"}, job)
    assert reply["code"] == "bad_request" and "tenant" in reply["error"]
    wire = decode_request(msgpack.packb({"v": 1, "op": "submit", "flows": [], "tenant": "gold"}))
    assert INVALID in wire  # on the wire too: answered bad_request, nothing submitted
    reply = handler.handle({"v": 1, "op": "submit", "flows": [flow("f")]}, job)
    assert reply["ok"]
    status = handler.handle({"v": 1, "op": "status", "coflow": reply["coflow"]}, job)
    assert status["status"]["tenant"] == "bronze"
    other = handler.handle({"v": 1, "op": "tenant", "name": "gold"}, job)
    assert other["code"] == "forbidden"  # a job sees its own tenant only
    for ask in ({}, {"name": "bronze"}):
        mine = handler.handle({"v": 1, "op": "tenant", **ask}, job)
        assert mine["tenant"]["name"] == "bronze"


# ---- the policy -------------------------------------------------------------------------


def tenant_controller(text: str, state_dir=None) -> tuple[Controller, TenantBook]:
    swan = load_topology("swan")
    book = TenantBook(parse_tenants(text), text.encode())
    factory = scheduler_factory(argparse.Namespace(scheduler="terra"), swan,
                                SchedulerOptions(), book)  # fmt: skip
    controller = Controller(swan, factory(), state_dir=state_dir)
    attach_tenants(controller, book)
    for agent, dc in AGENTS:
        controller.registry.register_agent(agent, dc, "127.0.0.1:1")
    return controller, book


def flow(fid, src="hk1", dst="ba1", size=10**9):
    return {"id": fid, "src": src, "dst": dst, "bytes": size}


def rate(controller: Controller, cid: int) -> float:
    return sum(r for paths in controller.rates.get(cid, {}).values() for _, r in paths)


def test_one_tenant_schedules_exactly_as_terra():
    swan = load_topology("swan")
    plain = Controller(swan, TerraPolicy(swan))
    for agent, dc in AGENTS:
        plain.registry.register_agent(agent, dc, "127.0.0.1:1")
    tenant, _ = tenant_controller("[tenants.only]\nweight = 2\n")
    for c in (plain, tenant):
        c.submit([flow("a", size=300_000_000), flow("b", "hk2", "ba2", 50_000_000)])
        c.submit([flow("c", "ba1", "hk1", 80_000_000)], deadline=30)
        c.submit([flow("d", "hk2", "ba1", 120_000_000)])
        c.run_round()
    assert tenant.rates == plain.rates and plain.rates


def two_tenant_coflows(controller):
    handler = ApiHandler(controller)
    ids = {}
    for job, tenant, src, dst in (("etl", "gold", "hk1", "ba1"), ("adhoc", "bronze", "hk2", "ba2")):
        reply = handler.handle({"v": 1, "op": "submit", "flows": [flow("f", src, dst)]},
                               Identity(job, Role.JOB, tenant=tenant))  # fmt: skip
        ids[tenant] = reply["coflow"]
    controller.run_round()
    return handler, ids


def test_rates_follow_the_weights_and_an_operator_changes_them_live():
    controller, book = tenant_controller(TWO)
    handler, ids = two_tenant_coflows(controller)
    gold, bronze = rate(controller, ids["gold"]), rate(controller, ids["bronze"])
    assert gold / bronze == pytest.approx(3.0, rel=0.02)
    view = handler.handle({"v": 1, "op": "tenants"}, OPERATOR)
    rows = {r["name"]: r for r in view["tenants"]}
    assert rows["gold"]["allocated_bytes_per_s"] == pytest.approx(gold)
    assert rows["gold"]["active_coflows"] == 1 and view["guarantee"] >= 1.0
    reply = handler.handle({"v": 1, "op": "tenant_set", "name": "bronze", "weight": 3}, OPERATOR)
    assert reply["ok"] and reply["tenant"]["weight"] == 3.0
    controller.run_round()
    gold, bronze = rate(controller, ids["gold"]), rate(controller, ids["bronze"])
    assert gold / bronze == pytest.approx(1.0, rel=0.02)
    metrics = controller.metrics.render().decode()
    assert 'terra_tenant_weight{tenant="bronze"} 3.0' in metrics
    assert "terra_tenant_isolation_guarantee" in metrics


def test_strict_sharing_live_gives_each_tenant_its_pair_rate_in_its_order():
    # Both tenants on HK->BA, weights 3 : 1, strict sharing: gold gets 3/4 of what Step A
    # routes for the pair and bronze 1/4; gold's Terra serves its small coflow first, and
    # the two split gold's pair rate. What REST and the metrics report is what was given.
    controller, book = tenant_controller('sharing = "strict"\n' + TWO)
    handler = ApiHandler(controller)
    ids = {}
    for name, tenant, size in (("big", "gold", 10**9), ("small", "gold", 10**7),
                               ("other", "bronze", 10**9)):  # fmt: skip
        reply = handler.handle({"v": 1, "op": "submit", "flows": [flow("f", size=size)]},
                               Identity(name, Role.JOB, tenant=tenant))  # fmt: skip
        ids[name] = reply["coflow"]
    controller.run_round()
    got = {name: rate(controller, cid) for name, cid in ids.items()}
    gold = got["big"] + got["small"]
    assert gold / got["other"] == pytest.approx(3.0, rel=1e-6)
    assert got["small"] > got["big"]  # smaller Γ first in gold's order
    assert book.achieved == pytest.approx(book.guarantee, rel=1e-9)
    rows = {r["name"]: r for r in handler.handle({"v": 1, "op": "tenants"}, OPERATOR)["tenants"]}
    assert rows["gold"]["allocated_bytes_per_s"] == pytest.approx(gold)
    assert rows["bronze"]["allocated_bytes_per_s"] == pytest.approx(got["other"])
    controller.close()


def test_each_tenant_has_its_progress_and_a_histogram_of_its_ccts():
    controller, book = tenant_controller(TWO)
    handler, ids = two_tenant_coflows(controller)
    metrics = controller.metrics.render().decode()
    # weights 3:1 on disjoint pairs of one link each way: both reach the same weighted
    # progress, the round's isolation guarantee
    assert set(book.progress) == {"gold", "bronze"}
    assert min(book.progress.values()) == pytest.approx(book.achieved)
    for tenant in ("gold", "bronze"):
        assert f'terra_tenant_progress{{tenant="{tenant}"}}' in metrics
    assert "terra_tenant_cct_seconds_count" not in metrics.replace("# TYPE", "")
    assert controller.complete(ids["gold"], "f", "00")
    controller.run_round()  # the done coflow leaves the policy
    metrics = controller.metrics.render().decode()
    assert 'terra_tenant_cct_seconds_count{tenant="gold"} 1.0' in metrics
    assert 'terra_tenant_cct_seconds_count{tenant="bronze"}' not in metrics
    assert book.progress == {}  # one tenant left active: no guarantee to measure
    assert handler.handle({"v": 1, "op": "cancel", "coflow": ids["bronze"]}, OPERATOR)["ok"]
    controller.run_round()  # a cancelled coflow has no CCT
    assert 'cct_seconds_count{tenant="bronze"}' not in controller.metrics.render().decode()
    controller.close()


@pytest.mark.parametrize(
    "request_, code",
    [
        ({"op": "tenant_set", "name": "gold", "weight": -1}, "bad_request"),
        ({"op": "tenant_set", "name": "gold", "weight": 0}, "bad_request"),
        ({"op": "tenant_set", "name": "gold", "weight": "x"}, "bad_request"),
        ({"op": "tenant_set", "name": "gold", "weight": 2, "max_coflows": 0}, "bad_request"),
        ({"op": "tenant_set", "name": "GOLD", "weight": 2}, "bad_request"),
        ({"op": "tenant_set", "name": "no such", "weight": 2}, "bad_request"),
        ({"op": "tenant_set", "name": "gold", "weight": 2, "colour": 1}, "bad_request"),
        ({"op": "tenant_remove", "name": "gold"}, "bad_request"),  # it has a coflow
        ({"op": "tenant_remove", "name": "silver"}, "unknown_tenant"),
    ],
)  # fmt: skip
def test_a_bad_tenant_change_changes_nothing(request_, code):
    controller, book = tenant_controller(TWO)
    handler, ids = two_tenant_coflows(controller)
    before = (book.record(), book.version, controller.journal.tenants)
    reply = handler.handle({"v": 1, **request_}, OPERATOR)
    assert not reply["ok"] and reply["code"] == code
    assert "\n" not in reply["error"] and reply["error"]
    assert (book.record(), book.version, controller.journal.tenants) == before
    job = handler.handle({"v": 1, "op": "tenant_set", "name": "gold", "weight": 9},
                         Identity("etl", Role.JOB, tenant="gold"))  # fmt: skip
    assert job["code"] == "forbidden" and book.record() == before[0]


def test_unknown_tenants_are_refused_or_mapped():
    controller, _ = tenant_controller(TWO)
    handler = ApiHandler(controller)
    stranger = Identity("x", Role.JOB, tenant="silver")
    reply = handler.handle({"v": 1, "op": "submit", "flows": [flow("f")]}, stranger)
    assert reply["code"] == "unknown_tenant" and not controller.registry.coflows
    controller, book = tenant_controller('[default]\naction = "map"\ntenant = "bronze"\n' + TWO)
    handler = ApiHandler(controller)
    reply = handler.handle({"v": 1, "op": "submit", "flows": [flow("f")]}, stranger)
    assert book.tenant_of_coflow(reply["coflow"], "x") == "bronze"


def test_limits_refuse_a_submit_beyond_them():
    controller, _ = tenant_controller(TWO.replace("weight = 1", "weight = 1\nmax_coflows = 1"))
    handler = ApiHandler(controller)
    job = Identity("adhoc", Role.JOB, tenant="bronze")
    assert handler.handle({"v": 1, "op": "submit", "flows": [flow("f")]}, job)["ok"]
    reply = handler.handle({"v": 1, "op": "submit", "flows": [flow("g")]}, job)
    assert reply["code"] == "tenant_limit"
    controller, _ = tenant_controller(TWO.replace("weight = 1", "weight = 1\nmax_bytes = 1500"))
    handler = ApiHandler(controller)
    ok = handler.handle({"v": 1, "op": "submit", "flows": [flow("f", size=1000)]}, job)
    assert ok["ok"]
    reply = handler.handle({"v": 1, "op": "submit", "flows": [flow("g", size=1000)]}, job)
    assert reply["code"] == "tenant_limit"


def test_live_changes_survive_a_restart_unless_the_file_changed(tmp_path):
    controller, _ = tenant_controller(TWO, tmp_path)
    handler = ApiHandler(controller)
    assert handler.handle({"v": 1, "op": "tenant_set", "name": "silver", "weight": 2,
                           "max_bytes": 10**12}, OPERATOR)["ok"]  # fmt: skip
    handler.handle({"v": 1, "op": "submit", "flows": [flow("f")]},
                   Identity("etl", Role.JOB, tenant="gold"))  # fmt: skip
    controller.close()
    again, book = tenant_controller(TWO, tmp_path)
    assert book.weights() == {"gold": 3.0, "bronze": 1.0, "silver": 2.0}
    assert book.owners == {"etl": "gold"}
    again.close()
    changed, book = tenant_controller(TWO.replace("weight = 3", "weight = 5"), tmp_path)
    assert book.weights() == {"gold": 5.0, "bronze": 1.0}
    assert book.owners == {"etl": "gold"}
    changed.close()


def test_the_readme_tenants_file_is_valid():
    import re
    from pathlib import Path

    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    blocks = re.findall(r"```toml\n(.*?)```", readme, re.DOTALL)
    assert blocks
    for block in blocks:
        config = parse_tenants(block, "README")
        assert config.default.tenant in config.tenants


def test_the_file_knows_every_sharing_of_the_policy():
    from typing import get_args

    from terra_controller.tenants_config import Sharing
    from terra_core.tenant_shares import SHARINGS

    assert get_args(Sharing) == SHARINGS


def test_a_replay_gives_each_job_the_tenant_its_certificate_gave(tmp_path):
    """The core's log holds each submit's tenant as the job's certificate gave it (learned
    before the event), so a replay schedules the coflows in the same shares."""
    from terra_controller.core_log import CoreRecorder, read_events, replay

    controller, _ = tenant_controller(TWO)
    controller.recorder = CoreRecorder(tmp_path / "core.log")
    handler = ApiHandler(controller)
    for name, tenant in [("etl", "gold"), ("adhoc", "bronze"), ("etl2", "gold")]:
        job = Identity(name, Role.JOB, tenant=tenant)
        assert handler.handle({"v": 1, "op": "submit", "flows": [flow("f")]}, job)["ok"]
        controller.run_round()
    # Live changes are events too: a weight, and a guaranteed rate for bronze.
    change = {"v": 1, "op": "tenant_set", "name": "bronze", "weight": 2}
    assert handler.handle(change, OPERATOR)["ok"]
    reserve = {"v": 1, "op": "tenant_reserve", "name": "bronze", "src": "HK", "dst": "BA",
               "rate_bytes_per_s": 5e7}  # fmt: skip
    assert handler.handle(reserve, OPERATOR)["ok"]
    controller.run_round()
    controller.recorder.close()
    again, book = tenant_controller(TWO)
    events = list(read_events(tmp_path / "core.log"))
    assert [e.args[0] for e in events if e.kind == "tenant"] == ["set", "reserve"]
    report = replay(again, events)
    assert report.identical, report.mismatches
    assert book.owners == {"etl": "gold", "adhoc": "bronze", "etl2": "gold"}
    assert book.weights()["bronze"] == 2 and book.limits["bronze"].reservations
    assert [rate(again, cid) for cid in (0, 1, 2)] == [rate(controller, cid) for cid in (0, 1, 2)]


def test_the_tenant_book_is_used_on_the_controller_s_loop_only():
    """The book has one owner, the controller's loop, and no lock: the round's worker, the
    API's worker threads (tenant ops, submits), REST views and metrics hand their reads
    and changes to the loop."""
    import threading

    from terra_controller.rest import RestApp

    controller, book = tenant_controller(TWO)
    seen: list[tuple[str, str]] = []
    for name in dir(TenantBook):
        method = getattr(book, name)
        if name.startswith("_") or name == "on_loop" or not callable(method):
            continue

        def traced(*args, _name=name, _method=method, **kwargs):
            seen.append((_name, threading.current_thread().name))
            return _method(*args, **kwargs)

        setattr(book, name, traced)
    handler, ids = two_tenant_coflows(controller)  # (this thread: as an API worker's)
    for request in ({"op": "tenants"}, {"op": "tenant", "name": "gold"},
                    {"op": "tenant_set", "name": "bronze", "weight": 2},
                    {"op": "tenant_reserve", "name": "gold", "src": "HK", "dst": "BA",
                     "rate_bytes_per_s": 1e6}):  # fmt: skip
        assert handler.handle({"v": 1, **request}, OPERATOR)["ok"], request
    job = Identity("etl", Role.JOB, tenant="gold")
    assert handler.handle({"v": 1, "op": "tenant"}, job)["tenant"]["name"] == "gold"
    assert handler.handle({"v": 1, "op": "status", "coflow": ids["gold"]}, job)["ok"]
    controller.run_round()
    app = RestApp(controller)
    assert {r["name"] for r in app.tenants()["tenants"]} == {"gold", "bronze"}
    assert app.coflow(ids["bronze"])["tenant"] == "bronze"
    assert "terra_tenant_weight" in controller.metrics.render().decode()
    names = {n for n, _ in seen}
    assert {"learn", "view", "row", "set", "resolve", "tenant_of_coflow"} <= names, names
    off_loop = [(n, t) for n, t in seen if t != controller.owner.thread.name]
    assert not off_loop, off_loop
    controller.close()
