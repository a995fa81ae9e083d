"""`terra-sim --tenants`: a JSON tenants file follows the controller's tenant name rules,
names each tenant once and gives finite weights; a count must be >= 1."""

import json

import pytest

from terra_sim.cli import main
from terra_sim.tenants import parse_tenants


def write(tmp_path, text, name="tenants.json"):
    path = tmp_path / name
    path.write_text(text)
    return str(path)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('{"a": 3, "a": 1}', "tenant 'a' is given twice"),
        ('{"a": 1, "A": 2}', "duplicate tenant 'A' \\(as 'a'\\)"),
        ('{"a b": 1}', "bad tenant name 'a b': 1-64 characters of A-Z a-z 0-9 . _ -"),
        ('{"": 1}', "bad tenant name ''"),
        ('{"-a": 1}', "bad tenant name '-a'"),
        ('{"a\\n": 1}', "bad tenant name"),
        ('{"' + "x" * 65 + '": 1}', "bad tenant name"),
        ('{"a": 1e400}', "tenant 'a' weight must be a finite number > 0, got inf"),
        ('{"a": 0}', "tenant 'a' weight must be a finite number > 0, got 0"),
        ('{"a": {"b": 1}}', "tenant 'a' weight must be a finite number > 0"),
    ],
)
def test_bad_tenants_file(tmp_path, text, message):
    path = write(tmp_path, text)
    with pytest.raises(ValueError, match=f"^--tenants {path}: {message}"):
        parse_tenants(path)


def test_good_tenants_file_keeps_its_order(tmp_path):
    path = write(tmp_path, json.dumps({"web": 2, "Batch.1": 1, "x_y-z": 0.5}))
    assert parse_tenants(path) == {"web": 2.0, "Batch.1": 1.0, "x_y-z": 0.5}
    assert parse_tenants("3") == {"t0": 1.0, "t1": 1.0, "t2": 1.0}


@pytest.mark.parametrize("value", ["0", "-2", "+0"])
def test_tenant_count_must_be_at_least_one(value):
    with pytest.raises(ValueError, match=f"--tenants must be >= 1, got {int(value)}$"):
        parse_tenants(value)


@pytest.mark.parametrize("value", ["-2", "dup"])
def test_terra_sim_exits_2(tmp_path, capsys, value):
    if value == "dup":
        value = write(tmp_path, '{"a": 3, "a": 1}')
    argv = ["--topology", "swan", "--workload", "fb", "--limit", "2", "--tenants", value]
    assert main([*argv, "--scheduler", "terra"]) == 2
    [line] = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("terra-sim: error: --tenants ")
