"""GEMM microbenchmarks: saturn's nvmath plans against torch on the same GPU, one process.

What is timed (device time by CUDA events, median of 30, after warm-up), float32,
TF32 off on both sides:
  linear+gelu  y = gelu_tanh(x @ W^T + b), x 4096x1024, W 4096x1024: torch addmm then gelu
               (two kernels) vs one saturn GEMM with the GELU+bias epilogue
  mm           a @ b, 4096x4096 by 4096x4096: torch.mm vs a saturn GEMM plan

    python bench/gemm.py            (on a GPU machine)
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

import saturn  # noqa: F401
from saturn.codegen.gemm import GemmPlan, Layout

sys.path.insert(0, str(Path(__file__).resolve().parent))
from kernels import events_ms

GPU = "saturn:1"


def lay(t: torch.Tensor) -> Layout:
    return Layout("f32", tuple(t.shape), tuple(t.stride()))


def main() -> None:
    torch.backends.cuda.matmul.allow_tf32 = False
    sh = torch.saturn.stream_handle(GPU)
    stream = torch.cuda.ExternalStream(sh, device="cuda:0")
    torch.manual_seed(0)
    rows = []

    x, w, b = torch.randn(4096, 1024), torch.randn(4096, 1024) * 0.03, torch.randn(4096)
    xc, wc, bc = x.cuda(), w.cuda(), b.cuda()
    t_torch = events_ms(
        lambda: torch.nn.functional.gelu(torch.addmm(bc, xc, wc.t()), approximate="tanh")
    )
    xs, ws, bs = x.to(GPU), w.to(GPU), b.to(GPU)
    wt = ws.t()  # the weight as stored, read transposed
    out = torch.empty(4096, 4096, device=GPU)
    ptrs = (xs.data_ptr(), wt.data_ptr(), out.data_ptr(), bs.data_ptr())
    with torch.saturn.device(GPU):
        plan = GemmPlan(lay(xs), lay(wt), lay(out), "gelu_bias", lay(bs), ptrs, sh)
        t_sat = events_ms(lambda: plan.run(ptrs), stream)
    want = torch.nn.functional.gelu(torch.addmm(bc, xc, wc.t()), approximate="tanh").cpu()
    err = (out.cpu() - want).abs().max().item()
    rows.append(("linear+tanh-GELU 4096x1024x4096", t_torch, t_sat, err))

    a, c = torch.randn(4096, 4096), torch.randn(4096, 4096)
    ac, cc = a.cuda(), c.cuda()
    t_torch = events_ms(lambda: torch.mm(ac, cc))
    as_, cs = a.to(GPU), c.to(GPU)
    out = torch.empty(4096, 4096, device=GPU)
    ptrs = (as_.data_ptr(), cs.data_ptr(), out.data_ptr())
    with torch.saturn.device(GPU):
        plan = GemmPlan(lay(as_), lay(cs), lay(out), "none", None, ptrs, sh)
        t_sat = events_ms(lambda: plan.run(ptrs), stream)
    err = (out.cpu() - torch.mm(ac, cc).cpu()).abs().max().item()
    rows.append(("mm 4096x4096x4096", t_torch, t_sat, err))

    print(f"GPU: {torch.cuda.get_device_name(0)}, torch {torch.__version__}")
    print(f"{'case':34s} {'torch ms':>9s} {'saturn ms':>10s} {'torch/saturn':>13s} {'max err':>9s}")
    for name, tt, ts, err in rows:
        print(f"{name:34s} {tt:9.3f} {ts:10.3f} {tt / ts:13.3f} {err:9.2e}")


if __name__ == "__main__":
    main()
