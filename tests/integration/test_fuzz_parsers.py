"""Hypothesis fuzzing of the three parsers with adversarial input.

1. Coflow API (terra_controller/api_server.py): `ApiHandler.handle` called directly with
   arbitrary and near-valid request maps, then raw byte streams over real mutual TLS.
2. Agent channel (terra_controller/agent_channel.py): fuzzed control messages from
   registered agents over TLS, and `terra_wire.control.validate_control` directly.
3. Data port (overlay/framing.FrameReader, overlay/protocol.validate_data): adversarial
   byte streams through an in-memory stream and over loopback TCP.
4. A slow sender on the API is cut off while another client is served.
5. Topology and workload files (topologies/loaders.py, workloads/json_workload.py): fuzzed
   JSON documents through the loaders.

What every parser must do with bad input: answer with a clear error (or close only that
connection), never crash, keep serving everybody else and change nothing.
"""

from __future__ import annotations

import copy
import ipaddress
import json
import math
import socket
import ssl
import struct
import threading
import time
import zlib
from contextlib import contextmanager
from unittest import mock

import msgpack
import pytest
import trio
from hypothesis import assume, event, given, settings
from hypothesis import strategies as st
from test_api import Server, flow
from test_controller_channel import Agent, channel  # noqa: F401 (fixture)
from test_framing import tcp_pair

from overlay import framing
from overlay.framing import FrameReader, PayloadBuffers
from terra_controller.agent_connection import ChannelError, read_control, send_parts
from terra_controller.api_server import ApiHandler
from terra_controller.transport import read_message
from terra_model.states import CoflowStatus
from terra_security.integrity import MAC_BYTES, mac_bytes
from terra_security.pki import Identity, Role
from terra_wire import control as protocol
from terra_wire.api import MAX_MESSAGE_BYTES, WireError, pack_message
from terra_wire.control import ProtocolError, validate_control, validate_data
from terra_wire.frames import (
    MAX_HEADER_BYTES,
    MAX_PAYLOAD_BYTES,
    FrameError,
    chunk_header,
    encode_frame,
)

_LEN = struct.Struct(">I")
NAN, INF = float("nan"), float("inf")
WIRE_INTS = st.integers(-(2**63), 2**64 - 1)  # what msgpack can carry
ANY_INTS = st.one_of(WIRE_INTS, st.integers(), st.sampled_from([10**30, -(10**30), 10**400]))

# Values that sit on the edges of what the parsers accept.
SPECIAL = [
    2**64 - 1, 2**63 - 1, 2**63, 2**50, 2**50 + 1, -1, -(2**63), 0, 1, True, False,
    "0", "", " 0", "+1", "1", "0x0", "\u0660", 1.0, 1.5, -0.0, NAN, INF, -INF, 5e-324, 1e308,
    None, b"0", b"", [], {}, [0], [None], {"coflow": 0}, "a1", "b1", "ghost", "A", "B", "Z",
    "x" * 300, "../x", "/etc/passwd", "a\0b", "file:", "file:x", "synthetic", "digest",
    "127.0.0.1:0", "127.0.0.1:70000", "h:1", "send", "recv", "source", "sink",
]  # fmt: skip


def scalars(ints) -> st.SearchStrategy:
    return st.one_of(
        st.none(), st.booleans(), ints, st.floats(), st.text(max_size=12), st.binary(max_size=12)
    )


def nested(ints) -> st.SearchStrategy:
    """Arbitrary msgpack-like values: scalars, lists and str-keyed maps, nested."""
    return st.recursive(
        scalars(ints),
        lambda kids: st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=6), kids,
                                                                   max_size=4),
        max_leaves=10,
    )  # fmt: skip


def field_values(ints) -> st.SearchStrategy:
    """What replaces one field of an otherwise valid message."""
    special = st.sampled_from([v for v in SPECIAL if ints is ANY_INTS or _wire_safe(v)])
    return st.one_of(special, nested(ints))


def _wire_safe(value) -> bool:
    try:
        msgpack.packb(value, use_bin_type=True)
    except Exception:
        return False
    return True


def same_kind(value) -> st.SearchStrategy:
    """Plausible replacements: another value of the original's type (ids, sizes, rates)."""
    if isinstance(value, bool):
        return st.booleans()
    if isinstance(value, int):
        return st.one_of(st.integers(0, 2**64 - 1), st.integers(0, 1000))
    if isinstance(value, float):
        return st.floats(0, 1e12)
    if isinstance(value, str):
        return st.one_of(
            st.text(min_size=1, max_size=10),
            st.sampled_from(["0", "1", "f", "g", "a1", "b1", "c1", "A", "B", "C"]),
        )
    return st.just(value)  # fmt: skip


MUTATIONS = ["replace", "replace", "retype", "retype", "delete", "extra", "entry", "entry",
             "none"]  # fmt: skip
ENVELOPE = ("v", "op", "t")  # fields that make everything else moot: changed less often


