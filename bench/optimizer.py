"""An uncompiled AdamW step on saturn GPU tensors: eager PyTorch on CUDA against saturn's
eager elementwise kernels (decision 0028) and against the counted CPU fallback they
replace, float32.

What is timed: wall time of ``opt.step()`` plus a device synchronize, median of REPEATS
steps after warm-up, over the parameters of a TransformerEncoderLayer of width d (gradients
fixed random tensors, set once). ``foreach`` False (PyTorch's per-parameter loop) and True
(``_foreach_*`` ops, which reach saturn's kernels through PyTorch's per-tensor path).
Eager CUDA runs in a child process that never imports saturn, in the same invocation.

    python bench/optimizer.py            (on a GPU machine)
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time

import torch

WIDTHS = (512, 1024)
GPU = "saturn:1"
REPEATS = 20


def params(d: int, device: str) -> list[torch.nn.Parameter]:
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(d, 8, 4 * d, dropout=0.0, batch_first=True)
    ps = [torch.nn.Parameter(p.detach().to(device)) for p in layer.parameters()]
    g = torch.Generator().manual_seed(1)
    for p in ps:
        p.grad = torch.randn(p.shape, generator=g).to(device) * 1e-3
    return ps


def step_us(ps, foreach: bool, sync, repeats: int = REPEATS) -> float:
    opt = torch.optim.AdamW(ps, lr=1e-3, weight_decay=0.01, foreach=foreach)
    for _ in range(3):
        opt.step()
    sync()
    ts = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        opt.step()
        sync()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts) * 1e6


def eager_child() -> None:
    out = {}
    for d in WIDTHS:
        for foreach in (False, True):
            ps = params(d, "cuda")
            out[f"{d} {foreach}"] = step_us(ps, foreach, torch.cuda.synchronize)
    print(json.dumps(out))


def main() -> None:
    child = subprocess.run(
        [sys.executable, __file__, "--eager"], capture_output=True, text=True, check=True
    )
    eager = json.loads(child.stdout.strip().splitlines()[-1])
    import saturn
    from saturn import eager_pointwise

    def sync():
        torch.saturn.synchronize(GPU)

    print(f"GPU: {torch.cuda.get_device_name(0)}, torch {torch.__version__}")
    print(
        f"{'d':>5s} {'foreach':>7s} {'params':>9s} {'eager us':>9s} {'saturn us':>10s} "
        f"{'fallback us':>12s} {'eager/saturn':>13s} {'host ops/step':>13s}"
    )
    for d in WIDTHS:
        for foreach in (False, True):
            ps = params(d, GPU)
            n = sum(p.numel() for p in ps)
            before = sum(saturn.fallback_counts().values())
            t = step_us(ps, foreach, sync)
            ops = (sum(saturn.fallback_counts().values()) - before) / (REPEATS + 3)
            eager_pointwise.ENABLED = False
            try:
                tf = step_us(params(d, GPU), foreach, sync, repeats=3)
            finally:
                eager_pointwise.ENABLED = True
            te = eager[f"{d} {foreach}"]
            print(
                f"{d:5d} {foreach!s:>7s} {n:9d} {te:9.0f} {t:10.0f} {tf:12.0f} "
                f"{te / t:13.2f} {ops:13.1f}"
            )


if __name__ == "__main__":
    if "--eager" in sys.argv[1:]:
        eager_child()
    else:
        main()
