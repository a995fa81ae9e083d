"""terra-job's progress text (terra_controller/job_follow.py): sizes, rates, ETA, the final
report and its exit status, and the line reporter used off a terminal."""

from __future__ import annotations

import io

import pytest

from terra_controller.job_follow import (
    BarProgress,
    LineProgress,
    eta_text,
    final_report,
    human_bytes,
    make_progress,
    progress_line,
)


def status(state="running", delivered=12_000_000, rate=20_100_000.0, **extra):
    return {"id": 7, "state": state, "reason": None, "bytes_total": 50_000_000,
            "bytes_delivered": delivered, "cct_s": None, "deadline_s": None,
            "flows": [{"id": "f1", "src": "hk1", "dst": "ba1", "bytes": 50_000_000,
                       "digest": None, "rate_bytes_per_s": rate}], **extra}  # fmt: skip


def test_sizes_and_eta():
    assert human_bytes(512) == "512 B"
    assert human_bytes(12_000_000) == "12.0 MB"
    assert human_bytes(3.1e9) == "3.10 GB"
    assert eta_text(38e6, 20e6) == "ETA 2 s"
    assert eta_text(200e6, 1e6) == "ETA 3 min 20 s"
    assert eta_text(1.0, 0.0) == "ETA ?"


def test_progress_line_has_bytes_rate_and_eta():
    line = progress_line(status())
    assert line == "coflow 7 running: 12.0 MB of 50.0 MB (24%), 20.1 MB/s, ETA 2 s"
    assert progress_line(status(name="etl")).startswith("coflow 7 (etl) running:")
    labelled = progress_line(status(name="etl", tags=["nightly", "eu"]))
    assert labelled.startswith("coflow 7 (etl) [nightly,eu] running:")


def test_off_a_terminal_one_line_per_second():
    out = io.StringIO()
    reporter = make_progress(out)
    assert isinstance(reporter, LineProgress)
    for _ in range(5):
        reporter.show(status())
    assert len(out.getvalue().splitlines()) == 1


def test_final_report_and_exit_status():
    out, err = io.StringIO(), io.StringIO()
    done = status("done", 50_000_000, cct_s=2.5)
    done["flows"][0]["digest"] = "ab" * 32
    assert final_report(done, out, err) == 0
    assert out.getvalue().splitlines() == [
        "coflow 7 done: 50.0 MB in 2.50 s",
        f"  f1 hk1 -> ba1 50000000 B digest {'ab' * 32}",
    ]
    failed = status("failed", reason="agent ba1 disconnected for 60 s")
    assert final_report(failed, out, err) == 1
    assert err.getvalue() == "coflow 7 failed: agent ba1 disconnected for 60 s\n"


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_on_a_terminal_a_tqdm_bar_of_the_bytes():
    pytest.importorskip("tqdm")  # the dev environment and the sim / bench extras have it
    out = _Terminal()
    reporter = make_progress(out)
    assert isinstance(reporter, BarProgress)
    for delivered, state in ((0, "running"), (30_000_000, "running"), (20_000_000, "running"),
                             (50_000_000, "done")):  # fmt: skip
        reporter.show(status(state, delivered, name="etl"))
    reporter.close()
    assert reporter.bar.n == 50_000_000  # a restarted flow's bytes went back, then forward
    assert "coflow 7 (etl): 100%" in out.getvalue() and "done" in out.getvalue()
