"""``attention`` on a GPU (marker gpu): half types run one fused cuDNN
kernel, eager and compiled (causal, additive and boolean masks, grouped-query heads), with
the row log-sum-exp aten's op returns; values against eager CPU in float32, and proof that
the fused kernel ran (no fallback counted, no plan refused, one Custom step per attention
and no score matrix in the compiled program)."""

from __future__ import annotations

import pytest
import torch
from torch.nn.functional import scaled_dot_product_attention as attention

import saturn
from saturn import backend, sdpa
from saturn.custom_ops import fallback_counts

pytestmark = pytest.mark.gpu
GPU = torch.device("saturn:1")
HALVES = [torch.float16, torch.bfloat16]
DTYPES = [*HALVES, torch.float32]  # float32: saturn's own kernel (codegen/flash_attention.py)
# the fused kernel rounds the probabilities once before the second product (as PyTorch's
# fused CUDA kernels do), the math only its result; float32 sums in another order
TOL = {torch.float16: (4e-3, 2e-3), torch.bfloat16: (3e-2, 1.6e-2), torch.float32: (1e-5, 1e-5)}
CASES = {
    "plain": ({}, None, 8),
    "causal": ({"is_causal": True}, None, 8),
    "float-mask": ({}, "float", 8),
    "bool-mask": ({}, "bool", 8),
    "gqa-causal": ({"is_causal": True, "enable_gqa": True}, None, 2),
    "long-causal": ({"is_causal": True}, None, 8),
    "odd-lengths": ({}, "float", 8),
}


def case(name: str, dtype):
    kwargs, mask, hk = CASES[name]
    s, d = {"long-causal": (300, 128), "odd-lengths": (77, 40)}.get(name, (64, 64))
    torch.manual_seed(0)
    q = torch.randn(2, 8, s, d).to(dtype)
    k, v = (torch.randn(2, hk, s, d).to(dtype) for _ in range(2))
    args = [q, k, v]
    if mask == "float":
        args.append(torch.randn(2, 1, s, s).to(dtype))
    elif mask == "bool":
        args.append(torch.rand(2, 1, 1, s) > 0.3)
    return args, kwargs


def cpu_reference(args, kwargs):
    xs = [a.float() if a.is_floating_point() else a for a in args]
    return attention(*xs, **kwargs)


def no_refused_plans() -> bool:
    return not [v for v in sdpa._PLANS.values() if isinstance(v, str)]


def flash_runs() -> int:
    """Calls of saturn's float32 kernel so far (its plans count their runs)."""
    from saturn.codegen.flash_attention import FlashPlan

    plans = [v[0] for v in sdpa._PLANS.values() if not isinstance(v, str)]
    return sum(p.runs for p in plans if isinstance(p, FlashPlan))


@pytest.mark.parametrize("name", list(CASES))
@pytest.mark.parametrize("dtype", DTYPES)
def test_eager_attention_runs_the_fused_kernel(name, dtype):
    args, kwargs = case(name, dtype)
    fb, cfb, runs = saturn.fallback_counts(), fallback_counts(), flash_runs()
    got = attention(*(a.to(GPU) for a in args), **kwargs)
    assert saturn.fallback_counts() == fb and fallback_counts() == cfb and no_refused_plans()
    assert flash_runs() == runs + (dtype == torch.float32)
    rtol, atol = TOL[dtype]
    torch.testing.assert_close(got.cpu().float(), cpu_reference(args, kwargs), rtol=rtol, atol=atol)


@pytest.mark.parametrize("dtype", DTYPES)
def test_the_fused_kernels_log_sum_exp_is_the_rows(dtype):
    args, _ = case("causal", dtype)
    q, k, v = (a.to(GPU) for a in args)
    res = torch.ops.aten._scaled_dot_product_fused_attention_overrideable(q, k, v, is_causal=True)
    want = sdpa.log_sum_exp(*(a.float() for a in args[:2]), None, 64**-0.5, True)
    torch.testing.assert_close(res[1].cpu(), want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("name", ["causal", "float-mask", "bool-mask", "gqa-causal"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_compiled_attention_is_one_fused_step(name, dtype):
    args, kwargs = case(name, dtype)
    dargs = [a.to(GPU) for a in args]

    def fn(*xs):
        return attention(*xs, **kwargs) * 2

    torch._dynamo.reset()
    cfn = torch.compile(fn, backend="saturn", dynamic=False)
    before = len(backend.CACHE.fallbacks)
    cfn(*dargs)
    fb, cfb = saturn.fallback_counts(), fallback_counts()
    got = cfn(*dargs)
    assert backend.CACHE.fallbacks[before:] == []
    assert saturn.fallback_counts() == fb and fallback_counts() == cfb and no_refused_plans()
    recipe = list(backend.CACHE.items.values())[-1].recipe
    prog = recipe.program
    assert prog.count("host") == 0 and recipe.last.crossings == 0, prog.to_text()
    fused = [k for k in prog.kernels if k.kind == "custom" and "sdpa" in k.attrs["name"]]
    assert len(fused) == 1, prog.to_text()
    assert "rows" not in [k.kind for k in prog.kernels]  # no softmax over written scores
    rtol, atol = TOL[dtype]
    torch.testing.assert_close(
        got.cpu().float(), 2 * cpu_reference(args, kwargs), rtol=rtol, atol=2 * atol
    )
    torch._dynamo.reset()


def test_float32_attention_runs_saturns_kernel_and_declines_what_it_cannot_take():
    """Float32 runs saturn's own kernel (a FlashPlan planned, nothing counted); a head
    dimension over 128 or not a multiple of 8, or dropout, keeps aten's math (no plan)."""
    args, kwargs = case("causal", torch.float32)
    runs = flash_runs()
    got = attention(*(a.to(GPU) for a in args), **kwargs)
    assert flash_runs() == runs + 1
    torch.testing.assert_close(got.cpu(), cpu_reference(args, kwargs), rtol=1e-5, atol=1e-5)
    torch.manual_seed(1)
    for d, dropout in ((136, 0.0), (20, 0.0), (64, 0.5)):
        q, k, v = (torch.randn(1, 2, 16, d) for _ in range(3))
        runs, n = flash_runs(), len(sdpa._PLANS)
        got = attention(q.to(GPU), k.to(GPU), v.to(GPU), dropout_p=dropout)
        assert flash_runs() == runs and len(sdpa._PLANS) == n, d
        if not dropout:
            torch.testing.assert_close(got.cpu(), attention(q, k, v), rtol=1e-5, atol=1e-5)


def test_float32_rows_with_every_key_masked_are_zero_as_in_the_math():
    torch.manual_seed(3)
    q, k, v = (torch.randn(2, 4, 40, 64) for _ in range(3))
    mask = torch.rand(2, 1, 40, 40) > 0.5
    mask[:, :, 5] = False  # row 5 sees no key
    runs = flash_runs()
    got = attention(q.to(GPU), k.to(GPU), v.to(GPU), attn_mask=mask.to(GPU))
    want = attention(q, k, v, attn_mask=mask)
    assert flash_runs() == runs + 1 and torch.equal(got.cpu()[:, :, 5], torch.zeros(2, 4, 64))
    torch.testing.assert_close(got.cpu(), want, rtol=1e-5, atol=1e-5)
