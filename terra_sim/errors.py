"""The simulator's one error: an infeasible allocation from a policy, or lost bytes."""


class SimulationError(RuntimeError):
    """A policy returned an infeasible allocation, or the simulation lost bytes."""
