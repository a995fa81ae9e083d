"""Checks of what a coflow request carries, and the request limits: ids, coflow ids and
their string keys, labels, file paths, ages and deadlines (docs/design.md section 6).

Each check returns the value in the controller's type or raises `RegistryError` with a
one-line message naming the field; nothing is changed before every check has passed.
"""

from __future__ import annotations

import math

from terra_controller.coflow_state import RegistryError
from terra_model.states import MAX_COFLOW_ID
from terra_wire.api_session import label_error

MAX_FLOW_BYTES = 1 << 50  # 1 PiB: far above any real flow, below float rounding trouble
MAX_FLOWS_PER_REQUEST = 100_000
MAX_OPEN_FLOWS = 1_000_000  # flows of unfinished coflows per job client
MAX_ID_CHARS = 256
MAX_PATH_CHARS = 1024  # src_path / dst_path (relative to the agent's --data-root)


def named_agents(flows: object) -> set[str]:
    """The agent ids a submit's `flows` ([{"src", "dst", ...}]) name, as far as they are
    strings in maps of a list of at most MAX_FLOWS_PER_REQUEST items; anything else names
    none (parse_flows refuses it later)."""
    if not isinstance(flows, list) or len(flows) > MAX_FLOWS_PER_REQUEST:
        return set()
    return {
        item[key]
        for item in flows
        if isinstance(item, dict)
        for key in ("src", "dst")
        if isinstance(item.get(key), str)
    }


def check_id(value: object, where: str) -> str:
    """Return an id (non-empty str, or int) as a string.

    Raises:
        RegistryError("bad_request"): any other type, empty, or longer than MAX_ID_CHARS.
    """
    if isinstance(value, bool) or not isinstance(value, str | int):
        raise RegistryError("bad_request", f"{where}: id must be a string or integer")
    text = str(value)
    if not text or len(text) > MAX_ID_CHARS:
        raise RegistryError("bad_request", f"{where}: id must have 1..{MAX_ID_CHARS} characters")
    return text


def check_labels(name: object, tags: object) -> tuple[str | None, tuple[str, ...]]:
    """A submit's "name" and "tags" (terra_wire.api_session.label_error: a name of 1..128
    printable characters, at most 16 distinct tags of 1..64), as (name or None, tags).

    Raises:
        RegistryError("bad_request"): which bound is broken.
    """
    error = label_error(name, tags)
    if error is not None:
        raise RegistryError("bad_request", error)
    return (name if isinstance(name, str) else None), tuple(str(t) for t in tags or ())


def check_path(value: object, where: str) -> str | None:
    """Return a flow's src_path / dst_path (None when absent) after checking its shape.

    A path names a file relative to an agent's data root (terra-agent --data-root), which the
    agent resolves and keeps inside the root; here only its shape is checked.

    Raises:
        RegistryError("bad_request"): not a string, empty, longer than MAX_PATH_CHARS
            characters, a NUL byte, absolute (leading "/"), or a ".." component.
    """
    if value is None:
        return None
    if not isinstance(value, str) or not 0 < len(value) <= MAX_PATH_CHARS:
        raise RegistryError(
            "bad_request", f"{where}: must be a string of 1..{MAX_PATH_CHARS} chars"
        )
    if "\0" in value:
        raise RegistryError("bad_request", f"{where}: must not contain a NUL byte")
    if value.startswith("/"):
        raise RegistryError(
            "bad_request", f"{where}: must be relative to the agent's data root, got {value!r}"
        )
    if ".." in value.split("/"):
        raise RegistryError("bad_request", f"{where}: must not have a '..' component")
    return value


def check_coflow_id(value: object, top: int = MAX_COFLOW_ID) -> int:
    """Return a coflow id: an integer (not a bool) in 0..top (MAX_CLIENT_ID for ids a
    client asks for, so that ids never wrap).

    Raises:
        RegistryError("bad_request"): anything else.
    """
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= top:
        raise RegistryError(
            "bad_request", f"coflow id must be an integer in 0..{top}, got {value!r:.40}"
        )
    return value


def check_age(value: object) -> float:
    """Return a resubmitted coflow's age: seconds since its first submission (>= 0, finite).

    Raises:
        RegistryError("bad_request"): not a finite number >= 0.
    """
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise RegistryError("bad_request", f"age_s must be seconds (a number), got {value!r}")
    if not (_finite(value) and value >= 0):
        raise RegistryError("bad_request", f"age_s must be finite and >= 0, got {value!r:.40}")
    return float(value)


def _finite(value: int | float) -> bool:
    """True for a finite number that fits a float (a huge int does not)."""
    try:
        return math.isfinite(float(value))
    except OverflowError:
        return False


def check_deadline(value: object) -> float | None:
    """Return a deadline in seconds (> 0, finite) or None.

    Raises:
        RegistryError("bad_request"): not a positive finite number.
    """
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise RegistryError("bad_request", f"deadline must be seconds (a number), got {value!r}")
    if not (value > 0 and _finite(value)):
        raise RegistryError(
            "bad_request", f"deadline must be positive and finite, got {value!r:.40}"
        )
    return float(value)
