"""CUDA reduction kernels: a domain seen as outer x reduce x inner, rows reduced by a warp
or a block each, columns by 32 per block; split reductions (partials per chunk, then a fold)
where too few outputs would leave the device idle (``split_plan``).
"""

from __future__ import annotations

import math

from saturn.eqsat.program import Kernel

from .cubins import (
    KernelError,
)
from .cuda_reads import (
    ROW_THREAD_LIMIT,
    ROW_WARP_LIMIT,
    _acc_dtype,
    _combine,
    _identity,
    _operand_reads,
    _store_reduced,
    _warp_reduce,
    compute_dtype,
    index_arithmetic,
    narrow_head,
)
from .expr import NUMBA_TYPE, BodyWriter
from .generated import NUMBA_SCALAR, THREADS, Params


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


def _names(k: Kernel) -> tuple[list[str], list[str]]:
    """The accumulators of a reduction and the element values they fold: ``acc`` and
    ``v`` for its output, ``acc1``, ``v1``, ... for each sibling it computes beside it
    (``attrs["stats"]``, ``eqsat/horizontal.py``)."""
    n = 1 + len(k.attrs.get("stats", ()))
    return ["acc", *[f"acc{j}" for j in range(1, n)]], ["v", *[f"v{j}" for j in range(1, n)]]


def _accumulate(index: str, step: int, bound: str, element, kind: str, ind: str, k) -> list[str]:
    """A reduction thread's loop from ``r`` up to ``bound`` in steps of ``step``, folding each
    element into its accumulators. ``index`` is the flat index of element ``r`` (``{r}`` in
    it); ``element(ind, vars)`` gives the lines computing the elements at ``f`` into
    ``vars``, one per accumulator. (Unrolled four times, with the loads ahead of the adds,
    the narrow reductions of bench/kernel_speed.py ran no faster: 83 -> 96 us, 32 -> 37 us
    on the H200.)"""
    accs, vals = _names(k)
    return [
        f"{ind}while r < {bound}:",
        f"{ind}    f = {index.format(r='r')}",
        *element(ind + "    ", vals),
        *[f"{ind}    {a} = {_combine(kind, a, v)}" for a, v in zip(accs, vals, strict=True)],
        f"{ind}    r += {step}",
    ]


def _element(k: Kernel, narrow: bool = False):
    """``element(ind, vars)``: the lines computing a reduction's values at flat index ``f``
    into ``vars`` (operand reads once, the bodies, the casts to the accumulator); and the
    int parameters the reads use. ``narrow``: the reads' index arithmetic in 32 bits, over
    the copies ``narrow_head`` makes."""
    rank = len(k.domain)
    dnames = [f"s{d}" for d in range(rank)]
    body = BodyWriter(lambda i: f"in{i}_v", lambda i: compute_dtype(k.inputs[i].dtype))
    results = [body.emit(e)[0] for e in (k.body, *(e for e, _ in k.attrs.get("stats", ())))]
    acc_type = NUMBA_TYPE[_acc_dtype(k)]
    _, ints = _operand_reads(k, "f", rank, dnames, "")

    def element(at: str, vars: list[str]) -> list[str]:
        reads, _ = _operand_reads(k, "f", rank, dnames, at, narrow)
        casts = [f"{at}{v} = {acc_type}({res})" for v, res in zip(vars, results, strict=True)]
        return reads + [at + b for b in body.lines] + casts

    return element, ints


def _warp_fold(kind: str, k: Kernel, ind: str) -> list[str]:
    """Each accumulator folded across the 32 lanes of a warp (lane 0 ends with it)."""
    shfl = [_combine(kind, a, f"cuda.shfl_down_sync(0xFFFFFFFF, {a}, off)") for a in _names(k)[0]]
    if len(shfl) == 1:
        return _warp_reduce(shfl[0], ind)
    return [
        f"{ind}off = 16",
        f"{ind}while off > 0:",
        *[f"{ind}    {a} = {e}" for a, e in zip(_names(k)[0], shfl, strict=True)],
        f"{ind}    off //= 2",
    ]


