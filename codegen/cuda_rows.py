"""CUDA rows kernels (softmax, layer norm and the loops fused into them): a warp (or a block,
or a thread for short rows) per row, several passes over the row, operands kept in
registers or shared memory between passes where they fit (``row_cache``).
"""

from __future__ import annotations

import math
from collections.abc import Callable

from saturn.eqsat.program import TAKE_TABLES, Kernel, leaves

from .cubins import (
    KernelError,
)
from .cuda_reads import (
    MEMORY_SIZE,
    _combine,
    _group,
    _identity,
    _operand_reads,
    _row_constant,
    _row_trailing,
    _store,
    _vector_reads,
    compute_dtype,
    load_expr,
    store_expr,
    stored_body,
    vector_lanes,
)
from .expr import NUMBA_TYPE, BodyWriter
from .generated import NUMBA_SCALAR, THREADS, Params
from .lane_body import LaneBodies
from .movement import (
    INDEX_TYPES,
)

ROWS_PER_BLOCK = THREADS // 32  # rows kernels: a warp per row


def _used(e: tuple) -> set[int]:
    """The operands a body reads."""
    return {leaf[1] for leaf in leaves(e) if leaf[0] == "in"}


def rows_lanes(k: Kernel) -> int:
    """Elements per vector access in a rows kernel: as in loops, when no operand is strided
    and the row length is a multiple (so every row starts aligned)."""
    if any(o.indexing == "strided" for o in k.inputs):
        return 1
    lanes = vector_lanes(k)
    return lanes if k.domain and k.domain[-1] % lanes == 0 else 1


ROW_REGISTERS = 64  # most operand values per thread a rows kernel keeps between its passes


# Rows whose kept operands take fewer bytes than this are re-read instead: measured on the
# H200 (16,384 rows of 1,024 float32), a row of one operand re-read from L1 is as fast as
# kept (the registers cost occupancy: 93 us re-read against 113 us kept; an embedding's
# layer norm 84 against 133), while two operands (8 KB a row, more than L1 holds for all
# the SM's warps) go from 150 us re-read to 92 us kept.
ROW_CACHE_BYTES = 8192


def _row_strided_head(k: Kernel) -> list[str]:
    """Each strided operand's offset at the row's start (``sb{i}``), its coordinates over
    the leading axes divided out once per row: an element then reads ``sb{i} + r * stride``
    (a causal mask broadcast over heads, [B, 1, S, S] under [B, H, S, S], divided out
    along four axes at every element of every pass took 1.1 ms of float32 OPT's 1.3 ms
    softmax on the H200)."""
    strided = [i for i, o in enumerate(k.inputs) if o.indexing == "strided"]
    rank = len(k.domain)
    if not strided or not rank:
        return []
    lines = ["        hrem = row", *(f"        sb{i} = 0" for i in strided)]
    for d in reversed(range(rank - 1)):
        lines += [f"        hc = hrem % s{d}", f"        hrem = hrem // s{d}"]
        lines += [f"        sb{i} += hc * st{i}_{d}" for i in strided]
    return lines


def _row_constant_head(k: Kernel) -> list[str]:
    """The row-constant operands' values (``_row_constant``), read at the row's start."""
    lines = []
    for i, o in enumerate(k.inputs):
        if not _row_constant(k, i):
            continue
        if o.indexing == "middle":
            g = _group(k, i)
            at = f"((row * red) // r{g}) % m{g}"
        else:
            at = f"(row * red) // r{i}"
        lines.append(f"        rc{i} = {load_expr(o.dtype, f'in{i}[{at}]')}")
    return lines


def _row_indexed(k: Kernel, i: int) -> bool:
    """Whether operand i holds a row of its own for each row: what a rows kernel may keep.
    Trailing operands are read from cache instead, with no division (``_row_trailing``):
    keeping an embedding block's position rows next to its token rows measured slower on
    the H200 (16,384 rows of 1,024: 68.6 us kept against 53.9 us re-read)."""
    return k.inputs[i].indexing in ("same", "strided", "table")


def row_cache(k: Kernel, width: int, lanes: int) -> tuple[int, list[int]] | None:
    """(steps per pass, operands kept) where a rows kernel keeps the row in registers: the
    row-indexed operands (``_row_indexed``) its stages read, loaded once in the first
    pass, when they fit ``ROW_REGISTERS`` values per thread and take at least
    ``ROW_CACHE_BYTES`` a row; None otherwise (later passes re-read the row, mostly from
    cache)."""
    if not k.stages or not k.domain:
        return None
    steps = math.ceil(k.domain[-1] / (width * lanes))
    used = set().union(*(_used(st.body) for st in k.stages))
    kept = [i for i in sorted(used) if _row_indexed(k, i)]
    row_bytes = k.domain[-1] * sum(MEMORY_SIZE[k.inputs[i].dtype] for i in kept)
    short = width < 32 and ROW_SEGMENT_KEEP  # short rows by parts of a warp: kept if they fit
    if not kept or steps * lanes * len(kept) > ROW_REGISTERS:
        return None
    return (steps, kept) if short or row_bytes >= ROW_CACHE_BYTES else None


