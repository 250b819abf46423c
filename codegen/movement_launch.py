"""Launchers of the data-movement kernels (``codegen/movement.py`` generates them): copies,
takes, scatter-adds, concatenations and padding, each compiled once per element width and
launched on saturn's stream with raw pointers.
"""

from __future__ import annotations

import math

import numpy as np

from saturn.eqsat.kinds import Kind

from .cubins import (
    KernelError,
)
from .cuda_load import core_stream, grid_for, load
from .cuda_reads import BLOCKS_PER_SM
from .generated import THREADS, Generated
from .movement import (
    ROW_LANES,
    broadcast_of_one,
    concat_pieces,
    fastest_axis,
    fill_vectors,
    fits_narrow,
    generate_concat,
    generate_copy,
    generate_fill,
    generate_pad,
    generate_row_concat,
    generate_row_copy,
    generate_scatter_add,
    generate_take,
    generate_tiled_copy,
    row_concat_arguments,
    row_copy_fits,
    take_geometry,
    take_lanes,
    tiled_grid,
)


class CopyKernel:
    """Strided copies into packed outputs for one element width and rank: a tiled transpose
    when the source's fastest axis is not the output's last, a row copy when the source's
    rows are contiguous, a flat gather otherwise; the last two with 32-bit index arithmetic
    when every index fits."""

    def __init__(self, width: int, rank: int, cc: tuple[int, int]):
        self.width, self.rank, self.cc = width, rank, cc
        self.g = generate_copy(width, rank)
        self._tiled: dict[int, object] = {}
        self._kernels: dict[tuple[str, bool], object] = {}  # (flat|rows, narrow), loaded once

    def _fill(self, stream: int, out_ptr: int, src_ptr: int, n: int) -> None:
        from cuda.core import LaunchConfig, launch

        kernel = self._kernels.get(("fill", False))
        if kernel is None:
            kernel = self._kernels[("fill", False)] = load(generate_fill(self.width), self.cc)
        nv = fill_vectors(self.width, n, out_ptr)
        count = nv + (n - nv * ROW_LANES.get(self.width, 1)) if nv else n
        blocks, threads = grid_for(self.g, {"n": count})
        launch(
            core_stream(stream),
            LaunchConfig(grid=blocks, block=threads),
            kernel,
            np.uint64(out_ptr),
            np.uint64(src_ptr),
            np.int64(nv),
            np.int64(n),
        )

    def _kernel(self, kind: str, narrow: bool):
        k = self._kernels.get((kind, narrow))
        if k is None:
            gen = generate_row_copy if kind == Kind.ROWS else generate_copy
            k = self._kernels[(kind, narrow)] = load(gen(self.width, self.rank, narrow), self.cc)
        return k

    def launch(self, stream: int, out_ptr: int, src_ptr: int, shape, strides) -> None:
        from cuda.core import LaunchConfig, launch

        n = math.prod(shape)
        if n == 0:
            return
        if broadcast_of_one(shape, strides):  # an expanded scalar: a fill
            self._fill(stream, out_ptr, src_ptr, n)
            return
        a = fastest_axis(shape, strides)
        dims = [np.int64(s) for s in shape]
        sts = [np.int64(s) for s in strides]
        if self.rank >= 2 and a != self.rank - 1 and shape[-1] > 1:
            kernel = self._tiled.get(a)
            if kernel is None:
                kernel = self._tiled[a] = load(
                    generate_tiled_copy(self.width, self.rank, a), self.cc
                )
            config = LaunchConfig(grid=tiled_grid(shape, a), block=THREADS)
            launch(
                core_stream(stream),
                config,
                kernel,
                np.uint64(out_ptr),
                np.uint64(src_ptr),
                *dims,
                *sts,
            )
            return
        narrow = fits_narrow(n, shape, strides)
        kernel, count = self._kernel("flat", narrow), n
        if row_copy_fits(self.width, shape, strides, (out_ptr, src_ptr)):
            kernel = self._kernel("rows", narrow)
            count = n // ROW_LANES[self.width]  # vectors, not elements
        blocks, threads = grid_for(self.g, {"n": count})
        launch(
            core_stream(stream),
            LaunchConfig(grid=blocks, block=threads),
            kernel,
            np.uint64(out_ptr),
            np.uint64(src_ptr),
            np.int64(count),
            *dims,
            *sts,
        )


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
            blocks, threads = take_geometry(n, d, 1)
            ints = [n, d, rows, vs0, vs1, index[1][0]]
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


class _FlatKernel:
    """A generated grid-stride kernel (concatenation, pad) compiled at first use, with its
    launch geometry and integer arguments worked out once per operand layout."""

    def __init__(self, g: Generated, cc: tuple[int, int]):
        self.g, self.cc = g, cc
        self._kernel = None
        self._plans: dict[tuple, tuple] = {}

    def _launch(self, stream: int, ptrs: tuple[int, ...], key: tuple, ints_of) -> None:
        """``ints_of()``: (element count, the kernel's integer arguments) for ``key``."""
        from cuda.core import LaunchConfig, launch

        p = self._plans.get(key)
        if p is None:
            n, ints = ints_of()
            blocks, threads = grid_for(self.g, {"n": n})
            config = LaunchConfig(grid=blocks, block=threads)
            p = self._plans[key] = (n, config, [np.int64(v) for v in ints])
        n, config, ints = p
        if n == 0:
            return
        if self._kernel is None:
            self._kernel = load(self.g, self.cc)
        launch(core_stream(stream), config, self._kernel, *[np.uint64(q) for q in ptrs], *ints)


