"""The gradient of attention's fused op on saturn tensors without a GPU (``sdpa_grad``): the
math it falls back to equals CPU autograd (masks, causal band, grouped-query heads, a row
whose every key is masked, three-dimensional operands); eager and compiled backward passes
on saturn:0 equal eager CPU's; the compiled graph's fused branch (made to run here) calls
``saturn::sdpa_grad`` / ``saturn::sdpa_grad_bias``, whose reference ran; and the device's
choice keeps the math where the gradient kernel does not apply."""

from __future__ import annotations

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx
from torch.nn.functional import scaled_dot_product_attention as attention

from saturn import backend, sdpa_grad
from saturn.custom_ops import fallback_counts

REF = torch.device("saturn:0")
FUSED = torch.ops.aten._scaled_dot_product_fused_attention_overrideable
GRAD = "aten._scaled_dot_product_fused_attention_overrideable_backward.default"
TOL = dict(rtol=1e-5, atol=1e-5)

CASES = {  # (mask, causal, key/value heads, 3-D, key length)
    "plain": (None, False, 4, False, 16),
    "causal": (None, True, 4, False, 16),
    "float-mask": ("float", False, 4, False, 16),
    "bool-mask": ("bool", False, 4, False, 16),
    "gqa-causal": (None, True, 2, False, 16),
    "cross-lengths": ("float", False, 4, False, 24),
    "three-d": (None, True, 4, True, 16),
}


def operands(name: str):
    mask, causal, hk, three, sk = CASES[name]
    torch.manual_seed(0)
    q = torch.randn(2, 4, 16, 8)
    k, v = torch.randn(2, hk, sk, 8), torch.randn(2, hk, sk, 8)
    bias = None
    if mask == "float":
        bias = torch.randn(2, 1, 16, sk)
    elif mask == "bool":
        keep = torch.rand(2, 1, 1, sk) > 0.3
        bias = torch.zeros(2, 1, 1, sk).masked_fill(~keep, float("-inf"))
    if three:
        q, k, v = q[0], k[0], v[0]
    return q, k, v, bias, causal


@pytest.fixture
def kernels_on():
    """The fused gradient wherever it applies (by default only for float32 rows whose
    length is not a multiple of 4, decision 0132), the default again after."""
    before = sdpa_grad.MODE
    sdpa_grad.set_kernels("fused")
    yield
    sdpa_grad.set_kernels(before)


def fused_call(q, k, v, bias, causal):
    """The op aten's attention calls when the device chooses the fused path."""
    return FUSED(q, k, v, bias, is_causal=causal, scale=0.3)[0]


def cpu_grads(q, k, v, bias, causal, g):
    """CPU autograd of aten's attention (heads repeated as enable_gqa repeats them)."""
    xs = [t.clone().requires_grad_() for t in (q, k, v)]
    hq, hk = q.shape[-3], k.shape[-3]
    out = attention(*xs, attn_mask=bias, is_causal=causal, scale=0.3, enable_gqa=hq != hk)
    out.backward(g)
    return out.detach(), [x.grad for x in xs]


@pytest.mark.parametrize("name", list(CASES))
def test_the_math_gradients_are_autograds(name):
    q, k, v, bias, causal = operands(name)
    g = torch.randn(q.shape)
    _, want = cpu_grads(q, k, v, bias, causal, g)
    bq = [t.unsqueeze(0) if t.dim() == 3 else t for t in (q, k, v, g)]
    got = sdpa_grad.math_grads(bq[3], *bq[:3], bias, 0.3, causal)
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a.reshape(b.shape), b, **TOL)


def test_a_row_whose_every_key_is_masked_has_no_gradient():
    q, k, v, _, _ = operands("plain")
    bias = torch.zeros(2, 1, 16, 16)
    bias[:, :, 3] = float("-inf")
    dq, dk, dv = sdpa_grad.math_grads(torch.randn(q.shape), q, k, v, bias, 0.3, False)
    assert torch.equal(dq[:, :, 3], torch.zeros_like(dq[:, :, 3]))
    assert all(torch.isfinite(t).all() for t in (dq, dk, dv))


@pytest.mark.parametrize("name", list(CASES))
def test_eager_backward_on_saturn0_matches_eager_cpu(name):
    q, k, v, bias, causal = operands(name)
    g = torch.randn(q.shape)
    want_out, want = cpu_grads(q, k, v, bias, causal, g)
    xs = [t.to(REF).requires_grad_() for t in (q, k, v)]
    out = fused_call(*xs, None if bias is None else bias.to(REF), causal)
    out.backward(g.to(REF))
    torch.testing.assert_close(out.detach().cpu(), want_out, **TOL)
    for x, w in zip(xs, want, strict=True):
        assert x.grad.device == REF
        torch.testing.assert_close(x.grad.cpu(), w, **TOL)


def _compiled(fn, args):
    torch._dynamo.reset()
    before = len(backend.CACHE.fallbacks)
    out = torch.compile(fn, backend="saturn", dynamic=False)(*args)
    assert backend.CACHE.fallbacks[before:] == [], backend.CACHE.fallbacks[before:]
    return out


