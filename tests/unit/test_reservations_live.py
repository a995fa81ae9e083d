"""Guaranteed reservations in the controller, in one process (terra_controller/
reservations.py, docs/design.md 4.5): the tenants file's reservations (bad ones: one line,
exit status 2), live reserve / unreserve (bad values change nothing), the guarantee held
while another tenant floods, the job API for a tenant's own reservations, REST's view and
the journal.

SWAN, every link 125e6 bytes/s: HK has two links out (HK-LA, HK-NY) and BA two in, so
HK->BA can take 250e6 B/s with every link up and 125e6 with HK-LA or HK-NY down.
"""

from __future__ import annotations

import pytest

from terra_controller.api_server import ApiHandler
from terra_controller.cli import main
from terra_controller.tenants_config import TenantsError, parse_tenants
from terra_security.pki import Identity, Role
from tests.unit.test_tenants_live import OPERATOR, flow, rate, tenant_controller

C = 125e6
FILE = """[tenants.gold]
weight = 1

[tenants.bronze]
weight = 9
"""


def reservation(rate_, ceil=None, src="HK", dst="BA"):
    text = f'\n[[tenants.gold.reservations]]\nsrc = "{src}"\ndst = "{dst}"\n'
    text += f"rate_bytes_per_s = {rate_:.0f}\n"
    return text + ("" if ceil is None else f"ceil_bytes_per_s = {ceil:.0f}\n")


def start(tmp_path, text, capsys):
    path = tmp_path / "t.toml"
    path.write_text(text)
    with pytest.raises(SystemExit) as exit_:
        main(["--topology", "swan", "--insecure", "--no-openflow", "--tenants", str(path)])
    return exit_.value.code, capsys.readouterr().err.strip(), str(path)


@pytest.mark.parametrize(
    "extra, words",
    [
        # 300e6 > 250e6 out of HK: fits 250/300 = 83.3 %
        (reservation(3e8), "reservations refused: does not fit with every link up: the "
         "guarantees active together (gold HK->BA 3e+08 B/s) fit only 83.3 %"),
        # 150e6 fits 250e6, not the 125e6 left with one of HK's or BA's two links down
        # (4 failures, the first in name order named): 125/150 = 83.3 %
        (reservation(1.5e8), "does not fit with link BA-FL down (and 3 other failures): "
         "the guarantees active together (gold HK->BA 1.5e+08 B/s) fit only 83.3 %"),
        (reservation(1e6, src="XX"), "reservation of gold: unknown DC 'XX'"),
    ],
)  # fmt: skip
def test_a_file_whose_guarantees_do_not_fit_exits_2(tmp_path, capsys, extra, words):
    code, err, path = start(tmp_path, FILE.replace("weight = 1\n", "weight = 1\n" + extra, 1),
                            capsys)  # fmt: skip
    assert code == 2 and err.startswith(f"terra-controller: {path}: ") and words in err
    assert "\n" not in err


@pytest.mark.parametrize(
    "extra, expected",
    [
        (reservation(1e6, ceil=5e5), "t.toml: line 11: tenants.gold.reservations[0]."
         "ceil_bytes_per_s: must be finite and >= rate_bytes_per_s (1e+06), got 500000"),
        (reservation(-1), "t.toml: line 10: tenants.gold.reservations[0].rate_bytes_per_s: "
         "expected `float` > 0.0"),
        (reservation(1e6, dst="HK"), "t.toml: line 9: tenants.gold.reservations[0].dst: same "
         "DC as src ('HK')"),
        (reservation(1e6) + "rate_bps = 3\n", "t.toml: line 11: tenants.gold.reservations[0]."
         "rate_bps: unknown key"),
    ],
)  # fmt: skip
def test_a_bad_reservation_in_the_file_is_one_line(extra, expected):
    with pytest.raises(TenantsError) as err:
        parse_tenants(FILE + extra, "t.toml")
    assert str(err.value) == expected


