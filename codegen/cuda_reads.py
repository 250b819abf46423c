"""What every CUDA kernel kind shares: compute and storage dtypes, half-precision helpers,
operand reads by indexing (packed, broadcast, strided, table) in scalar and 16-byte vector
form, stores, and the warp-level pieces of reductions.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
from numba import config

from saturn.eqsat import optable as ot
from saturn.eqsat.kinds import Kind
from saturn.eqsat.program import Kernel

from .expr import NUMBA_TYPE, BodyWriter
from .lane_body import LaneBodies
from .movement import (
    _uint32,
    narrow_copies,
)

BLOCKS_PER_SM = 32  # loop kernels: grid cap (bench/kernel_speed.py sweeps it)


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
    bfloat16, ties to even; any NaN to 0x7FFF, as PyTorch's CUDA conversion: ``f32_bf16``),
    ``bf16_round``/``f16_round`` (a float32 rounded to the half type and back: a cast
    inside a body)."""
    return f"""
{decorator}
def bf16_load(u):
    return bits_f32(np.uint32(u) << np.uint32(16))


{decorator}
def bf16_store(v):
    return f32_bf16(np.float32(v))


{decorator}
def bf16_round(v):
    return bf16_load(bf16_store(v))


{decorator}
def f16_round(v):
    return np.float32(np.float16(v))
""" + "".join(_converting_vload(decorator, t, n) for t in HALVES for n in (2, 4, 8))


def _converting_vload(decorator: str, dtype: str, lanes: int) -> str:
    """``{dtype}_vload{lanes}``: a vector of half elements read into float32 values, one
    call per operand and step instead of a load and a conversion per lane (statements
    Numba's front end would type one by one: decision 0112)."""
    vs = [f"v{u}" for u in range(lanes)]
    return (
        f"\n\n{decorator}\ndef {dtype}_vload{lanes}(a, i):\n"
        f"    {', '.join(vs)} = vload{lanes}(a, i)\n"
        f"    return {', '.join(load_expr(dtype, v) for v in vs)}\n"
    )


def _vload(dtype: str, lanes: int, names: list[str], array: str, at: str, ind: str) -> str:
    """``names`` read as one vector access at ``at``, in their compute dtype."""
    fn = f"{dtype}_vload{lanes}" if dtype in HALVES else f"vload{lanes}"
    return f"{ind}{', '.join(names)} = {fn}({array}, {at})"


