"""GEMM microbenchmarks: saturn's nvmath plans against torch on the same GPU, one process.

What is timed: device time per call, float32, TF32 off on both sides. Each side's stream
is held by a spin kernel while ten calls are enqueued, then CUDA events around them (so
neither side's host launch cost is counted, as in a replayed graph); median of 7 such
measurements, after warm-up:
  linear+gelu  y = gelu_tanh(x @ W^T + b), x 4096x1024, W 4096x1024 (and 16384x1024 by
               4096x1024, the large MLP's): torch addmm then gelu (two kernels) vs saturn's
               GEMM plan with the GELU+bias epilogue, made both ways (cuBLASLt's epilogue;
               bias epilogue + saturn's GELU pass) and the faster kept, both printed
  mm           a @ b, 4096x4096 by 4096x4096: torch.mm vs a saturn GEMM plan

    python bench/gemm.py            (on a GPU machine)
"""

from __future__ import annotations

import statistics

import torch

import saturn  # noqa: F401
from saturn.codegen.gemm import GemmPlan, Layout, time_on_stream


def device_ms(fn, stream: int) -> float:
    return statistics.median(time_on_stream(fn, stream, reps=10) for _ in range(7))


GPU = "saturn:1"


def lay(t: torch.Tensor) -> Layout:
    return Layout("f32", tuple(t.shape), tuple(t.stride()))


def linear_gelu(m: int, sh: int) -> tuple[tuple, str]:
    x, w, b = torch.randn(m, 1024), torch.randn(4096, 1024) * 0.03, torch.randn(4096)
    xc, wc, bc = x.cuda(), w.cuda(), b.cuda()
    t_torch = device_ms(
        lambda: torch.nn.functional.gelu(torch.addmm(bc, xc, wc.t()), approximate="tanh"),
        torch.cuda.current_stream().cuda_stream,
    )
    xs, ws, bs = x.to(GPU), w.to(GPU), b.to(GPU)
    wt = ws.t()  # the weight as stored, read transposed
    out = torch.empty(m, 4096, device=GPU)
    ptrs = (xs.data_ptr(), wt.data_ptr(), out.data_ptr(), bs.data_ptr())
    with torch.saturn.device(GPU):
        plan = GemmPlan(lay(xs), lay(wt), lay(out), "gelu_bias", lay(bs), ptrs, sh)
        t_sat = device_ms(lambda: plan.run(ptrs), sh)
    want = torch.nn.functional.gelu(torch.addmm(bc, xc, wc.t()), approximate="tanh").cpu()
    err = (out.cpu() - want).abs().max().item()
    kept = "separate" if plan.gelu_separate else "fused"
    timed = ", ".join(f"{k} {v:.3f} ms" for k, v in plan.timings.items())
    way = f"{m}x1024x4096: kept {kept} ({timed}, timed at planning)"
    return (f"linear+tanh-GELU {m}x1024x4096", t_torch, t_sat, err), way


def main() -> None:
    torch.backends.cuda.matmul.allow_tf32 = False
    sh = torch.saturn.stream_handle(GPU)
    torch.manual_seed(0)
    rows = []

    ways = []
    for m in (4096, 16384):
        row, way = linear_gelu(m, sh)
        rows.append(row)
        ways.append(way)

    a, c = torch.randn(4096, 4096), torch.randn(4096, 4096)
    ac, cc = a.cuda(), c.cuda()
    t_torch = device_ms(lambda: torch.mm(ac, cc), torch.cuda.current_stream().cuda_stream)
    as_, cs = a.to(GPU), c.to(GPU)
    out = torch.empty(4096, 4096, device=GPU)
    ptrs = (as_.data_ptr(), cs.data_ptr(), out.data_ptr())
    with torch.saturn.device(GPU):
        plan = GemmPlan(lay(as_), lay(cs), lay(out), "none", None, ptrs, sh)
        t_sat = device_ms(lambda: plan.run(ptrs), sh)
    err = (out.cpu() - torch.mm(ac, cc).cpu()).abs().max().item()
    rows.append(("mm 4096x4096x4096", t_torch, t_sat, err))

    print(f"GPU: {torch.cuda.get_device_name(0)}, torch {torch.__version__}")
    print(f"{'case':34s} {'torch ms':>9s} {'saturn ms':>10s} {'torch/saturn':>13s} {'max err':>9s}")
    for name, tt, ts, err in rows:
        print(f"{name:34s} {tt:9.3f} {ts:10.3f} {tt / ts:13.3f} {err:9.2e}")
    for line in ways:
        print("GELU epilogue " + line)


if __name__ == "__main__":
    main()
