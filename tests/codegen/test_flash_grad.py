"""saturn's float32 attention gradient kernel without a GPU: what its plan refuses before
building anything, and that both kernels compile (NVRTC, as CuPy compiles them on a GPU)
for sm_90 at every head size's tile with no register spills, within the blocks a SM the
tile is bounded for. Its values are the GPU tests' (tests/device/test_sdpa_grad_gpu.py)."""

from __future__ import annotations

import re

import pytest

from saturn.codegen import flash_grad as fg
from saturn.codegen.attention import AttentionError
from saturn.codegen.gemm import Layout

from .test_flash_attention import packed


def plan(q, k, v, grads=None, bias=None):
    """The plan's checks (stream 0: nothing is launched, nothing built before them)."""
    grads = grads or (q, k, v)
    return fg.FlashGradPlan(q, k, v, q, q, grads, 0.1, 0, bias=bias)


@pytest.mark.parametrize(
    "q, k, grads, why",
    [
        ((2, 4, 16, 64), (2, 2, 16, 64), None, "heads equal"),
        ((2, 4, 16, 64), (2, 4, 16, 64), ((2, 4, 16, 64), (2, 4, 8, 64), (2, 4, 16, 64)), "dk"),
        ((2, 4, 16, 136), (2, 4, 16, 136), None, "head"),
    ],
)
def test_the_plan_refuses_what_the_kernel_does_not_take(q, k, grads, why):
    g = tuple(packed(s) for s in grads) if grads else None
    with pytest.raises(AttentionError, match=why):
        plan(packed(q), packed(k), packed(k), g)


def test_a_gradient_in_another_dtype_or_a_strided_head_axis_is_refused():
    q = packed((1, 2, 8, 16))
    with pytest.raises(AttentionError, match="dq"):
        plan(q, q, q, (packed((1, 2, 8, 16), "bf16"), q, q))
    strided = Layout("f32", q.shape, (256, 128, 16, 2))
    with pytest.raises(AttentionError, match="dv"):
        plan(q, q, q, (q, q, strided))


@pytest.mark.parametrize("d", [8, 40, 64, 128])
def test_each_tile_compiles_without_spills_for_its_blocks_a_sm(d):
    nvrtc = pytest.importorskip("cuda.bindings.nvrtc")
    tile = fg.config(d)
    src = fg.source(d, True, True, tile)
    err, prog = nvrtc.nvrtcCreateProgram(src.encode(), b"flash_grad.cu", 0, [], [])
    (err,) = nvrtc.nvrtcCompileProgram(prog, 2, [b"-arch=sm_90", b"-Xptxas=-v"])
    _, n = nvrtc.nvrtcGetProgramLogSize(prog)
    log = bytearray(n)
    nvrtc.nvrtcGetProgramLog(prog, log)
    text = log.decode(errors="replace")
    assert err == nvrtc.nvrtcResult.NVRTC_SUCCESS, text
    assert len(re.findall(r"\b0 bytes spill stores", text)) == 2, text  # both kernels
    used = [int(x) for x in re.findall(r"Used (\d+) registers", text)]
    grad = max(used)  # the gradient kernel's (the first kernel needs few)
    assert grad * 32 * tile.warps * tile.blocks <= 65536
    assert tile.blocks * fg.shared_bytes(d, tile) <= 227 * 1024