def test_a_file_whose_reservations_exceed_the_tenants_cap_is_one_line():
    text = FILE.replace("weight = 1\n", "weight = 1\nmax_reserved_bytes_per_s = 1.5e6\n", 1)
    # two open windows, 1e6 each, at once: 2e6 > 1.5e6 (line 3: the cap's line)
    with pytest.raises(TenantsError) as err:
        parse_tenants(text + reservation(1e6) + reservation(1e6, src="LA", dst="NY"), "t.toml")
    assert str(err.value) == ("t.toml: line 3: tenants.gold.max_reserved_bytes_per_s: its "
                              "reservations hold 2e+06 B/s at once, more than 1.5e+06")  # fmt: skip
    assert parse_tenants(text + reservation(1.5e6), "t.toml")  # at the cap: fine


def submit(handler, job, tenant, src, dst):
    reply = handler.handle({"v": 1, "op": "submit", "flows": [flow("f", src, dst)]},
                           Identity(job, Role.JOB, tenant=tenant))  # fmt: skip
    assert reply["ok"]
    return reply["coflow"]


def test_a_live_reservation_holds_while_another_tenant_floods(tmp_path):
    controller, book = tenant_controller(FILE, tmp_path)
    handler = ApiHandler(controller)
    gold = submit(handler, "etl", "gold", "hk1", "ba1")
    for i in range(3):
        submit(handler, f"bulk{i}", "bronze", "hk2", "ba2")
    controller.run_round()
    assert rate(controller, gold) < 0.9 * 0.5 * C  # weight 1 of 10
    reply = handler.handle({"v": 1, "op": "tenant_reserve", "name": "gold", "src": "HK",
                            "dst": "BA", "rate_bytes_per_s": 0.5 * C,
                            "ceil_bytes_per_s": 0.6 * C}, OPERATOR)  # fmt: skip
    assert reply["ok"], reply
    assert reply["tenant"]["reservations"][0]["rate_bytes_per_s"] == 0.5 * C
    assert reply["tenant"]["reserved_bytes_per_s"] == 0.5 * C
    reply = handler.handle({"v": 1, "op": "tenant_set", "name": "gold", "weight": 1}, OPERATOR)
    assert len(reply["tenant"]["reservations"]) == 1  # a weight change keeps them
    controller.run_round()
    assert 0.5 * C * (1 - 1e-6) <= rate(controller, gold) <= 0.6 * C * (1 + 1e-6)
    view = handler.handle({"v": 1, "op": "tenants"}, OPERATOR)
    assert view["reservation_failures"]["covered"]  # HK-LA, HK-NY, ... are covered
    assert view["reservation_failures"]["uncovered"] == {}
    metrics = controller.metrics.render().decode()
    assert 'terra_tenant_reserved_bytes_per_second{tenant="gold"} 6.25e+07' in metrics
    controller.close()
    again, book = tenant_controller(FILE, tmp_path)  # the journal keeps it
    assert [s.rate_bytes_per_s for s in book.limits["gold"].reservations] == [0.5 * C]
    handler = ApiHandler(again)
    reply = handler.handle({"v": 1, "op": "tenant_unreserve", "name": "gold", "src": "HK",
                            "dst": "BA"}, OPERATOR)  # fmt: skip
    assert reply["ok"] and reply["tenant"]["reservations"] == []
    again.close()


