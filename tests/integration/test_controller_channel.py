"""The controller's agent channel over mutual TLS, in-test agents speaking terra_wire/control.py.

Triangle WAN A, B, C (1e8 bytes/s per directed link), TerraPolicy with K = 2:
every ordered DC pair has the direct path (index 0) and the two-hop path (index 1).
"""

import logging
import socket
import threading
import time

import msgpack
import pytest
from tls_helpers import ensure, plain_socket, security, shared_tls_socket, tls_socket

from terra_controller.agent_channel import AgentChannel, start_agent_server
from terra_controller.agent_connection import read_control, send_parts
from terra_controller.controller import Controller
from terra_controller.flow_specs import batches
from terra_controller.transport import stop_listener
from terra_controller.tunnel_table import TunnelTable, installed_path_source
from terra_core.registry import SchedulerOptions, make_scheduler, scheduler_names
from terra_core.terra_policy import TerraPolicy
from terra_security.data_keys import DataKeys
from terra_security.pki import Role
from terra_wire import control as protocol
from topologies import Topology, k_shortest_paths, load_topology, path_links

CAP = 1e8


class Endpoint(tuple):
    """The channel's (host, port), with the PKI its agents' certificates come from."""

    pki = None


def daemon_spawn(func, *args):
    thread = threading.Thread(target=func, args=args, daemon=True)
    thread.start()
    return thread


def triangle() -> Topology:
    """The triangle WAN A, B, C with CAP bytes/s per directed link."""
    links = {}
    for u, v in [("A", "B"), ("B", "C"), ("A", "C")]:
        links[(u, v)] = links[(v, u)] = CAP
    return Topology("tri", ["A", "B", "C"], links)


@pytest.fixture
def channel(request, pki):
    k = getattr(request, "param", 2)
    topology = triangle()
    controller = Controller(topology, TerraPolicy(topology, k=k))
    chan = AgentChannel(controller, TunnelTable(topology, k))
    listener, _, bound = start_agent_server(chan, "127.0.0.1", 0, security(pki), daemon_spawn)
    addr = Endpoint(bound)
    addr.pki = pki
    yield controller, chan, addr
    stop_listener(listener)
    chan.close_all(grace_s=0)


class Agent:
    """An in-test agent: registers, collects messages, acks those with an id."""

    def __init__(self, addr, agent, dc, port, cert=None, inflight=None):
        """Connect with certificate `cert` (default: the agent's own name), then register
        (with `inflight` rows, if given)."""
        cert = ensure(addr.pki, Role.AGENT, cert or agent)
        self.sock = shared_tls_socket(*addr, addr.pki, cert)
        self.sock.settimeout(None)  # the reader thread waits for messages as long as it takes
        self.agent = agent
        self.messages: list[dict] = []
        self.cond = threading.Condition()
        self.closed = False
        register = protocol.register_message(dc, agent, f"127.0.0.1:{port}", inflight)
        send_parts(self.sock, register)
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        try:
            while True:
                m = read_control(self.sock)
                if m is None:
                    break
                if "id" in m:
                    send_parts(self.sock, {"t": "ack", "id": m["id"]})
                with self.cond:
                    self.messages.append(m)
                    self.cond.notify_all()
        except Exception:
            pass
        with self.cond:
            self.closed = True
            self.cond.notify_all()

    def wait_for(self, predicate, timeout=10.0):
        end = time.monotonic() + timeout
        with self.cond:
            while True:
                found = [m for m in self.messages if predicate(m)]
                if found:
                    return found[-1]
                left = end - time.monotonic()
                assert left > 0, f"{self.agent}: no such message in {self.messages}"
                self.cond.wait(left)

    def latest_rates(self, coflow: str, dst_dc: str) -> dict[str, float]:
        """The FlowGroup's current {tunnel: rate} (entries replace earlier ones)."""
        with self.cond:
            paths = {}
            for m in self.messages:
                if m["t"] == "rates":
                    for g in m["rates"]:
                        if (g["coflow"], g["dst_dc"]) == (coflow, dst_dc):
                            paths = {p["tunnel"]: p["rate"] for p in g["paths"]}
            return paths

    def spec(self, cid: int, flow: str) -> dict:
        """The latest descriptor of flow `flow` of coflow `cid` this agent got."""

        def mine(f: dict) -> bool:
            return f["coflow"] == str(cid) and f["flow"] == flow

        m = self.wait_for(lambda m: m["t"] == "flows" and any(mine(f) for f in m["flows"]))
        return [f for f in m["flows"] if mine(f)][-1]

    def send(self, header):
        send_parts(self.sock, header)

    def close(self) -> None:
        """Close the connection."""
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()