def _parts(k: Kernel, size: int, acc_t: str) -> list[str]:
    """Shared memory for each accumulator's partials: ``part``, ``part1``, ..."""
    t = NUMBA_SCALAR[acc_t]
    return [f"    {_part(a)} = cuda.shared.array({size}, dtype=numba.{t})" for a in _names(k)[0]]


def _part(acc: str) -> str:
    return acc.replace("acc", "part")


def _block_row(kind: str, acc_t: str, start: str, bound: str, element, store, k) -> list[str]:
    """A block of THREADS per row (``blockIdx.x``): each thread folds from ``start`` up to
    ``bound``, the warps fold across their lanes and then across warps through shared
    memory; thread 0 runs ``store`` (lines at 12 spaces) with the row's accumulators."""
    ident = _identity(kind, acc_t)
    accs = _names(k)[0]
    return [
        "    row = cuda.blockIdx.x",
        "    tid = cuda.threadIdx.x",
        *_parts(k, 8, acc_t),
        *[f"    {a} = {ident}" for a in accs],
        f"    r = {start}",
        *_accumulate("row * red + {r}", THREADS, bound, element, kind, "    ", k),
        *_warp_fold(kind, k, "    "),
        "    if tid % 32 == 0:",
        *[f"        {_part(a)}[tid // 32] = {a}" for a in accs],
        "    cuda.syncthreads()",
        "    if tid < 32:",
        *[f"        {a} = {_part(a)}[tid] if tid < 8 else {ident}" for a in accs],
        *_warp_fold(kind, k, "        "),
        "        if tid == 0:",
        *store,
    ]


def _columns(kind: str, acc_t: str, outputs: str, loop: list[str], store, k) -> list[str]:
    """32 consecutive outputs per block (``p``, coalesced), 8 threads down each: every
    thread folds by ``loop`` (lines at 8 spaces), then the 8 partials of each output are
    folded in order through shared memory and ``store`` (lines at 8 spaces) runs."""
    accs = _names(k)[0]
    return [
        "    tx = cuda.threadIdx.x % 32",
        "    ty = cuda.threadIdx.x // 32",
        "    p = cuda.blockIdx.x * 32 + tx",
        *_parts(k, 256, acc_t),
        *[f"    {a} = {_identity(kind, acc_t)}" for a in accs],
        f"    if p < {outputs}:",
        *loop,
        *[f"    {_part(a)}[cuda.threadIdx.x] = {a}" for a in accs],
        "    cuda.syncthreads()",
        f"    if ty == 0 and p < {outputs}:",
        "        for j in range(1, 8):",
        *[f"            {a} = {_combine(kind, a, _part(a) + '[j * 32 + tx]')}" for a in accs],
        *store,
    ]


def _column_loop(start: str, bound: str, element, kind: str, k) -> list[str]:
    return [
        "        o = p // inner",
        "        c = p % inner",
        f"        r = {start}",
        *_accumulate("(o * red + {r}) * inner + c", 8, bound, element, kind, "        ", k),
    ]


def _stores(k: Kernel, at: str, ind: str) -> list[str]:
    """Each accumulator finished (mean's division, the epilogue) and stored at ``at``: the
    output to ``out``, each sibling to its ``stat{j}``."""
    kind = k.attrs["reduce"]
    acc_type = NUMBA_TYPE[_acc_dtype(k)]
    lines = []
    for j, a in enumerate(_names(k)[0]):
        finish = f"{a} / {acc_type}(red)" if kind == "mean" else a
        lines += _store_reduced(k, f"{'out' if j == 0 else f'stat{j - 1}'}[{at}]", finish, ind)
    return lines


def _stat_pointers(k: Kernel) -> list[str]:
    return [f"stat{j}" for j in range(len(k.attrs.get("stats", ())))]