@pytest.mark.parametrize(
    "request_, code",
    [
        ({"name": "gold", "src": "HK", "dst": "BA", "rate_bytes_per_s": -1}, "bad_request"),
        ({"name": "gold", "src": "HK", "dst": "BA", "rate_bytes_per_s": "x"}, "bad_request"),
        ({"name": "gold", "src": "HK", "dst": "BA", "rate_bytes_per_s": 10,
          "ceil_bytes_per_s": 5}, "bad_request"),
        ({"name": "gold", "src": "HK", "dst": "ZZ", "rate_bytes_per_s": 10}, "bad_request"),
        ({"name": "gold", "src": "HK", "dst": "HK", "rate_bytes_per_s": 10}, "bad_request"),
        ({"name": "gold", "src": "HK", "dst": "BA", "rate_bytes_per_s": 10,
          "start_s": 5, "end_s": 5}, "bad_request"),
        ({"name": "gold", "src": "HK", "rate_bytes_per_s": 10}, "bad_request"),
        ({"name": "gold", "src": "HK", "dst": "BA", "rate_bytes_per_s": 10, "colour": 1},
         "bad_request"),
        ({"name": "silver", "src": "HK", "dst": "BA", "rate_bytes_per_s": 10},
         "unknown_tenant"),
        # 0.7 C more on HK->BA next to the file's 0.5 C: 1.2 C > C with HK-LA down
        ({"name": "bronze", "src": "HK", "dst": "BA", "rate_bytes_per_s": 0.7 * C},
         "reservation_refused"),
        ({"name": "gold", "src": "HK", "dst": "BA", "rate_bytes_per_s": 3 * C},
         "reservation_refused"),
    ],
)  # fmt: skip
def test_a_bad_live_reservation_changes_nothing(tmp_path, request_, code):
    text = FILE.replace("weight = 1\n", "weight = 1\n" + reservation(0.5 * C), 1)
    controller, book = tenant_controller(text, tmp_path)
    handler = ApiHandler(controller)
    before = (book.record(), book.version, controller.journal.tenants)
    reply = handler.handle({"v": 1, "op": "tenant_reserve", **request_}, OPERATOR)
    assert not reply["ok"] and reply["code"] == code, reply
    assert "\n" not in reply["error"] and reply["error"]
    assert (book.record(), book.version, controller.journal.tenants) == before
    reply = handler.handle({"v": 1, "op": "tenant_unreserve", "name": "gold", "src": "HK",
                            "dst": "NY"}, OPERATOR)  # fmt: skip
    assert reply["code"] == "bad_request" and book.record() == before[0]
    controller.close()


def test_a_job_reserves_for_its_own_tenant_only_and_within_its_cap():
    capped = FILE.replace("weight = 1\n", "weight = 1\nmax_reserved_bytes_per_s = 3e6\n", 1)
    controller, book = tenant_controller(capped)
    handler = ApiHandler(controller)
    job = Identity("etl", Role.JOB, tenant="gold")
    ask = {"v": 1, "op": "tenant_reserve", "src": "LA", "dst": "NY", "rate_bytes_per_s": 1e6}
    reply = handler.handle(ask, job)
    assert reply["ok"] and reply["tenant"]["name"] == "gold"
    assert reply["tenant"]["max_reserved_bytes_per_s"] == 3e6
    assert [s.src for s in book.limits["gold"].reservations] == ["LA"]
    reply = handler.handle(ask | {"name": "bronze"}, job)
    assert reply["code"] == "forbidden" and not book.limits["bronze"].reservations
    # 1e6 held + 2.5e6 asked = 3.5e6 > 3e6: refused, nothing changed
    before = book.record()
    reply = handler.handle(ask | {"src": "HK", "rate_bytes_per_s": 2.5e6}, job)
    assert reply["code"] == "reservation_refused", reply
    assert "max_reserved_bytes_per_s: its reservations hold 3.5e+06 B/s at once" in reply["error"]
    assert book.record() == before
    # open windows all overlap: 1e6 + 2e6 = 3e6 is at the cap, admitted
    reply = handler.handle(ask | {"src": "HK", "rate_bytes_per_s": 2e6}, job)
    assert reply["ok"], reply
    controller.close()


