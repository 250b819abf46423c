"""Attention's gradient kernels on a GPU (marker gpu): saturn's float32 kernel against CPU
autograd within float32's 1e-5 (plain, causal, additive and boolean masks, grouped-query
heads, odd lengths and head sizes, cross lengths, head size 128), cuDNN's bfloat16 backward
within bfloat16's rounding of the same, eager and compiled, with proof that the kernel ran
(its plan's launches, no fallback counted, the custom op in the compiled graph) and that
the plan takes the forward's log-sum-exp or recomputes it."""

from __future__ import annotations

import pytest
import torch
from torch.nn.functional import scaled_dot_product_attention as attention

from saturn import backend, sdpa_grad
from saturn.custom_ops import fallback_counts

pytestmark = pytest.mark.gpu
GPU = torch.device("saturn:1")
TOL = dict(rtol=1e-5, atol=1e-5)
# cuDNN rounds the probabilities and their gradients to bfloat16 before the products
HALF_TOL = dict(rtol=5e-2, atol=5e-2)
CASES = {  # (batch, heads, kv heads, Sq, Skv, head size, causal, mask)
    "plain": (2, 4, 4, 64, 64, 64, False, None),
    "causal": (2, 4, 4, 130, 130, 64, True, None),
    "float-mask": (2, 4, 4, 77, 77, 40, False, "float"),
    "bool-mask": (2, 4, 4, 96, 96, 32, False, "bool"),
    "gqa-causal": (1, 8, 2, 200, 200, 64, True, None),
    "cross": (2, 3, 3, 50, 197, 64, False, "float"),
    "deit": (4, 3, 3, 197, 197, 64, False, None),
    "wide-causal": (1, 2, 2, 300, 300, 128, True, None),
}


def operands(name: str):
    b, h, hk, sq, skv, d, causal, mask = CASES[name]
    torch.manual_seed(0)
    q = torch.randn(b, h, sq, d)
    k, v = torch.randn(b, hk, skv, d), torch.randn(b, hk, skv, d)
    bias = None
    if mask == "float":
        bias = torch.randn(b, 1, sq, skv)
    elif mask == "bool":
        bias = torch.rand(b, 1, 1, skv) > 0.3
    return q, k, v, bias, causal


def grads(q, k, v, bias, causal, g, device, dtype=torch.float32):
    """(out, dq, dk, dv) on ``device`` in ``dtype``, as float32 on the CPU (the CPU's from
    operands rounded to ``dtype`` first, in float32)."""
    if device == "cpu":
        q, k, v, g = (t.to(dtype).float() for t in (q, k, v, g))
        bias = bias if bias is None or bias.dtype == torch.bool else bias.to(dtype).float()
        dtype = torch.float32
    xs = [t.detach().to(device, dtype).requires_grad_() for t in (q, k, v)]
    m = None if bias is None else bias.to(device, dtype if bias.is_floating_point() else None)
    out = attention(*xs, attn_mask=m, is_causal=causal, enable_gqa=q.shape[1] != k.shape[1])
    out.backward(g.to(device, dtype))
    return [out.detach().cpu().float()] + [x.grad.cpu().float() for x in xs]


@pytest.fixture(autouse=True)
def kernels_on():
    """The fused gradient runs by default only for float32 rows whose length is not a
    multiple of 4 (decision 0132); these tests run it wherever it applies, and restore the
    default after."""
    before = sdpa_grad.MODE
    sdpa_grad.set_kernels("fused")
    yield
    sdpa_grad.set_kernels(before)


def kernel_runs() -> int:
    return sum(p[0].runs for p in sdpa_grad._PLANS.values() if not isinstance(p, str))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("name", list(CASES))
def test_eager_gradients_run_the_kernel_and_match_cpu(name, dtype):
    q, k, v, bias, causal = operands(name)
    g = torch.randn(q.shape)
    want = grads(q, k, v, bias, causal, g, "cpu", dtype)
    runs, fb = kernel_runs(), fallback_counts()
    got = grads(q, k, v, bias, causal, g, GPU, dtype)
    assert kernel_runs() == runs + 1 and fallback_counts() == fb
    tol = TOL if dtype == torch.float32 else HALF_TOL
    for a, b, what in zip(got, want, ("out", "dq", "dk", "dv"), strict=True):
        torch.testing.assert_close(a, b, **tol, msg=lambda m, w=what: f"{w}: {m}")