def wait_until(predicate, timeout=5.0):
    end = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < end, "timed out"
        time.sleep(0.01)


def test_registration_and_tunnel_tables(channel):
    controller, chan, addr = channel
    a1 = Agent(addr, "a1", "A", 30000)
    a1.wait_for(lambda m: m["t"] == "registered")
    b1 = Agent(addr, "b1", "B", 31000)
    b1.wait_for(lambda m: m["t"] == "registered")
    table = a1.wait_for(lambda m: m["t"] == "tunnels" and m["tunnels"])
    paths = sorted((t["peer_agent"], tuple(t["path"]), t["port"]) for t in table["tunnels"])
    # To b1 (data port 31000): path index 0 A-B at port 31001, index 1 A-C-B at 31002.
    assert paths == [("b1", ("A", "B"), 31001), ("b1", ("A", "C", "B"), 31002)]
    assert table["listen"] == [30001, 30002]  # a1's own tunnel ports
    assert controller.registry.agents["b1"].dc == "B"


def test_tunnel_tables_carry_the_pair_keys_of_connected_agents(channel):
    controller, chan, addr = channel
    chan.data_keys = DataKeys()
    a1 = Agent(addr, "a1", "A", 30000)
    a1.wait_for(lambda m: m["t"] == "registered")
    b1 = Agent(addr, "b1", "B", 31000)
    c1 = Agent(addr, "c1", "C", 32000)
    a_table = a1.wait_for(lambda m: m["t"] == "tunnels" and len(m.get("keys", {})) == 2)
    b_table = b1.wait_for(lambda m: m["t"] == "tunnels" and len(m.get("keys", {})) == 2)
    c1.wait_for(lambda m: m["t"] == "tunnels" and len(m.get("keys", {})) == 2)
    assert a_table["keys"]["b1"] == b_table["keys"]["a1"]  # one key per pair, both ends
    assert a_table["keys"]["c1"] != a_table["keys"]["b1"]
    assert "a1" not in a_table["keys"]
    chan.data_keys = None  # an insecure channel sends none
    d1 = Agent(addr, "d1", "A", 33000)
    d1.wait_for(lambda m: m["t"] == "tunnels" and m["tunnels"])
    assert all("keys" not in m for m in d1.messages)


@pytest.mark.parametrize(
    "bad",
    [
        b"\x00\x00\x00\x05\xc1\xc1\xc1\xc1\xc1",  # not msgpack
        b"\x00\x10\x00\x01",  # header length over 64 KiB
        b"\x00\x00\x00\x01\x90",  # a msgpack list, not a map
    ],
)
def test_bad_frames_and_forged_identity_close_only_that_connection(channel, bad):
    controller, chan, addr = channel
    good = Agent(addr, "a1", "A", 30000)
    good.wait_for(lambda m: m["t"] == "registered")
    with tls_socket(*addr, addr.pki, "a2") as s:
        s.sendall(bad)
        assert read_control(s)["t"] == "error"
        assert s.recv(10) == b""  # closed by the controller
    # no TLS at all: the handshake fails (or times out after 5 s), nothing is read
    with plain_socket(*addr, timeout=15) as s:
        s.sendall(bad)
        data = b""
        try:
            while chunk := s.recv(100):
                data += chunk
        except ConnectionResetError:
            pass
        assert data[:1] in (b"", b"\x15")  # at most a TLS alert record, then closed
    intruder = Agent(addr, "a9", "A", 30500, cert="a3")  # a3's certificate, a9's name
    wait_until(lambda: intruder.closed)
    assert "a9" not in controller.registry.agents
    unknown_dc = Agent(addr, "z1", "Mars", 30600)
    wait_until(lambda: unknown_dc.closed)
    assert set(chan.connections) == {"a1"}
    # The good agent still works: it registers a peer's arrival.
    Agent(addr, "b1", "B", 31000).wait_for(lambda m: m["t"] == "registered")
    good.wait_for(lambda m: m["t"] == "tunnels" and m["tunnels"])


