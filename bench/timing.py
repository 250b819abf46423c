"""Wall-clock timing shared by the eager benchmarks: a call plus a device synchronize."""

from __future__ import annotations

import statistics
import time


def median_us(fn, sync, repeats: int, warmup: int = 3) -> float:
    """Median wall time of ``fn(); sync()`` over ``repeats`` calls after ``warmup``, in us."""
    return pipelined_us(fn, sync, repeats, calls=1, warmup=warmup)


def pipelined_us(fn, sync, repeats: int, calls: int = 20, warmup: int = 3) -> float:
    """Median over ``repeats`` of the wall time of ``calls`` back-to-back calls and one
    synchronize, per call, in us: each call's host work overlaps the device work queued
    before it, so where the device work is the longer this is the device time per call."""
    for _ in range(warmup):
        fn()
    sync()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        sync()
        times.append((time.perf_counter() - t0) / calls)
    return statistics.median(times) * 1e6
