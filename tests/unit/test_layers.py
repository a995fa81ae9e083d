"""The layers of docs/architecture.md hold: no package imports from a layer above its own or
from a sibling it is not allowed to use, and no two modules import each other, directly or
round a longer cycle (imports inside functions count too)."""

from __future__ import annotations

import ast
from pathlib import Path

import networkx as nx
import pytest

ROOT = Path(__file__).resolve().parents[2]
# Bottom to top. A package may import packages of lower layers only; packages of one layer
# are independent of each other.
LAYERS = [
    {"terra_model", "topologies"},
    {"terra_security"},
    {"terra_wire", "workloads"},
    {"terra_core", "overlay"},
    {"terra_controller", "terra_agent"},
    {"terra_sim"},
    {"mininet_scenarios"},
    {"benchmarks"},
]
LEVEL = {package: level for level, layer in enumerate(LAYERS) for package in layer}


def imports_of(path: Path) -> set[str]:
    """Absolute module names `path` imports (top-level and inside functions)."""
    here = module_name(path).split(".")
    if path.name != "__init__.py":
        here = here[:-1]  # relative imports start from the module's package
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: inside the module's own package
                base = ".".join(here[: len(here) - node.level + 1])
                module = f"{base}.{node.module}" if node.module else base
            else:
                module = node.module or ""
            found.add(module)
            found.update(f"{module}.{alias.name}" for alias in node.names)
    return found


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def project_modules() -> dict[str, Path]:
    return {
        module_name(path): path
        for package in LEVEL
        for path in sorted((ROOT / package).rglob("*.py"))
    }


def import_graph() -> nx.DiGraph:
    """module -> project module it imports."""
    modules = project_modules()
    graph = nx.DiGraph()
    graph.add_nodes_from(modules)
    for name, path in modules.items():
        for target in imports_of(path):
            if target in modules and target != name:
                graph.add_edge(name, target)
    return graph


@pytest.fixture(scope="module")
def graph() -> nx.DiGraph:
    """The import graph, parsed once for this module's tests (copy it before changing it)."""
    return import_graph()


def test_every_top_level_package_has_a_layer():
    packages = {p.parent.name for p in ROOT.glob("*/__init__.py")}
    assert packages - {"tests"} == set(LEVEL), "add new packages to LAYERS and docs/architecture.md"


def test_no_import_goes_up_or_sideways(graph):
    wrong = []
    for a, b in graph.edges:
        pa, pb = a.split(".")[0], b.split(".")[0]
        if pa != pb and LEVEL[pb] >= LEVEL[pa]:
            wrong.append(f"{a} -> {b}")
    assert not wrong, "imports against the layers:\n" + "\n".join(sorted(wrong))


def test_no_import_cycles(graph):
    graph = graph.copy()
    # A package's __init__ re-exporting its modules is not a cycle of ideas.
    graph.remove_edges_from([(a, b) for a, b in list(graph.edges) if b == a.rsplit(".", 1)[0]])
    cycles = [sorted(c) for c in nx.strongly_connected_components(graph) if len(c) > 1]
    assert not cycles, f"import cycles: {cycles}"


@pytest.mark.parametrize("client", ["terra_controller.client", "terra_controller.async_client"])
def test_the_client_imports_only_the_model_the_wire_security_and_its_transport(client, graph):
    reached = nx.descendants(graph, client)
    allowed = (
        "terra_model",
        "terra_wire",
        "terra_security",
        "overlay.pending_connections",
        "overlay.rate_limited_log",
        "terra_controller.transport",
        "terra_controller.client",
    )  # fmt: skip (the async client shares its TLS setup)
    assert all(m.startswith(allowed) for m in reached), sorted(reached)
    assert "terra_controller.controller" not in reached
