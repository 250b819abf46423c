"""Where the device time of one block goes: kernels by total device time (CUPTI, through
torch.profiler) for eager PyTorch and saturn, per call, after warm-up.

    python bench/profile_blocks.py [--tf32x3] [--bf16] [workload ...]   (on a GPU machine)

``--tf32x3`` profiles saturn with that option as well; ``--bf16`` converts the models and
inputs to bfloat16.
"""

from __future__ import annotations

import copy
import sys
from pathlib import Path

import torch
from cupti import print_kernels  # bench/cupti.py (this script's folder)

import saturn  # noqa: F401

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.compile.blocks import WORKLOADS, make

GPU = "saturn:1"
CALLS = 10


def kernels(fn, x, sync) -> None:
    print_kernels(lambda: fn(x), sync, CALLS)


def main(names: list[str], tf32x3: bool = False, dtype: torch.dtype = torch.float32) -> None:
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    for name in names:
        model, x = make(name)
        model = model.to(dtype)
        x = x.to(dtype) if x.is_floating_point() else x  # token ids stay integers
        with torch.no_grad():
            print(f"{name}: eager")
            kernels(copy.deepcopy(model).cuda(), x.cuda(), torch.cuda.synchronize)
            for opts in ({}, {"tf32x3": True}) if tf32x3 else ({},):
                torch._dynamo.reset()
                sat = torch.compile(
                    copy.deepcopy(model).to(GPU), backend="saturn", dynamic=False, options=opts
                )
                print(f"{name}: saturn{' tf32x3' if opts else ''}")
                kernels(sat, x.to(GPU), lambda: torch.saturn.synchronize(GPU))
        torch.cuda.empty_cache()


if __name__ == "__main__":
    args = [a for a in sys.argv[1:] if a not in ("--tf32x3", "--bf16")]
    dtype = torch.bfloat16 if "--bf16" in sys.argv[1:] else torch.float32
    main(args or list(WORKLOADS), tf32x3="--tf32x3" in sys.argv[1:], dtype=dtype)
