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


def _span(ptr: int, lay) -> tuple[np.ndarray, int]:
    """An operand's span as float32 or float64 values (halves read from their bits)."""
    n = 1 + sum((d - 1) * s for d, s in zip(lay.shape, lay.strides, strict=True))
    if lay.dtype in ("f32", "f64"):
        dtype = np.float32 if lay.dtype == "f32" else np.float64
        size = np.dtype(dtype).itemsize
        return np.frombuffer((ctypes.c_byte * (size * n)).from_address(ptr), dtype=dtype), n
    bits = np.frombuffer((ctypes.c_byte * (2 * n)).from_address(ptr), dtype=np.int16)
    return torch.from_numpy(bits.copy()).view(HALF[lay.dtype]).float().numpy(), n


HALF = {"f16": torch.float16, "bf16": torch.bfloat16}


class HostPlan:
    """Stands in for codegen.cublaslt.LtPlan: the same constructor, and at ``run`` its
    column-major problem (``lt_problem``) run by ``simulate`` on the operands' memory,
    rounded once to the output's type."""

    made: ClassVar[list[HostPlan]] = []

    def __init__(self, a, b, out, epilogue, bias, ptrs, stream, workspace, **kwargs):
        from saturn.codegen.cublaslt import lt_problem

        self.layouts, self.epilogue, self.runs = (a, b, out, bias), epilogue, 0
        self.problem = lt_problem(a, b, out)
        HostPlan.made.append(self)

    def run(self, ptrs):
        from saturn.codegen.cublaslt import simulate

        a, b, out, bias = self.layouts
        (fa, _), (fb, _), (fd, n) = (
            _span(p, x) for p, x in zip(ptrs[:3], (a, b, out), strict=True)
        )
        fbias = None if bias is None else _span(ptrs[3], bias)[0]
        if out.dtype in HALF:
            fd = fd.copy()
        # saturn's b is the library's a (out^T = b^T @ a^T)
        simulate(self.problem, fb, fa, fd, bias=fbias)
        if out.dtype in HALF:
            rounded = torch.from_numpy(fd).to(HALF[out.dtype]).view(torch.int16).numpy()
            dst = (ctypes.c_byte * (2 * n)).from_address(ptrs[2])
            np.frombuffer(dst, dtype=np.int16)[...] = rounded
        self.runs += 1


@pytest.fixture
def host_gemm(monkeypatch):
    from saturn.codegen import cublaslt

    HostPlan.made = []
    monkeypatch.setattr(cublaslt, "LtPlan", HostPlan)
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
    a = torch.randint(0, 5, (4, 5), device=DEV)  # integers: no library plan
    before = saturn.fallback_counts().get("aten::mm", 0)
    torch.mm(a, a.t())
    assert saturn.fallback_counts()["aten::mm"] == before + 1 and not host_gemm
    with pytest.raises(RuntimeError, match="cannot be multiplied"):
        torch.mm(torch.randn(4, 5, device=DEV), torch.randn(4, 5, device=DEV))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_products_take_the_column_major_plan(host_gemm, dtype):
    torch.manual_seed(4)
    lin = torch.nn.Linear(24, 10).to(dtype)
    x = torch.randn(7, 24, dtype=dtype)
    with torch.no_grad():
        want = torch.addmm(lin.bias.float(), x.float(), lin.weight.float().t()).to(dtype)
        got = run(lin.to(DEV), x)
        torch.testing.assert_close(got.cpu(), want)
        a, b = torch.randn(3, 6, 8, dtype=dtype), torch.randn(3, 5, 8, dtype=dtype)
        got = run(lambda a, b: torch.bmm(a, b.transpose(1, 2)), a, b)
        want = torch.bmm(a.float(), b.float().transpose(1, 2)).to(dtype)
        torch.testing.assert_close(got.cpu(), want)
    assert [type(p) for p in host_gemm] == [HostPlan, HostPlan]
    assert [p.epilogue for p in host_gemm] == ["bias", "none"]


def test_half_addmm_with_other_alpha_declines(host_gemm):
    # a rounded half product scaled afterwards would round twice: PyTorch's CPU kernel runs
    c, a, b = (torch.randn(*s, dtype=torch.bfloat16, device=DEV) for s in ((5,), (4, 3), (5, 3)))
    before = saturn.fallback_counts().get("aten::addmm", 0)
    torch.addmm(c, a, b.t(), alpha=2.0)
    assert saturn.fallback_counts()["aten::addmm"] == before + 1 and not host_gemm
