"""The model every layer shares: coflows, flows, their states and ids.

Plain data with no I/O and no heavy imports (the coflow API client imports it).
Layers: docs/architecture.md.
"""

from terra_model.coflow import Coflow, Flow, WorkloadError, check_size

__all__ = ["Coflow", "Flow", "WorkloadError", "check_size"]
