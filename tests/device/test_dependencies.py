"""Every dependency ``pyproject.toml`` declares is imported by saturn's code, and every
package saturn's code imports is declared: a runtime dependency, or (GPU libraries saturn
checks for at run time) an extra."""

from __future__ import annotations

import ast
import functools
import importlib.metadata as md
import re
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SOURCES = ("eqsat", "device", "codegen")
# imports whose distribution is not the one the import's top level names, or that this
# environment may lack (the GPU extras): import prefix -> distributions providing it
PROVIDED_BY = {
    "numba.cuda": ("numba-cuda",),  # numba-cuda serves numba.cuda
    "cupy": ("cupy-cuda12x", "cupy-cuda13x"),
    "cudnn": ("nvidia-cudnn-frontend",),
}


def _name(req: str) -> str:
    return re.split(r"[\s\[<>=~!;]", req, maxsplit=1)[0].lower().replace("_", "-")


def _imports() -> set[str]:
    out = set()
    for d in SOURCES:
        for f in (ROOT / d).rglob("*.py"):
            for n in ast.walk(ast.parse(f.read_text())):
                if isinstance(n, ast.Import):
                    out |= {a.name for a in n.names}
                elif isinstance(n, ast.ImportFrom) and n.level == 0 and n.module:
                    out.add(n.module)
    return {m for m in out if m.split(".")[0] not in sys.stdlib_module_names | {"saturn"}}


@functools.cache
def _top_levels() -> dict[str, list[str]]:
    return md.packages_distributions()


def _providers(module: str) -> set[str]:
    for prefix, dists in PROVIDED_BY.items():
        if module == prefix or module.startswith(prefix + "."):
            return set(dists)
    found = _top_levels().get(module.split(".")[0], [])
    return {_name(d) for d in found}


def _requires(dist: str) -> set[str]:
    try:
        return {_name(r) for r in md.requires(dist) or [] if "extra ==" not in r}
    except md.PackageNotFoundError:
        return set()


def _metapackage(dist: str) -> bool:
    """A distribution with no code of its own (cuda-python: cuda-bindings, cuda-core)."""
    try:
        return not any(str(f).endswith(".py") for f in md.files(dist) or [])
    except md.PackageNotFoundError:
        return False


def _declared() -> tuple[set[str], set[str]]:
    """(runtime dependencies, a metapackage's direct requirements included; extras')."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    runtime = {_name(r) for r in project["dependencies"]}
    runtime |= set().union(*(_requires(d) for d in runtime if _metapackage(d)))
    extras = {_name(r) for reqs in project["optional-dependencies"].values() for r in reqs}
    return runtime, extras


def test_every_import_is_declared_and_every_dependency_imported():
    runtime, extras = _declared()
    imports = _imports()
    undeclared = {m for m in imports if not _providers(m) & (runtime | extras)}
    assert not undeclared, f"imported but not declared: {sorted(undeclared)}"
    used = set().union(*(_providers(m) for m in imports))
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    unused = set()
    for r in project["dependencies"]:
        dist = _name(r)
        via = {dist} | (_requires(dist) if _metapackage(dist) else set())
        if not via & used:
            unused.add(dist)
    assert not unused, f"declared but never imported: {sorted(unused)}"
    # the GPU libraries saturn checks for at run time are extras, not requirements
    assert {"cupy-cuda13x", "nvidia-cudnn-frontend"} <= extras