def reduce_source(k: Kernel, fn: str, narrow: bool = False) -> tuple[str, Params, str]:
    """A row (warp or block per row) or column reduction kernel; returns its style too.
    ``narrow``: operands' index arithmetic in 32 bits (as loops, ``loop_source``)."""
    _, red, inner = reduce_layout(k)
    dnames = [f"s{d}" for d in range(len(k.domain))]
    kind = k.attrs["reduce"]
    acc_t = _acc_dtype(k)
    accs = _names(k)[0]
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
        ["out", *[f"in{i}" for i in range(len(k.inputs))], *_stat_pointers(k)],
        ["outer", "red", "inner", *shape, *ints],
    )
    lines = [f"def {fn}({params.signature()}):", *(narrow_head(k, dnames) if narrow else [])]
    if style == "row-thread":
        # one thread per row (grid-stride), its elements folded in order
        lines += [
            "    row = cuda.grid(1)",
            "    step = cuda.gridsize(1)",
            "    while row < outer:",
            *[f"        {a} = {_identity(kind, acc_t)}" for a in accs],
            "        r = 0",
            *_accumulate("row * red + {r}", 1, "red", element, kind, "        ", k),
            *_stores(k, "row", "        "),
            "        row += step",
        ]
    elif style == "row-warp":
        # one warp per row, 8 rows per block
        lines += [
            "    lane = cuda.threadIdx.x % 32",
            "    row = cuda.blockIdx.x * 8 + cuda.threadIdx.x // 32",
            *[f"    {a} = {_identity(kind, acc_t)}" for a in accs],
            "    if row < outer:",
            "        r = lane",
            *_accumulate("row * red + {r}", 32, "red", element, kind, "        ", k),
            *_warp_fold(kind, k, "    "),
            "    if lane == 0 and row < outer:",
            *_stores(k, "row", "        "),
        ]
    elif style == "row-block":
        lines += _block_row(kind, acc_t, "tid", "red", element, _stores(k, "row", " " * 12), k)
    else:
        loop = _column_loop("ty", "red", element, kind, k)
        lines += _columns(kind, acc_t, "outer * inner", loop, _stores(k, "p", " " * 8), k)
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
    ``ws[chunk * outputs + output]``, each sibling's after the output's:
    ``ws[(j * chunks + chunk) * outputs + output]``) and the fold over chunks (32 outputs
    per block, 8 threads down the chunks), with their parameters. ``narrow``: the
    partials' operand index arithmetic in 32 bits."""
    _, _, inner = reduce_layout(k)
    dnames = [f"s{d}" for d in range(len(k.domain))]
    kind = k.attrs["reduce"]
    acc_t = _acc_dtype(k)
    accs = _names(k)[0]
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

    def chunk_of(j: int) -> str:
        return "cuda.blockIdx.y" if j == 0 else f"({j} * cuda.gridDim.y + cuda.blockIdx.y)"

    if inner == 1:  # a block per (row, chunk)
        store = [" " * 12 + f"ws[{chunk_of(j)} * outer + row] = {a}" for j, a in enumerate(accs)]
        lines += _block_row(kind, acc_t, "lo + tid", "hi", element, store, k)
    else:  # 32 outputs per block, 8 threads down each, over one chunk
        store = [
            " " * 8 + f"ws[{chunk_of(j)} * outer * inner + p] = {a}" for j, a in enumerate(accs)
        ]
        loop = _column_loop("lo + ty", "hi", element, kind, k)
        lines += _columns(kind, acc_t, "outer * inner", loop, store, k)
    fparams = Params(["out", "ws", *_stat_pointers(k)], ["outputs", "chunks", "red"])
    fold = ["        r = ty", "        while r < chunks:"]
    for j, a in enumerate(accs):
        at = "r" if j == 0 else f"({j} * chunks + r)"
        fold.append(f"            {a} = {_combine(kind, a, f'ws[{at} * outputs + p]')}")
    fold.append("            r += 8")
    flines = [
        f"def {fn}_fold({fparams.signature()}):",
        *_columns(kind, acc_t, "outputs", fold, _stores(k, "p", " " * 8), k),
    ]
    return "\n".join(lines), params, "\n".join(flines), fparams
