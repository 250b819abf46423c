"""Attention's softmax rows kernels at a text model's sizes: the row kept in registers
between passes against re-read (``cuda_rows.ROW_CACHE_BYTES``), against eager PyTorch and
Inductor, in one process.

What is timed (device time by CUDA events, median of repeats after warm-up, back-to-back
launches on one stream; saturn's kernel launched directly, no dispatcher):
  forward   softmax over the last axis of scores [8, 12, S, S] (DistilBERT's training
            batch), S = 512 and 197 (DeiT's tokens); float32 and bfloat16
  backward  softmax's gradient p * (g - sum(g * p)) over the same rows (float32)
Each saturn variant is checked against eager float32 on the GPU (max abs difference).

    python bench/rows_attention.py            (on a GPU machine)
"""

from __future__ import annotations

import torch
from kernel_speed import events_ms  # beside this file
from rows_short import kernel_ms

import saturn  # noqa: F401
from saturn.codegen import cuda_rows

GPU = "saturn:1"
REPEATS = 50
CACHE = {"re-read": cuda_rows.ROW_CACHE_BYTES, "kept": 0}  # ROW_CACHE_BYTES per variant
TYPES = {torch.float32: "f32", torch.bfloat16: "bf16"}


def saturn_ms(text: str, operands: list[torch.Tensor], stream, cache: int):
    """(device ms, output, what the kernel did) of the graph's one rows kernel."""
    cuda_rows.ROW_CACHE_BYTES = cache
    t, out, kern, k = kernel_ms(text, operands, stream, REPEATS)
    kept = cuda_rows.row_cache(k, kern.g.row_threads, kern.g.lanes)
    how = f"{kern.g.row_threads} threads a row, {kern.g.lanes} lanes, "
    return t, out, how + ("kept" if kept else "re-read")


def grad(p, g):
    return p * (g - (g * p).sum(-1, keepdim=True))


def main() -> None:
    torch.manual_seed(0)
    stream = torch.cuda.ExternalStream(torch.saturn.stream_handle(GPU), device="cuda:0")
    here = torch.cuda.current_stream()
    default = cuda_rows.ROW_CACHE_BYTES
    rows = []
    for n in (512, 197):
        shape = [8, 12, n, n]
        dims = " ".join(map(str, shape))
        for dtype in (torch.float32, torch.bfloat16):
            s = (torch.randn(shape, device="cuda") * 3).to(dtype)
            want = s.float().softmax(-1)
            ind = torch.compile(lambda x: x.softmax(-1))
            name = f"forward S={n} {TYPES[dtype]}"
            rows.append((f"{name} eager", events_ms(lambda s=s: s.softmax(-1), here, REPEATS), ""))
            rows.append((f"{name} inductor", events_ms(lambda s=s, f=ind: f(s), here, REPEATS), ""))
            ss = s.cpu().to(GPU)
            text = f"(input x {TYPES[dtype]} [{dims}])\n(let r (Softmax x 3))\n(output r)\n"
            for cache in CACHE.values():
                t, out, how = saturn_ms(text, [ss], stream, cache)
                err = (out.cpu().float() - want.cpu()).abs().max().item()
                rows.append((f"{name} saturn, {how}", t, f"err {err:.1e}"))
        p = torch.randn(shape, device="cuda").softmax(-1)
        g = torch.randn(shape, device="cuda")

        want = grad(p, g)
        ind = torch.compile(grad)
        name = f"backward S={n} f32"
        rows.append((f"{name} eager", events_ms(lambda p=p, g=g: grad(p, g), here, REPEATS), ""))
        rows.append(
            (f"{name} inductor", events_ms(lambda f=ind, p=p, g=g: f(p, g), here, REPEATS), "")
        )
        text = (
            f"(input p f32 [{dims}])\n(input g f32 [{dims}])\n"
            "(let r (Mul p (Sub g (Sum (Mul g p) [3] 1))))\n(output r)\n"
        )
        sp, sg = p.cpu().to(GPU), g.cpu().to(GPU)
        for cache in CACHE.values():
            t, out, how = saturn_ms(text, [sp, sg], stream, cache)
            err = (out.cpu() - want.cpu()).abs().max().item()
            rows.append((f"{name} saturn, {how}", t, f"err {err:.1e}"))
    cuda_rows.ROW_CACHE_BYTES = default
    for name, t, note in rows:
        print(f"{name:60s} {t * 1000:9.1f} us  {note}")


if __name__ == "__main__":
    main()
