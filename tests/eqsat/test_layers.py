"""saturn's import structure: no import cycle among the modules of ``saturn.eqsat`` and
``saturn.codegen``, nor among those of the device package ``saturn`` (imports inside
functions included, which hide a cycle from Python but not from a reader); and the core
imports neither torch nor the device package."""

from __future__ import annotations

import ast
from pathlib import Path

import networkx as nx

ROOT = Path(__file__).parents[2]
PACKAGES = {"saturn.eqsat": ROOT / "eqsat", "saturn.codegen": ROOT / "codegen"}


DEVICE = {"saturn": ROOT / "device"}


def _modules(packages: dict[str, Path] = PACKAGES) -> dict[str, Path]:
    return {
        f"{pkg}.{f.stem}" if f.stem != "__init__" else pkg: f
        for pkg, folder in packages.items()
        for f in sorted(folder.glob("*.py"))
    }


def _imports(name: str, path: Path) -> set[str]:
    """Every module ``path`` imports, anywhere in it, as absolute names."""
    package = name if path.stem == "__init__" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                up = ".".join(parts[: len(parts) - node.level + 1])
                base = f"{up}.{base}" if base else up
            found.add(base)
            found |= {f"{base}.{a.name}" for a in node.names}  # `from . import optable`
    return found


def import_graph(packages: dict[str, Path] = PACKAGES) -> nx.DiGraph:
    modules = _modules(packages)
    g = nx.DiGraph()
    g.add_nodes_from(modules)
    for name, path in modules.items():
        for target in _imports(name, path):
            if target in modules and target != name:
                g.add_edge(name, target)
    return g


def test_the_core_has_no_import_cycle():
    g = import_graph()
    cycles = list(nx.simple_cycles(g))
    assert not cycles, f"import cycles: {cycles}"


def test_the_device_package_has_no_import_cycle():
    cycles = list(nx.simple_cycles(import_graph(DEVICE)))
    assert not cycles, f"import cycles: {cycles}"


def test_the_core_imports_neither_torch_nor_the_device():
    bad = {
        (name, target)
        for name, path in _modules().items()
        for target in _imports(name, path)
        if target.split(".")[0] == "torch"
        or (target.startswith("saturn") and not target.startswith(tuple(PACKAGES)))
    }
    assert not bad, bad
