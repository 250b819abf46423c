"""The roll kernel (the ``roll`` kind): a tensor of any strides rolled along its axes into
a packed output, its source per element width and rank, and its launcher."""

from __future__ import annotations

import math

from saturn.eqsat.kinds import Kind

from .cubins import KernelError
from .cuda_reads import MEMORY_SIZE
from .generated import Generated, Params
from .launchers import LAUNCHERS, LaunchContext
from .movement import COPY_TYPES, movement_module
from .movement_launch import FlatKernel


def roll_source(rank: int, fn: str) -> tuple[str, Params]:
    """``out[i] = x[(i - h) mod s]`` along every axis: each output coordinate less its
    shift ``h{d}`` (in [0, s{d})), brought back into [0, s{d}) by one conditional add,
    then through x's strides. Every read is inside x."""
    sz = [f"s{d}" for d in range(rank)]
    sh = [f"h{d}" for d in range(rank)]
    st = [f"st{d}" for d in range(rank)]
    lines = [
        f"def {fn}(out, x, n, {', '.join(sz + sh + st)}):",
        "    i = cuda.grid(1)",
        "    step = cuda.gridsize(1)",
        "    while i < n:",
        "        rem = i",
        "        off = 0",
    ]
    for d in reversed(range(rank)):
        lines += [
            f"        c = rem % s{d} - h{d}",
            f"        rem = rem // s{d}",
            "        if c < 0:",
            f"            c += s{d}",
            f"        off += c * st{d}",
        ]
    lines += ["        out[i] = x[off]", "        i += step"]
    return "\n".join(lines), Params(["out", "x"], ["n", *sz, *sh, *st])


def generate_roll(width: int, rank: int) -> Generated:
    if width not in COPY_TYPES or width == 16:
        raise KernelError(f"no roll kernel for {width}-byte elements")
    fn = f"roll_w{width}_r{rank}"
    body, params = roll_source(rank, fn)
    t = COPY_TYPES[width]
    return Generated(fn, movement_module(body), params, [t, t], "copy")


class RollKernel(FlatKernel):
    """Rolls for one element width and rank (see ``roll_source``)."""

    def __init__(self, width: int, rank: int, cc: tuple[int, int]):
        super().__init__(generate_roll(width, rank), cc)
        self.rank = rank

    def launch(self, stream: int, ptrs: tuple[int, int], x: tuple, shifts) -> None:
        """``ptrs``: out, x; ``x``: (shape, strides) in elements; ``shifts``: one per axis,
        axis 0 first, each in [0, size)."""

        def ints_of():
            shape, strides = x
            if len(shape) != self.rank or len(shifts) != self.rank:
                raise KernelError(f"roll kernel {self.g.name} got {list(shape)} and {shifts}")
            if any(not 0 <= h < max(s, 1) for h, s in zip(shifts, shape, strict=True)):
                raise KernelError(f"roll kernel {self.g.name}: shifts {shifts} of {list(shape)}")
            n = math.prod(shape)
            return n, [n, *shape, *shifts, *strides]

        self._launch(stream, ptrs, (x, tuple(shifts)), ints_of)


@LAUNCHERS.on(Kind.ROLL)
class RollLauncher:
    def __init__(self, k, cc: tuple[int, int]) -> None:
        x = k.inputs[0]
        self.kernel = RollKernel(MEMORY_SIZE[x.dtype], len(x.shape), cc)
        self.shifts = k.attrs["shifts"]

    def expected(self) -> list[Generated]:
        return [self.kernel.g]

    def launch(self, stream: int, out, operands: list, ctx: LaunchContext) -> None:
        (x,) = operands
        shape_strides = (tuple(x.shape), tuple(x.stride()))
        self.kernel.launch(stream, (out.data_ptr(), x.data_ptr()), shape_strides, self.shifts)
