"""Where a convolution's compile time goes: cuDNN plan building and autotuning per dtype.

    python bench/conv_plans.py [--batch 32] [--compiled-shapes 2] [--layouts | --grouped]

For ResNet-18's and MobileNetV2's convolution shapes at 224 px, on CUDA memory: seconds to
build the plan (``codegen.conv.ConvPlan``), seconds to autotune it (build and time the first
eight candidates), the candidates timed and the chosen plan's device milliseconds, in
float32 and bfloat16; first with precompiled engines only (saturn's default for dense
convolutions), then, for the first ``--compiled-shapes`` shapes, with runtime-compiled
(NVRTC) engines admitted. Compare
the chosen plan's time with eager's ``nnf.conv2d`` (CUDA events, median of 20).

With ``--layouts``, each shape in float32 and bfloat16 twice instead: every operand packed
(NCHW, the layout saturn's programs give a convolution today) and every operand
channels-last (NHWC memory: the image, the weight and the output), the plan and eager's
call alike, to see what the layout is worth to cuDNN. With ``--grouped``, the zoo's grouped
and depthwise convolutions (``GROUPED``) the same way, with NVRTC engines admitted and not.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as nnf

from saturn.codegen.conv import ConvParams, ConvPlan
from saturn.codegen.gemm import Layout

# (input, weight, stride, padding, groups) at batch 1; the batch is set on the command line
SHAPES = [
    ((3, 224, 224), (64, 3, 7, 7), 2, 3, 1),
    ((64, 56, 56), (64, 64, 3, 3), 1, 1, 1),
    ((64, 56, 56), (128, 64, 3, 3), 2, 1, 1),
    ((64, 56, 56), (128, 64, 1, 1), 2, 0, 1),
    ((128, 28, 28), (128, 128, 3, 3), 1, 1, 1),
    ((256, 14, 14), (256, 256, 3, 3), 1, 1, 1),
    ((512, 7, 7), (512, 512, 3, 3), 1, 1, 1),
    ((32, 112, 112), (32, 1, 3, 3), 1, 1, 32),
    ((96, 112, 112), (96, 1, 3, 3), 2, 1, 96),
    ((144, 56, 56), (24, 144, 1, 1), 1, 0, 1),
]
# grouped convolutions of the zoo (--grouped): ConvNeXt's 7x7 depthwise, MobileNetV2's and
# EfficientNet-B0's 3x3 and 5x5 depthwise, RegNetY-400MF's groups of eight channels
GROUPED = [
    ((40, 56, 56), (40, 1, 7, 7), 1, 3, 40),
    ((80, 28, 28), (80, 1, 7, 7), 1, 3, 80),
    ((160, 14, 14), (160, 1, 7, 7), 1, 3, 160),
    ((320, 7, 7), (320, 1, 7, 7), 1, 3, 320),
    ((32, 112, 112), (32, 1, 3, 3), 1, 1, 32),
    ((144, 56, 56), (144, 1, 3, 3), 1, 1, 144),
    ((192, 28, 28), (192, 1, 3, 3), 2, 1, 192),
    ((384, 14, 14), (384, 1, 3, 3), 1, 1, 384),
    ((240, 28, 28), (240, 1, 5, 5), 1, 2, 240),
    ((672, 14, 14), (672, 1, 5, 5), 1, 2, 672),
    ((1152, 7, 7), (1152, 1, 5, 5), 1, 2, 1152),
    ((48, 56, 56), (48, 8, 3, 3), 1, 1, 6),
    ((104, 28, 28), (104, 8, 3, 3), 1, 1, 13),
    ((208, 14, 14), (208, 8, 3, 3), 1, 1, 26),
]
NAMES = {torch.float32: "f32", torch.bfloat16: "bf16", torch.float16: "f16"}


def lay(t: torch.Tensor) -> Layout:
    return Layout(NAMES[t.dtype], tuple(t.shape), tuple(t.stride()))


def eager_ms(x, w, s, p, g) -> float:
    for _ in range(3):
        nnf.conv2d(x, w, None, s, p, 1, g)
    times = []
    for _ in range(20):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        nnf.conv2d(x, w, None, s, p, 1, g)
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    return statistics.median(times)


def one(shape, dtype, batch: int, compiled: bool, keep: list, cl: bool = False) -> str:
    (c, h, wd), wshape, s, p, g = shape
    fmt = torch.channels_last if cl else torch.contiguous_format
    x = torch.randn(batch, c, h, wd, device="cuda", dtype=dtype).to(memory_format=fmt)
    w = torch.randn(*wshape, device="cuda", dtype=dtype).to(memory_format=fmt)
    out = nnf.conv2d(x, w, None, s, p, 1, g).to(memory_format=fmt)
    stream = torch.cuda.current_stream().cuda_stream
    params = ConvParams((s, s), (p, p), (1, 1), g)

    def workspace(n: int) -> int:
        keep.append(torch.empty(max(n, 1), dtype=torch.uint8, device="cuda"))
        return keep[-1].data_ptr()

    t0 = time.perf_counter()
    plan = ConvPlan(lay(x), lay(w), None, lay(out), params, stream, runtime_compiled=compiled)
    t1 = time.perf_counter()
    plan.autotune((x.data_ptr(), w.data_ptr(), out.data_ptr()), workspace)
    torch.cuda.synchronize()
    t2 = time.perf_counter()
    tuned = plan.tuned[0] if plan.tuned else float("nan")
    return (
        f"{NAMES[dtype]:4} {'nhwc' if cl else 'nchw'} "
        f"{'nvrtc' if plan.runtime_compiled else 'pre':5} "
        f"x{list(x.shape)} w{list(w.shape)} s{s} g{g}: build {t1 - t0:6.2f} s, "
        f"autotune {t2 - t1:6.2f} s ({plan.candidates} plans), "
        f"chosen {tuned:.3f} ms, eager {eager_ms(x, w, s, p, g):.3f} ms"
    )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--compiled-shapes", type=int, default=2)
    ap.add_argument("--layouts", action="store_true", help="NCHW against channels-last")
    ap.add_argument(
        "--grouped",
        action="store_true",
        help="the zoo's grouped convolutions in both layouts, precompiled and NVRTC engines",
    )
    a = ap.parse_args()
    keep: list = []
    if a.grouped:
        for dtype in (torch.bfloat16, torch.float32):
            for shape in GROUPED:
                for cl in (False, True):
                    for compiled in (False, True):
                        print(one(shape, dtype, a.batch, compiled, keep, cl), flush=True)
        return
    if a.layouts:
        for dtype in (torch.bfloat16, torch.float32):
            for shape in SHAPES:
                for cl in (False, True):
                    print(one(shape, dtype, a.batch, False, keep, cl), flush=True)
        return
    for dtype in (torch.float32, torch.bfloat16):
        for shape in SHAPES:
            print(one(shape, dtype, a.batch, False, keep), flush=True)
    for dtype in (torch.bfloat16,):
        for shape in SHAPES[: a.compiled_shapes]:
            print(one(shape, dtype, a.batch, True, keep), flush=True)


if __name__ == "__main__":
    main()
