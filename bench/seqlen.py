"""Per-call time of a TransformerEncoderLayer compiled once for symbolic sequence lengths,
against a static compile of the same shape, on the GPU, float32, forward only with grad
enabled (under no_grad the layer takes PyTorch's fused encoder path, which dynamo in torch
2.11 does not trace with dynamic shapes).

What is timed: wall time of one call plus a synchronize, median of REPEATS calls after
warm-up, at each length in LENGTHS; for the symbolic recipe also the first call at a new
length (building its concrete recipe: substituting sizes, planning memory, loading kernels,
planning GEMMs, capturing on the next call). Compiles are counted from saturn's cache.

    python bench/seqlen.py            (on a GPU machine)
"""

from __future__ import annotations

import statistics
import time

import torch

import saturn  # noqa: F401
from saturn import backend

GPU = "saturn:1"
REPEATS = 30
D, HEADS, BATCH = 512, 8, 8
LENGTHS = (64, 96, 128, 192, 256)


def per_call_us(fn, x) -> float:
    for _ in range(5):
        fn(x)
    ts = []
    for _ in range(REPEATS):
        torch.saturn.synchronize(GPU)
        t0 = time.perf_counter()
        fn(x)
        torch.saturn.synchronize(GPU)
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts) * 1e6


def main() -> None:
    torch.manual_seed(0)
    model = torch.nn.TransformerEncoderLayer(D, HEADS, 4 * D, dropout=0.0, batch_first=True)
    model = model.eval().to(GPU)
    rows = []
    with torch.enable_grad():
        torch._dynamo.reset()
        sym = torch.compile(model, backend="saturn")
        c0 = backend.CACHE.compiles
        sym(torch.randn(BATCH, 32, D).to(GPU))  # static first
        sym(torch.randn(BATCH, 48, D).to(GPU))  # the symbolic compile
        for n in LENGTHS:
            x = torch.randn(BATCH, n, D).to(GPU)
            torch.saturn.synchronize(GPU)
            t0 = time.perf_counter()
            sym(x)
            torch.saturn.synchronize(GPU)
            first = (time.perf_counter() - t0) * 1e6
            t_sym = per_call_us(sym, x)
            torch._dynamo.reset()
            static = torch.compile(model, backend="saturn", dynamic=False)
            t_static = per_call_us(static, x)
            torch._dynamo.reset()
            sym = torch.compile(model, backend="saturn")  # cached recipes: no new compile
            sym(torch.randn(BATCH, 32, D).to(GPU))
            sym(torch.randn(BATCH, 48, D).to(GPU))
            rows.append((n, first, t_sym, t_static))
        compiles = backend.CACHE.compiles - c0
    print(f"GPU: {torch.cuda.get_device_name(0)}, torch {torch.__version__}")
    print(
        f"encoder d={D} heads={HEADS} batch={BATCH}; saturn compiles in the run: "
        f"{compiles} (one static compile per length included)"
    )
    print(f"{'length':>6s} {'first us':>9s} {'symbolic us':>12s} {'static us':>10s} {'ratio':>6s}")
    for n, first, ts, tt in rows:
        print(f"{n:6d} {first:9.0f} {ts:12.1f} {tt:10.1f} {ts / tt:6.2f}")


if __name__ == "__main__":
    main()
