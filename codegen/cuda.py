"""The CUDA emitter: kernel descriptions to Numba CUDA kernels, compiled once, launched
through cuda.core on saturn's stream.

It takes the same descriptions as the CPU emitter. Kernels take raw pointers and 64-bit
sizes (no Numba array structs), so a launch passes a handful of scalars and never goes
through the Numba dispatcher. Loops read packed operands at ``i``, ``i % m``, ``i // r``,
``(i // r) % m`` (a channel) or ``0`` by their indexing, and any other operand through
per-axis strides given at launch (zero on broadcast axes). Reductions see their domain as
outer x reduce x inner: rows (inner == 1) reduce with a warp per row for short rows or a
block per row for long ones; columns reduce with 32 columns per block and 8 threads down
each column. A reduction with too few outputs to fill the device and a long reduced axis
splits the axis into chunks: partials per chunk, then a fold (``split_plan``).
Accumulation is in the output dtype (integers widen to int64 as PyTorch does; float32 stays
float32, so a float32 kernel has no double-precision instruction); max and min propagate NaN.

The same Python source runs under Numba's CUDA simulator with array arguments (CI has no
GPU), and compiles to PTX with pointer arguments for the device; PTX is linked to a cubin
cached on disk, keyed on the source, the architecture and the Numba and CUDA versions.
"""

from __future__ import annotations

import hashlib
import logging
import math
import re
import threading
from collections.abc import Callable

import numpy as np
from numba import config

from saturn.eqsat import optable as ot
from saturn.eqsat.program import TAKE_TABLES, Kernel, leaves

from .cubins import (  # noqa: F401 (entry_name, precompile, ...: this module's interface)
    KernelError,
    build,
    entry_name,
    precompile,
    ptx,
    python_function,
    signature,
)
from .expr import NUMBA_TYPE, BodyWriter, helpers
from .generated import MEMORY_TYPE, NUMBA_SCALAR, THREADS, Generated, Params
from .movement import (  # noqa: F401 (copy_source, ...: read through this module)
    COPY_TYPES,
    INDEX32,
    INDEX_TYPES,
    ROW_LANES,
    SCATTER_DTYPES,
    VECTOR_IMPORT,
    _uint32,
    broadcast_of_one,
    concat_pieces,
    concat_source,
    copy_source,
    fastest_axis,
    fill_source,
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
    narrow_copies,
    pad_source,
    row_concat_arguments,
    row_concat_source,
    row_copy_fits,
    row_copy_source,
    scatter_add_source,
    take_geometry,
    take_lanes,
    take_source,
    tiled_copy_source,
    tiled_grid,
)

log = logging.getLogger("saturn")
BLOCKS_PER_SM = 32  # loop kernels: grid cap (bench/kernels.py sweeps it)
ROW_WARP_LIMIT = 1024  # rows shorter than this reduce with one warp per row
# rows this short reduce with one thread per row, in order: a warp per 4-element pooling
# window left 28 of its 32 lanes idle (bfloat16 DenseNet-121's three 2x2 average pools
# took 0.76 ms each on the H200, 30x their bytes' time)
ROW_THREAD_LIMIT = 16
# Half-precision dtypes: loops load them into float32, compute in float32 (as PyTorch's GPU
# kernels do, its "opmath" type) and round once when they store.
HALVES = ot.HALVES


def compute_dtype(dtype: str) -> str:
    """What a value of ``dtype`` is held in inside a kernel."""
    return "f32" if dtype in HALVES else dtype


def load_expr(dtype: str, ref: str) -> str:
    """The expression reading memory ``ref`` of ``dtype`` into its compute dtype."""
    if dtype == "bool":
        return f"{ref} != 0"  # bools travel as bytes (Numba stores a bool as i1)
    if dtype == "f16":
        return f"np.float32({ref})"
    if dtype == "bf16":
        return f"bf16_load({ref})"
    return ref


def half_helpers(decorator: str) -> str:
    """Device functions for bfloat16 and float16 values held in float32: ``bf16_load``
    (memory bits to float32: exact), ``bf16_store`` (float32 to the bits of the nearest
    bfloat16, ties to even, as PyTorch's conversion; any NaN to its quiet NaN 0x7FC0),
    ``bf16_round``/``f16_round`` (a float32 rounded to the half type and back: a cast
    inside a body)."""
    return f"""
{decorator}
def bf16_load(u):
    return bits_f32(np.uint32(u) << np.uint32(16))


{decorator}
def bf16_store(v):
    b = np.int64(f32_bits(np.float32(v)))
    if (b & 0x7FFFFFFF) > 0x7F800000:
        return np.uint16(0x7FC0)
    return np.uint16((b + 0x7FFF + ((b >> 16) & 1)) >> 16)


{decorator}
def bf16_round(v):
    return bf16_load(bf16_store(v))


{decorator}
def f16_round(v):
    return np.float32(np.float16(v))
"""


# the simulator runs device functions as Python: numpy's rounding there (expr.helpers)
ROUNDING_TARGET = "numpy" if config.ENABLE_CUDASIM else "cuda"
# Helpers are inlined by NVVM (``alwaysinline``), not in Numba's IR: IR inlining costs
# seconds per call site, and a bfloat16 loop of eight lanes has hundreds (ResNet-18's pool
# took 72 s to build, 1.3 s this way). The simulator's jit has no such option.
DEVICE_FN = "@cuda.jit(device=True" + ("" if config.ENABLE_CUDASIM else ", forceinline=True") + ")"


def _acc_dtype(k: Kernel) -> str:
    """What the reduction accumulates and produces (the kernel's output dtype unless an
    epilogue turns the reduced value into something else)."""
    return k.attrs.get("acc_dtype", k.dtype)


def _warp_reduce(shfl: str, ind: str) -> list[str]:
    """Fold ``acc`` across the 32 lanes of a warp with shuffles (lane 0 ends with it)."""
    return [
        f"{ind}off = 16",
        f"{ind}while off > 0:",
        f"{ind}    acc = {shfl}",
        f"{ind}    off //= 2",
    ]


def _store_reduced(k: Kernel, target: str, value: str, ind: str) -> list[str]:
    """Write the reduced ``value`` to ``target``, through the epilogue if there is one (a
    half-type result is rounded from the float32 accumulator once, at the store)."""

    def store(v: str) -> str:
        if k.dtype in HALVES:
            return f"{ind}{target} = {store_expr(k.dtype, v)}"
        return f"{ind}{target} = {NUMBA_TYPE[k.dtype]}({v})"

    if k.epilogue is None:
        return [store(value)]
    red = _acc_dtype(k)
    w = BodyWriter(lambda i: "acc_r", lambda i: red, "e")
    res, _ = w.emit(k.epilogue)
    return [f"{ind}acc_r = {NUMBA_TYPE[red]}({value})", *(ind + ln for ln in w.lines), store(res)]


def _combine(kind: str, a: str, b: str) -> str:
    return {
        "sum": f"{a} + {b}",
        "mean": f"{a} + {b}",
        "prod": f"{a} * {b}",
        "max": f"max_nan({a}, {b})",
        "min": f"min_nan({a}, {b})",
    }[kind]


def _identity(kind: str, dtype: str) -> str:
    t = NUMBA_TYPE[dtype]
    if kind in ("sum", "mean"):
        return f"{t}(0)"
    if kind == "prod":
        return f"{t}(1)"
    if dtype in ot.FLOATS:
        return f"{t}({'-' if kind == 'max' else ''}np.inf)"
    info = np.iinfo(ot.NUMPY_DTYPE[dtype])
    return f"{t}({info.min if kind == 'max' else info.max})"


