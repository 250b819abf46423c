"""Where a CUDA kernel of any kind is launched from: its grid for the sizes of a launch,
its cuda.core kernel (built once per source and architecture, ``cubins.build``), and
saturn's stream as a cuda.core Stream.
"""

from __future__ import annotations

import math
import threading

from .cubins import build
from .cuda_reads import BLOCKS_PER_SM
from .generated import THREADS, Generated

# --- launch geometry -----------------------------------------------------------------


def grid_for(g: Generated, sizes: dict[str, int], sm_count: int = 132) -> tuple[int, int]:
    """(blocks, threads per block) for a launch with these sizes."""
    if g.style == "loop-group":  # threads for the largest of its loops
        n = max(max(sizes[p] for p in g.params.ints), 1)
        return max(1, min(math.ceil(n / THREADS), int(sm_count * BLOCKS_PER_SM))), THREADS
    if g.style in ("loop", "copy"):
        n = max(sizes["n"] // g.lanes, 1)
        # a bounded number of blocks per SM; each thread then strides through the rest
        return max(1, min(math.ceil(n / THREADS), int(sm_count * BLOCKS_PER_SM))), THREADS
    if g.style == "row-warp":
        return max(1, math.ceil(sizes["outer"] / 8)), THREADS
    if g.style == "row-thread":
        rows = math.ceil(sizes["outer"] / THREADS)
        return max(1, min(rows, int(sm_count * BLOCKS_PER_SM))), THREADS
    if g.style == "rows":  # a warp, or part of one, per row
        return max(1, math.ceil(sizes["outer"] / (THREADS // g.row_threads))), THREADS
    if g.style == "rows-block":
        return max(1, sizes["outer"]), g.threads
    if g.style == "row-block":
        return max(1, sizes["outer"]), THREADS
    return max(1, math.ceil(sizes["outer"] * sizes["inner"] / 32)), THREADS


# --- compilation and loading -----------------------------------------------------------

_LOCK = threading.Lock()
_KERNELS: dict[tuple, object] = {}


def load(g: Generated, cc: tuple[int, int]):
    """A cuda.core Kernel for ``g`` on the current context (built, or found in the cache
    on disk: ``cubins.build``)."""
    key = (g.source, cc)
    with _LOCK:
        if key in _KERNELS:
            return _KERNELS[key]
        from cuda.core import ObjectCode

        entry, kind, code = build(g, cc)
        obj = ObjectCode.from_cubin(code) if kind == "cubin" else ObjectCode.from_ptx(code)
        kernel = obj.get_kernel(entry)
        _KERNELS[key] = kernel
        return kernel


_STREAMS: dict[int, object] = {}


def core_stream(handle: int):
    """saturn's stream as a cuda.core Stream (made once per handle)."""
    s = _STREAMS.get(handle)
    if s is None:
        from cuda.core import Stream

        s = _STREAMS[handle] = Stream.from_handle(handle)
    return s
