"""The controller's Prometheus metrics (docs/runtime.md "Metrics").

Every Controller owns one `ControllerMetrics`: a `prometheus_client.CollectorRegistry`
of its own (never the process-global one, so tests and benchmarks can run several
controllers in one process) holding

- objects updated at the event, where the event happens: the round's and the
  policy's durations and every LP solve (histograms, seconds), admissions,
  rejections, finished coflows by final state, flow restarts, bytes acknowledged,
  agent registrations (counters), WAN reaction times (histogram, seconds);
- `ControllerCollector`, which reads what lives in the controller at scrape time:
  per-link capacity, allocated rate and state (labels `a`, `b`: the directed link
  a->b), active coflows by state, registered and connected agents, and per-DPID
  rules and flow-mods from the OpenFlow app;
- the process, platform and GC collectors (CPU seconds, RSS, open fds, Python version,
  garbage collections).

A scrape never walks the finished coflows: its cost is O(links + active coflows'
flows + switches), whatever the history (target: < 50 ms with 100k finished coflows,
benchmarks/metrics_scrape.py). Metric names, types, labels and units are listed in
docs/runtime.md.
"""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import (
    CollectorRegistry,
    Counter,
    GCCollector,
    Histogram,
    PlatformCollector,
    ProcessCollector,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from overlay.pending_connections import listener_families
from terra_model.states import CoflowStatus

# Histogram buckets (seconds). A round on SWAN takes ~1 ms, on ATT with hundreds of
# coflows up to seconds; one LP takes tens of microseconds to tens of milliseconds.
ROUND_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
                 5.0, 10.0, float("inf"))  # fmt: skip
LP_BUCKETS = (1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 0.01, 0.025, 0.05,
              0.1, 0.25, 1.0, float("inf"))  # fmt: skip
CCT_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0,
               3600.0, float("inf"))  # fmt: skip
ACTIVE_STATES = (CoflowStatus.QUEUED, CoflowStatus.RUNNING, CoflowStatus.PREEMPTED)
ENDED_STATES = tuple(s.value for s in (CoflowStatus.DONE, CoflowStatus.FAILED,
                                       CoflowStatus.CANCELLED))  # fmt: skip
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class ControllerMetrics:
    """One controller's metric objects on its own CollectorRegistry.

    Attributes (prometheus_client objects; the controller updates them at the event):
        registry: the CollectorRegistry (`render()` serialises it).
        round_duration: Histogram terra_round_duration_seconds (a whole round).
        allocate_duration: Histogram terra_allocate_duration_seconds (policy.allocate).
        lp_solve: Histogram terra_lp_solve_duration_seconds (one HiGHS run, in rounds and
            admissions).
        admitted, rejected: Counters terra_coflows_admitted_total /
            terra_coflows_rejected_total (submissions the policy accepted / refused).
        finished: Counter terra_coflows_finished_total{state} (done, failed, cancelled;
            counted when the coflow ends, so dropping it from memory later changes nothing).
        restarts: Counter terra_flow_restarts_total.
        bytes_delivered: Counter terra_bytes_delivered_total (bytes the receivers
            acknowledged; a flow restarted from byte 0 counts its bytes again).
        registrations: Counter terra_agent_registrations_total (successful "register"
            messages, reconnections included).
        reaction: Histogram terra_wan_reaction_seconds (a WAN event to the last agent's
            acknowledgement of its new rates; reaction.Reaction).
        listeners: {server name: its connection counts (overlay/pending_connections.py
            ConnectionCounts: total, refused, evicted)}, filled as the servers start and
            read at scrape time (overlay/pending_connections.listener_families).
    """

    def __init__(self) -> None:
        self.listeners: dict = {}
        self.registry = CollectorRegistry(auto_describe=False)
        ProcessCollector(registry=self.registry)
        PlatformCollector(registry=self.registry)
        GCCollector(registry=self.registry)
        reg = self.registry
        self.round_duration = Histogram(
            "terra_round_duration_seconds",
            "Wall time of a scheduling round (snapshot, policy.allocate, apply)",
            buckets=ROUND_BUCKETS, registry=reg,
        )  # fmt: skip
        self.allocate_duration = Histogram(
            "terra_allocate_duration_seconds",
            "Wall time of the policy's allocate() within a round",
            buckets=ROUND_BUCKETS, registry=reg,
        )  # fmt: skip
        self.lp_solve = Histogram(
            "terra_lp_solve_duration_seconds",
            "Wall time of one LP solve (HiGHS) in a round or an admission",
            buckets=LP_BUCKETS, registry=reg,
        )  # fmt: skip
        self.admitted = Counter(
            "terra_coflows_admitted", "Coflows admitted (submitted and accepted)", registry=reg
        )
        self.rejected = Counter(
            "terra_coflows_rejected", "Coflows rejected at admission (deadline)", registry=reg
        )
        self.finished = Counter(
            "terra_coflows_finished",
            "Coflows that reached a final state, by that state",
            ["state"], registry=reg,
        )  # fmt: skip
        for state in ENDED_STATES:
            self.finished.labels(state)
        self.restarts = Counter(
            "terra_flow_restarts", "Flows sent again from byte 0 after a digest mismatch",
            registry=reg,
        )  # fmt: skip
        self.bytes_delivered = Counter(
            "terra_bytes_delivered", "Bytes acknowledged by receivers", registry=reg
        )
        self.registrations = Counter(
            "terra_agent_registrations",
            "Agent registrations on the control channel (reconnections included)",
            registry=reg,
        )  # fmt: skip

        self.reaction = Histogram(
            "terra_wan_reaction_seconds",
            "From a WAN event (link down/up, capacity change) until every agent that got "
            "new rates acknowledged them",
            buckets=ROUND_BUCKETS, registry=reg,
        )  # fmt: skip

    def render(self) -> bytes:
        """The registry in Prometheus text format (version 0.0.4), UTF-8 bytes."""
        return generate_latest(self.registry)


