"""The journal on the shared store (a real one-member etcd): changes go out from the store
writer's thread in group commits; a write the store refuses stays queued, `failing` says
why, waiters are told at once, and a probe once the store takes writes again lands all of
it. The journal's owner and the waiters talk to the writer by messages only.
"""

from __future__ import annotations

import threading

import pytest

from mininet_scenarios.etcd_cluster import start_etcd
from terra_controller.etcd_state import EtcdState, parse_endpoints
from terra_controller.journal import CoflowJournal


@pytest.fixture
def etcd(tmp_path):
    procs, addrs = start_etcd(tmp_path, 1)
    yield addrs[0]
    for p in procs:
        p.kill()
        p.wait()


def _store(addr: str) -> EtcdState:
    return EtcdState(parse_endpoints(addr), cluster="journal-test")


def test_refused_writes_stay_queued_and_land_once_the_store_takes_them(etcd):
    store = _store(etcd)  # not the leader yet: every guarded write is refused
    journal = CoflowJournal(None, store=store)
    for cid in range(5):
        journal.admitted(cid, "job", b"s" * 32)
    assert not journal.wait_durable(5)
    assert "not the leader" in journal.failing
    assert _store(etcd).load() == (0, [])

    assert store.campaign({"api": "x"}, 10) is not None
    assert journal.flush()
    assert journal.failing is None
    next_id, entries = _store(etcd).load()
    assert next_id == 5
    assert sorted(records[0]["c"] for records in entries) == [0, 1, 2, 3, 4]


def test_concurrent_waiters_each_see_their_change_durable(etcd):
    store = _store(etcd)
    assert store.campaign({"api": "x"}, 10) is not None
    journal = CoflowJournal(None, store=store)
    results: list[bool] = []
    journal.admitted(0, "job", b"s" * 32)
    waiters = [threading.Thread(target=lambda: results.append(journal.wait_durable(5)))
               for _ in range(8)]  # fmt: skip
    for t in waiters:
        t.start()
    for t in waiters:
        t.join()
    assert results == [True] * 8
    journal.forgotten(0)
    assert journal.wait_durable(5)
    assert _store(etcd).load() == (1, [])
