"""The roll kernel (the ``roll`` kind): a tensor of any strides rolled along its axes into
a packed output, its source per element width and rank, and its launcher.

Four variants of one index map: element by element or, where the last axis is not rolled
and its rows are contiguous whole aligned vectors (Swin's windows rolled over H and W of
[B, H, W, C]), 16-byte vectors along it; each in 64-bit or (every index below 2^31)
32-bit unsigned arithmetic, whose divisions cost a fraction of 64-bit ones. Measured on an
H100, Swin-T's bfloat16 rolls took 67 us each element by element in 64 bits, against 20 us
for eager's roll kernel (``bench/profile_zoo.py``)."""

from __future__ import annotations

import math

from saturn.eqsat.kinds import Kind
from saturn.eqsat.program import packed_strides

from .cubins import KernelError
from .cuda_reads import MEMORY_SIZE
from .generated import Generated, Params
from .launchers import LAUNCHERS, LaunchContext
from .movement import (
    COPY_TYPES,
    ROW_LANES,
    fits_narrow,
    movement_module,
    narrow_copies,
    row_copy_fits,
)
from .movement_launch import FlatKernel


def roll_source(rank: int, fn: str, narrow: bool = False, lanes: int = 1) -> tuple[str, Params]:
    """``out[i] = x[(i - h) mod s]`` along every axis: each output coordinate plus
    ``s{d} - h{d}`` (shifts in [0, s{d})), brought back into [0, s{d}) by one conditional
    subtraction (no negative value, so unsigned arithmetic holds), then through x's
    strides. Every read is inside x. With ``lanes`` > 1 the kernel steps through ``n``
    vectors of the last axis, which is not rolled and has stride 1 (the launcher checks)."""
    sz = [f"s{d}" for d in range(rank)]
    sh = [f"h{d}" for d in range(rank)]
    st = [f"st{d}" for d in range(rank)]
    u = "u" if narrow else ""
    lines = [
        f"def {fn}(out, x, n, {', '.join(sz + sh + st)}):",
        "    i = cuda.grid(1)",
        "    step = cuda.gridsize(1)",
        *(narrow_copies(sz + sh + st) if narrow else []),
    ]
    rolled = range(rank)
    if lanes > 1:
        rolled = range(rank - 1)
        vr = f"{u}s{rank - 1} // {lanes}"
        lines += [f"    vr = {f'np.uint32({vr})' if narrow else vr}"]
    lines += ["    while i < n:", f"        rem = {'np.uint32(i)' if narrow else 'i'}"]
    if lanes > 1:
        lines += [
            "        k = rem",
            "        rem = k // vr",
            f"        off = (k - rem * vr) * {f'np.uint32({lanes})' if narrow else lanes}",
        ]
    else:
        lines += [f"        off = {'np.uint32(0)' if narrow else '0'}"]
    for d in reversed(rolled):
        lines += [
            f"        c = rem % {u}s{d} + ({u}s{d} - {u}h{d})",
            f"        rem = rem // {u}s{d}",
            f"        if c >= {u}s{d}:",
            f"            c -= {u}s{d}",
            f"        off += c * {u}st{d}",
        ]
    if lanes > 1:
        vals = ", ".join(f"v{k}" for k in range(lanes))
        lines += [
            f"        {vals} = vload{lanes}(x, off)",
            f"        vstore{lanes}(out, i * {lanes}, {vals})",
        ]
    else:
        lines += ["        out[i] = x[off]"]
    lines += ["        i += step"]
    return "\n".join(lines), Params(["out", "x"], ["n", *sz, *sh, *st])


def generate_roll(width: int, rank: int, narrow: bool = False, vectors: bool = False) -> Generated:
    if width not in COPY_TYPES or width == 16:
        raise KernelError(f"no roll kernel for {width}-byte elements")
    lanes = ROW_LANES[width] if vectors else 1
    fn = f"roll_w{width}_r{rank}{'_v' if vectors else ''}{'_n' if narrow else ''}"
    body, params = roll_source(rank, fn, narrow, lanes)
    t = COPY_TYPES[width]
    return Generated(fn, movement_module(body, vectors=vectors), params, [t, t], "copy", lanes)