@st.composite
def mutants(draw, bases: dict, ints, list_fields=()) -> dict:
    """A valid message from `bases` ({name: message}) with one change: a field replaced by a
    fuzzed value or by another value of its type, removed, an unknown field added, or a field
    of a list entry changed that way."""
    msg = copy.deepcopy(bases[draw(st.sampled_from(sorted(bases)))])
    value = field_values(ints)
    how = draw(st.sampled_from(MUTATIONS))
    lists = [k for k in list_fields if isinstance(msg.get(k), list) and msg[k]]
    if how == "entry" and lists:
        entries = msg[draw(st.sampled_from(lists))]
        i = draw(st.integers(0, len(entries) - 1))
        entry = entries[i]
        if isinstance(entry, dict):
            key = draw(st.sampled_from([*sorted(entry), "extra"]))
            what = draw(st.sampled_from(["delete", "replace", "retype"]))
            if what == "delete" and key in entry:
                del entry[key]
            elif what == "retype" and key in entry:
                entry[key] = draw(same_kind(entry[key]))
            else:
                entry[key] = draw(value)
        else:
            entries[i] = draw(st.one_of(value, same_kind(entry)))
        return msg
    keys = sorted(msg)
    inner = [k for k in keys if k not in ENVELOPE] or keys
    key = draw(st.sampled_from(keys) if draw(st.integers(0, 5)) == 0 else st.sampled_from(inner))
    if how in ("replace", "entry"):
        msg[key] = draw(value)
    elif how == "retype":
        msg[key] = draw(same_kind(msg[key]))
    elif how == "delete":
        del msg[key]
    elif how == "extra":
        msg[draw(st.text(max_size=6))] = draw(value)
    return msg


# ---- 1. the coflow API ------------------------------------------------------------------------

JOB1, JOB2 = Identity("job1", Role.JOB), Identity("job2", Role.JOB)
OPERATOR, AGENT = Identity("operator1", Role.OPERATOR), Identity("a1", Role.AGENT)
IDENTITIES = [JOB1, JOB2, OPERATOR, AGENT]

# Coflow 0 belongs to job1, coflow 1 to job2 (see seeded_server).
API_BASES = {
    "hello": {"v": 1, "op": "hello", "req": 7},
    "submit": {
        "v": 1,
        "op": "submit",
        "flows": [flow("n1"), flow("n2", "a2", "c1", 5, src_path="in/x", dst_path="out/x")],
    },
    "submit-deadline": {"v": 1, "op": "submit", "flows": [flow("n1")], "deadline": 60.0},
    "resubmit": {"v": 1, "op": "submit", "flows": [flow("n1")], "coflow": 50, "age_s": 1.0},
    "submit-ref": {"v": 1, "op": "submit", "ref": "r1", "flows": [flow("n1")]},
    "update": {"v": 1, "op": "update", "coflow": 0, "flows": [flow("u1", "b1", "c1", 5)]},
    "status": {"v": 1, "op": "status", "coflow": 0},
    "cancel": {"v": 1, "op": "cancel", "coflow": 1},
    "list": {"v": 1, "op": "list"},
    "link_state": {"v": 1, "op": "link_state", "a": "A", "b": "B", "up": False},
    "capacity": {"v": 1, "op": "capacity", "a": "A", "b": "C", "bytes_per_s": 5e7},
}


@st.composite
def api_requests(draw, ints):
    """Near-valid requests (5 in 7), and arbitrary maps and values."""
    if draw(st.integers(0, 6)) < 5:
        return draw(mutants(API_BASES, ints, list_fields=("flows",)))
    return draw(st.one_of(
        st.dictionaries(st.sampled_from(["v", "op", "coflow", "flows", "req", "ref"]),
                        field_values(ints), max_size=4),
        nested(ints),
    ))  # fmt: skip


@contextmanager
def seeded_server(pki):
    """A Server (test_api) whose job1 owns coflow 0 and job2 coflow 1."""
    server = Server(pki)
    try:
        for who in (JOB1, JOB2):
            reply = server.handler.handle({"v": 1, "op": "submit", "flows": [flow("f")]}, who)
            assert reply["ok"], reply
        yield server
    finally:
        server.stop()


def api_snapshot(server: Server):
    """What no refused request may change in the controller: coflows and their flows, the
    next id, agents and the WAN (states that rounds change on their own are left out)."""
    c = server.controller

    def on_loop():
        reg = c.registry
        coflows = {
            cid: (
                co.state is CoflowStatus.CANCELLED,
                co.deadline_s,
                co.submitted_s,
                tuple(
                    (f.id, f.src_agent, f.dst_agent, f.bytes, f.delivered, f.src_path, f.dst_path)
                    for f in co.flows.values()
                ),
            )
            for cid, co in reg.coflows.items()
        }
        wan = (frozenset(c.topology.down), tuple(sorted(c.topology.capacity.items())))
        agents = {a: (i.dc, i.data_addr) for a, i in reg.agents.items()}
        return coflows, reg.next_id, agents, wan

    return c.owner.run(on_loop)


def handler_snapshot(handler: ApiHandler):
    """What no refused request may change in the API handler: owners and remembered refs."""
    return handler.controller.owner.run(
        lambda: (copy.deepcopy(dict(handler.controller.journal.live)), list(handler.done_refs))
    )


def check_reply(handler: ApiHandler, request, reply) -> None:
    assert isinstance(reply, dict), reply
    assert isinstance(reply.get("ok"), bool), reply
    assert reply["v"] == 1 and reply["instance"] == handler.instance
    if not reply["ok"]:
        assert isinstance(reply.get("code"), str), reply
        assert reply["code"] != "internal", f"internal error for {request!r}"
        assert isinstance(reply.get("error"), str)
    if _wire_safe(request):  # it could have come over the wire: the reply must go back
        pack_message(reply)


def fuzz_handle(server: Server, request, identity: Identity) -> dict:
    before, owners_before = api_snapshot(server), handler_snapshot(server.handler)
    reply = server.handler.handle(request, identity)  # must not raise
    check_reply(server.handler, request, reply)
    event(f"reply: {reply.get('code', 'ok')}")
    if not reply["ok"]:
        assert api_snapshot(server) == before, f"{request!r} changed the registry"
        assert handler_snapshot(server.handler) == owners_before, request
    return reply


