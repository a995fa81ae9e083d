"""The failover rules of agents and clients given several controllers (terra_wire/failover.py):
round robin, backoff once per full pass, a standby's "not_leader" naming the leader."""

from __future__ import annotations

import pytest

from terra_wire.api_session import TerraError
from terra_wire.failover import (
    ControllerList,
    NotLeader,
    Retry,
    check_leader,
    client_controllers,
    format_address,
    parse_address,
    parse_addresses,
)

A, B, C = ("10.0.0.1", 6700), ("10.0.0.2", 6700), ("10.0.0.3", 6700)


def test_addresses_parse_from_strings_pairs_and_lists():
    assert parse_address("10.0.0.1:6700") == A
    assert parse_address(("10.0.0.1", "6700")) == A
    assert parse_address("[::1]:80") == ("::1", 80)
    assert format_address(("::1", 80)) == "[::1]:80"
    assert parse_addresses("10.0.0.1:6700, 10.0.0.2:6700,10.0.0.1:6700") == [A, B]
    assert parse_addresses(["10.0.0.2:6700", A]) == [B, A]
    for bad in ["10.0.0.1", ":80", "h:99999", "h:x", "", None, ("h", 1, 2)]:
        with pytest.raises(ValueError):
            parse_addresses([bad])
    with pytest.raises(ValueError):
        parse_addresses([])


def test_client_takes_host_and_port_or_controllers_not_both():
    assert client_controllers("10.0.0.1", 6700, None).addresses == [A]
    assert client_controllers(None, None, ["10.0.0.1:6700", "10.0.0.2:6700"]).addresses == [A, B]
    for args in [(None, None, None), ("h", 1, ["h:2"]), ("h", None, None)]:
        with pytest.raises(ValueError):
            client_controllers(*args)


def test_round_robin_with_backoff_once_per_full_pass():
    ring = ControllerList([A, B, C])
    assert ring.current == A
    assert ring.failed(A) is False and ring.current == B  # no wait: try the next at once
    assert ring.failed(B) is False and ring.current == C
    assert ring.failed(C) is True and ring.current == A  # a full pass failed: wait now
    assert ring.failed(A) is False
    ring.reached()  # B answered: the count starts again
    assert [ring.failed(ring.current) for _ in range(3)] == [False, False, True]


def test_one_controller_waits_before_every_retry():
    ring = ControllerList([A])
    assert [ring.failed(A) for _ in range(3)] == [True, True, True]
    assert ring.current == A


def test_a_stale_failure_does_not_skip_an_address():
    ring = ControllerList([A, B, C])
    ring.failed(A)
    assert ring.failed(A) is False and ring.current == B  # a second caller on A's connection
    assert ring.redirect(A, C) is False and ring.current == B


def test_a_standby_naming_the_leader_sends_the_next_attempt_there():
    ring = ControllerList([A, B])
    assert ring.redirect(A, B) is False and ring.current == B
    ring.reached()
    leader = ("10.0.0.9", 6700)  # not in the list: learned
    assert ring.redirect(B, leader) is False and ring.current == leader
    assert ring.addresses == [A, B, leader]
    assert ring.redirect(leader, None) is False and ring.current == A  # not known: next
    # standbys naming each other still wait once per pass
    ring = ControllerList([A, B])
    assert [ring.redirect(A, B), ring.redirect(B, A)] == [False, True]


def test_learned_leaders_are_bounded():
    ring = ControllerList([A])
    for i in range(40):
        ring.redirect(ring.current, ("10.1.0.1", 1000 + i))
    assert ring.addresses[0] == A and len(ring.addresses) == 17
    assert ring.current == ("10.1.0.1", 1039)


def test_check_leader_raises_for_a_standby_reply_only():
    ok = {"v": 1, "ok": True, "instance": "x"}
    assert check_leader(ok) is ok
    refused = {"v": 1, "ok": False, "code": "bad_request", "error": "no"}
    assert check_leader(refused) is refused
    reply = {"v": 1, "ok": False, "code": "not_leader", "leader": "10.0.0.2:6700",
             "error": "this controller is a standby; the leader is 10.0.0.2:6700"}  # fmt: skip
    with pytest.raises(NotLeader) as info:
        check_leader(reply)
    assert info.value.leader == B and info.value.code == "not_leader"
    assert isinstance(info.value, TerraError)
    for leader in (None, "nonsense", 7):
        with pytest.raises(NotLeader) as info:
            check_leader(dict(reply, leader=leader))
        assert info.value.leader is None


class Clock:
    """Seconds advanced by hand."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_retry_waits_per_pass_and_gives_up_in_one_line_naming_every_address():
    clock = Clock()
    ring = ControllerList([A, B])
    retry = Retry(ring, timeout=1.0, clock=clock)
    refused = ConnectionRefusedError(111, "Connection refused")
    assert retry.failed(A, refused) == 0.0
    assert retry.failed(B, refused) == 0.05  # a full pass: the backoff, doubling
    assert retry.failed(A, refused) == 0.0
    assert retry.failed(B, refused) == 0.1
    standby = NotLeader("this controller is a standby;\nthe leader is not known yet", None)
    clock.now += 0.95
    assert retry.failed(A, standby) == 0.0  # B may still answer at once
    with pytest.raises(ConnectionError) as info:
        retry.failed(B, standby)  # the next backoff (0.2 s) would pass the deadline
    message = str(info.value)
    assert "\n" not in message
    assert "10.0.0.1:6700, 10.0.0.2:6700" in message and "within 1 s" in message
    assert "last: 10.0.0.2:6700: not_leader: this controller is a standby; the leader" in message
