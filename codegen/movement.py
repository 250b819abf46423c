"""The CUDA emitter's data-movement kernels, per element width (rank, index type, pieces),
not per graph: strided copies (flat, rows of vectors, tiled transposes), fills, takes,
atomic scatter-adds, concatenations, constant padding. Sources only; ``cuda`` launches."""

from __future__ import annotations

import math

from saturn.eqsat.program import MAX_CONCAT

from .cubins import KernelError
from .generated import MEMORY_TYPE, THREADS, Generated, Params


def narrow_copies(names: list[str]) -> list[str]:
    """Kernel-head statements making ``u``-prefixed 32-bit unsigned copies of int64 size and
    stride parameters (the ``narrow`` variants' index arithmetic)."""
    return [f"    u{n} = np.uint32({n})" for n in names]


def _uint32(v: str) -> str:
    return f"np.uint32({v})"


def _copy_head(
    fn: str, count: str, rank: int, narrow: bool
) -> tuple[list[str], list[str], list[str]]:
    """A copy kernel's size and stride names and its first lines: the signature (``out``,
    ``src``, the ``count`` it steps through, sizes, strides), the grid-stride start and,
    for ``narrow``, the 32-bit copies of the sizes and strides."""
    dnames = [f"s{d}" for d in range(rank)]
    snames = [f"st{d}" for d in range(rank)]
    lines = [
        f"def {fn}(out, src, {count}, {', '.join(dnames + snames)}):",
        "    i = cuda.grid(1)",
        "    step = cuda.gridsize(1)",
        *(narrow_copies(dnames + snames) if narrow else []),
    ]
    return dnames, snames, lines


def copy_source(width: int, rank: int, fn: str, narrow: bool = False) -> tuple[str, Params]:
    """A strided copy into a packed output, by element width (bytes) and rank. ``narrow``:
    the index arithmetic in 32-bit unsigned integers (the launcher checks every index fits),
    whose divisions cost a fraction of 64-bit ones."""
    dnames, snames, lines = _copy_head(fn, "n", rank, narrow)
    u = "u" if narrow else ""
    cast = _uint32 if narrow else str
    lines += [
        "    while i < n:",
        f"        rem = {cast('i')}",
        f"        off = {cast('0')}",
    ]
    for d in reversed(range(rank)):
        lines += [f"        off += (rem % {u}s{d}) * {u}st{d}", f"        rem = rem // {u}s{d}"]
    if width == 16:
        lines += ["        out[2 * i] = src[2 * off]", "        out[2 * i + 1] = src[2 * off + 1]"]
    else:
        lines += ["        out[i] = src[off]"]
    lines += ["        i += step"]
    return "\n".join(lines), Params(["out", "src"], ["n", *dnames, *snames])


INDEX32 = 2**31  # narrow index arithmetic when every index stays below this


def fits_narrow(n: int, shape, strides) -> bool:
    """Whether a copy of ``n`` elements from a source of this layout indexes below 2^31."""
    span = sum((s - 1) * abs(st) for s, st in zip(shape, strides, strict=True)) + 1
    return n < INDEX32 and span < INDEX32 and all(0 <= st < INDEX32 for st in strides)


COPY_TYPES = {1: "uint8", 2: "uint16", 4: "uint32", 8: "uint64", 16: "uint64"}
VECTOR_IMPORT = (
    "from saturn.codegen.vector import vload2, vload4, vload8, vstore2, vstore4, vstore8\n"
)
# element width -> elements per vector access in row copies (16 bytes)
ROW_LANES = {2: 8, 4: 4, 8: 2}


def row_copy_source(width: int, rank: int, fn: str, narrow: bool = False) -> tuple[str, Params]:
    """A copy whose source rows (the last axis) are contiguous, as a head permute
    ([B, L, H, D] -> [B, H, L, D]) is: 16-byte loads and stores, and the row's offset worked
    out once per vector instead of per element. The launcher checks that rows split into
    whole aligned vectors (last extent, every other stride and both pointers). ``narrow``
    as for ``copy_source``."""
    lanes = ROW_LANES[width]
    dnames, snames, lines = _copy_head(fn, "nv", rank, narrow)
    vals = ", ".join(f"v{k}" for k in range(lanes))
    u = "u" if narrow else ""
    cast = _uint32 if narrow else str
    lines += [
        f"    vr = {cast(f's{rank - 1} // {lanes}')}",
        "    while i < nv:",
        f"        k = {cast('i')}",
        "        rem = k // vr",
        f"        off = (k - rem * vr) * {cast(str(lanes))}",
    ]
    for d in reversed(range(rank - 1)):
        lines += [f"        off += (rem % {u}s{d}) * {u}st{d}", f"        rem = rem // {u}s{d}"]
    lines += [
        f"        {vals} = vload{lanes}(src, off)",
        f"        vstore{lanes}(out, i * {lanes}, {vals})",
        "        i += step",
    ]
    return "\n".join(lines), Params(["out", "src"], ["nv", *dnames, *snames])


