"""saturn's import structure: no import cycle among the modules of ``saturn.eqsat`` and
``saturn.codegen``, nor among those of the device package ``saturn`` (imports inside
functions included, which hide a cycle from Python but not from a reader); the core
imports neither torch nor the device package; and every import follows the layer order
that ``[tool.saturn.layers]`` in pyproject.toml states."""

from __future__ import annotations

import ast
from pathlib import Path

import networkx as nx

ROOT = Path(__file__).parents[2]
PACKAGES = {"saturn.eqsat": ROOT / "eqsat", "saturn.codegen": ROOT / "codegen"}


DEVICE = {"saturn": ROOT / "device"}


def _modules(packages: dict[str, Path] = PACKAGES) -> dict[str, Path]:
    """Every module of the packages, those of their subpackages (``eqsat/kinds/``)
    included; the device package's own subfolders are packages of their own."""
    found = {}
    for pkg, folder in packages.items():
        files = folder.glob("*.py") if pkg == "saturn" else folder.rglob("*.py")
        for f in sorted(files):
            parts = [*f.relative_to(folder).parent.parts]
            if f.stem != "__init__":
                parts.append(f.stem)
            found[".".join([pkg, *parts])] = f
    return found


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


def _layer_order() -> list[list[str]]:
    import tomllib

    return tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["saturn"]["layers"]["order"]


def _layer_of(module: str, order: list[list[str]]) -> int | None:
    """The index of ``module``'s layer: a name given exactly wins over a pattern."""
    import fnmatch

    for i, layer in enumerate(order):
        if module in layer:
            return i
    for i, layer in enumerate(order):
        for pat in layer:
            if fnmatch.fnmatchcase(module, pat) or (pat.endswith(".*") and module == pat[:-2]):
                return i
    return None


def _breaches(g: nx.DiGraph, order: list[list[str]]) -> tuple[list[str], list[tuple]]:
    """(modules in no layer, imports (module, import) that reach a layer above)."""
    layer = {m: _layer_of(m, order) for m in g}
    unplaced = [m for m, i in layer.items() if i is None]
    upward = [
        (a, b) for a, b in g.edges if None not in (layer[a], layer[b]) and layer[b] < layer[a]
    ]
    return unplaced, upward


def test_every_import_follows_the_layer_order_in_pyproject():
    """The contract ``[tool.saturn.layers]`` in pyproject.toml: every module of saturn has
    a layer, and no module imports from a layer above its own."""
    unplaced, upward = _breaches(import_graph({**DEVICE, **PACKAGES}), _layer_order())
    assert not unplaced, f"modules in no layer: {unplaced}"
    assert not upward, f"imports from a layer above (module, import): {upward}"


def test_the_layer_contract_declines_an_upward_import():
    """The check on a graph of its own: the core importing the runtime, codegen importing
    the core's command line and a module no layer names are each found; imports downwards
    and within a layer are not."""
    order = _layer_order()
    g = nx.DiGraph(
        [
            ("saturn.eqsat.extract", "saturn.gpu_runner"),  # up
            ("saturn.codegen.cuda", "saturn.eqsat.driver"),  # up
            ("saturn.gpu_runner", "saturn.codegen.cuda"),  # down
            ("saturn.eager_matmul", "saturn._runtime"),  # same layer
            ("saturn.nonexistent_module", "saturn.dtypes"),
        ]
    )
    unplaced, upward = _breaches(g, order)
    assert unplaced == ["saturn.nonexistent_module"]
    assert sorted(upward) == [
        ("saturn.codegen.cuda", "saturn.eqsat.driver"),
        ("saturn.eqsat.extract", "saturn.gpu_runner"),
    ]


MAX_LINES = 600  # a module a reader can hold in mind; split it along what it does


def test_no_module_of_the_packages_is_over_600_lines():
    """Every module of saturn's packages (the device package, its subpackages, the core)
    fits in ``MAX_LINES``; none is generated (the generated schema and placement rules are
    .egg files)."""
    folders = [ROOT / "device", ROOT / "device" / "library", ROOT / "device" / "autoload"]
    folders += [ROOT / "eqsat", ROOT / "codegen"]
    long = {
        str(f.relative_to(ROOT)): n
        for folder in folders
        for f in folder.glob("*.py")
        if (n := len(f.read_text().splitlines())) > MAX_LINES
    }
    assert long == {}, long
