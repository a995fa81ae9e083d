"""File flows as users name them: sizes left out, directories and globs, sync.

A submitted flow with a "src_path" may leave out "bytes": the sending agent reports the
file's size. A "src_path" naming a directory ("logs/", or "logs" when bytes is left out) or
a glob ("logs/2026-11-*/") expands into one flow per regular file below it, all of the one
coflow; each file keeps its path relative to the glob's fixed part (`tree_base`) under the
flow's "dst_path" (the tree is recreated there), and gets the flow id "<id>/<that path>"
(or "<id>/#<n>" when that would be longer than the registry's MAX_ID_CHARS). Empty files
are left out of an expansion (a flow carries at least one byte).

`expand` is pure: it takes the agents' listings (terra_agent/file_listing.py, asked by
terra_controller/file_requests.py) and returns the request's flows with sizes and
expansions filled in, or raises RegistryError with one line naming the flow at fault.
Destinations are checked here for collisions: two flows writing one file, or one flow's file
being a directory another flow writes into.
"""

from __future__ import annotations

import glob
import posixpath

from terra_controller.coflow_state import RegistryError
from terra_controller.request_checks import MAX_ID_CHARS, check_path

Listing = list[tuple[str, int, "str | None"]]  # [(path, size bytes, sha256 hex or None)]


def is_tree(src_path: str) -> bool:
    """True when `src_path` names a directory ("/" at its end) or a glob ("*", "?", "[")."""
    return src_path.endswith("/") or glob.has_magic(src_path)


def needs_listing(item: object, sync: bool = False) -> bool:
    """True when flow request `item` must be listed at its sender before it is parsed: it has
    a src_path and no bytes, or a directory / glob src_path, or (sync) a dst_path too."""
    if not isinstance(item, dict) or not isinstance(item.get("src_path"), str):
        return False
    path = item["src_path"]
    if item.get("bytes") is None or is_tree(path):
        return True
    return sync and isinstance(item.get("dst_path"), str)


def listing_key(item: dict) -> tuple[str, str]:
    """(sending agent, src_path) of a flow request to list."""
    return (str(item.get("src")), item["src_path"])


def tree_base(src_path: str) -> str:
    """The part of a directory or glob path the listed files' relative paths start from: the
    leading components without glob characters ("logs/2026-11-*/" -> "logs"; "logs/" ->
    "logs"; "*.log" -> ".")."""
    parts = []
    for part in posixpath.normpath(src_path).split("/"):
        if glob.has_magic(part):
            break
        parts.append(part)
    return "/".join(parts) or "."


def expand(flows: list, listings: dict[tuple[str, str], Listing]) -> list:
    """The request's flows with file sizes filled in and directories / globs expanded.

    Args:
        flows: the submitted flow maps (as parse_flows takes them).
        listings: {listing_key(item): the sender's rows} for every item needing a listing.

    Returns:
        new flow maps (items without a listing are passed through unchanged); the expanded
        ones carry "sha256" (the sender's, when the listing had it) for sync's check, which
        `strip_sha256` removes before parsing.

    Raises:
        RegistryError("bad_request"): bytes given for a directory or glob, a directory with no
            non-empty file, an empty file; "path_busy": colliding destinations.
    """
    out = []
    for i, item in enumerate(flows):
        key = listing_key(item) if isinstance(item, dict) and "src_path" in item else None
        rows = listings.get(key) if key is not None else None
        if rows is None:
            out.append(item)
            continue
        out += _expand_one(item, rows, f"flows[{i}]")
    check_destinations(out)
    return out


def _expand_one(item: dict, rows: Listing, where: str) -> list[dict]:
    src = item["src_path"]
    single = posixpath.normpath(src)
    if not is_tree(src) and len(rows) == 1 and rows[0][0] == single:
        path, size, digest = rows[0]
        if size == 0:
            raise RegistryError("bad_size", f"{where}: {src!r} is empty at the sender")
        flow = dict(item, bytes=item["bytes"] if item.get("bytes") is not None else size)
        return [_with_sha(flow, digest)]
    if item.get("bytes") is not None:
        raise RegistryError(
            "bad_request", f"{where}: leave out bytes for a directory or glob ({src!r})"
        )
    base, dst, fid = tree_base(src), item.get("dst_path"), str(item.get("id"))
    out = []
    for n, (path, size, digest) in enumerate(rows):
        if size == 0:
            continue
        rel = posixpath.relpath(path, base)
        if rel.startswith("../") or rel == "..":
            raise RegistryError(
                "bad_request", f"{where}: the sender listed {path!r} outside {src!r}"
            )
        flow_id = f"{fid}/{rel}" if len(fid) + 1 + len(rel) <= MAX_ID_CHARS else f"{fid}/#{n}"
        flow = dict(item, id=flow_id, src_path=path, bytes=size)
        if isinstance(dst, str):
            flow["dst_path"] = check_path(posixpath.join(dst, rel), f"{where}.dst_path")
        out.append(_with_sha(flow, digest))
    if not out:
        raise RegistryError("bad_request", f"{where}: no non-empty file at {src!r} on the sender")
    return out


def _with_sha(flow: dict, digest: str | None) -> dict:
    if digest is not None:
        flow["sha256"] = digest
    return flow


def strip_sha256(flows: list) -> tuple[list, dict[str, str]]:
    """(the flows without their "sha256" keys, {flow id: sender's sha256})."""
    shas: dict[str, str] = {}
    out = []
    for item in flows:
        if isinstance(item, dict) and "sha256" in item:
            item = dict(item)
            shas[str(item.get("id"))] = item.pop("sha256")
        out.append(item)
    return out, shas


def check_destinations(flows: list) -> None:
    """Refuse flows writing one file twice at one agent, or a file where another flow needs
    a directory (out/a and out/a/b).

    Raises:
        RegistryError("path_busy"): names both flows and the path.
    """
    writers: dict[tuple[str, str], str] = {}
    for item in flows:
        if not isinstance(item, dict) or not isinstance(item.get("dst_path"), str):
            continue
        key = (str(item.get("dst")), posixpath.normpath(item["dst_path"]))
        other = writers.get(key)
        if other is not None:
            raise RegistryError(
                "path_busy",
                f"flows {other!r} and {item.get('id')!r} both write {key[1]!r} at agent {key[0]}",
            )
        writers[key] = str(item.get("id"))
    for (agent, path), fid in writers.items():
        parent = posixpath.dirname(path)
        while parent not in ("", "/", "."):
            other = writers.get((agent, parent))
            if other is not None:
                raise RegistryError(
                    "path_busy",
                    f"flow {other!r} writes the file {parent!r} at agent {agent} where flow "
                    f"{fid!r} needs a directory",
                )
            parent = posixpath.dirname(parent)
