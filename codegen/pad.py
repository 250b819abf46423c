"""The pad kernel (the ``pad`` kind): a tensor of any strides with a constant border,
its source per element width and rank, the constant as the element's bits, and its
launcher."""

from __future__ import annotations

import math

import numpy as np

from saturn.eqsat.graph import bits_float
from saturn.eqsat.kinds import Kind

from .cubins import KernelError
from .cuda_reads import MEMORY_SIZE
from .generated import Generated, Params
from .launchers import LAUNCHERS, LaunchContext
from .movement import COPY_TYPES, movement_module
from .movement_launch import FlatKernel


def pad_source(width: int, rank: int, fn: str) -> tuple[str, Params]:
    """``x`` (any strides) padded with a constant into a packed output: each coordinate,
    less the padding before it, is compared with x's extent before any read; outside,
    ``fill`` (the constant's bits, as the element's unsigned word)."""
    osz = [f"o{d}" for d in range(rank)]
    isz = [f"s{d}" for d in range(rank)]
    before = [f"b{d}" for d in range(rank)]
    st = [f"st{d}" for d in range(rank)]
    word = COPY_TYPES[width]
    lines = [
        f"def {fn}(out, x, n, fill, {', '.join(osz + isz + before + st)}):",
        "    i = cuda.grid(1)",
        "    step = cuda.gridsize(1)",
        f"    value = numba.{word}(fill)",
        "    while i < n:",
        "        rem = i",
        "        off = 0",
        "        inside = True",
    ]
    for d in reversed(range(rank)):
        lines += [
            f"        c = rem % o{d} - b{d}",
            f"        rem = rem // o{d}",
            f"        inside = inside and c >= 0 and c < s{d}",
            f"        off += c * st{d}",
        ]
    lines += [
        "        if inside:",
        "            out[i] = x[off]",
        "        else:",
        "            out[i] = value",
        "        i += step",
    ]
    return "\n".join(lines), Params(["out", "x"], ["n", "fill", *osz, *isz, *before, *st])


def generate_pad(width: int, rank: int) -> Generated:
    if width not in (1, 2, 4, 8):
        raise KernelError(f"no pad kernel for {width}-byte elements")
    fn = f"pad_w{width}_r{rank}"
    body, params = pad_source(width, rank, fn)
    t = COPY_TYPES[width]
    return Generated(fn, movement_module(body), params, [t, t], "copy")


class PadKernel(FlatKernel):
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


def fill_word(value_bits: int, dtype: str) -> int:
    """A pad's constant (float64 bits) as its element's bits, converted to the dtype as
    PyTorch converts a double (to a half type through float32, rounding to nearest even
    each time; to an integer by truncation), signed for 8-byte elements (the kernel takes
    them as int64), unsigned otherwise."""
    v = bits_float(value_bits)
    size = MEMORY_SIZE[dtype]
    with np.errstate(all="ignore"):
        if dtype == "bool":
            word = int(v != 0)
        elif dtype in ("f64", "f32", "f16"):
            a = np.array(v, dtype=np.float64)
            if dtype != "f64":
                a = a.astype(np.float32)
            if dtype == "f16":
                a = a.astype(np.float16)
            word = int(a.view({2: np.uint16, 4: np.uint32, 8: np.int64}[size]))
        elif dtype == "bf16":
            u = int(np.float32(v).view(np.uint32))
            word = 0x7FC0 if math.isnan(v) else (u + 0x7FFF + ((u >> 16) & 1)) >> 16
        else:  # an integer: truncated toward zero, wrapped to the element's width
            word = int(v) if math.isfinite(v) else 0
    if size == 8:
        return (word + (1 << 63)) % (1 << 64) - (1 << 63)
    return word & ((1 << (8 * size)) - 1)


@LAUNCHERS.on(Kind.PAD)
class PadLauncher:
    def __init__(self, k, cc: tuple[int, int]) -> None:
        x = k.inputs[0]
        self.kernel = PadKernel(MEMORY_SIZE[x.dtype], len(x.shape), cc)
        self.fill = fill_word(k.attrs["value_bits"], x.dtype)
        self.pads = k.attrs["pads"]

    def expected(self) -> list[Generated]:
        return [self.kernel.g]

    def launch(self, stream: int, out, operands: list, ctx: LaunchContext) -> None:
        (x,) = operands
        shape_strides = (tuple(x.shape), tuple(x.stride()))
        self.kernel.launch(
            stream, (out.data_ptr(), x.data_ptr()), shape_strides, self.pads, self.fill
        )
