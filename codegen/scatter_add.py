"""The row-add kernel (the ``scatter`` kind): rows of values added into a copy of a
table at a 1-d index with atomic adds, its source per dtype and index type, and its
launcher. An index out of range adds nothing and sets the error word."""

from __future__ import annotations

import numpy as np

from saturn.eqsat.kinds import Kind

from .cubins import KernelError
from .cuda_load import core_stream, load
from .generated import MEMORY_TYPE, Generated, Params
from .launchers import LAUNCHERS, LaunchContext
from .movement import INDEX_TYPES, movement_module
from .take import take_geometry

SCATTER_DTYPES = ("i32", "i64", "f32", "f64")  # the atomic adds codegen/atomics.py emits


# rows shorter than this are added element by element across the grid (``flat``): a block
# per row would leave most of its threads idle (a max pool's backward adds rows of one)
FLAT_BELOW = 32
FLAT_THREADS = 256


def scatter_add_source(fn: str) -> tuple[str, Params]:
    """Rows of ``values`` ([n, d], any strides) added into a packed ``out`` table ([rows,
    d], already holding the base table) at ``index``'s rows (1-D, any stride), each element
    one atomic add: with ``flat``, a thread per element (grid-stride over the n x d
    elements, row by row); otherwise a block per value row (grid-stride over rows), its
    threads across the row. A negative index counts from the end, as PyTorch's index_put;
    one outside [-rows, rows) adds nothing and sets ``err[0]`` (for the launcher to
    raise)."""
    lines = [
        f"def {fn}(out, values, index, err, n, d, rows, vs0, vs1, is0, flat):",
        "    if flat:",
        "        e = numba.int64(cuda.blockIdx.x) * cuda.blockDim.x + cuda.threadIdx.x",
        "        while e < n * d:",
        "            r = e // d",
        "            c = e - r * d",
        "            j = numba.int64(index[r * is0])",
        "            if j < 0:",
        "                j += rows",
        "            if j >= 0 and j < rows:",
        "                atomic_add(out, j * d + c, values[r * vs0 + c * vs1])",
        "            else:",
        "                err[0] = 1",
        "            e += cuda.gridDim.x * cuda.blockDim.x",
        "    r = n if flat else cuda.blockIdx.x",
        "    while r < n:",
        "        j = numba.int64(index[r * is0])",
        "        if j < 0:",
        "            j += rows",
        "        if j >= 0 and j < rows:",
        "            o = j * d",
        "            v = r * vs0",
        "            c = cuda.threadIdx.x",
        "            while c < d:",
        "                atomic_add(out, o + c, values[v + c * vs1])",
        "                c += cuda.blockDim.x",
        "        elif cuda.threadIdx.x == 0:",
        "            err[0] = 1",
        "        r += cuda.gridDim.x",
    ]
    return "\n".join(lines), Params(
        ["out", "values", "index", "err"], ["n", "d", "rows", "vs0", "vs1", "is0", "flat"]
    )


def generate_scatter_add(dtype: str, index: str) -> Generated:
    if dtype not in SCATTER_DTYPES:
        raise KernelError(f"no atomic add kernel for {dtype}")
    if index not in INDEX_TYPES:
        raise KernelError(f"a row add's index is i32 or i64, not {index}")
    fn = f"scatter_add_{dtype}_{index}"
    body, params = scatter_add_source(fn)
    src = movement_module(body, imports="from saturn.codegen.atomics import atomic_add\n")
    t = MEMORY_TYPE[dtype]
    return Generated(fn, src, params, [t, t, INDEX_TYPES[index], "int32"], "scatter")


class ScatterAddKernel:
    """Rows added into a table for one dtype and index dtype (see ``scatter_add_source``),
    compiled at first use. The caller copies the base table into the output first and
    reads the error word after the call."""

    def __init__(self, dtype: str, index: str, cc: tuple[int, int]):
        self.g = generate_scatter_add(dtype, index)
        self.cc = cc
        self._kernel = None
        self._plans: dict[tuple, tuple] = {}

    def launch(
        self,
        stream: int,
        ptrs: tuple[int, int, int, int],
        rows: int,
        values: tuple[tuple[int, ...], tuple[int, ...]],
        index: tuple[tuple[int, ...], tuple[int, ...]],
    ) -> None:
        """``ptrs``: out, values, index, error word; ``rows``: the table's; ``values`` and
        ``index``: (shape, strides) in elements, [n, d] and [n]."""
        from cuda.core import LaunchConfig, launch

        key = (rows, values, index)
        p = self._plans.get(key)
        if p is None:
            (n, d), (vs0, vs1) = values
            if len(index[0]) != 1 or index[0][0] != n:
                raise KernelError(
                    f"a row add of values {[n, d]} got an index of shape {list(index[0])}"
                )
            flat = d < FLAT_BELOW
            if flat:  # a block per FLAT_THREADS elements, under the same bounded grid
                threads = FLAT_THREADS
                blocks, _ = take_geometry(-(-n * d // threads), 1, 1)
            else:
                blocks, threads = take_geometry(n, d, 1)
            ints = [n, d, rows, vs0, vs1, index[1][0], int(flat)]
            p = self._plans[key] = (
                n * d,
                LaunchConfig(grid=blocks, block=threads),
                [np.int64(v) for v in ints],
            )
        count, config, ints = p
        if count == 0:
            return
        if self._kernel is None:
            self._kernel = load(self.g, self.cc)
        launch(core_stream(stream), config, self._kernel, *[np.uint64(q) for q in ptrs], *ints)


@LAUNCHERS.on(Kind.SCATTER)
class ScatterAddLauncher:
    def __init__(self, k, cc: tuple[int, int]) -> None:
        base, index, _ = k.inputs
        self.kernel = ScatterAddKernel(base.dtype, index.dtype, cc)

    def expected(self) -> list[Generated]:
        return []  # built at the first call

    def launch(self, stream: int, out, operands: list, ctx: LaunchContext) -> None:
        base, index, values = operands
        ctx.copy(base, out)  # the table first (on the stream): the adds land on it
        self.kernel.launch(
            stream,
            (out.data_ptr(), values.data_ptr(), index.data_ptr(), ctx.err_ptr),
            base.shape[0],
            (tuple(values.shape), tuple(values.stride())),
            (tuple(index.shape), tuple(index.stride())),
        )
