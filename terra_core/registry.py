"""The scheduler registry: every policy by name, built the same way everywhere.

`terra-sim`, the benchmarks and the live controller all make their policy with
`make_scheduler(name, topology, options)`, so a new scheduler is one class (implementing
policy.Policy) and one `register` call here. The names are Terra and the baselines of
docs/design.md section 4.4 (the five of the paper and CoflowSim's FAIR).

Options every scheduler takes (SchedulerOptions): K and the path source; Terra's own
(α, ε, δ and the starvation guard) are ignored by the baselines.
"""

from __future__ import annotations

import argparse
import importlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING

from terra_core.policy import PathSource, Policy
from topologies import Topology

if TYPE_CHECKING:
    from terra_core.tenant_policy import TenantSpec


@dataclass(frozen=True)
class SchedulerOptions:
    """Options of a scheduler (docs/design.md sections 4.2-4.4).

    Attributes:
        k: paths per DC pair (K >= 1).
        alpha: Terra's starvation share α in [0, 1) (4.2 step 2).
        epsilon: Terra's deadline admission slack ε >= 0 (4.3).
        delta: Terra's relative capacity-change threshold δ >= 0 (4.3).
        guard, guard_factor, guard_floor_s: Terra's starvation guard and its patience
            max(guard_factor·Γ, guard_floor_s) seconds (4.2; terra_core/starvation.py).
        path_source: where the paths come from (policy.PathSource); None: the K shortest
            paths over the links that are up.
        tenants: None, or a tenant_policy.TenantSpec: "terra" is then Terra with tenants
            (tenant_policy.TenantPolicy, docs/design.md 4.5); the baselines ignore it.
    """

    k: int = 4
    alpha: float = 0.1
    epsilon: float = 0.1
    delta: float = 0.1
    guard: str = "aged"
    guard_factor: float = 2.0
    guard_floor_s: float = 1.0
    path_source: PathSource | None = None
    tenants: TenantSpec | None = None


Factory = Callable[[Topology, SchedulerOptions], Policy]
SCHEDULERS: dict[str, Factory] = {}


def register(name: str, factory: Factory) -> None:
    """Make `factory(topology, options) -> Policy` available as `name`.

    Raises:
        ValueError: `name` is already registered.
    """
    if name in SCHEDULERS:
        raise ValueError(f"scheduler {name!r} is already registered")
    SCHEDULERS[name] = factory


def scheduler_names() -> list[str]:
    """The registered names, in registration order (Terra first)."""
    return list(SCHEDULERS)


def make_scheduler(
    name: str, topology: Topology, options: SchedulerOptions | None = None
) -> Policy:
    """A fresh policy `name` on `topology` (shared, mutated by the caller).

    Raises:
        ValueError: unknown name (the message lists the known ones), or an option out of
            range for that scheduler.
    """
    factory = SCHEDULERS.get(name)
    if factory is None:
        raise ValueError(f"unknown scheduler {name!r}; known: {', '.join(SCHEDULERS)}")
    return factory(topology, options or SchedulerOptions())


def _terra(topology: Topology, o: SchedulerOptions) -> Policy:
    from terra_core.terra_policy import TerraPolicy  # imported on use: HiGHS, numpy

    if o.tenants is not None:
        from terra_core.tenant_policy import TenantPolicy

        return TenantPolicy(
            topology, o.tenants, k=o.k, alpha=o.alpha, epsilon=o.epsilon, delta=o.delta,
            guard=o.guard, guard_factor=o.guard_factor, guard_floor_s=o.guard_floor_s,
            path_source=o.path_source,
        )  # fmt: skip
    return TerraPolicy(
        topology, k=o.k, alpha=o.alpha, epsilon=o.epsilon, delta=o.delta,
        guard=o.guard, guard_factor=o.guard_factor, guard_floor_s=o.guard_floor_s,
        path_source=o.path_source,
    )  # fmt: skip


def _baseline(module: str, class_name: str) -> Factory:
    def factory(topology: Topology, o: SchedulerOptions) -> Policy:
        cls = getattr(importlib.import_module(module), class_name)  # on use: HiGHS, numpy
        policy: Policy = cls(topology, k=o.k, path_source=o.path_source)
        return policy

    return factory


