"""Following a coflow from the command line (`terra-job`): progress with bytes, rate and ETA,
and the final summary with each flow's digest.

Progress goes to stdout: a tqdm bar when stdout is a terminal and tqdm is installed (it comes
with the 'sim' and 'bench' extras), else one line per second:

    coflow 7 running: 12.0 MB of 50.0 MB (24%), 20.1 MB/s, ETA 2 s
"""

from __future__ import annotations

import sys
import time
from typing import TextIO

from terra_controller.client import FINAL

POLL_S = 0.2  # status requests while following a coflow
LINE_S = 1.0  # seconds between two progress lines


def human_bytes(n: float) -> str:
    """`n` bytes in decimal units: "512 B", "12.0 MB", "3.10 GB"."""
    for unit, scale in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            value = n / scale
            return f"{value:.2f} {unit}" if value < 10 else f"{value:.1f} {unit}"
    return f"{int(n)} B"


def eta_text(remaining: float, rate: float) -> str:
    """The time left at `rate` bytes/s as "ETA 42 s" / "ETA 3 min 5 s" ("ETA ?" at rate 0)."""
    if rate <= 0:
        return "ETA ?"
    seconds = round(remaining / rate)
    if seconds < 60:
        return f"ETA {seconds} s"
    return f"ETA {seconds // 60} min {seconds % 60} s"


def coflow_label(status: dict) -> str:
    """The coflow's id with its name and tags when it has them: "coflow 7 (etl-daily)
    [nightly,eu]"."""
    name, tags = status.get("name"), status.get("tags")
    label = f"coflow {status['id']}" + (f" ({name})" if name else "")
    return label + (f" [{','.join(tags)}]" if tags else "")


def progress_line(status: dict) -> str:
    """One progress line of a status map (CoflowState.status with per-flow rates)."""
    total, done = status["bytes_total"], status["bytes_delivered"]
    rate = sum(f.get("rate_bytes_per_s") or 0.0 for f in status["flows"])
    share = 100.0 * done / total if total else 100.0
    return (
        f"{coflow_label(status)} {status['state']}: {human_bytes(done)} of "
        f"{human_bytes(total)} ({share:.0f}%), {human_bytes(rate)}/s, "
        f"{eta_text(total - done, rate)}"
    )


class LineProgress:
    """One progress line per LINE_S seconds on `stream` (logs, pipes, no tqdm)."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream
        self.last = -LINE_S

    def show(self, status: dict) -> None:
        """Print a line if LINE_S passed since the last one."""
        now = time.monotonic()
        if now - self.last >= LINE_S:
            self.last = now
            print(progress_line(status), file=self.stream, flush=True)

    def close(self) -> None:
        """Nothing to close."""


class BarProgress:
    """A tqdm bar of the coflow's bytes (unit B, scaled) with its state as postfix."""

    def __init__(self, tqdm_class, stream: TextIO) -> None:
        self.tqdm_class, self.stream = tqdm_class, stream
        self.bar = None

    def show(self, status: dict) -> None:
        """Move the bar to the delivered bytes."""
        if self.bar is None:
            self.bar = self.tqdm_class(
                total=status["bytes_total"], desc=coflow_label(status), unit="B",
                unit_scale=True, unit_divisor=1000, file=self.stream,
            )  # fmt: skip
        self.bar.total = status["bytes_total"]  # updates add flows
        self.bar.update(status["bytes_delivered"] - self.bar.n)
        self.bar.set_postfix_str(status["state"])

    def close(self) -> None:
        """Close the bar (its last state stays on the terminal)."""
        if self.bar is not None:
            self.bar.close()


def make_progress(stream: TextIO | None = None):
    """A tqdm BarProgress when `stream` (default stdout) is a terminal and tqdm is
    installed, else a LineProgress."""
    stream = stream or sys.stdout
    if getattr(stream, "isatty", lambda: False)():
        try:
            from tqdm import tqdm
        except ImportError:
            return LineProgress(stream)
        return BarProgress(tqdm, stream)
    return LineProgress(stream)


def follow(client, coflow_id: int, show_progress: bool, timeout: float | None) -> dict:
    """Poll a coflow's status every POLL_S s until it is final; show progress if asked.

    Returns:
        the final status map.

    Raises:
        TimeoutError: not final after `timeout` seconds (None: wait for ever).
        TerraError, ConnectionError: from the client.
    """
    reporter = make_progress() if show_progress else None
    end = None if timeout is None else time.monotonic() + timeout
    try:
        while True:
            status = client.check_status(coflow_id)
            if reporter is not None:
                reporter.show(status)
            if status["state"] in FINAL:
                return status
            if end is not None and time.monotonic() >= end:
                raise TimeoutError(f"coflow {coflow_id} not finished after {timeout} s")
            time.sleep(POLL_S)
    finally:
        if reporter is not None:
            reporter.close()


def final_report(status: dict, out: TextIO, err: TextIO) -> int:
    """Print the outcome of a final status: on success one summary line and one line per
    flow with its digest and sha256 (flow_line, stdout); otherwise the state and reason
    (stderr).

    Returns:
        the exit status: 0 for "done", 1 for failed, cancelled or rejected.
    """
    label = coflow_label(status)
    if status["state"] != "done":
        print(f"{label} {status['state']}: {status.get('reason') or 'no reason given'}",
              file=err)  # fmt: skip
        return 1
    cct = status.get("cct_s")
    cct_text = "" if cct is None else f" in {cct:.2f} s"
    print(f"{label} done: {human_bytes(status['bytes_total'])}{cct_text}", file=out)
    for f in status["flows"]:
        print(flow_line(f), file=out)
    return 0


def flow_line(f: dict) -> str:
    """One flow of a final status: id, endpoints, bytes, digest, and for a file flow its
    sha256 (and "skipped" when a sync found it already there)."""
    line = f"  {f['id']} {f['src']} -> {f['dst']} {f['bytes']} B digest {f['digest']}"
    if f.get("sha256"):
        line += f" sha256 {f['sha256']}"
    if f.get("skipped"):
        line += " skipped"
    return line