class ControllerCollector:
    """Reads the controller (and the agent channel, the OpenFlow app) at scrape time.

    Args:
        controller: the Controller (its `metrics_view()`; see there).
        connected: callable returning the number of agents with an open control
            connection, or None.
        openflow: callable returning {"rules_per_switch": {dpid: n},
            "flow_mods_per_switch": {dpid: n}, ...} (the OpenFlow app), or None.
        ports: callable returning {(a, b): port_stats.LinkLoad} (the switches' WAN port
            counters), or None without switches.

    Metrics: see `collect`.
    """

    def __init__(
        self,
        controller,
        connected: Callable[[], int] | None = None,
        openflow: Callable[[], dict] | None = None,
        ports: Callable[[], dict] | None = None,
    ) -> None:
        self.controller = controller
        self.connected = connected
        self.openflow = openflow
        self.ports = ports

    def describe(self):
        """Nothing: collected at scrape time only (the registry skips description)."""
        return []

    def collect(self):
        """Yield the scrape-time families: terra_link_capacity_bytes_per_second,
        terra_link_allocated_bytes_per_second, terra_link_up, terra_link_delivered_bytes_total
        {a, b};
        terra_coflows_active {state}; terra_coflows_in_memory; terra_coflows_dropped_total
        {state}; terra_agents_registered;
        terra_agent_connections; terra_lps_solved_total; terra_switch_rules {dpid};
        terra_switch_flow_mods_total {dpid}; with switches, `port_families`; the servers'
        `listener_families` (terra_connections_*{server})."""
        view = self.controller.metrics_view()
        yield from link_families(view["links"])
        yield from coflow_families(view)
        yield GaugeMetricFamily(
            "terra_agents_registered", "Agents the controller knows", value=view["agents"]
        )
        if self.connected is not None:
            yield GaugeMetricFamily(
                "terra_agent_connections", "Agents with an open control connection",
                value=self.connected(),
            )  # fmt: skip
        yield CounterMetricFamily("terra_lps_solved", "LPs solved by the policy", value=view["lps"])
        yield from role_families(self.controller)
        if self.openflow is not None:
            yield from switch_families(self.openflow())
        if self.ports is not None:
            yield from port_families(self.ports())
        yield from listener_families(self.controller.metrics.listeners, "terra")


def link_families(links):
    """Per-link families from the controller's view of the WAN (an iterable of
    (a, b, capacity bytes/s, up, allocated bytes/s, delivered bytes) per directed link
    a->b): terra_link_capacity_bytes_per_second, terra_link_allocated_bytes_per_second,
    terra_link_up (1 up, 0 down) and terra_link_delivered_bytes_total, labels a, b."""
    capacity = GaugeMetricFamily(
        "terra_link_capacity_bytes_per_second", "Capacity of the directed link a->b",
        labels=["a", "b"],
    )  # fmt: skip
    allocated = GaugeMetricFamily(
        "terra_link_allocated_bytes_per_second",
        "Rate the last round allocated on the directed link a->b", labels=["a", "b"],
    )  # fmt: skip
    state = GaugeMetricFamily(
        "terra_link_up", "1 when the directed link a->b is up, 0 when down",
        labels=["a", "b"],
    )  # fmt: skip
    delivered = CounterMetricFamily(
        "terra_link_delivered_bytes",
        "Bytes acknowledged by receivers that crossed the directed link a->b (split over "
        "a flow's paths by rate)", labels=["a", "b"],
    )  # fmt: skip
    for a, b, cap, up, load, nbytes in links:
        capacity.add_metric([a, b], cap)
        allocated.add_metric([a, b], load)
        state.add_metric([a, b], 1.0 if up else 0.0)
        delivered.add_metric([a, b], nbytes)
    yield capacity
    yield allocated
    yield state
    yield delivered


