"""Depth does not matter: graphs thousands of values deep compile with Python's default
recursion limit (nothing in import, saturation, typing, extraction, lowering, memory
planning or code generation recurses once per producer) and run compiled, not through the
uncompiled fallback."""

from __future__ import annotations

import sys

import pytest
import torch

from saturn import backend

from .helpers import last_compiled


def _compile(fn, *inputs):
    assert sys.getrecursionlimit() <= 1000  # Python's default: no test raised it
    torch._dynamo.reset()
    before = len(backend.CACHE.fallbacks)
    g = torch.compile(fn, backend="saturn", options={"device": "saturn:0"}, dynamic=False)
    with torch.no_grad():
        out = g(*[x.to("saturn:0") for x in inputs])
    assert backend.CACHE.fallbacks[before:] == [], backend.CACHE.fallbacks[before:]
    return out


@pytest.mark.slow
def test_a_chain_of_2500_elementwise_ops():
    def chain(x):
        for i in range(2500):  # 2.5 times the recursion limit
            x = x * 1.0001 if i % 2 else x + 0.5
        return x

    x = torch.randn(64)
    got = _compile(chain, x)
    torch.testing.assert_close(got.cpu(), chain(x), rtol=1e-5, atol=1e-5)
    kernels = last_compiled().compiled.program.kernels
    # cut into kernels of bounded depth, not one per op
    assert 10 <= len(kernels) <= 200, len(kernels)


def test_a_48_layer_mlp():
    torch.manual_seed(0)
    layers = []
    for _ in range(48):
        layers += [torch.nn.Linear(32, 32), torch.nn.GELU()]
    model = torch.nn.Sequential(*layers).eval()
    x = torch.randn(4, 32)
    got = _compile(model.to("saturn:0"), x)
    with torch.no_grad():
        want = model.to("cpu")(x)
    torch.testing.assert_close(got.cpu(), want, rtol=1e-5, atol=1e-5)
