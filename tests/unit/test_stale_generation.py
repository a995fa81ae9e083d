"""An agent follows only the newest leader: a controller registering it with an older etcd
generation than a leader it registered with lately (a deposed leader still running) is left
(terra_agent/control_session.py), and "registered" carries the generation on the wire."""

from __future__ import annotations

import pytest
import trio
import trio.testing

from terra_agent.control_session import (
    STALE_GENERATION_S,
    StaleController,
    _newest_generation,
)
from terra_wire.control import ProtocolError, validate_control


class Agent:
    """What _newest_generation keeps on the agent."""


def test_an_older_generation_is_refused_until_the_window_ends():
    async def main():
        agent = Agent()
        _newest_generation(agent, 7, "c1")
        _newest_generation(agent, 9, "c2")  # a newer leader: followed
        with pytest.raises(StaleController, match="generation 7, older than 9"):
            _newest_generation(agent, 7, "c1")
        _newest_generation(agent, 9, "c2")  # the same leader again
        await trio.sleep(STALE_GENERATION_S + 0.1)  # long after: a new etcd cluster
        _newest_generation(agent, 3, "c3")
        assert agent.generation_seen[0] == 3

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))


def test_a_lone_controller_leads_generation_0_and_the_field_is_checked():
    assert validate_control({"t": "registered", "agent": "a1"})["t"] == "registered"
    validate_control({"t": "registered", "agent": "a1", "generation": 12})
    with pytest.raises(ProtocolError):
        validate_control({"t": "registered", "agent": "a1", "generation": -1})
