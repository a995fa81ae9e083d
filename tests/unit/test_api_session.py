"""The clients' sans-IO protocol (terra_wire/api_session.py): requests, refs, reply checks,
the open coflows and their resubmission after a controller restart, framing of replies."""

from __future__ import annotations

import msgpack
import pytest

from terra_wire.api import MAX_MESSAGE_BYTES, WireError
from terra_wire.api_session import (
    ClientSession,
    TerraError,
    decode_reply,
    frame,
    reply_length,
)


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


FLOWS = [{"id": "f", "src": "a1", "dst": "b1", "bytes": 10}]


def test_submit_carries_a_ref_its_resend_reuses_and_remembers_the_coflow():
    clock = Clock()
    session = ClientSession(clock=clock)
    call = session.submit(FLOWS, deadline=30, name="etl", tags=["nightly"])
    assert call.request["op"] == "submit" and len(call.request["ref"]) == 24
    assert call.request["name"] == "etl" and call.request["tags"] == ["nightly"]
    assert session.submit(FLOWS).request["ref"] != call.request["ref"]  # one per request
    sent = msgpack.unpackb(frame(call.request, req=5)[4:])
    assert sent["v"] == 1 and sent["req"] == 5 and sent["ref"] == call.request["ref"]
    assert session.finish(call, {"ok": True, "coflow": 7}) == 7
    assert session.open[7]["deadline_at"] == 130.0 and session.open[7]["name"] == "etl"
    clock.t = 110.0
    again = session.resubmit_request(7)
    assert again["coflow"] == 7 and again["age_s"] == 10.0 and again["deadline"] == 20.0
    assert again["name"] == "etl" and again["tags"] == ["nightly"]
    assert "ref" not in again


def test_error_replies_raise_and_gone_coflows_are_forgotten():
    session = ClientSession()
    session.finish(session.submit(FLOWS), {"ok": True, "coflow": 3})
    with pytest.raises(TerraError) as info:
        session.finish(session.status(3), {"ok": False, "code": "unknown_coflow", "error": "x"})
    assert info.value.code == "unknown_coflow" and session.open == {}
    session.finish(session.submit(FLOWS), {"ok": True, "coflow": 4})
    status = {"ok": True, "status": {"id": 4, "state": "done"}}
    assert session.finish(session.status(4), status)["state"] == "done"
    assert session.open == {}  # final: not resubmitted
    assert session.finish(session.submit(FLOWS), {"ok": True, "coflow": -1}) == -1
    assert session.open == {}  # rejected


def test_a_new_instance_means_resubmit_and_refusals_forget():
    session = ClientSession(max_open=2)
    assert not session.restarted({"instance": "a"})
    for cid in (1, 2, 3):
        session.finish(session.submit(FLOWS), {"ok": True, "coflow": cid})
    assert session.resubmissions() == [2, 3] and session.forgotten == 1
    assert not session.restarted({"instance": "a"})
    assert session.restarted({"instance": "b"})
    assert session.resubmitted(2, {"ok": False, "code": "unknown_agent"}, may_retry=True)
    assert not session.resubmitted(2, {"ok": False, "code": "unknown_agent"}, may_retry=False)
    assert not session.resubmitted(3, {"ok": True, "coflow": 3}, may_retry=True)
    assert session.resubmissions() == [3]


@pytest.mark.parametrize(
    "name, tags",
    [("", None), ("x" * 129, None), ("a\nb", None), (None, ["t"] * 2), (None, [""]),
     (None, ["x" * 65]), (None, [f"t{i}" for i in range(17)]), (None, "tag"), (7, None)],
)  # fmt: skip
def test_bad_names_and_tags_are_refused_before_sending(name, tags):
    with pytest.raises(TerraError) as info:
        ClientSession().submit(FLOWS, name=name, tags=tags)
    assert info.value.code == "bad_request"


def test_reply_framing():
    assert reply_length((12).to_bytes(4, "big")) == 12
    with pytest.raises(WireError):
        reply_length((MAX_MESSAGE_BYTES + 1).to_bytes(4, "big"))
    assert decode_reply(msgpack.packb({"ok": True})) == {"ok": True}
    for body in (b"\xc1", msgpack.packb([1, 2])):
        with pytest.raises(WireError):
            decode_reply(body)
