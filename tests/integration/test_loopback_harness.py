"""The loopback harness (benchmarks/harness.py) starts subprocess agents as asked.

- own_sessions=True: each `terra-agent` subprocess leads a session of its own (setsid), so
  Linux's scheduler autogroups give it its own share of the CPU; the default keeps the test
  process's session;
- agent_args reach the agent's command line, and an agent started with them registers.
"""

import os

import psutil
import trio

from benchmarks.harness import LoopbackHarness

TIMEOUT = 60
MAX_AHEAD = str(64 << 20)


async def start_pair(tmp_path, own_sessions: bool) -> dict[str, int]:
    """Start subprocess agents "a" and "b"; {agent id: pid} once both registered."""
    async with trio.open_nursery() as nursery:
        h = LoopbackHarness(
            nursery,
            tmp_path,
            own_sessions=own_sessions,
            agent_args=["--max-ahead", MAX_AHEAD],
        )
        await h.start()
        with trio.fail_after(TIMEOUT):
            await h.add_agent("a", "HK", subprocess=True)
            await h.add_agent("b", "LA", subprocess=True)
        pids = {a: h.agents[a].process.pid for a in ("a", "b")}
        for pid in pids.values():
            assert psutil.Process(pid).cmdline()[-2:] == ["--max-ahead", MAX_AHEAD]
        sessions = {a: os.getsid(pid) for a, pid in pids.items()}
        nursery.cancel_scope.cancel()
    return sessions | {f"{a}_pid": pid for a, pid in pids.items()}


async def test_agents_in_sessions_of_their_own(tmp_path):
    got = await start_pair(tmp_path, own_sessions=True)
    assert got["a"] == got["a_pid"] and got["b"] == got["b_pid"]
    assert os.getsid(0) not in (got["a"], got["b"])


async def test_agents_in_the_harness_session_by_default(tmp_path):
    got = await start_pair(tmp_path, own_sessions=False)
    assert got["a"] == got["b"] == os.getsid(0)