def test_a_job_of_a_tenant_without_a_cap_may_not_reserve_but_an_operator_may():
    controller, book = tenant_controller(FILE)
    handler = ApiHandler(controller)
    job = Identity("etl", Role.JOB, tenant="gold")
    ask = {"v": 1, "op": "tenant_reserve", "src": "LA", "dst": "NY", "rate_bytes_per_s": 1e6}
    reply = handler.handle(ask, job)
    assert reply["code"] == "forbidden" and "only an operator reserves" in reply["error"]
    assert not book.limits["gold"].reservations
    reply = handler.handle(ask | {"name": "gold"}, OPERATOR)
    assert reply["ok"] and reply["tenant"]["max_reserved_bytes_per_s"] is None
    # the operator gives gold a cap below what it holds: refused, nothing changed
    before = book.record()
    reply = handler.handle({"v": 1, "op": "tenant_set", "name": "gold", "weight": 1,
                            "max_reserved_bytes_per_s": 5e5}, OPERATOR)  # fmt: skip
    assert reply["code"] == "bad_request" and "hold 1e+06 B/s at once" in reply["error"]
    assert book.record() == before
    reply = handler.handle({"v": 1, "op": "tenant_set", "name": "gold", "weight": 1,
                            "max_reserved_bytes_per_s": 1e6}, OPERATOR)  # fmt: skip
    assert reply["ok"] and len(reply["tenant"]["reservations"]) == 1
    controller.close()


def test_windows_that_do_not_overlap_are_capped_one_at_a_time():
    from terra_controller.tenants_config import ReservationSpec, peak_reserved

    def spec(rate_, start, end):
        return ReservationSpec(src="HK", dst="BA", rate_bytes_per_s=rate_, start_s=start,
                               end_s=end)  # fmt: skip

    # [0, 10) 3 and [10, 20) 4 never together: 4; [5, 15) 2 overlaps both: max(3+2, 4+2) = 6
    assert peak_reserved([spec(3, 0, 10), spec(4, 10, 20)]) == 4
    assert peak_reserved([spec(3, 0, 10), spec(4, 10, 20), spec(2, 5, 15)]) == 6
    assert peak_reserved([spec(3, None, 10), spec(4, 9, None)]) == 7
    assert peak_reserved([]) == 0.0


def test_the_files_reservations_apply_from_the_first_round_within_their_window():
    import time

    later = time.time() + 3600
    text = FILE.replace("weight = 1\n", "weight = 1\n" + reservation(0.5 * C), 1)
    text += reservation(0.2 * C, src="LA", dst="NY") + f"start_s = {later:.0f}\n"
    controller, book = tenant_controller(text)
    handler = ApiHandler(controller)
    gold = submit(handler, "etl", "gold", "hk1", "ba1")
    for i in range(3):
        submit(handler, f"bulk{i}", "bronze", "hk2", "ba2")
    controller.run_round()
    assert rate(controller, gold) >= 0.5 * C * (1 - 1e-6)
    row = handler.handle({"v": 1, "op": "tenant", "name": "gold"}, OPERATOR)["tenant"]
    assert row["reserved_bytes_per_s"] == 0.5 * C  # the LA->NY one starts in an hour
    assert len(row["reservations"]) == 2
    (late,) = [r for r in controller.policy.inner.spec.reservations if r.src == "LA"]
    assert late.start > controller.now() + 3500  # on the round clock


def test_terra_sim_honours_the_file_and_refuses_what_does_not_fit(tmp_path, capsys):
    from terra_sim.cli import main as sim

    good = tmp_path / "t.toml"
    good.write_text(FILE.replace("weight = 1\n", "weight = 1\n" + reservation(0.5 * C), 1))
    argv = ["--topology", "swan", "--workload", "fb", "--limit", "6", "--scheduler", "terra"]
    assert sim([*argv, "--tenants", str(good)]) == 0
    bad = tmp_path / "bad.toml"
    bad.write_text(FILE.replace("weight = 1\n", "weight = 1\n" + reservation(3e8), 1))
    capsys.readouterr()
    assert sim([*argv, "--tenants", str(bad)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"terra-sim: error: {bad}: reservations refused: does not fit with "
                          "every link up") and "\n" not in err  # fmt: skip