def test_rates_split_among_agent_pairs_by_remaining_bytes(channel):
    controller, chan, addr = channel
    agents = {name: Agent(addr, name, dc, port) for name, dc, port in
              [("a1", "A", 30000), ("a2", "A", 30100), ("b1", "B", 31000)]}  # fmt: skip
    wait_until(lambda: len(chan.connections) == 3)
    cid = controller.submit(
        [
            {"id": "x", "src": "a1", "dst": "b1", "bytes": 30_000_000},
            {"id": "y", "src": "a2", "dst": "b1", "bytes": 10_000_000},
        ]
    )
    # Both flows are one FlowGroup A->B; each sender gets it in proportion to its
    # remaining bytes: a1 30 MB, a2 10 MB -> 3:1 on every path.
    for name in ("a1", "a2", "b1"):
        agents[name].wait_for(lambda m: m["t"] == "flows")
    controller.run_round()
    wait_until(lambda: all(agents[a].latest_rates(str(cid), "B") for a in ("a1", "a2")))
    r1, r2 = agents["a1"].latest_rates(str(cid), "B"), agents["a2"].latest_rates(str(cid), "B")
    assert set(r1) == set(r2) and r1
    for tunnel in r1:
        assert r1[tunnel] == pytest.approx(3 * r2[tunnel])
    assert sum(r1.values()) + sum(r2.values()) <= 2 * CAP * (1 + 1e-9)  # two paths into B
    assert agents["b1"].latest_rates(str(cid), "B") == {}  # the receiver sends nothing
    # a1 reports 20 MB acknowledged: 10 MB left each -> an equal split next round.
    k = protocol.report_tag(controller.registry.flow(cid, "x").digest_key)
    agents["a1"].send(protocol.progress_message([(str(cid), "x", 20_000_000, k)]))
    wait_until(lambda: controller.registry.get(cid).flows["x"].delivered == 20_000_000)
    controller.run_round()
    wait_until(
        lambda: (
            agents["a1"].latest_rates(str(cid), "B").values()
            and sum(agents["a1"].latest_rates(str(cid), "B").values())
            == pytest.approx(sum(agents["a2"].latest_rates(str(cid), "B").values()))
        )
    )


def test_completion_reports_finish_the_coflow(channel):
    controller, chan, addr = channel
    _a1, b1 = Agent(addr, "a1", "A", 30000), Agent(addr, "b1", "B", 31000)
    wait_until(lambda: len(chan.connections) == 2)
    cid = controller.submit([{"id": "x", "src": "a1", "dst": "b1", "bytes": 1000}])
    spec = b1.wait_for(lambda m: m["t"] == "flows")["flows"][0]
    assert (spec["coflow"], spec["flow"], spec["size"], spec["offset"]) == (str(cid), "x", 1000, 0)
    assert (spec["source"], spec["sink"]) == ("synthetic", "digest")
    k = protocol.report_tag(spec["digest_key"])
    b1.send(protocol.complete_message(str(cid), "x", "abc", 1000, k))
    wait_until(lambda: controller.registry.get(cid).state == "done")
    status = controller.status(cid)
    assert status["bytes_delivered"] == 1000 and status["flows"][0]["digest"] == "abc"
    assert status["cct_s"] >= 0


