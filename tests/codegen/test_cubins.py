"""Kernels built ahead of the first call (codegen/cubins.py): ``precompile`` spreads the
builds over worker processes that import only the codegen folder and stay for the
process (codegen/build_pool.py), and leaves every kernel's files on disk, where ``build``
finds them without compiling again. No GPU: PTX is Numba and NVVM, a cubin nvJitLink (PTX
alone where no linker is found)."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from saturn.codegen import build_pool, cubins
from saturn.codegen import cuda as cg

from .test_cuda_emitter import kernels_of

CODEGEN = Path(cubins.__file__).parent
GRAPHS = [
    "(input a f32 [64])\n(input b f32 [64])\n(let r (Sigmoid (Add (Mul a b) a)))\n(output r)\n",
    "(input x f32 [64 8])\n(let r (Mean (Mul x x) [0] 0))\n(output r)\n",
    "(input x f64 [64])\n(let r (Exp (Neg x)))\n(output r)\n",
]


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SATURN_CACHE_DIR", str(tmp_path))
    return tmp_path


@pytest.fixture(autouse=True)
def no_pool():
    """Each test starts without the process's build workers, and leaves none behind."""
    build_pool.shutdown()
    yield
    build_pool.shutdown()


def _gens():
    return [cg.generate(k) for text in GRAPHS for k in kernels_of(text)]


def test_precompile_builds_every_kernel_in_workers_and_build_finds_them(cache, monkeypatch):
    gens = _gens()
    distinct = {g.source for g in gens}
    assert len(distinct) >= cubins.PARALLEL_FROM
    monkeypatch.setattr(cubins, "workers", lambda: 2)
    assert cubins.precompile(gens, (9, 0)) == len(distinct)
    assert all(cubins.built(g, (9, 0)) for g in gens)

    def no_compiling(*_):
        raise AssertionError("compiled again")

    monkeypatch.setattr(cubins, "ptx", no_compiling)
    for g in gens:
        entry, kind, code = cubins.build(g, (9, 0))
        assert g.name in entry and kind in ("cubin", "ptx") and code
    assert cubins.precompile(gens, (9, 0)) == 0  # nothing left to build


def test_too_few_kernels_are_built_at_first_launch(cache):
    g = _gens()[:1]
    assert cubins.precompile(g, (9, 0)) == 0 and not cubins.built(g[0], (9, 0))


def test_a_caller_script_is_not_run_again_by_the_workers(cache, tmp_path):
    """Workers never import the caller's __main__ (a script with no main guard would run
    again in each): the script's top level runs once. The script imports the codegen
    folder alone, as the workers do, and precompiles these kernels."""
    marker, jobs = tmp_path / "runs", tmp_path / "jobs.json"
    jobs.write_text(json.dumps([dataclasses.astuple(cubins.job(g)) for g in _gens()]))
    script = tmp_path / "user.py"
    script.write_text(
        textwrap.dedent(
            f"""
            import json, sys, types
            with open({str(marker)!r}, "a") as f:
                f.write("run\\n")
            for name, path in (("saturn", []), ("saturn.codegen", [{str(CODEGEN)!r}])):
                m = types.ModuleType(name); m.__path__ = path; sys.modules[name] = m
            from saturn.codegen import cubins
            cubins.workers = lambda: 2
            gens = [cubins.Job(*j) for j in json.load(open({str(jobs)!r}))]
            print(cubins.precompile(gens, (9, 0)))
            """
        )
    )
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    assert int(out.stdout.split()[-1]) >= cubins.PARALLEL_FROM
    assert marker.read_text() == "run\n"


def test_a_failing_build_is_left_to_the_launch(cache, monkeypatch):
    gens = _gens()
    bad = cg.Generated(
        "broken", "def broken(:\n", gens[0].params, gens[0].pointer_types
    )  # not Python: the worker fails, precompile does not raise
    monkeypatch.setattr(cubins, "workers", lambda: 2)
    cubins.precompile([*gens, bad], (9, 0))
    assert not cubins.built(bad, (9, 0)) and all(cubins.built(g, (9, 0)) for g in gens)
    with pytest.raises(SyntaxError):
        cubins.build(bad, (9, 0))


def _pids() -> set[int]:
    return {p.pid for p in build_pool._POOL.procs if p.poll() is None}


def test_the_workers_stay_for_the_next_graph(cache, monkeypatch):
    """A second graph's kernels go to the workers the first graph started (no new
    processes), and with workers running even one kernel is built there, not at launch."""
    first = _gens()
    second = [
        cg.generate(k) for k in kernels_of("(input x f32 [32])\n(let r (Tanh x))\n(output r)\n")
    ]
    monkeypatch.setattr(cubins, "workers", lambda: 2)
    assert cubins.precompile(first, (9, 0)) == len({g.source for g in first})
    pids = _pids()
    assert len(pids) == 2
    assert cubins.precompile(second, (9, 0)) == 1 and cubins.built(second[0], (9, 0))
    assert _pids() == pids


def test_workers_started_early_build_a_lone_kernel(cache, monkeypatch):
    monkeypatch.setattr(cubins, "workers", lambda: 2)
    cubins.start_workers((9, 0))
    assert build_pool.started((9, 0)) and not build_pool.started((8, 0))
    g = _gens()[:1]
    assert cubins.precompile(g, (9, 0)) == 1 and cubins.built(g[0], (9, 0))


def test_one_worker_builds_nothing_ahead(cache, monkeypatch):
    monkeypatch.setattr(cubins, "workers", lambda: 1)
    cubins.start_workers((9, 0))
    assert not build_pool.started((9, 0))
    assert cubins.precompile(_gens(), (9, 0)) == 0


def test_workers_gone_idle_are_started_again(cache, monkeypatch):
    monkeypatch.setattr(cubins, "workers", lambda: 2)
    monkeypatch.setattr(build_pool, "IDLE_S", 0.2)
    cubins.start_workers((9, 0))
    old = _pids()
    for p in build_pool._POOL.procs:
        p.wait(timeout=120)  # each exits once idle (after its start-up)
    gens = _gens()
    assert cubins.precompile(gens, (9, 0)) == len({g.source for g in gens})
    assert all(cubins.built(g, (9, 0)) for g in gens)
    assert not _pids() & old