def coflow_families(view: dict):
    """The coflow counts of the controller's `metrics_view()`: terra_coflows_active{state}
    (queued, running, preempted), terra_coflows_in_memory and
    terra_coflows_dropped_total{state} (finished coflows dropped, by final state)."""
    active = GaugeMetricFamily(
        "terra_coflows_active", "Coflows not in a final state, by state", labels=["state"]
    )
    for name in ACTIVE_STATES:
        active.add_metric([name.value], view["active"].get(name.value, 0))
    yield active
    yield GaugeMetricFamily(
        "terra_coflows_in_memory",
        "Coflows kept for status requests (active and finished not yet dropped)",
        value=view["in_memory"],
    )
    dropped = CounterMetricFamily(
        "terra_coflows_dropped", "Finished coflows dropped from memory, by final state",
        labels=["state"],
    )  # fmt: skip
    for name, n in sorted(view["dropped"].items()):
        dropped.add_metric([name], n)
    yield dropped


def switch_families(info: dict):
    """Per-switch families from the OpenFlow app's counts ({"rules_per_switch": {dpid: n},
    "flow_mods_per_switch": {dpid: n}, ...}; a missing key gives an empty family):
    terra_switch_rules{dpid} and terra_switch_flow_mods_total{dpid}."""
    rules = GaugeMetricFamily(
        "terra_switch_rules", "Flow entries the controller wants on the switch",
        labels=["dpid"],
    )  # fmt: skip
    for dpid, n in sorted(info.get("rules_per_switch", {}).items()):
        rules.add_metric([str(dpid)], n)
    yield rules
    mods = CounterMetricFamily(
        "terra_switch_flow_mods", "Flow-mods sent to the switch", labels=["dpid"]
    )
    for dpid, n in sorted(info.get("flow_mods_per_switch", {}).items()):
        mods.add_metric([str(dpid)], n)
    yield mods


def role_families(controller):
    """This controller's role among controllers on etcd (cli --etcd): terra_controller_role
    {role} (1 for its role: "single" or "leader"; a standby serves no metrics),
    terra_leader_generation (the etcd generation it leads with, 0 alone: it grows with every
    failover), terra_state_version and terra_state_store_failing."""
    health = controller.health()
    role = GaugeMetricFamily("terra_controller_role", "This controller's role (1: the one it "
                             "has)", labels=["role"])  # fmt: skip
    for name in ("single", "leader"):
        role.add_metric([name], 1.0 if health["role"] == name else 0.0)
    yield role
    yield GaugeMetricFamily("terra_leader_generation", "etcd generation of this leader (0: "
                            "no etcd); it grows with every failover",
                            value=controller.generation)  # fmt: skip
    yield GaugeMetricFamily("terra_state_version", "Changes recorded in the coflow journal "
                            "(with etcd: its revision)", value=health["state_version"])  # fmt: skip
    failing = controller.journal.failing is not None
    yield GaugeMetricFamily("terra_state_store_failing", "1 while the shared state (etcd) "
                            "does not take the journal's writes", value=float(failing))  # fmt: skip


def port_families(loads: dict):
    """Per-link families from the switches' WAN port counters ({(a, b): port_stats.LinkLoad}):
    terra_link_tx_bytes_total, terra_link_tx_dropped_total, terra_link_rx_dropped_total
    (counters) and terra_link_measured_bytes_per_second (bytes/s between the last two
    polls), labels a, b, dpid, port."""
    labels = ["a", "b", "dpid", "port"]
    tx = CounterMetricFamily(
        "terra_link_tx_bytes", "Bytes a WAN port sent (OpenFlow)", labels=labels
    )
    drops = CounterMetricFamily(
        "terra_link_tx_dropped", "Packets a WAN port dropped on send (OpenFlow)", labels=labels
    )
    rx_drops = CounterMetricFamily(
        "terra_link_rx_dropped", "Packets a WAN port dropped on receive (OpenFlow)", labels=labels
    )
    rate = GaugeMetricFamily(
        "terra_link_measured_bytes_per_second",
        "Bytes/s a WAN port sent between the last two port-statistics polls",
        labels=labels,
    )
    for (a, b), m in sorted(loads.items()):
        key = [a, b, str(m.dpid), str(m.port)]
        tx.add_metric(key, m.tx_bytes)
        drops.add_metric(key, m.tx_dropped)
        rx_drops.add_metric(key, m.rx_dropped)
        if m.tx_bytes_per_s is not None:
            rate.add_metric(key, m.tx_bytes_per_s)
    yield from (tx, drops, rx_drops, rate)
