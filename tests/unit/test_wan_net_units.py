"""ovs_send_buffer: ovs-vswitchd's shared send socket in `ss -0 -m -p` output (no OVS)."""

from mininet_scenarios.wan_net import OVS_SEND_BUFFER_BYTES, ovs_send_buffer

# Captured on this machine during a testbed run: per-port receive sockets (bound to sN-ethX)
# and the one unbound socket ("[0]:*") that sends for every port.
SS = """\
p_raw 0      0                  *:s1-eth2                *     users:(("ovs-vswitchd",pid=13537,fd=38)) skmem:(r0,rb212992,t0,tb212992,f0,w0,o176,bl0,d0)
p_raw 4562   0                  *:s1-eth100              *     users:(("ovs-vswitchd",pid=13537,fd=40)) skmem:(r4562,rb212992,t0,tb212992,f0,w0,o176,bl0,d10)
p_raw 0      0                [0]:*                      *     users:(("ovs-vswitchd",pid=13537,fd=88)) skmem:(r0,rb212992,t73920,tb33554432,f0,w0,o0,bl0,d0)
"""  # noqa: E501


def test_send_buffer_of_the_unbound_socket():
    assert ovs_send_buffer(SS) == 33554432 == OVS_SEND_BUFFER_BYTES


def test_default_sized_socket_is_reported_as_is():
    small = SS.replace("tb33554432", "tb212992")
    assert ovs_send_buffer(small) == 212992 < OVS_SEND_BUFFER_BYTES


def test_no_ovs_socket_yet():
    assert ovs_send_buffer("") is None
    assert ovs_send_buffer(SS.splitlines()[0]) is None  # only a per-port socket