def fill_source(width: int, fn: str) -> tuple[str, Params]:
    """A copy from a source whose every element is its first (an expanded scalar: a zero
    table to add rows into): the element is read once per thread and stored as 16-byte
    vectors (``nv`` of them, from a 16-byte aligned output; 0 where it is not), then one
    element at a time for the rest (``n`` elements). 16-byte elements move as two words."""
    lanes = ROW_LANES.get(width, 1)
    vals = ", ".join(["v"] * lanes)
    lines = [
        f"def {fn}(out, src, nv, n):",
        "    i = cuda.grid(1)",
        "    step = cuda.gridsize(1)",
    ]
    if width == 16:
        lines += [
            "    v0 = src[0]",
            "    v1 = src[1]",
            "    while i < n:",
            "        out[2 * i] = v0",
            "        out[2 * i + 1] = v1",
            "        i += step",
        ]
        return "\n".join(lines), Params(["out", "src"], ["nv", "n"])
    lines += ["    v = src[0]"]
    if lanes > 1:
        lines += [
            "    while i < nv:",
            f"        vstore{lanes}(out, i * {lanes}, {vals})",
            "        i += step",
            f"    i = nv * {lanes} + cuda.grid(1)",
        ]
    lines += ["    while i < n:", "        out[i] = v", "        i += step"]
    return "\n".join(lines), Params(["out", "src"], ["nv", "n"])


def fill_vectors(width: int, n: int, out_ptr: int) -> int:
    """How many 16-byte vectors a fill of ``n`` elements stores (0 when the output is not
    16-byte aligned or the width has no vector form)."""
    lanes = ROW_LANES.get(width)
    return n // lanes if lanes and out_ptr % 16 == 0 else 0


def broadcast_of_one(shape, strides) -> bool:
    """Whether every element of a view is its first (stride 0 along every axis it spans)."""
    return all(st == 0 for s, st in zip(shape, strides, strict=True) if s > 1)


def row_copy_fits(width: int, shape, strides, ptrs) -> bool:
    """Whether the row copy takes this source: contiguous rows of whole aligned vectors."""
    lanes = ROW_LANES.get(width)
    if lanes is None or len(shape) < 2 or strides[-1] != 1 or shape[-1] % lanes:
        return False
    if any(p % 16 for p in ptrs):
        return False
    return all(st % lanes == 0 for n, st in zip(shape[:-1], strides[:-1], strict=True) if n > 1)


def tiled_copy_source(width: int, rank: int, a: int, fn: str) -> tuple[str, Params]:
    """A copy that transposes through shared memory: 32 x 32 tiles over the source's
    fastest axis ``a`` and the output's last axis, so reads and writes both coalesce."""
    b = rank - 1
    e = 2 if width == 16 else 1  # 16-byte elements move as two 8-byte words
    others = [d for d in range(rank) if d not in (a, b)]
    sizes = [f"s{d}" for d in range(rank)]
    strides = [f"st{d}" for d in range(rank)]
    lines = [
        f"def {fn}(out, src, {', '.join(sizes + strides)}):",
        f"    tile = cuda.shared.array((32, {33 * e}), dtype=numba.{COPY_TYPES[width]})",
        "    tx = cuda.threadIdx.x % 32",
        "    ty = cuda.threadIdx.x // 32",
        f"    tiles_b = (s{b} + 31) // 32",
        f"    tiles_a = (s{a} + 31) // 32",
        "    blk = cuda.blockIdx.x",
        "    ib = (blk % tiles_b) * 32",
        "    blk = blk // tiles_b",
        "    ia = (blk % tiles_a) * 32",
        "    rest = blk // tiles_a",
        f"    ost{b} = 1",
    ]
    for d in reversed(range(rank - 1)):
        lines.append(f"    ost{d} = ost{d + 1} * s{d + 1}")
    lines += ["    src_base = 0", "    out_base = 0"]
    for d in reversed(others):
        lines += [
            f"    c{d} = rest % s{d}",
            f"    rest = rest // s{d}",
            f"    src_base += c{d} * st{d}",
            f"    out_base += c{d} * ost{d}",
        ]
    lines += [
        "    j = ty",
        "    while j < 32:",
        f"        if ia + tx < s{a} and ib + j < s{b}:",
        f"            off = src_base + (ia + tx) * st{a} + (ib + j) * st{b}",
    ]
    lines += [f"            tile[tx, j * {e} + {k}] = src[off * {e} + {k}]" for k in range(e)]
    lines += [
        "        j += 8",
        "    cuda.syncthreads()",
        "    j = ty",
        "    while j < 32:",
        f"        if ia + j < s{a} and ib + tx < s{b}:",
        f"            o = out_base + (ia + j) * ost{a} + ib + tx",
    ]
    lines += [f"            out[o * {e} + {k}] = tile[j, tx * {e} + {k}]" for k in range(e)]
    lines += ["        j += 8"]
    return "\n".join(lines), Params(["out", "src"], [*sizes, *strides])


