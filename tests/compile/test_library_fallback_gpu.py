"""A library that declines a plan (cuBLASLt or cuDNN refusing an operand layout) is handled
inside the compile: the step is planned on packed copies of its operands, made at every
call on the stream (and captured by replay), with the reason logged; nothing reaches the
caller, and the values are eager's. GPU only (marker gpu): an unrolled recurrent cell
whose linear layers read ``xs[:, t]`` slices, and products and convolutions whose plans
are made to decline every operand that is not packed."""

from __future__ import annotations

import logging

import pytest
import torch

from saturn import backend, runner_plans
from saturn.codegen.conv import ConvError
from saturn.codegen.gemm import GemmError
from saturn.eqsat.program import packed_strides

pytestmark = pytest.mark.gpu
GPU = "saturn:1"


def _packed(lay) -> bool:
    want = packed_strides(tuple(lay.shape))
    return all(n == 1 or s == w for n, s, w in zip(lay.shape, lay.strides, want, strict=True))


def _compiled(fn, *args):
    torch._dynamo.reset()
    cf = torch.compile(fn, backend="saturn", dynamic=False)
    fallbacks = len(backend.CACHE.fallbacks), len(backend.CACHE.failed_calls)
    outs = [cf(*args), cf(*args), cf(*args)]  # the first, captured, replayed
    assert (len(backend.CACHE.fallbacks), len(backend.CACHE.failed_calls)) == fallbacks
    return outs, list(backend.CACHE.items.values())[-1].recipe


def test_an_unrolled_recurrent_cell_on_sliced_steps():
    torch.manual_seed(0)
    lin_x, lin_h = torch.nn.Linear(12, 16), torch.nn.Linear(16, 16)

    def cell(xs):
        h = xs.new_zeros(xs.shape[0], 16)
        for t in range(xs.shape[1]):
            h = torch.tanh(lin_x(xs[:, t]) + lin_h(h))
        return h

    xs = torch.randn(3, 5, 12)
    with torch.no_grad():
        want = cell(xs)
        lin_x.to(GPU), lin_h.to(GPU)
        outs, recipe = _compiled(cell, xs.to(GPU))
    for out in outs:
        torch.testing.assert_close(out.cpu(), want, rtol=1e-5, atol=1e-5)
    assert recipe.program.count("host") == 0, recipe.program.to_text()


def test_products_declined_on_strided_operands_run_on_packed_copies(monkeypatch, caplog):
    real_gemm, real_lt = runner_plans.GemmPlan, runner_plans.LtPlan

    def picky(real):
        def make(a, b, *rest, **kw):
            if not (_packed(a) and _packed(b)):
                raise GemmError("declined for this test: packed operands only")
            return real(a, b, *rest, **kw)

        return make

    monkeypatch.setattr(runner_plans, "GemmPlan", picky(real_gemm))
    monkeypatch.setattr(runner_plans, "LtPlan", picky(real_lt))
    torch.manual_seed(1)
    a, b = torch.randn(24, 40), torch.randn(40, 32)

    def f(a, b):  # column- and row-strided slices: neither packed
        return (a[:, ::2] @ b[::2]).relu() + 1

    with caplog.at_level(logging.INFO, logger="saturn"):
        outs, recipe = _compiled(f, a.to(GPU), b.to(GPU))
    for out in outs:
        torch.testing.assert_close(out.cpu(), f(a, b), rtol=1e-5, atol=1e-5)
    assert any(k.kind == "gemm" for k in recipe.program.kernels), recipe.program.to_text()
    assert recipe.runner.packs and recipe.runner.replays >= 1
    assert "planned on packed copies" in caplog.text


def test_a_convolution_declined_on_a_strided_input_runs_on_a_packed_copy(monkeypatch):
    real = runner_plans.ConvPlan

    def picky(x, w, *rest, **kw):
        if not _packed(x):
            raise ConvError("declined for this test: packed input only")
        return real(x, w, *rest, **kw)

    monkeypatch.setattr(runner_plans, "ConvPlan", picky)
    torch.manual_seed(2)
    x, w = torch.randn(2, 3, 12, 16), torch.randn(4, 3, 3, 3)

    def f(x, w):
        return torch.nn.functional.conv2d(x[..., ::2], w, padding=1) * 2

    outs, recipe = _compiled(f, x.to(GPU), w.to(GPU))
    for out in outs:
        torch.testing.assert_close(out.cpu(), f(x, w), rtol=1e-4, atol=1e-4)
    assert recipe.runner.packs, recipe.program.to_text()