def test_api_handle_fuzzed_requests(pki):
    """Requests that can arrive over the wire (64-bit integers): never an exception, never
    "internal", and a refused request changes nothing."""
    with seeded_server(pki) as server:

        @settings(max_examples=200, deadline=None)
        @given(request=api_requests(WIRE_INTS), identity=st.sampled_from(IDENTITIES))
        def run(request, identity):
            fuzz_handle(server, request, identity)

        run()
        # The seeded coflows are still where they were, for their owners only.
        assert server.handler.handle({"v": 1, "op": "status", "coflow": 0}, JOB1)["ok"]
        assert not server.handler.handle({"v": 1, "op": "status", "coflow": 0}, JOB2)["ok"]


@pytest.mark.parametrize(
    ("op", "identity", "fields"),
    [
        ("submit", JOB1, {"flows": [flow("h")], "deadline": 10**400}),
        ("submit", JOB1, {"flows": [flow("h")], "age_s": 10**400}),
        ("capacity", OPERATOR, {"a": "A", "b": "B", "bytes_per_s": 10**400}),
    ],
)
def test_api_handle_integers_beyond_float_range(pki, op, identity, fields):
    """Found by fuzzing: these raised OverflowError (answered "internal")."""
    with seeded_server(pki) as server:
        reply = server.handler.handle({"v": 1, "op": op, **fields}, identity)
        assert reply["ok"] is False and reply["code"] == "bad_request", reply


def test_api_handle_any_python_values(pki):
    """Direct callers may pass values no wire can carry (integers of any size): still a
    reply, never an exception, never "internal"."""
    with seeded_server(pki) as server:

        @settings(max_examples=60, deadline=None)
        @given(request=api_requests(ANY_INTS), identity=st.sampled_from(IDENTITIES))
        def run(request, identity):
            before = api_snapshot(server)
            reply = server.handler.handle(request, identity)
            assert isinstance(reply, dict) and isinstance(reply.get("ok"), bool)
            if not reply["ok"]:
                assert isinstance(reply["code"], str) and reply["code"] != "internal", reply
                assert api_snapshot(server) == before, request

        run()


def _frame(body: bytes) -> bytes:
    return _LEN.pack(len(body)) + body


@st.composite
def raw_api_streams(draw) -> bytes:
    """Byte streams a broken or hostile client might send on the API connection."""
    request = api_requests(WIRE_INTS)
    piece = st.one_of(
        st.binary(max_size=64),  # random bytes
        st.binary(max_size=64).map(_frame),  # a frame with a garbage body
        nested(WIRE_INTS).map(lambda v: _frame(msgpack.packb(v, use_bin_type=True))),
        request.map(pack_message),  # a whole (near-valid) request
        st.tuples(request, st.integers(0, 40)).map(
            lambda rk: pack_message(rk[0])[: rk[1]]  # truncated
        ),
        st.integers(MAX_MESSAGE_BYTES + 1, 2**32 - 1).map(_LEN.pack),  # oversized length
        st.integers(1, MAX_MESSAGE_BYTES).map(lambda n: _LEN.pack(n) + b"\x80"),  # short body
    )
    return b"".join(draw(st.lists(piece, min_size=1, max_size=4)))


def exchange(server: Server, data: bytes, name: str = "job1") -> list[dict]:
    """Send `data` on a new TLS connection, half-close, and return the replies read until
    the server closes. Fails if the server neither answers nor closes within 5 s."""
    with server.connect(name) as s:
        s.settimeout(5)
        try:
            s.sendall(data)
            socket.socket.shutdown(s, socket.SHUT_WR)  # TCP half-close under TLS
        except OSError:
            pass  # the server already gave up on this connection
        replies = []
        while True:
            try:
                reply = read_message(s, frame_timeout=5)
            except TimeoutError:
                pytest.fail(f"the server kept a connection open after {data!r}")
            except (WireError, OSError, ssl.SSLError):
                break  # reset or cut while replying: closed all the same
            if reply is None:
                break
            replies.append(reply)
        return replies


def test_api_raw_byte_streams_over_tls(pki):
    """Random bytes, garbage bodies, truncated and oversized frames over mutual TLS: each
    reply is a well-formed answer (errors never "internal"), the server closes only that
    connection, and another client's connection is answered after every one of them."""
    with seeded_server(pki) as server, server.connect("job2") as other:
        other.settimeout(5)
        count = [0]

        @settings(max_examples=60, deadline=None)
        @given(data=raw_api_streams())
        def run(data):
            replies = exchange(server, data)
            event(f"replies: {[r.get('code', 'ok') for r in replies]}")
            for reply in replies:
                assert isinstance(reply, dict) and isinstance(reply.get("ok"), bool), reply
                if not reply["ok"]:
                    assert reply["code"] != "internal", data
            count[0] += 1
            other.sendall(pack_message({"v": 1, "op": "hello", "req": count[0]}))
            reply = read_message(other)
            assert reply["ok"] and reply["req"] == count[0]

        run()
        with server.client("job1") as c:  # and a new client too
            assert 0 in [x["id"] for x in c.list_coflows()]


def test_api_reply_that_would_exceed_the_message_limit(pki):
    with seeded_server(pki) as server:
        before = set(threading.enumerate())
        try:
            replies = exchange(server, pack_message({"v": 1, "op": "\0" * (17 << 20)}))
        finally:  # let the connection's thread end here (its exception belongs to this test)
            for thread in set(threading.enumerate()) - before:
                if thread.name != "terra-deadlines":
                    thread.join(5)
        # A short error (its quoted op cut), never a reply over the limit.
        assert [r["code"] for r in replies] == ["bad_request"]


# ---- 2. the agent channel ----------------------------------------------------------------------

DIGEST = "ab" * 32
MAC = bytes(MAC_BYTES)  # a well-formed chunk MAC (its value is the agent's business)


