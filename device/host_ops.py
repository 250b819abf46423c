"""Running the program's host steps with PyTorch on the CPU.

A row's first ATen spelling takes its tensors and attributes in the row's order for most
ops; the ops whose ATen signature differs have an adapter here. Opaque nodes call their
original op with the arguments the importer kept.
"""

from __future__ import annotations

import torch

from saturn.eqsat import optable as ot
from saturn.eqsat.graph import bits_float

from .dtypes import TORCH_DTYPES, HostCall
from .eager_host import HOST


def _aten(name: str):
    """``ns.op.overload`` -> the op; ``higher_order.name.__call__`` -> the higher-order op."""
    ns, op, overload = name.split(".")
    packet = getattr(getattr(torch.ops, ns), op)
    return packet if overload == "__call__" else getattr(packet, overload)


def _layer_norm(x, w, b, dims, eps_bits):
    """A missing weight or bias is imported as the scalar 1 or -0.0 (exact stand-ins);
    PyTorch's kernel takes them at the normalized shape."""
    shape = [x.shape[d] for d in dims]
    w, b = (t.expand(shape) if list(t.shape) != shape else t for t in (w, b))
    return torch.ops.aten.native_layer_norm.default(x, shape, w, b, bits_float(eps_bits))[0]


def _batch_norm(x, w, b, rm, rv, eps_bits):
    return (x - rm) * torch.rsqrt(rv + bits_float(eps_bits)) * w + b


def _rmsnorm(x, w, eps_bits):
    return x * torch.rsqrt((x * x).mean(-1, keepdim=True) + bits_float(eps_bits)) * w


def _fma(a, b, c):
    """float32 as the kernel computes it (in float64, one rounding of the sum; PyTorch's
    CPU prims.fma rounds the product first); other dtypes as PyTorch's prims.fma."""
    if a.dtype != torch.float32:
        return torch.ops.prims.fma.default(a, b, c)
    return (a.double() * b.double() + c.double()).to(torch.float32)


def _prod(x, dims, keepdim):
    for d in sorted(dims, reverse=True):
        x = torch.prod(x, d, keepdim=bool(keepdim))
    return x


def _take(table, index):
    return table.index_select(0, index.reshape(-1)).view(*index.shape, table.shape[1])


def _pad(x, pads, value_bits):
    """(before, after) per axis, axis 0 first; torch's pad lists the last axis first."""
    flat = [p for d in reversed(range(x.dim())) for p in (pads[2 * d], pads[2 * d + 1])]
    return torch.nn.functional.pad(x, flat, value=bits_float(value_bits))


def _index_add(base, index, values):
    """base with values' rows added at index's rows (PyTorch's own range check)."""
    return base.index_put((index,), values, accumulate=True)


ADAPTERS = {
    "Pad": _pad,
    "IndexAdd": _index_add,
    "Take": _take,
    "Roll": lambda x, shifts: torch.roll(x, list(shifts), list(range(x.dim()))),
    "Cat": lambda a, b, dim: torch.cat([a, b], dim),
    "Cast": lambda x, dtype: x.to(TORCH_DTYPES[dtype]),
    "Gelu": lambda x: torch.ops.aten.gelu.default(x),
    "GeluTanh": lambda x: torch.ops.aten.gelu.default(x, approximate="tanh"),
    "Fma": _fma,
    "Softmax": lambda x, dim: torch.ops.aten._softmax.default(x, dim, False),
    "LogSoftmax": lambda x, dim: torch.ops.aten._log_softmax.default(x, dim, False),
    "LayerNorm": _layer_norm,
    "BatchNormInf": _batch_norm,
    "RMSNorm": _rmsnorm,
    "Var": lambda x, dims, corr, kd: torch.ops.aten.var.correction(
        x, list(dims), correction=corr, keepdim=bool(kd)
    ),
    "Prod": _prod,
    "View": lambda x, shape: x.reshape(shape),
    "Pow": lambda x, e: torch.pow(x, e),
    # the importer's clamp halves (no ATen spelling of their own): torch.clamp's semantics
    # torch.clamp's bound as a value (x kept on a tie: -0.0 against 0.0 stays -0.0, a NaN
    # bound gives NaN); clamp_min's Tensor overload resolves zero ties by vector width
    "ClampMin": lambda x, lo: torch.where((x < lo) | (lo != lo), lo.to(x.dtype), x),
    "ClampMax": lambda x, hi: torch.where((x > hi) | (hi != hi), hi.to(x.dtype), x),
    "Conv2d": lambda x, w, b, st, pa, di, g: torch.ops.aten.convolution.default(
        x, w, b, list(st), list(pa), list(di), False, [0, 0], g
    ),
    "Conv2dNoBias": lambda x, w, st, pa, di, g: torch.ops.aten.convolution.default(
        x, w, None, list(st), list(pa), list(di), False, [0, 0], g
    ),
    # Maximum and Minimum keep their second operand on a tie (their kernels' ``a if a > b
    # else b``, numpy's maximum): PyTorch's CPU kernels keep the first, so the operands
    # are swapped and a zero tie (-0.0 against +0.0) comes out the same on every path
    "Maximum": lambda a, b: torch.maximum(b, a),
    "Minimum": lambda a, b: torch.minimum(b, a),
    "ConvInputGrad": lambda g, w, shape, st, pa, di, gr: torch.nn.grad.conv2d_input(
        list(shape), w, g, list(st), list(pa), list(di), gr
    ),
    "ConvWeightGrad": lambda g, x, shape, st, pa, di, gr: torch.nn.grad.conv2d_weight(
        x, list(shape), g, list(st), list(pa), list(di), gr
    ),
}


def call_opaque(call: HostCall, tensors: list):
    args, kwargs = call_args(call, tensors)
    if "device" in kwargs:  # a factory (arange, zeros, ...): a host step makes it on the host
        kwargs["device"] = torch.device("cpu")
    # an op whose CUDA kernel takes what the CPU's refuses: CUDA's semantics (eager_host)
    return HOST.get(call.target, _aten(call.target))(*args, **kwargs)


def call_args(call: HostCall, tensors: list) -> tuple[list, dict]:
    """The call's positional and keyword arguments with its tensor slots filled."""

    def conv(a):
        if isinstance(a, list):
            return [conv(x) for x in a]
        if isinstance(a, tuple) and len(a) == 2 and a[0] in ("t", "c", "op"):
            return tensors[a[1]] if a[0] == "t" else _aten(a[1]) if a[0] == "op" else a[1]
        if isinstance(a, tuple):
            return tuple(conv(x) for x in a)
        return a

    return [conv(a) for a in call.args], {k: conv(v) for k, v in call.kwargs.items()}


def run_host(op: str, args: list, attrs: tuple, host_calls: dict[str, HostCall]):
    if op in host_calls:
        return call_opaque(host_calls[op], args)
    if op == "Item":
        return args[0][attrs[0]]
    if op in ADAPTERS:
        return ADAPTERS[op](*args, *attrs)
    row = ot.op(op)
    fn = _aten(row.aten[0].split(":")[0])
    return fn(*args, *[list(a) if isinstance(a, tuple) else a for a in attrs])
