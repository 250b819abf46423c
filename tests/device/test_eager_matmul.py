"""Eager matrix multiplies on a saturn GPU (marker gpu) run codegen.cublaslt.LtPlan:
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


HALF_TOL = {torch.float16: (2e-3, 1e-3), torch.bfloat16: (1.6e-2, 1e-2)}  # ~2 ulps


def half_reference(fn, dtype, *xs):
    """fn on float32 copies of half inputs, rounded once to dtype (as a float32-accumulating
    product with one rounding gives it)."""
    return fn(*(x.float() for x in xs)).to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("layout", ["packed", "transposed a", "transposed b", "sliced"])
def test_mm_uses_the_operands_layouts(dtype, layout):
    from saturn.codegen.cublaslt import LtPlan

    torch.manual_seed(0)
    # scaled so that products are O(1): float32's rounding then stays well under 1e-5
    a = (torch.randn(96, 160, dtype=torch.float64) / 160**0.5).to(dtype)
    b = torch.randn(160, 72, dtype=torch.float64).to(dtype)
    da, db = a.to(GPU), b.to(GPU)
    if layout == "transposed a":
        da = a.t().contiguous().to(GPU).t()
    elif layout == "transposed b":
        db = b.t().contiguous().to(GPU).t()
    elif layout == "sliced":
        wide = (torch.randn(96, 200, dtype=torch.float64) / 160**0.5).to(dtype)
        a, da = wide[:, 20:180], wide.to(GPU)[:, 20:180]
    em._PLANS.clear()
    got, ran, fell = counted(lambda: da @ db)
    assert (ran, fell) == (1, 0) and got.dtype == dtype
    assert [type(p) for p in em._PLANS.values()] == [LtPlan]
    if dtype in HALF_TOL:
        rtol, atol = HALF_TOL[dtype]
        torch.testing.assert_close(
            got.cpu(), half_reference(torch.mm, dtype, a, b), rtol=rtol, atol=atol
        )
    else:
        torch.testing.assert_close(got.cpu(), a @ b, rtol=1e-5, atol=1e-5)


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


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_linear_and_bmm_on_the_device(dtype):
    torch.manual_seed(5)
    lin = torch.nn.Linear(64, 40)
    x = torch.randn(32, 64)
    want = half_reference(
        lambda x, w, c: torch.addmm(c, x, w.t()),
        dtype,
        x.to(dtype),
        lin.weight.to(dtype),
        lin.bias.to(dtype),
    )
    dlin = lin.to(dtype).to(GPU)
    rtol, atol = HALF_TOL[dtype]
    with torch.no_grad():
        got, ran, fell = counted(lambda: dlin(x.to(dtype).to(GPU)))
    torch.testing.assert_close(got.cpu(), want, rtol=rtol, atol=atol)
    assert (ran, fell) == (1, 0)  # one product with the bias epilogue
    q, k = (torch.randn(4, 33, 64) / 8).to(dtype), torch.randn(4, 17, 64).to(dtype)
    got, ran, fell = counted(lambda: q.to(GPU) @ k.to(GPU).transpose(1, 2))
    want = half_reference(lambda q, k: q @ k.transpose(1, 2), dtype, q, k)
    torch.testing.assert_close(got.cpu(), want, rtol=rtol, atol=atol)
    assert (ran, fell) == (1, 0)


@pytest.mark.parametrize("epilogue", ["relu_bias", "gelu_bias"])
def test_half_plans_take_the_activation_epilogues(epilogue):
    """The plan compiled graphs would fuse into: bias and activation on the float32
    accumulator, rounded once (cuBLASLt's GELU is the tanh form)."""
    from saturn.codegen.cublaslt import WORKSPACE_BYTES, LtPlan
    from saturn.codegen.gemm import Layout

    torch.manual_seed(6)
    dtype = torch.bfloat16
    x, w, c = (
        torch.randn(48, 64).to(dtype),
        (torch.randn(40, 64) / 8).to(dtype),
        torch.randn(40).to(dtype),
    )
    dx, dw, dc = x.to(GPU), w.to(GPU), c.to(GPU)
    wt = dw.t()
    out = torch.empty(48, 40, dtype=dtype, device=GPU)
    ws = torch.empty(WORKSPACE_BYTES, dtype=torch.uint8, device=GPU)

    def lay(t):
        return Layout("bf16", tuple(t.shape), tuple(t.stride()))

    ptrs = (dx.data_ptr(), wt.data_ptr(), out.data_ptr(), dc.data_ptr())
    with torch.saturn.device(1):
        plan = LtPlan(
            lay(dx),
            lay(wt),
            lay(out),
            epilogue,
            lay(dc),
            ptrs,
            torch.saturn.stream_handle(1),
            (ws.data_ptr(), WORKSPACE_BYTES),
        )
        plan.run(ptrs)
    torch.saturn.synchronize(1)
    pre = x.float() @ w.float().t() + c.float()
    act = (
        torch.relu(pre)
        if epilogue == "relu_bias"
        else torch.nn.functional.gelu(pre, approximate="tanh")
    )
    torch.testing.assert_close(out.cpu(), act.to(dtype), rtol=1.6e-2, atol=1e-2)
