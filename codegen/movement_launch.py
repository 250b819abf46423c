"""Launchers of the copy kernels (``codegen/movement.py`` generates them), compiled once
per element width and rank and launched on saturn's stream with raw pointers, and the
grid-stride base the concatenation and pad launchers share.
"""

from __future__ import annotations

import math

import numpy as np

from .cuda_load import core_stream, grid_for, load
from .generated import THREADS, Generated
from .movement import (
    ROW_LANES,
    broadcast_of_one,
    fastest_axis,
    fill_vectors,
    fits_narrow,
    generate_copy,
    generate_fill,
    generate_row_copy,
    generate_tiled_copy,
    row_copy_fits,
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

    def _kernel(self, variant: str, narrow: bool):
        k = self._kernels.get((variant, narrow))
        if k is None:
            gen = generate_row_copy if variant == "rows" else generate_copy
            k = self._kernels[(variant, narrow)] = load(gen(self.width, self.rank, narrow), self.cc)
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


class FlatKernel:
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
