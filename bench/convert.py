"""Dtype conversions and a bfloat16 update on saturn GPU tensors, uncompiled: eager PyTorch
on CUDA against saturn's device kernels (decision 0029) and against the trip through the
host they replace (saturn with its eager kernels turned off).

What is timed: wall time of one op plus a device synchronize, median of REPEATS calls after
warm-up, for ``x.to(torch.bfloat16)``, ``x.to(torch.float16)`` and ``b.float()`` over N
float32 / bfloat16 elements, and ``b.add_(c, alpha=-0.01)`` in bfloat16. Eager CUDA runs in
the same process (no autograd is involved).

    python bench/convert.py            (on a GPU machine)
"""

from __future__ import annotations

import torch
from timing import median_us  # bench/timing.py (this script's folder)

import saturn
from saturn import eager_pointwise as ep

GPU = "saturn:1"
SIZES = (1 << 20, 1 << 24)
REPEATS = 20


def timed(fn, sync, repeats: int = REPEATS) -> float:
    return median_us(fn, sync, repeats)


def cases(device: str, n: int) -> dict:
    x = torch.randn(n, device=device)
    b = x.to(torch.bfloat16)
    c = torch.randn(n, device=device).to(torch.bfloat16)
    return {
        "f32 -> bf16": lambda: x.to(torch.bfloat16),
        "f32 -> f16": lambda: x.to(torch.float16),
        "bf16 -> f32": lambda: b.float(),
        "bf16 add_ alpha": lambda: b.add_(c, alpha=-0.01),
    }


if __name__ == "__main__":
    print(f"GPU: {torch.cuda.get_device_name(0)}, torch {torch.__version__}")
    print(
        f"{'op':18s} {'elements':>10s} {'eager CUDA us':>14s} {'saturn us':>10s} "
        f"{'via host us':>12s}"
    )
    for n in SIZES:
        cuda = cases("cuda", n)
        sat = cases(GPU, n)
        for name in cuda:
            t_cuda = timed(cuda[name], torch.cuda.synchronize)
            copies, fallbacks = ep.DEVICE_COPIES, sum(saturn.fallback_counts().values())
            t_sat = timed(sat[name], lambda: torch.saturn.synchronize(GPU))
            copies = ep.DEVICE_COPIES - copies
            fallbacks = sum(saturn.fallback_counts().values()) - fallbacks
            ep.ENABLED = False
            t_host = timed(sat[name], lambda: torch.saturn.synchronize(GPU), repeats=5)
            ep.ENABLED = True
            print(
                f"{name:18s} {n:10d} {t_cuda:14.1f} {t_sat:10.1f} {t_host:12.1f}"
                f"   (saturn: {copies} device copies, {fallbacks} fallbacks)"
            )