def rows_source(k: Kernel, fn: str, lanes: int = 1) -> tuple[str, Params]:
    """A ``rows`` kernel (``fuse_rows``): a warp (or a block, ``rows_threads``) per row
    computes the stages in order (each a pass over the row, reduced across its threads and
    broadcast to all of them), then a last pass writes the body.
    Where the row fits in registers (``row_cache``) each pass is a loop of a constant
    number of steps and the first one loads the row-indexed operands into arrays that the
    later passes read: the row crosses from memory once. NVVM unrolls such loops fully and
    promotes the arrays to registers (no local memory: ``test_cuda_emitter``), so the code
    is that of unrolled steps, written once (unrolled in the source, DeiT-tiny's layer norm
    took Numba 17 s to compile, 3 s as a loop, for the same PTX). Otherwise later passes
    re-read the row (mostly from cache).
    With ``lanes`` > 1 a lane takes that many adjacent elements per step, packed operands
    and the output as one vector access."""
    rank = len(k.domain)
    dnames = [f"s{d}" for d in range(rank)]
    uses_shape = any(o.indexing == "strided" for o in k.inputs)
    ind = "            "
    ints = _operand_reads(k, "j", rank, dnames, ind)[1]  # the int params every read uses
    take = k.attrs.get("take")
    stats = k.attrs.get("stats", ())  # per-row values written beside the output
    params = Params(
        [
            "out",
            *[f"in{i}" for i in range(len(k.inputs))],
            *(["err"] if take else []),
            *[f"stat{j}" for j in range(len(stats))],
        ],
        ["outer", "red", *(dnames if uses_shape else []), *ints, *(["rows"] if take else [])],
    )
    width = rows_threads(k, lanes)  # threads sharing a row
    block = width > 32
    first = "tid" if block else "lane"
    cache = row_cache(k, width, lanes)
    kept = cache[1] if cache else []

    def var(i: int, u: int) -> str:
        """Operand i's value at lane u."""
        return f"in{i}_v{u}" if lanes > 1 else f"in{i}_v"

    def reads(used: set[int]) -> list[str]:
        """Reads of the operands in ``used``."""
        if lanes > 1:
            return _vector_reads(k, lanes, rank, dnames, ind, used)
        return _operand_reads(k, "j", rank, dnames, ind, used=used)[0]

    lane = LaneBodies(fn)

    def bodies(e: tuple, tag: str) -> tuple[list[str], list[str]]:
        """Statements and result variables of ``e`` for each lane of a step: with vector
        lanes, a call of the body's function per lane (``LaneBodies``)."""
        lines, results = [], []
        if lanes > 1:
            for u in range(lanes):
                call, _ = lane.call(
                    e,
                    lambda i: compute_dtype(k.inputs[i].dtype),
                    lambda i, u=u: var(i, u),
                    stage_vars.__getitem__,
                )
                lines.append(f"{ind}b{tag}u{u} = {call}")
                results.append(f"b{tag}u{u}")
            return lines, results
        for u in range(lanes):
            w = BodyWriter(
                lambda i, u=u: var(i, u),
                lambda i: compute_dtype(k.inputs[i].dtype),
                f"{tag}u{u}",
                stage_vars.__getitem__,
            )
            res, _ = w.emit(e)
            lines += [ind + b for b in w.lines]
            results.append(res)
        return lines, results

    def passes(e: tuple, tag: str, step: Callable[[list[str], list[str]], list[str]], load: set):
        """One pass over the row: a loop of steps while the row lasts, or (row in registers)
        a loop of a constant number of steps; ``load``: the kept operands this pass loads
        into their arrays (the first pass loads them all), later passes read them there."""
        used = _used(e)
        body_lines, results = bodies(e, tag)
        if cache is None:
            return [
                f"        r = {first} * {lanes}",
                "        while r < red:",
                "            j = row * red + r",
                *reads(used),
                *body_lines,
                *step(body_lines, results),
                f"{ind}r += {width * lanes}",
            ]
        held = sorted(used & set(kept))
        at = [f"t * {lanes} + {u}" for u in range(lanes)]
        return [
            f"        for t in range({cache[0]}):",
            f"            r = {first} * {lanes} + t * {width * lanes}",
            "            if r < red:",
            *(
                "    " + ln
                for ln in [
                    "            j = row * red + r",
                    *reads((used - set(kept)) | load),
                    *(
                        f"{ind}h{i}[{at[u]}] = {var(i, u)}"
                        for i in sorted(load)
                        for u in range(lanes)
                    ),
                    *(
                        f"{ind}{var(i, u)} = h{i}[{at[u]}]"
                        for i in held
                        if i not in load
                        for u in range(lanes)
                    ),
                    *body_lines,
                    *step(body_lines, results),
                ]
            ),
        ]

    stage_vars: list[tuple[str, str]] = []
    if block:  # a block per row (long rows)
        lines = [
            f"def {fn}({params.signature()}):",
            "    tid = cuda.threadIdx.x",
            "    row = cuda.blockIdx.x",
            "    if row < outer:",
        ]
    elif width == 32:  # a warp per row, several rows per block
        lines = [
            f"def {fn}({params.signature()}):",
            "    lane = cuda.threadIdx.x % 32",
            f"    row = cuda.blockIdx.x * {ROWS_PER_BLOCK} + cuda.threadIdx.x // 32",
            "    if row < outer:",  # a whole warp shares its row: the shuffles see all 32 lanes
        ]
    else:  # part of a warp per row (short rows): a row past the end computes the last one
        # again without storing it, so that every lane of a warp takes part in its shuffles
        lines = [
            f"def {fn}({params.signature()}):",
            f"    lane = cuda.threadIdx.x % {width}",
            f"    row = cuda.blockIdx.x * {THREADS // width} + cuda.threadIdx.x // {width}",
            "    live = row < outer",
            "    if not live:",
            "        row = outer - 1",
            "    base = cuda.threadIdx.x % 32 - lane",  # the row's first lane in its warp
            "    if row >= 0:",  # outer == 0: no thread has a row
        ]
    if take is not None:
        lines += _take_head(k, take, first)
    lines += [
        f"        pb{i} = (row % (m{i} // red)) * red"
        for i in range(len(k.inputs))
        if _row_trailing(k, i)
    ]
    lines += _row_constant_head(k)
    lines += _row_strided_head(k)
    if cache is not None:  # the kept row: an array per operand, indexed by constants once
        # the compiler unrolls the constant-trip step loops, so it lives in registers
        lines += [
            f"        h{i} = cuda.local.array({cache[0] * lanes}, "
            f"{NUMBA_TYPE[compute_dtype(k.inputs[i].dtype)]})"
            for i in kept
        ]
    for j, st in enumerate(k.stages):
        acc, acc_t = f"acc{j}", st.acc_dtype

        def combine(_, results, acc=acc, st=st, acc_t=acc_t):
            return [
                f"{ind}{acc} = {_combine(st.reduce, acc, f'{NUMBA_TYPE[acc_t]}({res})')}"
                for res in results
            ]

        lines.append(f"        {acc} = {_identity(st.reduce, acc_t)}")
        lines += passes(st.body, f"s{j}", combine, set(kept) if j == 0 else set())
        shfl = _combine(st.reduce, acc, f"cuda.shfl_down_sync(0xFFFFFFFF, {acc}, off)")
        lines += [
            f"        off = {min(width, 32) // 2}",
            "        while off > 0:",
            f"            {acc} = {shfl}",
            "            off //= 2",
        ]
        if block:  # the warps' partial results through shared memory, then to every thread
            parts, scalar = width // 32, NUMBA_SCALAR[acc_t]
            ident = _identity(st.reduce, acc_t)
            lines += [
                f"        part{j} = cuda.shared.array({parts + 1}, dtype=numba.{scalar})",
                "        if tid % 32 == 0:",
                f"            part{j}[tid // 32] = {acc}",
                "        cuda.syncthreads()",
                "        if tid < 32:",
                f"            {acc} = part{j}[tid] if tid < {parts} else {ident}",
                "            off = 16",
                "            while off > 0:",
                f"                {acc} = {shfl}",
                "                off //= 2",
                "            if tid == 0:",
                f"                part{j}[{parts}] = {acc}",
                "        cuda.syncthreads()",
                f"        {acc} = part{j}[{parts}]",
            ]
        else:  # the row's first lane holds its result (it read only lanes of its row)
            first_lane = "0" if width == 32 else "base"
            lines.append(f"        {acc} = cuda.shfl_sync(0xFFFFFFFF, {acc}, {first_lane})")
        value = f"{acc} / {NUMBA_TYPE[acc_t]}(red)" if st.reduce == "mean" else acc
        if st.epilogue is not None:
            lines.append(f"        red{j} = {NUMBA_TYPE[acc_t]}({value})")
            w = BodyWriter(lambda i, v=f"red{j}": v, lambda i, t=acc_t: t, f"e{j}")
            value, _ = w.emit(st.epilogue)
            lines += ["        " + b for b in w.lines]
        lines.append(f"        st{j} = {NUMBA_TYPE[st.dtype]}({value})")
        stage_vars.append((f"st{j}", st.dtype))
    lines += _stat_stores(stats, stage_vars, first, width)

    def store(_, results):
        if lanes > 1:
            stored = ", ".join(store_expr(k.dtype, v) for v in results)
            line = f"vstore{lanes}(out, j, {stored})"
        else:
            line = _store(k, "j", results[0])
        return [f"{ind}{line}"] if width >= 32 else [f"{ind}if live:", f"{ind}    {line}"]

    lines += passes(stored_body(k.body, k.dtype), "", store, set())
    return lane.source() + "\n".join(lines), params


