"""How many of cuBLASLt's heuristic candidates a float32 GEMM plan should time, on the
products of real models: saturn's plan (``codegen/gemm.GemmPlan``) timing the first 8, 16
or 32 candidates, and the same plan running cuBLAS's own choice
(``codegen/cublaslt.offer_blas``, ``blas="always"``), against
``torch.nn.functional.linear`` on CUDA tensors, same process.

What is timed: device time per call (``gemm.time_on_stream``: the stream held while ten
calls are enqueued, CUDA events around them), median of 7, float32 with TF32 off. Each
product is a linear layer's: ``x [M, K] @ W^T`` with ``W [N, K]`` as stored. The shapes
are Mistral-7B's layer at the zoo's 8 x 512 tokens (query/output, key/value with two
key/value heads, gate/up, down), and the key and value products as one (N = 512) and
the three attention projections as one (N = 4608), to price joining them.

    python bench/gemm_candidates.py            (on a GPU machine)
"""

from __future__ import annotations

import statistics

import torch

import saturn  # noqa: F401
from saturn.codegen.cublaslt import WORKSPACE_BYTES, offer_blas
from saturn.codegen.gemm import GemmPlan, Layout, time_on_stream

GPU = "saturn:1"
SHAPES = {  # name: (M, K, N)
    "q/o 4096x4096x4096": (4096, 4096, 4096),
    "k/v 4096x4096x256": (4096, 4096, 256),
    "k+v 4096x4096x512": (4096, 4096, 512),
    "q+k+v 4096x4096x4608": (4096, 4096, 4608),
    "gate/up 4096x4096x14336": (4096, 4096, 14336),
    "down 4096x14336x4096": (4096, 14336, 4096),
}
LIMITS = (8, 16, 32)


def device_ms(fn, stream: int) -> float:
    return statistics.median(time_on_stream(fn, stream, reps=10) for _ in range(7))


def lay(t: torch.Tensor) -> Layout:
    return Layout("f32", tuple(t.shape), tuple(t.stride()))


def main() -> None:
    torch.backends.cuda.matmul.allow_tf32 = False
    sh = torch.saturn.stream_handle(GPU)
    torch.manual_seed(0)
    print(f"GPU: {torch.cuda.get_device_name(0)}, torch {torch.__version__}")
    blas_buf = torch.empty(WORKSPACE_BYTES, dtype=torch.uint8, device=GPU)
    blas_ws = (blas_buf.data_ptr(), WORKSPACE_BYTES)
    cols = [f"{n} cand." for n in LIMITS] + ["cuBLAS"]
    print(f"{'product':28s} {'torch ms':>9s} " + " ".join(f"{c:>10s}" for c in cols))
    for name, (m, k, n) in SHAPES.items():
        x, w = torch.randn(m, k), torch.randn(n, k) * k**-0.5
        xc, wc = x.cuda(), w.cuda()
        t_torch = device_ms(
            lambda xc=xc, wc=wc: torch.nn.functional.linear(xc, wc),
            torch.cuda.current_stream().cuda_stream,
        )
        want = torch.nn.functional.linear(xc, wc).cpu()
        xs, ws = x.to(GPU), w.to(GPU)
        wt = ws.t()
        out = torch.empty(m, n, device=GPU)
        ptrs = (xs.data_ptr(), wt.data_ptr(), out.data_ptr())
        times = []
        for limit, blas in [(n, "never") for n in LIMITS] + [(LIMITS[0], "always")]:
            with torch.saturn.device(GPU):
                plan = GemmPlan(
                    lay(xs), lay(wt), lay(out), "none", None, ptrs, sh, candidates=limit
                )
                offer_blas(plan, ptrs, blas_ws, blas)
                assert (plan.blas is not None) == (blas == "always")
                times.append(device_ms(lambda plan=plan, ptrs=ptrs: plan.run(ptrs), sh))
            err = (out.cpu() - want).abs().max().item()
            assert err < 1e-3, (name, limit, blas, err)
        print(f"{name:28s} {t_torch:9.3f} " + " ".join(f"{t:10.3f}" for t in times), flush=True)


if __name__ == "__main__":
    main()