def _operand_reads(
    k: Kernel, flat_index: str, rank: int, domain_names: list[str], ind: str, narrow: bool = False
) -> tuple[list[str], list[str]]:
    """Statements reading every operand at the domain's flat index; the int params used.
    ``narrow``: index arithmetic (strided offsets, broadcast operands' divisions) in 32-bit
    unsigned integers, over the ``u``-prefixed copies of the parameters ``narrow_head``
    makes."""
    u = "u" if narrow else ""
    cast = _uint32 if narrow else str
    lines, ints = _strided_offsets(k, flat_index, rank, domain_names, ind, narrow)
    fi = flat_index
    if narrow and any(o.indexing in BROADCAST for o in k.inputs):
        lines.append(f"{ind}fi = {cast(flat_index)}")
        fi = "fi"
    for i, o in enumerate(k.inputs):
        if o.indexing == "same":
            idx = flat_index
        elif o.indexing == "scalar":
            idx = "0"
        elif o.indexing == "trailing" and _row_trailing(k, i):  # from the row's base
            idx = f"pb{i} + r"
            ints.append(f"m{i}")
        elif o.indexing == "trailing":
            idx = f"{fi} % {u}m{i}"
            ints.append(f"m{i}")
        elif _row_constant(k, i):  # read once per row (``_row_constant_head``)
            g = _group(k, i) if o.indexing == "middle" else i
            ints += [f"r{g}", f"m{g}"] if o.indexing == "middle" else [f"r{i}"]
            lines.append(f"{ind}in{i}_v = rc{i}")
            continue
        elif o.indexing == "leading":
            idx = f"{fi} // {u}r{i}"
            ints.append(f"r{i}")
        elif o.indexing == "middle":
            g = _group(k, i)
            idx = f"({fi} // {u}r{g}) % {u}m{g}"
            ints += [f"r{g}", f"m{g}"]
        elif o.indexing == "table":  # rows kernels: the taken row (``_take_head``)
            zero = f"{NUMBA_TYPE[compute_dtype(o.dtype)]}(0)"
            read = load_expr(o.dtype, f"in{i}[tb + r]")
            lines.append(f"{ind}in{i}_v = {read} if tok else {zero}")
            continue
        elif o.indexing == "rowindex":  # read once per row, by ``_take_head``
            continue
        else:
            idx = f"off{i}"
        lines.append(f"{ind}in{i}_v = {load_expr(o.dtype, f'in{i}[{idx}]')}")
    return lines, sorted(set(ints), key=ints.index)


def _strided_offsets(
    k: Kernel, flat_index: str, rank: int, domain_names: list[str], ind: str, narrow: bool
) -> tuple[list[str], list[str]]:
    """Statements computing ``off{i}``, the element offset of every strided operand at the
    domain's flat index; the stride params used."""
    lines, ints = [], []
    u = "u" if narrow else ""
    cast = _uint32 if narrow else str
    strided = [i for i, o in enumerate(k.inputs) if o.indexing == "strided"]
    if strided and k.kind == "rows" and rank:  # from the row's base (``_row_strided_head``)
        last = rank - 1
        for i in strided:
            lines.append(f"{ind}off{i} = sb{i} + r * st{i}_{last}")
            ints += [f"st{i}_{d}" for d in range(rank)]
        return lines, ints
    if strided:
        lines.append(f"{ind}rem = {cast(flat_index)}")
        for i in strided:
            lines.append(f"{ind}off{i} = {cast('0')}")
        for d in reversed(range(rank)):
            lines.append(f"{ind}c{d} = rem % {u}{domain_names[d]}")
            lines.append(f"{ind}rem = rem // {u}{domain_names[d]}")
            for i in strided:
                lines.append(f"{ind}off{i} += c{d} * {u}st{i}_{d}")
                ints.append(f"st{i}_{d}")
    return lines, ints


BROADCAST = ("trailing", "leading", "middle")  # operands read at a division of the index


def narrow_head(k: Kernel, domain_names: list[str]) -> list[str]:
    """``narrow_copies`` of the sizes, strides and run lengths a loop's reads divide by."""
    _, ints = _operand_reads(k, "i", len(domain_names), domain_names, "")
    strided = any(o.indexing == "strided" for o in k.inputs)
    return narrow_copies((domain_names if strided else []) + ints)


def index_arithmetic(k: Kernel) -> bool:
    """Whether a loop or reduction divides its index to read an operand (and so has a
    narrow variant)."""
    return any(o.indexing in ("strided", *BROADCAST) for o in k.inputs)


def _group(k: Kernel, i: int) -> int:
    """The first operand indexed like operand ``i`` with its shape: operands of one shape
    (batch norm's four per-channel vectors) share their index parameters and arithmetic."""
    o = k.inputs[i]
    return next(j for j, p in enumerate(k.inputs) if (p.indexing, p.shape) == (o.indexing, o.shape))


def store_expr(dtype: str, value: str) -> str:
    """``value`` (in its compute dtype) as ``dtype`` is held in memory."""
    if dtype == "bf16":
        return f"bf16_store({value})"
    t = "np.uint8" if dtype == "bool" else NUMBA_TYPE[dtype]
    return f"{t}({value})"


def stored_body(body: tuple, dtype: str) -> tuple:
    """The expression a kernel stores as ``dtype``: a body ending in the rounding to that
    half type stores the rounding's operand, since the store rounds it to the same bits
    (rounding is idempotent and keeps infinities; a NaN becomes the same quiet NaN either
    way): one rounding per element instead of a rounding and a store."""
    if dtype in HALVES and body[0] == "cast" and body[2] == dtype:
        return body[1]
    return body


def _store(k: Kernel, index: str, value: str) -> str:
    return f"out[{index}] = {store_expr(k.dtype, value)}"


MEMORY_SIZE = ot.ITEMSIZE  # bytes per element in memory (bools: one byte)
VECTOR = True  # packed loops use vector loads and stores (bench/kernels.py turns it off)


