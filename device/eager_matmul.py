"""Eager matrix multiplies on saturn GPU tensors through cuBLASLt (``codegen.cublaslt.LtPlan``:
its C API through nvmath-python's bindings, with raw pointers), instead of the CPU fallback.

``mm``, ``bmm`` and ``addmm`` are registered for the device, and so is everything PyTorch
builds from them: ``matmul``, ``nn.Linear`` (``addmm`` for a 2-D input, ``matmul`` and an
add otherwise), and their backward passes (products of transposed views). Operands are
used as laid out (transposes read from strides). A plan is made, and cuBLASLt's candidates
timed, once per signature: dtype, device, shapes, strides, and each pointer's alignment
(a plan chosen for aligned operands may use vector loads a view at an odd offset breaks);
a call rebinds the pointers and runs on the device's stream.

``addmm`` with ``beta = alpha = 1`` and a bias per output feature runs cuBLASLt's bias
epilogue (one library call); other ``alpha``/``beta`` or a 2-D input to add are the product
followed by saturn's eager elementwise kernels (``beta = 0`` ignores the input, NaN
included, as PyTorch does). float32 computes in float32 (no TF32, as PyTorch's default).
float16 and bfloat16 are read in their type and accumulated in float32, the result (bias
included) rounded once, as PyTorch's GPU products; their ``addmm`` with other
``alpha``/``beta`` or a 2-D input falls back, since scaling a rounded product would round
twice.

What is not taken (other dtypes, operands on different devices, empty products, a layout
the library refuses even packed) runs PyTorch's CPU kernel on copies and is counted in
``saturn.fallback_counts()`` as any fallback, so are all calls on saturn:0.
"""

from __future__ import annotations

import math
import threading

import torch

from .dtypes import DTYPES
from .eager_pointwise import DeclinedError, _cpu, _gpu, cached
from .eager_registry import impl

_lib = torch.library.Library("aten", "IMPL")

_DTYPES = {t: DTYPES[t] for t in (torch.float32, torch.float64, torch.float16, torch.bfloat16)}
_HALVES = (torch.float16, torch.bfloat16)
_WORKSPACES: dict[int, torch.Tensor] = {}  # device index -> the plans' shared workspace
_LOCK = threading.Lock()
_PLANS: dict[tuple, object] = {}  # signature -> LtPlan, or None where the library refused
_CACHE_LIMIT = 256
GEMMS = 0  # products run through a library plan


def _alignment(t: torch.Tensor) -> int:
    """The largest power of two (up to 256, cuBLASLt's largest) dividing the address."""
    return math.gcd(t.data_ptr(), 256)


def _layout(t: torch.Tensor):
    from saturn.codegen.gemm import Layout

    return Layout(_DTYPES[t.dtype], tuple(t.shape), tuple(t.stride()))


def _workspace(index: int) -> tuple[int, int]:
    """One cuBLASLt workspace per GPU: the plans run one at a time on the device's stream
    (under ``_LOCK``), so they can share it."""
    from saturn.codegen.cublaslt import WORKSPACE_BYTES

    if index not in _WORKSPACES:
        _WORKSPACES[index] = torch.empty(
            WORKSPACE_BYTES, dtype=torch.uint8, device=torch.device("saturn", index)
        )
    return _WORKSPACES[index].data_ptr(), WORKSPACE_BYTES


def _plan(key: tuple, operands: list[torch.Tensor], out: torch.Tensor, epilogue: str):
    from saturn.codegen.cublaslt import LtPlan
    from saturn.codegen.gemm import GemmError

    def make():
        a, b, *bias = operands
        ptrs = (a.data_ptr(), b.data_ptr(), out.data_ptr(), *(t.data_ptr() for t in bias))
        try:
            return LtPlan(
                _layout(a),
                _layout(b),
                _layout(out),
                epilogue,
                _layout(bias[0]) if bias else None,
                ptrs,
                torch.saturn.stream_handle(out.device.index),
                _workspace(out.device.index),
            )
        except GemmError:
            return None

    return cached(_PLANS, key, make, _CACHE_LIMIT)


