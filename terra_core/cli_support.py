"""What the four command-line tools share: --version, --log-level, one log format, progress
bars and optional dependencies (docs/operations.md, "Logs" and "Installing").

terra-controller, terra-agent, terra-sim and terra-testbed all call `add_common_args` on
their parser and `setup_logging` once the arguments are parsed, so every tool logs the same
way: ``%(asctime)s %(name)s %(levelname)s %(message)s`` on stderr.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from importlib.metadata import PackageNotFoundError, version
from types import ModuleType, TracebackType
from typing import Protocol, TextIO

LOG_FORMAT = "%(asctime)s %(name)s %(levelname)s %(message)s"
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
DIST_NAME = "terra"


class MissingExtra(ImportError):
    """An optional dependency is not installed; the message names the extra that brings it."""


class HelpFormatter(argparse.HelpFormatter):
    """Help that ends every option's help with its
    default ("(default: 6700)"), except for flags and options without a default (None)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if (
            "%(default)" not in text
            and action.default not in (None, False, argparse.SUPPRESS)
            and action.option_strings
        ):
            text += " (default: %(default)s)"
        return text


def package_version() -> str:
    """The installed version of the `terra` distribution (its metadata), or "unknown" when
    the code runs from a tree that was never installed."""
    try:
        return version(DIST_NAME)
    except PackageNotFoundError:
        return "unknown"


def _level(text: str) -> str:
    return text.upper()


def add_common_args(parser: argparse.ArgumentParser, log_level: bool = True) -> None:
    """Add ``--version`` and (unless `log_level` is False) ``--log-level`` to `parser`.

    --log-level takes one of LOG_LEVELS, in any case ("debug" is DEBUG); anything else is an
    argparse usage error (exit status 2, "invalid choice"). The default is INFO.
    """
    parser.add_argument("--version", action="version", version=f"%(prog)s {package_version()}")
    if log_level:
        parser.add_argument(
            "--log-level",
            type=_level,
            choices=LOG_LEVELS,
            default="INFO",
            help="log messages at this level and above",
        )


class _StderrHandler(logging.StreamHandler[TextIO]):
    """A StreamHandler that writes to whatever `sys.stderr` is when a record is emitted (so a
    replaced or restored sys.stderr, as in tests, never leaves it writing to a closed file)."""

    def __init__(self) -> None:
        super().__init__(sys.stderr)

    @property
    def stream(self) -> TextIO:
        """The current sys.stderr."""
        return sys.stderr

    @stream.setter
    def stream(self, value: TextIO) -> None:
        pass  # always sys.stderr


def setup_logging(level: str = "INFO", stream: TextIO | None = None) -> None:
    """Configure the root logger for a tool: LOG_FORMAT on `stream` (default: sys.stderr as
    it is at each record), replacing any handlers the root logger had.

    Args:
        level: one of LOG_LEVELS.

    Raises:
        ValueError: `level` is not a logging level name.
    """
    if level not in LOG_LEVELS:
        raise ValueError(f"unknown log level {level!r}; one of {', '.join(LOG_LEVELS)}")
    handler = logging.StreamHandler(stream) if stream is not None else _StderrHandler()
    handler.setFormatter(logging.Formatter(LOG_FORMAT))
    logging.basicConfig(level=getattr(logging, level), handlers=[handler], force=True)


def report_crashes() -> None:
    """Make a fatal signal of the process (SIGSEGV, SIGFPE, SIGABRT, SIGBUS, SIGILL: a crash
    in compiled code) write every thread's Python traceback to stderr before it dies, so a
    daemon's log says where it died instead of ending mid-line (Python's faulthandler).
    It writes to the process's own stderr descriptor (sys.__stderr__), whatever replaced
    sys.stderr since; nothing without one."""
    import faulthandler

    if sys.__stderr__ is not None:
        faulthandler.enable(file=sys.__stderr__, all_threads=True)


def require(module: str, extra: str) -> ModuleType:
    """Import the optional dependency `module`, which the `extra` extra installs.

    Returns:
        the module.

    Raises:
        MissingExtra: it is not installed; the message says how to install it.
    """
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise MissingExtra(
            f"{module.split('.')[0]} is not installed; install the {extra!r} extra: "
            f"pip install 'terra[{extra}]' (or uv sync --all-extras)"
        ) from exc


class ProgressBar(Protocol):
    """What `progress` returns: a context manager whose `update(n)` reports n more items done."""

    def __enter__(self) -> ProgressBar: ...

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool | None: ...

    def update(self, n: int = 1) -> object: ...

    def close(self) -> None: ...


class _NoBar:
    """What `progress` returns when no bar is drawn: the tqdm calls the code makes, as no-ops."""

    def __enter__(self) -> _NoBar:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def update(self, n: int = 1) -> None:
        """Ignore progress."""

    def close(self) -> None:
        """Nothing to close."""


def progress(
    total: int | None, desc: str, unit: str = "it", stream: TextIO | None = None
) -> ProgressBar:
    """A tqdm progress bar on `stream` (stderr by default) when it is a terminal.

    No bar (a no-op object with the same update / set_postfix_str / close / context-manager
    calls) when the stream is not a terminal (logs, CI, pipes) or tqdm is not installed
    (it comes with the 'sim' extra).
    """
    stream = stream or sys.stderr
    if not getattr(stream, "isatty", lambda: False)():
        return _NoBar()
    try:
        from tqdm import tqdm
    except ImportError:
        return _NoBar()
    bar: ProgressBar = tqdm(total=total, desc=desc, unit=unit, file=stream)
    return bar
