"""Asking agents about files (terra_controller/file_requests.py): the requests' state lives
on the controller's loop; a worker thread's `ask` waits there for the replies, which the
agent channel's reader hands to `answer` on the loop."""

from __future__ import annotations

import threading
import time

import pytest

from terra_controller.coflow_state import RegistryError
from terra_controller.file_requests import FileRequests
from terra_controller.owner_loop import OwnerLoop


@pytest.fixture
def files():
    owner = OwnerLoop("test-files")
    sent: list[tuple[str, dict]] = []

    def send(agent: str, headers: list[dict]) -> bool:
        assert owner.on_loop
        if agent == "gone":
            return False
        sent.extend((agent, h) for h in headers)
        return True

    requests = FileRequests(owner, send, timeout_s=0.5)
    yield owner, requests, sent
    owner.stop()


def ask_in_thread(requests: FileRequests, asks) -> dict:
    """Run requests.ask(asks) in a thread (as the API's worker); its result or error."""
    out: dict = {}

    def run():
        try:
            out["rows"] = requests.ask(asks)
        except RegistryError as exc:
            out["error"] = (exc.code, str(exc))

    thread = threading.Thread(target=run)
    thread.start()
    out["thread"] = thread
    return out


def wait_sent(sent, n):
    end = time.monotonic() + 5
    while len(sent) < n:
        assert time.monotonic() < end
        time.sleep(0.005)


def test_paged_replies_are_joined_and_answers_of_other_agents_ignored(files):
    owner, requests, sent = files
    out = ask_in_thread(requests, [("a1", [{"t": "list"}]), ("b1", [{"t": "list"}])])
    wait_sent(sent, 2)
    (_, first), (_, second) = sent
    owner.run(requests.answer, "b1", {"id": first["id"], "files": [["/x", 9, "f" * 64]]})
    owner.run(requests.answer, "a1", {"id": first["id"], "files": [["/a", 1, "0" * 64]],
                                      "more": True})  # fmt: skip
    owner.run(requests.answer, "a1", {"id": first["id"], "files": [["/b", 2, "1" * 64]]})
    owner.run(requests.answer, "b1", {"id": second["id"], "files": []})
    out["thread"].join(5)
    assert out["rows"] == [[("/a", 1, "0" * 64), ("/b", 2, "1" * 64)], []]
    assert owner.run(lambda: requests._waiting) == {}


@pytest.mark.parametrize(
    ("agent", "reply", "code"),
    [
        ("a1", None, "unavailable"),  # silence for timeout_s
        ("a1", {"error": "no such file"}, "bad_request"),
        ("gone", None, "unknown_agent"),
    ],
)
def test_silence_refusals_and_unknown_agents_are_one_error_each(files, agent, reply, code):
    owner, requests, sent = files
    out = ask_in_thread(requests, [(agent, [{"t": "list"}])])
    if reply is not None:
        wait_sent(sent, 1)
        owner.run(requests.answer, agent, {"id": sent[0][1]["id"], **reply})
    out["thread"].join(5)
    assert out["error"][0] == code, out
    assert owner.run(lambda: requests._waiting) == {}