def control_bases(cid: str, agent: str, dc: str, port: int) -> dict:
    """Valid agent -> controller messages about flow f of coflow `cid`, sent as `agent`."""
    return {
        "register": {"t": "register", "dc": dc, "agent": agent,
                     "data_addr": f"127.0.0.1:{port}"},
        "register-inflight": {"t": "register", "dc": dc, "agent": agent,
                              "data_addr": f"127.0.0.1:{port}",
                              "inflight": [{"coflow": cid, "flow": "f", "role": "recv",
                                            "offset": 10, "digest": DIGEST}]},
        "progress": {"t": "progress", "flows": [{"coflow": cid, "flow": "f", "acked": 1000},
                                                {"coflow": cid, "flow": "g", "acked": 5}]},
        "complete": {"t": "complete", "coflow": cid, "flow": "f", "digest": DIGEST,
                     "size": 10**8},
        "heartbeat": {"t": "heartbeat"},
        "error": {"t": "error", "message": "boom", "coflow": cid, "flow": "f"},
        "failed": {"t": "failed", "coflow": cid, "flow": "f", "reason": "disk",
                   "cause": "sink", "attempt": 0},
        "failed-source": {"t": "failed", "coflow": cid, "flow": "g", "reason": "gone",
                          "cause": "source"},
        "ack": {"t": "ack", "id": 1},
    }  # fmt: skip


TO_AGENT_BASES = {
    "registered": {"t": "registered", "agent": "a1"},
    "tunnels": {"t": "tunnels", "listen": [30001],
                "tunnels": [{"tunnel": "0", "peer_agent": "b1", "peer_addr": "127.0.0.1:31000",
                             "path": ["A", "B"], "port": 31001}]},
    "flows": {"t": "flows", "id": 3,
              "flows": [{"coflow": "0", "flow": "f", "src_agent": "a1", "dst_agent": "b1",
                         "dst_dc": "B", "size": 100, "offset": 10, "source": "synthetic",
                         "sink": "file:out", "attempt": 1}]},
    "rates": {"t": "rates", "id": 4,
              "rates": [{"coflow": "0", "dst_dc": "B",
                         "paths": [{"tunnel": "0", "rate": 1e6}, {"tunnel": "1", "rate": 0}]}]},
    "drop": {"t": "drop", "coflow": "0", "flows": ["f", "g"]},
}  # fmt: skip
CONTROL_LISTS = ("flows", "inflight", "tunnels", "rates", "listen")


@st.composite
def control_frames(draw, bases: dict, ints=WIRE_INTS) -> dict:
    """A control frame header: a mutant of `bases`, an unknown type or an arbitrary map; its
    "v" and "n" are 1 and 0 unless fuzzed too."""
    kind = draw(st.sampled_from(["mutant"] * 6 + ["type", "map"]))
    if kind == "mutant":
        header = draw(mutants(bases, ints, list_fields=CONTROL_LISTS))
    elif kind == "type":
        header = {"t": draw(field_values(ints))}
    else:
        header = draw(st.dictionaries(st.text(max_size=6), field_values(ints), max_size=4))
    header.setdefault("v", 1)
    header.setdefault("n", 0)
    if draw(st.integers(0, 9)) == 0:
        header[draw(st.sampled_from(["v", "n"]))] = draw(field_values(ints))
    return header


def controller_parses(frame: bytes) -> bool:
    """Whether read_control (the controller's parser) accepts this frame."""
    left, right = socket.socketpair()
    with left, right:
        left.sendall(frame)
        left.shutdown(socket.SHUT_WR)
        right.settimeout(5)
        try:
            return read_control(right, frame_timeout=5) is not None
        except ChannelError:
            return False


def channel_accepts(header: dict, agent: str) -> bool:
    """Whether the controller keeps the connection after this frame: read_control accepts it
    and, for a "register", the agent registers under its certificate's name in a known DC."""
    if not controller_parses(_frame(msgpack.packb(header, use_bin_type=True))):
        return False
    if header["t"] == "register":
        return (
            header["agent"] == agent
            and header["dc"] in ("A", "B", "C")
            and (len(header["data_addr"]) <= 256)
            and names_this_host(header["data_addr"])
        )
    return True


def names_this_host(data_addr: str) -> bool:
    """Whether a data address an agent on loopback registers names itself: its host an IP
    address (not a host name), loopback or unspecified (design.md 6, "who may do what")."""
    host, _ = protocol.parse_addr(data_addr, "data_addr")
    try:
        ip = ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        return False
    ip = getattr(ip, "ipv4_mapped", None) or ip
    return ip.is_loopback or ip.is_unspecified


def flow_snapshot(controller, cid: int):
    def on_loop():
        coflow = controller.registry.get(cid)
        flows = tuple(
            (f.id, f.delivered, f.state, f.digest, f.restarts, f.reason)
            for f in coflow.flows.values()
        )
        return coflow.state, coflow.reason, flows

    return controller.owner.run(on_loop)


def count(agent: Agent, kind: str) -> int:
    with agent.cond:
        return sum(m["t"] == kind for m in agent.messages)


def wait_agent(agent: Agent, predicate, timeout: float = 5.0) -> bool:
    with agent.cond:
        return agent.cond.wait_for(predicate, timeout)


class FuzzAgent(Agent):
    """test_controller_channel.Agent that keeps reading when an ack cannot be sent (the
    controller may close the connection before the ack arrives: its "error" message and
    end of stream are still to be read)."""

    def _read(self):
        try:
            while (m := read_control(self.sock)) is not None:
                if "id" in m:
                    try:
                        send_parts(self.sock, {"t": "ack", "id": m["id"]})
                    except OSError:
                        pass
                with self.cond:
                    self.messages.append(m)
                    self.cond.notify_all()
        except Exception:
            pass
        with self.cond:
            self.closed = True
            self.cond.notify_all()


