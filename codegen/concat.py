"""The concatenation kernels (the ``concat`` kind): two to 32 pieces joined along one
axis, a row variant for pieces whose rows are packed and a general one for any layout,
their sources and their launcher."""

from __future__ import annotations

import math

import numpy as np

from saturn.eqsat.kinds import Kind
from saturn.eqsat.program import MAX_CONCAT

from .cubins import KernelError
from .cuda_load import core_stream, load
from .cuda_reads import BLOCKS_PER_SM, MEMORY_SIZE
from .generated import THREADS, Generated, Params
from .launchers import LAUNCHERS, LaunchContext
from .movement import COPY_TYPES, movement_module
from .movement_launch import FlatKernel


def concat_pieces(n: int) -> int:
    """The kernel variant that copies ``n`` pieces: 2, 4, 8, 16 or 32 of them, the unused
    ones first and empty (never chosen), so a model's many ``cat`` lengths build a few
    kernels rather than one per length."""
    if not 2 <= n <= MAX_CONCAT:
        raise KernelError(f"a concatenation of {n} pieces (2 to {MAX_CONCAT})")
    return 1 << (n - 1).bit_length()


def concat_source(rank: int, dim: int, pieces: int, fn: str) -> tuple[str, Params]:
    """``pieces`` operands (any strides) joined along ``dim`` into a packed output: each
    element's coordinate along ``dim`` picks the piece before anything is read, so every
    read lies inside one piece. ``o1``..: where each piece after the first starts along
    ``dim``; ``t{j}_{d}``: piece j's strides."""
    sizes = [f"s{d}" for d in range(rank)]
    starts = [f"o{j}" for j in range(1, pieces)]
    strides = [f"t{j}_{d}" for j in range(pieces) for d in range(rank)]
    srcs = [f"p{j}" for j in range(pieces)]
    lines = [
        f"def {fn}(out, {', '.join(srcs)}, n, {', '.join(starts + sizes + strides)}):",
        "    i = cuda.grid(1)",
        "    step = cuda.gridsize(1)",
        "    while i < n:",
        "        rem = i",
    ]
    for d in reversed(range(rank)):
        lines += [f"        c{d} = rem % s{d}", f"        rem = rem // s{d}"]
    for j in range(pieces):
        start = "0" if j == 0 else f"o{j}"
        coords = [f"(c{d} - {start})" if d == dim and j else f"c{d}" for d in range(rank)]
        offset = " + ".join(f"{c} * t{j}_{d}" for d, c in enumerate(coords))
        if j == pieces - 1:
            test = "        else:" if pieces > 1 else "        if True:"
        else:
            test = f"        {'if' if j == 0 else 'elif'} c{dim} < o{j + 1}:"
        lines += [test, f"            out[i] = p{j}[{offset}]"]
    lines.append("        i += step")
    return "\n".join(lines), Params(["out", *srcs], ["n", *starts, *sizes, *strides])


def generate_concat(width: int, rank: int, dim: int, pieces: int = 2) -> Generated:
    if width not in (1, 2, 4, 8):
        raise KernelError(f"no concatenation kernel for {width}-byte elements")
    if not 0 <= dim < rank:
        raise KernelError(f"a concatenation along dim {dim} of rank {rank}")
    if not 2 <= pieces <= MAX_CONCAT:
        raise KernelError(f"a concatenation of {pieces} pieces (2 to {MAX_CONCAT})")
    fn = f"concat_w{width}_r{rank}_d{dim}" + (f"_n{pieces}" if pieces > 2 else "")
    body, params = concat_source(rank, dim, pieces, fn)
    src = movement_module(body)
    t = COPY_TYPES[width]
    return Generated(fn, src, params, [t] * (pieces + 1), "copy")