register("terra", _terra)
for _name, _module, _class in [
    ("per-flow", "terra_core.per_flow", "PerFlowPolicy"),
    ("multipath", "terra_core.multipath", "MultipathPolicy"),
    ("swan-mcf", "terra_core.swan_mcf", "SwanMcfPolicy"),
    ("varys", "terra_core.varys", "VarysPolicy"),
    ("rapier", "terra_core.rapier", "RapierPolicy"),
    ("coflowsim-fair", "terra_core.coflowsim_fair", "CoflowSimFairPolicy"),
]:
    register(_name, _baseline(_module, _class))


def add_scheduler_arguments(
    parser: argparse.ArgumentParser, choices_extra: Sequence[str] = (), several: bool = False
) -> None:
    """Add the options every tool that runs a scheduler shares: --scheduler (one of the
    registry's names, plus `choices_extra`; with `several`, also a comma-separated list
    of the registry's names, kept as the string given), --k, --alpha, --guard,
    --guard-factor, --guard-floor, --epsilon, --delta."""
    d = SchedulerOptions()
    choices = [*SCHEDULERS, *choices_extra]
    if several:
        parser.add_argument(
            "--scheduler", type=_scheduler_list(choices), default="terra",
            metavar="{" + ",".join(choices) + "}[,NAME...]",
            help="scheduling policy, or a comma-separated list of them (default: %(default)s)",
        )  # fmt: skip
    else:
        parser.add_argument(
            "--scheduler", choices=choices, default="terra",
            help="scheduling policy (default: %(default)s)",
        )  # fmt: skip
    parser.add_argument(
        "--k", type=int, default=d.k, help="paths per DC pair (default: %(default)s)"
    )
    parser.add_argument(
        "--alpha", type=float, default=d.alpha,
        help="Terra: share of every link reserved for preempted coflows (default: %(default)s)",
    )  # fmt: skip
    parser.add_argument(
        "--guard", choices=["fixed", "aged", "aged-fair"], default=d.guard,
        help="Terra: starvation guard (fixed: the paper's reserve in every round) "
        "(default: %(default)s)",
    )  # fmt: skip
    parser.add_argument(
        "--guard-factor", type=float, default=d.guard_factor, metavar="F",
        help="Terra, aged guards: a coflow starves max(F x Γ, floor) s after it arrives "
        "(default: %(default)s)",
    )  # fmt: skip
    parser.add_argument(
        "--guard-floor", dest="guard_floor_s", type=float, default=d.guard_floor_s, metavar="S",
        help="Terra, aged guards: smallest patience in seconds (default: %(default)s)",
    )  # fmt: skip
    parser.add_argument(
        "--epsilon", type=float, default=d.epsilon,
        help="Terra: deadline admission slack (default: %(default)s)",
    )  # fmt: skip
    parser.add_argument(
        "--delta", type=float, default=d.delta,
        help="Terra: relative capacity change that triggers a new round (default: %(default)s)",
    )  # fmt: skip


def _scheduler_list(choices: Sequence[str]) -> Callable[[str], str]:
    """An argparse type: one of `choices`, or a comma-separated list of registry names
    without repeats (returned as given).

    Raises (from the returned function):
        argparse.ArgumentTypeError: an unknown or repeated name.
    """

    def check(text: str) -> str:
        if text in choices:
            return text
        names = text.split(",")
        if set(names) & set(choices) - set(SCHEDULERS):
            raise argparse.ArgumentTypeError(f"{text!r}: a list takes scheduler names only")
        for name in names:
            if name not in SCHEDULERS:
                raise argparse.ArgumentTypeError(
                    f"unknown scheduler {name!r}; known: {', '.join(choices)}"
                )
        if len(set(names)) < len(names):
            raise argparse.ArgumentTypeError(f"a scheduler is named twice in {text!r}")
        return text

    return check


def options_from_args(
    args: argparse.Namespace,
    path_source: PathSource | None = None,
    tenants: TenantSpec | None = None,
) -> SchedulerOptions:
    """SchedulerOptions from the arguments of `add_scheduler_arguments` (missing ones keep
    their defaults), with `path_source` and `tenants` (a tenant_policy.TenantSpec)."""
    names = {f.name for f in fields(SchedulerOptions)} - {"path_source", "tenants"}
    given = {n: getattr(args, n) for n in names if getattr(args, n, None) is not None}
    return SchedulerOptions(**given, path_source=path_source, tenants=tenants)
