"""Eager matrix multiplies on a saturn GPU (marker gpu) run cuBLASLt through nvmath:
values against PyTorch eager on the CPU (float32 at 1e-5), ``GEMMS`` counting library
products and the fallback counters unchanged."""

from __future__ import annotations

import pytest
import torch

import saturn
from saturn import eager_matmul as em

pytestmark = pytest.mark.gpu
GPU = "saturn:1"
PRODUCTS = ("aten::mm", "aten::bmm", "aten::addmm")


def counted(fn):
    """(fn(), library products it ran, product fallbacks it counted)."""
    before = em.GEMMS, [saturn.fallback_counts().get(k, 0) for k in PRODUCTS]
    out = fn()
    after = [saturn.fallback_counts().get(k, 0) for k in PRODUCTS]
    return out, em.GEMMS - before[0], sum(after) - sum(before[1])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("layout", ["packed", "transposed a", "transposed b", "sliced"])
def test_mm_uses_the_operands_layouts(dtype, layout):
    torch.manual_seed(0)
    # scaled so that products are O(1): float32's rounding then stays well under 1e-5
    a, b = torch.randn(96, 160, dtype=dtype) / 160**0.5, torch.randn(160, 72, dtype=dtype)
    da, db = a.to(GPU), b.to(GPU)
    if layout == "transposed a":
        da = a.t().contiguous().to(GPU).t()
    elif layout == "transposed b":
        db = b.t().contiguous().to(GPU).t()
    elif layout == "sliced":
        wide = torch.randn(96, 200, dtype=dtype) / 160**0.5
        a, da = wide[:, 20:180], wide.to(GPU)[:, 20:180]
    got, ran, fell = counted(lambda: da @ db)
    torch.testing.assert_close(got.cpu(), a @ b, rtol=1e-5, atol=1e-5)
    assert (ran, fell) == (1, 0)


def test_bmm_and_addmm_with_alpha_and_beta():
    torch.manual_seed(1)
    a, b = torch.randn(4, 33, 64) / 8, torch.randn(4, 64, 17)
    got, ran, fell = counted(lambda: torch.bmm(a.to(GPU), b.to(GPU)))
    torch.testing.assert_close(got.cpu(), torch.bmm(a, b), rtol=1e-5, atol=1e-5)
    assert (ran, fell) == (1, 0)
    c, x, w = torch.randn(33, 17), torch.randn(33, 64) / 8, torch.randn(64, 17)
    want = torch.addmm(c, x, w, beta=0.5, alpha=-2.0)
    got, ran, fell = counted(
        lambda: torch.addmm(c.to(GPU), x.to(GPU), w.to(GPU), beta=0.5, alpha=-2.0)
    )
    torch.testing.assert_close(got.cpu(), want, rtol=1e-5, atol=1e-5)
    assert (ran, fell) == (1, 0)


def test_a_linear_layer_forward_and_backward():
    torch.manual_seed(2)
    lin = torch.nn.Linear(128, 48)
    x = torch.randn(6, 10, 128)
    dlin = torch.nn.Linear(128, 48).to(GPU)
    dlin.load_state_dict(lin.state_dict())
    dx = x.to(GPU).requires_grad_()
    xr = x.clone().requires_grad_()
    (y, ran, fell) = counted(lambda: dlin(dx))
    want = lin(xr)
    torch.testing.assert_close(y.detach().cpu(), want.detach(), rtol=1e-5, atol=1e-5)
    assert ran >= 1 and fell == 0
    g = torch.randn(6, 10, 48)
    _, ran, fell = counted(lambda: y.backward(g.to(GPU)))
    want.backward(g)
    assert ran >= 2 and fell == 0  # input and weight gradients: products on the device
    torch.testing.assert_close(dx.grad.cpu(), xr.grad, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(dlin.weight.grad.cpu(), lin.weight.grad, rtol=1e-5, atol=1e-4)


def test_a_2d_linear_is_one_bias_epilogue_and_views_at_odd_offsets():
    torch.manual_seed(3)
    lin = torch.nn.Linear(64, 40)
    dlin = torch.nn.Linear(64, 40).to(GPU)
    dlin.load_state_dict(lin.state_dict())
    with torch.no_grad():
        x = torch.randn(32, 64)
        got, ran, fell = counted(lambda: dlin(x.to(GPU)))
        torch.testing.assert_close(got.cpu(), lin(x), rtol=1e-5, atol=1e-5)
        assert (ran, fell) == (1, 0)
        # the same shapes from a view 4 bytes into its storage: a plan of its own
        flat = torch.randn(32 * 64 + 1)
        xo = flat[1:].view(32, 64)
        got, ran, fell = counted(lambda: dlin(flat.to(GPU)[1:].view(32, 64)))
        torch.testing.assert_close(got.cpu(), lin(xo), rtol=1e-5, atol=1e-5)
        assert (ran, fell) == (1, 0)
