"""The fastest a float32 torch.compile backend can be on each block, against eager.

A compiled call cannot return before dynamo has run its guards and called the backend's
function, and its GEMMs and convolutions cannot start before that call launches them. In
float32 without TF32 those are cuBLAS's and cuDNN's kernels, the ones eager runs (saturn
plans the same libraries and keeps the fastest plan it times). So, for any backend,

    call >= dynamo's own per-call host time + the library kernels' device time

and the largest speed-up over eager that float32 allows is

    ceiling = eager call / (dynamo host + library device time)

which counts every other kernel, every crossing and all of the backend's own host work as
free. What is timed, per workload (tests/compile/blocks.py), no_grad, TF32 off:
  eager call    call + synchronize of eager CUDA, median of 50 (as bench/blocks.py)
  library       device time per call of the cuBLAS/cuDNN kernels (CUPTI, bench/cupti.py's
                LIBRARY pattern), the smaller of eager's and saturn's
  dynamo host   host time of a call compiled with a backend that does nothing (it returns
                outputs computed once), median of 50: dynamo's guards and wrapper alone
  saturn call   saturn's call + synchronize, median of 50, for comparison

    python bench/ceiling.py [workload ...]      (on a GPU machine)
"""

from __future__ import annotations

import copy
import sys
from functools import partial
from pathlib import Path

import torch
from blocks import GPU, saturn_sync, start, timed  # bench/blocks.py (this script's folder)
from cupti import LIBRARY, kernel_table, library_us

import saturn  # noqa: F401

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.compile.blocks import WORKLOADS, make

ISSUE_TARGET = 1.3  # saturn at least 1.3x faster than eager on every block


def _no_op_backend(gm, example_inputs):
    """A backend whose compiled function does no work: dynamo's per-call cost alone."""
    outputs = gm(*example_inputs)
    return lambda *args: outputs


def main(names: list[str]) -> None:
    start()
    cuda_sync = torch.cuda.synchronize
    rows = []
    for name in names:
        model, x = make(name)
        with torch.no_grad():
            m_cuda, xc = copy.deepcopy(model).cuda(), x.cuda()
            eager_call, _ = timed(m_cuda, xc, cuda_sync)
            eager = kernel_table(partial(m_cuda, xc), cuda_sync)
            torch._dynamo.reset()
            bare = torch.compile(m_cuda, backend=_no_op_backend, dynamic=False)
            _, dynamo_host = timed(bare, xc, cuda_sync)
            torch._dynamo.reset()
            sat = torch.compile(copy.deepcopy(model).to(GPU), backend="saturn", dynamic=False)
            xs = x.to(GPU)
            saturn_call, _ = timed(sat, xs, saturn_sync)
            ours = kernel_table(partial(sat, xs), saturn_sync)
        lib_e, lib_s = library_us(eager), library_us(ours)
        ceiling = eager_call / (dynamo_host + min(lib_e, lib_s))
        rows.append((name, eager_call, lib_e, lib_s, dynamo_host, ceiling, saturn_call))
        print(f"\n{name}: library kernels (eager | saturn), us per call")
        for side, table in (("eager", eager), ("saturn", ours)):
            for k, (t, n) in sorted(table.items(), key=lambda r: -r[1][0]):
                if LIBRARY.search(k):
                    print(f"  {side:6s} {t:9.1f} x{n:4.1f}  {k[:100]}")
        del m_cuda, xc, bare, sat, xs
        torch.cuda.empty_cache()
    print(
        f"\n{'workload':22s} {'eager call':>10s} {'lib eager':>10s} {'lib saturn':>10s}"
        f" {'dynamo':>8s} {'ceiling':>8s} {'saturn':>8s} {'saturn x':>8s}"
    )
    for name, call, lib_e, lib_s, dyn, ceiling, sat_call in rows:
        mark = "" if ceiling >= ISSUE_TARGET else f"  < {ISSUE_TARGET}x"
        print(
            f"{name:22s} {call:10.1f} {lib_e:10.1f} {lib_s:10.1f} {dyn:8.1f} {ceiling:7.2f}x"
            f" {sat_call:8.1f} {call / sat_call:7.2f}x{mark}"
        )


if __name__ == "__main__":
    main(sys.argv[1:] or [w for w in WORKLOADS if not w.startswith("embed")])
