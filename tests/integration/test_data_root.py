"""Flow files stay under the agent's data root.

Agents run in-process over real TCP on loopback (benchmarks/harness.py), driven by the in-test
controller peer speaking the real protocol; the data root is tmp_path/"data", so tmp_path itself
is "outside". Refusals must reach the controller as "error" reports naming the flow, leave the
agent running (a synthetic flow sent afterwards completes) and touch no file.
"""

import os
from contextlib import asynccontextmanager

import pytest
import trio

from benchmarks.harness import LoopbackHarness
from terra_agent.cli import build_parser, main
from terra_agent.receiver import InFlow
from terra_agent.sources import (
    DIGEST_SUFFIX,
    PART_SUFFIX,
    SourceError,
    open_sink,
    open_source,
    resolve_data_path,
    synthetic_digest,
)
from terra_controller.coflow_registry import CoflowRegistry
from terra_controller.coflow_state import RegistryError
from terra_security.integrity import flow_digest
from terra_wire.control import FlowSpec, GroupRates, flows_message

MB = 1_000_000
UNLIMITED = 1e12
TIMEOUT = 60


@asynccontextmanager
async def loopback(tmp_path, data_root="data"):
    """Controller peer + agents a (DC HK) and b (DC LA), 2 tunnels a -> b, sharing data_root."""
    async with trio.open_nursery() as nursery:
        h = LoopbackHarness(nursery, tmp_path, data_root=data_root)
        await h.start()
        await h.add_agent("a", "HK")
        await h.add_agent("b", "LA")
        h.tunnels = (await h.install_tunnels([("a", "b", 2)]))["a"]
        yield h
        nursery.cancel_scope.cancel()


async def run_flows(h, flows, rate=UNLIMITED):
    """Announce flows (receiver first) and give every tunnel of a -> b `rate` bytes/s."""
    await h.controller.add_flows(flows)
    paths = {t.tunnel: rate for t in h.tunnels}
    await h.controller.set_rates("a", [GroupRates(flows[0].coflow, "LA", paths)])


async def wait_complete(h, flows):
    with trio.fail_after(TIMEOUT):
        await h.controller.wait_until(lambda: h.controller.all_complete([f.key for f in flows]))


async def wait_error(h, agent, flow_id):
    """The message of the first "error" `agent` reported about flow `flow_id`."""

    def found():
        return [
            e["message"]
            for e in h.controller.errors
            if e["agent"] == agent and e.get("flow") == flow_id
        ]

    with trio.fail_after(TIMEOUT):
        await h.controller.wait_until(found)
    return found()[0]


async def still_serves(h, name="alive"):
    """The agents and their control sessions are fine: a synthetic flow completes."""
    f = h.flow("c9", name, "a", "b", 1 * MB)
    await run_flows(h, [f])
    await wait_complete(h, [f])
    assert h.controller.completed[f.key] == synthetic_digest("c9", name, 1 * MB, f.digest_key)
    assert h.controller.registrations == {"a": 1, "b": 1}


def file_digest(path, key):
    """The flow digest of a file's bytes under flow key `key`."""
    return flow_digest(key, path.read_bytes())


def leftovers(root):
    """Working files of FileSink left anywhere under root."""
    return sorted(
        os.path.relpath(os.path.join(d, n), root)
        for d, _, names in os.walk(root)
        for n in names
        if PART_SUFFIX in n
    )


# ------------------------------------------------------------------ whole agents


async def test_relative_file_flow_is_delivered_and_digest_matches(tmp_path):
    size = 3 * MB + 17
    async with loopback(tmp_path) as h:
        root = h.data_root
        (root / "in").mkdir()
        (root / "out").mkdir()
        src = root / "in" / "src.bin"
        src.write_bytes(os.urandom(size))
        (root / "alias.bin").symlink_to("in/src.bin")  # a symlink that stays inside: fine
        f = h.flow("c1", "f1", "a", "b", size, source="file:in/src.bin", sink="file:out/dst.bin")
        g = h.flow("c1", "f2", "a", "b", size, source="file:alias.bin", sink="file:./out/../g.bin")
        await run_flows(h, [f, g])
        await wait_complete(h, [f, g])
    assert (root / "out" / "dst.bin").read_bytes() == src.read_bytes()
    assert (root / "g.bin").read_bytes() == src.read_bytes()
    assert h.controller.completed[f.key] == file_digest(src, f.digest_key)
    assert h.controller.completed[g.key] == file_digest(src, g.digest_key)
    assert leftovers(root) == []  # part file renamed into place, saved digest removed
    assert not h.controller.errors