def row_concat_source(pieces: int, fn: str) -> tuple[str, Params]:
    """``pieces`` operands whose rows are packed, joined into a packed output: piece ``j``
    is ``rows`` rows of ``l{j}`` words ``r{j}`` words apart, written at column ``c{j}`` of
    output rows ``total`` words long. ``blockIdx.y`` picks the piece (a branch uniform over
    the block); a thread divides once for its first (row, column) and then steps by the
    grid's stride without dividing, so an element costs a load, a store and a few adds
    (the general kernel, ``concat_source``, divides per axis per element)."""
    srcs = [f"p{j}" for j in range(pieces)]
    per = [f"{v}{j}" for v in "lrc" for j in range(pieces)]
    lines = [
        f"def {fn}(out, {', '.join(srcs)}, rows, total, {', '.join(per)}):",
        "    j = cuda.blockIdx.y",
    ]
    for j in range(pieces):
        test = "    else:" if j == pieces - 1 else f"    {'if' if j == 0 else 'elif'} j == {j}:"
        lines += [test, f"        p = p{j}", f"        n = l{j}", f"        rs = r{j}"]
        lines.append(f"        start = c{j}")
    lines += [
        "    if n == 0:",
        "        return",
        "    i = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x",
        "    step = cuda.gridDim.x * cuda.blockDim.x",
        "    r = i // n",
        "    c = i - r * n",
        "    dr = step // n",
        "    dc = step - dr * n",
        "    while r < rows:",
        "        out[r * total + start + c] = p[r * rs + c]",
        "        c += dc",
        "        r += dr",
        "        if c >= n:",
        "            c -= n",
        "            r += 1",
    ]
    return "\n".join(lines), Params(["out", *srcs], ["rows", "total", *per])


def generate_row_concat(word: int, pieces: int) -> Generated:
    if word not in (1, 2, 4, 8):
        raise KernelError(f"no row concatenation kernel for {word}-byte words")
    if not 2 <= pieces <= MAX_CONCAT:
        raise KernelError(f"a concatenation of {pieces} pieces (2 to {MAX_CONCAT})")
    fn = f"concat_rows_b{word}_n{pieces}"
    body, params = row_concat_source(pieces, fn)
    t = COPY_TYPES[word]
    return Generated(fn, movement_module(body), params, [t] * (pieces + 1), "copy")


def row_concat_arguments(
    width: int, dim: int, pieces: tuple, ptrs: tuple[int, ...]
) -> tuple[int, int, int, list[int]] | None:
    """(word bytes, rows, most words of one piece, integer arguments) of the row
    concatenation joining ``pieces`` ((shape, strides) in elements) at ``ptrs`` (output
    first) along ``dim``, the variant's unused leading pieces empty; None unless every
    piece is packed from ``dim`` on and its leading axes collapse to one row stride. The
    word is the widest of 8, 4, 2, 1 bytes dividing every length, row stride, column and
    address."""
    variant = concat_pieces(len(pieces))
    shape0 = pieces[0][0]
    rows = math.prod(shape0[:dim])
    inner = math.prod(shape0[dim + 1 :])
    lengths, strides = [], []
    for shape, st in pieces:
        row, leading, expect = 0, False, 1  # row: the innermost long leading axis's stride
        for d in reversed(range(len(shape)) if shape[dim] * inner else ()):  # empty: unread
            if shape[d] == 1:
                continue
            if d < dim and not leading:
                row, leading, expect = st[d], True, st[d]
            elif st[d] != expect:
                return None
            expect *= shape[d]
        lengths.append(shape[dim] * inner)
        strides.append(row)
    columns = [0]
    for n in lengths[:-1]:
        columns.append(columns[-1] + n)
    total = columns[-1] + lengths[-1]
    nbytes = [v * width for v in (*lengths, *strides, *columns, total)] + list(ptrs)
    words = [w for w in (8, 4, 2, 1) if w >= width and all(b % w == 0 for b in nbytes)]
    if not words:
        return None
    word = words[0]
    k = word // width
    empty = variant - len(pieces)
    ints = (
        [rows, total // k]
        + [0] * empty + [n // k for n in lengths]
        + [0] * empty + [r // k for r in strides]
        + [0] * empty + [c // k for c in columns]
    )  # fmt: skip
    return word, rows, max(lengths) // k, ints


class ConcatKernel(FlatKernel):
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


@LAUNCHERS.on(Kind.CONCAT)
class ConcatLauncher:
    def __init__(self, k, cc: tuple[int, int]) -> None:
        a = k.inputs[0]
        self.kernel = ConcatKernel(
            MEMORY_SIZE[a.dtype], len(a.shape), k.attrs["dim"], cc, len(k.inputs)
        )

    def expected(self) -> list[Generated]:
        return self.kernel.expected()

    def launch(self, stream: int, out, operands: list, ctx: LaunchContext) -> None:
        self.kernel.launch(
            stream,
            (out.data_ptr(), *(p.data_ptr() for p in operands)),
            *((tuple(p.shape), tuple(p.stride())) for p in operands),
        )
