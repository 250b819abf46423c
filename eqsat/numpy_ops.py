"""The numpy semantics every reference shares: a value's dtype, a scalar from its bits, a
reduction in a given accumulator dtype, an op of the table applied to arrays, a 2-d
convolution, and a kernel body evaluated over its operands. Each keeps results in the
value's own dtype, so an exact rewrite gives bit-identical results."""

from __future__ import annotations

import numpy as np

from . import optable as ot
from .graph import bits_float
from .program import Expr, elementwise_ops
from .types import view_shape

_REDUCE = {"sum": np.sum, "mean": np.mean, "max": np.max, "min": np.min, "prod": np.prod}


def np_dtype(dtype: str):
    return ot.NUMPY_DTYPE[dtype]


def scalar(bits: int, dtype: str) -> np.ndarray:
    with np.errstate(all="ignore"):
        return np.array(bits_float(bits)).astype(np_dtype(dtype))


def reduce(kind: str, x: np.ndarray, dims, keepdim: int, out_dtype: str) -> np.ndarray:
    axis = tuple(d % x.ndim for d in dims) if x.ndim else None
    fn = _REDUCE[kind]
    with np.errstate(all="ignore"):
        if kind in ("sum", "prod", "mean"):
            r = fn(x, axis=axis, keepdims=bool(keepdim), dtype=np_dtype(out_dtype))
        else:
            r = fn(x, axis=axis, keepdims=bool(keepdim))
    return np.asarray(r).astype(np_dtype(out_dtype))


def apply_op(op: str, args: list[np.ndarray], attrs: tuple, dtype: str) -> np.ndarray:
    row = ot.op(op)
    with np.errstate(all="ignore"):
        if row.category == ot.ELEMENTWISE:
            if op == "Cast":
                return args[0].astype(np_dtype(attrs[0]))
            return np.asarray(row.numpy(*args)).astype(np_dtype(dtype))
        if row.category == ot.REDUCTION:
            kind = {"Sum": "sum", "Mean": "mean", "Amax": "max", "Amin": "min", "Prod": "prod"}.get(
                op
            )
            if op == "Var":
                dims, corr, kd = attrs
                axis = tuple(d % args[0].ndim for d in dims)
                return np.var(args[0], axis=axis, ddof=corr, keepdims=bool(kd)).astype(
                    np_dtype(dtype)
                )
            return reduce(kind, args[0], attrs[0], attrs[1], dtype)
        if op == "View":
            return args[0].reshape(view_shape(args[0].shape, attrs[0]))
        if op == "Permute":
            return np.transpose(args[0], attrs[0])
        if op == "Expand":
            shape = [
                s if s != -1 else args[0].shape[i - (len(attrs[0]) - args[0].ndim)]
                for i, s in enumerate(attrs[0])
            ]
            return np.broadcast_to(args[0], shape)
        if op == "Slice":
            dim, start, end, step = attrs
            index = [slice(None)] * args[0].ndim
            index[dim] = slice(start, end, step)
            return args[0][tuple(index)]
        if op in ("MatMul", "BatchMatMul"):
            return np.matmul(args[0], args[1]).astype(np_dtype(dtype))
        if op == "Addmm":
            return (args[0] + np.matmul(args[1], args[2])).astype(np_dtype(dtype))
        if op == "Softmax":
            x, d = args[0], attrs[0]
            z = np.exp(x - np.max(x, axis=d, keepdims=True))
            return (z / np.sum(z, axis=d, keepdims=True)).astype(np_dtype(dtype))
        if op == "LogSoftmax":
            x, d = args[0], attrs[0]
            s = x - np.max(x, axis=d, keepdims=True)
            return (s - np.log(np.sum(np.exp(s), axis=d, keepdims=True))).astype(np_dtype(dtype))
        if op == "LayerNorm":
            x, w, b = args
            axis = tuple(attrs[0])
            c = x - np.mean(x, axis=axis, keepdims=True)
            v = np.mean(c * c, axis=axis, keepdims=True)
            eps = scalar(attrs[1], dtype)
            return (c * (1 / np.sqrt(v + eps)) * w + b).astype(np_dtype(dtype))
        if op in ("Conv2d", "Conv2dNoBias"):
            b = args[2] if op == "Conv2d" else None
            return conv2d(args[0], args[1], b, *attrs)
        if op == "ConvInputGrad":
            return conv2d_input_grad(args[0], args[1], *attrs)
        if op == "ConvWeightGrad":
            return conv2d_weight_grad(args[0], args[1], *attrs)
        if row.category in (ot.GATHER, ot.SCATTER, ot.COPY) and row.numpy is not None:
            return row.numpy(*args, *attrs)  # moves (or adds) values in their own dtype
        if op == "RMSNorm":
            x, w = args
            eps = scalar(attrs[0], dtype)
            ms = np.mean(x * x, axis=-1, keepdims=True)
            return (x * (1 / np.sqrt(ms + eps)) * w).astype(np_dtype(dtype))
    raise NotImplementedError(f"the reference evaluator has no rule for {op}")


