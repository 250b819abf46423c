"""The take kernel (the ``gather`` kind): rows of a 2-d table at an index of any rank,
its source per element width, index type, rank and vector lanes, and its launcher. An
index out of range writes zeros and sets the error word the GPU runner reads after the
call."""

from __future__ import annotations

import math

import numpy as np

from saturn.eqsat.kinds import Kind

from .cubins import KernelError
from .cuda_load import core_stream, load
from .cuda_reads import MEMORY_SIZE
from .generated import THREADS, Generated, Params
from .launchers import LAUNCHERS, LaunchContext
from .movement import COPY_TYPES, INDEX_TYPES, ROW_LANES, movement_module


def take_source(width: int, index: str, rank: int, fn: str, lanes: int = 1) -> tuple[str, Params]:
    """Rows of a 2-D table picked by an index of ``rank`` axes (any strides), into a packed
    output: ``out[r, :] = table[index[r], :]``. A block per output row (grid-stride over
    rows), its threads across the row, so the index's address and value are worked out
    once per row, not per element. ``lanes`` > 1: 16-byte vector accesses (the launcher
    checks the table's rows are contiguous and every row start aligned). An index outside
    [0, rows) is never read through: the row is written as zeros and ``err[0]`` set to 1
    (a plain store: every writer stores the same value), for the launcher to raise."""
    dnames = [f"s{d}" for d in range(rank)]
    snames = [f"st{d}" for d in range(rank)]
    vals = ", ".join(f"v{k}" for k in range(lanes))
    lines = [
        f"def {fn}(out, table, index, err, nrows, d, rows, ts0, ts1"
        f"{''.join(', ' + a for a in dnames + snames)}):",
        "    r = cuda.blockIdx.x",
        f"    width = cuda.blockDim.x * {lanes}",
        "    while r < nrows:",
        "        rem = r",
        "        off = 0",
    ]
    for k in reversed(range(rank)):
        lines += [f"        off += (rem % s{k}) * st{k}", f"        rem = rem // s{k}"]
    lines += [
        "        j = numba.int64(index[off])",
        "        o = r * d",
        f"        c = cuda.threadIdx.x * {lanes}",
        "        if j >= 0 and j < rows:",
        "            base = j * ts0",
        "            while c < d:",
    ]
    if lanes > 1:
        lines += [
            f"                {vals} = vload{lanes}(table, base + c)",
            f"                vstore{lanes}(out, o + c, {vals})",
        ]
    else:
        lines += ["                out[o + c] = table[base + c * ts1]"]
    lines += [
        "                c += width",
        "        else:",
        "            if cuda.threadIdx.x == 0:",
        "                err[0] = 1",
        "            while c < d:",
        *(f"                out[o + c + {k}] = 0" for k in range(lanes)),
        "                c += width",
        "        r += cuda.gridDim.x",
    ]
    ints = ["nrows", "d", "rows", "ts0", "ts1", *dnames, *snames]
    return "\n".join(lines), Params(["out", "table", "index", "err"], ints)


def generate_take(width: int, index: str, rank: int, lanes: int = 1) -> Generated:
    if width not in (1, 2, 4, 8):
        raise KernelError(f"no take kernel for {width}-byte elements")
    if index not in INDEX_TYPES:
        raise KernelError(f"a take's index is i32 or i64, not {index}")
    if lanes not in (1, ROW_LANES.get(width)):
        raise KernelError(f"no {lanes}-lane take kernel for {width}-byte elements")
    fn = f"take_w{width}_{index}_r{rank}_v{lanes}"
    body, params = take_source(width, index, rank, fn, lanes)
    src = movement_module(body, vectors=lanes > 1)
    t = COPY_TYPES[width]
    return Generated(fn, src, params, [t, t, INDEX_TYPES[index], "int32"], "take", lanes)


def take_lanes(width: int, table: tuple, ptrs: tuple[int, ...]) -> int:
    """The vector width a take of this table layout can use: 16 bytes where the table's
    rows are contiguous and every row start, in the table and in the output, is aligned."""
    lanes = ROW_LANES.get(width, 1)
    (_, d), (ts0, ts1) = table
    if lanes == 1 or ts1 != 1 or d % lanes or ts0 % lanes or any(p % 16 for p in ptrs):
        return 1
    return lanes


def take_geometry(nrows: int, d: int, lanes: int, sm_count: int = 132) -> tuple[int, int]:
    """(blocks, threads): a block per row up to a bounded grid; a row's vectors across the
    threads, a whole number of warps, at most THREADS."""
    threads = min(THREADS, max(32, -(-d // lanes // 32) * 32))
    return max(1, min(nrows, sm_count * 16)), threads


class TakeKernel:
    """Row takes for one element width, index dtype and index rank (see ``take_source``),
    scalar or vector by the table's layout and alignment (``take_lanes``), each variant
    compiled at first use. The launcher checks the operands' ranks against the kernel; the
    caller reads the error word after the call and raises if it was set."""

    def __init__(self, width: int, index: str, rank: int, cc: tuple[int, int]):
        self.width, self.index, self.rank, self.cc = width, index, rank, cc
        self._kernels: dict[int, object] = {}  # lanes -> loaded kernel
        self._plans: dict[tuple, tuple] = {}

    def launch(
        self,
        stream: int,
        ptrs: tuple[int, int, int, int],
        table: tuple[tuple[int, ...], tuple[int, ...]],
        index: tuple[tuple[int, ...], tuple[int, ...]],
    ) -> None:
        """``ptrs``: out, table, index, error word. ``table`` and ``index``: (shape,
        strides) in elements; the output is packed, ``index shape + (columns,)``."""
        from cuda.core import LaunchConfig, launch

        if len(table[0]) != 2 or len(index[0]) != self.rank:
            raise KernelError(
                f"a take of rank-{self.rank} indices got a table of shape {list(table[0])} "
                f"and an index of shape {list(index[0])}"
            )
        lanes = take_lanes(self.width, table, ptrs[:2])
        key = (table, index, lanes)
        p = self._plans.get(key)
        if p is None:
            (rows, d), (ts0, ts1) = table
            shape, strides = index
            nrows = math.prod(shape)
            blocks, threads = take_geometry(nrows, d, lanes)
            ints = [nrows, d, rows, ts0, ts1, *shape, *strides]
            p = self._plans[key] = (
                nrows * d,
                LaunchConfig(grid=blocks, block=threads),
                [np.int64(v) for v in ints],
            )
        n, config, ints = p
        if n == 0:
            return
        kernel = self._kernels.get(lanes)
        if kernel is None:
            g = generate_take(self.width, self.index, self.rank, lanes)
            kernel = self._kernels[lanes] = load(g, self.cc)
        launch(core_stream(stream), config, kernel, *[np.uint64(q) for q in ptrs], *ints)


@LAUNCHERS.on(Kind.GATHER)
class TakeLauncher:
    def __init__(self, k, cc: tuple[int, int]) -> None:
        table, index = k.inputs
        self.kernel = TakeKernel(MEMORY_SIZE[table.dtype], index.dtype, len(index.shape), cc)

    def expected(self) -> list[Generated]:
        return []  # its variant depends on the table's layout: built at the first call

    def launch(self, stream: int, out, operands: list, ctx: LaunchContext) -> None:
        table, index = operands
        self.kernel.launch(
            stream,
            (out.data_ptr(), table.data_ptr(), index.data_ptr(), ctx.err_ptr),
            (tuple(table.shape), tuple(table.stride())),
            (tuple(index.shape), tuple(index.stride())),
        )