async def test_absolute_paths_are_refused(tmp_path):
    """/etc/shadow (or any absolute path, even one inside the data root) is refused by the
    sender; an absolute sink by the receiver; nothing is read or written."""
    async with loopback(tmp_path) as h:
        inside = h.data_root / "in.bin"
        inside.write_bytes(b"x" * 1000)
        shadow = h.flow("c1", "shadow", "a", "b", 27, source="file:/etc/shadow")
        absolute = h.flow("c1", "abs", "a", "b", 1000, source=f"file:{inside}")
        await run_flows(h, [shadow, absolute])
        for flow_id in ("shadow", "abs"):
            message = await wait_error(h, "a", flow_id)
            assert "refused: absolute" in message, message
        target = tmp_path / "copy"
        sink = h.flow("c1", "abs-sink", "a", "b", 1000, sink=f"file:{target}")
        await h.controller.send("b", flows_message([sink]))
        assert "refused: absolute" in await wait_error(h, "b", "abs-sink")
        a, b = h.agents["a"].agent, h.agents["b"].agent
        assert not {shadow.key, absolute.key} & set(a.out_flows)
        assert sink.key in b.refused and sink.key not in b.in_flows
        await still_serves(h)
    assert not target.exists() and not (tmp_path / f"copy{PART_SUFFIX}").exists()
    assert "/etc/shadow" not in str(h.controller.completed)


async def test_dotdot_escape_is_refused(tmp_path):
    async with loopback(tmp_path) as h:
        (tmp_path / "outside.bin").write_bytes(b"s" * 1000)
        read = h.flow("c1", "read", "a", "b", 1000, source="file:../outside.bin")
        deep = h.flow("c1", "deep", "a", "b", 1000, source="file:x/../../../outside.bin")
        write = h.flow("c1", "write", "a", "b", 1000, sink="file:../escaped.bin")
        await run_flows(h, [read, deep])
        await h.controller.send("b", flows_message([write]))
        for agent, flow_id in (("a", "read"), ("a", "deep"), ("b", "write")):
            message = await wait_error(h, agent, flow_id)
            assert "resolves outside the data root" in message, message
            assert str(tmp_path) not in message  # where it resolved to is not revealed
        await still_serves(h)
    assert not (tmp_path / "escaped.bin").exists()
    assert not (tmp_path / f"escaped.bin{PART_SUFFIX}").exists()


async def test_symlink_escape_is_refused(tmp_path):
    """Symlinks inside the data root that lead out of it: a file (read), a directory (write
    into), and a symlink at the destination itself (write through)."""
    async with loopback(tmp_path) as h:
        root = h.data_root
        secret = tmp_path / "secret.bin"
        secret.write_bytes(b"s" * 1000)
        outdir = tmp_path / "outdir"
        outdir.mkdir()
        victim = tmp_path / "victim.bin"
        victim.write_bytes(b"precious")
        (root / "link.bin").symlink_to(secret)
        (root / "dirlink").symlink_to(outdir)
        (root / "dst.bin").symlink_to(victim)
        read = h.flow("c1", "read", "a", "b", 1000, source="file:link.bin")
        via_dir = h.flow("c1", "via-dir", "a", "b", 1000, sink="file:dirlink/x.bin")
        through = h.flow("c1", "through", "a", "b", 1000, sink="file:dst.bin")
        await run_flows(h, [read])
        await h.controller.send("b", flows_message([via_dir, through]))
        for agent, flow_id in (("a", "read"), ("b", "via-dir"), ("b", "through")):
            message = await wait_error(h, agent, flow_id)
            assert "resolves outside the data root" in message, message
        await still_serves(h)
    assert os.listdir(outdir) == []
    assert victim.read_bytes() == b"precious"
    assert leftovers(tmp_path) == []


