"""Where a zoo model's device time goes: kernels by total device time (CUPTI, through
torch.profiler) for eager CUDA and saturn (and Inductor's default mode with --inductor), per
call, after warm-up (on a GPU machine).

    python bench/profile_zoo.py [--dtype float32|bfloat16] [--size full|tiny] [--inductor]
        [--rewrites RULESET ...] [--training] [--fresh] NAME ...

The models and inputs are ``bench/zoo.py``'s; TF32 is off for both, as in the zoo.
``--training`` profiles saturn's training step (``bench/zoo_training.py``'s: forward,
loss, backward, SGD) and times its parts; with ``--inductor``, eager's and Inductor's
steps first, in a process of their own that never imports saturn (as the zoo's training
rows time them: decision 0069).
"""

from __future__ import annotations

import argparse
import copy
import os
import subprocess
import sys

import torch
import zoo  # bench/zoo.py (this script's folder)
from cupti import print_kernels

GPU = "saturn:1"


def profile(
    name: str,
    dtype: torch.dtype,
    size: str,
    top: int,
    inductor: bool,
    rewrites: tuple[str, ...] = (),
) -> None:
    torch.manual_seed(0)
    model, inputs = zoo.MODELS[name](size)
    model = model.eval().to(dtype)

    def put(dev):
        return tuple(x.to(dev).to(dtype) if x.is_floating_point() else x.to(dev) for x in inputs)

    import saturn  # noqa: F401

    with torch.no_grad():
        print(f"== {name} {dtype}: eager", flush=True)
        m, xs = copy.deepcopy(model).cuda(), put("cuda")
        print_kernels(lambda: m(*xs), torch.cuda.synchronize, top=top)
        torch._dynamo.reset()
        options = {"rewrites": list(rewrites)} if rewrites else None
        sat = torch.compile(
            copy.deepcopy(model).to(GPU), backend="saturn", options=options, dynamic=False
        )
        xg = put(GPU)
        print(f"== {name} {dtype}: saturn", flush=True)
        print_kernels(lambda: sat(*xg), lambda: torch.saturn.synchronize(GPU), top=top)
        if inductor:  # the baseline saturn is measured against, on the same CUDA inputs
            torch._dynamo.reset()
            ind = torch.compile(copy.deepcopy(model).cuda())
            print(f"== {name} {dtype}: inductor", flush=True)
            print_kernels(lambda: ind(*xs), torch.cuda.synchronize, top=top)


def profile_training(name: str, dtype: torch.dtype, size: str, top: int) -> None:
    import zoo_training

    import saturn  # noqa: F401

    model, inputs = zoo.build(name, size)
    m, xs = zoo.moved(model, inputs, GPU, dtype)
    torch._dynamo.reset()
    opt = torch.optim.SGD(m.parameters(), lr=zoo_training.LR)
    step = zoo_training.Step(m, opt, zoo._first, zoo_training.saturn_compile)
    print(f"== {name} {dtype}: saturn, one training step", flush=True)
    sync = lambda: torch.saturn.synchronize(GPU)  # noqa: E731
    print_kernels(lambda: step(xs), sync, top=top)
    phases(step, xs, sync)


def reference_training(name: str, dtype: torch.dtype, size: str, top: int) -> None:
    """Eager's and Inductor's training steps (the zoo's), in this process: one that has not
    imported saturn."""
    import zoo_training

    assert "saturn" not in sys.modules
    model, inputs = zoo.build(name, size)
    sync = torch.cuda.synchronize
    for what, compile in (("eager", None), ("inductor", torch.compile)):
        torch._dynamo.reset()
        m, xs = zoo.moved(model, inputs, "cuda", dtype)
        opt = torch.optim.SGD(m.parameters(), lr=zoo_training.LR)
        step = zoo_training.Step(m, opt, zoo._first, compile)
        print(f"== {name} {dtype}: {what}, one training step", flush=True)
        print_kernels(lambda s=step, x=xs: s(x), sync, top=top)
        phases(step, xs, sync)


def phases(step, xs, sync, repeats: int = 10) -> None:
    """Wall time of each part of the step, synchronized around each (medians, ms): where
    a step's time goes that device time does not show (host work, eager ops)."""
    import statistics
    import time

    parts: dict[str, list[float]] = {}

    def timed(part: str, run):
        sync()
        t = time.perf_counter()
        r = run()
        sync()
        parts.setdefault(part, []).append(time.perf_counter() - t)
        return r

    for _ in range(repeats):
        timed("zero_grad", step.opt.zero_grad)
        scaled, _ = timed("forward and loss", lambda: step.loss_of(*xs))
        timed("backward", scaled.backward)
        timed("update", step.update)
    print(
        f"    phases (ms, median of {repeats}): "
        + ", ".join(f"{k} {1e3 * statistics.median(v):.2f}" for k, v in parts.items()),
        flush=True,
    )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("names", nargs="+")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument("--size", default="full", choices=["tiny", "full"])
    ap.add_argument("--top", type=int, default=12)
    ap.add_argument("--inductor", action="store_true", help="Inductor's kernels too (default mode)")
    ap.add_argument("--rewrites", nargs="*", default=[], help="saturn's opt-in rulesets")
    ap.add_argument("--training", action="store_true", help="saturn's training step")
    ap.add_argument("--reference", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument(
        "--fresh",
        action="store_true",
        help="time saturn's library choices anew, not reuse those on disk (which another "
        "process may have timed while the GPU was shared)",
    )
    a = ap.parse_args()
    if a.fresh:
        os.environ["SATURN_COMPILE_CACHE"] = "0"
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    for name in a.names:
        if a.reference:
            reference_training(name, getattr(torch, a.dtype), a.size, a.top)
        elif a.training:
            if a.inductor:  # eager's and Inductor's steps: a process without saturn
                cmd = [sys.executable, __file__, "--reference", "--dtype", a.dtype]
                cmd += ["--size", a.size, "--top", str(a.top), name]
                env = {**os.environ, "TORCH_DEVICE_BACKEND_AUTOLOAD": "0"}
                subprocess.run(cmd, env=env, check=True)
            profile_training(name, getattr(torch, a.dtype), a.size, a.top)
        else:
            profile(name, getattr(torch, a.dtype), a.size, a.top, a.inductor, tuple(a.rewrites))
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