def conv2d(x, w, b, stride, padding, dilation, groups) -> np.ndarray:
    """Cross-correlation as PyTorch's conv2d (NCHW, OIHW weights), by windows and einsum."""

    o, cg, kh, kw = w.shape
    xp = _padded(x, padding)
    win = np.lib.stride_tricks.sliding_window_view(
        xp, ((kh - 1) * dilation[0] + 1, (kw - 1) * dilation[1] + 1), axis=(2, 3)
    )
    win = win[:, :, :: stride[0], :: stride[1], :: dilation[0], :: dilation[1]]
    og = o // groups
    outs = []
    for g in range(groups):
        xs = win[:, g * cg : (g + 1) * cg]
        ws = w[g * og : (g + 1) * og]
        outs.append(np.einsum("nchwij,ocij->nohw", xs, ws, dtype=np.float64))
    y = np.concatenate(outs, axis=1)
    if b is not None:
        y = y + b.reshape(1, -1, 1, 1)
    return y.astype(x.dtype)


def _padded(x: np.ndarray, padding) -> np.ndarray:
    return np.pad(x, ((0, 0), (0, 0), (padding[0], padding[0]), (padding[1], padding[1])))


def conv2d_input_grad(g, w, shape, stride, padding, dilation, groups) -> np.ndarray:
    """The gradient of ``conv2d``'s input of ``shape`` given the output's ``g``: each
    kernel position's products added into the padded input at the positions it read,
    in float64, the padding cut off."""
    n, c, h, wd = shape
    k, cg, kh, kw = w.shape
    kg, (ho, wo) = k // groups, g.shape[2:]
    dx = np.zeros((n, c, h + 2 * padding[0], wd + 2 * padding[1]), np.float64)
    for gi in range(groups):
        gs = g[:, gi * kg : (gi + 1) * kg].astype(np.float64)
        ws = w[gi * kg : (gi + 1) * kg].astype(np.float64)
        for i in range(kh):
            for j in range(kw):
                r, q = i * dilation[0], j * dilation[1]
                rows = slice(r, r + stride[0] * (ho - 1) + 1, stride[0])
                cols = slice(q, q + stride[1] * (wo - 1) + 1, stride[1])
                dx[:, gi * cg : (gi + 1) * cg, rows, cols] += np.einsum(
                    "nkhw,kc->nchw", gs, ws[:, :, i, j]
                )
    dx = dx[:, :, padding[0] : padding[0] + h, padding[1] : padding[1] + wd]
    return dx.astype(g.dtype)


def conv2d_weight_grad(g, x, shape, stride, padding, dilation, groups) -> np.ndarray:
    """The gradient of ``conv2d``'s weight of ``shape`` given the output's ``g`` and the
    input ``x``: per group, the gradient contracted with the input's windows, in float64."""
    k, cg, kh, kw = shape
    kg = k // groups
    win = np.lib.stride_tricks.sliding_window_view(
        _padded(x, padding), ((kh - 1) * dilation[0] + 1, (kw - 1) * dilation[1] + 1), axis=(2, 3)
    )
    win = win[:, :, :: stride[0], :: stride[1], :: dilation[0], :: dilation[1]]
    outs = [
        np.einsum(
            "nkhw,nchwij->kcij",
            g[:, gi * kg : (gi + 1) * kg],
            win[:, gi * cg : (gi + 1) * cg],
            dtype=np.float64,
        )
        for gi in range(groups)
    ]
    return np.concatenate(outs, axis=0).astype(g.dtype)


def eval_expr(e: Expr, operands: list[np.ndarray], stages: list | None = None) -> np.ndarray:
    ops = elementwise_ops()
    if e[0] == "in":
        return operands[e[1]]
    if e[0] == "stage":
        return stages[e[1]]
    if e[0] == "const":
        return scalar(e[1], e[2])
    if e[0] == "cast":
        return eval_expr(e[1], operands, stages).astype(np_dtype(e[2]))
    args = [eval_expr(c, operands, stages) for c in e[1:]]
    row = ops[e[0]]
    # the result keeps its operands' dtype (comparisons give bool; Where its branches')
    out = np.bool_ if row.out_dtype == "bool" else args[1 if row.name == "Where" else 0].dtype
    with np.errstate(all="ignore"):
        return np.asarray(row.numpy(*args)).astype(out)
