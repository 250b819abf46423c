"""Eager reductions on saturn GPU tensors: ``sum``, ``mean``, ``amax`` and ``amin`` over
any set of axes run saturn's reduction kernels (the ones compiled graphs use: a warp or a
block per row, 32 columns per block, split into partials and a fold when too few outputs
would fill the device) instead of the CPU fallback. A loss's mean, a bias gradient's sum
and a softmax's max in uncompiled code stay on the device.

The input is read as it lies. A dense input is presented to the kernel in its memory order
(axes by decreasing stride), so a row-major matrix summed over its rows is a column
reduction reading whole rows, not a strided walk; when the reduced axes are adjacent in
that order the input is read as packed. Otherwise the reduced axes are moved last and the
input read through its strides. The result holds the kept axes in their order (a view of
the kernel's packed output where the memory order differs). Accumulation is in the
dtype (float32 stays float32, as PyTorch's GPU kernels do); float16 and bfloat16 are read
into a float32 accumulator and the result rounded once to their type at the store, as
PyTorch accumulates them. ``amax``/``amin`` propagate NaN.

Declined (PyTorch's CPU kernel on copies, counted in ``saturn.fallback_counts()``): integer
and bool dtypes, a ``dtype=`` argument, empty reductions or results, axes
PyTorch rejects (its CPU kernel raises its error), and saturn:0.
"""

from __future__ import annotations

import torch

from saturn.codegen import cuda as cg
from saturn.eqsat.kinds import Kind
from saturn.eqsat.optable import HALVES
from saturn.eqsat.program import Kernel, Operand, packed_strides

from .dtypes import DTYPES
from .eager_pointwise import DeclinedError, _cpu, _gpu, cached, is_non_overlapping_and_dense
from .eager_registry import impl

_lib = torch.library.Library("aten", "IMPL")
_DTYPES = {t: DTYPES[t] for t in (torch.float32, torch.float64, torch.float16, torch.bfloat16)}
_PLANS: dict[tuple, tuple | None] = {}
REDUCTIONS = 0  # reductions run as saturn kernels


def _axes(x: torch.Tensor, dim) -> tuple[int, ...]:
    """The reduced axes, normalized; all of them for None or []."""
    if dim is None or (isinstance(dim, list | tuple) and len(dim) == 0):
        return tuple(range(x.dim()))
    dims = [dim] if isinstance(dim, int) else list(dim)
    n = max(x.dim(), 1)
    if any(not -n <= d < n for d in dims):
        raise DeclinedError  # PyTorch's error
    out = tuple(sorted({d % n for d in dims}))
    if len(out) != len(dims):
        raise DeclinedError  # a repeated axis: PyTorch's error
    return out if x.dim() else ()


def _domain(x: torch.Tensor, dims: tuple[int, ...]):
    """(axis order, reduced positions in it, indexing): the memory order when dense and the
    reduced axes are adjacent there (read packed), else the kept axes then the reduced."""
    axes = list(range(x.dim()))
    if is_non_overlapping_and_dense(x):
        order = sorted(axes, key=lambda a: (-x.stride(a) if x.shape[a] > 1 else 0, a))
        pos = sorted(order.index(d) for d in dims)
        expected = packed_strides(tuple(x.shape[a] for a in order))
        # packed in that order (a size-1 axis's stride is never used)
        packed = all(
            x.stride(a) == e or x.shape[a] == 1 for a, e in zip(order, expected, strict=True)
        )
        if pos == list(range(pos[0], pos[0] + len(pos))) and packed:
            return order, tuple(pos), "same"
    order = [a for a in axes if a not in dims] + list(dims)
    k = len(dims)
    return order, tuple(range(len(axes) - k, len(axes))), "strided"


def _compile(k: Kernel, index: int) -> cg.CudaKernel:
    with torch.saturn.device(index):
        return cg.CudaKernel(k, torch.saturn.get_device_capability(index))


def _plan(kind: str, x: torch.Tensor, dims: tuple[int, ...]):
    order, pos, indexing = _domain(x, dims)
    domain = tuple(x.shape[a] for a in order)
    strides = tuple(x.stride(a) for a in order)
    kept = [a for a in order if a not in dims]  # the output's axes, in kernel order
    out_shape = tuple(x.shape[a] for a in kept)
    code = _DTYPES[x.dtype]
    op = Operand("in0", code, domain, indexing)
    half = code in HALVES  # a float32 accumulator, the result rounded once at the store
    k = Kernel(
        Kind.REDUCE,
        "out",
        code,
        out_shape,
        [op],
        ("cast", ("in", 0), "f32") if half else ("in", 0),
        domain,
        {"reduce": kind, "dims": pos, "keepdim": False, **({"acc_dtype": "f32"} if half else {})},
        epilogue=("cast", ("in", 0), code) if half else None,
    )
    kernel = _compile(k, x.device.index)
    launch_strides = packed_strides(domain) if indexing == "same" else strides
    return kernel, domain, launch_strides, kept, out_shape


def reduce(kind: str, x: torch.Tensor, dim, keepdim: bool) -> torch.Tensor:
    """``kind`` (sum, mean, max, min) of ``x`` over ``dim`` as one saturn kernel."""
    global REDUCTIONS
    if not _gpu(x) or x.dtype not in _DTYPES:
        raise DeclinedError
    dims = _axes(x, dim)
    if x.numel() == 0 or not dims:
        raise DeclinedError
    key = (kind, x.dtype, x.device, x.shape, x.stride(), dims)
    plan = cached(_PLANS, key, lambda: _plan(kind, x, dims))
    kernel, domain, strides, kept, out_shape = plan
    out = torch.empty(out_shape, dtype=x.dtype, device=x.device)
    index = x.device.index
    held = []

    def workspace(nbytes: int) -> int:
        held.append(torch.empty(nbytes, dtype=torch.uint8, device=x.device))
        return held[-1].data_ptr()

    with torch.saturn.device(index):
        stream = torch.saturn.stream_handle(index)
        kernel.launch(stream, out.data_ptr(), [x.data_ptr()], [domain], [strides], workspace)
    REDUCTIONS += 1
    # the kept axes in their own order (a view where the kernel's order differs)
    result = out.permute([kept.index(a) for a in sorted(kept)]) if kept else out
    if keepdim:
        for d in dims:
            result = result.unsqueeze(d)
    return result


def _register(name: str, kind: str, op, defaults: dict) -> None:
    def kernel(x, *args, **kwargs):
        params = dict(defaults)
        params.update(zip(list(defaults), args, strict=False))
        params.update(kwargs)
        try:
            if params.pop("dtype", None) not in (None, x.dtype):
                raise DeclinedError
            return reduce(kind, x, params.get("dim"), bool(params.get("keepdim", False)))
        except DeclinedError:
            return _cpu(name, op, (x, *args), kwargs, False)

    impl(_lib, name, kernel)


_DIM = {"dim": None, "keepdim": False, "dtype": None}
_register("sum.dim_IntList", "sum", torch.ops.aten.sum.dim_IntList, _DIM)
_register("sum", "sum", torch.ops.aten.sum.default, {"dtype": None})
_register("mean.dim", "mean", torch.ops.aten.mean.dim, _DIM)
_register("mean", "mean", torch.ops.aten.mean.default, {"dtype": None})
_register("amax", "max", torch.ops.aten.amax.default, {"dim": (), "keepdim": False})
_register("amin", "min", torch.ops.aten.amin.default, {"dim": (), "keepdim": False})
