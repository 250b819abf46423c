"""Eager reductions on a saturn GPU (marker gpu) run saturn's reduction kernels: values
against PyTorch eager on the CPU (float32 at 1e-5), ``REDUCTIONS`` counting kernels and the
fallback counters unchanged."""

from __future__ import annotations

import pytest
import torch

import saturn
from saturn import eager_reduce as er

pytestmark = pytest.mark.gpu
GPU = "saturn:1"

CASES = {
    "rows (a bias gradient)": (lambda: torch.randn(512, 96), lambda x: x.sum(0)),
    "last axis": (lambda: torch.randn(64, 300), lambda x: x.amax(-1, keepdim=True)),
    "long rows": (lambda: torch.randn(4, 5000), lambda x: x.mean(1)),
    "everything (split)": (lambda: torch.randn(1 << 20), lambda x: x.sum()),
    "transposed": (lambda: torch.randn(96, 128).t(), lambda x: x.sum(0)),
    "axes apart": (lambda: torch.randn(6, 40, 7), lambda x: x.amin((0, 2))),
    "slice": (lambda: torch.randn(64, 90)[:, 3:80], lambda x: x.mean(1, keepdim=True)),
    "channels": (lambda: torch.randn(4, 8, 12, 12), lambda x: x.sum((0, 2, 3))),
    "float64": (lambda: torch.randn(50, 70, dtype=torch.float64), lambda x: x.mean(0)),
}


@pytest.mark.parametrize("name", list(CASES))
def test_reductions_run_on_the_device(name):
    make, op = CASES[name]
    torch.manual_seed(7)
    x = make()
    want = op(x)
    if x._base is None:
        dev = x.to(GPU)
    else:
        dev = x._base.to(GPU).as_strided(x.shape, x.stride(), x.storage_offset())
    before, count = saturn.fallback_counts(), er.REDUCTIONS
    got = op(dev)
    assert saturn.fallback_counts() == before, "declined"
    assert er.REDUCTIONS == count + 1
    torch.testing.assert_close(got.cpu(), want, rtol=1e-5, atol=1e-5)


def test_nan_and_a_linear_layers_backward():
    x = torch.randn(32, 16)
    x[3, 4] = float("nan")
    got = x.to(GPU).amax(1).cpu()
    assert torch.isnan(got[3]) and torch.equal(got[:3], x.amax(1)[:3])
    torch.manual_seed(8)
    lin = torch.nn.Linear(16, 8)
    dlin = torch.nn.Linear(16, 8).to(GPU)
    dlin.load_state_dict(lin.state_dict())
    xs = torch.randn(64, 16)
    before = saturn.fallback_counts().get("aten::sum.dim_IntList", 0)
    dlin(xs.to(GPU)).sum().backward()
    lin(xs).sum().backward()
    assert saturn.fallback_counts().get("aten::sum.dim_IntList", 0) == before
    torch.testing.assert_close(dlin.bias.grad.cpu(), lin.bias.grad, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("name", ["rows (a bias gradient)", "long rows", "everything (split)"])
def test_half_reductions_accumulate_in_float32_and_round_once(dtype, name):
    make, op = CASES[name]
    torch.manual_seed(8)
    x = make().to(dtype)
    want = op(x.float()).to(dtype)  # float32 accumulation, one rounding (PyTorch's)
    before, count = saturn.fallback_counts(), er.REDUCTIONS
    got = op(x.to(GPU))
    assert saturn.fallback_counts() == before and er.REDUCTIONS == count + 1
    assert got.dtype == dtype
    # float32 sums in another order differ by float32 roundings, then one half rounding
    tol = {torch.float16: 2e-3, torch.bfloat16: 1.6e-2}[dtype]
    torch.testing.assert_close(got.cpu(), want, rtol=tol, atol=tol)
