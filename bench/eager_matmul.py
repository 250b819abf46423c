"""Eager (uncompiled) matrix multiplies on saturn GPU tensors: eager PyTorch on CUDA against
saturn's cuBLASLt plans (device/eager_matmul.py) and against the CPU fallback they replace.

What is timed: wall time of one ``a @ b`` (float32 with TF32 off, float16, bfloat16) plus a
device synchronize, median of REPEATS calls after warm-up (the first call of a shape plans
and tunes), in one process; the fallback with fewer repeats, and for the half types only up
to 1024 (PyTorch's CPU half products take seconds at 4096).

    python bench/eager_matmul.py            (on a GPU machine)
"""

from __future__ import annotations

import functools
import itertools

import torch
from timing import median_us  # bench/timing.py (this script's folder)

import saturn  # noqa: F401
from saturn import eager_matmul as em

GPU = "saturn:1"
SIZES = (256, 1024, 4096)
REPEATS = 20


def timed(fn, sync, repeats: int = REPEATS) -> float:
    return median_us(fn, sync, repeats)


if __name__ == "__main__":
    torch.backends.cuda.matmul.allow_tf32 = False

    def sync():
        torch.saturn.synchronize(GPU)

    print(f"GPU: {torch.cuda.get_device_name(0)}, torch {torch.__version__}")
    print(
        f"{'dtype':>9s} {'n (n x n @ n x n)':>18s} {'eager CUDA us':>14s} {'saturn us':>10s} "
        f"{'fallback us':>12s}"
    )
    for dtype, n in itertools.product((torch.float32, torch.float16, torch.bfloat16), SIZES):
        a, b = torch.randn(n, n, dtype=dtype), torch.randn(n, n, dtype=dtype)
        ac, bc = a.cuda(), b.cuda()
        asat, bsat = a.to(GPU), b.to(GPU)
        t_cuda = timed(functools.partial(torch.mm, ac, bc), torch.cuda.synchronize)
        gemms = em.GEMMS
        t_sat = timed(functools.partial(torch.mm, asat, bsat), sync)
        assert em.GEMMS > gemms, "saturn ran no library product"
        t_fb = float("nan")
        if dtype == torch.float32 or n <= 1024:
            em_gpu = em._gpu
            em._gpu = lambda t: False  # every product declines: the CPU fallback
            t_fb = timed(functools.partial(torch.mm, asat, bsat), sync, repeats=3)
            em._gpu = em_gpu
        name = str(dtype).removeprefix("torch.")
        print(f"{name:>9s} {n:18d} {t_cuda:14.1f} {t_sat:10.1f} {t_fb:12.1f}")
