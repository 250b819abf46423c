"""Every tile of saturn's float32 attention kernel (``codegen/flash_attention.py``'s CUDA-core
tiles, ``flash_mma.py``'s tensor-core ones) on a GPU, whichever ``config`` would pick for
these shapes: causal, additive and boolean masks read through broadcast strides, grouped-query
heads, lengths that are not a multiple of any tile, the row log-sum-exp. Values against
eager CPU in float32 (the tests' 1e-5), and the plan's launch counter proves it ran."""

from __future__ import annotations

import zlib

import pytest
import torch
from torch.nn.functional import scaled_dot_product_attention as attention

from saturn.codegen.flash_attention import FlashPlan, MmaTile, Tile
from saturn.codegen.gemm import Layout

pytestmark = pytest.mark.gpu

TILES = {
    "cuda-8x8": Tile(8, 8),
    "cuda-4x4": Tile(4, 4),
    "mma-2x16-rows": MmaTile(4, 32, blocks=2, mtiles=2),
    "mma-16-rows": MmaTile(4, 32, blocks=3, mtiles=1),
    "mma-2x16-rows-one-block": MmaTile(4, 32, blocks=1, mtiles=2),
    "mma-64-keys": MmaTile(4, 64),
    "mma-8-warps-2x16-rows": MmaTile(8, 32, blocks=1, mtiles=2),
}
# (batch, query heads, key heads, Sq, Skv, d, causal, mask)
CASES = {
    "plain": (2, 4, 4, 64, 64, 64, False, None),
    "causal-odd": (2, 4, 4, 77, 77, 40, True, None),
    "float-mask": (2, 4, 4, 70, 90, 64, False, "float"),
    "bool-mask": (2, 4, 4, 33, 140, 64, False, "bool"),
    "gqa-causal-long": (1, 8, 2, 300, 300, 128, True, None),
    "head-128-mask": (2, 2, 2, 129, 65, 128, False, "float"),
    "tiny-head": (3, 2, 1, 19, 23, 8, True, None),
}


def layout(t: torch.Tensor) -> Layout:
    return Layout("f32", tuple(t.shape), tuple(t.stride()))


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("tile", list(TILES))
def test_each_tile_is_the_math(tile, case):
    b, h, hk, sq, skv, d, causal, mask = CASES[case]
    if isinstance(TILES[tile], Tile) and (d > 64) != (TILES[tile].rows == 4):
        pytest.skip("config gives the CUDA-core tiles by head size: 8 x 8 up to 64, 4 x 4 above")
    gen = torch.Generator().manual_seed(zlib.crc32(case.encode()))  # the same in every process
    q = torch.randn(b, h, sq, d, generator=gen)
    k, v = (torch.randn(b, hk, skv, d, generator=gen) for _ in range(2))
    bias = None
    if mask == "float":
        bias = torch.randn(b, 1, sq, skv, generator=gen).expand(b, h, sq, skv)
    elif mask == "bool":  # masked keys as -inf; one row with every key masked is 0
        keep = torch.rand(b, 1, 1, skv, generator=gen) > 0.3
        bias = torch.zeros(b, 1, 1, skv).masked_fill(~keep, float("-inf")).expand(b, h, sq, skv)
    scale = d**-0.5
    g = h // hk
    kr, vr = (x.repeat_interleave(g, 1) for x in (k, v))
    want = attention(q, kr, vr, attn_mask=bias, is_causal=causal, scale=scale)
    scores = (q.double() @ kr.double().transpose(-1, -2)) * scale
    if bias is not None:
        scores = scores + bias.double()
    if causal:
        scores = scores.masked_fill(torch.ones(sq, skv).triu(1).bool(), float("-inf"))
    want_lse = torch.logsumexp(scores, -1).float()

    cq, ck, cv = (x.cuda() for x in (q, k, v))
    out = torch.empty_like(cq)
    lse = torch.empty(b, h, sq, device="cuda")
    cb = bias.cuda() if bias is not None else None
    stream = torch.cuda.current_stream().cuda_stream
    plan = FlashPlan(
        *map(layout, (cq, ck, cv, out)),
        scale,
        stream,
        bias=layout(cb) if cb is not None else None,
        causal=causal,
        stats=True,
        tile=TILES[tile],
    )
    ptrs = [x.data_ptr() for x in (cq, ck, cv, out)]
    ptrs += [cb.data_ptr()] if cb is not None else []
    plan.run((*ptrs, lse.data_ptr()))
    torch.cuda.synchronize()
    assert plan.runs == 1
    torch.testing.assert_close(out.cpu(), want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(lse.cpu(), want_lse, rtol=1e-5, atol=1e-5)
