"""File listing messages of the control channel: "list", "check" and their "listing" replies.

A controller asks an agent what files a path names under its data root ("list") before a
coflow's file flows are scheduled (sizes of flows submitted without "bytes", directories and
globs expanded into one flow per file), and which destination files already hold given bytes
("check", a coflow submitted with sync). The agent answers with one or more "listing"
messages carrying the request's id; every one but the last has more = true. Rows are
[path relative to the data root, size in bytes, hex SHA-256 or None]. Headers stay under
frames.MAX_HEADER_BYTES: rows are paged by their encoded size (`pages`).

Shapes are checked by terra_wire/control.py (validate_control); these helpers only build them.
Source: docs/design.md section 6 ("Control channel").
"""

from __future__ import annotations

from terra_wire.control import MessageId, validate_control
from terra_wire.frames import Header

PAGE_BYTES = 40 * 1024  # rows' bytes per "listing" / "check" message (headers <= 64 KiB)
ROW_OVERHEAD = 80  # msgpack array, size int and a 64-char hex digest, at most

FileRow = tuple[str, int, "str | None"]  # [path, size bytes, sha256 hex or None]


def list_message(path: str, msg_id: MessageId, sha256: bool = False) -> Header:
    """Header of a "list" request (controller -> agent): the regular files at `path` (a file,
    a directory, or a glob, relative to the agent's data root), with their SHA-256 when
    `sha256`."""
    return validate_control({"t": "list", "id": msg_id, "path": path, "sha256": sha256})


def check_messages(rows: list[FileRow], msg_id: MessageId) -> list[Header]:
    """Headers of a "check" request (controller -> agent) split into pages (each carries
    `msg_id`; the agent answers each page with its own "listing")."""
    return [
        validate_control({"t": "check", "id": msg_id, "files": [list(r) for r in page]})
        for page in pages(rows)
    ]


def listing_messages(
    msg_id: MessageId, rows: list[FileRow], error: str | None = None
) -> list[Header]:
    """Headers of the "listing" replies to request `msg_id`: `rows` in pages, the last with
    more = false; with `error` one message carrying it (and no rows)."""
    if error is not None:
        line = " ".join(error.split())[:1024] or "error"
        return [{"t": "listing", "id": msg_id, "files": [], "error": line}]
    out = [
        {"t": "listing", "id": msg_id, "files": [list(r) for r in page], "more": True}
        for page in pages(rows)
    ] or [{"t": "listing", "id": msg_id, "files": [], "more": True}]
    out[-1]["more"] = False
    return out


def pages(rows: list[FileRow], limit: int = PAGE_BYTES) -> list[list[FileRow]]:
    """Split rows into lists whose paths plus ROW_OVERHEAD each stay under `limit` bytes."""
    out: list[list[FileRow]] = []
    page: list[FileRow] = []
    used = 0
    for row in rows:
        size = len(row[0].encode()) + ROW_OVERHEAD
        if page and used + size > limit:
            out.append(page)
            page, used = [], 0
        page.append(row)
        used += size
    if page:
        out.append(page)
    return out
