"""cuBLAS's own choice as a candidate of a product's plan (``codegen.cublaslt.BlasGemm``).

Without a GPU: the call's arguments, replayed by a column-major reference of
``cublasGemmStridedBatchedEx``, compute the row-major ``a @ b`` for every layout the plans
take; an unknown choice is refused before the device is touched. On a GPU (marker gpu): a
plan made to take cuBLAS's choice gives PyTorch eager's CPU result (float32 at 1e-5), one
told never to take it does not hold it, and a timed plan records both timings."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from saturn.codegen import cublaslt as cb
from saturn.codegen.cublaslt import lt_problem, offer_blas
from saturn.codegen.gemm import GemmError, GemmPlan, Layout

BASE = 1 << 20  # fake pointers: buffer j at j * BASE, plus an offset in elements


class FakeBlas:
    """cuBLAS's strided batched product over numpy buffers, column-major as documented."""

    def __init__(self):
        self.bufs: dict[int, np.ndarray] = {}
        self.calls = 0

    def put(self, j: int, buf: np.ndarray) -> int:
        self.bufs[j * BASE] = buf.reshape(-1)
        return j * BASE

    def _read(self, ptr, op, rows, cols, ld, stride, i):
        buf, off = self.bufs[ptr - ptr % BASE], ptr % BASE + i * stride
        if op == 0:  # N: stored rows x cols
            idx = off + np.arange(rows)[:, None] + np.arange(cols)[None, :] * ld
        else:  # T: stored cols x rows, read transposed
            idx = off + np.arange(rows)[:, None] * ld + np.arange(cols)[None, :]
        return buf[idx].astype(np.float64)

    def gemm_strided_batched_ex(self, h, ta, tb, m, n, k, alpha, a, at, lda, sa, b, bt, ldb,
                                sb, beta, c, ct, ldc, sc, batch, compute, algo):  # fmt: skip
        self.calls += 1
        assert algo == cb.BLAS_DEFAULT_ALGO and at == bt == ct
        out = self.bufs[c - c % BASE]
        for i in range(batch):
            prod = self._read(a, ta, m, k, lda, sa, i) @ self._read(b, tb, k, n, ldb, sb, i)
            idx = c % BASE + i * sc + np.arange(m)[:, None] + np.arange(n)[None, :] * ldc
            out[idx] = prod


def strided(shape, strides, rng):
    """A float32 buffer and the array viewing it with ``strides`` (elements)."""
    span = 1 + sum((s - 1) * st for s, st in zip(shape, strides, strict=True))
    buf = rng.standard_normal(span).astype(np.float32)
    return buf, np.lib.stride_tricks.as_strided(buf, shape, [4 * s for s in strides])


