"""A guaranteed reservation on the SWAN testbed (`terra-testbed swan --tenants N
--reserve TENANT:SRC:DST:MBPS`) and the rate it delivered with real bytes.

The reservation (docs/design.md 4.5: the tenant's guaranteed rate from DC SRC to DC DST)
goes into the tenants file the testbed writes for the controller, without a window: it is
in force in every Terra run of the testbed (the honest runs and, with --greedy-tenant, the
runs where the greedy tenant floods with its split coflows). The workload gains one coflow,
the probe (below).

A guarantee is a rate, and a rate needs a backlog long enough to show it: the agents report
a flow's bytes every 0.5 s and the job master polls every swan.POLL_S (0.25 s), so a
transfer of a second or two (the quick run's 2 MiB at 8 Mbit/s) is measured to within a
third of its rate at best. The testbed therefore adds to the workload, for every run
(Terra and per-flow TCP alike, and the simulated twin), one coflow of the reserved tenant
arriving with the first coflow: the probe (trace id PROBE_ID), one flow from the first host
of SRC to the first host of DST carrying PROBE_S seconds of the guarantee (whole 64 KiB
leaves). The per-tenant figures leave the probe out (testbed_tenants.per_tenant); the FoIs
count it, as every scheduler runs it.

During each Terra run the job master polls, with the coflows (every swan.POLL_S), the
reserved tenant's coflows that have flows on the pair (the probe and the workload's;
check_status: each flow's bytes delivered as the agents report them, and whether it is
done) and keeps samples
(t seconds after the first arrival, bytes delivered on the pair, flows there not done).
A guarantee is a rate while its tenant has bytes on the pair (a tenant with nothing to
send there takes nothing), so the delivered rate is measured over that time, from the first
sample that shows bytes delivered (the start-up before it, submission to first byte, is a
latency, reported apart as "first_byte_s"):

    rate = Σ_i (d_{i+1} − d_i) / Σ_i (t_{i+1} − t_i)   over the samples i with a flow open
                                                        and d_i > 0

in bytes/s. The poll's granularity counts against the rate (a FlowGroup done just after a
sample is seen done one poll later), so the figure is a lower bound on what the pair got.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from itertools import pairwise

from mininet_scenarios.workload import TestbedCoflow
from terra_core.reservations import Reservation, ReservationError, admission
from topologies import Topology
from topologies.binding import Binding

TARGET_FRACTION = 0.9  # the reserved pair delivers at least this fraction of its guarantee
PROBE_ID = "reserve-probe"  # trace id of the probe coflow (module docstring)
PROBE_S = 8.0  # the probe carries this many seconds of the guarantee
LEAF_BYTES = 64 * 1024  # the probe's size is a whole number of these


@dataclass(frozen=True)
class Reserve:
    """The testbed's reservation: `tenant` is guaranteed `rate_bytes_per_s` bytes/s of
    payload from DC `src` to DC `dst` (given in Mbit/s on the command line)."""

    tenant: str
    src: str
    dst: str
    rate_bytes_per_s: float

    @property
    def pair(self) -> tuple[str, str]:
        """(src DC, dst DC)."""
        return (self.src, self.dst)

    def describe(self) -> str:
        """ "t0 HK->BA 4 Mbit/s" for the printout."""
        return f"{self.tenant} {self.src}->{self.dst} {self.rate_bytes_per_s * 8 / 1e6:g} Mbit/s"


def parse_reserve(text: str, tenants: list[str], topology: Topology, k: int) -> Reserve:
    """`TENANT:SRC:DST:MBPS` (e.g. "t0:HK:BA:4") as a Reserve, checked to be one of
    `tenants` and to fit `topology` (capacities in bytes/s) over its `k` tunnels with no
    failure and under every single link failure they route around (reservations.admission,
    as the controller checks it at start).

    Raises:
        ValueError: a malformed text, an unknown tenant or DC, a rate that is not a
            positive finite number of Mbit/s, or a guarantee that does not fit (one line).
    """
    parts = text.split(":")
    if len(parts) != 4:
        raise ValueError(f"--reserve {text!r}: give TENANT:SRC:DST:MBPS, e.g. t0:HK:BA:4")
    tenant, src, dst, mbps = parts
    if tenant not in tenants:
        raise ValueError(f"--reserve {text!r}: tenant {tenant!r} is not one of {tenants}")
    try:
        rate = float(mbps) * 1e6 / 8
    except ValueError:
        rate = math.nan
    if not 0 < rate < math.inf:
        raise ValueError(f"--reserve {text!r}: MBPS must be a finite number > 0, got {mbps!r}")
    reservation = Reservation(tenant, src, dst, rate)
    try:
        found = admission([reservation], topology, k)
    except ReservationError as exc:
        raise ValueError(f"--reserve {text!r}: {exc}") from None
    if not found.ok:
        raise ValueError(f"--reserve {text!r}: {found.reason}")
    return Reserve(tenant, src, dst, rate)


def probe_coflow(reserve: Reserve, binding: Binding) -> TestbedCoflow:
    """The probe coflow of `reserve` (module docstring): the reserved tenant's, arriving at
    0 s, one flow from the first host of its src DC to the first host of its dst DC in
    `binding` (the testbed's), of PROBE_S seconds of the guaranteed rate in whole 64 KiB
    leaves (at least one).

    Raises:
        KeyError, IndexError: a DC of the reservation not in `binding`, or with no host.
    """
    src, dst = binding.hosts(reserve.src)[0].name, binding.hosts(reserve.dst)[0].name
    leaves = max(1, int(reserve.rate_bytes_per_s * PROBE_S // LEAF_BYTES))
    flow = {"id": f"{src}>{dst}", "src": src, "dst": dst, "bytes": leaves * LEAF_BYTES}
    return TestbedCoflow(PROBE_ID, 0.0, (flow,), reserve.tenant)


def reservation_toml(reserve: Reserve | None) -> str:
    """The tenants-file table of the reservation (terra_controller/tenants_config.py), or ""."""
    if reserve is None:
        return ""
    return (
        f'[[tenants.{reserve.tenant}.reservations]]\nsrc = "{reserve.src}"\n'
        f'dst = "{reserve.dst}"\nrate_bytes_per_s = {reserve.rate_bytes_per_s!r}\n\n'
    )


class PairWatch:
    """Samples of what the reserved tenant's coflows delivered on the reserved pair during
    one Terra run (module docstring).

    Args:
        reserve: the reservation, or None (then nothing is watched).
        client_of: tenant -> its job client (TerraClient: check_status).

    Attributes:
        samples: [(t s after the first arrival, bytes delivered on the pair, flows there
            not done)], one per `poll` while a watched coflow has flows on the pair.
    """

    def __init__(self, reserve: Reserve | None, client_of) -> None:
        self.reserve = reserve
        self.client_of = client_of
        self.samples: list[tuple[float, int, int]] = []
        self._pending: list[int] = []  # submitted, not yet seen
        self._open: dict[int, tuple[int, int]] = {}  # coflow id -> (delivered, open flows)

    def submitted(self, coflow_id: int, tenant: str | None) -> None:
        """A coflow was submitted; watched when it is the reserved tenant's."""
        if self.reserve is not None and tenant == self.reserve.tenant:
            self._pending.append(coflow_id)

    def poll(self, t: float) -> None:
        """Read the watched coflows' flows on the pair; add a sample at `t` (seconds)."""
        if self.reserve is None:
            return
        client = self.client_of(self.reserve.tenant)
        for cid in [*self._pending, *(c for c, (_, n) in self._open.items() if n)]:
            flows = [f for f in client.check_status(cid)["flows"]
                     if (f["src_dc"], f["dst_dc"]) == self.reserve.pair]  # fmt: skip
            if flows:
                self._open[cid] = (sum(f["bytes_delivered"] for f in flows),
                                   sum(not f["done"] for f in flows))  # fmt: skip
        self._pending.clear()
        if self._open:
            delivered = sum(d for d, _ in self._open.values())
            self.samples.append((t, delivered, sum(n for _, n in self._open.values())))


def delivered_rate(samples: list) -> dict:
    """{"rate_bytes_per_s" (None without an open interval after the first byte),
    "backlogged_s" (the time it is measured over), "bytes" (delivered while a flow was
    open), "first_byte_s" (from the first sample to the first showing bytes: start-up, an
    upper bound)} of PairWatch samples: the rate from the first byte on over the time a
    flow on the pair was open (module docstring)."""
    busy, moved, counted, started = 0.0, 0, 0, None
    for (t0, d0, open0), (t1, d1, _) in pairwise(samples):
        if open0:
            moved += d1 - d0
            if d0 > 0:
                busy += t1 - t0
                counted += d1 - d0
        if started is None and d1 > 0:
            started = t1 - samples[0][0]
    return {"rate_bytes_per_s": counted / busy if busy > 0 else None, "backlogged_s": busy,
            "bytes": moved, "first_byte_s": started}  # fmt: skip


def reservation_summary(reserve: Reserve, honest: list, greedy: list) -> dict:
    """The reservation's figures for the JSON: {"tenant", "src", "dst",
    "guarantee_bytes_per_s", "honest" / "greedy": [delivered_rate of each run's samples
    with "fraction" = rate / guarantee and the "samples"], "min_fraction" (over every run;
    None without a measured run), "target_fraction", "target_met"}. `honest` / `greedy`:
    RunResults."""
    out: dict = {"tenant": reserve.tenant, "src": reserve.src, "dst": reserve.dst,
                 "guarantee_bytes_per_s": reserve.rate_bytes_per_s}  # fmt: skip
    fractions = []
    for key, runs in (("honest", honest), ("greedy", greedy)):
        out[key] = []
        for run in runs:
            got = delivered_rate(run.reserved_pair)
            got["samples"] = [list(x) for x in run.reserved_pair]
            rate = got["rate_bytes_per_s"]
            got["fraction"] = None if rate is None else rate / reserve.rate_bytes_per_s
            out[key].append(got)
            fractions.append(got["fraction"])
    measured = [f for f in fractions if f is not None]
    out["min_fraction"] = min(measured) if measured and len(measured) == len(fractions) else None
    out["target_fraction"] = TARGET_FRACTION
    out["target_met"] = out["min_fraction"] is not None and out["min_fraction"] >= TARGET_FRACTION
    return out


def reservation_lines(summary: dict) -> str:
    """The printout's lines of reservation_summary: per run, the rate the reserved pair
    delivered against its guarantee, and whether the target was met."""
    g = summary["guarantee_bytes_per_s"]
    head = f"reservation {summary['tenant']} {summary['src']}->{summary['dst']} {g * 8e-6:g} Mbit/s"
    lines = []
    for key in ("honest", "greedy"):
        for i, run in enumerate(summary[key]):
            rate = run["rate_bytes_per_s"]
            got = "no bytes on the pair" if rate is None else (
                f"{rate * 8e-6:.2f} Mbit/s = {run['fraction']:.1%} of the guarantee over "
                f"{run['backlogged_s']:.2f} s ({run['bytes']} bytes)")  # fmt: skip
            lines.append(f"{head}, {key} run {i + 1}: {got}")
    met = "met" if summary["target_met"] else "MISSED"
    lines.append(f"{head}: at least {summary['target_fraction']:.0%} of it in every run: {met}")
    return "\n".join(lines)
