"""Device time by kernel of a repeated call (CUPTI records, through torch.profiler and the
kineto trace), shared by the profiling scripts. Imports torch only, never saturn, so the
eager side of a benchmark can use it in a process of its own."""

from __future__ import annotations

import json
import re
import tempfile
from pathlib import Path

from torch.profiler import ProfilerActivity, profile

TOP = 14

# Kernels of the vendor libraries, by name: cuBLAS/cuBLASLt GEMMs and their split-K
# reductions, and every cuDNN kernel (convolutions, fused attention, and eager's batch
# norm, which saturn fuses into a loop instead): what an implementation that calls those
# libraries spends however well the rest is fused. A ceiling takes the smaller of two
# sides' totals, so a kernel one side counts and the other fuses only lowers the floor.
LIBRARY = re.compile(r"gemm|xmma|cutlass|cublas|cudnn|fprop|convolve|fmha|flash|splitK", re.I)


def kernel_table(call, sync, calls: int = 10, warmup: int = 5) -> dict[str, tuple[float, float]]:
    """Run ``call()`` ``warmup`` times, then profile ``calls`` more: for each kernel (or
    copy, or memset) name, its device time per call in us and its launches per call."""
    for _ in range(warmup):
        call()
    sync()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            call()
        sync()
    with tempfile.TemporaryDirectory() as d:
        prof.export_chrome_trace(f"{d}/trace.json")
        trace = json.loads(Path(f"{d}/trace.json").read_text())
    rows: dict[str, tuple[float, int]] = {}
    for e in trace["traceEvents"]:
        if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset"):
            t, n = rows.get(e["name"], (0.0, 0))
            rows[e["name"]] = (t + float(e.get("dur", 0)), n + 1)
    return {name: (t / calls, n / calls) for name, (t, n) in rows.items()}


def library_us(table: dict[str, tuple[float, float]]) -> float:
    """Device time per call of the table's library kernels (``LIBRARY``)."""
    return sum(t for name, (t, _) in table.items() if LIBRARY.search(name))


def print_table(table: dict[str, tuple[float, float]], top: int = TOP) -> None:
    total = sum(t for t, _ in table.values())
    count = sum(n for _, n in table.values())
    print(f"    device time per call {total:9.1f} us in {count:.0f} kernels")
    for name, (t, n) in sorted(table.items(), key=lambda r: -r[1][0])[:top]:
        print(f"    {t:9.1f} us  x{n:4.1f}  {name[:110]}")


def print_kernels(call, sync, calls: int = 10, top: int = TOP, warmup: int = 5) -> None:
    """Profile ``call()`` (see ``kernel_table``) and print the device time per call and the
    ``top`` kernels by their total time."""
    print_table(kernel_table(call, sync, calls, warmup), top)
