"""Device time of saturn's float32 attention kernel (``codegen/flash_attention.py``) per
thread tile, against PyTorch's float32 memory-efficient attention, on CUDA tensors in one
process: the measurement that picks ``flash_attention.config``.

Also timed: aten's math on the same CUDA tensors (cuBLAS products, a softmax over the
written scores, the causal mask as a bias), which is what an unfused float32 attention
costs. What is timed: CUDA events around 20 launches on one stream (device time, no host time),
median of 7 such runs, per launch, in us; q, k, v as [B, H, S, D] views of one packed
projection (an encoder's heads). Errors against float64 on the CPU where small enough.

    python bench/flash_tiles.py [--windows]           (on a GPU machine)
"""

from __future__ import annotations

import statistics
import sys

import torch
from attention import F32_SHAPES  # bench/attention.py (this script's folder)
from torch.nn.attention import SDPBackend, sdpa_kernel

from saturn.codegen.flash_attention import FlashPlan, MmaTile, Tile, config
from saturn.codegen.gemm import Layout

# attention.py's float32 shapes and one more at head size 128
SHAPES = (*F32_SHAPES, (8, 512, 12, 128, False))
# Swin-T's window attention at batch 32 (``--windows``): 49 rows a window, head size 32,
# images x windows slices in its first two stages
WINDOWS = ((2048, 49, 3, 32, False), (512, 49, 6, 32, False))
TILES = {
    64: [
        Tile(8, 8),
        MmaTile(4, 64),
        MmaTile(4, 32, 3),
        MmaTile(4, 64, 1, 2),
        MmaTile(4, 32, 2, 2),
        MmaTile(2, 32, 4),
    ],
    128: [Tile(4, 4), MmaTile(4, 32), MmaTile(8, 32, 1), MmaTile(4, 32, 1, 2)],
}


def name(tile) -> str:
    if isinstance(tile, MmaTile):  # tensor cores: warps, keys a step
        return f"mma{tile.warps}w{tile.keys}k{tile.mtiles}m{tile.blocks}b"
    return f"{tile.rows}x{tile.cols}{'p' if tile.pipelined else ''}{'2' if tile.exp2 else ''}"


def device_us(fn, calls: int = 20, runs: int = 7) -> float:
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(runs):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(calls):
            fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1e3 / calls)
    return statistics.median(times)


def layout(t: torch.Tensor) -> Layout:
    return Layout("f32", tuple(t.shape), tuple(t.stride()))


def row(b: int, s: int, h: int, d: int, causal: bool) -> None:
    torch.manual_seed(0)
    proj = torch.randn(b, s, 3 * h * d, device="cuda")
    q, k, v = (
        proj[..., i * h * d : (i + 1) * h * d].reshape(b, s, h, d).transpose(1, 2) for i in range(3)
    )
    f = torch.nn.functional.scaled_dot_product_attention
    with sdpa_kernel(SDPBackend.EFFICIENT_ATTENTION):
        want = f(q, k, v, is_causal=causal)
        t_torch = device_us(lambda: f(q, k, v, is_causal=causal))
    with sdpa_kernel(SDPBackend.MATH):  # what saturn's unfused float32 path runs
        t_math = device_us(lambda: f(q, k, v, is_causal=causal))
    ref = None
    if b * s * h <= 2**17:
        ref = f(*(x.cpu().double() for x in (q, k, v)), is_causal=causal)
    stream = torch.cuda.current_stream().cuda_stream
    out = torch.empty_like(q)
    cells = []
    for tile in TILES[64 if d <= 64 else 128]:
        plan = FlashPlan(*map(layout, (q, k, v, out)), d**-0.5, stream, causal=causal, tile=tile)
        ptrs = tuple(x.data_ptr() for x in (q, k, v, out))
        t = device_us(lambda plan=plan, ptrs=ptrs: plan.run(ptrs))
        err = (out - want).abs().max().item()
        e64 = (out.cpu().double() - ref).abs().max().item() if ref is not None else float("nan")
        cc, sms = torch.cuda.get_device_capability(), torch.cuda.get_device_properties(0)
        chosen = config(d, 10 * cc[0] + cc[1], s, b * h, sms.multi_processor_count)
        mark = "*" if tile == chosen else " "
        cells.append(f"{mark}{name(tile)} {t:8.1f} ({t_torch / t:4.2f}x, {err:.1e}, {e64:.1e})")
    shape = f"{b}x{s}x{h}x{d}{' causal' if causal else ''}"
    head = f"{shape:>22s} torch {t_torch:8.1f} math {t_math:8.1f} | "
    print(head + " | ".join(cells), flush=True)


if __name__ == "__main__":
    torch.backends.cuda.matmul.allow_tf32 = False
    print(f"GPU: {torch.cuda.get_device_name(0)}, torch {torch.__version__}")
    print("tile: rows x cols, p = pipelined copies, 2 = exp2 (CUDA cores); mma: warps, keys a")
    print("step (tensor cores, three TF32 products); * = config(d, cc); us per launch")
    print("(x torch's memory-efficient kernel, max |saturn - torch|, max |saturn - float64|)")
    for shape in WINDOWS if "--windows" in sys.argv else SHAPES:
        row(*shape)
