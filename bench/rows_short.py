"""Rows kernels over many short rows: a warp per row against part of a warp per row
(``cuda_rows.ROW_SEGMENT_STEPS``), against eager PyTorch and Inductor, in one process.

What is timed (device time by CUDA events, median of repeats after warm-up, back-to-back
launches on one stream; saturn's kernel launched directly, no dispatcher):
  swin    Swin-T's first-stage window attention softmax at batch 32: scores [2048, 3, 49,
          49] plus the relative-position bias ([49, 49, 3] permuted, broadcast over windows)
          plus the shift mask ([64, 49, 49] broadcast over images and heads), softmax over
          the last axis; bfloat16 and float32
  plain   softmax over 301,056 rows of 49 (float32)
Each saturn variant is checked against eager float32 on the GPU (max abs difference).

    python bench/rows_short.py            (on a GPU machine)
"""

from __future__ import annotations

import torch
from kernel_speed import events_ms  # beside this file

import saturn  # noqa: F401
from saturn.codegen import cuda as cg
from saturn.codegen import cuda_rows
from saturn.eqsat.graph import parse_graph
from saturn.eqsat.pipeline import compile_graph

GPU = "saturn:1"
REPEATS = 50
# (ROW_SEGMENT_STEPS, ROW_SEGMENT_KEEP): 0 steps is a warp per row; rows of 49 get 16, 8
# and 4 lanes at 4, 8 and 16 steps, each with the row re-read every pass and kept
VARIANTS = [(0, False)] + [(steps, keep) for steps in (4, 8, 16) for keep in (False, True)]
TYPES = {torch.float32: "f32", torch.bfloat16: "bf16"}


def swin(s, b, m, images: int):
    """The shifted-window softmax as torchvision's Swin-T writes it."""
    a = s + b.permute(2, 0, 1).unsqueeze(0)
    a = a.view(images, m.shape[0], *s.shape[1:]) + m.unsqueeze(1).unsqueeze(0)
    return a.view(s.shape).softmax(-1)


def swin_graph(dt: str, windows: int, images: int, heads: int, n: int) -> str:
    return (
        f"(input s {dt} [{images * windows} {heads} {n} {n}])\n(input b {dt} [{n} {n} {heads}])\n"
        f"(input m {dt} [{windows} {n} {n}])\n"
        f"(let bp (View (Permute b [2 0 1]) [1 {heads} {n} {n}]))\n(let a (Add s bp))\n"
        f"(let a5 (View a [{images} {windows} {heads} {n} {n}]))\n"
        f"(let m5 (View m [1 {windows} 1 {n} {n}]))\n(let am (Add a5 m5))\n"
        f"(let r (Softmax (View am [{images * windows} {heads} {n} {n}]) 3))\n(output r)\n"
    )


def kernel_ms(text: str, operands: list[torch.Tensor], stream, repeats: int = REPEATS):
    """(device ms, output, the CUDA kernel, its program's kernel) of the graph's one kernel
    launched directly on saturn's stream; ``operands``: the kernel's operands as views of
    saturn tensors, in order."""
    prog = compile_graph(parse_graph(text), machine="gpu", io_on_device=True).program
    (k,) = prog.kernels
    with torch.saturn.device(GPU):
        kern = cg.CudaKernel(k, torch.saturn.get_device_capability(GPU))
    out = torch.empty(k.shape, dtype=operands[0].dtype, device=GPU)
    sh = torch.saturn.stream_handle(GPU)
    ptrs = [t.data_ptr() for t in operands]
    shapes = [tuple(t.shape) for t in operands]
    strides = [t.stride() for t in operands]

    def launch():
        kern.launch(sh, out.data_ptr(), ptrs, shapes, strides)

    return events_ms(launch, stream, repeats), out, kern, k


def saturn_ms(text: str, operands: list[torch.Tensor], stream, variant: tuple[int, bool]):
    """(device ms, output, lanes a row, kept) of the graph's one rows kernel under a variant
    of VARIANTS; ``operands``: the kernel's operands as views of saturn tensors, in order."""
    cuda_rows.ROW_SEGMENT_STEPS, cuda_rows.ROW_SEGMENT_KEEP = variant
    t, out, kern, k = kernel_ms(text, operands, stream)
    kept = "kept" if cuda_rows.row_cache(k, kern.g.row_threads, kern.g.lanes) else "re-read"
    return t, out, kern.g.row_threads, kept


def main() -> None:
    torch.manual_seed(0)
    torch.backends.cuda.matmul.allow_tf32 = False
    stream = torch.cuda.ExternalStream(torch.saturn.stream_handle(GPU), device="cuda:0")
    rows = []
    images, windows, heads, n = 32, 64, 3, 49
    for dtype in (torch.bfloat16, torch.float32):
        s = torch.randn(images * windows, heads, n, n, device="cuda").to(dtype)
        b = torch.randn(n, n, heads, device="cuda").to(dtype)
        m = torch.where(torch.rand(windows, n, n, device="cuda") < 0.3, -100.0, 0.0).to(dtype)
        want = swin(s.float(), b.float(), m.float(), images)
        ind = torch.compile(swin)
        here = torch.cuda.current_stream()
        t_e = events_ms(lambda s=s, b=b, m=m: swin(s, b, m, images), here, REPEATS)
        t_i = events_ms(lambda s=s, b=b, m=m, f=ind: f(s, b, m, images), here, REPEATS)
        name = f"swin {TYPES[dtype]}"
        rows += [(f"{name} eager", t_e, ""), (f"{name} inductor", t_i, "")]
        ss, sb, sm = (t.cpu().to(GPU) for t in (s, b, m))
        ops = [ss, sb.permute(2, 0, 1).unsqueeze(0), sm.view(1, windows, 1, n, n)]
        text = swin_graph(TYPES[dtype], windows, images, heads, n)
        for variant in VARIANTS:
            t, out, width, kept = saturn_ms(text, ops, stream, variant)
            err = (out.cpu().float() - want.cpu()).abs().max().item()
            rows.append((f"{name} saturn, {width} lanes a row, {kept}", t, f"err {err:.1e}"))
    x = torch.randn(301056, n, device="cuda")
    t_e = events_ms(lambda: x.softmax(-1), torch.cuda.current_stream(), REPEATS)
    ind = torch.compile(lambda x: x.softmax(-1))
    t_i = events_ms(lambda: ind(x), torch.cuda.current_stream(), REPEATS)
    rows += [("plain f32 eager", t_e, ""), ("plain f32 inductor", t_i, "")]
    sx = x.cpu().to(GPU)
    for variant in VARIANTS:
        text = f"(input x f32 [301056 {n}])\n(let r (Softmax x 1))\n(output r)\n"
        t, out, width, kept = saturn_ms(text, [sx], stream, variant)
        err = (out.cpu() - x.softmax(-1).cpu()).abs().max().item()
        rows.append((f"plain f32 saturn, {width} lanes a row, {kept}", t, f"err {err:.1e}"))
    cuda_rows.ROW_SEGMENT_STEPS, cuda_rows.ROW_SEGMENT_KEEP = 8, True
    for name, t, note in rows:
        print(f"{name:48s} {t * 1000:9.1f} us  {note}")


if __name__ == "__main__":
    main()