class ChannelFuzz:
    """Sends fuzzed frames as one agent (reconnecting it when the controller closed it) and
    checks that the controller and the other agents are unharmed."""

    def __init__(self, fixture, name: str, dc: str, port: int, watchers: list[Agent]):
        self.controller, self.chan, self.addr = fixture
        self.name, self.dc, self.port = name, dc, port
        self.watchers = watchers
        self.agent = self.connect()
        self.closed = 0

    def connect(self) -> Agent:
        agent = FuzzAgent(self.addr, self.name, self.dc, self.port)
        assert wait_agent(agent, lambda: any(m["t"] == "registered" for m in agent.messages))
        return agent

    def send(self, header: dict) -> None:
        body = msgpack.packb(header, use_bin_type=True)
        assume(len(body) <= MAX_HEADER_BYTES)
        if self.agent.closed:  # (only after a failed example)
            self.agent = self.connect()
        agent, accepted = self.agent, channel_accepts(header, self.name)
        event(f"{header.get('t')!r:.12} {'kept' if accepted else 'closed'}")
        agent.sock.sendall(_frame(body))
        if accepted:  # re-register on the same connection: its reply follows our frame's effect
            seen = count(agent, "registered")
            agent.send(protocol.register_message(self.dc, self.name, f"127.0.0.1:{self.port}"))
            ok = wait_agent(agent, lambda: agent.closed or count(agent, "registered") > seen)
            assert ok and not agent.closed, f"connection closed after valid {header!r}"
        else:  # closed with an "error" message (a crash would close it without one)
            assert wait_agent(agent, lambda: agent.closed), f"{header!r} was not refused"
            assert any(m["t"] == "error" for m in agent.messages), f"no error for {header!r}"
            self.closed += 1
            self.agent = self.connect()
        for watcher in self.watchers:  # the other agents are still served
            assert not watcher.closed and watcher.agent in self.chan.connections
        # A new tunnel table reaches every agent. Once the fuzzing agent has it, it has
        # acked every earlier message too: no ack of it is in flight when the next frame
        # goes out (an ack arriving after the controller closed would reset the connection).
        everyone = [*self.watchers, self.agent]
        before = [count(a, "tunnels") for a in everyone]
        self.chan.push_tunnels()
        for agent, seen in zip(everyone, before, strict=True):
            assert wait_agent(agent, lambda a=agent, n=seen: count(a, "tunnels") > n)

    def close(self) -> None:
        for agent in (self.agent, *self.watchers):
            try:
                socket.socket.shutdown(agent.sock.raw, socket.SHUT_RDWR)
            except OSError:
                pass


def start_flows(fixture):
    controller, _chan, addr = fixture
    a1, b1 = Agent(addr, "a1", "A", 30000), Agent(addr, "b1", "B", 31000)
    for agent in (a1, b1):
        agent.wait_for(lambda m: m["t"] == "registered")
    cid = controller.submit([
        {"id": "f", "src": "a1", "dst": "b1", "bytes": 10**8},
        {"id": "g", "src": "a1", "dst": "b1", "bytes": 5 * 10**7},
    ])  # fmt: skip
    for agent in (a1, b1):
        agent.wait_for(lambda m: m["t"] == "flows")
    return a1, b1, cid


def test_channel_fuzzed_control_messages_from_a_non_endpoint(channel):  # noqa: F811
    """c1 is no endpoint of the coflow's flows: whatever it sends, valid or not, changes
    none of them; invalid frames close only its connection (with an "error" message)."""
    controller = channel[0]
    a1, b1, cid = start_flows(channel)
    fuzz = ChannelFuzz(channel, "c1", "C", 32000, [a1, b1])
    before = flow_snapshot(controller, cid)
    try:

        @settings(max_examples=80, deadline=None)
        @given(header=control_frames({**control_bases(str(cid), "c1", "C", 32000),
                                      **TO_AGENT_BASES}))  # fmt: skip
        def run(header):
            fuzz.send(header)
            assert flow_snapshot(controller, cid) == before, header

        run()
        assert fuzz.closed > 0  # some frames were refused (the fuzzing reached the checks)
        assert controller.status(cid)["bytes_delivered"] == 0
    finally:
        fuzz.close()


@st.composite
def refused_reports(draw, cid: int) -> dict:
    """Well-formed reports from the flows' sender a1 that the controller must refuse: offsets
    beyond the flow, unknown flows, completions and sink failures (a receiver's), failures of
    an attempt that is not the current one."""
    c = str(cid)
    acked = draw(st.integers(10**8 + 1, 2**64 - 1))
    options = [
        {"t": "progress", "flows": [{"coflow": c, "flow": "f", "acked": acked}]},
        {"t": "progress", "flows": [{"coflow": c, "flow": draw(st.sampled_from(
            ["h", "F", "f ", "0", "x" * 300])), "acked": 1}]},  # fmt: skip
        {"t": "complete", "coflow": c, "flow": draw(st.sampled_from(["f", "g"])),
         "digest": draw(st.text(min_size=1, max_size=70)), "size": draw(st.integers(1, 2**64 - 1))},
        {"t": "failed", "coflow": c, "flow": "f", "reason": draw(st.text(min_size=1, max_size=50)),
         "cause": draw(st.sampled_from(["sink", "digest"]))},
        {"t": "failed", "coflow": c, "flow": "g", "reason": "x", "cause": "source",
         "attempt": draw(st.integers(1, 2**64 - 1))},
        {"t": "ack", "id": draw(st.one_of(WIRE_INTS, st.text(min_size=1, max_size=20)))},
    ]  # fmt: skip
    header = draw(st.sampled_from(options))
    return {**header, "v": 1, "n": 0}