async def test_agent_without_data_root_refuses_file_flows(tmp_path):
    async with loopback(tmp_path, data_root=None) as h:
        assert h.agents["a"].agent.config.data_root is None
        (tmp_path / "src.bin").write_bytes(b"x" * 1000)
        read = h.flow("c1", "read", "a", "b", 1000, source="file:src.bin")
        write = h.flow("c1", "write", "a", "b", 1000, sink="file:dst.bin")
        await run_flows(h, [read])
        await h.controller.send("b", flows_message([write]))
        for agent, flow_id in (("a", "read"), ("b", "write")):
            message = await wait_error(h, agent, flow_id)
            assert "serves no files" in message and "--data-root" in message, message
        assert write.key in h.agents["b"].agent.refused
        await still_serves(h)  # synthetic flows to digest sinks still run
    assert not (tmp_path / "dst.bin").exists() and leftovers(tmp_path) == []


async def test_missing_or_short_source_leaves_existing_destination_unchanged(tmp_path):
    async with loopback(tmp_path) as h:
        root = h.data_root
        precious = os.urandom(5000)
        (root / "dst.bin").write_bytes(precious)
        (root / "dst2.bin").write_bytes(precious)
        (root / "short.bin").write_bytes(b"x" * 10)
        missing = h.flow("c1", "missing", "a", "b", 1000, source="file:nope", sink="file:dst.bin")
        short = h.flow("c1", "short", "a", "b", 1000, source="file:short.bin", sink="file:dst2.bin")
        await run_flows(h, [missing, short])
        assert "cannot open source file 'nope'" in await wait_error(h, "a", "missing")
        assert "has 10 bytes, flow needs 1000" in await wait_error(h, "a", "short")
        await still_serves(h)
        assert missing.key in h.agents["b"].agent.in_flows  # the receiver waits; nothing came
    assert (root / "dst.bin").read_bytes() == precious
    assert (root / "dst2.bin").read_bytes() == precious


async def test_destination_is_replaced_only_when_the_flow_completes(tmp_path):
    """While a file flow is half done (and across a receiver restart, which resumes from the
    part file) the old destination is intact; at completion it is replaced in one rename."""
    size = 6 * MB
    async with loopback(tmp_path) as h:
        root = h.data_root
        src = root / "src.bin"
        src.write_bytes(os.urandom(size))
        dst = root / "dst.bin"
        dst.write_bytes(b"old contents")
        f = h.flow("c1", "f1", "a", "b", size, source="file:src.bin", sink="file:dst.bin")
        await run_flows(h, [f], rate=1 * MB)  # 2 tunnels: ~3 s
        with trio.fail_after(TIMEOUT):
            await h.controller.wait_until(lambda: h.controller.acked.get(f.key, 0) >= 2 * MB)
        assert dst.read_bytes() == b"old contents"
        assert (root / f"dst.bin{PART_SUFFIX}").stat().st_size >= 2 * MB
        await h.stop_agent("b")
        await h.start_agent("b")
        assert h.agents["b"].agent.in_flows[f.key].base >= 2 * MB  # resumed from the part file
        assert dst.read_bytes() == b"old contents"
        await wait_complete(h, [f])
    assert dst.read_bytes() == src.read_bytes()
    assert h.controller.completed[f.key] == file_digest(src, f.digest_key)
    assert leftovers(root) == []


# ------------------------------------------------------------------ sources, sinks, InFlow


def test_resolve_data_path_containment(tmp_path):
    root = tmp_path / "root"
    (root / "d").mkdir(parents=True)
    (root / "d" / "f").write_bytes(b"1")
    (tmp_path / "out").write_bytes(b"2")
    (root / "up").symlink_to(tmp_path)
    real_root = os.path.realpath(root)
    assert resolve_data_path(str(root), "d/f", "source") == os.path.join(real_root, "d", "f")
    assert resolve_data_path(str(root), "d/../new", "sink") == os.path.join(real_root, "new")
    refusals = {
        "../out": "outside",
        "d/../../out": "outside",
        "up/out": "outside",
        "up": "outside",
        "/etc/shadow": "absolute",
        str(root / "d" / "f"): "absolute",
        "": "empty",
        "d/f\0x": "NUL",
    }
    for path, why in refusals.items():
        with pytest.raises(SourceError, match=why):
            resolve_data_path(str(root), path, "source")
    with pytest.raises(SourceError, match="serves no files"):
        resolve_data_path(None, "d/f", "source")


