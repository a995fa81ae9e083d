"""benchmarks/fb_table3.py and foi_ceiling.py --jobs: parallel sweeps give the serial results."""

import importlib
import json

from benchmarks.fb_table3 import without_times


def benchmark(name: str):
    """Import benchmarks/<name>.py (as the package module, so that a process pool can
    pickle its functions)."""
    return importlib.import_module(f"benchmarks.{name}")


def test_fb_table3_jobs_2_equals_serial_and_reuses_parts(tmp_path, capsys):
    # 2 topologies x 3 schedulers on the first 6 FB coflows: 6 independent runs. Serial and
    # 2 processes must write the same part files and details (but for measured times).
    fb_table3 = benchmark("fb_table3")
    argv = ["--topology", "swan", "gscale", "--limit", "6", "--schedulers"]
    argv += ["terra", "varys", "per-flow"]
    for jobs in (1, 2):
        out = tmp_path / f"j{jobs}"
        assert fb_table3.main([*argv, "--jobs", str(jobs), "--reuse", str(out / "parts")]) == 0
    serial, parallel = (sorted((tmp_path / f"j{j}" / "parts").iterdir()) for j in (1, 2))
    assert [p.name for p in serial] == [p.name for p in parallel]
    assert len(serial) == 6
    for a, b in zip(serial, parallel, strict=True):
        one, two = json.loads(a.read_text()), json.loads(b.read_text())
        assert without_times(one) == without_times(two), a.name
        assert one["results"][next(iter(one["results"]))]["coflows"]  # not vacuous
    # --reuse with --jobs 2: nothing is simulated again, every part is loaded as it was
    before = {p: p.read_text() for p in parallel}
    capsys.readouterr()
    assert fb_table3.main([*argv, "--jobs", "2", "--reuse", str(tmp_path / "j2" / "parts")]) == 0
    assert capsys.readouterr().err.count("reusing") == 6
    assert {p: p.read_text() for p in parallel} == before


def test_foi_ceiling_jobs_2_equals_serial(tmp_path):
    # Two capacities (1 and 10 Gbps) x terra, varys on the first 6 FB coflows of SWAN: the
    # bounds and every ceiling/FoI are the same computed serially or in 2 processes.
    foi_ceiling = benchmark("foi_ceiling")
    argv = ["--topology", "swan", "--limit", "6", "--link-gbps", "1", "10", "--schedulers"]
    argv += ["terra", "varys"]
    outs = []
    for jobs in (1, 2):
        out = tmp_path / f"c{jobs}.json"
        assert foi_ceiling.main([*argv, "--jobs", str(jobs), "--json", str(out)]) == 0
        outs.append(json.loads(out.read_text()))
    assert outs[0] == outs[1]
    assert set(outs[0]["swan"]) == {"1", "10"}
    assert outs[0]["swan"]["1"]["baselines"]["varys"]["foi"] > 0
