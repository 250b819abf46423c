"""Training step time of a language model's input block (``Embed`` in
tests/compile/blocks.py: token and position embeddings, then a layer norm): eager PyTorch on
CUDA against the block compiled by saturn, float32, and saturn with the gradient's row adds
left to PyTorch on the host (the importer's ``index_put`` handler removed: how saturn
compiled the backward before decision 0042).

What is timed: wall time of forward + loss ``(y * g).sum()`` + backward plus a device
synchronize, median of bench/train.py's REPEATS steps after warm-up, gradients set to None
before each step.
Eager runs in a child process that never imports saturn (CUDA autograd is not used in a
process that imported saturn), in the same invocation, on the same GPU. saturn's gradients
are checked against eager CPU's on the first step (relative to each gradient's largest
entry: repeated tokens sum in the atomics' order).

    python bench/embed_train.py [--profile]            (on a GPU machine)

``--profile`` prints the device time of one step by kernel (CUPTI), eager's and saturn's,
instead of the timings.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import torch
from cupti import print_kernels  # bench/cupti.py (this script's folder)
from train import Loss, step_us, stepper  # bench/train.py (this script's folder)

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.compile.blocks import make

WORKLOADS = ("embed-8x128x768", "embed-32x512x1024")
GPU = "saturn:1"


def upstream(shape) -> torch.Tensor:
    return torch.randn(shape, generator=torch.Generator().manual_seed(1))


def eager_child(profile: bool) -> None:
    out = {}
    for name in WORKLOADS:
        model, x = make(name)
        g = upstream(model(x).shape)
        loss, x, g = Loss(model.cuda()), x.cuda(), g.cuda()
        if profile:
            print(f"{name}: eager")
            print_kernels(stepper(loss, x, g), torch.cuda.synchronize)
        else:
            out[name] = step_us(loss, x, g, torch.cuda.synchronize)
    print(json.dumps(out))


def saturn_step(
    name: str, host_adds: bool, profile: bool = False
) -> tuple[float, float, int, list]:
    import saturn  # noqa: F401
    from saturn import backend, import_core

    handlers = import_core.HANDLERS
    kept = handlers.pop("aten.index_put.default") if host_adds else None
    try:
        model, x = make(name)
        ref = Loss(model)
        g = upstream(model(x).shape)
        ref(x, g).backward()
        dev = Loss(make(name)[0]).to(GPU)
        torch._dynamo.reset()
        backend.CACHE.clear()
        fn = torch.compile(dev, backend="saturn", dynamic=False)
        xd, gd = x.to(GPU), g.to(GPU)
        fn(xd, gd).backward()
        err = max(
            ((p.grad.cpu() - q.grad).abs().max() / q.grad.abs().max()).item()
            for p, q in zip(dev.parameters(), ref.parameters(), strict=True)
        )
        graphs = list(backend.CACHE.items.values())[-2:]  # forward, backward
        host = sum(c.compiled.program.count("host") for c in graphs)
        sync = lambda: torch.saturn.synchronize(GPU)  # noqa: E731
        if profile:
            print(f"{name}: saturn")
            print_kernels(stepper(fn, xd, gd), sync)
            return 0.0, err, host, []
        t = step_us(fn, xd, gd, sync)
        replays = [c.recipe.runner.replays if c.recipe.runner else 0 for c in graphs]
        return t, err, host, replays
    finally:
        if kept is not None:
            handlers["aten.index_put.default"] = kept


def profile() -> None:
    child = subprocess.run(
        [sys.executable, __file__, "--eager", "--profile"], capture_output=True, text=True
    )
    print(child.stdout.rsplit("\n", 2)[0], child.stderr[-2000:] if child.returncode else "")
    for name in WORKLOADS:
        saturn_step(name, host_adds=False, profile=True)


def main() -> None:
    child = subprocess.run(
        [sys.executable, __file__, "--eager"], capture_output=True, text=True, check=True
    )
    eager = json.loads(child.stdout.strip().splitlines()[-1])
    print(f"GPU: {torch.cuda.get_device_name(0)}, torch {torch.__version__}")
    print(
        f"{'workload':20s} {'impl':22s} {'step us':>9s} {'eager/it':>9s} {'grad err':>9s} "
        f"{'host steps':>10s} replays (fw, bw)"
    )
    for name in WORKLOADS:
        te = eager[name]
        print(f"{name:20s} {'eager':22s} {te:9.0f}")
        for label, host_adds in (("saturn", False), ("saturn, adds on host", True)):
            t, err, host, replays = saturn_step(name, host_adds)
            print(f"{name:20s} {label:22s} {t:9.0f} {te / t:9.2f} {err:9.1e} {host:10d} {replays}")


if __name__ == "__main__":
    if "--eager" in sys.argv[1:]:
        eager_child("--profile" in sys.argv[1:])
    elif "--profile" in sys.argv[1:]:
        profile()
    else:
        main()
