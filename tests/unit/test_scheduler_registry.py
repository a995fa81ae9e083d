"""The scheduler registry (terra_core/registry.py): one name -> factory table used by
terra-sim, the benchmarks and the controller."""

from __future__ import annotations

import argparse

import pytest

from terra_core import registry
from terra_core.policy import CoflowRatesPolicy, PairLevelsPolicy, Policy, StatefulPolicy
from terra_core.registry import SchedulerOptions, make_scheduler, scheduler_names
from terra_model import Coflow, Flow
from terra_sim import cli as sim_cli
from topologies import load_topology


def test_the_schedulers_are_registered_terra_first():
    assert scheduler_names() == [
        "terra", "per-flow", "multipath", "swan-mcf", "varys", "rapier", "coflowsim-fair",
    ]  # fmt: skip
    assert sim_cli.SCHEDULERS == scheduler_names()


@pytest.mark.parametrize("name", scheduler_names())
def test_each_factory_builds_a_policy_with_its_name_and_options(name):
    swan = load_topology("swan")
    policy = make_scheduler(name, swan, SchedulerOptions(k=2))
    assert isinstance(policy, Policy)
    assert policy.name == name and policy.topology is swan and policy.k == 2
    # The fast paths are declared as Protocols, not probed by attribute name.
    assert isinstance(policy, PairLevelsPolicy) == (name in ("per-flow", "multipath", "swan-mcf"))
    assert isinstance(policy, CoflowRatesPolicy) == (name in ("varys", "rapier", "coflowsim-fair"))
    assert isinstance(policy, StatefulPolicy) == (name == "terra")


def test_terra_gets_its_own_options_and_a_path_source():
    calls = []

    def source(topology, k):
        calls.append(k)
        return {("HK", "BA"): [("HK", "LA", "NY", "BA")]}

    options = SchedulerOptions(k=3, alpha=0.2, epsilon=0.5, delta=0.3, path_source=source)
    terra = make_scheduler("terra", load_topology("swan"), options)
    assert (terra.k, terra.alpha, terra.epsilon, terra.delta) == (3, 0.2, 0.5, 0.3)
    terra.add_coflow(Coflow("c", 0.0, [Flow("f", "HK", "BA", 1e6)]), 0.0)
    alloc = terra.allocate(0.0, {"c": {"f": 1e6}})
    assert [p for p, _ in alloc["c"]["f"]] == [("HK", "LA", "NY", "BA")]  # only the source's
    assert calls == [3]


def test_unknown_names_and_bad_options_are_clear_errors():
    with pytest.raises(ValueError, match="unknown scheduler 'fifo'; known: terra, per-flow"):
        make_scheduler("fifo", load_topology("swan"))
    with pytest.raises(ValueError, match="alpha"):
        make_scheduler("terra", load_topology("swan"), SchedulerOptions(alpha=1.5))
    with pytest.raises(ValueError, match="already registered"):
        registry.register("terra", lambda topology, options: None)


def test_command_line_options_map_onto_scheduler_options():
    parser = argparse.ArgumentParser()
    registry.add_scheduler_arguments(parser)
    args = parser.parse_args(["--scheduler", "varys", "--k", "2", "--delta", "0.5"])
    assert args.scheduler == "varys"
    assert registry.options_from_args(args) == SchedulerOptions(k=2, delta=0.5)
    with pytest.raises(SystemExit):
        parser.parse_args(["--scheduler", "fifo"])


def test_a_tool_taking_several_schedulers_checks_every_name():
    parser = argparse.ArgumentParser()
    registry.add_scheduler_arguments(parser, choices_extra=["all"], several=True)
    assert parser.parse_args(["--scheduler", "all"]).scheduler == "all"
    assert parser.parse_args(["--scheduler", "terra,varys"]).scheduler == "terra,varys"
    for bad in ("terra,fifo", "terra,terra", "all,terra", "terra,"):
        with pytest.raises(SystemExit):
            parser.parse_args(["--scheduler", bad])
    check = registry._scheduler_list(["terra", "varys", "all"])
    with pytest.raises(argparse.ArgumentTypeError, match="scheduler names only"):
        check("all,terra")
