"""Checks of the tenant operations (terra_controller/tenant_api.py, tenant_cli.py,
tenants_config.py): limits the wire can carry, operators naming the tenant they reserve
for, `tenant set` keeping the limits it leaves out, a job seeing its own tenant only, and
readable refusals."""

from __future__ import annotations

import argparse

import msgpack
import pytest

from terra_controller.api_server import _DOING, _OPS, ApiHandler
from terra_controller.cli import main
from terra_controller.tenant_api import set_args
from terra_controller.tenant_cli import add_tenant_ctl, run_tenant_ctl
from terra_controller.tenants_config import MAX_LIMIT, TenantsError, parse_tenants
from terra_security.pki import INSECURE, Identity, Role
from terra_wire.api import decode_request, pack_message
from terra_wire.api_session import TerraError
from tests.unit.test_tenants_live import OPERATOR, TWO, tenant_controller

HUGE = 99999999999999999999  # above 2**64-1: msgpack cannot carry it
LIMITED = TWO.replace("weight = 1\n", "weight = 1\nmax_coflows = 5\nmax_bytes = 7000\n"
                      "max_reserved_bytes_per_s = 3e6\n")  # fmt: skip


class WireClient:
    """A ctl client that sends its requests through the wire's encoding to an ApiHandler
    (as TerraClient.tenant_request: TerraError for an error reply)."""

    def __init__(self, handler: ApiHandler, identity: Identity) -> None:
        self.handler, self.identity, self.sent = handler, identity, []

    def tenant_request(self, request: dict) -> dict:
        message = pack_message({"v": 1, **request})  # OverflowError beyond 2**64-1
        self.sent.append(request)
        reply = self.handler.handle(decode_request(message[4:]), self.identity)
        reply = msgpack.unpackb(pack_message(reply)[4:])  # the reply must fit the wire too
        if not reply["ok"]:
            raise TerraError(reply["code"], reply["error"])
        return reply


def ctl_args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_tenant_ctl(parser.add_subparsers(dest="op"))
    return parser.parse_args(["tenant", *argv])


# ---- limits the wire can carry --------------------------------------------------------------


@pytest.mark.parametrize(
    "key, value, line",
    [("max_coflows", HUGE, 6), ("max_bytes", 2**64, 6), ("max_coflows", MAX_LIMIT + 1, 6)],
)
def test_a_limit_beyond_the_wire_is_one_line_naming_its_line(key, value, line):
    with pytest.raises(TenantsError) as err:
        parse_tenants(TWO + f"{key} = {value}\n", "t.toml")
    assert str(err.value) == (
        f"t.toml: line {line}: tenants.bronze.{key}: expected `int` <= {MAX_LIMIT}"
    )
    config = parse_tenants(TWO + f"{key} = {MAX_LIMIT}\n", "t.toml")
    assert getattr(config.tenants["bronze"], key) == MAX_LIMIT


def test_a_tenants_file_with_a_huge_limit_exits_2(tmp_path, capsys):
    bad = tmp_path / "t.toml"
    bad.write_text(TWO + f"max_coflows = {HUGE}\n")
    with pytest.raises(SystemExit) as exit_:
        main(["--topology", "swan", "--insecure", "--no-openflow", "--tenants", str(bad)])
    assert exit_.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err == (
        f"terra-controller: {bad}: line 6: tenants.bronze.max_coflows: expected `int` <= "
        f"{MAX_LIMIT}"
    )


def test_a_huge_limit_set_live_is_refused_and_the_list_still_answers():
    controller, book = tenant_controller(TWO)
    handler = ApiHandler(controller)
    before = book.record()
    for key in ("max_coflows", "max_bytes"):
        reply = handler.handle({"v": 1, "op": "tenant_set", "name": "gold", "weight": 1,
                                key: MAX_LIMIT + 1}, OPERATOR)  # fmt: skip
        assert reply["code"] == "bad_request" and f"<= {MAX_LIMIT}" in reply["error"]
        assert "\n" not in reply["error"] and book.record() == before
    reply = handler.handle({"v": 1, "op": "tenant_set", "name": "gold", "weight": 1,
                            "max_bytes": MAX_LIMIT}, OPERATOR)  # fmt: skip
    assert reply["ok"] and reply["tenant"]["max_bytes"] == MAX_LIMIT
    rows = WireClient(handler, OPERATOR).tenant_request({"op": "tenants"})["tenants"]
    assert rows[0]["max_bytes"] == MAX_LIMIT
    controller.close()


def test_ctl_tenant_set_with_a_huge_limit_is_one_line_and_sends_nothing(capsys):
    controller, book = tenant_controller(TWO)
    client = WireClient(ApiHandler(controller), OPERATOR)
    before = book.record()
    for key in ("--max-coflows", "--max-bytes"):
        rc = run_tenant_ctl(client, ctl_args("set", "c", "--weight", "1", key, str(HUGE)))
        err = capsys.readouterr().err
        assert rc == 1 and err.count("\n") == 1, err
        assert err.startswith("terra-controller ctl: bad_request: tenant c: max_")
        assert f"<= {MAX_LIMIT}" in err
    assert client.sent == [] and book.record() == before
    controller.close()