# the simulator runs device functions as Python: numpy's rounding there (expr.helpers)
ROUNDING_TARGET = "numpy" if config.ENABLE_CUDASIM else "cuda"


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
    k: Kernel,
    flat_index: str,
    rank: int,
    domain_names: list[str],
    ind: str,
    narrow: bool = False,
    used: set[int] | None = None,
    name: Callable[[int], str] | None = None,
) -> tuple[list[str], list[str]]:
    """Statements reading every operand (or those in ``used``) at the domain's flat index
    into ``in{i}_v`` (or ``name(i)``); the int params used, by every operand.
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
        v = name(i) if name else f"in{i}_v"
        emit = used is None or i in used
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
            lines += [f"{ind}{v} = rc{i}"] if emit else []
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
            lines += [f"{ind}{v} = {read} if tok else {zero}"] if emit else []
            continue
        elif o.indexing == "rowindex":  # read once per row, by ``_take_head``
            continue
        else:
            idx = f"off{i}"
        lines += [f"{ind}{v} = {load_expr(o.dtype, f'in{i}[{idx}]')}"] if emit else []
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
    if strided and k.kind == Kind.ROWS and rank:  # from the row's base (``_row_strided_head``)
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


VECTOR = True  # packed loops use vector loads and stores (bench/kernel_speed.py turns it off)


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
    name: Callable[[int], str] | None = None,
) -> list[str]:
    """Statements reading ``lanes`` adjacent elements (flat index ``j`` on) of every operand
    (or those in ``used``) as ``in{i}_v{u}`` (or ``name(i)`` then the lane): packed
    operands as one vector access,
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
        base = name(i) if name else f"in{i}_v"
        names = [f"{base}{u}" for u in range(lanes)]
        if _row_constant(k, i):  # one value per row (``_row_constant_head``)
            lines += [f"{ind}{v} = rc{i}" for v in names]
            continue
        convert = o.dtype not in HALVES and load_expr(o.dtype, "v") != "v"  # bools
        if o.indexing == "trailing" and _row_trailing(k, i):  # whole rows, from the base
            lines.append(_vload(o.dtype, lanes, names, f"in{i}", f"pb{i} + r", ind))
            if convert:
                lines += [f"{ind}{v} = {load_expr(o.dtype, v)}" for v in names]
            continue
        if o.indexing == "table":  # the taken row, or zeros past the table (``_take_head``)
            zero = f"{NUMBA_TYPE[compute_dtype(o.dtype)]}(0)"
            lines += [
                f"{ind}if tok:",
                _vload(o.dtype, lanes, names, f"in{i}", "tb + r", ind + "    "),
                *(f"{ind}    {v} = {load_expr(o.dtype, v)}" for v in names if convert),
                f"{ind}else:",  # the compute type's zeros: what the reads convert to
                f"{ind}    {', '.join(names)} = {', '.join([zero] * lanes)}",
            ]
            continue
        if o.indexing in ("same", "strided"):
            if o.indexing == "strided" and not offsets:
                lines += _strided_offsets(k, "j", rank, dnames, ind, narrow)[0]
                offsets = True
            at = "j" if o.indexing == "same" else f"off{i}"
            lines.append(_vload(o.dtype, lanes, names, f"in{i}", at, ind))
            if convert:  # bools: to their compute dtype (halves convert as they load)
                lines += [f"{ind}{v} = {load_expr(o.dtype, v)}" for v in names]
            continue
        per_lane = []
        for u in range(lanes):
            r, _ = _operand_reads(
                k, f"(j + {u})", rank, dnames, ind, narrow, {i}, lambda _, v=names[u]: v
            )
            pre = [ln for ln in r[:-1] if ln.startswith(f"{ind}fi =")]
            per_lane += [*pre, r[-1]]
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
    k: Kernel,
    lanes: int,
    rank: int,
    dnames: list[str],
    ind: str,
    narrow: bool,
    lane: LaneBodies,
) -> list[str]:
    """One vector step of a loop at flat index ``j``, each lane calling the body's function
    (``lane``). With middle or leading operands the step branches once: where it stays
    inside one run of each, those operands are read once and every lane computes from the
    same values (so what depends only on them, batch norm's ``rsqrt(var + eps)``, is
    computed once per step, not per lane: the inlined calls share it); otherwise each lane
    reads its own."""
    u_, jj = ("u", "uj") if narrow else ("", "j")
    head = (
        [f"{ind}uj = np.uint32(j)"]
        if narrow and any(o.indexing in BROADCAST for o in k.inputs)
        else []
    )

    body = stored_body(k.body, k.dtype)

    def step(ind2: str, reads: list[str], tag: str = "") -> list[str]:
        lines, results = list(reads), []
        for u in range(lanes):
            call, _ = lane.call(
                body, lambda i: compute_dtype(k.inputs[i].dtype), lambda i, u=u: f"in{i}_v{u}"
            )
            lines.append(f"{ind2}b{tag}u{u} = {call}")
            results.append(store_expr(k.dtype, f"b{tag}u{u}"))
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
        *step(
            inner,
            _vector_reads(k, lanes, rank, dnames, inner, narrow=narrow, runs="shared"),
            "s",
        ),
        f"{ind}elif {two}:",
        *(f"{inner}e{g} = (q{g} + {one}) * {u_}r{g} - {jj}" for g in groups),
        *step(
            inner,
            _vector_reads(k, lanes, rank, dnames, inner, narrow=narrow, runs="two"),
            "t",
        ),
        f"{ind}else:",
        *step(
            inner,
            _vector_reads(k, lanes, rank, dnames, inner, narrow=narrow, runs="per-lane"),
            "p",
        ),
    ]


def _row_trailing(k: Kernel, i: int) -> bool:
    """Whether rows kernel ``k`` reads trailing operand i as whole rows: its length a
    multiple of the row's, so row ``row`` reads row ``row % (m / red)`` of it from its
    start (``pb{i}``, worked out once per row) and element ``r`` needs no division (a layer
    norm's weight: ``pb`` is 0; position rows under a batch)."""
    o = k.inputs[i]
    if k.kind != Kind.ROWS or o.indexing != "trailing" or not k.domain or not o.shape:
        return False
    return o.shape[-1] == k.domain[-1] and math.prod(o.shape) % k.domain[-1] == 0


def _row_constant(k: Kernel, i: int) -> bool:
    """Whether rows kernel ``k``'s broadcast operand i is constant along each row (its last
    extent 1, the row's more): an attention mask's per-query column [S, 1] under
    [B, H, S, S]. Its run ``r`` is then a multiple of ``red``, so every element of row
    ``row`` reads the value at the row's start, ``(row * red) // r``: read once per row
    (``rc{i}``, ``_row_constant_head``), not divided out at every element of every pass."""
    o = k.inputs[i]
    if k.kind != Kind.ROWS or o.indexing not in ("leading", "middle") or not k.domain:
        return False
    return (not o.shape or o.shape[-1] == 1) and k.domain[-1] > 1
