"""AsyncTerraClient against a real API server (mutual TLS, the in-process controller of
test_api.py): concurrent calls on one connection from one event loop, the same results and
errors as TerraClient, and the resubmission after a controller restart."""

from __future__ import annotations

import asyncio
import socket
import threading
import time

import pytest
from test_api import Server, flow

from terra_controller.async_client import AsyncTerraClient
from terra_controller.client import TerraError


@pytest.fixture
def server(pki):
    srv = Server(pki)
    yield srv
    srv.stop()


def async_client(server: Server, name: str = "job1", timeout: float = 10) -> AsyncTerraClient:
    return AsyncTerraClient(server.host, server.port, pki=server.pki, name=name, timeout=timeout)


def test_100_concurrent_submits_and_status_calls_share_one_connection(server):
    async def main():
        async with async_client(server) as c:
            await c.list_agents()  # connected: the server's threads for it are running
            threads_before = threading.active_count()
            ids = await asyncio.gather(
                *(c.submit_coflow([flow(f"f{i}", size=1000 + i)]) for i in range(100))
            )
            threads_during = threading.active_count()
            statuses = await asyncio.gather(*(c.check_status(cid) for cid in ids))
            return ids, statuses, threads_during - threads_before

    ids, statuses, new_threads = asyncio.run(main())
    assert sorted(ids) == list(range(100))  # every submit answered, each once
    assert [s["id"] for s in statuses] == ids
    assert [s["bytes_total"] for s in statuses] == [1000 + i for i in range(100)]
    assert len(server.conns) == 1  # pipelined on one connection
    assert new_threads <= 0  # no thread per call (other tests' threads may end meanwhile)
    assert len(server.controller.registry.coflows) == 100


def test_same_results_and_errors_as_the_blocking_client(server):
    async def main():
        async with async_client(server) as c:
            cid = await c.submit_coflow([flow("f1")], deadline=None)
            await c.update_coflow(cid, [flow("f2", "b1", "c1", 77)])
            status = await c.checkStatus(cid)
            listed = await c.list_coflows()
            agents = await c.list_agents()
            await c.cancel_coflow(cid)
            final = await c.wait(cid, timeout=5)
            errors = []
            for call in (c.check_status(999), c.submit_coflow([flow("x", "a1", "zz")]),
                         c.set_link_state("A", "B", False)):  # fmt: skip
                with pytest.raises(TerraError) as info:
                    await call
                errors.append(info.value.code)
            return cid, status, listed, agents, final, errors, dict(c.session.open)

    cid, status, listed, agents, final, errors, still_open = asyncio.run(main())
    assert [f["id"] for f in status["flows"]] == ["f1", "f2"]
    assert [c["id"] for c in listed] == [cid]
    assert [a["id"] for a in agents["agents"]] == ["a1", "a2", "b1", "c1"]
    assert final["state"] == "cancelled"
    assert errors == ["unknown_coflow", "unknown_agent", "forbidden"]
    assert still_open == {}
    with server.client("job1") as blocking:
        assert [c["id"] for c in blocking.list_coflows()] == [cid]  # the same job's view
        assert blocking.check_status(cid)["state"] == "cancelled"


def test_a_bad_name_or_tags_is_refused_before_sending(server):
    async def main():
        c = async_client(server)
        for name, tags in (("", None), ("x" * 129, None), (None, ["a", "a"]), (None, ["\n"])):
            with pytest.raises(TerraError) as info:
                await c.submit_coflow([flow("f")], name=name, tags=tags)
            assert info.value.code == "bad_request"
        await c.close()

    asyncio.run(main())
    assert server.conns == []  # nothing was sent


def test_resubmits_open_coflows_after_a_controller_restart(pki):
    first = Server(pki)
    second = None

    async def before(c):
        done = await c.submit_coflow([flow("x", "a1", "a2")])  # intra-DC only: done at once
        assert (await c.check_status(done))["state"] == "done"
        open_id = await c.submit_coflow([flow("f1")])
        await c.update_coflow(open_id, [flow("f2", "b1", "c1", 77)])
        return open_id

    async def main():
        nonlocal second
        c = async_client(first)
        try:
            open_id = await before(c)
            first.stop()
            second = Server(pki, first.port)  # a new controller on the same port
            status = await c.check_status(open_id)  # reconnects, resubmits, then asks
            assert [f["id"] for f in status["flows"]] == ["f1", "f2"]
            assert set(second.controller.registry.coflows) == {open_id}
            assert await c.submit_coflow([flow("g")]) == open_id + 1
        finally:
            await c.close()

    try:
        asyncio.run(main())
    finally:
        if second is not None:
            second.stop()


def test_calls_in_flight_resend_after_a_broken_connection_and_submits_run_once(server):
    def break_connection_midway():
        while len(server.controller.registry.coflows) < 20:
            time.sleep(0.001)
        socket.socket.shutdown(server.conns[0], socket.SHUT_RDWR)  # replies in flight lost

    async def main():
        async with async_client(server) as c:
            await c.list_agents()
            breaker = threading.Thread(target=break_connection_midway)
            breaker.start()
            ids = await asyncio.gather(
                *(c.submit_coflow([flow(f"f{i}", size=1000 + i)]) for i in range(200))
            )
            breaker.join()
            return ids

    ids = asyncio.run(main())
    assert len(server.conns) >= 2  # it reconnected
    # every submit answered, none executed twice (a resent submit keeps its ref): 200 coflows
    assert sorted(ids) == list(range(200))
    assert len(server.controller.registry.coflows) == 200
    sizes = {server.controller.registry.coflows[cid].bytes_total for cid in ids}
    assert sizes == {1000 + i for i in range(200)}


def test_the_client_serves_another_event_loop_after_close(server):
    c = async_client(server)

    async def submit():
        cid = await c.submit_coflow([flow("f")])
        await c.close()
        return cid

    first, second = asyncio.run(submit()), asyncio.run(submit())
    assert second == first + 1
    assert set(c.session.open) == {first, second}  # both remembered for a resubmission