class ConcatKernel(_FlatKernel):
    """Concatenations of ``pieces`` operands for one element width, rank and dim. Pieces
    whose rows are packed (``row_concat_arguments``: a model's feature maps, heads, caches)
    are copied in words of up to 8 bytes by ``generate_row_concat``'s kernel; any other
    layout by the general variant ``concat_pieces`` picks (``concat_source``), built at its
    first use. The launcher checks the operands against the kernel."""

    def __init__(self, width: int, rank: int, dim: int, cc: tuple[int, int], pieces: int = 2):
        super().__init__(generate_concat(width, rank, dim, concat_pieces(pieces)), cc)
        self.width, self.rank, self.dim, self.pieces = width, rank, dim, pieces
        self.empty = concat_pieces(pieces) - pieces  # leading empty pieces of the variant
        self._rows: dict[int, list] = {}  # word -> [source, loaded kernel or None]
        self._row_plans: dict[tuple, tuple | None] = {}

    def expected(self) -> list[Generated]:
        """What a first call most likely launches, to build before it: the 8-byte row
        kernel (the general variant is built only if a layout needs it)."""
        return [self._row_kernel(8)[0]] if self.width <= 8 else [self.g]

    def _row_kernel(self, word: int) -> list:
        if word not in self._rows:
            self._rows[word] = [generate_row_concat(word, concat_pieces(self.pieces)), None]
        return self._rows[word]

    def launch(self, stream: int, ptrs: tuple[int, ...], *pieces: tuple) -> None:
        """``ptrs``: out, then each piece's; ``pieces``: (shape, strides) in elements."""
        if len(pieces) != self.pieces:
            raise KernelError(f"concatenation kernel {self.g.name} got {len(pieces)} pieces")
        key = (pieces, tuple(q % 8 for q in ptrs))
        if key not in self._row_plans:  # a new layout: checked once, then planned
            first = pieces[0][0]
            for sh, _ in pieces:
                if len(sh) != self.rank or any(
                    x != y for k, (x, y) in enumerate(zip(sh, first, strict=True)) if k != self.dim
                ):
                    raise KernelError(
                        f"concatenation kernel {self.g.name}: pieces "
                        f"{[list(s) for s, _ in pieces]} do not join along {self.dim}"
                    )
            self._row_plans[key] = self._row_plan(ptrs, pieces)
        plan = self._row_plans[key]
        if self.empty:  # never read: any pointer will do
            ptrs = (ptrs[0], *[ptrs[1]] * self.empty, *ptrs[1:])
        if plan is not None:
            from cuda.core import launch

            word, config, ints = plan
            entry = self._row_kernel(word)
            if entry[1] is None:
                entry[1] = load(entry[0], self.cc)
            launch(core_stream(stream), config, entry[1], *[np.uint64(q) for q in ptrs], *ints)
            return

        def ints_of():
            try:
                return concat_arguments(self.rank, self.dim, pieces)
            except KernelError as e:
                raise KernelError(f"concatenation kernel {self.g.name}: {e}") from None

        self._launch(stream, ptrs, pieces, ints_of)

    def _row_plan(self, ptrs: tuple[int, ...], pieces: tuple) -> tuple | None:
        from cuda.core import LaunchConfig

        args = row_concat_arguments(self.width, self.dim, pieces, ptrs)
        if args is None:
            return None
        word, rows, longest, ints = args
        variant = concat_pieces(self.pieces)
        most = max(1, 132 * BLOCKS_PER_SM // variant)  # blocks per piece (grid_for's cap)
        blocks = max(1, min(math.ceil(rows * longest / THREADS), most))
        config = LaunchConfig(grid=(blocks, variant), block=THREADS)
        return word, config, [np.int64(v) for v in ints]


def concat_arguments(rank: int, dim: int, pieces: tuple) -> tuple[int, list[int]]:
    """(element count, integer arguments) of the ``concat_pieces`` variant joining
    ``pieces`` ((shape, strides) in elements), its unused leading pieces empty."""
    first = pieces[0][0]
    if any(
        len(sh) != rank
        or any(x != y for k, (x, y) in enumerate(zip(sh, first, strict=True)) if k != dim)
        for sh, _ in pieces
    ):
        raise KernelError(f"pieces {[list(sh) for sh, _ in pieces]} do not join along {dim}")
    empty = concat_pieces(len(pieces)) - len(pieces)
    starts, at = [0] * empty, 0
    for sh, _ in pieces[:-1]:
        at += sh[dim]
        starts.append(at)
    shape = tuple(at + pieces[-1][0][dim] if k == dim else x for k, x in enumerate(first))
    n = math.prod(shape)
    strides = [0] * (empty * rank) + [t for _, st in pieces for t in st]
    return n, [n, *starts, *shape, *strides]


class PadKernel(_FlatKernel):
    """Constant pads for one element width and rank (see ``pad_source``). ``fill``: the
    constant's bits as an unsigned word of the element's width."""

    def __init__(self, width: int, rank: int, cc: tuple[int, int]):
        super().__init__(generate_pad(width, rank), cc)
        self.rank = rank

    def launch(self, stream: int, ptrs: tuple[int, int], x: tuple, pads, fill: int) -> None:
        """``ptrs``: out, x; ``x``: (shape, strides) in elements; ``pads``: (before, after)
        per axis, axis 0 first."""

        def ints_of():
            shape, strides = x
            if len(shape) != self.rank or len(pads) != 2 * self.rank:
                raise KernelError(f"pad kernel {self.g.name} got {list(shape)} and {pads}")
            before = [pads[2 * d] for d in range(self.rank)]
            out = [n + pads[2 * d] + pads[2 * d + 1] for d, n in enumerate(shape)]
            n = math.prod(out)
            return n, [n, fill, *out, *shape, *before, *strides]

        self._launch(stream, ptrs, (x, tuple(pads), fill), ints_of)
