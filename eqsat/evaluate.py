"""A numpy reference evaluator for graphs and for extracted programs.

Both use the op table's numpy semantics, in each value's own dtype, so an exact rewrite
gives bit-identical results: the property tests compare the two.
"""

from __future__ import annotations

import numpy as np

from . import optable as ot
from .graph import Graph, bits_float
from .kinds import Kind, KindTable
from .program import Expr, Program, elementwise_ops
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
    xp = np.pad(x, ((0, 0), (0, 0), (padding[0], padding[0]), (padding[1], padding[1])))
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


def eval_graph(graph: Graph, inputs: dict[str, np.ndarray]) -> list[np.ndarray]:
    env: dict[str, np.ndarray] = {}
    for n in graph.nodes.values():
        if n.op in ("Input", "Param"):
            env[n.name] = inputs[n.name]
        elif n.op == "Scalar":
            env[n.name] = scalar(*n.attrs)
        elif n.op == "Arange":
            env[n.name] = ot.arange_values(*n.attrs)
        else:
            env[n.name] = apply_op(n.op, [env[a] for a in n.args], n.attrs, n.dtype)
    return [env[o] for o in graph.outputs]


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


def eval_program(prog: Program, inputs: dict[str, np.ndarray]) -> list[np.ndarray]:
    env: dict[str, np.ndarray] = {}
    by_input = {v: k for k, v in prog.inputs.items()}
    for s in prog.steps:
        if s.kind == "input":
            env[s.output] = inputs[by_input[s.output]]
        elif s.kind == "const" and s.op == "Arange":
            env[s.output] = ot.arange_values(*s.attrs)
        elif s.kind == "const":
            env[s.output] = scalar(*s.attrs)
        elif s.kind == "crossing":
            env[s.output] = env[s.args[0]].copy()
        elif s.kind in ("host", "view"):
            env[s.output] = apply_op(s.op, [env[a] for a in s.args], s.attrs, s.dtype)
        elif s.kind == "kernel":
            env[s.output] = run_kernel(s, [env[o.value] for o in s.kernel.inputs])
    return [env[o] for o in prog.outputs]


# the numpy reference of each kernel kind: (kernel, its operands) -> its output
REFERENCE: KindTable = KindTable("the reference evaluator")


def run_kernel(s, operands: list[np.ndarray]) -> np.ndarray:
    return REFERENCE[s.kernel.kind](s.kernel, operands)


@REFERENCE.on(Kind.ROWS)
def _rows(k, operands: list[np.ndarray]) -> np.ndarray:
    """Each stage a last-axis reduction, then the body."""
    if "take" in k.attrs:  # a fused take (fuse_row_takes): the taken rows, as a gather
        t, x = k.attrs["take"]
        operands = list(operands)
        operands[t] = ot.op("Take").numpy(operands[t], operands[x])
    stages = []
    last = [len(k.domain) - 1]
    for st in k.stages:
        v = np.broadcast_to(eval_expr(st.body, operands, stages), k.domain)
        acc = reduce(st.reduce, v, last, 1, st.acc_dtype)
        if st.epilogue is not None:
            acc = np.asarray(eval_expr(st.epilogue, [acc])).astype(np_dtype(st.dtype))
        stages.append(acc)
    v = np.broadcast_to(eval_expr(k.body, operands, stages), k.domain)
    return np.array(v, dtype=np_dtype(k.dtype))


@REFERENCE.on(Kind.LOOP)
def _loop(k, operands: list[np.ndarray]) -> np.ndarray:
    v = np.broadcast_to(eval_expr(k.body, operands), k.domain)
    return np.array(v, dtype=np_dtype(k.dtype))


@REFERENCE.on(Kind.REDUCE)
def _reduce(k, operands: list[np.ndarray]) -> np.ndarray:
    v = np.broadcast_to(eval_expr(k.body, operands), k.domain)
    acc = reduce(
        k.attrs["reduce"],
        v,
        k.attrs["dims"],
        k.attrs["keepdim"],
        k.attrs.get("acc_dtype", k.dtype),
    )
    # a reduction over a permuted domain (kept axes first) keeps its dims at the end:
    # the same elements in the same order as the output's shape
    acc = np.reshape(acc, k.shape)
    if k.epilogue is None:
        return acc
    return np.asarray(eval_expr(k.epilogue, [acc])).astype(np_dtype(k.dtype))


@REFERENCE.on(Kind.GEMM)
def _gemm(k, operands: list[np.ndarray]) -> np.ndarray:
    a, b = operands[0], operands[1]
    r = np.matmul(a, b)
    if k.attrs["epilogue"] != "none":
        r = r + operands[2]
    if k.attrs["epilogue"] == "relu_bias":
        r = ot.op("Relu").numpy(r.astype(np_dtype(k.dtype)))
    elif k.attrs["epilogue"] == "gelu_bias":
        r = ot.op("GeluTanh").numpy(r.astype(np_dtype(k.dtype)))
    return np.asarray(r).astype(np_dtype(k.dtype))


@REFERENCE.on(Kind.CONV)
def _conv(k, operands: list[np.ndarray]) -> np.ndarray:
    a = k.attrs
    b = operands[2] if a["bias"] else None
    x, w = operands[0], operands[1]
    return conv2d(x, w, b, a["stride"], a["padding"], a["dilation"], a["groups"])


@REFERENCE.on(Kind.GATHER)
def _gather(k, operands: list[np.ndarray]) -> np.ndarray:
    return ot.op("Take").numpy(operands[0], operands[1])


@REFERENCE.on(Kind.SCATTER)
def _scatter(k, operands: list[np.ndarray]) -> np.ndarray:
    return ot.op("IndexAdd").numpy(*operands)


@REFERENCE.on(Kind.CONCAT)
def _concat(k, operands: list[np.ndarray]) -> np.ndarray:
    """Two or more pieces, joined two at a time."""
    r = operands[0]
    for piece in operands[1:]:
        r = ot.op("Cat").numpy(r, piece, k.attrs["dim"])
    return r


@REFERENCE.on(Kind.PAD)
def _pad(k, operands: list[np.ndarray]) -> np.ndarray:
    return ot.op("Pad").numpy(operands[0], k.attrs["pads"], k.attrs["value_bits"])


@REFERENCE.on(Kind.CUSTOM)
def _custom(k, operands: list[np.ndarray]) -> np.ndarray:
    """The built-in pattern a custom kernel stands for (a user's op has no numpy form)."""
    if k.attrs["name"] != "rmsnorm":
        raise NotImplementedError(f"the reference evaluator cannot run custom op {k.attrs['name']}")
    return apply_op("RMSNorm", operands, (k.attrs["eps_bits"],), k.dtype)
