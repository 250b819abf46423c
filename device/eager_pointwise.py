"""Eager elementwise ops on saturn GPU tensors: saturn's generated loop kernels, no trip
through the host.

An uncompiled optimizer step (``add_``, ``mul_``, ``lerp_``, ``addcmul_``, ``addcdiv_``,
``sqrt``, ``_foreach_*`` through PyTorch's per-tensor path), a gradient accumulated into
an existing ``.grad``, or any eager arithmetic on device tensors runs one loop kernel per
op, built from the operation table's scalar expressions (the ones compiled graphs use)
over the operands' real layouts. What a kernel does not take runs PyTorch's own CPU kernel
on copies and is counted in ``saturn.fallback_counts()`` like any other fallback: other
dtypes, type promotion across operands, operands on different devices, an in-place target
that partly overlaps an operand, and saturn:0 (host memory, where the CPU kernel is the
reference). PyTorch's errors for bad arguments come from that CPU kernel.

Numbers (``alpha``, ``value``, a weight, a Python scalar operand) are read by the kernel
from device memory: one kernel serves every value, so a learning rate that changes every
step compiles nothing. They are converted to the operands' dtype first, as PyTorch's GPU
kernels compute in it.
"""

from __future__ import annotations

import math
import numbers
import threading
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from saturn.codegen import cuda as cg
from saturn.eqsat.kinds import Kind
from saturn.eqsat.program import Kernel, Operand, packed_strides

from .dtypes import DTYPES
from .eager_kernels import byte_span, is_non_overlapping_and_dense
from .eager_registry import impl

_lib = torch.library.Library("aten", "IMPL")

ENABLED = True  # False: every op takes the counted CPU path (for comparisons)

_FLOATS = ("f32", "f64", "f16", "bf16")
_INTS_TOO = (*_FLOATS, "i32", "i64")
_DTYPES = {t: code for t, code in DTYPES.items() if code in _INTS_TOO}  # arithmetic
# What a kernel computes a dtype's values in, and so what a number operand is held in:
# half types in float32, as PyTorch's GPU kernels do (their "opmath" type), so ``alpha``
# or a Python scalar is not rounded to the half type first.
_OPMATH = {torch.float16: torch.float32, torch.bfloat16: torch.float32}
# Copy kernels convert between every dtype of the IR (importer.DTYPES); complex and the
# rest are staged through the host.

In = tuple  # ("in", i): the i-th operand of the kernel


_PARTIAL_OVERLAP = (
    "unsupported operation: some elements of the input tensor and the written-to tensor "
    "refer to a single memory location. Please clone() the tensor before performing the "
    "operation."
)


_INTERNAL_OVERLAP = (
    "unsupported operation: more than one element of the written-to tensor refers to a "
    "single memory location. Please clone() the tensor before performing the operation."
)


class DeclinedError(Exception):
    """The kernel does not take these arguments: PyTorch's CPU kernel runs instead."""


# --- kernels and scalars, cached --------------------------------------------------------

_LOCK = threading.Lock()
_KERNELS: dict[tuple, cg.CudaKernel] = {}
_SCALARS: dict[tuple, torch.Tensor] = {}
_CACHE_LIMIT = 4096
_MISSING = object()


def cached(cache: dict, key, make: Callable, limit: int = _CACHE_LIMIT):
    """``cache[key]``, made by ``make()`` on a miss (outside the lock: building a kernel or a
    library plan takes long; two threads may both build, one result is kept); a full cache
    is emptied first."""
    with _LOCK:
        value = cache.get(key, _MISSING)
    if value is _MISSING:
        value = make()
        with _LOCK:
            if len(cache) >= limit:
                cache.clear()
            cache[key] = value
    return value