def _stat_stores(stats: tuple, stage_vars: list, first: str, width: int) -> list[str]:
    """The row's statistics (``kinds/row_stat.py``: an expression over the stages and its
    dtype each), computed from the stages every thread of the row holds and stored by the
    row's first thread at the row's index (a statistic has one value per row, in order)."""
    if not stats:
        return []
    owner = f"{first} == 0" + (" and live" if width < 32 else "")
    lines = [f"        if {owner}:"]
    for j, (e, dtype) in enumerate(stats):
        w = BodyWriter(lambda i: "", lambda i, t=dtype: t, f"t{j}", stage_vars.__getitem__)
        value, _ = w.emit(e)
        lines += ["            " + b for b in w.lines]
        lines.append(f"            stat{j}[row] = {store_expr(dtype, value)}")
    return lines


def _take_head(k: Kernel, take: tuple[int, int], first: str) -> list[str]:
    """A rows kernel's fused take (``fuse_row_takes``): the row's table index, read once,
    and the base of the taken row. An index outside [0, rows) reads nothing: ``tok`` is
    false, every read of the table is a zero, and the row's first thread sets ``err[0]``
    (a plain store: every writer stores the same value) for the launcher to raise."""
    t, x = take
    if k.inputs[t].dtype not in TAKE_TABLES or k.inputs[x].dtype not in INDEX_TYPES:
        raise KernelError(
            f"a fused take reads {'/'.join(TAKE_TABLES)} tables by i32/i64 indices, not "
            f"{k.inputs[t].dtype} by {k.inputs[x].dtype}"
        )
    return [
        f"        ix = numba.int64(in{x}[row])",
        "        tok = ix >= 0 and ix < rows",
        "        tb = ix * red if tok else numba.int64(0)",
        f"        if not tok and {first} == 0:",
        "            err[0] = 1",
    ]