def roll_variant(width: int, shape, strides, shifts, ptrs) -> tuple[bool, bool]:
    """(narrow, vectors): the roll variant a layout takes (module docstring)."""
    n = math.prod(shape)
    narrow = fits_narrow(n, shape, strides)
    vectors = (
        width in ROW_LANES
        and len(shape) >= 2
        and shifts[-1] == 0
        and row_copy_fits(width, shape, strides, ptrs)
    )
    return narrow, vectors


class RollKernel:
    """Rolls for one element width and rank (see ``roll_source``), each variant compiled
    at its first use."""

    def __init__(self, width: int, rank: int, cc: tuple[int, int]):
        self.width, self.rank, self.cc = width, rank, cc
        self._variants: dict[tuple[bool, bool], FlatKernel] = {}
        # (layout, shifts, pointer alignments) -> (variant, its integer arguments), checked
        # and chosen once per layout as the other movement launchers do
        self._chosen: dict[tuple, tuple[FlatKernel, tuple]] = {}

    def variant(self, narrow: bool, vectors: bool) -> FlatKernel:
        k = self._variants.get((narrow, vectors))
        if k is None:
            g = generate_roll(self.width, self.rank, narrow, vectors)
            k = self._variants[(narrow, vectors)] = FlatKernel(g, self.cc)
        return k

    def _choose(self, ptrs: tuple[int, int], x: tuple, shifts: tuple) -> tuple:
        shape, strides = x
        if len(shape) != self.rank or len(shifts) != self.rank:
            raise KernelError(
                f"roll kernel w{self.width} r{self.rank} got {list(shape)} and {shifts}"
            )
        if any(not 0 <= h < max(s, 1) for h, s in zip(shifts, shape, strict=True)):
            raise KernelError(
                f"roll kernel w{self.width} r{self.rank}: shifts {shifts} of {list(shape)}"
            )
        narrow, vectors = roll_variant(self.width, shape, strides, shifts, ptrs)
        n = math.prod(shape)
        count = n // ROW_LANES[self.width] if vectors else n
        # the grid is sized by elements: it divides n by the variant's lanes
        return self.variant(narrow, vectors), (n, [count, *shape, *shifts, *strides])

    def launch(self, stream: int, ptrs: tuple[int, int], x: tuple, shifts) -> None:
        """``ptrs``: out, x; ``x``: (shape, strides) in elements; ``shifts``: one per axis,
        axis 0 first, each in [0, size)."""
        shifts = tuple(shifts)
        key = (x, shifts, ptrs[0] % 16, ptrs[1] % 16)
        chosen = self._chosen.get(key)
        if chosen is None:
            chosen = self._chosen[key] = self._choose(ptrs, x, shifts)
        kernel, ints = chosen
        kernel._launch(stream, ptrs, (x, shifts), lambda: ints)


@LAUNCHERS.on(Kind.ROLL)
class RollLauncher:
    def __init__(self, k, cc: tuple[int, int]) -> None:
        x = k.inputs[0]
        self.width, self.shape = MEMORY_SIZE[x.dtype], tuple(x.shape)
        self.kernel = RollKernel(self.width, len(x.shape), cc)
        self.shifts = k.attrs["shifts"]

    def expected(self) -> list[Generated]:
        """The variant a packed operand in aligned memory takes (built before the first
        call); another layout builds its own at its first launch."""
        strides = packed_strides(self.shape)
        narrow, vectors = roll_variant(self.width, self.shape, strides, self.shifts, (0, 0))
        return [self.kernel.variant(narrow, vectors).g]

    def launch(self, stream: int, out, operands: list, ctx: LaunchContext) -> None:
        (x,) = operands
        shape_strides = (tuple(x.shape), tuple(x.stride()))
        self.kernel.launch(stream, (out.data_ptr(), x.data_ptr()), shape_strides, self.shifts)