def _kernel(body: tuple, dtype: str, operands: list[Operand], domain: tuple) -> cg.CudaKernel:
    def make():
        kern = Kernel(Kind.LOOP, "out", dtype, domain, operands, body=body, domain=domain)
        index = torch.saturn.current_device()
        return cg.CudaKernel(kern, torch.saturn.get_device_capability(index))

    key = (body, dtype, tuple((o.dtype, o.shape, o.indexing) for o in operands), domain)
    return cached(_KERNELS, key, make)


def _scalar(value, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A 0-dim device tensor holding ``value`` converted to ``dtype`` (made by memset, kept
    for the next use of the same value: betas and epsilons repeat every step)."""
    # the sign keeps -0.0 and 0.0 apart; every NaN converts to the same value's class
    sign = math.copysign(1.0, value) if isinstance(value, float) else 0.0
    key = (device, dtype, "nan" if value != value else value, sign)
    # PyTorch's conversion (an out-of-range value raises as fill_ does)
    return cached(_SCALARS, key, lambda: torch.full((), value, dtype=dtype, device=device))


# --- argument checks --------------------------------------------------------------------


def _gpu(t) -> bool:
    return isinstance(t, torch.Tensor) and t.device.type == "saturn" and (t.device.index or 0) >= 1


def _number(v, dtype: str):
    """A number operand as a Python value of the kernel's category, or DeclinedError where
    PyTorch would promote (a float number with an integer tensor) or where it is odd."""
    if isinstance(v, torch.Tensor):
        if v.device.type != "cpu" or v.dim() != 0 or v.dtype not in _DTYPES:
            raise DeclinedError
        v = v.item()
    if isinstance(v, bool) or not isinstance(v, numbers.Real):
        raise DeclinedError
    if dtype not in _FLOATS and not isinstance(v, numbers.Integral):
        raise DeclinedError
    return v


def _overlaps(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether the bytes ``a`` and ``b`` can reach intersect (conservative: spans)."""

    if a.numel() == 0 or b.numel() == 0:
        return False
    (alo, ahi), (blo, bhi) = byte_span(a), byte_span(b)
    return alo < bhi and blo < ahi


def _same_view(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.data_ptr() == b.data_ptr() and a.shape == b.shape and a.stride() == b.stride()


# --- one elementwise op -----------------------------------------------------------------


@dataclass(frozen=True)
class _Plan:
    """What a call's argument signature (op, dtypes, shapes, strides, number kinds) fixes."""

    kernel: cg.CudaKernel | None  # None: nothing to compute (an empty result)
    shape: tuple[int, ...]  # the result's
    out_strides: tuple[int, ...] | None  # an out-of-place result's (None: packed)
    shapes: list  # operands' shapes and strides as launched
    strides: list
    direct: bool  # the kernel writes the result itself (else a packed one, then a copy)
    numbers: tuple[int, ...]  # argument positions read as numbers
    dtype: torch.dtype  # the operands' (numbers are converted from it)
    device: torch.device
    stream: int
    result: torch.dtype  # the result's: the operands' dtype, or bool for a comparison


_PLANS: dict[tuple, _Plan | None] = {}  # None: the signature declines


def run(
    body: tuple,
    args: list,
    allowed: tuple[str, ...],
    inplace: bool,
    result: torch.dtype | None = None,
    conditions: tuple[int, ...] = (),
) -> torch.Tensor:
    """Run ``body`` (leaves ("in", i) over ``args``: device tensors or numbers) as one loop
    kernel; in place writes ``args[0]``. ``result``: the result's dtype when it is not the
    operands' (bool for comparisons); ``conditions``: positions of bool tensors that select
    (``where``'s condition, ``masked_fill``'s mask) beside operands of one other dtype.
    Raises DeclinedError for what the kernel does not take. Everything but addresses and
    numbers' values is worked out once per signature."""
    if not ENABLED:
        raise DeclinedError
    sig: list = [body, inplace, allowed, result, conditions]
    for a in args:
        if not isinstance(a, torch.Tensor):
            sig.append(type(a))
        elif a.device.type == "cpu" and a.dim() == 0:
            sig.append(("number", a.dtype))
        else:
            sig.append((a.device, a.dtype, a.shape, a.stride()))
    if inplace:  # pointer-dependent, and PyTorch checks overlap before shapes
        _check_overlap(args)

    def make() -> _Plan | None:
        try:
            return _plan(body, args, allowed, inplace, result, conditions)
        except DeclinedError:
            return None

    plan = cached(_PLANS, tuple(sig), make)
    if plan is None:
        raise DeclinedError
    operands = list(args)
    opmath = _OPMATH.get(plan.dtype, plan.dtype)
    for i in plan.numbers:
        operands[i] = _scalar(_number(args[i], _DTYPES[plan.dtype]), opmath, plan.device)
    if inplace:
        out = args[0]
    elif plan.out_strides is not None:
        out = torch.empty_strided(
            plan.shape, plan.out_strides, dtype=plan.result, device=plan.device
        )
    else:
        out = torch.empty(plan.shape, dtype=plan.result, device=plan.device)
    if plan.kernel is None:
        return out
    # a strided in-place target with broadcast operands is written through a packed result
    dst = out if plan.direct else torch.empty(plan.shape, dtype=plan.result, device=plan.device)
    with torch.saturn.device(plan.device.index):
        # a dense tensor's data pointer is its lowest address (PyTorch's strides are >= 0)
        ptrs = [t.data_ptr() for t in operands]
        plan.kernel.launch(plan.stream, dst.data_ptr(), ptrs, plan.shapes, plan.strides)
    if dst is not out:
        out.copy_(dst)
    return out


def _check_overlap(args: list) -> None:
    """An in-place target partly overlapping an operand: PyTorch's error where both are
    dense (as its own devices raise), declined (computed on copies) otherwise."""
    target = args[0]
    if not _gpu(target):
        return
    if any(st == 0 and n > 1 for n, st in zip(target.shape, target.stride(), strict=True)):
        raise RuntimeError(_INTERNAL_OVERLAP)  # an expanded target: PyTorch's error
    for t in args[1:]:
        if _gpu(t) and t is not target and _overlaps(target, t) and not _same_view(target, t):
            if is_non_overlapping_and_dense(target) and is_non_overlapping_and_dense(t):
                raise RuntimeError(_PARTIAL_OVERLAP)
            raise DeclinedError


def _plan(
    body: tuple,
    args: list,
    allowed: tuple[str, ...],
    inplace: bool,
    result: torch.dtype | None = None,
    conditions: tuple[int, ...] = (),
) -> _Plan:
    tensors = [
        a
        for a in args
        if isinstance(a, torch.Tensor) and not (a.device.type == "cpu" and a.dim() == 0)
    ]
    if not tensors or not all(_gpu(t) for t in tensors):
        raise DeclinedError
    conds = [args[i] for i in conditions]
    if any(not isinstance(c, torch.Tensor) or c.dtype != torch.bool for c in conds):
        raise DeclinedError
    values = [t for t in tensors if not any(t is c for c in conds)]
    if not values:
        raise DeclinedError
    device = values[0].device
    dtype = values[0].dtype
    code = _DTYPES.get(dtype)
    if code not in allowed or any(t.device != device or t.dtype != dtype for t in values):
        raise DeclinedError
    if any(c.device != device for c in conds):
        raise DeclinedError
    result = result or dtype
    try:
        shape = tuple(torch.broadcast_shapes(*[t.shape for t in tensors if t.dim() > 0]))
    except RuntimeError:
        raise DeclinedError from None
    if inplace and tuple(args[0].shape) != shape:
        raise DeclinedError  # PyTorch's CPU kernel raises its error
    numbers = []
    operands = []  # tensors, and stand-ins with the layout of a number's device tensor
    for i, a in enumerate(args):
        if any(a is t for t in tensors):
            operands.append(a)
        else:
            _number(a, code)  # declines a kind that would promote
            numbers.append(i)
            operands.append(torch.empty((), dtype=_OPMATH.get(dtype, dtype), device="meta"))
    out_strides = None
    if inplace:
        out = args[0]
    else:
        out_strides = _output_strides(operands, shape)
        out = torch.empty_strided(shape, out_strides or packed_strides(shape), device="meta")
    stream = torch.saturn.stream_handle(device.index)
    if math.prod(shape) == 0:
        return _Plan(None, shape, out_strides, [], [], True, (), dtype, device, stream, result)
    out_code = DTYPES[result]
    ops, shapes, strides, domain, direct = layout(out_code, operands, shape, out)
    with torch.saturn.device(device.index):
        k = _kernel(body, out_code, ops, domain)
    return _Plan(
        k,
        shape,
        out_strides,
        shapes,
        strides,
        direct,
        tuple(numbers),
        dtype,
        device,
        stream,
        result,
    )


def _output_strides(operands: list[torch.Tensor], shape) -> tuple[int, ...] | None:
    """An out-of-place result's strides: its full-shape operands' when they all share one
    dense layout (as PyTorch's elementwise results do); None (packed) otherwise."""
    full = [t for t in operands if t.dim() > 0]
    if (
        full
        and all(tuple(t.shape) == tuple(shape) and t.stride() == full[0].stride() for t in full)
        and is_non_overlapping_and_dense(full[0])
    ):
        return tuple(full[0].stride())
    return None


def layout(code: str, operands: list[torch.Tensor], shape, out: torch.Tensor):
    """How the kernel reads its operands: (kernel operands, each with its own dtype, their
    shapes and strides as launched, the iteration domain, whether ``out`` is written
    directly). Operands sharing ``out``'s dense layout are read as one flat range ("same":
    vector accesses); anything broadcast or laid out differently through strides, into a
    packed output. (``code`` is the result's dtype, which the operands' may differ from.)"""
    n = math.prod(shape)
    full = [t for t in operands if t.dim() > 0]
    flat = is_non_overlapping_and_dense(out) and all(
        tuple(t.shape) == tuple(shape) and t.stride() == out.stride() for t in full
    )
    ops, shapes, strides = [], [], []
    for i, t in enumerate(operands):
        kind = DTYPES[t.dtype]
        if t.dim() == 0:
            ops.append(Operand(f"in{i}", kind, (), "scalar"))
            shapes.append(())
            strides.append(())
        elif flat:
            ops.append(Operand(f"in{i}", kind, (n,), "same"))
            shapes.append((n,))
            strides.append((1,))
        else:
            ops.append(Operand(f"in{i}", kind, tuple(t.shape), "strided"))
            shapes.append(tuple(t.shape))
            strides.append(tuple(t.stride()))
    domain = (n,) if flat else tuple(shape)
    return ops, shapes, strides, domain, flat or out.is_contiguous()


# --- registrations ----------------------------------------------------------------------


def _cpu(name: str, op, args: tuple, kwargs: dict, inplace: bool):
    """PyTorch's CPU kernel on copies, results copied back (the counted fallback's
    semantics and errors)."""
    tensors = [v for v in (*args, *kwargs.values()) if isinstance(v, torch.Tensor)]
    device = next(t.device for t in tensors if t.device.type == "saturn")
    other = next((t.device for t in tensors if t.device != device and t.dim() > 0), None)
    if other is not None:  # a CPU number may mix in; a CPU tensor may not
        raise RuntimeError(
            "Expected all tensors to be on the same device, but found at least two devices, "
            f"{device} and {other}!"
        )
    torch.ops.saturn_rt.count_fallback(f"aten::{name}")  # the C++ fallback's key

    def host(v):
        return v.cpu() if isinstance(v, torch.Tensor) and v.device.type == "saturn" else v

    res = op(*[host(a) for a in args], **{k: host(v) for k, v in kwargs.items()})
    if inplace:
        return args[0].copy_(res)
    if isinstance(res, tuple):  # several results, some possibly not computed (None)
        return tuple(r.to(device) if isinstance(r, torch.Tensor) else r for r in res)
    return res.to(device)  # where the op's saturn operand is (self may be a CPU number)


def _register(
    name: str,
    build: Callable,
    allowed: tuple[str, ...],
    inplace: bool,
    result: torch.dtype | None = None,
    conditions: tuple[int, ...] = (),
) -> None:
    """``build(*args, **kwargs)`` -> (body, kernel operands) for aten ``name``."""
    packet, _, overload = name.partition(".")
    op = getattr(getattr(torch.ops.aten, packet), overload or "default")

    def kernel(*args, **kwargs):
        try:
            body, operands = build(*args, **kwargs)
            return run(body, operands, allowed, inplace, result, conditions)
        except DeclinedError:
            return _cpu(name, op, args, kwargs, inplace)

    impl(_lib, name, kernel)


def _x(i: int) -> In:
    return ("in", i)


def _binary(node: str, with_alpha: bool = False):
    def build(a, b, alpha=1):
        if with_alpha and not (isinstance(alpha, numbers.Real) and alpha == 1):
            return (node, _x(0), ("mul", _x(2), _x(1))), [a, b, alpha]
        return (node, _x(0), _x(1)), [a, b]

    return build


def _unary(node: str):
    def build(a):
        return (node, _x(0)), [a]

    return build


def _addc(node: str):
    def build(a, t1, t2, value=1):
        if isinstance(value, numbers.Real) and value == 1:
            return ("add", _x(0), (node, _x(1), _x(2))), [a, t1, t2]
        if node == "mul":  # PyTorch: self + value * t1 * t2
            return ("add", _x(0), ("mul", ("mul", _x(3), _x(1)), _x(2))), [a, t1, t2, value]
        return ("add", _x(0), ("mul", _x(3), ("div", _x(1), _x(2)))), [a, t1, t2, value]

    return build


def _lerp(a, end, weight):
    """PyTorch's lerp: ``a + w (end - a)`` for |w| < 0.5, else ``end - (end - a)(1 - w)``
    (exact at both ends); the branch is the number's, chosen here."""
    w = _number(weight, "f32")
    if abs(w) < 0.5:
        return ("add", _x(0), ("mul", _x(2), ("sub", _x(1), _x(0)))), [a, end, w]
    # 1 - w in the kernel's compute dtype (float32 for float32 and the half types)
    one_minus = 1.0 - w if a.dtype == torch.float64 else float(np.float32(1.0) - np.float32(w))
    return ("sub", _x(1), ("mul", ("sub", _x(1), _x(0)), _x(2))), [a, end, one_minus]


for _name, _node, _alpha, _allowed in (
    ("add", "add", True, _INTS_TOO),
    ("sub", "sub", True, _INTS_TOO),
    ("mul", "mul", False, _INTS_TOO),
    ("div", "div", False, _FLOATS),
):
    for _suffix, _inplace in (("", False), ("_", True)):
        _register(f"{_name}{_suffix}.Tensor", _binary(_node, _alpha), _allowed, _inplace)
        _register(f"{_name}{_suffix}.Scalar", _binary(_node, _alpha), _allowed, _inplace)

for _name, _allowed in (("maximum", _INTS_TOO), ("minimum", _INTS_TOO)):
    _register(_name, _binary(_name), _allowed, False)

for _name, _allowed in (
    ("neg", _INTS_TOO),
    ("abs", _INTS_TOO),
    ("relu", _INTS_TOO),
    ("exp", _FLOATS),
    ("log", _FLOATS),
    ("sqrt", _FLOATS),
    ("rsqrt", _FLOATS),
    ("reciprocal", _FLOATS),
    ("tanh", _FLOATS),
    ("sigmoid", _FLOATS),
):
    _register(_name, _unary(_name), _allowed, False)
    _register(f"{_name}_", _unary(_name), _allowed, True)

for _name, _node in (("addcmul", "mul"), ("addcdiv", "div")):
    _register(_name, _addc(_node), _FLOATS, False)
    _register(f"{_name}_", _addc(_node), _FLOATS, True)

_register("lerp.Scalar", _lerp, _FLOATS, False)
_register("lerp_.Scalar", _lerp, _FLOATS, True)

# comparisons: bool results; a number compares in the operands' compute dtype (float32 for
# the half types), as PyTorch's GPU comparison kernels do
for _name in ("gt", "lt", "ge", "le", "eq", "ne"):
    for _overload in ("Tensor", "Scalar"):
        _register(f"{_name}.{_overload}", _binary(_name), _INTS_TOO, False, torch.bool)


def _where(cond, a, b):
    return ("where", _x(0), _x(1), _x(2)), [cond, a, b]


def _masked_fill(a, mask, value):
    """``a`` where ``mask`` is false, ``value`` (converted to ``a``'s dtype at the store)
    where it is true."""
    return ("where", _x(1), _x(2), _x(0)), [a, mask, value]


_register("where.self", _where, _INTS_TOO, False, conditions=(0,))
_register("masked_fill_.Scalar", _masked_fill, _INTS_TOO, True, conditions=(1,))


# --- copies between dtypes and layouts on one GPU ----------------------------------------

_COPY_PLANS: dict[tuple, tuple | None] = {}  # signature -> (kernel, shapes, strides) | None
DEVICE_COPIES = 0  # copies device_copy ran (a kernel, no trip through the host)


def device_copy(src: torch.Tensor, dst: torch.Tensor) -> bool:
    """``dst.copy_(src)`` on one GPU without the host (``src`` already has ``dst``'s shape):
    a dtype conversion as one loop kernel, read flat where both share one dense layout and
    through ``src``'s strides into a packed ``dst`` otherwise; a same-dtype gather into a
    packed ``dst`` as the strided byte copy. Conversions are C++'s (PyTorch's): floats to
    integers truncate, to bool test for nonzero (NaN is true), to a half type round to
    nearest even. False where it does not apply: a strided destination, overlapping
    operands, a dtype without a kernel (the caller stages through the host)."""
    if not ENABLED or src.dtype not in DTYPES or dst.dtype not in DTYPES:
        return False
    if dst.numel() == 0 or _overlaps(src, dst):
        return False
    if src.dtype == dst.dtype:
        if not dst.is_contiguous() or dst.dim() > 8:
            return False
        from .eager_kernels import strided_copy

        strided_copy(src, dst)  # bytes moved as they are (NaN payloads kept)
        _counted()
        return True
    key = (src.dtype, dst.dtype, src.shape, src.stride(), dst.stride(), dst.device)
    plan = cached(_COPY_PLANS, key, lambda: _copy_plan(src, dst))
    if plan is None:
        return False
    kernel, shapes, strides = plan
    index = dst.device.index
    with torch.saturn.device(index):
        stream = torch.saturn.stream_handle(index)
        kernel.launch(stream, dst.data_ptr(), [src.data_ptr()], shapes, strides)
    _counted()
    return True


def _counted() -> None:
    global DEVICE_COPIES
    with _LOCK:
        DEVICE_COPIES += 1


def _copy_plan(src: torch.Tensor, dst: torch.Tensor) -> tuple | None:
    flat = is_non_overlapping_and_dense(dst) and src.stride() == dst.stride()
    if not flat and not dst.is_contiguous():
        return None  # a strided destination: staged
    code = DTYPES[dst.dtype]
    ops, shapes, strides, domain, _ = layout(code, [src], tuple(dst.shape), dst)
    with torch.saturn.device(dst.device.index):
        k = _kernel(("cast", _x(0), code), code, ops, domain)
    return k, shapes, strides


_rt_lib = torch.library.Library("saturn_rt", "IMPL")  # kept: a dropped Library unregisters
impl(_rt_lib, "device_copy", device_copy)
