"""Training step time of a TransformerEncoderLayer: eager PyTorch on CUDA against the layer
compiled by saturn (forward and backward graphs, each replayed as a CUDA graph), float32.

What is timed: wall time of forward + loss + backward plus a device synchronize, median of
REPEATS steps after warm-up, at each size in SIZES. The loss ``(y * g).sum()`` (a fixed
random ``g``: an arbitrary upstream gradient) is computed inside the compiled function, and
the gradients are set to None before each step (as ``zero_grad()`` does), so the step is
the compiled forward and backward graphs: eager ops on saturn GPU tensors outside them
(``+=`` into existing gradients, an optimizer step) would run through the CPU fallback.
Eager runs in a child process that never imports saturn (CUDA autograd is not used in a
process that imported saturn), in the same invocation, on the same GPU. saturn's gradients
are checked against eager CPU's on the first step.

    python bench/train.py            (on a GPU machine)
"""

from __future__ import annotations

import json
import subprocess
import sys

import torch
from timing import median_us  # bench/timing.py (this script's folder)

SIZES = ((8, 128, 512), (32, 512, 1024))  # batch, length, width
HEADS = 8
GPU = "saturn:1"
REPEATS = 30


def layer(d: int) -> torch.nn.Module:
    """GELU feed-forward: with ReLU's kink, a pre-activation within rounding of zero takes
    the other branch in one of two float32 implementations, and one token's flip moves a
    weight's gradient by ~1/sqrt(tokens) of its size (1e-2 at 16,384 tokens)."""
    torch.manual_seed(0)
    return torch.nn.TransformerEncoderLayer(
        d, HEADS, 4 * d, dropout=0.0, activation="gelu", batch_first=True
    )


def upstream(b: int, n: int, d: int) -> torch.Tensor:
    return torch.randn(b, n, d, generator=torch.Generator().manual_seed(1)) / (b * n * d) ** 0.5


class Loss(torch.nn.Module):
    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.model = model

    def forward(self, x, g):
        return (self.model(x) * g).sum()


def stepper(loss, x, g):
    """One training step: gradients set to None, then forward, loss and backward."""
    params = list(loss.parameters())

    def step():
        for p in params:
            p.grad = None
        loss(x, g).backward()

    return step


def step_us(loss, x, g, sync) -> float:
    return median_us(stepper(loss, x, g), sync, REPEATS, warmup=5)


def eager_child() -> None:
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    out = {}
    for b, n, d in SIZES:
        x, g = torch.randn(b, n, d, device="cuda"), upstream(b, n, d).cuda()
        out[f"{b}x{n}x{d}"] = step_us(Loss(layer(d).cuda()), x, g, torch.cuda.synchronize)
    print(json.dumps(out))


def saturn_rows(eager: dict) -> list[tuple]:
    import saturn
    from saturn import backend

    rows = []
    for b, n, d in SIZES:
        ref = layer(d)
        x, g = torch.randn(b, n, d), upstream(b, n, d)
        Loss(ref)(x, g).backward()
        model = layer(d).to(GPU)
        torch._dynamo.reset()
        fn = torch.compile(Loss(model), backend="saturn", dynamic=False)
        xd, gd = x.to(GPU), g.to(GPU)
        fn(xd, gd).backward()
        # each parameter's gradient against eager CPU's, relative to its largest entry
        err = max(
            ((p.grad.cpu() - q.grad).abs().max() / q.grad.abs().max()).item()
            for p, q in zip(model.parameters(), ref.parameters(), strict=True)
        )
        graphs = list(backend.CACHE.items.values())[-2:]  # forward, backward
        host = sum(g.compiled.program.count("host") for g in graphs)
        fallbacks = dict(saturn.fallback_counts())
        t = step_us(fn, xd, gd, lambda: torch.saturn.synchronize(GPU))
        after = saturn.fallback_counts()
        # ops that ran through the CPU fallback in the timed steps (none expected)
        per_step = {k: v - fallbacks.get(k, 0) for k, v in after.items() if v != fallbacks.get(k)}
        replays = [g.recipe.runner.replays if g.recipe.runner else 0 for g in graphs]
        rows.append((f"{b}x{n}x{d}", eager.get(f"{b}x{n}x{d}"), t, err, host, replays))
        print(f"{b}x{n}x{d}: CPU-fallback ops in {REPEATS + 5} steps: {per_step}")
    return rows


def main() -> None:
    child = subprocess.run(
        [sys.executable, __file__, "--eager"], capture_output=True, text=True, check=True
    )
    eager = json.loads(child.stdout.strip().splitlines()[-1])
    rows = saturn_rows(eager)
    print(f"GPU: {torch.cuda.get_device_name(0)}, torch {torch.__version__}")
    print(
        f"{'size':14s} {'eager us':>9s} {'saturn us':>10s} {'eager/saturn':>13s} "
        f"{'grad err':>9s} {'host steps':>10s} replays (fw, bw)"
    )
    for size, te, ts, err, host, replays in rows:
        print(f"{size:14s} {te:9.0f} {ts:10.0f} {te / ts:13.2f} {err:9.1e} {host:10d} {replays}")


if __name__ == "__main__":
    if "--eager" in sys.argv[1:]:
        eager_child()
    else:
        main()
