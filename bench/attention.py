"""Attention on saturn GPU tensors: ``saturn::attention`` (one cuDNN kernel, decision 0033)
against PyTorch's ``scaled_dot_product_attention`` on CUDA tensors, bfloat16, eager, in one
process. (saturn's unfused eager product is not timed: its softmax is the CPU fallback.)
A float32 table comes first: saturn's own kernel against PyTorch's memory-efficient one.
A second table times ``F.scaled_dot_product_attention`` itself on saturn tensors (the fused
op the device chooses, decision 0061), causal and with grouped-query heads, against the same
call on CUDA tensors. The last table times attention's gradient (decision 0128: saturn's
float32 kernel, cuDNN's backward for bfloat16) against PyTorch's memory-efficient (float32)
and flash (bfloat16) backward ops, called directly (no autograd: CUDA autograd cannot run in
a process that imported saturn yet), each given its own forward's output and log-sum-exp.

What is timed: wall time of one call plus a device synchronize, median of REPEATS calls
after warm-up (the first call of a layout plans), q, k, v as [B, H, S, D] views of one
packed [B, S, 3 H D] projection (an encoder's heads, read in place by both kernels).

    python bench/attention.py [grad]     (on a GPU machine; grad: the gradient table only)
"""

from __future__ import annotations

import torch
from timing import median_us, pipelined_us  # bench/timing.py (this script's folder)

import saturn  # noqa: F401

GPU = "saturn:1"
SHAPES = ((8, 128, 8, 64), (32, 512, 8, 128), (4, 2048, 16, 64))  # B, S, H, D
REPEATS = 30


def heads(proj: torch.Tensor, b: int, s: int, h: int, d: int):
    return [
        proj[..., i * h * d : (i + 1) * h * d].reshape(b, s, h, d).transpose(1, 2) for i in range(3)
    ]


def row(b: int, s: int, h: int, d: int) -> str:
    torch.manual_seed(0)
    proj = torch.randn(b, s, 3 * h * d).to(torch.bfloat16)
    cq, ck, cv = heads(proj.cuda(), b, s, h, d)
    sq, sk, sv = heads(proj.to(GPU), b, s, h, d)
    scale = d**-0.5

    def torch_call():
        return torch.nn.functional.scaled_dot_product_attention(cq, ck, cv, scale=scale)

    def fused_call():
        return torch.ops.saturn.attention(sq, sk, sv, scale)

    t_torch = median_us(torch_call, torch.cuda.synchronize, REPEATS)
    t_fused = median_us(fused_call, lambda: torch.saturn.synchronize(GPU), REPEATS)
    err = (fused_call().cpu().float() - torch_call().cpu().float()).abs().max().item()
    return f"{f'{b}x{s}x{h}x{d}':>18s} {t_torch:14.1f} {t_fused:16.1f} {err:20.2e}"


CAUSAL_SHAPES = ((8, 512, 16, 64, 16), (4, 2048, 32, 128, 8), (1, 4096, 32, 128, 8))


def sdpa_row(b: int, s: int, h: int, d: int, hk: int) -> str:
    """F.scaled_dot_product_attention(is_causal=True, enable_gqa=hk < h) on both devices."""
    torch.manual_seed(0)
    q = torch.randn(b, h, s, d).to(torch.bfloat16)
    k, v = (torch.randn(b, hk, s, d).to(torch.bfloat16) for _ in range(2))
    c = [t.cuda() for t in (q, k, v)]
    g = [t.to(GPU) for t in (q, k, v)]
    f = torch.nn.functional.scaled_dot_product_attention
    gqa = hk < h

    def torch_call():
        return f(*c, is_causal=True, enable_gqa=gqa)

    def saturn_call():
        return f(*g, is_causal=True, enable_gqa=gqa)

    t_torch = median_us(torch_call, torch.cuda.synchronize, REPEATS)
    t_saturn = median_us(saturn_call, lambda: torch.saturn.synchronize(GPU), REPEATS)
    err = (saturn_call().cpu().float() - torch_call().cpu().float()).abs().max().item()
    shape = f"{b}x{s}x{h}/{hk}x{d}"
    return f"{shape:>20s} {t_torch:14.1f} {t_saturn:16.1f} {err:20.2e}"