@st.composite
def invalid_frames(draw, bases: dict) -> dict:
    header = draw(control_frames(bases))
    assume(not channel_accepts(header, "a1"))
    return header


def test_channel_refused_and_invalid_reports_from_an_endpoint(channel):  # noqa: F811
    """a1 sends flows f and g: its well-formed but wrong reports are refused (the connection
    stays), its malformed frames close only its connection; no flow changes either way."""
    controller = channel[0]
    a1, b1, cid = start_flows(channel)
    c1 = Agent(channel[2], "c1", "C", 32000)
    c1.wait_for(lambda m: m["t"] == "registered")
    a1.sock.close()  # the fuzzer takes a1's place (a new connection replaces the old one)
    fuzz = ChannelFuzz(channel, "a1", "A", 30000, [b1, c1])
    before = flow_snapshot(controller, cid)
    bases = control_bases(str(cid), "a1", "A", 30000)
    try:

        @settings(max_examples=80, deadline=None)
        @given(header=st.one_of(refused_reports(cid), invalid_frames(bases)))
        def run(header):
            fuzz.send(header)
            assert flow_snapshot(controller, cid) == before, header

        run()
        assert controller.status(cid)["bytes_delivered"] == 0
    finally:
        fuzz.close()


def test_read_control_fuzzed_frames_on_a_socket_pair():
    """read_control on a plain socket: a frame either parses to a valid control message or
    raises ChannelError; never anything else."""

    @settings(max_examples=100, deadline=None)
    @given(data=st.one_of(
        st.binary(max_size=80),
        control_frames({**control_bases("0", "a1", "A", 1), **TO_AGENT_BASES}).map(
            lambda h: _frame(msgpack.packb(h, use_bin_type=True))),
        st.integers(MAX_HEADER_BYTES + 1, 2**32 - 1).map(_LEN.pack),
    ))  # fmt: skip
    def run(data):
        left, right = socket.socketpair()
        with left, right:
            right.settimeout(5)
            left.sendall(data)
            left.shutdown(socket.SHUT_WR)
            while True:
                try:
                    message = read_control(right, frame_timeout=5)
                except ChannelError:
                    break
                if message is None:
                    break
                assert validate_control(message) is message

    run()


@settings(max_examples=400, deadline=None)
@given(msg=st.one_of(
    nested(ANY_INTS),
    control_frames({**control_bases("0", "a1", "A", 1), **TO_AGENT_BASES}, ANY_INTS),
    st.dictionaries(st.sampled_from(["t", "id", "flows", "rates", "tunnels", "agent"]),
                    field_values(ANY_INTS), max_size=3),
))  # fmt: skip
def test_validate_control_raises_only_protocol_error(msg):
    try:
        out = validate_control(msg)
    except ProtocolError:
        return
    assert out is msg
    if not _wire_safe(msg):
        return
    # What an agent does with a valid controller message must not fail either.
    parse = {"tunnels": protocol.parse_tunnels, "flows": protocol.parse_flows,
             "rates": protocol.parse_rates}.get(msg["t"])  # fmt: skip
    if parse is not None:
        parse(msg)


# ---- 3. the data port ------------------------------------------------------------------------

DATA_BASES = {
    "hello": {"t": "hello", "agent": "a1", "tunnel": "0"},
    "chunk": {"t": "chunk", "c": "0", "f": "f", "o": 0, "n": 3, "m": bytes(MAC_BYTES),
              "d": DIGEST, "a": 1},
    "ack": {"t": "ack", "c": "0", "f": "f", "o": 10, "e": 5, "a": 2},
}  # fmt: skip


@settings(max_examples=300, deadline=None)
@given(msg=st.one_of(
    nested(ANY_INTS),
    mutants(DATA_BASES, ANY_INTS),
    st.dictionaries(st.sampled_from(["t", "c", "f", "o", "e"]), field_values(ANY_INTS),
                    max_size=4),
))  # fmt: skip
def test_validate_data_raises_only_protocol_error(msg):
    try:
        assert validate_data(msg) is msg
    except ProtocolError:
        pass


class Feed(trio.abc.ReceiveStream):
    """Hands over `data` in pieces of the given sizes (cycled); then EOF, or waits forever
    when `eof` is False (a peer that stopped sending but keeps the connection)."""

    def __init__(self, data: bytes, sizes: list[int], eof: bool = True):
        self.data, self.sizes, self.eof, self.pos, self.i = data, sizes, eof, 0, 0

    async def receive_some(self, max_bytes=None):
        await trio.lowlevel.checkpoint()
        if self.pos >= len(self.data) and not self.eof:
            await trio.sleep_forever()
        n = min(self.sizes[self.i % len(self.sizes)], max_bytes or 1 << 30)
        self.i += 1
        piece = self.data[self.pos : self.pos + n]
        self.pos += len(piece)
        return piece

    async def aclose(self):
        pass


@contextmanager
def bytearray_sizes():
    """Record the size of every bytearray overlay/framing allocates."""
    sizes: list[int] = []
    real = bytearray

    def tracking(*args, **kwargs):
        buf = real(*args, **kwargs)
        sizes.append(len(buf))
        return buf

    with mock.patch.object(framing, "bytearray", tracking, create=True):
        yield sizes


def assert_payloads_within(allocated: list[int], max_payload: int) -> None:
    """Apart from the reader's fixed receive buffer, no bytearray beyond max_payload bytes."""
    rest = list(allocated)
    if framing._RBUF_BYTES in rest:
        rest.remove(framing._RBUF_BYTES)
    assert all(n <= max_payload for n in rest), allocated