def test_link_down_pushes_tunnels_and_rates_and_records_the_reaction(channel):
    controller, chan, addr = channel
    a1, _b1 = Agent(addr, "a1", "A", 30000), Agent(addr, "b1", "B", 31000)
    wait_until(lambda: len(chan.connections) == 2)
    cid = controller.submit([{"id": "x", "src": "a1", "dst": "b1", "bytes": 10**9}])
    controller.run_round()
    wait_until(lambda: len(a1.latest_rates(str(cid), "B")) == 2)  # both paths used
    controller.set_link_state("A", "B", False)
    controller.run_round()
    wait_until(lambda: len(a1.latest_rates(str(cid), "B")) == 1)
    table = [m for m in a1.messages if m["t"] == "tunnels"][-1]
    assert [t["path"] for t in table["tunnels"]] == [["A", "C", "B"]]
    (only,) = a1.latest_rates(str(cid), "B")
    assert only == next(t["tunnel"] for t in table["tunnels"])
    # Every message of that round was acknowledged: the reaction has its time.
    wait_until(lambda: chan.reactions and chan.reactions[-1].applied_at is not None)
    reaction = chan.reactions[-1].to_json()
    assert reaction["agents"] == ["a1", "b1"]
    assert 0 <= reaction["event_to_push_ms"] <= reaction["event_to_applied_ms"]
    # The controller's metrics: the reaction in its histogram, both registrations counted.
    sample = controller.metrics.registry.get_sample_value
    assert sample("terra_wan_reaction_seconds_count") == 1
    assert sample("terra_wan_reaction_seconds_sum") == pytest.approx(
        reaction["event_to_applied_ms"] / 1e3
    )
    assert sample("terra_agent_registrations_total") == 2


@pytest.mark.parametrize("channel", [1], indirect=True)
def test_new_path_after_a_failure_gets_a_logical_tunnel_before_its_rates(channel):
    controller, chan, addr = channel
    a1, _b1 = Agent(addr, "a1", "A", 30000), Agent(addr, "b1", "B", 31000)
    wait_until(lambda: len(chan.connections) == 2)
    cid = controller.submit([{"id": "x", "src": "a1", "dst": "b1", "bytes": 10**9}])
    controller.run_round()
    # K = 1: the only tunnel A->B is the direct link (tunnel ids run over the six
    # ordered pairs in DC order, so A->B is tunnel 0).
    first = a1.wait_for(lambda m: m["t"] == "rates")["rates"][0]["paths"]
    assert [p["tunnel"] for p in first] == ["0"]
    controller.set_link_state("A", "B", False)
    controller.run_round()
    # The scheduler now uses A-C-B, which had no tunnel: a logical one (id 6, index 1
    # of the pair: port 31000 + 1 + 1) reaches a1 in a tunnel table before the rates.
    wait_until(lambda: a1.latest_rates(str(cid), "B").keys() == {"6"})
    tables = [i for i, m in enumerate(a1.messages) if m["t"] == "tunnels" and any(
        t["tunnel"] == "6" for t in m["tunnels"])]  # fmt: skip
    rates = [i for i, m in enumerate(a1.messages) if m["t"] == "rates" and any(
        p["tunnel"] == "6" for g in m["rates"] for p in g["paths"])]  # fmt: skip
    assert tables and rates and tables[0] < rates[0]
    spec = next(t for t in a1.messages[tables[0]]["tunnels"] if t["tunnel"] == "6")
    assert spec["path"] == ["A", "C", "B"] and spec["port"] == 31002


def test_a_silent_agent_is_disconnected_and_may_register_again(channel):
    controller, chan, addr = channel
    chan.silence_s = 0.3  # agents send heartbeats every 2 s; this one sends nothing
    quiet = Agent(addr, "a1", "A", 30000)
    quiet.wait_for(lambda m: m["t"] == "registered")
    # The agent sees its connection closed as soon as the controller closes it; the
    # controller's reader thread forgets the connection just after.
    wait_until(lambda: quiet.closed and "a1" not in chan.connections)
    assert "a1" in controller.registry.agents
    again = Agent(addr, "a1", "A", 30000)
    again.wait_for(lambda m: m["t"] == "registered")


def test_flow_descriptors_are_batched_below_the_header_limit():
    # 2000 descriptors with 4096-character file paths: about 8.3 kB each encoded,
    # so a 48 KiB batch holds 5 of them and a control header never nears 64 KiB.
    specs = [
        protocol.FlowSpec("1", f"f{i}", "a1", "b1", "B", 10, source="file:" + "p" * 4096)
        for i in range(2000)
    ]
    parts = batches(specs)
    assert [s.flow for part in parts for s in part] == [s.flow for s in specs]
    for part in parts:
        header = protocol.flows_message(part)
        assert len(msgpack.packb(header)) < 64 * 1024