def _product(a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None = None):
    """``a @ b`` (+ ``bias`` per output feature) for 2-D or batched 3-D operands, on the
    operands' GPU; raises DeclinedError for what the library plan does not take."""
    global GEMMS
    if not (_gpu(a) and _gpu(b)) or a.device != b.device or a.dtype != b.dtype:
        raise DeclinedError
    if a.dtype not in _DTYPES:
        raise DeclinedError
    if bias is not None and (bias.device, bias.dtype) != (a.device, a.dtype):
        raise DeclinedError
    if a.dim() != b.dim() or a.dim() not in (2, 3) or a.shape[-1] != b.shape[-2]:
        raise DeclinedError  # PyTorch's CPU kernel raises its error
    if a.dim() == 3 and a.shape[0] != b.shape[0]:
        raise DeclinedError
    shape = (*a.shape[:-1], b.shape[-1])
    if 0 in shape or a.shape[-1] == 0:
        raise DeclinedError
    operands = [a, b] if bias is None else [a, b, bias]
    out = torch.empty(shape, dtype=a.dtype, device=a.device)
    key = (
        a.dtype,
        a.device,
        *((t.shape, t.stride(), _alignment(t)) for t in operands),
        _alignment(out),
        bias is not None,
    )
    with torch.saturn.device(a.device.index):
        plan = _plan(key, operands, out, "none" if bias is None else "bias")
        if plan is None:
            raise DeclinedError
        ptrs = (a.data_ptr(), b.data_ptr(), out.data_ptr(), *(t.data_ptr() for t in operands[2:]))
        with _LOCK:  # a plan's operands are rebound per call: one call at a time
            plan.run(ptrs)
            GEMMS += 1
    return out


def _packed_retry(a: torch.Tensor, b: torch.Tensor, bias=None):
    """The product as laid out; if the library refuses that layout, of packed copies."""
    try:
        return _product(a, b, bias)
    except DeclinedError:
        if _gpu(a) and _gpu(b) and not (a.is_contiguous() and b.is_contiguous()):
            return _product(a.contiguous(), b.contiguous(), bias)
        raise


def mm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    try:
        return _packed_retry(a, b)
    except DeclinedError:
        return _cpu("mm", torch.ops.aten.mm.default, (a, b), {}, False)


def bmm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    try:
        return _packed_retry(a, b)
    except DeclinedError:
        return _cpu("bmm", torch.ops.aten.bmm.default, (a, b), {}, False)


def addmm(bias: torch.Tensor, a: torch.Tensor, b: torch.Tensor, *, beta=1, alpha=1):
    try:
        feature = (
            _gpu(bias)
            and bias.dim() == 1
            and a.dim() == 2
            and b.dim() == 2
            and bias.shape[0] == b.shape[-1]
            and bias.stride() == (1,)
        )
        if feature and beta == 1 and alpha == 1:
            return _packed_retry(a, b, bias)
        if not _gpu(bias) or bias.device != a.device or bias.dtype != a.dtype:
            raise DeclinedError
        if a.dtype in _HALVES:
            # PyTorch scales and adds in float32 before one rounding; a half product
            # followed by eager half ops would round twice
            raise DeclinedError
        try:
            torch.broadcast_shapes(bias.shape, (a.shape[0], b.shape[-1]))
        except RuntimeError:
            raise DeclinedError from None
        out = _packed_retry(a, b)
        if alpha != 1:
            out.mul_(alpha)
        if beta != 0:
            out.add_(bias, alpha=beta)
        return out
    except DeclinedError:
        kwargs = {"beta": beta, "alpha": alpha}
        return _cpu("addmm", torch.ops.aten.addmm.default, (bias, a, b), kwargs, False)


impl(_lib, "mm", mm)
impl(_lib, "bmm", bmm)
impl(_lib, "addmm", addmm)
