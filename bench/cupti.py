"""Device time by kernel of a repeated call (CUPTI records, through torch.profiler and the
kineto trace), shared by the profiling scripts. Imports torch only, never saturn, so the
eager side of a benchmark can use it in a process of its own."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

from torch.profiler import ProfilerActivity, profile

TOP = 14


def print_kernels(call, sync, calls: int = 10, top: int = TOP, warmup: int = 5) -> None:
    """Run ``call()`` ``warmup`` times, then profile ``calls`` more, and print the device time
    per call and the ``top`` kernels (or copies, or memsets) by their total time."""
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
    total = sum(t for t, _ in rows.values()) / calls
    count = sum(n for _, n in rows.values()) / calls
    print(f"    device time per call {total:9.1f} us in {count:.0f} kernels")
    for name, (t, n) in sorted(rows.items(), key=lambda r: -r[1][0])[:top]:
        print(f"    {t / calls:9.1f} us  x{n / calls:4.1f}  {name[:110]}")