def vector_lanes(k: Kernel) -> int:
    """Elements per vector access in a loop: 16 bytes of the widest operand read as vectors
    (out, inputs read at ``i``, strided inputs: see ``strided_vectors_fit``), at most 4, or
    8 where every such operand has 2-byte elements (the half types)."""
    if not VECTOR:
        return 1
    widest = max(
        MEMORY_SIZE[d]
        for d in [
            k.dtype,
            *(
                o.dtype
                for i, o in enumerate(k.inputs)
                if o.indexing in ("same", "strided", "table") or _row_trailing(k, i)
            ),
        ]
    )
    return max(1, min(8 if widest == 2 else 4, 16 // widest))


def strided_vectors_fit(k: Kernel, lanes: int, shapes, strides) -> bool:
    """Whether a loop's strided operands can be read ``lanes`` elements at a time: each has
    the domain's last axis, contiguous, every other stride a multiple of ``lanes`` and the
    last extent too (so a step's lanes are adjacent in memory and its first is aligned; the
    launcher checks the pointers)."""
    if not k.domain or k.domain[-1] % lanes:
        return False
    for o, shp, st in zip(k.inputs, shapes, strides, strict=True):
        if o.indexing != "strided":
            continue
        if len(shp) == 0 or shp[-1] != k.domain[-1] or st[-1] != 1:
            return False
        if any(st[a] % lanes for a in range(len(shp) - 1) if shp[a] != 1):
            return False
    return True


def _vector_reads(
    k: Kernel,
    lanes: int,
    rank: int,
    dnames: list[str],
    ind: str,
    used: set[int] | None = None,
    narrow: bool = False,
    runs: str = "check",
) -> list[str]:
    """Statements reading ``lanes`` adjacent elements (flat index ``j`` on) of every operand
    (or those in ``used``) as ``in{i}_v{u}``: packed operands as one vector access,
    broadcast operands once per run where the lanes share a value. ``runs`` says how
    middle and leading operands (runs of ``r`` equal values) are read: ``check`` tests
    whether the step stays in one run, ``shared`` knows it does (``q{g}``, the run, is
    computed: see ``_loop_vector_step``), ``two`` knows it crosses into the next run after
    ``e{g}`` lanes, ``per-lane`` reads each lane. ``narrow``: 32-bit index
    arithmetic over ``uj``."""
    lines: list[str] = []
    u_, jj = ("u", "uj") if narrow else ("", "j")
    offsets = False  # the strided operands' offsets at j, worked out once for all of them
    for i, o in enumerate(k.inputs):
        if used is not None and i not in used:
            continue
        names = [f"in{i}_v{u}" for u in range(lanes)]
        if _row_constant(k, i):  # one value per row (``_row_constant_head``)
            lines += [f"{ind}{v} = rc{i}" for v in names]
            continue
        if o.indexing == "trailing" and _row_trailing(k, i):  # whole rows, from the base
            lines.append(f"{ind}{', '.join(names)} = vload{lanes}(in{i}, pb{i} + r)")
            if load_expr(o.dtype, "v") != "v":
                lines += [f"{ind}{v} = {load_expr(o.dtype, v)}" for v in names]
            continue
        if o.indexing == "table":  # the taken row, or zeros past the table (``_take_head``)
            zero = f"{NUMBA_TYPE[compute_dtype(o.dtype)]}(0)"
            convert = [f"{v} = {load_expr(o.dtype, v)}" for v in names]
            lines += [
                f"{ind}if tok:",
                f"{ind}    {', '.join(names)} = vload{lanes}(in{i}, tb + r)",
                *(f"{ind}    {ln}" for ln in convert if load_expr(o.dtype, "v") != "v"),
                f"{ind}else:",  # the compute type's zeros: what the reads convert to
                f"{ind}    {', '.join(names)} = {', '.join([zero] * lanes)}",
            ]
            continue
        if o.indexing in ("same", "strided"):
            if o.indexing == "strided" and not offsets:
                lines += _strided_offsets(k, "j", rank, dnames, ind, narrow)[0]
                offsets = True
            at = "j" if o.indexing == "same" else f"off{i}"
            lines.append(f"{ind}{', '.join(names)} = vload{lanes}(in{i}, {at})")
            if load_expr(o.dtype, "v") != "v":  # bools and halves: to their compute dtype
                lines += [f"{ind}{v} = {load_expr(o.dtype, v)}" for v in names]
            continue
        per_lane = []
        for u in range(lanes):
            r, _ = _operand_reads(k, f"(j + {u})", rank, dnames, ind, narrow)
            at = r.index(next(ln for ln in r if ln.startswith(f"{ind}in{i}_v =")))
            pre = [ln for ln in r[:at] if ln.startswith(f"{ind}fi =")]
            per_lane += [*pre, r[at].replace("_v =", f"_v{u} =")]
        if o.indexing in ("middle", "leading") and runs != "per-lane":
            g = _group(k, i) if o.indexing == "middle" else i
            at = f"q{g} % {u_}m{g}" if o.indexing == "middle" else f"q{g}"
            read = load_expr(o.dtype, f"in{i}[{at}]")
            shared = [f"w{i} = {read}", *(f"{v} = w{i}" for v in names)]
            if runs == "two":
                # the step crosses one run's end (runs are at least ``lanes`` long): lanes
                # before it (``e{g}`` of them) read run q, the rest run q + 1
                one = "np.uint32(1)" if narrow else "1"
                nxt = f"(q{g} + {one}) % {u_}m{g}" if o.indexing == "middle" else f"q{g} + {one}"
                lines += [
                    f"{ind}w{i} = {read}",
                    # (a group whose own run goes on reads nothing past it: its last run
                    # may be the operand's last)
                    f"{ind}x{i} = "
                    f"{load_expr(o.dtype, f'in{i}[{nxt}]')} if e{g} < {lanes} else w{i}",
                    *(f"{ind}{v} = w{i} if {u} < e{g} else x{i}" for u, v in enumerate(names)),
                ]
                continue
            if runs == "shared":
                lines += [ind + ln for ln in shared]
            else:
                # the lanes of one step share a run of r elements (and so one value)
                # unless the step crosses a run's end: one division, not one per lane
                lines += [
                    f"{ind}q{g} = {jj} // {u_}r{g}",
                    f"{ind}if {jj} - q{g} * {u_}r{g} + {lanes} <= {u_}r{g}:",
                    *(f"{ind}    {ln}" for ln in shared),
                    f"{ind}else:",
                    *("    " + ln for ln in per_lane),
                ]
        elif o.indexing == "trailing":
            # a bias: the lanes read adjacent elements unless the step wraps
            lines += [
                f"{ind}t{i} = {jj} % {u_}m{i}",
                f"{ind}if t{i} + {lanes} <= {u_}m{i}:",
                *(
                    f"{ind}    {v} = {load_expr(o.dtype, f'in{i}[t{i} + {u}]')}"
                    for u, v in enumerate(names)
                ),
                f"{ind}else:",
                *("    " + ln for ln in per_lane),
            ]
        else:
            lines += per_lane
    return lines


def _run_groups(k: Kernel) -> list[int]:
    """The index-parameter groups of a loop's middle and leading operands (``_group``)."""
    groups = [
        _group(k, i) if o.indexing == "middle" else i
        for i, o in enumerate(k.inputs)
        if o.indexing in ("middle", "leading")
    ]
    return sorted(set(groups))


def _loop_vector_step(
    k: Kernel, lanes: int, rank: int, dnames: list[str], ind: str, narrow: bool
) -> list[str]:
    """One vector step of a loop at flat index ``j``. With middle or leading operands the
    step branches once: where it stays inside one run of each, those operands are read
    once and every lane computes from the same values (so what depends only on them, batch
    norm's ``rsqrt(var + eps)``, is computed once per step, not per lane); otherwise each
    lane reads its own."""
    u_, jj = ("u", "uj") if narrow else ("", "j")
    head = (
        [f"{ind}uj = np.uint32(j)"]
        if narrow and any(o.indexing in BROADCAST for o in k.inputs)
        else []
    )

    def step(ind2: str, reads: list[str]) -> list[str]:
        lines, results = list(reads), []
        for u in range(lanes):
            w = BodyWriter(
                lambda i, u=u: f"in{i}_v{u}", lambda i: compute_dtype(k.inputs[i].dtype), f"u{u}"
            )
            res, _ = w.emit(stored_body(k.body, k.dtype))
            lines += [ind2 + ln for ln in w.lines]
            results.append(store_expr(k.dtype, res))
        return [*lines, f"{ind2}vstore{lanes}(out, j, {', '.join(results)})"]

    groups = _run_groups(k)
    if not groups:
        return head + step(ind, _vector_reads(k, lanes, rank, dnames, ind, narrow=narrow))
    inner = ind + "    "
    cond = " and ".join(f"{jj} - q{g} * {u_}r{g} + {lanes} <= {u_}r{g}" for g in groups)
    # runs of at least ``lanes``: a step that leaves one run enters only the next, so each
    # operand is read twice, not once per lane (per-lane reads of ResNet-152's sixteen
    # per-channel vectors in bfloat16, where 8 lanes straddle 14x14 planes half the time,
    # made one fused loop 30 times slower than its bandwidth)
    two = " and ".join(f"{u_}r{g} >= {lanes}" for g in groups)
    one = "np.uint32(1)" if narrow else "1"
    return [
        *head,
        *(f"{ind}q{g} = {jj} // {u_}r{g}" for g in groups),
        f"{ind}if {cond}:",
        *step(inner, _vector_reads(k, lanes, rank, dnames, inner, narrow=narrow, runs="shared")),
        f"{ind}elif {two}:",
        *(f"{inner}e{g} = (q{g} + {one}) * {u_}r{g} - {jj}" for g in groups),
        *step(inner, _vector_reads(k, lanes, rank, dnames, inner, narrow=narrow, runs="two")),
        f"{ind}else:",
        *step(inner, _vector_reads(k, lanes, rank, dnames, inner, narrow=narrow, runs="per-lane")),
    ]


def loop_source(k: Kernel, fn: str, lanes: int = 1, narrow: bool = False) -> tuple[str, Params]:
    """A grid-stride loop. With ``lanes`` > 1 each thread takes ``lanes`` adjacent elements
    per step: packed operands and the output move as one vector access (the launcher checks
    their alignment), broadcast operands are read once per run (``_loop_vector_step``); a
    scalar loop does the tail. ``narrow``: the index arithmetic (strided offsets, broadcast
    operands' divisions) in 32 bits (the launcher checks every index fits; a 64-bit
    division costs several 32-bit ones)."""
    rank = len(k.domain)
    dnames = [f"s{d}" for d in range(rank)]
    ind = "        "
    uses_shape = any(o.indexing == "strided" for o in k.inputs)
    narrow = narrow and index_arithmetic(k)
    reads, ints = _operand_reads(k, "i", rank, dnames, ind, narrow)
    params = Params(
        ["out", *[f"in{i}" for i in range(len(k.inputs))]],
        ["n", *(dnames if uses_shape else []), *ints],
    )
    lines = [
        f"def {fn}({params.signature()}):",
        "    i = cuda.grid(1)",
        "    step = cuda.gridsize(1)",
        *(narrow_head(k, dnames) if narrow else []),
    ]
    if lanes > 1:
        lines += [f"    nv = n // {lanes}", "    while i < nv:", f"{ind}j = i * {lanes}"]
        lines += _loop_vector_step(k, lanes, rank, dnames, ind, narrow)
        lines += [f"{ind}i += step", f"    i = nv * {lanes} + cuda.grid(1)"]
    body = BodyWriter(lambda i: f"in{i}_v", lambda i: compute_dtype(k.inputs[i].dtype))
    result, _ = body.emit(stored_body(k.body, k.dtype))
    lines.append("    while i < n:")
    lines += reads + [ind + ln for ln in body.lines]
    lines.append(ind + _store(k, "i", result))
    lines.append(f"{ind}i += step")
    return "\n".join(lines), params


def reduce_layout(k: Kernel) -> tuple[int, int, int]:
    """(outer, reduce, inner) of a reduction over a contiguous run of axes."""
    dims = sorted(k.attrs["dims"])
    if dims != list(range(dims[0], dims[-1] + 1)):
        raise KernelError(f"reduction over non-adjacent axes {dims} (permute first)")
    shape = k.domain
    outer = math.prod(shape[: dims[0]])
    red = math.prod(shape[dims[0] : dims[-1] + 1])
    inner = math.prod(shape[dims[-1] + 1 :])
    return outer, red, inner


def _accumulate(index: str, step: int, bound: str, element, kind: str, ind: str) -> list[str]:
    """A reduction thread's loop from ``r`` up to ``bound`` in steps of ``step``, folding each
    element into ``acc``. ``index`` is the flat index of element ``r`` (``{r}`` in it);
    ``element(ind, var)`` gives the lines computing the element at ``f`` into ``var``.
    (Unrolled four times, with the loads ahead of the adds, the narrow reductions of
    bench/kernels.py ran no faster: 83 -> 96 us, 32 -> 37 us on the H200.)"""
    return [
        f"{ind}while r < {bound}:",
        f"{ind}    f = {index.format(r='r')}",
        *element(ind + "    ", "v"),
        f"{ind}    acc = {_combine(kind, 'acc', 'v')}",
        f"{ind}    r += {step}",
    ]


def _element(k: Kernel, narrow: bool = False):
    """``element(ind, var)``: the lines computing a reduction's value at flat index ``f``
    into ``var`` (operand reads, the body, the cast to the accumulator); and the int
    parameters the reads use. ``narrow``: the reads' index arithmetic in 32 bits, over the
    copies ``narrow_head`` makes."""
    rank = len(k.domain)
    dnames = [f"s{d}" for d in range(rank)]
    body = BodyWriter(lambda i: f"in{i}_v", lambda i: compute_dtype(k.inputs[i].dtype))
    result, _ = body.emit(k.body)
    acc_type = NUMBA_TYPE[_acc_dtype(k)]
    _, ints = _operand_reads(k, "f", rank, dnames, "")

    def element(at: str, var: str) -> list[str]:
        reads, _ = _operand_reads(k, "f", rank, dnames, at, narrow)
        return reads + [at + b for b in body.lines] + [f"{at}{var} = {acc_type}({result})"]

    return element, ints


def _block_row(kind: str, acc_t: str, start: str, bound: str, element, store) -> list[str]:
    """A block of THREADS per row (``blockIdx.x``): each thread folds from ``start`` up to
    ``bound``, the warps fold across their lanes and then across warps through shared
    memory; thread 0 runs ``store`` (lines at 12 spaces) with the row's ``acc``."""
    ident = _identity(kind, acc_t)
    shfl = _combine(kind, "acc", "cuda.shfl_down_sync(0xFFFFFFFF, acc, off)")
    return [
        "    row = cuda.blockIdx.x",
        "    tid = cuda.threadIdx.x",
        f"    part = cuda.shared.array(8, dtype=numba.{NUMBA_SCALAR[acc_t]})",
        f"    acc = {ident}",
        f"    r = {start}",
        *_accumulate("row * red + {r}", THREADS, bound, element, kind, "    "),
        *_warp_reduce(shfl, "    "),
        "    if tid % 32 == 0:",
        "        part[tid // 32] = acc",
        "    cuda.syncthreads()",
        "    if tid < 32:",
        f"        acc = part[tid] if tid < 8 else {ident}",
        *_warp_reduce(shfl, "        "),
        "        if tid == 0:",
        *store,
    ]


def _columns(kind: str, acc_t: str, outputs: str, loop: list[str], store) -> list[str]:
    """32 consecutive outputs per block (``p``, coalesced), 8 threads down each: every
    thread folds by ``loop`` (lines at 8 spaces), then the 8 partials of each output are
    folded in order through shared memory and ``store`` (lines at 8 spaces) runs."""
    return [
        "    tx = cuda.threadIdx.x % 32",
        "    ty = cuda.threadIdx.x // 32",
        "    p = cuda.blockIdx.x * 32 + tx",
        f"    part = cuda.shared.array(256, dtype=numba.{NUMBA_SCALAR[acc_t]})",
        f"    acc = {_identity(kind, acc_t)}",
        f"    if p < {outputs}:",
        *loop,
        "    part[cuda.threadIdx.x] = acc",
        "    cuda.syncthreads()",
        f"    if ty == 0 and p < {outputs}:",
        "        for j in range(1, 8):",
        f"            acc = {_combine(kind, 'acc', 'part[j * 32 + tx]')}",
        *store,
    ]


def _column_loop(start: str, bound: str, element, kind: str) -> list[str]:
    return [
        "        o = p // inner",
        "        c = p % inner",
        f"        r = {start}",
        *_accumulate("(o * red + {r}) * inner + c", 8, bound, element, kind, "        "),
    ]


def reduce_source(k: Kernel, fn: str, narrow: bool = False) -> tuple[str, Params, str]:
    """A row (warp or block per row) or column reduction kernel; returns its style too.
    ``narrow``: operands' index arithmetic in 32 bits (as loops, ``loop_source``)."""
    _, red, inner = reduce_layout(k)
    dnames = [f"s{d}" for d in range(len(k.domain))]
    kind = k.attrs["reduce"]
    acc_t = _acc_dtype(k)
    acc_type = NUMBA_TYPE[acc_t]
    if inner == 1:
        style = (
            "row-thread"
            if red <= ROW_THREAD_LIMIT
            else "row-warp"
            if red < ROW_WARP_LIMIT
            else "row-block"
        )
    else:
        style = "column"
    narrow = narrow and index_arithmetic(k)
    element, ints = _element(k, narrow)
    shape = dnames if any(o.indexing == "strided" for o in k.inputs) else []
    params = Params(
        ["out", *[f"in{i}" for i in range(len(k.inputs))]], ["outer", "red", "inner", *shape, *ints]
    )
    finish = f"acc / {acc_type}(red)" if kind == "mean" else "acc"
    lines = [f"def {fn}({params.signature()}):", *(narrow_head(k, dnames) if narrow else [])]
    if style == "row-thread":
        # one thread per row (grid-stride), its elements folded in order
        lines += [
            "    row = cuda.grid(1)",
            "    step = cuda.gridsize(1)",
            "    while row < outer:",
            f"        acc = {_identity(kind, acc_t)}",
            "        r = 0",
            *_accumulate("row * red + {r}", 1, "red", element, kind, "        "),
            *_store_reduced(k, "out[row]", finish, "        "),
            "        row += step",
        ]
    elif style == "row-warp":
        # one warp per row, 8 rows per block
        lines += [
            "    lane = cuda.threadIdx.x % 32",
            "    row = cuda.blockIdx.x * 8 + cuda.threadIdx.x // 32",
            f"    acc = {_identity(kind, acc_t)}",
            "    if row < outer:",
            "        r = lane",
            *_accumulate("row * red + {r}", 32, "red", element, kind, "        "),
            *_warp_reduce(
                _combine(kind, "acc", "cuda.shfl_down_sync(0xFFFFFFFF, acc, off)"), "    "
            ),
            "    if lane == 0 and row < outer:",
            *_store_reduced(k, "out[row]", finish, "        "),
        ]
    elif style == "row-block":
        lines += _block_row(
            kind, acc_t, "tid", "red", element, _store_reduced(k, "out[row]", finish, " " * 12)
        )
    else:
        loop = _column_loop("ty", "red", element, kind)
        lines += _columns(
            kind, acc_t, "outer * inner", loop, _store_reduced(k, "out[p]", finish, " " * 8)
        )
    return "\n".join(lines), params, style


# --- split reductions ---------------------------------------------------------------
# A reduction with too few outputs to fill the device (a loss summed to one value, a bias
# gradient's 1024 column sums over 16,384 rows) splits its reduced axis: a first kernel
# reduces each chunk of it into a workspace of partial accumulators (one per chunk and
# output, in the accumulation dtype), a second folds the partials in chunk order and
# finishes (mean's division, the epilogue, the cast). The order of the additions is fixed
# by the sizes, so results repeat exactly from call to call.
SPLIT_BLOCKS_PER_SM = 4  # what a split launch aims for
ROW_SPLIT_CHUNK = 2048  # at least this many elements per chunk of a row (8 per thread)
COLUMN_SPLIT_CHUNK = 128  # at least this many rows per chunk of a column (16 per thread)


def split_plan(k: Kernel, sm_count: float = 132, min_chunk: int | None = None) -> tuple[int, int]:
    """(chunks, chunk length) of the reduced axis; (1, red) when the unsplit kernel already
    has at least two blocks per SM, or its rows are short enough for a warp each."""
    outer, red, inner = reduce_layout(k)
    if inner == 1 and red < ROW_WARP_LIMIT:
        return 1, red
    blocks = outer if inner == 1 else math.ceil(outer * inner / 32)
    if blocks == 0 or blocks >= 2 * sm_count:
        return 1, red
    least = min_chunk or (ROW_SPLIT_CHUNK if inner == 1 else COLUMN_SPLIT_CHUNK)
    splits = min(math.ceil(SPLIT_BLOCKS_PER_SM * sm_count / blocks), red // least)
    if splits < 2:
        return 1, red
    chunk = math.ceil(red / splits)
    return math.ceil(red / chunk), chunk


def split_sources(k: Kernel, fn: str, narrow: bool = False) -> tuple[str, Params, str, Params]:
    """The two kernels of a split reduction: partials (grid: output tiles x chunks, writing
    ``ws[chunk * outputs + output]``) and the fold over chunks (32 outputs per block, 8
    threads down the chunks), with their parameters. ``narrow``: the partials' operand
    index arithmetic in 32 bits."""
    _, _, inner = reduce_layout(k)
    dnames = [f"s{d}" for d in range(len(k.domain))]
    kind = k.attrs["reduce"]
    acc_t = _acc_dtype(k)
    acc_type = NUMBA_TYPE[acc_t]
    narrow = narrow and index_arithmetic(k)
    element, ints = _element(k, narrow)
    shape = dnames if any(o.indexing == "strided" for o in k.inputs) else []
    params = Params(
        ["ws", *[f"in{i}" for i in range(len(k.inputs))]],
        ["outer", "red", "inner", *shape, *ints, "chunk"],
    )
    lines = [
        f"def {fn}_part({params.signature()}):",
        *(narrow_head(k, dnames) if narrow else []),
        "    lo = cuda.blockIdx.y * chunk",
        "    hi = min(lo + chunk, red)",
    ]
    if inner == 1:  # a block per (row, chunk)
        store = [" " * 12 + "ws[cuda.blockIdx.y * outer + row] = acc"]
        lines += _block_row(kind, acc_t, "lo + tid", "hi", element, store)
    else:  # 32 outputs per block, 8 threads down each, over one chunk
        store = [" " * 8 + "ws[cuda.blockIdx.y * outer * inner + p] = acc"]
        lines += _columns(
            kind, acc_t, "outer * inner", _column_loop("lo + ty", "hi", element, kind), store
        )
    fparams = Params(["out", "ws"], ["outputs", "chunks", "red"])
    finish = f"acc / {acc_type}(red)" if kind == "mean" else "acc"
    fold = [
        "        r = ty",
        "        while r < chunks:",
        f"            acc = {_combine(kind, 'acc', 'ws[r * outputs + p]')}",
        "            r += 8",
    ]
    flines = [
        f"def {fn}_fold({fparams.signature()}):",
        *_columns(kind, acc_t, "outputs", fold, _store_reduced(k, "out[p]", finish, " " * 8)),
    ]
    return "\n".join(lines), params, "\n".join(flines), fparams


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


def _row_trailing(k: Kernel, i: int) -> bool:
    """Whether rows kernel ``k`` reads trailing operand i as whole rows: its length a
    multiple of the row's, so row ``row`` reads row ``row % (m / red)`` of it from its
    start (``pb{i}``, worked out once per row) and element ``r`` needs no division (a layer
    norm's weight: ``pb`` is 0; position rows under a batch)."""
    o = k.inputs[i]
    if k.kind != "rows" or o.indexing != "trailing" or not k.domain or not o.shape:
        return False
    return o.shape[-1] == k.domain[-1] and math.prod(o.shape) % k.domain[-1] == 0


def _row_constant(k: Kernel, i: int) -> bool:
    """Whether rows kernel ``k``'s broadcast operand i is constant along each row (its last
    extent 1, the row's more): an attention mask's per-query column [S, 1] under
    [B, H, S, S]. Its run ``r`` is then a multiple of ``red``, so every element of row
    ``row`` reads the value at the row's start, ``(row * red) // r``: read once per row
    (``rc{i}``, ``_row_constant_head``), not divided out at every element of every pass."""
    o = k.inputs[i]
    if k.kind != "rows" or o.indexing not in ("leading", "middle") or not k.domain:
        return False
    return (not o.shape or o.shape[-1] == 1) and k.domain[-1] > 1


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
    if not kept or steps * lanes * len(kept) > ROW_REGISTERS or row_bytes < ROW_CACHE_BYTES:
        return None
    return steps, kept


def rows_source(k: Kernel, fn: str, lanes: int = 1) -> tuple[str, Params]:
    """A ``rows`` kernel (``fuse_rows``): a warp (or a block, ``rows_threads``) per row
    computes the stages in order (each a pass over the row, reduced across its threads and
    broadcast to all of them), then a last pass writes the body.
    Where the row fits in registers (``row_cache``) the passes are unrolled and the first
    one loads the row-indexed operands into registers that the later passes read: the row
    crosses from memory once. Otherwise later passes re-read the row (mostly from cache).
    With ``lanes`` > 1 a lane takes that many adjacent elements per step, packed operands
    and the output as one vector access."""
    rank = len(k.domain)
    dnames = [f"s{d}" for d in range(rank)]
    uses_shape = any(o.indexing == "strided" for o in k.inputs)
    ind = "            "
    all_reads, ints = _operand_reads(k, "j", rank, dnames, ind)
    take = k.attrs.get("take")
    params = Params(
        ["out", *[f"in{i}" for i in range(len(k.inputs))], *(["err"] if take else [])],
        ["outer", "red", *(dnames if uses_shape else []), *ints, *(["rows"] if take else [])],
    )
    width = rows_threads(k, lanes)  # threads sharing a row
    block = width > 32
    first = "tid" if block else "lane"
    cache = row_cache(k, width, lanes)
    kept = cache[1] if cache else []

    def var(i: int, u: int, t: int | None = None) -> str:
        """Operand i's value at lane u (of step t, for a kept operand)."""
        base = f"in{i}_v{u}" if lanes > 1 else f"in{i}_v"
        return f"h{t}_{base}" if t is not None and i in kept else base

    def reads(used: set[int], t: int | None = None) -> list[str]:
        if lanes > 1:
            lines = _vector_reads(k, lanes, rank, dnames, ind, used)
        else:
            skip = tuple(f"{ind}in{i}_v =" for i in range(len(k.inputs)) if i not in used)
            lines = [ln for ln in all_reads if not ln.startswith(skip)] if skip else all_reads
        if t is None or not kept:
            return lines
        pattern = re.compile(rf"\bin({'|'.join(map(str, kept))})_v")
        return [pattern.sub(lambda m: f"h{t}_in{m.group(1)}_v", ln) for ln in lines]

    def bodies(e: tuple, tag: str, t: int | None = None) -> tuple[list[str], list[str]]:
        """Statements and result variables of ``e`` for each lane of a step."""
        lines, results = [], []
        for u in range(lanes):
            w = BodyWriter(
                lambda i, u=u: var(i, u, t),
                lambda i: compute_dtype(k.inputs[i].dtype),
                f"{tag}u{u}",
                stage_vars.__getitem__,
            )
            res, _ = w.emit(e)
            lines += [ind + b for b in w.lines]
            results.append(res)
        return lines, results

    def passes(e: tuple, tag: str, step: Callable[[list[str], list[str]], list[str]], load: set):
        """One pass over the row: a loop of steps, or (row in registers) its unrolled steps;
        ``load``: the kept operands this pass loads (the first pass loads them all)."""
        used = _used(e)
        if cache is None:
            body_lines, results = bodies(e, tag)
            return [
                f"        r = {first} * {lanes}",
                "        while r < red:",
                "            j = row * red + r",
                *reads(used),
                *body_lines,
                *step(body_lines, results),
                f"{ind}r += {width * lanes}",
            ]
        out = []
        for t in range(cache[0]):
            body_lines, results = bodies(e, f"{tag}t{t}", t)
            out += [
                f"        r = {first} * {lanes} + {t * width * lanes}",
                "        if r < red:",
                "            j = row * red + r",
                *reads((used - set(kept)) | load, t),
                *body_lines,
                *step(body_lines, results),
            ]
        return out

    stage_vars: list[tuple[str, str]] = []
    if block:  # a block per row (long rows)
        lines = [
            f"def {fn}({params.signature()}):",
            "    tid = cuda.threadIdx.x",
            "    row = cuda.blockIdx.x",
            "    if row < outer:",
        ]
    else:  # a warp per row, several rows per block
        lines = [
            f"def {fn}({params.signature()}):",
            "    lane = cuda.threadIdx.x % 32",
            f"    row = cuda.blockIdx.x * {ROWS_PER_BLOCK} + cuda.threadIdx.x // 32",
            "    if row < outer:",  # a whole warp shares its row: the shuffles see all 32 lanes
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
    if cache is not None:  # the kept values are defined on every path (a row's last step
        # may lie past its end for some threads)
        lines += [
            f"        {var(i, u, t)} = {NUMBA_TYPE[compute_dtype(k.inputs[i].dtype)]}(0)"
            for t in range(cache[0])
            for i in kept
            for u in range(lanes)
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
            "        off = 16",
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
        else:
            lines.append(f"        {acc} = cuda.shfl_sync(0xFFFFFFFF, {acc}, 0)")
        value = f"{acc} / {NUMBA_TYPE[acc_t]}(red)" if st.reduce == "mean" else acc
        if st.epilogue is not None:
            lines.append(f"        red{j} = {NUMBA_TYPE[acc_t]}({value})")
            w = BodyWriter(lambda i, v=f"red{j}": v, lambda i, t=acc_t: t, f"e{j}")
            value, _ = w.emit(st.epilogue)
            lines += ["        " + b for b in w.lines]
        lines.append(f"        st{j} = {NUMBA_TYPE[st.dtype]}({value})")
        stage_vars.append((f"st{j}", st.dtype))

    def store(_, results):
        if lanes > 1:
            stored = ", ".join(store_expr(k.dtype, v) for v in results)
            return [f"{ind}vstore{lanes}(out, j, {stored})"]
        return [ind + _store(k, "j", results[0])]

    lines += passes(stored_body(k.body, k.dtype), "", store, set())
    return "\n".join(lines), params


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


def rows_threads(k: Kernel, lanes: int) -> int:
    """Threads sharing a row in a rows kernel: a warp, or a block (up to ``THREADS``, as many
    warps as one step over the row needs) when the rows are few and a warp would step
    through a row several times per pass: few warps then leave the device waiting on
    memory. Many rows stay with warps (measured faster: the large encoder's 16,384 rows of
    1,024 take 144 us by warps, 150 us by blocks of 256, H200)."""
    if not k.domain:
        return 32
    per_row = math.ceil(k.domain[-1] / lanes)
    if math.prod(k.domain[:-1]) >= ROWS_WARP_MIN or per_row <= 32:
        return 32
    return min(THREADS, 32 * math.ceil(per_row / 32))


def rows_style(k: Kernel, lanes: int) -> str:
    return "rows" if rows_threads(k, lanes) == 32 else "rows-block"


def generate(k: Kernel, lanes: int | None = None, narrow: bool = False) -> Generated:
    """The kernel for ``k``; loops use ``lanes``-wide vector accesses (default: as wide as
    the operands allow), reductions ignore it; ``narrow`` loops and reductions divide
    their index (strided and broadcast operands) in 32-bit arithmetic."""
    if lanes is None:
        lanes = {"loop": vector_lanes, "rows": rows_lanes}.get(k.kind, lambda k: 1)(k)
    fn = f"{k.kind}_{_ops_named(k)}{_digest(k, lanes, narrow)}"
    dtypes = [k.dtype, *(o.dtype for o in k.inputs)]
    bad = [d for d in dtypes if d not in MEMORY_TYPE]
    if bad:
        raise KernelError(f"the CUDA emitter has no kernels for dtype {bad[0]}")
    _refuse_halves(k)
    halves = any(d in HALVES for d in dtypes) or _casts_to_half(k)
    if k.kind == "loop":
        body, params = loop_source(k, fn, lanes, narrow)
        style = "loop"
    elif k.kind == "reduce":
        body, params, style = reduce_source(k, fn, narrow)
        lanes = 1
    elif k.kind == "rows":
        body, params = rows_source(k, fn, lanes)
        style = rows_style(k, lanes)
    else:
        raise KernelError(f"the CUDA emitter builds loops and reductions, not {k.kind}")
    src = (
        "# generated by saturn.codegen.cuda\nimport math\n\nimport numba\nimport numpy as np\n"
        "from numba import cuda\n"
        + (VECTOR_IMPORT if lanes > 1 else "")
        + helpers(DEVICE_FN, ROUNDING_TARGET, casts="cuda")
        + _half_head(halves)
        + "\n\n"
        + body
        + "\n"
    )
    ptypes = [MEMORY_TYPE[k.dtype], *(MEMORY_TYPE[o.dtype] for o in k.inputs)]
    if "err" in params.pointers:  # a fused take's error word
        ptypes.append("int32")
    threads = rows_threads(k, lanes) if style == "rows-block" else THREADS
    if lanes == 1:
        return Generated(fn, src, params, ptypes, style, threads=threads)
    dtypes = [k.dtype, *(o.dtype for o in k.inputs)]
    vectors = ("same", "strided", "table")
    packed = (
        0,
        *(1 + i for i, o in enumerate(k.inputs) if o.indexing in vectors or _row_trailing(k, i)),
    )
    aligned = tuple((p, lanes * MEMORY_SIZE[dtypes[p]]) for p in packed)
    return Generated(fn, src, params, ptypes, style, lanes, threads=threads, aligned=aligned)


NAMED_OPS = 4  # most operation names a kernel's name lists
_UNNAMED = {"in", "const", "stage", "cast"}  # operands, constants and conversions


def _ops_named(k: Kernel) -> str:
    """What a kernel computes, for its name in profiles: a reduction's kind (a rows
    kernel's stage reductions), then the distinct operations of its stages, body and
    epilogue in order of first appearance (up to ``NAMED_OPS``, then ``etc``), each
    followed by ``_``: ``loop_add_relu_<digest>``, ``rows_max_sum_add_exp_<digest>``."""
    names: list[str] = [k.attrs["reduce"]] if k.kind == "reduce" else []
    stages = list(k.stages or ()) if k.kind == "rows" else []
    names += list(dict.fromkeys(st.reduce for st in stages))  # a softmax: max, sum
    exprs = [e for st in stages for e in (st.body, st.epilogue) if e is not None]
    exprs += [e for e in (k.body, k.epilogue) if e is not None]
    for e in exprs:
        todo = [e]  # depth-first, left to right, without recursion
        while todo:
            x = todo.pop()
            if not isinstance(x, tuple) or not x or not isinstance(x[0], str):
                continue
            if x[0] not in _UNNAMED and x[0] not in names:
                names.append(x[0])
            todo += reversed([a for a in x[1:] if isinstance(a, tuple)])
    if len(names) > NAMED_OPS:
        names = [*names[:NAMED_OPS], "etc"]
    return "".join(f"{n}_" for n in names if n.isidentifier())


def _digest(k: Kernel, *extra) -> str:
    key = (k.kind, k.body, k.epilogue, k.stages, len(k.domain), k.dtype, k.attrs, *extra)
    return hashlib.sha256(
        repr((*key, [(o.dtype, o.indexing) for o in k.inputs])).encode()
    ).hexdigest()[:12]


def _refuse_halves(k: Kernel) -> None:
    """Loops and rows kernels take half operands and outputs (read into float32, rounded
    at the store); a reduction too, accumulating in float32 or float64 (a rows kernel's
    stages always do: ``ROW_FLOATS``). A reduction accumulating in a half type is not
    built."""
    if k.kind == "reduce" and _acc_dtype(k) in HALVES:
        raise KernelError(f"a reduction accumulating in {_acc_dtype(k)} is not built")


def _casts_to_half(k: Kernel) -> bool:
    """Whether any expression of ``k`` rounds a value to a half type (its helpers needed)."""

    def walk(e) -> bool:
        if not isinstance(e, tuple) or not e:
            return False
        if e[0] == "cast" and e[2] in HALVES:
            return True
        return any(walk(c) for c in e[1:] if isinstance(c, tuple))

    exprs = [k.body, k.epilogue]
    for st in k.stages:
        exprs += [st.body, st.epilogue]
    return any(walk(e) for e in exprs if e is not None)


def _half_head(needed: bool) -> str:
    if not needed:
        return ""
    return "\nfrom saturn.codegen.halfbits import bits_f32, f32_bits\n" + half_helpers(DEVICE_FN)


def generate_split(k: Kernel, narrow: bool = False) -> tuple[Generated, Generated]:
    """The partial and fold kernels of a split reduction (``split_sources``)."""
    fn = f"split_{_digest(k, *(('narrow',) if narrow else ()))}"
    _refuse_halves(k)
    part, pparams, fold, fparams = split_sources(k, fn, narrow)
    halves = k.dtype in HALVES or any(o.dtype in HALVES for o in k.inputs) or _casts_to_half(k)
    head = (
        "# generated by saturn.codegen.cuda\nimport math\n\nimport numba\nimport numpy as np\n"
        "from numba import cuda\n"
        + helpers(DEVICE_FN, ROUNDING_TARGET, casts="cuda")
        + _half_head(halves)
        + "\n\n"
    )
    ptr = MEMORY_TYPE
    acc = ptr[_acc_dtype(k)]
    return (
        Generated(
            f"{fn}_part",
            head + part + "\n",
            pparams,
            [acc, *(ptr[o.dtype] for o in k.inputs)],
            "split-part",
        ),
        Generated(f"{fn}_fold", head + fold + "\n", fparams, [ptr[k.dtype], acc], "split-fold"),
    )


# --- launch geometry -----------------------------------------------------------------


def grid_for(g: Generated, sizes: dict[str, int], sm_count: int = 132) -> tuple[int, int]:
    """(blocks, threads per block) for a launch with these sizes."""
    if g.style in ("loop", "copy"):
        n = max(sizes["n"] // g.lanes, 1)
        # a bounded number of blocks per SM; each thread then strides through the rest
        return max(1, min(math.ceil(n / THREADS), int(sm_count * BLOCKS_PER_SM))), THREADS
    if g.style == "row-warp":
        return max(1, math.ceil(sizes["outer"] / 8)), THREADS
    if g.style == "row-thread":
        rows = math.ceil(sizes["outer"] / THREADS)
        return max(1, min(rows, int(sm_count * BLOCKS_PER_SM))), THREADS
    if g.style == "rows":
        return max(1, math.ceil(sizes["outer"] / ROWS_PER_BLOCK)), THREADS
    if g.style == "rows-block":
        return max(1, sizes["outer"]), g.threads
    if g.style == "row-block":
        return max(1, sizes["outer"]), THREADS
    return max(1, math.ceil(sizes["outer"] * sizes["inner"] / 32)), THREADS


def size_args(
    g: Generated, k: Kernel, shapes: list[tuple[int, ...]], strides: list[tuple[int, ...]]
) -> dict[str, int]:
    """The int64 parameters of a launch, from the operands' actual shapes and strides
    (in elements). Raises when an operand does not fit what the kernel was built for."""
    domain = tuple(k.domain)
    vals: dict[str, int] = {f"s{d}": s for d, s in enumerate(domain)}
    if k.kind == "loop":
        vals["n"] = math.prod(domain)
    elif k.kind == "rows":
        vals["red"] = domain[-1] if domain else 1
        vals["outer"] = math.prod(domain) // vals["red"] if vals["red"] else 0
    else:
        vals["outer"], vals["red"], vals["inner"] = reduce_layout(k)
    total = math.prod(domain)
    for i, (o, shp, st) in enumerate(zip(k.inputs, shapes, strides, strict=True)):
        if tuple(shp) != tuple(o.shape):
            raise KernelError(
                f"operand {i} has shape {list(shp)}, kernel built for {list(o.shape)}"
            )
        numel = math.prod(shp)
        if o.indexing == "trailing":
            vals[f"m{i}"] = numel
        elif o.indexing == "leading":
            vals[f"r{i}"] = total // numel if numel else 1
        elif o.indexing == "middle":
            pad = (1,) * (len(domain) - len(shp)) + tuple(shp)
            last = max(d for d, s in enumerate(pad) if s != 1)
            vals[f"m{i}"] = numel
            vals[f"r{i}"] = math.prod(domain[last + 1 :])
        elif o.indexing == "strided":
            pad = len(domain) - len(shp)
            for d in range(len(domain)):
                a = d - pad
                vals[f"st{i}_{d}"] = 0 if a < 0 or shp[a] == 1 else st[a]
        elif o.indexing in ("table", "rowindex"):  # a fused take reads both packed
            if not _is_packed(shp, st):
                raise KernelError(
                    f"operand {i} ({o.indexing}) has strides {list(st)}; the kernel reads it packed"
                )
            if o.indexing == "table":
                vals["rows"] = shp[0]
    return vals


def _is_packed(shape, strides) -> bool:
    """Whether elements lie in row-major order with no gaps (size-1 axes' strides aside)."""
    expected = 1
    for n, st in zip(reversed(tuple(shape)), reversed(tuple(strides)), strict=True):
        if n != 1 and st != expected:
            return False
        expected *= n
    return True


# --- compilation and loading -----------------------------------------------------------

_LOCK = threading.Lock()
_KERNELS: dict[tuple, object] = {}


def load(g: Generated, cc: tuple[int, int]):
    """A cuda.core Kernel for ``g`` on the current context (built, or found in the cache
    on disk: ``cubins.build``)."""
    key = (g.source, cc)
    with _LOCK:
        if key in _KERNELS:
            return _KERNELS[key]
        from cuda.core import ObjectCode

        entry, kind, code = build(g, cc)
        obj = ObjectCode.from_cubin(code) if kind == "cubin" else ObjectCode.from_ptx(code)
        kernel = obj.get_kernel(entry)
        _KERNELS[key] = kernel
        return kernel


_STREAMS: dict[int, object] = {}


def core_stream(handle: int):
    """saturn's stream as a cuda.core Stream (made once per handle)."""
    s = _STREAMS.get(handle)
    if s is None:
        from cuda.core import Stream

        s = _STREAMS[handle] = Stream.from_handle(handle)
    return s


class CudaKernel:
    """A compiled kernel ready to launch on saturn's stream with pointers and sizes.

    Loops come in variants: vector accesses (used when every packed pointer is aligned
    for them, which saturn's allocator gives whole tensors) or scalar (offset views), each
    with 32-bit index arithmetic when the loop divides its index (strided or broadcast
    operands) and every index fits, 64-bit otherwise. A variant is compiled when first
    launched. The launch geometry and size arguments are worked out once per operand layout
    and variant and reused; a launch checks the operands' shapes and raises on a mismatch."""

    def __init__(self, k: Kernel, cc: tuple[int, int], sm_count: int = 132):
        self.k, self.cc = k, cc
        self.g = generate(k)
        # a reduction too narrow to fill the device: (chunks, chunk, partial, fold kernels)
        self.split: tuple | None = None
        if k.kind == "reduce":
            chunks, chunk = split_plan(k, sm_count)
            if chunks > 1:
                self.split = (chunks, chunk, *generate_split(k))
        self._variants: dict[tuple[int, bool], tuple[Generated, object]] = {}
        self._indexed = k.kind in ("loop", "reduce") and index_arithmetic(k)
        self._strided = any(o.indexing == "strided" for o in k.inputs)
        self.takes = "take" in k.attrs  # a fused take: an error word after the operands
        # operand layout -> (strided operands readable as vectors, narrow index arithmetic)
        self._layouts: dict[tuple, tuple[bool, bool]] = {}
        self._plans: dict[tuple, tuple] = {}

    def expected(self) -> list[Generated]:
        """The variants a launch will most likely take, to build ahead of the first call
        (``cubins.precompile``): aligned vectors (and scalar where a strided operand may
        not allow them), narrow index arithmetic where the loop divides its index and
        its size fits; a split reduction's two kernels. A variant a launch takes that is
        not among these is built at that launch."""
        if self.split is not None:
            return list(self.split[2:])
        narrow = self._indexed and math.prod(self.k.domain) < INDEX32
        lanes = {self.g.lanes, 1} if self._strided else {self.g.lanes}
        out = []
        for n in lanes:
            same = (n, narrow) == (self.g.lanes, False)
            out.append(self.g if same else generate(self.k, lanes=n, narrow=narrow))
        return out

    def _layout(self, key: tuple) -> tuple[bool, bool]:
        """What an operand layout (shapes, strides) allows, worked out once per layout
        (programs that do not replay launch every call)."""
        fits = self._layouts.get(key)
        if fits is None:
            shapes, strides = key
            n = math.prod(self.k.domain)
            vectors = self.g.lanes > 1 and (
                not self._strided or strided_vectors_fit(self.k, self.g.lanes, shapes, strides)
            )
            narrow = (
                self._indexed
                and n < INDEX32
                and all(
                    fits_narrow(n, shp, st)
                    for o, shp, st in zip(self.k.inputs, shapes, strides, strict=True)
                    if o.indexing == "strided"
                )
            )
            fits = self._layouts[key] = (vectors, narrow)
        return fits

    def variant(
        self, ptrs: list[int], shapes=None, strides=None, key: tuple | None = None
    ) -> tuple[Generated, object]:
        """The variant these pointers and this layout take (compiled at first use); without
        a layout, the 64-bit variant, scalar for strided operands."""
        if key is None and shapes is not None:
            key = (tuple(map(tuple, shapes)), tuple(map(tuple, strides)))
        vectors, narrow = self._layout(key) if key is not None else (not self._strided, False)
        lanes = self.g.lanes if vectors and not self.g.misaligned(ptrs) else 1
        v = self._variants.get((lanes, narrow))
        if v is None:
            g = self.g if (lanes, narrow) == (self.g.lanes, False) else None
            g = g or generate(self.k, lanes=lanes, narrow=narrow)
            v = self._variants[(lanes, narrow)] = (g, load(g, self.cc))
        return v

    def plan(
        self,
        shapes: list[tuple[int, ...]],
        strides: list[tuple[int, ...]],
        g: Generated | None = None,
        key: tuple | None = None,
    ) -> tuple:
        g = g or self.g
        key = (g.name, key or (tuple(map(tuple, shapes)), tuple(map(tuple, strides))))
        p = self._plans.get(key)
        if p is None:
            from cuda.core import LaunchConfig

            sizes = size_args(g, self.k, shapes, strides)
            blocks, threads = grid_for(g, sizes)
            p = (
                LaunchConfig(grid=blocks, block=threads),
                [np.int64(sizes[name]) for name in g.params.ints],
            )
            self._plans[key] = p
        return p

    def launch(
        self,
        stream: int,
        out_ptr: int,
        in_ptrs: list[int],
        shapes: list[tuple[int, ...]],
        strides: list[tuple[int, ...]],
        workspace=None,
        err_ptr: int | None = None,
    ) -> None:
        """Launch on ``stream``. ``workspace(nbytes)`` gives the address of device memory
        the kernel may use for the launch (a split reduction's partials), the same memory
        at every call for a graph that replays. ``err_ptr``: the error word a rows kernel
        with a fused take sets on an index out of range."""
        from cuda.core import launch

        if self.split is not None:
            if workspace is None:
                raise KernelError("a split reduction needs a workspace")
            self._launch_split(stream, out_ptr, in_ptrs, shapes, strides, workspace)
            return
        ptrs = [out_ptr, *in_ptrs]
        if self.takes:
            if err_ptr is None:
                raise KernelError("a rows kernel with a fused take needs an error word")
            ptrs.append(err_ptr)
        key = (tuple(map(tuple, shapes)), tuple(map(tuple, strides)))
        g, kernel = self.variant(ptrs, key=key)
        config, ints = self.plan(shapes, strides, g, key)
        launch(core_stream(stream), config, kernel, *[np.uint64(p) for p in ptrs], *ints)

    def workspace_bytes(self) -> int:
        """Device memory a launch needs besides its operands."""
        if self.split is None:
            return 0
        outer, _, inner = reduce_layout(self.k)
        return self.split[0] * outer * inner * MEMORY_SIZE[_acc_dtype(self.k)]

    def _launch_split(self, stream, out_ptr, in_ptrs, shapes, strides, workspace) -> None:
        from cuda.core import LaunchConfig, launch

        chunks, chunk, part, fold = self.split
        layout = (tuple(map(tuple, shapes)), tuple(map(tuple, strides)))
        key = ("split", *layout)
        p = self._plans.get(key)
        if p is None:
            if self._layout(layout)[1]:  # every index fits: the narrow partials
                part, fold = generate_split(self.k, narrow=True)
            sizes = size_args(part, self.k, shapes, strides)
            sizes["chunk"] = chunk
            outputs = sizes["outer"] * sizes["inner"]
            tiles = sizes["outer"] if sizes["inner"] == 1 else math.ceil(outputs / 32)
            p = self._plans[key] = (
                LaunchConfig(grid=(tiles, chunks), block=THREADS),
                [np.int64(sizes[name]) for name in part.params.ints],
                LaunchConfig(grid=math.ceil(outputs / 32), block=THREADS),
                [np.int64(outputs), np.int64(chunks), np.int64(sizes["red"])],
                (load(part, self.cc), load(fold, self.cc)),
            )
        pconf, pints, fconf, fints, (pk, fk) = p
        ws = np.uint64(workspace(self.workspace_bytes()))
        s = core_stream(stream)
        launch(s, pconf, pk, ws, *[np.uint64(q) for q in in_ptrs], *pints)
        launch(s, fconf, fk, np.uint64(out_ptr), ws, *fints)


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
            gen = generate_row_copy if kind == "rows" else generate_copy
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
