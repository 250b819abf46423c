"""Identical products (a model's repeated layers) share one timed cuBLASLt choice: the
first plan times the candidates, the others take its choice, and the values are eager's.
GPU only (marker gpu)."""

from __future__ import annotations

import pytest
import torch

import saturn
from saturn import backend

pytestmark = pytest.mark.gpu
GPU = "saturn:1"


def repeated(model, x, dtype, library: str, fp32_tol: float) -> tuple[int, int, int]:
    """``model`` compiled for saturn:1 in ``dtype``: no graph or call uncompiled, the values
    eager's (float32 within ``fp32_tol``; bfloat16 within twice eager bfloat16's own distance
    from float32); returns the ``library`` choices timed and reused by the compile, and the
    steps that ran a plan another step built (``*_plans_shared``: convolutions, 0143)."""
    with torch.no_grad():
        want = model(x)
        ref = model.to(dtype)(x.to(dtype)).float()  # eager's own rounding, for bf16
        torch._dynamo.reset()
        before = saturn.stats()
        fallbacks = len(backend.CACHE.fallbacks), len(backend.CACHE.failed_calls)
        compiled = torch.compile(model.to(GPU), backend="saturn", dynamic=False)
        got = compiled(x.to(dtype).to(GPU)).float().cpu()
        after = saturn.stats()
    assert (len(backend.CACHE.fallbacks), len(backend.CACHE.failed_calls)) == fallbacks
    if dtype == torch.float32:
        torch.testing.assert_close(got, want, rtol=fp32_tol, atol=fp32_tol)
    else:
        torch.testing.assert_close(got, ref, rtol=0, atol=2 * (ref - want).abs().max().item())
    timed = after[f"{library}_tunings"] - before[f"{library}_tunings"]
    reused = after[f"{library}_tunings_reused"] - before[f"{library}_tunings_reused"]
    shared = after.get(f"{library}_plans_shared", 0) - before.get(f"{library}_plans_shared", 0)
    return timed, reused, shared


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_repeated_layers_time_their_product_once(dtype):
    torch.manual_seed(0)
    blocks = [torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.Tanh()) for _ in range(6)]
    model = torch.nn.Sequential(*blocks).eval()
    timed, reused, _ = repeated(model, torch.randn(64, 256), dtype, "gemm", 1e-5)
    # six identical products: one timed per alignment the memory plan gave the operands (the
    # arena's offsets), the rest reuse a choice
    assert reused >= 4, (timed, reused)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_repeated_convolutions_time_their_plan_once(dtype):
    """The same for cuDNN convolution plans, and since decision 0143 the built plan itself
    (``CONV_PLANS``): six identical 3x3 convolutions, one plan built and timed per
    alignment, the other steps running it; values as eager's (cuDNN may pick a Winograd or
    FFT algorithm for float32 with TF32 off: within 1e-4)."""
    torch.manual_seed(0)
    blocks = [
        torch.nn.Sequential(torch.nn.Conv2d(32, 32, 3, padding=1), torch.nn.ReLU())
        for _ in range(6)
    ]
    model = torch.nn.Sequential(*blocks).eval()
    timed, reused, shared = repeated(model, torch.randn(4, 32, 28, 28), dtype, "conv", 1e-4)
    # a step whose plan is shared neither builds nor looks up a choice: sharing, not the
    # timed choice's reuse, is what the repeated steps must show
    assert timed >= 1 and shared >= 4, (timed, reused, shared)
