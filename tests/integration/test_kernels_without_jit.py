"""The compiled kernels' tests also pass with numba's JIT off (NUMBA_DISABLE_JIT=1): the
kernels' Python source is then what runs, so a kernel whose interpreted and compiled
forms disagree fails one of the two runs."""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_compiled_kernel_tests_pass_with_the_jit_off():
    env = dict(os.environ, NUMBA_DISABLE_JIT="1")
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-x", "-n", "0", "-p", "no:cacheprovider",
         "tests/unit/test_maxmin_compiled.py"],  # -n 0: one process, not a worker per CPU
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert " passed" in done.stdout
