"""Eager matrix multiplies without a GPU: on saturn:0 they run PyTorch's CPU kernel and are
counted as fallbacks; the GPU path's decisions (layouts handed to the library plan, the bias
epilogue, alpha and beta after the product, plans per signature and alignment) are checked
on host memory with a stand-in for cuBLASLt's plan that multiplies with numpy at the
plan's addresses."""

from __future__ import annotations

import ctypes
from typing import ClassVar

import numpy as np
import pytest
import torch

import saturn
from saturn import eager_matmul as em

DEV = "saturn:0"


def test_saturn0_runs_pytorchs_cpu_kernel_and_counts_it():
    a, b, c = torch.randn(4, 6), torch.randn(6, 3), torch.randn(3)
    before = saturn.fallback_counts()
    got = torch.addmm(c.to(DEV), a.to(DEV), b.to(DEV)), a.to(DEV) @ b.to(DEV)
    after = saturn.fallback_counts()
    assert torch.equal(got[0].cpu(), torch.addmm(c, a, b))
    assert torch.equal(got[1].cpu(), a @ b)
    for key in ("aten::addmm", "aten::mm"):
        assert after.get(key, 0) == before.get(key, 0) + 1, key


def view(ptr: int, lay) -> np.ndarray:
    dtype = {"f32": np.float32, "f64": np.float64}[lay.dtype]
    size = np.dtype(dtype).itemsize
    extent = 1 + sum((n - 1) * s for n, s in zip(lay.shape, lay.strides, strict=True))
    base = np.frombuffer((ctypes.c_byte * (extent * size)).from_address(ptr), dtype=dtype)
    return np.lib.stride_tricks.as_strided(
        base, lay.shape, [s * size for s in lay.strides], writeable=True
    )


class HostPlan:
    """Stands in for codegen.gemm.GemmPlan: the same constructor, numpy at ``run``."""

    made: ClassVar[list[HostPlan]] = []

    def __init__(self, a, b, out, epilogue, bias, ptrs, stream, **kwargs):
        self.layouts, self.epilogue, self.runs = (a, b, out, bias), epilogue, 0
        HostPlan.made.append(self)

    def run(self, ptrs):
        a, b, out, bias = self.layouts
        value = view(ptrs[0], a) @ view(ptrs[1], b)
        if bias is not None:
            value = value + view(ptrs[3], bias)
        view(ptrs[2], out)[...] = value
        self.runs += 1


@pytest.fixture
def host_gemm(monkeypatch):
    from saturn.codegen import gemm

    HostPlan.made = []
    monkeypatch.setattr(gemm, "GemmPlan", HostPlan)
    monkeypatch.setattr(torch.saturn, "stream_handle", lambda device=None: 0)
    monkeypatch.setattr(em, "_PLANS", {})
    # products take the GPU path on host memory; elementwise ops stay saturn:0's (counted)
    monkeypatch.setattr(
        em, "_gpu", lambda t: isinstance(t, torch.Tensor) and t.device.type == "saturn"
    )
    return HostPlan.made


def run(fn, *args):
    """fn over saturn:0 copies of args; no product may take the CPU fallback."""
    keys = ("aten::mm", "aten::bmm", "aten::addmm")
    before = [saturn.fallback_counts().get(k, 0) for k in keys]
    got = fn(*[a.to(DEV) if isinstance(a, torch.Tensor) else a for a in args])
    assert [saturn.fallback_counts().get(k, 0) for k in keys] == before, "declined"
    return got


@pytest.mark.parametrize("layout", ["packed", "transposed a", "transposed b", "sliced"])
def test_products_use_the_operands_layouts(host_gemm, layout):
    torch.manual_seed(0)
    a, b = torch.randn(6, 5), torch.randn(5, 4)
    da, db = a.to(DEV), b.to(DEV)
    if layout == "transposed a":
        da = a.t().contiguous().to(DEV).t()  # column-major
    elif layout == "transposed b":
        db = b.t().contiguous().to(DEV).t()
    elif layout == "sliced":
        wide = torch.randn(6, 9)
        a, da = wide[:, 2:7], wide.to(DEV)[:, 2:7]
    got = run(torch.mm, da, db)
    torch.testing.assert_close(got.cpu(), a @ b, rtol=1e-6, atol=1e-6)
    (plan,) = host_gemm
    assert plan.layouts[0].strides == tuple(da.stride())  # used as laid out, no copy
    assert plan.layouts[1].strides == tuple(db.stride())


def test_a_linear_layer_is_one_bias_epilogue(host_gemm):
    torch.manual_seed(1)
    lin = torch.nn.Linear(5, 3)
    x = torch.randn(4, 5)
    got = run(lin.to(DEV), x)
    torch.testing.assert_close(got.cpu(), lin.cpu()(x), rtol=1e-6, atol=1e-6)
    (plan,) = host_gemm
    assert plan.epilogue == "bias" and plan.runs == 1


def test_alpha_and_beta_follow_the_product(host_gemm):
    torch.manual_seed(2)
    c, a, b = torch.randn(4, 3), torch.randn(4, 5), torch.randn(5, 3)
    got = run(lambda c, a, b: torch.addmm(c, a, b, beta=0.5, alpha=-2.0), c, a, b)
    torch.testing.assert_close(got.cpu(), torch.addmm(c, a, b, beta=0.5, alpha=-2.0))
    nan = torch.full((4, 3), float("nan"))
    got = run(lambda c, a, b: torch.addmm(c, a, b, beta=0), nan, a, b)
    assert not got.cpu().isnan().any(), "beta = 0 ignores the input, NaN included"
    torch.testing.assert_close(got.cpu(), a @ b, rtol=1e-6, atol=1e-6)
    assert [p.epilogue for p in host_gemm] == ["none"]  # one plan for both products


def test_plans_are_per_signature_and_alignment(host_gemm):
    a, b = torch.randn(8, 8, device=DEV), torch.randn(8, 8, device=DEV)
    for _ in range(3):
        torch.mm(a, b)
    assert len(host_gemm) == 1 and host_gemm[0].runs == 3
    flat = torch.randn(80, device=DEV)
    torch.mm(flat[1:65].view(8, 8), b)  # 4 bytes off: another plan
    assert len(host_gemm) == 2


def test_batched_products_and_their_backward(host_gemm):
    torch.manual_seed(3)
    a, b = torch.randn(3, 4, 5), torch.randn(3, 5, 2)
    da, db = a.to(DEV).requires_grad_(), b.to(DEV).requires_grad_()
    out = torch.bmm(da, db)
    torch.testing.assert_close(out.detach().cpu(), torch.bmm(a, b), rtol=1e-6, atol=1e-6)
    g = torch.randn(3, 4, 2)
    out.backward(g.to(DEV))
    torch.testing.assert_close(da.grad.cpu(), torch.bmm(g, b.transpose(1, 2)))
    torch.testing.assert_close(db.grad.cpu(), torch.bmm(a.transpose(1, 2), g))
    assert len(host_gemm) == 3 and all(p.runs == 1 for p in host_gemm)


def test_what_the_library_does_not_take_runs_on_the_cpu(host_gemm):
    a = torch.randn(4, 5, dtype=torch.float16, device=DEV)
    before = saturn.fallback_counts().get("aten::mm", 0)
    torch.mm(a, a.t())
    assert saturn.fallback_counts()["aten::mm"] == before + 1 and not host_gemm
    with pytest.raises(RuntimeError, match="cannot be multiplied"):
        torch.mm(torch.randn(4, 5, device=DEV), torch.randn(4, 5, device=DEV))