@pytest.mark.parametrize("fused", [False, True], ids=["math", "fused-branch"])
@pytest.mark.parametrize("name", ["causal", "float-mask", "gqa-causal", "cross-lengths"])
def test_compiled_backward_on_saturn0_matches_eager_cpu(name, fused, monkeypatch, kernels_on):
    """The joint graph's backward op decomposes into the math (saturn:0), or, where the
    gradient kernel takes the operands (saturn:0 made to count as a GPU: the layout checks
    are real), into ``saturn::sdpa_grad(_bias)``, whose reference runs here, counted."""
    if fused:
        monkeypatch.setattr(sdpa_grad, "on_fused_device", lambda *ts: True)
    op = "saturn::sdpa_grad_bias" if CASES[name][0] else "saturn::sdpa_grad"
    before = fallback_counts().get(op, 0)
    q, k, v, bias, causal = operands(name)
    g = torch.randn(q.shape)
    _, want = cpu_grads(q, k, v, bias, causal, g)
    xs = [t.to(REF).requires_grad_() for t in (q, k, v)]
    dbias = None if bias is None else bias.to(REF)

    def fn(q, k, v):
        return fused_call(q, k, v, dbias, causal) * 1.0

    out = _compiled(fn, xs)
    out.backward(g.to(REF))
    for x, w in zip(xs, want, strict=True):
        torch.testing.assert_close(x.grad.cpu(), w, **TOL)
    assert (fallback_counts().get(op, 0) > before) == fused
    torch._dynamo.reset()


def test_the_fused_branch_hands_the_kernel_expanded_heads_and_a_packed_mask(
    monkeypatch, kernels_on
):
    """The decomposition's custom op: k and v with q's heads, the mask packed to [B or 1,
    H or 1, Sq, Skv], a float32 ``like`` of the three gradients' sizes first."""
    monkeypatch.setattr(sdpa_grad, "on_fused_device", lambda *ts: True)
    q, k, v, bias, _ = operands("cross-lengths")
    k, v = k[:, :2], v[:, :2]  # grouped-query heads
    out = torch.randn(q.shape)
    g = torch.randn(q.shape)
    gm = make_fx(
        lambda *xs: sdpa_grad.decomposition(
            xs[0],
            *xs[1:4],
            xs[4],
            [True, True, True, False],
            xs[5],
            None,
            None,
            None,
            16,
            24,
            0.0,
            False,
            None,
            None,
            scale=0.3,
        )[:3]
    )(g, q, k, v, bias, out)
    calls = [n for n in gm.graph.nodes if "sdpa_grad" in str(n.target)]
    assert len(calls) == 1 and str(calls[0].target) == "saturn.sdpa_grad_bias.default"
    like, _, qt, kk, vv, _, b, scale = calls[0].args
    assert vv.meta["val"].shape == (2, 4, 24, 8)  # value heads expanded too
    assert like.meta["val"].shape == (2 * 4 * 16 * 8 + 2 * 2 * 4 * 24 * 8,)
    assert qt.meta["val"].shape == (2, 16, 4, 8) and kk.meta["val"].shape == (2, 4, 24, 8)
    assert b.meta["val"].shape == (2, 1, 16, 24) and b.meta["val"].is_contiguous()
    assert scale == 0.3


def test_the_switch_keeps_the_math_only_when_told(monkeypatch):
    """By default ("auto", decision 0132) the backward may run the kernel once the device
    chose the fused op; ``set_kernels("math")`` (``zoo.py --attention-grad math``) keeps
    aten's math even where a kernel would take the operands; an unknown mode is refused
    and changes nothing."""
    monkeypatch.setattr(sdpa_grad, "on_fused_device", lambda *ts: True)
    q, k, v, bias, _ = operands("float-mask")
    assert sdpa_grad.MODE == "auto"
    assert sdpa_grad._grad_operands(q, k, v, q, q, bias, 0.0) is not None
    sdpa_grad.set_kernels("math")
    try:
        assert sdpa_grad._grad_operands(q, k, v, q, q, bias, 0.0) is None
        with pytest.raises(ValueError, match="unknown attention gradient mode"):
            sdpa_grad.set_kernels("sometimes")
        assert sdpa_grad.MODE == "math"
    finally:
        sdpa_grad.set_kernels("auto")
    assert sdpa_grad._grad_operands(q, k, v, q, q, bias, 0.0) is not None


def test_dropout_and_a_mask_gradient_are_refused_plainly():
    q, k, v, bias, _ = operands("float-mask")
    args = (q, q, k, v, bias, [True] * 4, q, None, None, None, 16, 16)
    with pytest.raises(NotImplementedError, match="mask"):
        sdpa_grad.overrideable_backward(*args, 0.0, False, None, None)
    with pytest.raises(NotImplementedError, match="dropout"):
        sdpa_grad.overrideable_backward(*args[:5], [True] * 3, *args[6:], 0.1, False, None, None)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_the_device_keeps_the_math_where_the_gradient_kernel_does_not_apply(dtype):
    """saturn:0 keeps the math where a gradient is needed, in every dtype (the gradient
    kernels are a GPU's), as it did before they existed."""
    q = torch.randn(1, 2, 8, 8).to(dtype).to(REF).requires_grad_()
    g = make_fx(lambda x: attention(x, x, x))(q)
    targets = {str(n.target) for n in g.graph.nodes}
    assert "aten._scaled_dot_product_fused_attention_overrideable.default" not in targets