ROWS_WARP_MIN = 4096  # rows kernels with at least this many rows keep a warp per row
# Many short rows share a warp: as many lanes per row (a power of two, 4 to 32) as give
# each lane about this many steps per pass (0: a warp per row however short), the row kept
# in registers between passes wherever it fits. Measured on the H100 (bench/rows_short.py,
# rows of 49): Swin's windowed softmax with its bias and mask 592 us by warps, 214 by 8
# lanes kept (bfloat16; float32 469 -> 183), a plain float32 softmax 139 -> 84 us.
ROW_SEGMENT_STEPS = 8
ROW_SEGMENT_MIN = 4
ROW_SEGMENT_KEEP = True
# rows of at most this many steps (elements, or vectors of ``lanes``) only: the measured
# regime; longer rows (a bfloat16 layer norm over 768, 96 vector steps) keep a warp
ROW_SEGMENT_MAX = 64


def rows_threads(k: Kernel, lanes: int) -> int:
    """Threads sharing a row in a rows kernel: a warp; part of a warp when the rows are
    many and short (``ROW_SEGMENT_STEPS``: a warp would leave most of its lanes idle and
    spend a row's time in its shuffles); or a block (up to ``THREADS``, as many warps as one
    step over the row needs) when the rows are few and a warp would step through a row
    several times per pass: few warps then leave the device waiting on memory. Many rows
    stay with warps (measured faster: the large encoder's 16,384 rows of 1,024 take 144 us
    by warps, 150 us by blocks of 256, H200)."""
    if not k.domain:
        return 32
    per_row = math.ceil(k.domain[-1] / lanes)
    many = math.prod(k.domain[:-1]) >= ROWS_WARP_MIN
    if many and ROW_SEGMENT_STEPS and per_row <= ROW_SEGMENT_MAX:  # steps 0: always a warp
        want = math.ceil(per_row / ROW_SEGMENT_STEPS)
        return max(ROW_SEGMENT_MIN, min(32, 1 << max(want - 1, 0).bit_length()))
    if many or per_row <= 32:
        return 32
    return min(THREADS, 32 * math.ceil(per_row / 32))


def rows_style(k: Kernel, lanes: int) -> str:
    return "rows" if rows_threads(k, lanes) <= 32 else "rows-block"
