"""CoflowRegistry: validation leaves state untouched; progress, completion and CCT bookkeeping."""

import copy

import pytest

from terra_controller.coflow_registry import CoflowRegistry
from terra_controller.coflow_state import RegistryError


def make_registry() -> CoflowRegistry:
    reg = CoflowRegistry(["A", "B", "C"])
    reg.register_agent("a1", "A", "127.0.0.1:9001")
    reg.register_agent("a2", "A", "127.0.0.1:9002")
    reg.register_agent("b1", "B", "127.0.0.1:9003")
    reg.register_agent("c1", "C", "127.0.0.1:9004")
    return reg


def flow(fid, src="a1", dst="b1", size=1000, **extra):
    return {"id": fid, "src": src, "dst": dst, "bytes": size, **extra}


def snapshot(reg):
    return copy.deepcopy((reg.agents, reg.coflows, reg.next_id))


def test_submit_maps_agents_to_dcs_and_assigns_ids_in_order():
    reg = make_registry()
    c0 = reg.submit(reg.parse_flows([flow("f1"), flow("f2", "a2", "c1", 500)]), None, 1.0)
    c1 = reg.submit(reg.parse_flows([flow("g", "c1", "a1")]), 5.0, 2.0)
    assert (c0.id, c1.id) == (0, 1)
    assert c0.flows["f2"].src_dc == "A" and c0.flows["f2"].dst_dc == "C"
    assert c0.bytes_total == 1500 and c0.bytes_delivered == 0
    assert c0.state == "queued" and c1.deadline_s == 5.0
    # Remaining in the policy's shape: str ids, WAN flows only.
    assert reg.remaining() == {"0": {"f1": 1000.0, "f2": 500.0}, "1": {"g": 1000.0}}


@pytest.mark.parametrize(
    ("flows", "code"),
    [
        ("not a list", "bad_request"),
        ([], "bad_request"),
        ([flow("f1"), flow("f1")], "duplicate_flow"),
        ([flow("f1", src="nobody")], "unknown_agent"),
        ([flow("f1", dst=7)], "unknown_agent"),
        ([flow("f1", size=0)], "bad_size"),
        ([flow("f1", size=-5)], "bad_size"),
        ([flow("f1", size=1.5)], "bad_size"),
        ([flow("f1", size=True)], "bad_size"),
        ([flow("f1", size=2**51)], "bad_size"),
        ([flow("", size=10)], "bad_request"),
        ([flow(None)], "bad_request"),
        ([["f1", "a1", "b1", 10]], "bad_request"),
        ([flow("f1", colour="red")], "bad_request"),
        ([flow("f1", src_path="")], "bad_request"),
        ([flow("f1", dst_path="x" * 4097)], "bad_request"),
    ],
)
def test_bad_flows_raise_and_change_nothing(flows, code):
    reg = make_registry()
    reg.submit(reg.parse_flows([flow("x")]), None, 0.0)
    before = snapshot(reg)
    with pytest.raises(RegistryError) as info:
        reg.submit(reg.parse_flows(flows), None, 1.0)
    assert info.value.code == code
    assert snapshot(reg) == before


@pytest.mark.parametrize("deadline", [0, -1, float("nan"), float("inf"), "soon", True])
def test_bad_deadline_changes_nothing(deadline):
    reg = make_registry()
    before = snapshot(reg)
    with pytest.raises(RegistryError):
        reg.submit(reg.parse_flows([flow("f")]), deadline, 0.0)
    assert snapshot(reg) == before


def test_unknown_coflow_and_flow():
    reg = make_registry()
    reg.submit(reg.parse_flows([flow("f")]), None, 0.0)
    for bad in (1, -1, "0", None, True):
        with pytest.raises(RegistryError) as info:
            reg.get(bad)
        assert info.value.code == "unknown_coflow"
    with pytest.raises(RegistryError) as info:
        reg.record_progress(0, "nope", 10)
    assert info.value.code == "unknown_flow"