def _header_frame(header: dict, payload: bytes = b"") -> bytes:
    return _frame(msgpack.packb(header, use_bin_type=True)) + payload


@st.composite
def data_frames(draw) -> bytes:
    """One piece of a data-port byte stream: valid or corrupted frames, garbage, bad lengths."""
    payload = draw(st.binary(max_size=300))
    kind = draw(st.sampled_from(["chunk", "chunk", "chunk", "bad-chunk", "header", "mutant",
                                 "garbage", "body", "hlen", "n", "claim", "cut"]))  # fmt: skip
    if kind == "chunk":
        return b"".join(encode_frame(chunk_header("0", "f", draw(WIRE_INTS.filter(
            lambda o: o >= 0)), payload, bytes(mac_bytes(len(payload)))), payload))  # fmt: skip
    if kind == "bad-chunk":  # a chunk header with one field fuzzed, the payload as is
        header = {**chunk_header("0", "f", 0, payload, bytes(mac_bytes(len(payload)))), "v": 1}
        header[draw(st.sampled_from(["c", "f", "o", "n", "m", "v", "t"]))] = draw(
            field_values(WIRE_INTS)
        )
        return _header_frame(header, payload)
    if kind == "header":  # any map with v, t and n
        header = draw(st.dictionaries(st.text(max_size=4), field_values(WIRE_INTS), max_size=3))
        header.update(v=1, t=draw(st.text(max_size=6)), n=len(payload))
        return _header_frame(header, payload)
    if kind == "mutant":
        header = {**draw(mutants(DATA_BASES, WIRE_INTS)), "v": 1}
        header.setdefault("n", len(payload))
        return _header_frame(header, payload)
    if kind == "garbage":
        return payload
    if kind == "body":  # a length and a garbage or non-map body
        body = draw(st.one_of(st.binary(min_size=1, max_size=100),
                              nested(WIRE_INTS).map(msgpack.packb)))  # fmt: skip
        return _frame(body)
    if kind == "hlen":  # header length 0 or beyond the limit
        return _LEN.pack(draw(st.sampled_from([0, MAX_HEADER_BYTES + 1, 2**32 - 1]))) + payload
    if kind == "n":  # a payload length beyond any limit
        n = draw(st.integers(MAX_PAYLOAD_BYTES + 1, 2**64 - 1))
        return _header_frame({"t": "hello", "v": 1, "n": n}, payload)
    if kind == "claim":  # a large payload announced, a little of it sent
        n = draw(st.sampled_from([MAX_PAYLOAD_BYTES, MAX_PAYLOAD_BYTES - 1, 1 << 20]))
        header = {**chunk_header("0", "f", 0, b"", b""), "v": 1, "n": n}
        return _header_frame({**header, "m": bytes(mac_bytes(n))}, payload)
    macs = bytes(mac_bytes(len(payload)))
    full = b"".join(encode_frame(chunk_header("0", "f", 0, payload, macs), payload))
    return full[: draw(st.integers(0, len(full)))]


def check_frame(frame, max_payload: int) -> None:
    header, payload = frame
    assert header["v"] == 1 and not isinstance(header["v"], bool)
    assert isinstance(header["t"], str)
    n = header["n"]
    assert isinstance(n, int) and not isinstance(n, bool) and 0 <= n <= max_payload
    assert len(payload) == n
    if "x" in header:
        assert header["x"] == zlib.crc32(bytes(payload))
    try:  # what terra_agent's _serve_incoming does next
        validate_data(header)
    except ProtocolError:
        pass


async def read_stream(reader: FrameReader, max_payload: int) -> int:
    """Read frames until EOF or FrameError (anything else fails); returns frames read."""
    frames = 0
    with trio.fail_after(5):
        try:
            while (frame := await reader.read()) is not None:
                check_frame(frame, max_payload)
                frames += 1
        except FrameError as exc:
            event(f"FrameError: {str(exc)[:24]}")
    event(f"frames read: {min(frames, 3)}")
    return frames


MAX_PAYLOADS = st.sampled_from([0, 1, 100, 4096, MAX_PAYLOAD_BYTES])


@settings(max_examples=150, deadline=None)
@given(
    pieces=st.lists(data_frames(), min_size=1, max_size=5),
    sizes=st.lists(st.integers(1, 600), min_size=1, max_size=4),
    max_payload=MAX_PAYLOADS,
)
async def test_frame_reader_adversarial_streams_in_memory(pieces, sizes, max_payload):
    with bytearray_sizes() as allocated:
        reader = FrameReader(Feed(b"".join(pieces), sizes), max_payload=max_payload)
        await read_stream(reader, max_payload)
    assert_payloads_within(allocated, max_payload)


@settings(max_examples=40, deadline=None)
@given(pieces=st.lists(data_frames(), min_size=1, max_size=4), pooled=st.booleans())
async def test_frame_reader_adversarial_streams_over_tcp(pieces, pooled):
    """The socket path (os.readv into the frame buffer or a pooled payload buffer)."""
    client, server = await tcp_pair()
    data = b"".join(pieces)
    buffers = PayloadBuffers(MAX_PAYLOAD_BYTES, 2) if pooled else None

    async def send_and_close():
        try:
            await client.send_all(data)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass  # the reader gave up and closed its side
        await client.aclose()

    async def read_all():
        try:
            await read_stream(FrameReader(server, buffers=buffers), MAX_PAYLOAD_BYTES)
        finally:
            await server.aclose()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(send_and_close)
        nursery.start_soon(read_all)


