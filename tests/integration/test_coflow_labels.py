"""A coflow's name and tags: carried by submit, checked with a clear error, shown by status,
list and REST /coflows, kept in the journal across a controller restart (the API server of
test_api.py, mutual TLS)."""

from __future__ import annotations

import asyncio

import pytest
from test_api import Server, flow, triangle

from terra_controller.async_client import AsyncTerraClient
from terra_controller.client import TerraError
from terra_controller.controller import Controller
from terra_controller.rest import RestApp
from terra_core.terra_policy import TerraPolicy


@pytest.fixture
def server(pki):
    srv = Server(pki)
    yield srv
    srv.stop()


def test_status_list_and_rest_show_name_and_tags(server):
    with server.client("job1") as c:
        cid = c.submit_coflow([flow("f")], name="etl-daily", tags=["nightly", "eu"])
        plain = c.submit_coflow([flow("g")])
        status = c.check_status(cid)
        assert (status["name"], status["tags"]) == ("etl-daily", ["nightly", "eu"])
        assert (c.check_status(plain)["name"], c.check_status(plain)["tags"]) == (None, [])
        listed = {x["id"]: (x["name"], x["tags"]) for x in c.list_coflows()}
        assert listed == {cid: ("etl-daily", ["nightly", "eu"]), plain: (None, [])}
    rows = {r["id"]: r for r in RestApp(server.controller, None).coflows()}
    assert rows[cid]["name"] == "etl-daily" and rows[cid]["tags"] == ["nightly", "eu"]


def test_the_async_client_carries_them_too(server):
    async def main():
        async with AsyncTerraClient(server.host, server.port, pki=server.pki, name="job1") as c:
            cid = await c.submit_coflow([flow("f")], name="n", tags=["t"])
            return await c.check_status(cid)

    status = asyncio.run(main())
    assert status["name"] == "n" and status["tags"] == ["t"]


@pytest.mark.parametrize(
    "extra, message",
    [
        ({"name": ""}, "name: 1..128 printable characters"),
        ({"name": "x" * 129}, "name: 1..128 printable characters"),
        ({"name": 5}, "name: 1..128 printable characters"),
        ({"name": "a\tb"}, "name: 1..128 printable characters"),
        ({"tags": "nightly"}, "tags: a list of at most 16 strings"),
        ({"tags": [f"t{i}" for i in range(17)]}, "tags: a list of at most 16 strings"),
        ({"tags": ["a", "a"]}, "tags: distinct strings of 1..64 printable characters"),
        ({"tags": ["x" * 65]}, "tags: distinct strings of 1..64 printable characters"),
        ({"tags": [1]}, "tags: distinct strings of 1..64 printable characters"),
    ],
)
def test_the_controller_refuses_bad_labels_with_a_clear_error(server, extra, message):
    with server.client("job1") as c:
        with pytest.raises(TerraError) as info:  # sent raw: the client would refuse first
            c._call({"op": "submit", "flows": [flow("f")], **extra})
        assert info.value.code == "bad_request" and message in str(info.value)
    assert server.controller.registry.coflows == {}  # nothing changed


def make_controller(state_dir) -> Controller:
    topology = triangle()
    controller = Controller(topology, TerraPolicy(topology), state_dir=state_dir)
    for agent, dc in [("a1", "A"), ("b1", "B")]:
        controller.registry.register_agent(agent, dc, "127.0.0.1:1")
    return controller


def test_name_and_tags_survive_a_controller_restart(tmp_path):
    first = make_controller(tmp_path)
    cid = first.submit([flow("f")], owner="job1", name="etl", tags=["nightly"])
    first.close()
    second = make_controller(tmp_path)  # a new controller on the same journal
    # the client resubmits (its own copy of the labels, or none: the journal has them)
    assert second.submit([flow("f")], coflow_id=cid, age_s=1.0, owner="job1") == cid
    status = second.status(cid)
    assert status["name"] == "etl" and status["tags"] == ["nightly"]
    second.close()
    third = make_controller(tmp_path)  # the journal was rewritten at start-up: still there
    assert third.journal.labels(cid) == ("etl", ("nightly",))
    third.close()
