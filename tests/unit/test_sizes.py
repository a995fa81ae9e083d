"""Sizes the layout keeps (docs/architecture.md): no module over MODULE_LINES lines and no
function or method over FUNCTION_LINES lines (from its `def` line to its last line) in the
shipped packages and the benchmarks; tests are exempt."""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ["terra_model", "topologies", "terra_security", "terra_wire", "workloads",
            "terra_core", "overlay", "terra_controller", "terra_agent", "terra_sim",
            "mininet_scenarios", "benchmarks"]  # fmt: skip
MODULE_LINES, FUNCTION_LINES = 800, 80


def modules() -> list[Path]:
    return sorted(p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py"))


def long_functions(path: Path) -> list[str]:
    """'module:line name (N lines)' of every function in `path` over FUNCTION_LINES."""
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            length = node.end_lineno - node.lineno + 1
            if length > FUNCTION_LINES:
                out.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name} ({length} lines)")
    return out


def test_no_module_over_800_lines_and_no_function_over_80():
    paths = modules()
    assert len(paths) > 100  # the packages are where the scan looks
    too_long = [f"{p.relative_to(ROOT)} ({n} lines)" for p in paths
                if (n := len(p.read_text().splitlines())) > MODULE_LINES]  # fmt: skip
    assert too_long == []
    assert [f for p in paths for f in long_functions(p)] == []
