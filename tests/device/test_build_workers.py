"""The backend starts a GPU target's kernel-build workers when it is handed a graph,
before AOTAutograd traces (decision 0141); a CPU reference target starts none."""

from __future__ import annotations

import pytest
import torch

from saturn import backend
from saturn.codegen import build_pool, cubins
from saturn.options import parse


@pytest.fixture(autouse=True)
def no_pool(monkeypatch):
    monkeypatch.setattr(cubins, "workers", lambda: 2)
    build_pool.shutdown()
    yield
    build_pool.shutdown()


@pytest.fixture
def gpu_target(monkeypatch):
    """A graph for saturn:1 (this machine may have no GPU: the target is what counts)."""
    monkeypatch.setattr(backend, "_target", lambda opts, inputs: torch.device("saturn", 1))


def test_a_gpu_target_starts_the_build_workers(monkeypatch, gpu_target):
    monkeypatch.setattr(torch.saturn, "get_device_capability", lambda d: (9, 0))
    backend._start_build_workers(parse(None), [])
    assert build_pool.started((9, 0))
    assert len(build_pool._POOL.procs) == 2


def test_the_cpu_reference_device_starts_none():
    backend._start_build_workers(parse({"device": "saturn:0"}), [torch.ones(2)])
    assert not build_pool.started((9, 0)) and build_pool._POOL is None


def test_a_gpu_it_cannot_ask_starts_none_and_does_not_raise(monkeypatch, gpu_target):
    def no_gpu(d):
        raise RuntimeError("no GPU here")

    monkeypatch.setattr(torch.saturn, "get_device_capability", no_gpu)
    backend._start_build_workers(parse(None), [])
    assert build_pool._POOL is None


def test_the_workers_start_before_aot_autograd_traces(monkeypatch, gpu_target):
    monkeypatch.setattr(torch.saturn, "get_device_capability", lambda d: (9, 0))
    seen = []

    def tracing(**kw):
        def trace(gm, inputs):
            seen.append(build_pool.started((9, 0)))
            return gm

        return trace

    monkeypatch.setattr(backend, "aot_autograd", tracing)
    monkeypatch.setattr(backend, "_rerun_on_failure", lambda compiled, gm: compiled)
    gm = torch.fx.symbolic_trace(torch.nn.ReLU())
    backend.saturn_backend(gm, [torch.ones(2)])
    assert seen == [True]
