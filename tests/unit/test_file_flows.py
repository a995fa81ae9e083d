"""Path expansion and validation of file flows, without agents: the controller's expansion of
listings (terra_controller/file_flows.py), the agent's listing of its data root
(terra_agent/file_listing.py) with an attacker's paths, and the messages' shapes."""

from __future__ import annotations

import hashlib
import os

import pytest

from terra_agent.file_listing import answer_files, check_files, list_files
from terra_agent.sources import PART_SUFFIX, SourceError
from terra_controller.coflow_state import RegistryError
from terra_controller.file_flows import (
    check_destinations,
    expand,
    is_tree,
    needs_listing,
    strip_sha256,
    tree_base,
)
from terra_wire.control import ProtocolError, validate_control
from terra_wire.file_messages import check_messages, list_message, listing_messages, pages


def flow(**kw) -> dict:
    return {"id": "x", "src": "a", "dst": "b", **kw}


def test_which_flows_are_listed():
    assert needs_listing(flow(src_path="f.bin"))  # no bytes
    assert not needs_listing(flow(src_path="f.bin", bytes=5))
    assert needs_listing(flow(src_path="logs/", bytes=5))
    assert needs_listing(flow(src_path="l/*.log", bytes=5))
    assert needs_listing(flow(src_path="f.bin", bytes=5, dst_path="g"), sync=True)
    assert not needs_listing(flow(bytes=5))
    assert is_tree("a/") and is_tree("a/[0-9]") and not is_tree("a/b")


@pytest.mark.parametrize(
    ("pattern", "base"),
    [("logs/2026-11-*/", "logs"), ("logs/", "logs"), ("*.log", "."), ("a/b/c?", "a/b")],
)
def test_tree_base_is_the_globs_fixed_part(pattern, base):
    assert tree_base(pattern) == base


def test_a_file_gets_its_size_and_a_directory_its_tree():
    single = flow(src_path="f.bin", dst_path="g.bin")
    tree = {"id": "t", "src": "a", "dst": "b", "src_path": "logs/2026-*/", "dst_path": "out"}
    listings = {
        ("a", "f.bin"): [("f.bin", 7, None)],
        ("a", "logs/2026-*/"): [
            ("logs/2026-01/a.log", 3, "ab" * 32),
            ("logs/2026-01/empty", 0, None),
            ("logs/2026-02/deep/b.log", 4, None),
        ],
    }
    out = expand([single, tree, flow(id="m", bytes=9)], listings)
    assert out[0] == dict(single, bytes=7)
    assert out[1] == {"id": "t/2026-01/a.log", "src": "a", "dst": "b", "bytes": 3,
                      "src_path": "logs/2026-01/a.log", "dst_path": "out/2026-01/a.log",
                      "sha256": "ab" * 32}  # fmt: skip
    assert out[2]["dst_path"] == "out/2026-02/deep/b.log" and out[2]["id"] == "t/2026-02/deep/b.log"
    assert out[3] == flow(id="m", bytes=9)
    assert len(out) == 4  # the empty file is left out
    stripped, shas = strip_sha256(out)
    assert shas == {"t/2026-01/a.log": "ab" * 32} and "sha256" not in stripped[1]


def test_expansion_refusals_are_one_line_naming_the_flow():
    with pytest.raises(RegistryError, match=r"flows\[0\]: 'e.bin' is empty") as info:
        expand([flow(src_path="e.bin")], {("a", "e.bin"): [("e.bin", 0, None)]})
    assert info.value.code == "bad_size"
    with pytest.raises(RegistryError, match="leave out bytes"):
        expand([flow(src_path="d/", bytes=4)], {("a", "d/"): [("d/x", 4, None)]})
    with pytest.raises(RegistryError, match="no non-empty file"):
        expand([flow(src_path="d/")], {("a", "d/"): [("d/x", 0, None)]})
    with pytest.raises(RegistryError, match="outside"):  # a lying sender
        expand([flow(src_path="d/")], {("a", "d/"): [("e/x", 1, None)]})


def test_long_relative_paths_get_numbered_ids():
    rel = "d/" + "x" * 300
    (out,) = expand([flow(src_path="d/")], {("a", "d/"): [(rel, 1, None)]})
    assert out["id"] == "x/#0" and out["src_path"] == rel


def test_colliding_destinations_are_refused():
    one = flow(id="p", src_path="a", bytes=1, dst_path="out/f")
    with pytest.raises(RegistryError, match="flows 'p' and 'q' both write 'out/f' at agent b"):
        check_destinations([one, flow(id="q", src_path="b", bytes=1, dst_path="out/./f")])
    with pytest.raises(RegistryError, match="writes the file 'out/f' at agent b where flow 'q'"):
        check_destinations([one, flow(id="q", src_path="b", bytes=1, dst_path="out/f/g")])
    check_destinations([one, flow(id="q", dst="c", src_path="b", bytes=1, dst_path="out/f")])


