"""The CUDA emitter's data-movement kernels, per element width and rank, not per graph:
strided copies (flat, rows of vectors, tiled transposes) and fills, and what the kinds'
own emitters (take, scatter_add, concat, pad) share. Sources only; ``movement_launch``
launches."""

from __future__ import annotations

import math

from .generated import Generated, Params


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


def movement_module(body: str, vectors: bool = False, imports: str = "") -> str:
    """The module source of a copy, take, row add or concatenation kernel."""
    head = (
        "# generated by saturn.codegen.cuda\nimport numba\nimport numpy as np\n"
        "from numba import cuda\n"
    )
    return head + (VECTOR_IMPORT if vectors else "") + imports + "\n\n" + body + "\n"


def generate_row_copy(width: int, rank: int, narrow: bool = False) -> Generated:
    fn = f"copy_rows_w{width}_r{rank}{'_n' if narrow else ''}"
    body, params = row_copy_source(width, rank, fn, narrow)
    src = movement_module(body, vectors=True)
    t = COPY_TYPES[width]
    return Generated(fn, src, params, [t, t], "copy", ROW_LANES[width])


def generate_fill(width: int) -> Generated:
    fn = f"fill_w{width}"
    body, params = fill_source(width, fn)
    return Generated(
        fn,
        movement_module(body, vectors=width in ROW_LANES),
        params,
        [COPY_TYPES[width]] * 2,
        "copy",
    )


def generate_copy(width: int, rank: int, narrow: bool = False) -> Generated:
    fn = f"copy_w{width}_r{rank}{'_n' if narrow else ''}"
    body, params = copy_source(width, rank, fn, narrow)
    src = movement_module(body)
    t = COPY_TYPES[width]
    return Generated(fn, src, params, [t, t], "copy")


INDEX_TYPES = {"i32": "int32", "i64": "int64"}