def test_ctl_tenant_never_prints_a_traceback_for_what_the_wire_cannot_carry(capsys):
    class Overflowing:
        def tenant_request(self, request):
            raise OverflowError("Integer value out of range")

    assert run_tenant_ctl(Overflowing(), ctl_args("show", "gold")) == 1
    assert capsys.readouterr().err == "terra-controller ctl: Integer value out of range\n"


# ---- operators name the tenant they reserve for ---------------------------------------------


@pytest.mark.parametrize(
    "ask",
    [
        {"op": "tenant_reserve", "src": "HK", "dst": "BA", "rate_bytes_per_s": 1e6},
        {"op": "tenant_unreserve", "src": "HK", "dst": "BA"},
    ],
)
def test_an_operator_names_the_tenant_it_reserves_for(ask):
    controller, book = tenant_controller(TWO)
    handler = ApiHandler(controller)
    before = (book.record(), book.version)
    reply = handler.handle({"v": 1, **ask}, OPERATOR)
    verb = ask["op"].removeprefix("tenant_")
    assert reply["code"] == "bad_request", reply
    assert reply["error"] == f"an operator names the tenant (tenant {verb} NAME)"
    assert (book.record(), book.version) == before
    # an insecure client (every role, no certificate) still gets the default tenant
    reserve = {"op": "tenant_reserve", "src": "HK", "dst": "BA", "rate_bytes_per_s": 1e6}
    if ask["op"] == "tenant_unreserve":
        assert handler.handle({"v": 1, **reserve}, INSECURE)["ok"]
    reply = handler.handle({"v": 1, **ask}, INSECURE)
    assert reply["ok"] and reply["tenant"]["name"] == book.fallback() == "gold"
    controller.close()


def test_ctl_tenant_reserve_without_a_name_is_refused_for_an_operator(capsys):
    controller, book = tenant_controller(TWO)
    client = WireClient(ApiHandler(controller), OPERATOR)
    args = ctl_args("reserve", "--src", "HK", "--dst", "BA", "--rate-bytes-per-s", "1e6")
    assert run_tenant_ctl(client, args) == 1
    assert capsys.readouterr().err == (
        "terra-controller ctl: bad_request: an operator names the tenant (tenant reserve NAME)\n"
    )
    assert not book.limits["gold"].reservations
    args = ctl_args("reserve", "bronze", "--src", "HK", "--dst", "BA",
                    "--rate-bytes-per-s", "1e6")  # fmt: skip
    assert run_tenant_ctl(client, args) == 0
    assert len(book.limits["bronze"].reservations) == 1
    controller.close()


# ---- tenant set keeps the limits it leaves out ----------------------------------------------


def test_tenant_set_keeps_the_limits_it_leaves_out():
    controller, book = tenant_controller(LIMITED)
    handler = ApiHandler(controller)
    reply = handler.handle({"v": 1, "op": "tenant_set", "name": "bronze", "weight": 2},
                           OPERATOR)  # fmt: skip
    assert reply["ok"], reply
    row = reply["tenant"]
    assert (row["weight"], row["max_coflows"], row["max_bytes"]) == (2.0, 5, 7000)
    assert row["max_reserved_bytes_per_s"] == 3e6
    # a limit given changes; one given as nil is cleared; the others stay
    reply = handler.handle({"v": 1, "op": "tenant_set", "name": "bronze", "weight": 2,
                            "max_coflows": 9, "max_bytes": None}, OPERATOR)  # fmt: skip
    row = reply["tenant"]
    assert (row["max_coflows"], row["max_bytes"], row["max_reserved_bytes_per_s"]) == (
        9, None, 3e6)  # fmt: skip
    # a new tenant has the limits given only
    reply = handler.handle({"v": 1, "op": "tenant_set", "name": "silver", "weight": 1,
                            "max_bytes": 10}, OPERATOR)  # fmt: skip
    row = reply["tenant"]
    assert (row["max_coflows"], row["max_bytes"], row["max_reserved_bytes_per_s"]) == (
        None, 10, None)  # fmt: skip
    controller.close()


def test_a_bad_limit_given_changes_nothing_while_the_others_are_kept():
    controller, book = tenant_controller(LIMITED)
    handler = ApiHandler(controller)
    before = (book.record(), book.version)
    reply = handler.handle({"v": 1, "op": "tenant_set", "name": "bronze", "weight": 2,
                            "max_coflows": 0}, OPERATOR)  # fmt: skip
    assert reply["code"] == "bad_request" and (book.record(), book.version) == before
    controller.close()


def test_set_args_keeps_what_a_change_leaves_out_and_reads_older_changes_as_given():
    _, book = tenant_controller(LIMITED)
    assert set_args(book, ["bronze", 2, None, None, None, []]) == ["bronze", 2, 5, 7000, 3e6]
    assert set_args(book, ["bronze", 2, None, 8, None, ["max_coflows", "max_bytes"]]) == [
        "bronze", 2, None, 8, 3e6]  # fmt: skip
    assert set_args(book, ["silver", 2, None, None, None, []]) == ["silver", 2, None, None, None]
    # a change journaled before `given` sets every limit as recorded
    assert set_args(book, ["bronze", 2, None, None, None]) == ["bronze", 2, None, None, None]
    with pytest.raises(Exception) as err:
        set_args(book, ["bronze", 2, None, None, None, ["colour"]])
    assert getattr(err.value, "code", None) == "bad_request"