@pytest.fixture
def root(tmp_path):
    root = tmp_path / "root"
    (root / "logs" / "2026-11-01").mkdir(parents=True)
    (root / "logs" / "2026-11-02" / "sub").mkdir(parents=True)
    (root / "logs" / "2026-12-01").mkdir(parents=True)
    (root / "logs" / "2026-11-01" / "a.log").write_bytes(b"aaa")
    (root / "logs" / "2026-11-02" / "sub" / "b.log").write_bytes(b"bbbb")
    (root / "logs" / "2026-11-02" / f"c.log{PART_SUFFIX}").write_bytes(b"partial")
    (root / "logs" / "2026-12-01" / "c.log").write_bytes(b"cc")
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "secret").write_bytes(b"secret")
    return root


def test_listing_a_glob_a_directory_and_a_file(root):
    r = str(root)
    assert list_files(r, "logs/2026-11-*/") == [
        ("logs/2026-11-01/a.log", 3, None),
        ("logs/2026-11-02/sub/b.log", 4, None),
    ]
    assert [p for p, _, _ in list_files(r, "logs")] == [
        "logs/2026-11-01/a.log", "logs/2026-11-02/sub/b.log", "logs/2026-12-01/c.log"
    ]  # fmt: skip
    ((path, size, sha),) = list_files(r, "./logs/2026-12-01/c.log", sha256=True)
    assert (path, size, sha) == ("logs/2026-12-01/c.log", 2, hashlib.sha256(b"cc").hexdigest())


@pytest.mark.parametrize("path", ["../outside/secret", "/etc/passwd", "logs/../../outside"])
def test_paths_out_of_the_root_are_refused(root, path):
    with pytest.raises(SourceError, match="refused"):
        list_files(str(root), path)


def test_symlinks_out_of_the_root_are_refused_wherever_they_are(root, tmp_path):
    r = str(root)
    outside = tmp_path / "outside"
    (root / "logs" / "2026-11-01" / "s").symlink_to(outside / "secret")
    with pytest.raises(SourceError, match="'logs/2026-11-01/s' refused: it resolves outside"):
        list_files(r, "logs/")
    os.unlink(root / "logs" / "2026-11-01" / "s")
    (root / "logs" / "2026-11-02" / "dir").symlink_to(outside)
    with pytest.raises(SourceError, match="outside the data root"):
        list_files(r, "logs/2026-11-*/")
    with pytest.raises(SourceError, match="outside the data root"):
        list_files(r, "logs/2026-11-02/dir/secret")
    os.unlink(root / "logs" / "2026-11-02" / "dir")
    (root / "logs" / "inside").symlink_to(root / "logs" / "2026-12-01")  # not descended
    assert "logs/inside/c.log" not in [p for p, _, _ in list_files(r, "logs/")]
    assert list_files(r, "logs/inside/c.log") == [("logs/inside/c.log", 2, None)]


def test_missing_unreadable_and_rootless_are_one_line_errors(root):
    r = str(root)
    with pytest.raises(SourceError, match="'nope' at the sender: No such file"):
        list_files(r, "nope")
    with pytest.raises(SourceError, match="no file matches"):
        list_files(r, "nope*/")
    with pytest.raises(SourceError, match="serves no files"):
        list_files(None, "logs")
    locked = root / "logs" / "2026-12-01" / "c.log"
    locked.chmod(0)
    try:
        if os.access(locked, os.R_OK):
            pytest.skip("running as root: every file is readable")
        with pytest.raises(SourceError, match="c.log' at the sender: Permission denied"):
            list_files(r, "logs/")
    finally:
        locked.chmod(0o644)


def test_check_files_matches_size_and_sha256(root):
    good = ("logs/2026-12-01/c.log", 2, hashlib.sha256(b"cc").hexdigest())
    rows = [good, ("logs/2026-12-01/c.log", 2, "0" * 64), ("nope", 2, good[2]),
            ("../outside/secret", 6, hashlib.sha256(b"secret").hexdigest())]  # fmt: skip
    assert check_files(str(root), rows) == [good]


def test_messages_validate_and_page(root):
    validate_control(list_message("logs/", 1, sha256=True))
    rows = [(f"p/{i:04d}-" + "x" * 900, i, None) for i in range(200)]
    paged = check_messages(rows, "files-1")
    assert len(paged) > 1 and sum(len(m["files"]) for m in paged) == 200
    replies = listing_messages("files-1", rows)
    assert [m["more"] for m in replies] == [True] * (len(replies) - 1) + [False]
    assert all(validate_control(m) for m in replies)
    assert len(pages(rows)) == len(replies)
    (error,) = listing_messages(3, [], "bad\nthing")
    assert error["error"] == "bad thing" and validate_control(error)
    with pytest.raises(ProtocolError):
        validate_control({"t": "listing", "files": []})  # no id
    (answer,) = answer_files({"t": "list", "id": 5, "path": "logs/2026-12-01/"}, str(root))
    assert answer == {"t": "listing", "id": 5, "files": [["logs/2026-12-01/c.log", 2, None]],
                      "more": False}  # fmt: skip
    (answer,) = answer_files({"t": "list", "id": 5, "path": "../x"}, str(root))
    assert "refused" in answer["error"]
