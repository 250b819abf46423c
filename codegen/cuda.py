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

This module generates and launches a kernel of any kind (``generate``, ``CudaKernel``) and
emits loops; operand reads are in ``cuda_reads``, reductions in ``cuda_reduce``, rows
kernels in ``cuda_rows``, data movement in ``movement`` and ``movement_launch``.
"""

from __future__ import annotations

import hashlib
import logging
import math

import numpy as np

from saturn.eqsat.kinds import Kind
from saturn.eqsat.program import Kernel

from . import cuda_rows
from .concat import (  # noqa: F401 (read through this module)
    concat_pieces,
    concat_source,
    generate_concat,
    generate_row_concat,
    row_concat_arguments,
    row_concat_source,
)
from .cubins import (  # noqa: F401 (entry_name, precompile, ...: this module's interface)
    KernelError,
    build,
    entry_name,
    precompile,
    ptx,
    python_function,
    signature,
)
from .cuda_group import group_sizes, group_source, is_group
from .cuda_load import core_stream, grid_for, load
from .cuda_reads import (
    HALVES,
    MEMORY_SIZE,
    ROUNDING_TARGET,
    _acc_dtype,
    _loop_vector_step,
    _operand_reads,
    _row_trailing,
    _store,
    compute_dtype,
    half_helpers,
    index_arithmetic,
    narrow_head,
    stored_body,
    strided_vectors_fit,
    vector_lanes,
)
from .cuda_reduce import reduce_layout, reduce_source, split_plan, split_sources
from .cuda_rows import rows_lanes, rows_source, rows_style, rows_threads
from .expr import BodyWriter, helpers
from .generated import MEMORY_TYPE, THREADS, Generated, Params
from .lane_body import DEVICE_FN, LaneBodies
from .movement import (  # noqa: F401 (copy_source, ...: read through this module)
    COPY_TYPES,
    INDEX32,
    INDEX_TYPES,
    ROW_LANES,
    VECTOR_IMPORT,
    _uint32,
    broadcast_of_one,
    copy_source,
    fastest_axis,
    fill_source,
    fill_vectors,
    fits_narrow,
    generate_copy,
    generate_fill,
    generate_row_copy,
    generate_tiled_copy,
    narrow_copies,
    row_copy_fits,
    row_copy_source,
    tiled_copy_source,
    tiled_grid,
)
from .pad import generate_pad, pad_source  # noqa: F401
from .scatter_add import SCATTER_DTYPES, generate_scatter_add, scatter_add_source  # noqa: F401
from .take import generate_take, take_geometry, take_lanes, take_source  # noqa: F401

log = logging.getLogger("saturn")


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
        lane = LaneBodies(fn)
        lines += _loop_vector_step(k, lanes, rank, dnames, ind, narrow, lane)
        lines += [f"{ind}i += step", f"    i = nv * {lanes} + cuda.grid(1)"]
        # the scalar tail calls the lanes' function too
        result, _ = lane.call(
            stored_body(k.body, k.dtype),
            lambda i: compute_dtype(k.inputs[i].dtype),
            "in{}_v".format,
        )
        tail = [f"{ind}res = {result}"]
        result = "res"
    else:
        body = BodyWriter(lambda i: f"in{i}_v", lambda i: compute_dtype(k.inputs[i].dtype))
        result, _ = body.emit(stored_body(k.body, k.dtype))
        tail = [ind + ln for ln in body.lines]
    lines.append("    while i < n:")
    lines += reads + tail
    lines.append(ind + _store(k, "i", result))
    lines.append(f"{ind}i += step")
    defs = lane.source() if lanes > 1 else ""
    return defs + "\n".join(lines), params


# Generated kernels by structure: a model's repeated layers hold the same kernels under
# other value names (a 250-block transformer: 1,676 kernels, 142 sources), generated once.
_GENERATED: dict[str, Generated] = {}
_GENERATED_MAX = 4096


def structure(k: Kernel) -> str:
    """Everything of ``k`` the emitters read: all but the names of its values and of the
    graph nodes it covers (the same text for the same kernel in another layer)."""
    inputs = [(o.dtype, o.shape, o.indexing) for o in k.inputs]
    attrs = sorted(k.attrs.items())
    return repr((k.kind, k.dtype, k.shape, inputs, k.body, k.domain, attrs, k.epilogue, k.stages))


def generate(k: Kernel, lanes: int | None = None, narrow: bool = False) -> Generated:
    """The kernel for ``k``; loops use ``lanes``-wide vector accesses (default: as wide as
    the operands allow), reductions ignore it; ``narrow`` loops and reductions divide
    their index (strided and broadcast operands) in 32-bit arithmetic. Made once per
    structure (``structure``) and reused; treat the result as read-only."""
    # the rows emitter's tunables too (the simulator's tests and bench/cuda_sources.py set them)
    tunables = (
        cuda_rows.ROWS_WARP_MIN,
        cuda_rows.ROW_REGISTERS,
        cuda_rows.ROW_CACHE_BYTES,
        cuda_rows.ROW_SEGMENT_STEPS,
        cuda_rows.ROW_SEGMENT_KEEP,
        cuda_rows.ROW_SEGMENT_MAX,
    )
    key = f"{structure(k)}|{lanes}|{narrow}|{tunables}"
    g = _GENERATED.get(key)
    if g is None:
        g = _generate(k, lanes, narrow)
        if len(_GENERATED) >= _GENERATED_MAX:
            _GENERATED.pop(next(iter(_GENERATED)))  # the oldest: a bound, not a policy
        _GENERATED[key] = g
    return g


def _generate(k: Kernel, lanes: int | None, narrow: bool) -> Generated:
    if is_group(k):  # scalar accesses, one loop after another
        lanes = 1
    if lanes is None:
        lanes = {"loop": vector_lanes, "rows": rows_lanes}.get(k.kind, lambda k: 1)(k)
    fn = f"{k.kind}_{_ops_named(k)}{_digest(k, lanes, narrow)}"
    stats = [t for _, t in k.attrs.get("stats", ())]  # values written beside the output
    dtypes = [k.dtype, *(o.dtype for o in k.inputs), *stats]
    bad = [d for d in dtypes if d not in MEMORY_TYPE]
    if bad:
        raise KernelError(f"the CUDA emitter has no kernels for dtype {bad[0]}")
    _refuse_halves(k)
    halves = any(d in HALVES for d in dtypes) or _casts_to_half(k)
    if k.kind == Kind.LOOP and is_group(k):
        body, params = group_source(k, fn)
        style = "loop-group"
    elif k.kind == Kind.LOOP:
        body, params = loop_source(k, fn, lanes, narrow)
        style = "loop"
    elif k.kind == Kind.REDUCE:
        body, params, style = reduce_source(k, fn, narrow)
        lanes = 1
    elif k.kind == Kind.ROWS:
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
    ptypes += [MEMORY_TYPE[t] for t in stats]
    width = rows_threads(k, lanes) if k.kind == Kind.ROWS else 32
    threads = width if style == "rows-block" else THREADS
    if lanes == 1:
        return Generated(fn, src, params, ptypes, style, threads=threads, row_threads=width)
    dtypes = [k.dtype, *(o.dtype for o in k.inputs)]
    vectors = ("same", "strided", "table")
    packed = (
        0,
        *(1 + i for i, o in enumerate(k.inputs) if o.indexing in vectors or _row_trailing(k, i)),
    )
    aligned = tuple((p, lanes * MEMORY_SIZE[dtypes[p]]) for p in packed)
    return Generated(
        fn, src, params, ptypes, style, lanes, threads=threads, aligned=aligned, row_threads=width
    )


NAMED_OPS = 4  # most operation names a kernel's name lists
_UNNAMED = {"in", "const", "stage", "cast"}  # operands, constants and conversions


def _ops_named(k: Kernel) -> str:
    """What a kernel computes, for its name in profiles: a reduction's kind (a rows
    kernel's stage reductions), then the distinct operations of its stages, body and
    epilogue in order of first appearance (up to ``NAMED_OPS``, then ``etc``), each
    followed by ``_``: ``loop_add_relu_<digest>``, ``rows_max_sum_add_exp_<digest>``."""
    names: list[str] = [k.attrs["reduce"]] if k.kind == Kind.REDUCE else []
    stages = list(k.stages or ()) if k.kind == Kind.ROWS else []
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
    attrs, rank = k.attrs, len(k.domain)
    if "segments" in attrs:  # a loop group reads flat: its domains are launch sizes only
        attrs, rank = {**attrs, "segments": len(attrs["segments"])}, 0
    key = (k.kind, k.body, k.epilogue, k.stages, rank, k.dtype, attrs, *extra)
    return hashlib.sha256(
        repr((*key, [(o.dtype, o.indexing) for o in k.inputs])).encode()
    ).hexdigest()[:12]


def _refuse_halves(k: Kernel) -> None:
    """Loops and rows kernels take half operands and outputs (read into float32, rounded
    at the store); a reduction too, accumulating in float32 or float64 (a rows kernel's
    stages always do: ``ROW_FLOATS``). A reduction accumulating in a half type is not
    built."""
    if k.kind == Kind.REDUCE and _acc_dtype(k) in HALVES:
        raise KernelError(f"a reduction accumulating in {_acc_dtype(k)} is not built")


def _casts_to_half(k: Kernel) -> bool:
    """Whether any expression of ``k`` rounds a value to a half type (its helpers needed)."""

    def walk(e) -> bool:
        if not isinstance(e, tuple) or not e:
            return False
        if e[0] == "cast" and e[2] in HALVES:
            return True
        return any(walk(c) for c in e[1:] if isinstance(c, tuple))

    exprs = [k.body, k.epilogue, *(e for e, _ in k.attrs.get("stats", ()))]
    for st in k.stages:
        exprs += [st.body, st.epilogue]
    return any(walk(e) for e in exprs if e is not None)


def _half_head(needed: bool) -> str:
    if not needed:
        return ""
    return "\nfrom saturn.codegen.halfbits import bits_f32, f32_bf16\n" + half_helpers(DEVICE_FN)


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
        Generated(
            f"{fn}_fold",
            head + fold + "\n",
            fparams,
            [ptr[k.dtype], acc, *(ptr[t] for _, t in k.attrs.get("stats", ()))],
            "split-fold",
        ),
    )


def size_args(
    g: Generated, k: Kernel, shapes: list[tuple[int, ...]], strides: list[tuple[int, ...]]
) -> dict[str, int]:
    """The int64 parameters of a launch, from the operands' actual shapes and strides
    (in elements). Raises when an operand does not fit what the kernel was built for."""
    domain = tuple(k.domain)
    vals: dict[str, int] = {f"s{d}": s for d, s in enumerate(domain)}
    if k.kind == Kind.LOOP:
        vals["n"] = math.prod(domain)
        if is_group(k):  # the loops beside it
            vals.update(group_sizes(k))
    elif k.kind == Kind.ROWS:
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
        if k.kind == Kind.REDUCE:
            chunks, chunk = split_plan(k, sm_count)
            if chunks > 1:
                self.split = (chunks, chunk, *generate_split(k))
        self._variants: dict[tuple[int, bool], tuple[Generated, object]] = {}
        self._indexed = k.kind in (Kind.LOOP, Kind.REDUCE) and index_arithmetic(k)
        self._strided = any(o.indexing == "strided" for o in k.inputs)
        self.takes = "take" in k.attrs  # a fused take: an error word after the operands
        # values written beside the output after that (kinds/row_stat.py): a rows kernel's
        # statistics, a reduction's siblings
        self.stats = len(k.attrs.get("stats", ()))
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
        stat_ptrs: tuple[int, ...] = (),
    ) -> None:
        """Launch on ``stream``. ``workspace(nbytes)`` gives the address of device memory
        the kernel may use for the launch (a split reduction's partials), the same memory
        at every call for a graph that replays. ``err_ptr``: the error word a rows kernel
        with a fused take sets on an index out of range. ``stat_ptrs``: where a kernel
        writes the values beside its output (``kinds/row_stat.py``), one per value."""
        from cuda.core import launch

        if len(stat_ptrs) != self.stats:
            raise KernelError(
                f"a kernel writing {self.stats} values beside its output "
                f"was given {len(stat_ptrs)} places for them"
            )
        if self.split is not None:
            if workspace is None:
                raise KernelError("a split reduction needs a workspace")
            self._launch_split(stream, out_ptr, in_ptrs, shapes, strides, workspace, stat_ptrs)
            return
        ptrs = [out_ptr, *in_ptrs]
        if self.takes:
            if err_ptr is None:
                raise KernelError("a rows kernel with a fused take needs an error word")
            ptrs.append(err_ptr)
        ptrs += stat_ptrs
        key = (tuple(map(tuple, shapes)), tuple(map(tuple, strides)))
        g, kernel = self.variant(ptrs, key=key)
        config, ints = self.plan(shapes, strides, g, key)
        launch(core_stream(stream), config, kernel, *[np.uint64(p) for p in ptrs], *ints)

    def workspace_bytes(self) -> int:
        """Device memory a launch needs besides its operands."""
        if self.split is None:
            return 0
        outer, _, inner = reduce_layout(self.k)
        accumulators = 1 + self.stats  # a reduction's siblings after its own partials
        return accumulators * self.split[0] * outer * inner * MEMORY_SIZE[_acc_dtype(self.k)]

    def _launch_split(
        self, stream, out_ptr, in_ptrs, shapes, strides, workspace, stat_ptrs=()
    ) -> None:
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
        stats = [np.uint64(q) for q in stat_ptrs]
        launch(s, fconf, fk, np.uint64(out_ptr), ws, *stats, *fints)


# the movement kernels' launchers, read through this module as before they had their own
from .concat import ConcatKernel, concat_arguments  # noqa: E402, F401
from .movement_launch import CopyKernel  # noqa: E402, F401