@settings(max_examples=60, deadline=None)
@given(
    header=st.one_of(
        st.integers(MAX_PAYLOAD_BYTES + 1, 2**64 - 1).map(
            lambda n: _header_frame(
                {"t": "chunk", "c": "0", "f": "f", "o": 0, "m": MAC, "v": 1, "n": n}
            )
        ),  # fmt: skip
        st.sampled_from([0, MAX_HEADER_BYTES + 1, 2**31, 2**32 - 1]).map(_LEN.pack),
    ),
    max_payload=MAX_PAYLOADS,
)
async def test_frame_reader_refuses_oversized_lengths_before_reading_on(header, max_payload):
    """A header announcing more than allowed is refused at once (the peer keeps the
    connection open and sends nothing more) and nothing of that size is allocated."""
    with bytearray_sizes() as allocated:
        reader = FrameReader(Feed(header, [7], eof=False), max_payload=max_payload)
        with trio.fail_after(2), pytest.raises(FrameError):
            await reader.read()
    assert_payloads_within(allocated, max_payload)


# ---- 4. slow senders --------------------------------------------------------------------------


def answered_or_closed(sock: ssl.SSLSocket) -> bool:
    """True when the server sent application data or closed `sock` (not waiting: TLS 1.3
    session tickets make the socket readable without any data for the application)."""
    sock.setblocking(False)
    try:
        sock.recv(1)
    except (ssl.SSLWantReadError, BlockingIOError):
        return False
    except (OSError, ssl.SSLError):
        return True
    finally:
        sock.settimeout(5)
    return True  # the first byte of a reply, or EOF


def test_a_slow_sender_is_cut_off_while_another_client_is_served(pki):
    """One byte every 0.2 s: the server closes that connection once the frame's 1 s deadline
    passed; meanwhile another client's requests are answered at once."""
    with seeded_server(pki) as server:
        server.handler.frame_timeout_s = 1.0
        body = pack_message({"v": 1, "op": "list", "req": "x" * 100})
        with server.connect("job1") as slow, server.connect("job2") as other:
            other.settimeout(5)
            start, cut_at, answered = time.monotonic(), None, 0
            for i, byte in enumerate(body):
                try:
                    slow.sendall(bytes([byte]))
                except OSError:
                    cut_at = time.monotonic()
                    break
                if answered_or_closed(slow):  # the server's error reply, or its close
                    cut_at = time.monotonic()
                    break
                asked = time.monotonic()
                other.sendall(pack_message({"v": 1, "op": "hello", "req": i}))
                reply = read_message(other)
                assert reply["ok"] and reply["req"] == i
                assert time.monotonic() - asked < 1.0  # not held up by the slow sender
                answered += 1
                time.sleep(0.2)
            assert cut_at is not None, "the slow sender was never cut off"
            assert 0.8 < cut_at - start < 5
            assert answered >= 3
        with server.client("job1") as c:  # the server goes on serving new clients
            assert sorted(x["id"] for x in c.list_coflows()) == [0]


# ---- 5. topology and workload files -----------------------------------------------------------

TOPOLOGY_BASES = {
    "topology": {"name": "t", "default_capacity_gbps": 2, "dcs": ["A", "B", "C"],
                 "links": [{"a": "A", "b": "B"}, {"a": "B", "b": "C", "capacity_gbps": 0.5}]},
}  # fmt: skip
WORKLOAD_BASES = {
    "workload": {"coflows": [
        {"id": "c1", "arrival_s": 0, "deadline_s": 5,
         "flows": [{"id": "f", "src": "HK", "dst": "LA", "bytes": 10}]},
        {"id": 2, "arrival_s": 1.5, "flows": [{"id": 1, "src": "LA", "dst": "NY", "bytes": 2e9}]},
    ]},
}  # fmt: skip


def json_file(directory, doc) -> str | None:
    """`doc` written as a JSON file in `directory` (None: `doc` is not JSON, e.g. bytes)."""
    try:
        text = json.dumps(doc)
    except (TypeError, ValueError):
        return None
    path = directory / "input.json"
    path.write_text(text)
    return str(path)


@pytest.fixture(scope="module")
def files_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("files")


def test_topology_files_raise_only_topology_error(files_dir):
    from topologies import TopologyError, load_topology

    @settings(max_examples=200, deadline=None)
    @given(doc=st.one_of(nested(ANY_INTS), mutants(TOPOLOGY_BASES, ANY_INTS, ["links", "dcs"])))
    def check(doc):
        path = json_file(files_dir, doc)
        assume(path is not None)
        try:
            topo = load_topology(path)
        except TopologyError as exc:
            assert str(exc).startswith(f"{path}: ")
            return
        assert topo.links and all(0 < c < math.inf for c in topo.capacity.values())
        assert all(isinstance(dc, str) and dc for dc in topo.dcs)

    check()


def test_workload_files_raise_only_workload_error(files_dir):
    from topologies import load_topology
    from workloads import WorkloadError, load_workload

    swan = load_topology("swan")

    @settings(max_examples=200, deadline=None)
    @given(doc=st.one_of(nested(ANY_INTS), mutants(WORKLOAD_BASES, ANY_INTS, ["coflows"])))
    def check(doc):
        path = json_file(files_dir, doc)
        assume(path is not None)
        try:
            coflows = load_workload(path, swan)
        except WorkloadError as exc:
            assert str(exc).startswith(f"{path}: ")
            return
        assert coflows and len({c.id for c in coflows}) == len(coflows)
        for c in coflows:
            assert 0 <= c.arrival_s < math.inf and (c.deadline_s is None or c.deadline_s > 0)
            assert all(0 < f.bytes < math.inf and f.src in swan.dcs for f in c.flows)

    check()