@pytest.mark.parametrize("name", scheduler_names())
def test_with_switches_every_scheduler_routes_only_over_installed_tunnels_that_are_up(name):
    swan = load_topology("swan")
    table = TunnelTable(swan, 4, logical=False)
    options = SchedulerOptions(k=4, path_source=installed_path_source(table))
    policy = make_scheduler(name, swan, options)
    installed = {t.path for t in table.tunnels}
    swan.set_link_state("LA", "NY", False)
    policy.wan_changed(0.0)
    fresh = {p for s in swan.dcs for d in swan.dcs if s != d
             for p in k_shortest_paths(swan, s, d, 4)}  # fmt: skip
    assert fresh - installed  # plain K shortest paths would use paths without rules
    controller = Controller(swan, policy)
    for dc in swan.dcs:
        controller.registry.register_agent(dc.lower(), dc, "127.0.0.1:1")
    flows = [{"id": f"{s}{d}", "src": s.lower(), "dst": d.lower(), "bytes": 10**9}
             for s in swan.dcs for d in swan.dcs if s != d]  # fmt: skip
    controller.submit(flows)
    rates, _ = controller.run_round()
    used = {p for flows in rates.values() for paths in flows.values() for p, r in paths if r > 0}
    assert used and used <= installed
    assert all(("LA", "NY") not in path_links(p) and ("NY", "LA") not in path_links(p)
               for p in used)  # fmt: skip
    assert all(table.tunnel_for(p) is not None for p in used)


def test_sends_to_a_connection_that_is_ending_are_dropped_and_others_go_on(channel, monkeypatch):
    """An agent leaves while its writer is still busy: in the moment its queue is flushed,
    sends to it are dropped, and neither a push nor another agent's registration fails."""
    import trio

    import terra_controller.agent_connection as connection

    controller, chan, addr = channel
    real = connection.send_all

    async def slow(sock, data):  # a peer slow to read: each write takes 0.5 s
        await trio.sleep(0.5)
        await real(sock, data)

    a1 = Agent(addr, "a1", "A", 30000)
    a1.wait_for(lambda m: m["t"] == "tunnels")
    monkeypatch.setattr(connection, "send_all", slow)
    chan.push_tunnels()  # a1's writer is now busy for 0.5 s
    a1.close()  # its reader ends: the queue is flushed (what is queued goes, nothing more)
    time.sleep(0.1)
    monkeypatch.setattr(connection, "send_all", real)
    chan.push_tunnels()  # (raised ClosedResourceError while a1 was still listed)
    b1 = Agent(addr, "b1", "B", 31000)  # registers while a1's queue is flushed
    b1.wait_for(lambda m: m["t"] == "tunnels")
    time.sleep(0.7)
    assert not b1.closed and chan.connected_agents() == ["b1"]
    b1.close()


def test_the_goodbye_half_close_keeps_tls_for_the_agents_last_messages(channel, caplog):
    """close_all half-closes each connection (FIN) and waits: a message an agent sends in
    that grace period is still read as TLS, not as raw records ("message length ...")."""
    controller, chan, addr = channel
    sock = tls_socket(*addr, addr.pki, ensure(addr.pki, Role.AGENT, "a1"))
    send_parts(sock, protocol.register_message("A", "a1", "127.0.0.1:30000", None))
    while read_control(sock)["t"] != "registered":
        pass
    caplog.set_level(logging.INFO, logger="terra.agents")
    closing = threading.Thread(target=chan.close_all, args=(1.0,))
    closing.start()
    time.sleep(0.2)
    send_parts(sock, {"v": 1, "t": "heartbeat"})  # in the grace period, before reading
    closing.join()
    sock.close()
    texts = [r.getMessage() for r in caplog.records]
    assert not [t for t in texts if "exceeds" in t or "; closing" in t], texts