def test_update_rejects_duplicates_against_existing_flows():
    reg = make_registry()
    c = reg.submit(reg.parse_flows([flow("f1")]), None, 0.0)
    with pytest.raises(RegistryError) as info:
        reg.parse_flows([flow("f2"), flow("f1")], existing=c.flows)
    assert info.value.code == "duplicate_flow"
    reg.add_flows(c, reg.parse_flows([flow("f2", size=300)], existing=c.flows))
    assert list(c.flows) == ["f1", "f2"] and c.bytes_total == 1300


def test_progress_never_goes_back_and_is_bounded():
    reg = make_registry()
    reg.submit(reg.parse_flows([flow("f", size=1000)]), None, 0.0)
    reg.record_progress(0, "f", 600)
    reg.record_progress(0, "f", 400)  # a stale report must not move delivered back
    assert reg.get(0).flows["f"].delivered == 600
    assert reg.remaining() == {"0": {"f": 400.0}}  # 1000 - 600
    for bad in (1001, -1, 3.0, "10"):
        with pytest.raises(RegistryError):
            reg.record_progress(0, "f", bad)
    assert reg.get(0).flows["f"].delivered == 600


def test_completion_sets_done_and_cct_when_all_wan_flows_finish():
    reg = make_registry()
    # f1, f2 cross the WAN (A->B, A->C); f3 is intra-DC (a1 and a2 are both in A).
    reg.submit(
        reg.parse_flows([flow("f1"), flow("f2", "a1", "c1"), flow("f3", "a1", "a2")]), None, 10.0
    )
    c = reg.record_complete(0, "f1", "d1", 11.0)
    assert c.state != "done" and c.cct_s is None
    c = reg.record_complete(0, "f2", "d2", 13.5)
    assert c.state == "done"
    assert c.cct_s == pytest.approx(3.5)  # finished 13.5 - submitted 10.0
    assert c.flows["f3"].done  # intra-DC counts as done with the WAN part
    assert c.bytes_delivered == c.bytes_total == 3000
    assert reg.remaining() == {} and reg.active() == []


def test_intra_dc_only_coflow_is_done_at_once():
    reg = make_registry()
    c = reg.submit(reg.parse_flows([flow("f", "a1", "a2")]), None, 4.0)
    assert reg.finish_if_done(c, 4.0)
    assert c.state == "done" and c.cct_s == 0.0


def test_requested_id_for_resubmission():
    reg = make_registry()
    c = reg.submit(reg.parse_flows([flow("f")]), None, 0.0, coflow_id=7)
    assert c.id == 7 and reg.next_id == 8
    with pytest.raises(RegistryError):
        reg.submit(reg.parse_flows([flow("f")]), None, 0.0, coflow_id=7)
    assert reg.submit(reg.parse_flows([flow("f")]), None, 0.0).id == 8


def test_agent_registration_validates_dc():
    reg = make_registry()
    with pytest.raises(RegistryError):
        reg.register_agent("z", "Mars")
    with pytest.raises(RegistryError):
        reg.register_agent("", "A")
    assert "z" not in reg.agents
    reg.register_agent("a1", "B")  # re-registration moves the agent
    assert reg.agents["a1"].dc == "B"


def test_remaining_is_a_copy_and_follows_every_change():
    reg = make_registry()
    c = reg.submit(reg.parse_flows([flow("f", size=100), flow("g", "a1", "c1", 50)]), None, 0.0)
    left = reg.remaining()
    left["0"]["f"] = -1.0  # the caller's copy
    assert reg.remaining() == {"0": {"f": 100.0, "g": 50.0}}
    reg.add_flows(c, reg.parse_flows([flow("h", "b1", "c1", 7)], existing=c.flows))
    reg.record_progress(0, "f", 100)  # all acknowledged, completion not yet reported
    assert reg.remaining() == {"0": {"g": 50.0, "h": 7.0}}
    # Only flows whose DCs are still connected: here A->C is cut off.
    assert reg.remaining(lambda s, d: (s, d) != ("A", "C")) == {"0": {"h": 7.0}}
    for fid in ("f", "g", "h"):
        reg.record_complete(0, fid, "x", 1.0)
    assert reg.remaining() == {} and c.state == "done"