def test_ctl_tenant_set_sends_the_limits_given_and_none_clears_one(capsys):
    controller, book = tenant_controller(LIMITED)
    client = WireClient(ApiHandler(controller), OPERATOR)
    assert run_tenant_ctl(client, ctl_args("set", "bronze", "--weight", "2")) == 0
    assert client.sent[-1] == {"op": "tenant_set", "name": "bronze", "weight": 2.0}
    lim = book.limits["bronze"]
    assert (lim.weight, lim.max_coflows, lim.max_bytes) == (2.0, 5, 7000)
    argv = ("set", "bronze", "--weight", "2", "--max-bytes", "none", "--max-coflows", "6")
    assert run_tenant_ctl(client, ctl_args(*argv)) == 0
    assert client.sent[-1] == {"op": "tenant_set", "name": "bronze", "weight": 2.0,
                               "max_coflows": 6, "max_bytes": None}  # fmt: skip
    lim = book.limits["bronze"]
    assert (lim.max_coflows, lim.max_bytes, lim.max_reserved_bytes_per_s) == (6, None, 3e6)
    capsys.readouterr()
    with pytest.raises(SystemExit):
        ctl_args("set", "bronze", "--weight", "2", "--max-coflows", "many")
    assert "invalid int value: 'many'" in capsys.readouterr().err
    controller.close()


def test_a_kept_limit_survives_a_replay(tmp_path):
    from terra_controller.core_log import CoreRecorder, read_events, replay

    controller, book = tenant_controller(LIMITED)
    controller.recorder = CoreRecorder(tmp_path / "core.log")
    handler = ApiHandler(controller)
    change = {"v": 1, "op": "tenant_set", "name": "bronze", "weight": 2}
    assert handler.handle(change, OPERATOR)["ok"]
    controller.recorder.close()
    again, book = tenant_controller(LIMITED)
    report = replay(again, list(read_events(tmp_path / "core.log")))
    assert report.identical, report.mismatches
    lim = book.limits["bronze"]
    assert (lim.weight, lim.max_coflows, lim.max_bytes) == (2.0, 5, 7000)


# ---- a job sees its own tenant only ---------------------------------------------------------


def test_a_job_asking_for_another_tenant_is_forbidden():
    controller, _ = tenant_controller(TWO)
    handler = ApiHandler(controller)
    job = Identity("etl", Role.JOB, tenant="bronze")
    reply = handler.handle({"v": 1, "op": "tenant", "name": "gold"}, job)
    assert (reply["code"], reply["error"]) == ("forbidden", "a job sees its own tenant only")
    for ask in ({}, {"name": "bronze"}):
        assert handler.handle({"v": 1, "op": "tenant", **ask}, job)["tenant"]["name"] == "bronze"
    controller.close()


def test_a_mapped_job_sees_the_tenant_it_is_scheduled_in():
    controller, _ = tenant_controller('[default]\naction = "map"\ntenant = "bronze"\n' + TWO)
    handler = ApiHandler(controller)
    job = Identity("x", Role.JOB, tenant="silver")
    for ask in ({}, {"name": "bronze"}, {"name": "silver"}):
        assert handler.handle({"v": 1, "op": "tenant", **ask}, job)["tenant"]["name"] == "bronze"
    assert handler.handle({"v": 1, "op": "tenant", "name": "gold"}, job)["code"] == "forbidden"
    controller.close()


def test_ctl_tenant_show_of_another_tenant_by_a_job_exits_1(capsys):
    controller, _ = tenant_controller(TWO)
    client = WireClient(ApiHandler(controller), Identity("etl", Role.JOB, tenant="bronze"))
    assert run_tenant_ctl(client, ctl_args("show", "gold")) == 1
    assert capsys.readouterr().err == (
        "terra-controller ctl: forbidden: a job sees its own tenant only\n"
    )
    controller.close()


# ---- readable refusals ----------------------------------------------------------------------


def test_a_job_listing_tenants_is_told_in_words():
    controller, _ = tenant_controller(TWO)
    handler = ApiHandler(controller)
    job = Identity("etl", Role.JOB, tenant="gold")
    reply = handler.handle({"v": 1, "op": "tenants"}, job)
    assert (reply["code"], reply["error"]) == ("forbidden", "job 'etl' may not list tenants")
    reply = handler.handle({"v": 1, "op": "tenant_set", "name": "gold", "weight": 2}, job)
    assert reply["error"] == "job 'etl' may not add or change tenants"
    reply = handler.handle({"v": 1, "op": "link_state", "a": "HK", "b": "BA", "up": False}, job)
    assert reply["error"] == "job 'etl' may not change link states"
    controller.close()


def test_every_operation_has_words_for_a_refusal():
    assert set(_DOING) == set(_OPS)
    assert all("_" not in words for words in _DOING.values())
