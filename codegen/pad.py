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
from .movement import COPY_TYPES, INDEX32, fits_narrow, movement_module, narrow_copies
from .movement_launch import FlatKernel


def pad_source(width: int, rank: int, fn: str, narrow: bool = False) -> tuple[str, Params]:
    """``x`` (any strides) padded with a constant into a packed output: each coordinate is
    compared with the padding before it and x's extent before any read; outside, ``fill``
    (the constant's bits, as the element's unsigned word). ``narrow``: the index arithmetic
    in 32-bit unsigned integers (the launcher checks every index fits), whose divisions
    cost a fraction of 64-bit ones (a 64-bit pad of ResNet's stem ran at a fifth of the
    memory's speed); a coordinate inside is ``q - b < s`` with ``q >= b``, no sign needed."""
    osz = [f"o{d}" for d in range(rank)]
    isz = [f"s{d}" for d in range(rank)]
    before = [f"b{d}" for d in range(rank)]
    st = [f"st{d}" for d in range(rank)]
    word = COPY_TYPES[width]
    u = "u" if narrow else ""
    lines = [
        f"def {fn}(out, x, n, fill, {', '.join(osz + isz + before + st)}):",
        "    i = cuda.grid(1)",
        "    step = cuda.gridsize(1)",
        f"    value = numba.{word}(fill)",
        *(narrow_copies(osz + isz + before + st) if narrow else []),
        "    while i < n:",
        f"        rem = {'np.uint32(i)' if narrow else 'i'}",
        f"        off = {'np.uint32(0)' if narrow else '0'}",
        "        inside = True",
    ]
    for d in reversed(range(rank)):
        lines += [
            f"        q = rem % {u}o{d}",
            f"        rem = rem // {u}o{d}",
            f"        c = q - {u}b{d} if q >= {u}b{d} else q - q",  # no unsigned wrap
            f"        inside = inside and q >= {u}b{d} and c < {u}s{d}",
            f"        off += c * {u}st{d}",
        ]
    lines += [
        "        if inside:",
        "            out[i] = x[off]",
        "        else:",
        "            out[i] = value",
        "        i += step",
    ]
    return "\n".join(lines), Params(["out", "x"], ["n", "fill", *osz, *isz, *before, *st])


def generate_pad(width: int, rank: int, narrow: bool = False) -> Generated:
    if width not in (1, 2, 4, 8):
        raise KernelError(f"no pad kernel for {width}-byte elements")
    fn = f"pad_w{width}_r{rank}" + ("_n" if narrow else "")
    body, params = pad_source(width, rank, fn, narrow)
    t = COPY_TYPES[width]
    return Generated(fn, movement_module(body), params, [t, t], "copy")


def fits_32(shape, strides, pads) -> bool:
    """Whether a pad of ``shape`` (source ``strides``, in elements) by ``pads`` indexes
    below 2^31 everywhere: the output's elements, the source's span, and each coordinate
    and padding (a coordinate less its padding stays below the output's extent)."""
    out = [v + pads[2 * d] + pads[2 * d + 1] for d, v in enumerate(shape)]
    before = pads[0::2]
    return fits_narrow(math.prod(out), shape, strides) and all(
        0 <= v < INDEX32 for v in (*out, *before)
    )


class PadKernel:
    """Constant pads for one element width and rank (see ``pad_source``), in 32-bit index
    arithmetic where every index of the call fits. ``fill``: the constant's bits as an
    unsigned word of the element's width."""

    def __init__(self, width: int, rank: int, cc: tuple[int, int]):
        self.rank = rank
        self.wide = FlatKernel(generate_pad(width, rank), cc)
        self.narrow = FlatKernel(generate_pad(width, rank, narrow=True), cc)
        self._chosen: dict[tuple, tuple] = {}  # per operand layout: (kernel, n, ints)

    def launch(self, stream: int, ptrs: tuple[int, int], x: tuple, pads, fill: int) -> None:
        """``ptrs``: out, x; ``x``: (shape, strides) in elements; ``pads``: (before, after)
        per axis, axis 0 first."""
        key = (x, tuple(pads), fill)
        plan = self._chosen.get(key)
        if plan is None:
            shape, strides = x
            if len(shape) != self.rank or len(pads) != 2 * self.rank:
                raise KernelError(f"pad kernel {self.wide.g.name} got {list(shape)} and {pads}")
            before = [pads[2 * d] for d in range(self.rank)]
            out = [v + pads[2 * d] + pads[2 * d + 1] for d, v in enumerate(shape)]
            n = math.prod(out)
            kernel = self.narrow if fits_32(shape, strides, pads) else self.wide
            plan = self._chosen[key] = (kernel, n, [n, fill, *out, *shape, *before, *strides])
        kernel, n, ints = plan
        kernel._launch(stream, ptrs, key, lambda: (n, ints))


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
        # the variant a packed operand of the traced shape takes (a first call builds it)
        shape = tuple(x.shape)
        packed = [math.prod(shape[d + 1 :]) for d in range(len(shape))]
        fits = fits_32(shape, packed, self.pads)
        self.traced = self.kernel.narrow if fits else self.kernel.wide

    def expected(self) -> list[Generated]:
        return [self.traced.g]

    def launch(self, stream: int, out, operands: list, ctx: LaunchContext) -> None:
        (x,) = operands
        shape_strides = (tuple(x.shape), tuple(x.stride()))
        self.kernel.launch(
            stream, (out.data_ptr(), x.data_ptr()), shape_strides, self.pads, self.fill
        )
