"""The compile cache on disk (``saturn.eqsat.compile_cache``): a second compile of the same
graph, in this process after a reset or in a new process, reads the result instead of
saturating again and runs the same program, equal to eager; a changed rule file misses; an
unreadable entry is compiled and written again; ``SATURN_COMPILE_CACHE=0`` writes nothing."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

import saturn
from saturn.eqsat import compile_cache

from .helpers import last_compiled


def model(x, w):
    return torch.softmax(torch.relu(x @ w) * 2 + 1, dim=-1)


def inputs():
    g = torch.Generator().manual_seed(0)
    return torch.randn(6, 8, generator=g), torch.randn(8, 5, generator=g)


def compile_once(rules=None) -> tuple[torch.Tensor, str]:
    torch._dynamo.reset()
    options = {"rules": rules} if rules else {}
    fn = torch.compile(model, backend="saturn", dynamic=False, options=options)
    with torch.no_grad():
        got = fn(*(t.to("saturn:0") for t in inputs()))
    return got.cpu(), last_compiled().compiled.program.to_text()


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SATURN_COMPILE_CACHE", "1")
    monkeypatch.setenv("SATURN_CACHE_DIR", str(tmp_path))
    return tmp_path / "compiled"


def test_a_second_compile_reads_the_result_and_runs_the_same_program(cache):
    hits = saturn.stats()["compile_cache_hits"]
    first, program = compile_once()
    assert saturn.stats()["compile_cache_hits"] == hits and len(list(cache.glob("*.pkl"))) == 1
    second, again = compile_once()
    assert saturn.stats()["compile_cache_hits"] == hits + 1
    assert again == program and torch.equal(first, second)
    assert "compile cache" in last_compiled().compiled.stages.seconds
    with torch.no_grad():
        torch.testing.assert_close(second, model(*inputs()), rtol=1e-5, atol=1e-5)


def test_a_changed_rule_file_misses_and_a_broken_entry_is_rewritten(cache, tmp_path):
    rule = tmp_path / "mine.egg"
    rule.write_text("(ruleset mine)\n")
    compile_once([str(rule)])
    hits = saturn.stats()["compile_cache_hits"]
    rule.write_text("(ruleset mine)\n;; changed\n")
    compile_once([str(rule)])
    assert saturn.stats()["compile_cache_hits"] == hits  # another key
    for f in cache.glob("*.pkl"):
        f.write_bytes(b"not a pickle")
    got, _ = compile_once([str(rule)])
    assert saturn.stats()["compile_cache_hits"] == hits
    with torch.no_grad():
        torch.testing.assert_close(got, model(*inputs()), rtol=1e-5, atol=1e-5)
    compile_once([str(rule)])  # written again, whole
    assert saturn.stats()["compile_cache_hits"] == hits + 1


def test_turned_off_it_writes_nothing(cache, monkeypatch):
    monkeypatch.setenv("SATURN_COMPILE_CACHE", "0")
    compile_once()
    assert not cache.exists() or not list(cache.glob("*"))
    assert not compile_cache.enabled()


@pytest.mark.slow
def test_a_new_process_reuses_the_result(cache, tmp_path):
    script = textwrap.dedent(
        """
        import torch, saturn
        def model(x, w):
            return torch.softmax(torch.relu(x @ w) * 2 + 1, dim=-1)
        g = torch.Generator().manual_seed(0)
        x, w = torch.randn(6, 8, generator=g), torch.randn(8, 5, generator=g)
        fn = torch.compile(model, backend="saturn", dynamic=False)
        with torch.no_grad():
            got = fn(x.to("saturn:0"), w.to("saturn:0")).cpu()
            torch.testing.assert_close(got, model(x, w), rtol=1e-5, atol=1e-5)
        print("hits", saturn.stats()["compile_cache_hits"])
        """
    )
    # the C++ extension this process loaded, seen from the fresh cache folder: the recipe
    # cache starts empty, the extension is not built again (70 s on two cores)
    (lib,) = (Path(p) for p in torch.ops.loaded_libraries if "saturn" in Path(p).name)
    (tmp_path / "ext").mkdir(exist_ok=True)
    (tmp_path / "ext" / lib.parent.name).symlink_to(lib.parent, target_is_directory=True)
    env = dict(os.environ, SATURN_COMPILE_CACHE="1", SATURN_CACHE_DIR=str(tmp_path))
    runs = [
        subprocess.run(
            [sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=600
        )
        for _ in range(2)
    ]
    for r in runs:
        assert r.returncode == 0, r.stdout + r.stderr
    assert "hits 0" in runs[0].stdout and "hits 1" in runs[1].stdout
