"""Coflow-benchmark trace lines with non-finite arrivals or sizes: one error naming the
file and line, in the default model, as CoflowSim reads them, and from terra-sim."""

import pytest

from terra_model import WorkloadError
from terra_sim.cli import main
from topologies import load_topology
from workloads import load_fb_trace
from workloads.coflowsim_trace import load_coflowsim_trace
from workloads.fb_trace import parse_fields

SWAN = load_topology("swan")


def write(tmp_path, text, name="trace.txt"):
    path = tmp_path / name
    path.write_text(text)
    return path


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("1 inf 1 0 1 2:1.0", "arrival must be a finite number >= 0 ms, got inf"),
        ("1 nan 1 0 1 2:1.0", "arrival must be a finite number >= 0 ms, got nan"),
        ("1 -inf 1 0 1 2:1.0", "arrival must be a finite number >= 0 ms, got -inf"),
        ("1 0 1 0 1 2:1e308", "reducer 0 size must be a number of MB > 0"),
        ("1 0 1 0 2 2:1 3:nan", "reducer 1 size must be a number of MB > 0"),
        ("1 0 1 0 1 2:inf", "reducer 0 size must be a number of MB > 0"),
    ],
)
def test_non_finite_arrival_or_size_is_refused(line, message):
    with pytest.raises(WorkloadError, match="^t.txt:2: " + message.replace("(", r"\(")):
        parse_fields(line, 10, "t.txt:2")


def test_finite_fields_still_parse():
    assert parse_fields("7 1500 2 0 6 1 2:1e300", 10, "t:2") == ("7", 1500.0, [0, 6], [(2, 1e300)])


@pytest.mark.parametrize("arrival", ["inf", "nan"])
def test_trace_loaders_name_the_line(tmp_path, arrival):
    path = write(tmp_path, f"10 2\n1 0 1 0 1 2:1\n2 {arrival} 1 0 1 2:1\n")
    with pytest.raises(WorkloadError, match=f"trace.txt:3: arrival .* got {arrival}"):
        load_fb_trace(path, SWAN.dcs)
    with pytest.raises(WorkloadError, match=f"trace.txt:3: arrival .* got {arrival}"):
        load_coflowsim_trace(path, str, lambda r: f"rx{r}")


def test_coflowsim_reducers_of_one_rack_summing_past_a_float(tmp_path):
    # each size is finite in bytes (1.7e302 x 1048576 = 1.78e308), their sum is not
    path = write(tmp_path, "10 1\n1 0 1 0 2 2:1.7e302 2:1.7e302\n")
    with pytest.raises(WorkloadError, match="trace.txt:2: reducers of rack 2: .* too large"):
        load_coflowsim_trace(path, str, lambda r: f"rx{r}")


@pytest.mark.parametrize("compat", [False, True])
@pytest.mark.parametrize(
    "line", ["1 inf 1 22 1 65:1.0", "1 nan 1 22 1 65:1.0", "1 0 1 22 1 65:1e308"]
)
def test_terra_sim_exits_2_with_one_line(tmp_path, capsys, compat, line):
    path = write(tmp_path, f"150 2\n{line}\n2 0 1 5 1 7:2.0\n")
    argv = ["--topology", "bigswitch", "--workload", str(path), "--scheduler", "coflowsim-fair"]
    assert main(argv + ["--coflowsim-compat"] * compat) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"terra-sim: error: {path}:2: ")