def test_file_source_refuses_special_files_and_a_replaced_file(tmp_path):
    os.mkfifo(tmp_path / "fifo")  # opening it for the check must not block
    (tmp_path / "dir").mkdir()
    root = str(tmp_path)
    for name in ("fifo", "dir"):
        with pytest.raises(SourceError, match="not a regular file"):
            open_source(f"file:{name}", "k", 0, data_root=root)
    path = tmp_path / "s"
    path.write_bytes(b"0123456789")
    src = open_source("file:s", "k", 10, data_root=root)
    path.rename(tmp_path / "old")  # (kept, so its inode is not reused)
    path.write_bytes(b"abcdefghij")  # another file under the same name before the first read
    with pytest.raises(SourceError, match="was replaced"):
        src.read(0, 4)


def test_sink_refuses_reserved_names_and_directories(tmp_path):
    root = str(tmp_path)
    (tmp_path / "d").mkdir()
    for name in (f"x{PART_SUFFIX}", f"x{PART_SUFFIX}{DIGEST_SUFFIX}"):
        with pytest.raises(SourceError, match="reserved"):
            open_sink(f"file:{name}", 10, resume=False, data_root=root)
    with pytest.raises(SourceError, match="is a directory"):
        open_sink("file:d", 10, resume=False, data_root=root)
    (tmp_path / "f").write_bytes(b"")
    with pytest.raises(SourceError, match="cannot create the directory 'f'"):
        open_sink("file:f/x", 10, resume=False, data_root=root)
    open_sink("file:nodir/x", 10, resume=False, data_root=root).close()  # directory made
    assert (tmp_path / "nodir").is_dir()


def test_inflow_digest_mismatch_leaves_destination_and_keeps_part(tmp_path):
    dst = tmp_path / "dst"
    dst.write_bytes(b"keep me")
    spec = FlowSpec("c1", "f1", "a", "b", "LA", 10, sink="file:dst")
    flow = InFlow(spec, 100, str(tmp_path), data_root=str(tmp_path))
    flow.add(0, b"y" * 10, "00" * 64)
    assert not flow.check_digest() and "digest mismatch" in flow.failed
    assert dst.read_bytes() == b"keep me"
    assert (tmp_path / f"dst{PART_SUFFIX}").read_bytes() == b"y" * 10


def test_cli_data_root(tmp_path):
    args = ["--controller", "h:1", "--dc", "HK", "--id", "a", "--data-addr", "h:1", "--insecure"]
    assert build_parser().parse_args(args).data_root is None
    assert build_parser().parse_args([*args, "--data-root", "/srv"]).data_root == "/srv"
    assert main([*args, "--data-root", str(tmp_path / "nodir")]) == 2


# ------------------------------------------------------------------ controller validation


def registry():
    reg = CoflowRegistry(["A", "B"])
    reg.register_agent("a1", "A")
    reg.register_agent("b1", "B")
    return reg


@pytest.mark.parametrize(
    "path",
    [
        "/etc/shadow",
        "/tmp/copy",
        "../x",
        "a/../../x",
        "a/..",
        "..",
        "x\0y",
        "",
        "x" * 1025,
        7,
        b"bytes",
    ],
)
@pytest.mark.parametrize("key", ["src_path", "dst_path"])
def test_registry_rejects_bad_paths_and_changes_nothing(key, path):
    reg = registry()
    reg.submit(reg.parse_flows([{"id": "ok", "src": "a1", "dst": "b1", "bytes": 10}]), None, 0.0)
    before = (dict(reg.coflows), reg.next_id)
    bad = {"id": "f", "src": "a1", "dst": "b1", "bytes": 27, key: path}
    with pytest.raises(RegistryError) as info:
        reg.submit(reg.parse_flows([bad]), None, 1.0)
    assert info.value.code == "bad_request"
    assert (dict(reg.coflows), reg.next_id) == before


def test_registry_accepts_relative_paths():
    reg = registry()
    flows = reg.parse_flows(
        [
            {"id": "f", "src": "a1", "dst": "b1", "bytes": 27, "src_path": "in/x.bin"},
            {"id": "g", "src": "a1", "dst": "b1", "bytes": 27, "dst_path": "./a..b/" + "y" * 1000},
        ]
    )
    assert flows[0].src_path == "in/x.bin" and flows[0].dst_path is None
    assert flows[1].dst_path.startswith("./a..b/")
