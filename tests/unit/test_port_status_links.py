"""A WAN link's state from its two switch ports (terra_controller/openflow_app.py): the link is
live only while neither port is known to be down. Mininet setting a link down reports one
end, then the other, and the second end may still say live in between; that must not bring
the link back up (tests/system/test_switches_e2e.py saw the flap).

OpenFlow 1.3 PortStatus messages built with os-ken's parser, handed to the app's handler as
a switch connection would; the datapath is a stand-in holding the DPID and the protocol (no
switch: the flow-mods have nowhere to go).
"""

from __future__ import annotations

from types import SimpleNamespace

from os_ken.ofproto import ofproto_v1_3 as ofp
from os_ken.ofproto import ofproto_v1_3_parser as parser
from switch_triangle import bound_triangle

from terra_controller.openflow_app import TunnelApp, TunnelConfig
from topologies.binding import load_binding
from topologies.loaders import load_json_topology


def triangle_app(tmp_path):
    topology = load_json_topology(bound_triangle(tmp_path))
    changes = []
    config = TunnelConfig(topology, load_binding(topology), 2, on_link_change=changes.append)
    return TunnelApp(terra_config=config), changes


def port_status(app, dc: str, neighbour: str, up: bool):
    """The PortStatus of `dc`'s switch port towards `neighbour`: MODIFY, link up or down."""
    binding = app.config.binding
    port_no = binding.port_to(dc, neighbour)
    datapath = SimpleNamespace(id=binding.dpid_of(dc), ofproto=ofp, ofproto_parser=parser)
    desc = parser.OFPPort(port_no, "00:00:00:00:00:01", f"s-{dc}-{neighbour}", 0,
                          0 if up else ofp.OFPPS_LINK_DOWN, 0, 0, 0, 0, 0, 0)  # fmt: skip
    msg = parser.OFPPortStatus(datapath, ofp.OFPPR_MODIFY, desc)
    app.port_status_handler(SimpleNamespace(msg=msg))


def test_a_link_stays_down_while_either_port_is_down(tmp_path):
    app, changes = triangle_app(tmp_path)
    down = app.config.topology.down
    port_status(app, "B", "A", up=False)  # the first end goes down: the link is down
    assert ("A", "B") in down or ("B", "A") in down
    port_status(app, "A", "B", up=True)  # the other end still says live: no flap
    port_status(app, "A", "B", up=False)
    assert [(c.link, c.up) for c in changes] == [(("B", "A"), False)]
    port_status(app, "A", "B", up=True)  # one end back: still down
    assert [c.up for c in changes] == [False]
    port_status(app, "B", "A", up=True)  # both ends live: up again
    assert [(c.link, c.up) for c in changes] == [(("B", "A"), False), (("B", "A"), True)]
    assert not down
