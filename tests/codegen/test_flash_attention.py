"""saturn's float32 attention kernel without a GPU: what it takes and refuses, and that
every tile it picks compiles (NVRTC, as CuPy compiles it on a GPU) for sm_90 with no
register spills and two blocks a SM. Its values are the GPU tests' (tests/device/
test_sdpa_gpu.py, test_fused_attention.py)."""

from __future__ import annotations

import re

import pytest

from saturn.codegen import flash_attention as fa
from saturn.codegen.attention import AttentionError
from saturn.codegen.gemm import Layout


def packed(shape, dtype="f32"):
    strides, acc = [], 1
    for n in reversed(shape):
        strides.append(acc)
        acc *= n
    return Layout(dtype, tuple(shape), tuple(reversed(strides)))


def test_it_takes_float32_heads_in_place_and_grouped_query_heads():
    q = Layout("f32", (2, 8, 77, 64), (77 * 3 * 512, 64, 3 * 512, 1))  # a packed projection
    kv = packed((2, 2, 90, 64))
    fa.check_operands(q, kv, kv, packed((2, 8, 77, 64)))
    fa.check_bias(q, kv, Layout("f32", (2, 1, 77, 90), (90, 0, 0, 1)))


@pytest.mark.parametrize(
    ("q", "k", "why"),
    [
        ((2, 4, 16, 64), (2, 4, 16, 64), "float32"),  # bf16 operands: cuDNN's
        ((2, 4, 16, 12), (2, 4, 16, 12), "multiple of 8"),
        ((2, 4, 16, 136), (2, 4, 16, 136), "up to 128"),
        ((2, 4, 16, 64), (2, 3, 16, 64), "heads"),
        ((2, 4, 16, 64), (2, 4, 16, 32), "pair"),
        ((2, 4, 0, 64), (2, 4, 16, 64), "empty"),
        ((2, 4, 16, 64), (2, 4, 0, 64), "empty"),
    ],
)
def test_it_refuses_what_it_does_not_take(q, k, why):
    dtype = "bf16" if why == "float32" else "f32"
    with pytest.raises(AttentionError, match=why):
        fa.check_operands(packed(q, dtype), packed(k, dtype), packed(k, dtype), packed(q, dtype))


def test_a_strided_head_axis_and_a_bias_of_the_wrong_shape_are_refused():
    q = packed((1, 2, 8, 16))
    t = Layout("f32", (1, 2, 8, 16), (256, 128, 16, 8))
    with pytest.raises(AttentionError, match="not contiguous"):
        fa.check_operands(q, t, q, q)
    with pytest.raises(AttentionError, match="bias"):
        fa.check_bias(q, q, packed((1, 2, 8, 9)))


# (compute capability, query rows, batch x heads): an older card; a small grid; a large one
MACHINES = [(75, 512, 96), (90, 197, 96), (90, 512, 96)]


def chosen(d: int, cc: int, rows: int, heads: int):
    return fa.config(d, cc, rows, heads, sms=132)


def test_the_tile_follows_the_card_and_the_grid():
    assert isinstance(chosen(64, 75, 512, 96), fa.Tile)  # no TF32 tensor cores before 8.0
    assert isinstance(fa.config(64), fa.Tile)  # an unknown card
    wide, narrow = chosen(64, 90, 512, 96), chosen(64, 90, 197, 32)
    assert (wide.mtiles, wide.blocks) == (2, 2)  # 4 x 96 blocks: two a SM or more
    assert (narrow.mtiles, narrow.blocks) == (1, 3)  # 2 x 32 blocks would leave SMs idle
    assert chosen(128, 90, 512, 96).mtiles == 2
    # short windows (Swin's 49 rows): one 64-row block, not half of a 128-row one
    short = chosen(32, 90, 49, 6144)
    assert (short.mtiles, short.blocks) == (1, 3)
    assert chosen(64, 90, 197, 384).mtiles == 2  # both pad 59 rows: the wide tile


@pytest.mark.parametrize("machine", MACHINES, ids=["sm75", "small-grid", "large-grid"])
@pytest.mark.parametrize("d", [8, 16, 40, 64, 128])
def test_each_tile_compiles_without_spills_for_its_blocks_a_sm(d, machine):
    nvrtc = pytest.importorskip("cuda.bindings.nvrtc")
    tile = chosen(d, *machine)
    if isinstance(tile, fa.MmaTile):
        src, threads, blocks = (
            fa.flash_mma.source(d, True, True, True, tile),
            32 * tile.warps,
            tile.blocks,
        )
        smem = fa.flash_mma.shared_bytes(d, tile)
    else:
        src, threads, blocks = fa.source(d, True, True, True, tile), fa.TY * fa.LANES, 2
        smem = fa.shared_bytes(d, tile)
    arch = b"-arch=sm_90" if machine[0] >= 80 else b"-arch=sm_75"
    err, prog = nvrtc.nvrtcCreateProgram(src.encode(), b"flash.cu", 0, [], [])
    (err,) = nvrtc.nvrtcCompileProgram(prog, 2, [arch, b"-Xptxas=-v"])
    _, n = nvrtc.nvrtcGetProgramLogSize(prog)
    log = bytearray(n)
    nvrtc.nvrtcGetProgramLog(prog, log)
    text = log.decode(errors="replace")
    assert err == nvrtc.nvrtcResult.NVRTC_SUCCESS, text
    assert re.search(r"\b0 bytes spill stores", text), text
    regs = int(re.search(r"Used (\d+) registers", text).group(1))
    assert regs * threads * blocks <= 65536  # its blocks a SM by registers
    assert blocks * smem <= 228 * 1024  # and by shared memory