@pytest.mark.parametrize("given", [True, False], ids=["lse-given", "lse-recomputed"])
def test_the_plan_with_and_without_the_forwards_log_sum_exp(given):
    q, k, v, bias, causal = operands("causal")
    g = torch.randn(q.shape)
    _, dq, dk, dv = grads(q, k, v, bias, causal, g, "cpu")
    dev = [t.to(GPU) for t in (q, k, v, g)]
    out = attention(*dev[:3], is_causal=True)
    lse = None
    if given:
        lse = torch.logsumexp(
            (q @ k.transpose(-2, -1) / 8).masked_fill(~torch.ones(130, 130).bool().tril(), -1e30),
            -1,
        ).to(GPU)
    flat = torch.empty(3 * q.numel(), device=GPU)
    pieces = sdpa_grad._pieces(flat, *dev[:3])
    assert sdpa_grad.run_grad(*pieces, *dev[:3], out, dev[3], None, 0.125, True, lse)
    for a, b in zip(pieces, (dq, dk, dv), strict=True):
        torch.testing.assert_close(a.cpu(), b, **TOL)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("name", ["causal", "float-mask", "gqa-causal", "deit"])
def test_compiled_training_runs_the_kernel_and_matches_cpu(name, dtype):
    q, k, v, bias, causal = operands(name)
    g = torch.randn(q.shape)
    want = grads(q, k, v, bias, causal, g, "cpu", dtype)
    m = None if bias is None else bias.to(GPU, dtype)

    def fn(q, k, v):
        o = attention(q, k, v, attn_mask=m, is_causal=causal, enable_gqa=q.shape[1] != k.shape[1])
        return o * 1.0

    torch._dynamo.reset()
    before = len(backend.CACHE.fallbacks)
    op = "saturn::sdpa_grad_bias" if bias is not None else "saturn::sdpa_grad"
    runs, fb = kernel_runs(), fallback_counts().get(op, 0)
    xs = [t.to(GPU, dtype).requires_grad_() for t in (q, k, v)]
    out = torch.compile(fn, backend="saturn", dynamic=False)(*xs)
    out.backward(g.to(GPU, dtype))
    assert backend.CACHE.fallbacks[before:] == [], backend.CACHE.fallbacks[before:]
    assert kernel_runs() > runs and fallback_counts().get(op, 0) == fb
    got = [out.detach().cpu().float()] + [x.grad.cpu().float() for x in xs]
    tol = TOL if dtype == torch.float32 else HALF_TOL
    for a, b, what in zip(got, want, ("out", "dq", "dk", "dv"), strict=True):
        torch.testing.assert_close(a, b, **tol, msg=lambda m, w=what: f"{w}: {m}")
    torch._dynamo.reset()


@pytest.mark.parametrize(
    "name, dtype, fused",
    [
        ("deit", torch.float32, True),  # 197 tokens: the math's products are unaligned
        ("float-mask", torch.float32, True),  # 77
        ("cross", torch.float32, True),  # 50 queries over 197 keys
        ("plain", torch.float32, False),  # 64: the math
        ("bool-mask", torch.float32, False),  # 96
        ("deit", torch.bfloat16, False),  # half types keep the math by default
    ],
)
def test_the_default_runs_the_kernel_only_for_unaligned_float32_rows(name, dtype, fused):
    """Decision 0132's default ("auto"): the device takes the fused op with a gradient for
    float32 rows whose length is not a multiple of 4 and keeps aten's math elsewhere; the
    gradients match the CPU's either way."""
    sdpa_grad.set_kernels("auto")
    q, k, v, bias, causal = operands(name)
    g = torch.randn(q.shape)
    want = grads(q, k, v, bias, causal, g, "cpu", dtype)
    runs = kernel_runs()
    got = grads(q, k, v, bias, causal, g, GPU, dtype)
    assert kernel_runs() == runs + (1 if fused else 0)
    tol = TOL if dtype == torch.float32 else HALF_TOL
    for a, b, what in zip(got, want, ("out", "dq", "dk", "dv"), strict=True):
        torch.testing.assert_close(a, b, **tol, msg=lambda m, w=what: f"{w}: {m}")