# float32 (issue 31: faster than PyTorch's float32 memory-efficient attention): timm/ViT
# encoders at 224 px (197 tokens), BERT-sized and longer sequences, causal decoders
F32_SHAPES = (
    (32, 197, 3, 64, False),
    (32, 197, 12, 64, False),
    (8, 512, 12, 64, False),
    (4, 1024, 16, 64, True),
    (2, 2048, 16, 128, True),
    (1, 4096, 16, 64, True),
)


def f32_row(b: int, s: int, h: int, d: int, causal: bool) -> str:
    """F.scaled_dot_product_attention in float32 on saturn tensors (saturn's own kernel,
    codegen/flash_attention.py) against CUDA tensors with PyTorch's memory-efficient
    kernel forced (what it picks for float32), TF32 off. Timed as 20 calls back to back
    and one synchronize, per call (``pipelined_us``): the device time where it exceeds the
    host's (saturn's eager call costs about 150 us of host time; compiled graphs replay)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    torch.manual_seed(0)
    proj = torch.randn(b, s, 3 * h * d)
    cq, ck, cv = heads(proj.cuda(), b, s, h, d)
    sq, sk, sv = heads(proj.to(GPU), b, s, h, d)
    f = torch.nn.functional.scaled_dot_product_attention

    def torch_call():
        with sdpa_kernel(SDPBackend.EFFICIENT_ATTENTION):
            return f(cq, ck, cv, is_causal=causal)

    def saturn_call():
        return f(sq, sk, sv, is_causal=causal)

    t_torch = pipelined_us(torch_call, torch.cuda.synchronize, REPEATS)
    t_saturn = pipelined_us(saturn_call, lambda: torch.saturn.synchronize(GPU), REPEATS)
    got, want = saturn_call().cpu(), torch_call().cpu()
    err = (got - want).abs().max().item()
    ref = f(*heads(proj.double(), b, s, h, d), is_causal=causal) if b * s * h <= 2**17 else None
    err64 = (got.double() - ref).abs().max().item() if ref is not None else float("nan")
    shape = f"{b}x{s}x{h}x{d}{' causal' if causal else ''}"
    return (
        f"{shape:>22s} {t_torch:14.1f} {t_saturn:12.1f} {t_torch / t_saturn:8.2f} "
        f"{err:12.2e} {err64:12.2e}"
    )


GRAD_SHAPES = (  # B, S, H, D, causal: DeiT-tiny's heads, an encoder's, a decoder's
    (32, 197, 3, 64, False),
    (8, 512, 12, 64, False),
    (4, 1024, 16, 64, True),
    (2, 2048, 16, 128, True),
)


def grad_row(b: int, s: int, h: int, d: int, causal: bool, dtype: torch.dtype) -> str:
    """dq, dk, dv of attention on saturn tensors (``sdpa_grad.run_grad`` with the forward's
    log-sum-exp, as an eager backward runs it) against PyTorch's backward op on CUDA
    tensors; ``pipelined_us`` per call, and the largest difference of the three gradients."""
    from saturn import sdpa_grad

    torch.manual_seed(0)
    q, k, v, g = (torch.randn(b, h, s, d).to(dtype) for _ in range(4))
    cq, ck, cv, cg = (t.cuda() for t in (q, k, v, g))
    scale = d**-0.5
    aten = torch.ops.aten
    if dtype == torch.float32:
        out, lse, seed, off = aten._scaled_dot_product_efficient_attention(
            cq, ck, cv, None, True, 0.0, causal, scale=scale
        )
        mask = [True, True, True, False]

        def torch_call():
            return aten._scaled_dot_product_efficient_attention_backward(
                cg, cq, ck, cv, None, out, lse, seed, off, 0.0, mask, causal, scale=scale
            )[:3]
    else:
        out, lse, cq_, ck_, mq, mk, seed, off, _ = aten._scaled_dot_product_flash_attention(
            cq, ck, cv, 0.0, causal, False, scale=scale
        )

        def torch_call():
            return aten._scaled_dot_product_flash_attention_backward(
                cg, cq, ck, cv, out, lse, cq_, ck_, mq, mk, 0.0, causal, seed, off, scale=scale
            )

    sq, sk, sv, sg = (t.to(GPU) for t in (q, k, v, g))
    so, slse = aten._scaled_dot_product_fused_attention_overrideable(
        sq, sk, sv, None, 0.0, causal, scale=scale
    )[:2]  # the fused forward's output and log-sum-exp, as an eager backward is given them
    flat = torch.empty(3 * q.numel(), dtype=dtype, device=GPU)
    pieces = sdpa_grad._pieces(flat, sq, sk, sv)

    def saturn_call():
        if not sdpa_grad.run_grad(*pieces, sq, sk, sv, so, sg, None, scale, causal, slse):
            raise RuntimeError("the gradient kernel refused these operands")
        return pieces

    t_torch = pipelined_us(torch_call, torch.cuda.synchronize, REPEATS)
    t_saturn = pipelined_us(saturn_call, lambda: torch.saturn.synchronize(GPU), REPEATS)
    err = max(
        (a.cpu().float() - b.cpu().float()).abs().max().item()
        for a, b in zip(saturn_call(), torch_call(), strict=True)
    )
    shape = f"{b}x{s}x{h}x{d}{' causal' if causal else ''}"
    name = "f32" if dtype == torch.float32 else "bf16"
    times = f"{t_torch:14.1f} {t_saturn:12.1f} {t_torch / t_saturn:8.2f}"
    return f"{shape:>22s} {name:>5s} {times} {err:12.2e}"


def grad_table() -> None:
    print("attention's gradient (dq, dk, dv), eager, given the forward's output and statistics")
    print(
        f"{'B x S x H x D':>22s} {'dtype':>5s} {'torch us':>14s} {'saturn us':>12s} "
        f"{'x torch':>8s} {'max |s - t|':>12s}"
    )
    for dtype in (torch.float32, torch.bfloat16):
        for shape in GRAD_SHAPES:
            print(grad_row(*shape, dtype), flush=True)


if __name__ == "__main__":
    import sys

    torch.backends.cuda.matmul.allow_tf32 = False
    print(f"GPU: {torch.cuda.get_device_name(0)}, torch {torch.__version__}")
    if sys.argv[1:] == ["grad"]:
        grad_table()
        sys.exit(0)
    print("F.scaled_dot_product_attention, float32, eager")
    print(
        f"{'B x S x H x D':>22s} {'torch mem-eff':>14s} {'saturn us':>12s} {'x torch':>8s} "
        f"{'|s - torch|':>12s} {'|s - f64|':>12s}"
    )
    for shape in F32_SHAPES:
        print(f32_row(*shape))
    print()
    print(
        f"{'B x S x H x D':>18s} {'torch CUDA us':>14s} {'saturn fused us':>16s} "
        f"{'max |fused - torch|':>20s}"
    )
    for shape in SHAPES:
        print(row(*shape))
    print()
    print("F.scaled_dot_product_attention(is_causal=True), bfloat16, eager")
    print(
        f"{'B x S x H/Hkv x D':>20s} {'torch CUDA us':>14s} {'saturn us':>16s} "
        f"{'max |saturn - torch|':>20s}"
    )
    for shape in CAUSAL_SHAPES:
        print(sdpa_row(*shape))
    print()
    grad_table()
