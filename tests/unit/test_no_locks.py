"""No lock shared between threads in the product (docs/runtime.md, "Parts and threads"):
every piece of mutable state has one owning thread, and the others send it messages
(queues, events, the controller's loop). So the shipped packages make no threading lock,
condition, semaphore or barrier; trio's and asyncio's locks order the tasks of one loop
and are fine. The testbed and the benchmarks' harnesses are not the product."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PRODUCT = ["terra_controller", "terra_core", "terra_agent", "overlay", "terra_wire",
           "terra_security", "terra_model", "terra_sim", "topologies", "workloads"]  # fmt: skip
LOCKS = {"Lock", "RLock", "Condition", "Semaphore", "BoundedSemaphore", "Barrier"}


def thread_locks(path: Path) -> list[str]:
    """`threading.X(...)` calls and `from threading import X` of a lock kind X in `path`,
    as "file:line X"."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.module == "threading":
            found += [f"{path}:{node.lineno} {a.name}" for a in node.names if a.name in LOCKS]
        elif (
            isinstance(node, ast.Attribute)
            and node.attr in LOCKS
            and isinstance(node.value, ast.Name)
            and node.value.id == "threading"
        ):
            found.append(f"{path}:{node.lineno} threading.{node.attr}")
    return found


@pytest.mark.parametrize("package", PRODUCT)
def test_the_product_makes_no_thread_lock(package):
    files = sorted((ROOT / package).rglob("*.py"))
    assert files
    found = [hit for path in files for hit in thread_locks(path)]
    assert found == []


def test_the_check_finds_a_lock(tmp_path):
    module = tmp_path / "m.py"
    module.write_text("import threading\nfrom threading import RLock\nx = threading.Condition()\n")
    assert [hit.split(" ")[1] for hit in thread_locks(module)] == ["RLock", "threading.Condition"]
