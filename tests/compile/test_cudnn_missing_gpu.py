"""Without cuDNN's Python frontend (an optional package) a GPU graph with a convolution is
declined at compile time, with its reason logged, and runs uncompiled; attention runs
unfused. Marker gpu: these graphs only reach cuDNN on a GPU target."""

from __future__ import annotations

import pytest
import torch

import saturn.codegen.conv as conv
from saturn import backend, fused_attention

pytestmark = pytest.mark.gpu
GPU = "saturn:1"
WHY = "cuDNN's Python frontend (the nvidia-cudnn-frontend package) is missing: test"


def test_a_convolution_graph_is_declined_with_its_reason(monkeypatch, caplog):
    monkeypatch.setattr(conv, "cudnn_unavailable", lambda: WHY)
    torch.manual_seed(0)
    x, w = torch.randn(2, 3, 8, 8), torch.randn(4, 3, 3, 3)

    def f(x, w):
        return torch.relu(torch.nn.functional.conv2d(x, w, padding=1))

    torch._dynamo.reset()
    before = len(backend.CACHE.fallbacks)
    got = torch.compile(f, backend="saturn", dynamic=False)(x.to(GPU), w.to(GPU))
    reasons = backend.CACHE.fallbacks[before:]
    assert len(reasons) == 1 and WHY in reasons[0] and "saturn:1" in reasons[0], reasons
    assert any(WHY in r.getMessage() for r in caplog.records)
    torch.testing.assert_close(got.cpu(), f(x, w), rtol=1e-5, atol=1e-5)


def test_attention_runs_unfused_without_the_frontend(monkeypatch):
    q = torch.randn(1, 2, 16, 32, dtype=torch.float16, device=GPU)
    assert fused_attention.fused_attention_takes(q, q, q)
    monkeypatch.setattr(fused_attention, "cudnn_unavailable", lambda: WHY)
    assert not fused_attention.fused_attention_takes(q, q, q)
