"""Edges of the accept thread and the blocking reader (terra_controller/transport.py) and of
the process-wide link ids the LPs share (terra_core/min_cct.py), on real sockets.

- A message cut short by its deadline shuts the socket down: the caller's next exchange
  fails instead of reading the rest of the old message as a new one.
- `stop_listener` ends the accept thread at once (its port free when it returns), not at
  the thread's next periodic check.
- A link id another thread gave but did not record yet is recorded by whoever returns it.
"""

from __future__ import annotations

import socket
import struct
import threading
import time

import pytest

from terra_controller.transport import ServerSecurity, accept_loop, read_message, stop_listener
from terra_core import min_cct
from terra_wire.api import WireError


def test_a_message_cut_short_by_its_deadline_shuts_the_socket_down():
    a, b = socket.socketpair()
    with a, b:
        b.settimeout(5)
        a.sendall(struct.pack(">I", 100) + b"x" * 10)  # 10 of 100 body bytes, then silence
        with pytest.raises(WireError, match="within 0.3 s"):
            read_message(b, frame_timeout=0.3)
        a.settimeout(5)
        assert a.recv(1) == b""  # the reader's side is shut down: EOF here
        assert read_message(b, frame_timeout=0.3) is None  # closed, not a new message


def test_an_oversized_length_shuts_the_socket_down():
    a, b = socket.socketpair()
    with a, b:
        b.settimeout(5)
        a.sendall(struct.pack(">I", 10**9))
        with pytest.raises(WireError, match="exceeds"):
            read_message(b, max_bytes=1000)
        a.settimeout(5)
        assert a.recv(1) == b""


def test_stop_listener_ends_the_accept_thread_at_once():
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    thread = threading.Thread(
        target=accept_loop,
        args=(listener, lambda *_: None, None, ServerSecurity(None)),
        daemon=True,
    )
    thread.start()
    with socket.create_connection(("127.0.0.1", port), timeout=5):
        pass  # the thread is serving
    time.sleep(0.1)
    start = time.monotonic()
    stop_listener(listener)
    thread.join(5)
    assert not thread.is_alive()
    assert time.monotonic() - start < 0.5  # (its periodic check is 1 s)
    socket.create_server(("127.0.0.1", port)).close()  # the port is free


def test_a_link_id_given_but_not_recorded_yet_is_recorded_by_whoever_returns_it():
    link = ("link-ids-test-a", "link-ids-test-b")
    given = next(min_cct._NEXT_LINK_ID)
    min_cct._LINK_ID[link] = given  # as a thread that ran setdefault and not the next line
    try:
        assert min_cct._link_ids(link) == (given,)
        assert min_cct._LINKS[given] == link
    finally:
        min_cct._LINK_ID.pop(link, None)
        min_cct._LINKS.pop(given, None)
        min_cct._link_ids.cache_clear()