LAYOUTS = {
    "packed": ((12, 20), (20, 1), (20, 8), (8, 1)),
    "transposed a": ((12, 20), (1, 12), (20, 8), (8, 1)),
    "transposed b": ((12, 20), (20, 1), (20, 8), (1, 20)),
    "sliced rows": ((12, 20), (30, 1), (20, 8), (8, 1)),
    "batched": ((3, 12, 20), (240, 20, 1), (3, 20, 8), (160, 1, 20)),
}


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_the_call_computes_the_row_major_product(name, monkeypatch):
    from nvmath.bindings import cublas

    sa, ta, sb, tb = LAYOUTS[name]
    rng = np.random.default_rng(0)
    (abuf, a), (bbuf, b) = strided(sa, ta, rng), strided(sb, tb, rng)
    out_shape = (*sa[:-1], sb[-1])
    out = np.zeros(out_shape, dtype=np.float32)
    fake = FakeBlas()
    for fn in ("set_stream", "set_workspace"):
        monkeypatch.setattr(cublas, fn, lambda *a: None)
    monkeypatch.setattr(cublas, "gemm_strided_batched_ex", fake.gemm_strided_batched_ex)
    monkeypatch.setattr(cb, "_blas_handle", lambda: 0)

    def lay(shape, strides):
        return Layout("f32", shape, strides)

    out_lay = lay(out_shape, tuple(s // 4 for s in out.strides))
    gemm = cb.BlasGemm(lt_problem(lay(sa, ta), lay(sb, tb), out_lay), "f32", 7, (0, 0))
    gemm.run((fake.put(1, abuf), fake.put(2, bbuf), fake.put(3, out)))
    assert fake.calls == 1
    np.testing.assert_allclose(out, a.astype(np.float64) @ b, rtol=1e-6, atol=1e-6)


def test_plans_refuse_an_unknown_choice_before_touching_the_device():
    from saturn.codegen.cublaslt import LtPlan

    a, b, out = Layout("f32", (8, 4), (4, 1)), Layout("f32", (4, 6), (6, 1)), None
    out = Layout("f32", (8, 6), (6, 1))
    with pytest.raises(GemmError, match="unknown cuBLAS choice"):
        LtPlan(a, b, out, "none", None, (0, 0, 0), 0, (0, 0), blas="sometimes")
    with pytest.raises(GemmError, match="unknown cuBLAS choice"):
        offer_blas(None, (0, 0, 0), (0, 0), blas="sometimes")


@pytest.mark.parametrize(
    "epilogue, precision, blas, asked",
    [
        ("none", "fp32", "timed", True),
        ("bias", "fp32", "timed", False),  # cuBLAS's classic API has no epilogue
        ("none", "tf32", "timed", False),  # a TF32 plan: cuBLAS would compute float32
        ("none", "tf32x3", "timed", False),  # three products and splits
        ("none", "fp32", "never", False),
    ],
)
def test_offer_blas_declines_what_cublas_does_not_compute_alike(
    epilogue, precision, blas, asked, monkeypatch
):
    """Only a float32 (or float64) plan with no epilogue gets cuBLAS's choice; the others
    are left as they are before cuBLAS is touched."""
    import types

    handles = []
    monkeypatch.setattr(cb, "_blas_handle", lambda: handles.append(1) or 0)
    monkeypatch.setattr(cb, "time_on_stream", lambda *a: 1.0)  # no device: equal times
    lay = Layout("f32", (8, 8), (8, 1))
    plan = types.SimpleNamespace(
        layouts=(lay, lay, lay, None),
        epilogue=epilogue,
        precision=precision,
        stream=0,
        candidates=8,
        autotune=True,
        timings={},
        blas=None,
        run=lambda ptrs: None,
    )
    offer_blas(plan, (256, 512, 768), (0, 0), blas)
    assert bool(handles) == asked and plan.blas is None


# --- on a GPU -----------------------------------------------------------------------------

GPU = "saturn:1"
DT = {torch.float32: "f32", torch.float64: "f64", torch.bfloat16: "bf16"}


def operands(dtype, name):
    torch.manual_seed(0)
    sa, ta, sb, tb = LAYOUTS[name]
    a = torch.randn(sa, dtype=torch.float64) / sa[-1] ** 0.5
    b = torch.randn(sb, dtype=torch.float64)
    da = torch.empty_strided(sa, ta, dtype=dtype, device=GPU)
    db = torch.empty_strided(sb, tb, dtype=dtype, device=GPU)
    da.copy_(a.to(dtype)), db.copy_(b.to(dtype))
    return a.to(dtype), b.to(dtype), da, db


def plan(kind, dtype, da, db, out, blas):
    from saturn.codegen.cublaslt import WORKSPACE_BYTES, LtPlan

    def lay(t):
        return Layout(DT[dtype], tuple(t.shape), tuple(t.stride()))

    ws = torch.empty(WORKSPACE_BYTES, dtype=torch.uint8, device=GPU)
    ptrs = (da.data_ptr(), db.data_ptr(), out.data_ptr())
    stream = torch.saturn.stream_handle(1)
    with torch.saturn.device(1):
        if kind == "lt":
            p = LtPlan(lay(da), lay(db), lay(out), "none", None, ptrs, stream,
                       (ws.data_ptr(), WORKSPACE_BYTES), blas=blas)  # fmt: skip
        else:
            p = GemmPlan(lay(da), lay(db), lay(out), "none", None, ptrs, stream)
            offer_blas(p, ptrs, (ws.data_ptr(), WORKSPACE_BYTES), blas)
        out.zero_()
        p.run(ptrs)
    torch.saturn.synchronize(1)
    return p, ws


@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["lt", "nvmath"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
@pytest.mark.parametrize("name", list(LAYOUTS))
def test_cublas_choice_gives_eagers_product(kind, dtype, name, monkeypatch):
    from saturn.codegen import cublaslt, gemm
    from saturn.codegen.gemm_tuning import Tunings

    if kind == "nvmath" and dtype == torch.bfloat16:
        pytest.skip("half products are cuBLASLt plans of their own (LtPlan)")
    fresh = Tunings("gemm")  # no choice from another test or the disk: every plan times
    monkeypatch.setattr(gemm, "TUNINGS", fresh)
    monkeypatch.setattr(cublaslt, "TUNINGS", fresh)
    a, b, da, db = operands(dtype, name)
    want = (a.float() @ b.float()).to(dtype) if dtype == torch.bfloat16 else a @ b
    tol = {"rtol": 1.6e-2, "atol": 1e-2} if dtype == torch.bfloat16 else {}
    for blas in ("always", "never", "timed"):
        out = torch.empty(want.shape, dtype=dtype, device=GPU)
        p, _ = plan(kind, dtype, da, db, out, blas)
        assert (p.blas is not None) == (blas == "always") or blas == "timed"
        if blas == "timed" and kind == "nvmath":
            assert {"cublas", "cublaslt"} <= set(p.timings)
        if blas == "timed" and kind == "lt":  # every candidate and cuBLAS's choice
            assert sorted(p.timings) == list(range(len(p.algos) + 1))
        torch.testing.assert_close(out.cpu(), want, **tol)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_compiled_product_on_cublas_is_captured_and_replayed(dtype, monkeypatch):
    """A compiled graph whose products run by cuBLAS's choice (forced) replays them in its
    CUDA graph with eager's CPU result at every call."""
    import functools

    from saturn import backend, runner_plans
    from saturn.codegen.cublaslt import LtPlan

    monkeypatch.setattr(runner_plans, "offer_blas", functools.partial(offer_blas, blas="always"))
    monkeypatch.setattr(runner_plans, "LtPlan", functools.partial(LtPlan, blas="always"))
    torch.manual_seed(1)
    a, b = torch.randn(3, 64, 48).to(dtype), (torch.randn(48, 40) / 7).to(dtype)
    want = torch.relu(a.float() @ b.float()).to(dtype) if dtype != torch.float32 else None
    want = torch.relu(a @ b) if want is None else want
    tol = {"rtol": 1.6e-2, "atol": 1e-2} if dtype == torch.bfloat16 else {}
    torch._dynamo.reset()
    before = backend.CACHE.compiles
    fn = torch.compile(lambda a, b: torch.relu(a @ b), backend="saturn", dynamic=False)
    for _ in range(4):
        torch.testing.assert_close(fn(a.to(GPU), b.to(GPU)).cpu(), want, **tol)
    n = backend.CACHE.compiles - before
    assert n == 1
    recipe = list(backend.CACHE.items.values())[-1].recipe
    plans = [p for _, p in recipe.runner.plans.values()]
    assert plans and all(p.blas is not None for p in plans)
    assert recipe.runner.replays >= 1