def fastest_axis(shape, strides) -> int:
    """The axis along which the source's elements are adjacent (smallest stride, size > 1).
    A broadcast axis (stride 0) is never it: it repeats elements, it does not walk them (an
    expanded key, ``[B, H, 1, L, D] -> [B, H, R, L, D]``, is a row copy, not a transpose of
    R against D)."""
    axes = [d for d, n in enumerate(shape) if n > 1 and strides[d] != 0]
    return min(axes, key=lambda d: abs(strides[d])) if axes else len(shape) - 1


def generate_tiled_copy(width: int, rank: int, a: int) -> Generated:
    fn = f"copy_tiled_w{width}_r{rank}_a{a}"
    body, params = tiled_copy_source(width, rank, a, fn)
    src = (
        "# generated by saturn.codegen.cuda\nimport numba\nfrom numba import cuda\n\n\n"
        + body
        + "\n"
    )
    t = COPY_TYPES[width]
    return Generated(fn, src, params, [t, t], "tiled-copy")


def tiled_grid(shape, a: int) -> int:
    b = len(shape) - 1
    rest = math.prod(n for d, n in enumerate(shape) if d not in (a, b))
    return math.ceil(shape[a] / 32) * math.ceil(shape[b] / 32) * rest


def _movement_module(body: str, vectors: bool = False, imports: str = "") -> str:
    """The module source of a copy, take, row add or concatenation kernel."""
    head = (
        "# generated by saturn.codegen.cuda\nimport numba\nimport numpy as np\n"
        "from numba import cuda\n"
    )
    return head + (VECTOR_IMPORT if vectors else "") + imports + "\n\n" + body + "\n"


def generate_row_copy(width: int, rank: int, narrow: bool = False) -> Generated:
    fn = f"copy_rows_w{width}_r{rank}{'_n' if narrow else ''}"
    body, params = row_copy_source(width, rank, fn, narrow)
    src = _movement_module(body, vectors=True)
    t = COPY_TYPES[width]
    return Generated(fn, src, params, [t, t], "copy", ROW_LANES[width])


def generate_fill(width: int) -> Generated:
    fn = f"fill_w{width}"
    body, params = fill_source(width, fn)
    return Generated(
        fn,
        _movement_module(body, vectors=width in ROW_LANES),
        params,
        [COPY_TYPES[width]] * 2,
        "copy",
    )


def generate_copy(width: int, rank: int, narrow: bool = False) -> Generated:
    fn = f"copy_w{width}_r{rank}{'_n' if narrow else ''}"
    body, params = copy_source(width, rank, fn, narrow)
    src = _movement_module(body)
    t = COPY_TYPES[width]
    return Generated(fn, src, params, [t, t], "copy")


INDEX_TYPES = {"i32": "int32", "i64": "int64"}


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
    src = _movement_module(body, vectors=lanes > 1)
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


SCATTER_DTYPES = ("i32", "i64", "f32", "f64")  # the atomic adds codegen/atomics.py emits


def scatter_add_source(fn: str) -> tuple[str, Params]:
    """Rows of ``values`` ([n, d], any strides) added into a packed ``out`` table ([rows,
    d], already holding the base table) at ``index``'s rows (1-D, any stride): a block per
    value row (grid-stride over rows), its threads across the row, each element one atomic
    add. A negative index counts from the end, as PyTorch's index_put; one outside
    [-rows, rows) adds nothing and sets ``err[0]`` (for the launcher to raise)."""
    lines = [
        f"def {fn}(out, values, index, err, n, d, rows, vs0, vs1, is0):",
        "    r = cuda.blockIdx.x",
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
        ["out", "values", "index", "err"], ["n", "d", "rows", "vs0", "vs1", "is0"]
    )


def generate_scatter_add(dtype: str, index: str) -> Generated:
    if dtype not in SCATTER_DTYPES:
        raise KernelError(f"no atomic add kernel for {dtype}")
    if index not in INDEX_TYPES:
        raise KernelError(f"a row add's index is i32 or i64, not {index}")
    fn = f"scatter_add_{dtype}_{index}"
    body, params = scatter_add_source(fn)
    src = _movement_module(body, imports="from saturn.codegen.atomics import atomic_add\n")
    t = MEMORY_TYPE[dtype]
    return Generated(fn, src, params, [t, t, INDEX_TYPES[index], "int32"], "scatter")


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
    src = _movement_module(body)
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
    return Generated(fn, _movement_module(body), params, [t] * (pieces + 1), "copy")


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
    return Generated(fn, _movement_module(body), params, [t, t], "copy")
