"""File flows copy whole files to one owner each, and make the directories they need.

Agents run in-process over real TCP on loopback (benchmarks/harness.py), driven by the
in-test controller peer speaking the real protocol; agents a (HK) and b (LA) share the data
root tmp_path/"data".

- a flow whose `bytes` differ from its source file's size fails at the sender (cause
  "source", the reason names both sizes); no copy, truncated or not, is reported done;
- a sink in a directory that does not exist yet gets the directory (inside the data root);
- two live flows to one resolved sink path on one agent: the second fails (cause "sink"),
  the first's part file is never truncated and it completes with its own bytes.
"""

import os
import stat

import trio
from test_data_root import (
    MB,
    file_digest,
    leftovers,
    loopback,
    run_flows,
    still_serves,
    wait_complete,
    wait_error,
)

from terra_agent.sources import PART_SUFFIX, SourceError, open_sink

TIMEOUT = 60


def failures(h, flow_id):
    """The "failed" reports about flow `flow_id`."""
    return [f for f in h.controller.failed if f["flow"] == flow_id]


async def test_a_source_longer_than_the_flow_fails_instead_of_a_truncated_copy(tmp_path):
    async with loopback(tmp_path) as h:
        root = h.data_root
        (root / "big.bin").write_bytes(os.urandom(5000))
        (root / "small.bin").write_bytes(os.urandom(10))
        longer = h.flow("c1", "longer", "a", "b", 1000, source="file:big.bin", sink="file:x.bin")
        shorter = h.flow(
            "c1", "shorter", "a", "b", 1000, source="file:small.bin", sink="file:y.bin"
        )
        await run_flows(h, [longer, shorter])
        message = await wait_error(h, "a", "longer")
        assert "has 5000 bytes" in message and "1000" in message, message
        assert "has 10 bytes" in await wait_error(h, "a", "shorter")
        assert {f["cause"] for f in failures(h, "longer") + failures(h, "shorter")} == {"source"}
        await still_serves(h)
        assert longer.key not in h.controller.completed
        assert shorter.key not in h.controller.completed
    assert not (root / "x.bin").exists() and not (root / "y.bin").exists()


async def test_a_sink_in_a_missing_directory_gets_its_directories(tmp_path):
    size = 2 * MB + 5
    async with loopback(tmp_path) as h:
        root = h.data_root
        src = root / "src.bin"
        src.write_bytes(os.urandom(size))
        f = h.flow("c1", "f1", "a", "b", size, source="file:src.bin", sink="file:new/deep/d.bin")
        await run_flows(h, [f])
        await wait_complete(h, [f])
        assert not h.controller.failed
    dst = root / "new" / "deep" / "d.bin"
    assert dst.read_bytes() == src.read_bytes()
    assert h.controller.completed[f.key] == file_digest(src, f.digest_key)
    umask = os.umask(0)
    os.umask(umask)
    for d in (root / "new", root / "new" / "deep"):
        assert stat.S_IMODE(d.stat().st_mode) == 0o755 & ~umask
    assert leftovers(root) == []


def test_missing_directories_are_never_made_through_a_symlink(tmp_path):
    root = tmp_path / "root"
    root.mkdir()
    outside = tmp_path / "outside"
    outside.mkdir()
    (root / "link").symlink_to(outside)
    try:
        open_sink("file:link/sub/f.bin", 10, resume=False, data_root=str(root))
    except SourceError as exc:
        assert "outside the data root" in str(exc)
    else:
        raise AssertionError("a sink through a symlink out of the data root was opened")
    assert os.listdir(outside) == []
    (root / "file").write_bytes(b"x")
    try:
        open_sink("file:file/sub/f.bin", 10, resume=False, data_root=str(root))
    except SourceError as exc:
        assert "cannot create the directory 'file'" in str(exc), exc
    else:
        raise AssertionError("a regular file was used as a directory")


async def test_a_second_flow_to_a_sink_path_in_use_is_refused(tmp_path):
    size = 4 * MB
    async with loopback(tmp_path) as h:
        root = h.data_root
        (root / "out").mkdir()
        first_src, second_src = root / "first.bin", root / "second.bin"
        first_src.write_bytes(os.urandom(size))
        second_src.write_bytes(os.urandom(size))
        first = h.flow(
            "c1", "first", "a", "b", size, source="file:first.bin", sink="file:out/d.bin"
        )
        second = h.flow(
            "c2", "second", "a", "b", size, source="file:second.bin", sink="file:./out/../out/d.bin"
        )
        await run_flows(h, [first], rate=1 * MB)  # 2 tunnels: ~2 s
        with trio.fail_after(TIMEOUT):
            await h.controller.wait_until(lambda: h.controller.acked.get(first.key, 0) >= MB)
        part = root / "out" / f"d.bin{PART_SUFFIX}"
        before = part.stat().st_size
        await run_flows(h, [second])
        message = await wait_error(h, "b", "second")
        assert "c1/first" in message and "still writing" in message, message
        assert [f["cause"] for f in failures(h, "second")] == ["sink"]
        for agent in ("a", "b"):  # as the controller does when a flow fails
            await h.controller.send(agent, {"t": "drop", "coflow": "c2", "flows": ["second"]})
        assert part.stat().st_size >= before  # not truncated
        await wait_complete(h, [first])
        assert second.key not in h.controller.completed
        assert h.controller.completed[first.key] == file_digest(first_src, first.digest_key)
        # once the first flow is done, the path is free for another flow
        third = h.flow(
            "c3", "third", "a", "b", size, source="file:second.bin", sink="file:out/d.bin"
        )
        await run_flows(h, [third])
        await wait_complete(h, [third])
    assert (root / "out" / "d.bin").read_bytes() == second_src.read_bytes()
    assert leftovers(root) == []
