"""``saturn::attention`` on the GPU (marker gpu): one cuDNN kernel over saturn tensors,
heads read in place through their strides, against the unfused product on the CPU."""

from __future__ import annotations

import pytest
import torch

import saturn
from saturn.custom_ops import fallback_counts
from saturn.fused_attention import _PLANS, fused_attention_takes, unfused

pytestmark = pytest.mark.gpu
GPU = torch.device("saturn:1")
HALVES = [torch.float16, torch.bfloat16]
# the fused kernel rounds the probabilities once, the unfused product its scores as well
TOL = {torch.float16: (4e-3, 2e-3), torch.bfloat16: (3e-2, 1.6e-2)}


def heads(b, s, h, d, dtype, seed=0):
    """q, k, v as an encoder reads them: [B, H, S, D] views of one [B, S, 3 H D] projection."""
    torch.manual_seed(seed)
    proj = torch.randn(b, s, 3 * h * d).to(dtype)
    return proj, [
        proj[..., i * h * d : (i + 1) * h * d].reshape(b, s, h, d).transpose(1, 2) for i in range(3)
    ]


@pytest.mark.parametrize("dtype", HALVES)
@pytest.mark.parametrize("shape", [(2, 16, 4, 8), (3, 77, 2, 64), (1, 130, 8, 128)])
def test_fused_attention_reads_strided_heads_and_matches_the_unfused_product(dtype, shape):
    b, s, h, d = shape
    proj, (q, k, v) = heads(b, s, h, d, dtype)
    dproj = proj.to(GPU)
    dq, dk, dv = (
        dproj[..., i * h * d : (i + 1) * h * d].reshape(b, s, h, d).transpose(1, 2)
        for i in range(3)
    )
    assert fused_attention_takes(dq, dk, dv)
    fb, cfb = saturn.fallback_counts(), fallback_counts()
    got = torch.ops.saturn.attention(dq, dk, dv, d**-0.5)
    assert got.device == GPU and got.shape == (b, h, s, d) and got.dtype == dtype
    # the fused kernel ran: no fallback counted, and no plan was refused (a refusal is
    # kept as its reason and counted)
    assert saturn.fallback_counts() == fb and fallback_counts() == cfb
    assert not [v for v in _PLANS.values() if isinstance(v, str)]
    want = unfused(q.float(), k.float(), v.float(), d**-0.5)
    rtol, atol = TOL[dtype]
    torch.testing.assert_close(got.cpu().float(), want, rtol=rtol, atol=atol)
    # the eager CPU result in the half type is as far from the float32 one
    err = (got.cpu().float() - want).abs().max().item()
    ref = (unfused(q, k, v, d**-0.5).float() - want).abs().max().item()
    assert err <= max(2 * ref, atol), (err, ref)


def test_float32_attention_on_the_gpu_runs_saturns_kernel():
    """Float32 runs saturn's own kernel (codegen/flash_attention.py: a FlashPlan launched,
    nothing counted); a head dimension it does not take (12: not a multiple of 8) runs the
    reference, counted."""
    from saturn.codegen.flash_attention import FlashPlan

    def runs() -> int:
        plans = [p[0] for p in _PLANS.values() if not isinstance(p, str)]
        return sum(p.runs for p in plans if isinstance(p, FlashPlan))

    _, (q, k, v) = heads(2, 16, 4, 8, torch.float32)
    dq, dk, dv = (t.to(GPU) for t in (q, k, v))
    assert fused_attention_takes(dq, dk, dv)
    before, n = fallback_counts().get("saturn::attention", 0), runs()
    got = torch.ops.saturn.attention(dq, dk, dv, 0.3)
    assert fallback_counts().get("saturn::attention", 0) == before and runs() == n + 1
    torch.testing.assert_close(got.cpu(), unfused(q, k, v, 0.3), rtol=1e-5, atol=1e-5)
    _, (q, k, v) = heads(2, 16, 4, 12, torch.float32)
    dq, dk, dv = (t.to(GPU) for t in (q, k, v))
    assert not fused_attention_takes(dq, dk, dv)
    got = torch.ops.saturn.attention(dq, dk, dv, 0.3)
    assert fallback_counts()["saturn::attention"] == before + 1 and runs() == n + 1
    torch.testing.assert_close(got.cpu(), unfused(q, k, v, 0.3), rtol=1e-5, atol=1e-5)
