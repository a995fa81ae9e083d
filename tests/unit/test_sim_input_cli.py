"""terra-sim options: --fail-link times must be finite, Terra's options are checked before
any run whatever --scheduler, and the table's scheduler column fits the longest name."""

import json

import pytest

from terra_sim.cli import main, parse_fail_link
from topologies import load_topology

SWAN = load_topology("swan")
WORKLOAD = {
    "coflows": [
        {"id": "c1", "arrival_s": 0.0, "deadline_s": None,
         "flows": [{"id": "f1", "src": "HK", "dst": "NY", "bytes": 1e8}]},
        {"id": "c2", "arrival_s": 0.5, "deadline_s": None,
         "flows": [{"id": "f1", "src": "BA", "dst": "FL", "bytes": 5e7}]},
    ]
}  # fmt: skip


@pytest.fixture
def workload(tmp_path):
    path = tmp_path / "two.json"
    path.write_text(json.dumps(WORKLOAD))
    return str(path)


@pytest.mark.parametrize("spec", ["HK-LA@nan", "HK-LA@inf", "HK-LA@1:nan", "HK-LA@1:inf"])
def test_fail_link_times_must_be_finite(spec):
    with pytest.raises(ValueError, match="times must be finite numbers"):
        parse_fail_link(spec, SWAN)


def test_fail_link_finite_times_still_parse():
    down, up = parse_fail_link("HK-LA@1:2.5", SWAN)
    assert (down.time_s, down.up, up.time_s, up.up) == (1.0, False, 2.5, True)


def test_terra_sim_exits_2_on_a_non_finite_failure_time(workload, capsys):
    argv = ["--topology", "swan", "--workload", workload, "--fail-link", "HK-LA@nan"]
    assert main([*argv, "--scheduler", "varys"]) == 2
    [line] = capsys.readouterr().err.strip().splitlines()
    assert (
        line == "terra-sim: error: --fail-link 'HK-LA@nan': times must be finite numbers of seconds"
    )


@pytest.mark.parametrize(
    ("option", "message"),
    [
        (["--alpha", "2"], "alpha must be in [0, 1), got 2.0"),
        (["--delta", "-1"], "delta must be >= 0, got -1.0"),
        (["--epsilon", "nan"], "epsilon must be >= 0, got nan"),
        (["--guard-factor", "-1"], "guard factor must be a finite number >= 0"),
    ],
)
@pytest.mark.parametrize("scheduler", ["all", "varys", "terra,varys"])
def test_invalid_terra_option_exits_2_whatever_the_schedulers(
    workload, capsys, option, message, scheduler
):
    argv = ["--topology", "swan", "--workload", workload, "--scheduler", scheduler, *option]
    assert main(argv) == 2
    out, err = capsys.readouterr()
    assert out == ""  # no run, no table
    [line] = err.strip().splitlines()
    assert line.startswith(f"terra-sim: error: invalid Terra option: {message}")


def test_table_column_fits_coflowsim_fair(workload, capsys):
    argv = ["--topology", "swan", "--workload", workload, "--scheduler", "varys,coflowsim-fair"]
    assert main(argv) == 0
    lines = capsys.readouterr().out.splitlines()
    head, rule, *rows = lines[:4]
    assert [row.split()[0] for row in rows] == ["varys", "coflowsim-fair"]
    assert len(rule) == len(head) and {len(row) for row in rows} == {len(head)}
    column = head.index("avg CCT s") + len("avg CCT s")
    for row in rows:  # the average CCT ends under its heading
        assert row[column - 1] != " " and row[column] == " "
