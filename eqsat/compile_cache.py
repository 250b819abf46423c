"""Compile results kept on disk, so that a second process compiling the same graph (the same
model and shapes after a restart, each rank of a job, a benchmark's fresh process) skips
saturation, extraction and lowering, as Inductor's FX graph cache skips its compile.

A result is keyed on everything ``compile_graph`` reads: the graph's text, the contents of
every rule file (saturn's and the user's), the opt-in rewrites, the bounds, the machine and
where the inputs live, and the version of the compiler itself (the source of this package,
egglog's and Python's versions). It is stored without the live e-graph (``saturation`` is
None: nothing after a compile reads it). A compile stopped by its time bound is not kept (its
program depends on the machine's speed that day). ``SATURN_COMPILE_CACHE=0`` turns the cache
off; ``SATURN_CACHE_DIR`` moves it (default ``~/.cache/saturn/compiled``). A file that cannot
be read (truncated, from another version) is a miss and is written again."""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import logging
import os
import pickle
import sys
import tempfile
from pathlib import Path

from .pipeline import Compiled, Stages, compile_graph
from .rules import rule_files

log = logging.getLogger("saturn")
FORMAT = 1  # bump when what is stored changes shape


def enabled() -> bool:
    return os.environ.get("SATURN_COMPILE_CACHE", "1") != "0"


def cache_root() -> Path:
    root = os.environ.get("SATURN_CACHE_DIR")
    if root:
        return Path(root) / "compiled"
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "saturn" / "compiled"


@functools.cache
def compiler_version() -> str:
    """The compiler's own sources (this package), egglog's and Python's versions."""
    from importlib.metadata import version

    h = hashlib.sha256(f"{FORMAT} {sys.version} {version('egglog')}".encode())
    for f in sorted(Path(__file__).parent.glob("*.py")):
        h.update(f.name.encode())
        h.update(f.read_bytes())
    return h.hexdigest()


def key(
    text: str, rules: list | None, rewrites: list | None, bounds, machine: str, io: bool
) -> str:
    h = hashlib.sha256(compiler_version().encode())
    h.update(text.encode())
    for f in rule_files(rules):
        h.update(str(f).encode())
        h.update(f.read_bytes())
    h.update(repr((sorted(rewrites or []), bounds, machine, io)).encode())
    return h.hexdigest()[:32]


def compile_cached(
    graph,
    rules: list | None = None,
    rewrites: list[str] | None = None,
    bounds=None,
    machine: str = "cpu-reference",
    io_on_device: bool = False,
) -> tuple[Compiled, bool]:
    """``compile_graph``'s result and whether it came from the disk cache."""
    if not enabled():
        return compile_graph(graph, rules, rewrites, bounds, machine, io_on_device), False
    stages = Stages()
    try:
        k = key(graph.to_text(), rules, rewrites, bounds, machine, io_on_device)
    except Exception as e:  # the cache must never stop a compile: compile uncached
        log.info("saturn: no compile cache key (%s: %s); compiling", type(e).__name__, e)
        return compile_graph(graph, rules, rewrites, bounds, machine, io_on_device), False
    path = cache_root() / f"{k}.pkl"
    try:
        with open(path, "rb") as f:
            got = pickle.load(f)
        if isinstance(got, Compiled):
            stages.mark("compile cache", "read")
            got.stages = stages
            return got, True
    except FileNotFoundError:
        pass
    except Exception as e:  # a partial or foreign file: compile and write it again
        log.info("saturn: compile cache entry %s unreadable (%s); compiling", path.name, e)
    compiled = compile_graph(graph, rules, rewrites, bounds, machine, io_on_device)
    if not compiled.report.stop_reason.startswith("time"):
        _write(path, dataclasses.replace(compiled, saturation=None))
    return compiled, False


def _write(path: Path, compiled: Compiled) -> None:
    """Write atomically (a temporary file renamed): a reader sees all of a file or none."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path.parent, suffix=".tmp", delete=False) as f:
            pickle.dump(compiled, f, protocol=pickle.HIGHEST_PROTOCOL)
        os.replace(f.name, path)
    except Exception as e:  # a read-only or full disk: the compile stands, uncached
        log.info("saturn: could not write the compile cache (%s)", e)
