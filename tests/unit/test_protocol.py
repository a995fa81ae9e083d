"""terra_wire/control.py: constructors round-trip through the real frame codec; validators reject
each malformed field with a message naming it."""

import msgpack
import pytest

from terra_wire.control import (
    FlowSpec,
    GroupRates,
    ProtocolError,
    TunnelSpec,
    complete_message,
    flows_message,
    parse_addr,
    parse_flows,
    parse_rates,
    parse_tunnels,
    progress_message,
    rates_message,
    register_message,
    tunnels_message,
    validate_control,
    validate_data,
)
from terra_wire.frames import encode_frame

TUNNEL = TunnelSpec("HK-LA-0", "b", "127.0.0.3:9000", ("HK", "LA"), 9001)
FLOW = FlowSpec("c1", "f1", "a", "b", "LA", 1000, offset=10, source="synthetic", sink="file:/x")


def wire(header: dict) -> dict:
    """Encode as a real frame and decode the header back (what the peer sees)."""
    head = bytes(encode_frame(header)[0])
    return msgpack.unpackb(head[4:], raw=False)


def test_constructors_round_trip_through_frames():
    msg = wire(tunnels_message([TUNNEL], [9001, 9002], msg_id=7))
    specs, listen = parse_tunnels(msg)
    assert specs == [TUNNEL] and listen == [9001, 9002] and msg["id"] == 7
    assert parse_flows(wire(flows_message([FLOW]))) == [FLOW]
    rates = GroupRates("c1", "LA", {"HK-LA-0": 3e6, "HK-LA-1": 0.0})
    assert parse_rates(wire(rates_message([rates]))) == [rates]
    reg = wire(register_message("HK", "a", "127.0.0.2:9000"))
    assert validate_control(reg)["agent"] == "a"
    progress = wire(progress_message([("c1", "f1", 5, "0" * 32)]))
    assert validate_control(progress)["flows"][0]["acked"] == 5
    assert validate_control(wire(complete_message("c1", "f1", "ab" * 32, 1000, "0" * 32)))


@pytest.mark.parametrize(
    "msg, words",
    [
        ({"t": "nope"}, "unknown control message type"),
        ({"t": "register", "dc": "HK", "agent": "a"}, "data_addr"),
        ({"t": "register", "dc": "HK", "agent": "a", "data_addr": "h:99999"}, "port"),
        ({"t": "register", "dc": "", "agent": "a", "data_addr": "h:1"}, "'dc'"),
        (
            {
                "t": "register",
                "dc": "HK",
                "agent": "a",
                "data_addr": "h:1",
                "inflight": [{"coflow": "c", "flow": "f", "offset": 1, "role": "x"}],
            },
            "role",
        ),
        ({"t": "tunnels", "tunnels": [{**TUNNEL.to_dict(), "port": 0}]}, "'port'"),
        ({"t": "tunnels", "tunnels": [{**TUNNEL.to_dict(), "path": ["HK"]}]}, "path"),
        ({"t": "tunnels", "tunnels": [TUNNEL.to_dict(), TUNNEL.to_dict()]}, "duplicate"),
        ({"t": "tunnels", "tunnels": [], "listen": [70000]}, "listen"),
        ({"t": "flows", "flows": [{**FLOW.to_dict(), "size": 0}]}, "'size'"),
        ({"t": "flows", "flows": [{**FLOW.to_dict(), "offset": 1001}]}, "offset"),
        ({"t": "flows", "flows": [{**FLOW.to_dict(), "source": "http://x"}]}, "source"),
        ({"t": "flows", "flows": [{**FLOW.to_dict(), "sink": "file:"}]}, "sink"),
        ({"t": "flows", "flows": "x"}, "Expected `array`"),
        ({"t": "rates", "rates": [{"coflow": "c", "dst_dc": "LA", "paths": [{}]}]}, "tunnel"),
        (
            {"t": "rates", "rates": [{"coflow": "c", "dst_dc": "LA", "paths": [{"tunnel": "t"}]}]},
            "rate",
        ),
        (
            {
                "t": "rates",
                "rates": [{"coflow": "c", "dst_dc": "LA", "paths": [{"tunnel": "t", "rate": -1}]}],
            },
            "rate",
        ),
        ({"t": "progress", "flows": [{"coflow": "c", "flow": "f", "acked": -1}]}, "acked"),
        ({"t": "complete", "coflow": "c", "flow": "f", "digest": "d", "size": 0}, "size"),
        ({"t": "ack", "id": None}, "'id'"),
        ({"t": "error"}, "message"),
        ({"t": "heartbeat", "id": 1.5}, "'id'"),
    ],
)
def test_validate_control_rejects_with_clear_message(msg, words):
    with pytest.raises(ProtocolError, match=words):
        validate_control(msg)


def test_validate_control_rejects_non_map():
    with pytest.raises(ProtocolError, match="map"):
        validate_control(["t", "register"])


@pytest.mark.parametrize(
    "msg, words",
    [
        ({"t": "hello", "agent": "a"}, "tunnel"),
        ({"t": "ack", "c": "c", "f": "f", "o": 1}, "'e'"),
        ({"t": "ack", "c": "c", "f": "f", "o": True, "e": 1}, "'o'"),
        ({"t": "chunk", "c": "c", "f": "f", "o": 0, "d": 5}, "'d'"),
        ({"t": "rates"}, "unknown data message"),
    ],
)
def test_validate_data_rejects(msg, words):
    with pytest.raises(ProtocolError, match=words):
        validate_data(msg)


def test_validate_data_accepts_all_types():
    assert validate_data({"t": "hello", "agent": "a", "tunnel": "t"})
    assert validate_data({"t": "ack", "c": "c", "f": "f", "o": 3, "e": 12})
    assert validate_data({"t": "chunk", "c": "c", "f": "f", "o": 3, "d": "ab"})


def test_parse_addr():
    assert parse_addr("127.0.0.2:9000") == ("127.0.0.2", 9000)
    assert parse_addr("[::1]:80") == ("::1", 80)
    for bad in ("nohost", ":80", "h:x", "h:0", 5):
        with pytest.raises(ProtocolError):
            parse_addr(bad)


def test_tunnel_peer_host_and_flow_key():
    assert TUNNEL.peer_host == "127.0.0.3"
    assert FLOW.key == ("c1", "f1")
    assert GroupRates("c1", "LA", {}).key == ("c1", "LA")
