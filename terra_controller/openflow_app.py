"""The os-ken OpenFlow 1.3 app: installs the tunnel rules once, follows WAN link state.

docs/design.md sections 1, 5 and 10. When every switch of the
topology binding has connected, the app installs the compiled tunnel rules
(terra_controller.tunnels) once. A PortStatus on a WAN port that changes the
link's state updates the Topology, removes (link down) or restores (link up)
the rules of the tunnels that cross the link, and calls `on_link_change` (the
scheduler's hook). Nothing else ever sends a flow-mod: rate and schedule
changes go to the agents, not the switches.

Start it with `start_openflow(config)` (os-ken's AppManager on the native
hub, docs/design.md section 10), or standalone for bring-up and tests:
``python -m terra_controller.openflow_app TOPOLOGY.json [--k 4] [--of-port 6653]``,
which prints one JSON line per event (installed, link).

The app's state (rules wanted, switches, flow-mod counts, port counters) is changed only
by its handlers, which os-ken runs one at a time in the app's event thread; the port
statistics poller only posts an event to that thread. So the app holds no lock: readers in
other threads (REST) read what the handlers replace whole or copy in one step.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

from os_ken.base import app_manager
from os_ken.controller import event, ofp_event
from os_ken.controller.handler import (
    CONFIG_DISPATCHER,
    DEAD_DISPATCHER,
    MAIN_DISPATCHER,
    set_ev_cls,
)
from os_ken.lib import hub
from os_ken.ofproto import ofproto_v1_3

from terra_controller.port_stats import PortSample, PortStats
from terra_controller.tunnels import (
    FlowEntry,
    Tunnel,
    compile_rules,
    diff_rules,
    rules_per_switch,
    startup_tunnels,
    tunnels_up,
)
from terra_core.cli_support import setup_logging
from topologies import Link, Topology, TopologyError, load_topology
from topologies.binding import Binding, load_binding

LOG = logging.getLogger(__name__)
APP_NAME = "TunnelApp"
DEFAULT_K = 4


@dataclass(frozen=True)
class LinkChange:
    """A WAN link went down or came back (both directions).

    Attributes:
        link: (a, b) DC names as the reporting switch sees it (a = that switch's DC).
        up: new state.
        tunnels_changed: ids of the tunnels removed (down) or restored (up).
        flow_mods: flow-mods sent for this change.
    """

    link: Link
    up: bool
    tunnels_changed: frozenset[int]
    flow_mods: int


@dataclass
class TunnelConfig:
    """What the app needs: the WAN, its binding, K and the callbacks.

    Attributes:
        topology: the WAN; the app updates its link state (the caller shares it
            with the scheduler; the callbacks run on the app's event thread).
        binding: DPIDs, ports and agent hosts (topologies.binding.load_binding).
        k: paths per DC pair (docs/design.md section 5; default 4).
        on_installed: called once with the app after the rules are sent.
        on_link_change: called with a LinkChange after each link state change.
        tunnels: the start-up tunnels (tunnels.startup_tunnels), shared with the agent
            channel; None: built here.
        port_stats_s: period of the port-statistics polls (seconds); 0 turns them off.
        role_generation: None alone; among controllers on etcd, the leader's generation: every
            switch is asked to make this controller its MASTER with it as the generation id
            (OpenFlow 1.3 section 6.3.7: a switch refuses a request older than the newest
            generation it saw, so a deposed leader cannot take a switch back).
    """

    topology: Topology
    binding: Binding
    k: int = DEFAULT_K
    on_installed: Callable[[TunnelApp], None] | None = None
    on_link_change: Callable[[LinkChange], None] | None = None
    tunnels: list[Tunnel] | None = None
    port_stats_s: float = 1.0
    role_generation: int | None = None


class EventPollPorts(event.EventBase):
    """Time to ask every switch for its port statistics (posted by the app's poller)."""


class TunnelApp(app_manager.OSKenApp):
    """OpenFlow 1.3 app: tunnel rules at start-up, rule changes on link failure/recovery.

    Keyword args (from AppManager.instantiate_apps): terra_config: TunnelConfig.

    Attributes (changed only in the app's event thread; other threads read values the
    handlers replace whole, such as `entries`, or copy them):
        tunnels: the tunnels (computed once, every link up).
        entries: flow entries currently wanted on the switches.
        datapaths: connected switches by DPID.
        installed: True once every switch holds the wanted rules.
        found: {dpid: FlowEntry list read from that switch's flow table (flow stats) since
            it connected}; syncing: {dpid: {"ports": {port: live} or None, "flows": [...],
            "done": bool}} of switches whose tables and ports are being read.
        flow_mods_per_switch: {dpid: flow-mods sent to that switch}.
        flow_mods_sent: all flow-mods sent; flow_mods_at_install: the count when
            installation finished (the difference is what link events cost).
        port_stats: PortStats, the switches' port counters (polled every
            `config.port_stats_s` seconds).
    """

    OFP_VERSIONS = [ofproto_v1_3.OFP_VERSION]

    def __init__(self, *args, terra_config: TunnelConfig | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        if terra_config is None:
            raise ValueError("TunnelApp needs terra_config=TunnelConfig(...)")
        self.config = terra_config
        self.tunnels = terra_config.tunnels or startup_tunnels(
            terra_config.topology, terra_config.k, terra_config.binding.base_port
        )
        self.entries: list[FlowEntry] = self._wanted()
        self.datapaths: dict = {}
        self.installed = False
        self.flow_mods_sent = 0
        self.flow_mods_per_switch: dict[int, int] = {}
        self.flow_mods_at_install = 0
        self.port_stats = PortStats(terra_config.binding)
        self.found: dict[int, list[FlowEntry]] = {}
        self.syncing: dict[int, dict] = {}
        self.read_changes: list[LinkChange] = []  # link states read, not yet reported
        self.ports_live: dict[tuple[int, int], bool] = {}  # (DPID, port): last state seen

    def start(self):
        """Start os-ken's event loop and, with a period, the port-statistics poller."""
        thread = super().start()
        if self.config.port_stats_s > 0:
            self.threads.append(hub.spawn(self._poll_port_stats))
        return thread

    def _poll_port_stats(self) -> None:
        """Every period: an EventPollPorts to the app's own event thread."""
        while self.is_active:
            self.send_event(self.name, EventPollPorts())
            hub.sleep(self.config.port_stats_s)

    @set_ev_cls(EventPollPorts)
    def poll_ports_handler(self, ev) -> None:
        """One OFPPortStatsRequest (all ports) to every connected switch."""
        for dp in list(self.datapaths.values()):
            ofp, parser = dp.ofproto, dp.ofproto_parser
            dp.send_msg(parser.OFPPortStatsRequest(dp, 0, ofp.OFPP_ANY))

    @set_ev_cls(ofp_event.EventOFPPortStatsReply, MAIN_DISPATCHER)
    def port_stats_reply_handler(self, ev) -> None:
        """Record every port's counters of a switch's reply (port_stats.PortStats)."""
        now = time.monotonic()
        dpid = ev.msg.datapath.id
        for st in ev.msg.body:
            self.port_stats.record(dpid, st.port_no, PortSample(
                now, st.tx_bytes, st.rx_bytes, st.tx_packets, st.rx_packets, st.tx_dropped,
                st.rx_dropped,
            ))  # fmt: skip
        self.port_stats.replies += 1

    def rules_per_switch(self) -> dict[int, int]:
        """Return {dpid: number of flow entries wanted there}."""
        return rules_per_switch(self.entries)

    def _wanted(self) -> list[FlowEntry]:
        up = tunnels_up(self.tunnels, self.config.topology)
        return compile_rules(self.tunnels, self.config.binding, up)

    @set_ev_cls(ofp_event.EventOFPSwitchFeatures, CONFIG_DISPATCHER)
    def switch_features_handler(self, ev) -> None:
        """Record the switch (MASTER role first, among controllers on etcd) and read its
        ports and flow table; `_synced` installs only what differs from the wanted rules."""
        dp = ev.msg.datapath
        if self.config.binding.dc_of(dp.id) is None:
            LOG.warning("switch %016x is not in the binding; ignored", dp.id)
            return
        ofp, parser = dp.ofproto, dp.ofproto_parser
        self.datapaths[dp.id] = dp
        self.syncing[dp.id] = {"ports": None, "flows": [], "done": False}
        if self.config.role_generation is not None:
            dp.send_msg(parser.OFPRoleRequest(dp, ofp.OFPCR_ROLE_MASTER,
                                              self.config.role_generation))  # fmt: skip
        dp.send_msg(parser.OFPPortDescStatsRequest(dp, 0))
        dp.send_msg(parser.OFPFlowStatsRequest(dp, 0, ofp.OFPTT_ALL, ofp.OFPP_ANY,
                                               ofp.OFPG_ANY, 0, 0, parser.OFPMatch()))  # fmt: skip

    @set_ev_cls(ofp_event.EventOFPPortDescStatsReply, MAIN_DISPATCHER)
    def port_desc_reply_handler(self, ev) -> None:
        """A switch's ports as they are now (part of `switch_features_handler`'s reading)."""
        msg = ev.msg
        ofp = msg.datapath.ofproto
        sync = self.syncing.get(msg.datapath.id)
        if sync is None:
            return
        ports = sync["ports"] if sync["ports"] is not None else {}
        for port in msg.body:
            ports[port.port_no] = port_live(ofp, port.state, port.config)
        if not msg.flags & ofp.OFPMPF_REPLY_MORE:
            sync["ports"] = ports
        self._maybe_synced(msg.datapath)

    @set_ev_cls(ofp_event.EventOFPFlowStatsReply, MAIN_DISPATCHER)
    def flow_stats_reply_handler(self, ev) -> None:
        """A switch's flow entries (part of `switch_features_handler`'s reading)."""
        msg = ev.msg
        dp = msg.datapath
        sync = self.syncing.get(dp.id)
        if sync is None:
            return
        sync["flows"] += [from_flow_stats(dp.id, stat, dp.ofproto) for stat in msg.body]
        if not msg.flags & dp.ofproto.OFPMPF_REPLY_MORE:
            sync["done"] = True
        self._maybe_synced(dp)

    def _maybe_synced(self, dp) -> None:
        """Once a switch's ports and flow table are read: take its link states, and once every
        switch is read (or for a switch that reconnects later), send only the flow-mods that
        turn what the switches hold into the wanted rules."""
        binding = self.config.binding
        first = False
        sync = self.syncing.get(dp.id)
        if sync is None or sync["ports"] is None or not sync["done"]:
            return
        del self.syncing[dp.id]
        self.found[dp.id] = sync["flows"]
        self.read_changes += self._take_port_states(dp.id, sync["ports"])
        if not self.installed:
            if set(self.found) != {sw.dpid for sw in binding.switches.values()}:
                return
            self.entries = [e for entries in self.found.values() for e in entries]
        else:
            self.entries = [e for e in self.entries if e.dpid != dp.id] + sync["flows"]
        sent = self._apply(self._wanted())
        if not self.installed:
            first, self.installed = True, True
            self.flow_mods_at_install = self.flow_mods_sent
        changes, self.read_changes = self.read_changes, []
        LOG.info("switch %016x read; %d flow-mods sent", dp.id, sent)
        if first:
            LOG.info("tunnel rules installed: %s", rules_per_switch(self.entries))
            if self.config.on_installed:
                self.config.on_installed(self)
        if self.config.on_link_change:
            for change in changes:
                self.config.on_link_change(change)

    def _take_port_states(self, dpid: int, ports: dict[int, bool]) -> list[LinkChange]:
        """Set the state of every WAN link of switch `dpid` from its ports;
        the changes, to report once the rules follow them."""
        topology, changes = self.config.topology, []
        for port_no, port_up in ports.items():
            link = self.config.binding.link_of_port(dpid, port_no)
            if link is None:
                continue
            live = self._link_live(link, dpid, port_no, port_up)
            if live == (link not in topology.down):
                continue
            before = tunnels_up(self.tunnels, topology)
            topology.set_link_state(*link, up=live)
            changed = frozenset(before ^ tunnels_up(self.tunnels, topology))
            changes.append(LinkChange(link, live, changed, 0))
            LOG.info("link %s-%s %s (read from switch %016x)", *link,
                     "up" if live else "down", dpid)  # fmt: skip
        return changes

    def _link_live(self, link: Link, dpid: int, port_no: int, port_up: bool) -> bool:
        """Record the state of port `port_no` of switch `dpid` (link `link`'s end there);
        return whether the link is live: neither of its two ports is known to be down. (A
        link going down reports both ends, one after the other, and the second end may still
        say live in between: that must not bring the link back.)"""
        self.ports_live[(dpid, port_no)] = port_up
        a, b = link
        try:
            other = (self.config.binding.dpid_of(b), self.config.binding.port_to(b, a))
        except KeyError:  # (the far end is not bound: this end decides)
            return port_up
        return port_up and self.ports_live.get(other, True)

    @set_ev_cls(ofp_event.EventOFPStateChange, DEAD_DISPATCHER)
    def state_change_handler(self, ev) -> None:
        """Forget a switch whose connection closed."""
        dp = ev.datapath
        if dp.id is not None and self.datapaths.get(dp.id) is dp:
            del self.datapaths[dp.id]

    @set_ev_cls(ofp_event.EventOFPPortStatus, MAIN_DISPATCHER)
    def port_status_handler(self, ev) -> None:
        """A WAN port changed: update the link state, remove/restore tunnels, notify."""
        msg = ev.msg
        ofp = msg.datapath.ofproto
        link = self.config.binding.link_of_port(msg.datapath.id, msg.desc.port_no)
        if link is None:
            return
        port_up = msg.reason != ofp.OFPPR_DELETE and port_live(ofp, msg.desc.state, msg.desc.config)
        live = self._link_live(link, msg.datapath.id, msg.desc.port_no, port_up)
        topology = self.config.topology
        if live == (link not in topology.down):
            return
        before = tunnels_up(self.tunnels, topology)
        topology.set_link_state(*link, up=live)
        changed = frozenset(before ^ tunnels_up(self.tunnels, topology))
        sent = self._apply(self._wanted()) if self.installed else 0
        LOG.info(
            "link %s-%s %s: %d tunnels, %d flow-mods",
            *link,
            "up" if live else "down",
            len(changed),
            sent,
        )
        if self.config.on_link_change:
            self.config.on_link_change(LinkChange(link, live, changed, sent))

    def _apply(self, wanted: list[FlowEntry]) -> int:
        """Send the flow-mods that turn self.entries into `wanted`; return how many."""
        to_delete, to_add = diff_rules(self.entries, wanted)
        self.entries = wanted
        before = self.flow_mods_sent
        for entry in to_delete:
            if entry.dpid in self.datapaths:
                self._send(self.datapaths[entry.dpid], entry, delete=True)
        for entry in to_add:
            if entry.dpid in self.datapaths:
                self._send(self.datapaths[entry.dpid], entry)
        return self.flow_mods_sent - before

    def _send(self, dp, entry: FlowEntry, delete: bool = False) -> None:
        ofp, parser = dp.ofproto, dp.ofproto_parser
        match = parser.OFPMatch(**entry.match)
        if delete:
            mod = parser.OFPFlowMod(
                dp,
                table_id=entry.table_id,
                command=ofp.OFPFC_DELETE_STRICT,
                priority=entry.priority,
                match=match,
                out_port=ofp.OFPP_ANY,
                out_group=ofp.OFPG_ANY,
            )
        else:
            mod = parser.OFPFlowMod(
                dp,
                cookie=entry.cookie,
                table_id=entry.table_id,
                command=ofp.OFPFC_ADD,
                priority=entry.priority,
                match=match,
                instructions=to_instructions(parser, ofp, entry.actions),
            )
        dp.send_msg(mod)
        self._count_mod(dp.id)

    def _count_mod(self, dpid: int) -> None:
        self.flow_mods_sent += 1
        self.flow_mods_per_switch[dpid] = self.flow_mods_per_switch.get(dpid, 0) + 1


def port_live(ofp, state: int, config: int) -> bool:
    """Whether a port carries traffic: its link is up and it is not administratively down."""
    return not state & ofp.OFPPS_LINK_DOWN and not config & ofp.OFPPC_PORT_DOWN


def from_flow_stats(dpid: int, stat, ofp) -> FlowEntry:
    """The FlowEntry of one OFPFlowStats (the inverse of `to_instructions`): match fields by
    os-ken name, apply-actions as FlowEntry action tuples, then a goto_table; an action
    FlowEntry has no name for is kept as ("other", its class name), so it never equals a
    wanted entry."""
    actions: list = []
    goto = []
    for inst in stat.instructions:
        if getattr(inst, "type", None) == ofp.OFPIT_APPLY_ACTIONS:
            actions += [_action_tuple(a) for a in inst.actions]
        elif hasattr(inst, "table_id") and getattr(inst, "type", None) == ofp.OFPIT_GOTO_TABLE:
            goto.append(("goto_table", inst.table_id))
        else:
            actions.append(("other", type(inst).__name__))
    return FlowEntry(dpid, stat.table_id, stat.priority, dict(stat.match.items()),
                     actions + goto, stat.cookie)  # fmt: skip


def _action_tuple(action) -> tuple:
    name = type(action).__name__
    if name == "OFPActionOutput":
        return ("output", action.port)
    if name == "OFPActionPushMpls":
        return ("push_mpls", action.ethertype)
    if name == "OFPActionPopMpls":
        return ("pop_mpls", action.ethertype)
    if name == "OFPActionSetField":
        return ("set_field", action.key, action.value)
    return ("other", name)


def to_instructions(parser, ofp, actions: list) -> list:
    """Translate FlowEntry actions (terra_controller.tunnels) to OpenFlow 1.3 instructions.

    Raises:
        ValueError: an unknown action.
    """
    applied, instructions = [], []
    for action in actions:
        kind = action[0]
        if kind == "output":
            applied.append(parser.OFPActionOutput(action[1]))
        elif kind == "push_mpls":
            applied.append(parser.OFPActionPushMpls(action[1]))
        elif kind == "pop_mpls":
            applied.append(parser.OFPActionPopMpls(action[1]))
        elif kind == "set_field":
            applied.append(parser.OFPActionSetField(**{action[1]: action[2]}))
        elif kind == "goto_table":
            instructions.append(parser.OFPInstructionGotoTable(action[1]))
        else:
            raise ValueError(f"unknown flow entry action {action!r}")
    if applied:
        instructions.insert(0, parser.OFPInstructionActions(ofp.OFPIT_APPLY_ACTIONS, applied))
    return instructions


def start_openflow(config: TunnelConfig, of_host: str = "127.0.0.1", of_port: int = 6653):
    """Start os-ken (OpenFlow listener + TunnelApp) on the native hub, in this process.

    Once per process: os-ken's AppManager and CONF are process-wide singletons.

    Args:
        config: the app's TunnelConfig.
        of_host, of_port: where to listen for switches (TCP).

    Returns:
        (app, threads): the TunnelApp and os-ken's threads (join them to block).
    """
    from os_ken import cfg
    from os_ken.controller import controller  # noqa: F401  (registers the ofp options)
    from os_ken.lib import hub

    hub.patch(thread=False)
    cfg.CONF(
        args=[f"--ofp-listen-host={of_host}", f"--ofp-tcp-listen-port={of_port}"],
        project="os_ken",
    )
    manager = app_manager.AppManager.get_instance()
    manager.load_apps([__name__ if __name__ != "__main__" else "terra_controller.openflow_app"])
    contexts = manager.create_contexts()
    threads = manager.instantiate_apps(terra_config=config, **contexts)
    return manager.applications[APP_NAME], threads


def main(argv: list[str] | None = None) -> int:
    """Standalone bring-up: run the app and print one JSON line per event on stdout."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("topology", help="topology JSON with a 'switches' binding")
    parser.add_argument("--k", type=int, default=DEFAULT_K, help="paths per DC pair")
    parser.add_argument("--of-host", default="127.0.0.1")
    parser.add_argument("--of-port", type=int, default=6653)
    args = parser.parse_args(argv)
    setup_logging("WARNING")
    try:
        topology = load_topology(args.topology)
        binding = load_binding(topology)
    except TopologyError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2

    def emit(**event) -> None:
        print(json.dumps(event), flush=True)

    def installed(app: TunnelApp) -> None:
        emit(
            event="installed",
            tunnels=len(app.tunnels),
            flow_mods=app.flow_mods_sent,
            rules_per_switch=app.rules_per_switch(),
        )

    def link_change(change: LinkChange) -> None:
        emit(
            event="link",
            link=list(change.link),
            up=change.up,
            tunnels=sorted(change.tunnels_changed),
            flow_mods=change.flow_mods,
        )

    config = TunnelConfig(topology, binding, args.k, installed, link_change)
    _, threads = start_openflow(config, args.of_host, args.of_port)
    emit(event="listening", of_port=args.of_port)
    for thread in threads:
        thread.join()
    return 0


if __name__ == "__main__":
    sys.exit(main())
