"""The product speaks only of the product: no numbered issue or session references.

Every text file of the shipped packages (pyproject's wheel list), tests, benchmarks,
deploy, scripts, .ci, docs/, README.md, CHANGELOG.md and pyproject.toml is read, and so
is every file and directory name under them. A word "issue" or "session" (any case,
optionally plural) directly followed by a number, with at most a space, "_", "-" or "#"
between, is project history and fails the test; "to issue a certificate" has no number
after it and passes. docs/results.md says what each figure is and when it was measured,
CHANGELOG.md what each capability is.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
HISTORY = re.compile(r"\b(issue|session)s?[ _#-]?#?[0-9]+", re.IGNORECASE)
TOP_FILES = ["README.md", "CHANGELOG.md", "pyproject.toml"]
TOP_DIRS = ["tests", "benchmarks", "deploy", "scripts", ".ci", "docs"]
SKIPPED_DIRS = {"__pycache__", ".venv", ".git", ".pytest_cache", ".ruff_cache", ".hypothesis"}


def shipped_packages() -> list[str]:
    """The package directories the wheel ships (pyproject's hatch wheel target)."""
    doc = tomllib.loads((ROOT / "pyproject.toml").read_text())
    return doc["tool"]["hatch"]["build"]["targets"]["wheel"]["packages"]


def scanned_roots() -> list[Path]:
    """Directories and files the test reads; each must exist (CHANGELOG.md included)."""
    return [ROOT / name for name in [*shipped_packages(), *TOP_DIRS, *TOP_FILES]]


def scanned_files() -> list[Path]:
    """Every file under the scanned roots, outside caches and virtual environments."""
    files = []
    for root in scanned_roots():
        paths = [root] if root.is_file() else sorted(root.rglob("*"))
        files += [p for p in paths if p.is_file() and not SKIPPED_DIRS & set(p.parts)]
    return files


def text_of(path: Path) -> str | None:
    """The file's text, or None for a binary file (a NUL byte in its first 8 KiB)."""
    data = path.read_bytes()
    if b"\0" in data[:8192]:
        return None
    return data.decode("utf-8", errors="replace")


def history_lines(text: str) -> list[tuple[int, str]]:
    """(line number, line) of every line with a numbered issue or session reference."""
    return [(n, line) for n, line in enumerate(text.splitlines(), 1) if HISTORY.search(line)]


@pytest.mark.parametrize(
    "text",
    [f"{word}{sep}{n}" for word in ("issue", "Session", "ISSUES", "sessions")
     for sep, n in ((" ", 13), ("", 11), (" #", 2), ("-", 9), ("_", 4), ("#", 10))],
)  # fmt: skip
def test_a_numbered_issue_or_session_is_found(text):
    assert history_lines(f"see {text} for why") == [(1, f"see {text} for why")]


@pytest.mark.parametrize(
    "text",
    [
        "terra-controller pki issue pki/ --role agent hk1",
        "issue a certificate to an agent, job client or operator",
        "certificates issued 2026-11-24",
        "the TLS session on data connections (AES-GCM)",
    ],
)
def test_words_without_a_number_after_them_pass(text):
    assert history_lines(text) == []


def test_every_scanned_root_exists():
    missing = [str(p.relative_to(ROOT)) for p in scanned_roots() if not p.exists()]
    assert not missing, f"scanned roots missing: {missing}"


def test_no_numbered_history_in_file_contents():
    files = scanned_files()
    assert len(files) > 100  # the packages, tests and docs were found
    hits = [
        f"{path.relative_to(ROOT)}:{n}: {line.strip()}"
        for path in files
        if (text := text_of(path)) is not None
        for n, line in history_lines(text)
    ]
    assert not hits, "say what it means instead:\n" + "\n".join(hits)


def test_no_numbered_history_in_file_or_directory_names():
    names = {p.relative_to(ROOT) for p in scanned_files()}
    names |= {parent for p in names for parent in p.parents}
    hits = sorted(str(p) for p in names if HISTORY.search(p.name))
    assert not hits, f"renamed to say what they hold: {hits}"
