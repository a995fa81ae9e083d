"""Where a sweep's independent simulations run: here, in local processes, or on a Dask cluster.

A sweep (terra-sim --scheduler all, benchmarks/fb_table3.py, benchmarks/foi_ceiling.py)
is a set of independent, deterministic simulations ("cells"). `open_sweep` gives the
executor its cells are submitted to:

- ``dask`` set (``tcp://HOST:PORT``, a running ``dask scheduler``): a
  dask.distributed Client connected to that scheduler, and the Client's
  concurrent.futures interface (Client.get_executor: each submit is a Client.submit,
  its result comes back as a concurrent.futures.Future), so the callers' code is the
  same as with a process pool. Every worker must import the same code as the caller
  (the same installed `terra`; for the benchmarks a checkout on PYTHONPATH).
- else ``jobs`` > 1: a local concurrent.futures.ProcessPoolExecutor of `jobs` processes.
- else None: the caller runs its cells itself, one after the other.

The results do not depend on where the cells run (only measured times do).
"""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import Executor, ProcessPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from terra_core.cli_support import require

CONNECT_TIMEOUT_S = 30  # how long to wait for the Dask scheduler to answer


@dataclass
class Sweep:
    """An open sweep: `executor` (a concurrent.futures Executor, None for serial) and,
    with Dask, the `client` (dask.distributed.Client) behind it."""

    executor: Executor | None
    client: Any = None

    def share(self, value: Any) -> Any:
        """`value` as the argument to pass to many submits: on Dask, a future of it
        scattered to every worker once (Client.scatter, broadcast), so a large input (a
        whole trace, tens of MB) is not sent with every cell; otherwise `value` itself."""
        if self.client is None:
            return value
        return self.client.scatter(value, broadcast=True, hash=False)


@contextmanager
def open_sweep(
    jobs: int = 1, dask: str | None = None, connect_timeout_s: float = CONNECT_TIMEOUT_S
) -> Iterator[Sweep]:
    """Open the executor of a sweep (module docstring); cancel what is still pending and
    close it (and the Dask client) on exit.

    Args:
        jobs: local processes when `dask` is None (1: serial, no executor).
        dask: address of a Dask scheduler, e.g. ``tcp://10.0.0.5:8786``, or None.
        connect_timeout_s: how long to wait for that scheduler, seconds.

    Raises:
        ValueError: jobs < 1.
        MissingExtra: `dask` given without dask.distributed installed (the 'sim' extra).
        OSError: the Dask scheduler did not answer within `connect_timeout_s` seconds
            (distributed raises TimeoutError / OSError).
    """
    if jobs < 1:
        raise ValueError(f"--jobs must be >= 1, got {jobs}")
    if dask is not None:
        distributed = require("distributed", "sim")
        client = distributed.Client(dask, timeout=connect_timeout_s, set_as_default=False)
        with client:
            executor = client.get_executor(pure=False)
            try:
                yield Sweep(executor, client)
            finally:
                executor.shutdown(wait=False)  # cancels the cells not yet finished
    elif jobs > 1:
        pool = ProcessPoolExecutor(max_workers=jobs)
        try:
            yield Sweep(pool)
        finally:
            pool.shutdown(cancel_futures=True)
    else:
        yield Sweep(None)
