"""Type inference: the dtype and shape of a node from its operands, by the op's shape rule.

The same rules type imported graphs, text graphs, and every e-node during extraction (where
all e-nodes of a class must agree: the analysis asserts it).
"""

from __future__ import annotations

import math

from . import optable as ot
from .bits import bits_float
from .errors import GraphError

Shape = tuple[int, ...]


def broadcast(*shapes: Shape) -> Shape:
    rank = max((len(s) for s in shapes), default=0)
    out = []
    for i in range(rank):
        dims = {s[len(s) - rank + i] for s in shapes if len(s) - rank + i >= 0}
        dims.discard(1)
        if len(dims) > 1:
            raise ValueError(f"shapes {list(shapes)} do not broadcast")
        out.append(dims.pop() if dims else 1)
    return tuple(out)


def reduce_shape(shape: Shape, dims, keepdim: int) -> Shape:
    ds = {d % len(shape) if shape else 0 for d in dims}
    if keepdim:
        return tuple(1 if i in ds else s for i, s in enumerate(shape))
    return tuple(s for i, s in enumerate(shape) if i not in ds)


def view_shape(shape: Shape, new) -> Shape:
    new = list(new)
    numel = math.prod(shape)
    if new.count(-1) > 1:
        raise ValueError("only one dimension can be -1")
    if -1 in new:
        rest = math.prod(s for s in new if s != -1)
        new[new.index(-1)] = numel // rest if rest else 0
    if math.prod(new) != numel:
        raise ValueError(f"cannot view {list(shape)} ({numel} elements) as {new}")
    return tuple(new)


def expand_shape(shape: Shape, new) -> Shape:
    new = list(new)
    off = len(new) - len(shape)
    if off < 0:
        raise ValueError(f"cannot expand {list(shape)} to fewer dimensions {new}")
    out = []
    for i, n in enumerate(new):
        s = shape[i - off] if i >= off else 1
        if n == -1:
            n = s
        if s != 1 and s != n:
            raise ValueError(f"cannot expand {list(shape)} to {new}")
        out.append(n)
    return tuple(out)


def conv_shape(x: Shape, w: Shape, stride, padding, dilation, groups) -> Shape:
    if len(x) != 4 or len(w) != 4:
        raise ValueError("conv2d takes rank-4 input and weight")
    if x[1] != w[1] * groups:
        raise ValueError(f"conv2d: {x[1]} input channels, weight expects {w[1] * groups}")
    hw = [
        (x[2 + i] + 2 * padding[i] - dilation[i] * (w[2 + i] - 1) - 1) // stride[i] + 1
        for i in range(2)
    ]
    return (x[0], w[0], *hw)


def conv_grad_shape(
    g: Shape, x: Shape, w: Shape, stride, padding, dilation, groups, of_input: bool
) -> Shape:
    """A convolution gradient's shape: the input's ``x`` (``of_input``) or the weight's
    ``w``, checked against the output's gradient ``g`` and the other operand."""
    if len(g) != 4 or len(x) != 4 or len(w) != 4 or groups < 1:
        raise ValueError("a conv2d gradient takes rank-4 tensors and a group count >= 1")
    if w[0] % groups:
        raise ValueError(f"conv2d: {w[0]} output channels in {groups} groups")
    out = conv_shape(x, w, stride, padding, dilation, groups)
    if out != tuple(g):
        raise ValueError(f"conv2d of {list(x)} by {list(w)} gives {list(out)}, not {list(g)}")
    return tuple(x) if of_input else tuple(w)


def take_shape(table: Shape, index: Shape) -> Shape:
    if len(table) != 2:
        raise ValueError(f"Take reads a 2-D table, got rank {len(table)}")
    return (*index, table[1])


def index_add_shape(base: Shape, index: Shape, values: Shape) -> Shape:
    if len(base) != 2 or len(index) != 1:
        raise ValueError(
            f"IndexAdd adds rows into a 2-D table at a 1-D index, got {list(base)} and "
            f"{list(index)}"
        )
    if tuple(values) != (index[0], base[1]):
        raise ValueError(
            f"IndexAdd's values must be [{index[0]}, {base[1]}] (a row per index), got "
            f"{list(values)}"
        )
    return tuple(base)


def cat_shape(a: Shape, b: Shape, dim: int) -> Shape:
    if len(a) != len(b) or not 0 <= dim < len(a):
        raise ValueError(f"cat of {list(a)} and {list(b)} along dim {dim}")
    if any(x != y for d, (x, y) in enumerate(zip(a, b, strict=True)) if d != dim):
        raise ValueError(f"cat of {list(a)} and {list(b)}: sizes differ off dim {dim}")
    return tuple(x + y if d == dim else x for d, (x, y) in enumerate(zip(a, b, strict=True)))


def pad_shape(x: Shape, pads) -> Shape:
    if len(pads) != 2 * len(x) or any(p < 0 for p in pads):
        raise ValueError(f"Pad takes (before, after) >= 0 per axis of {list(x)}, got {pads}")
    return tuple(n + pads[2 * d] + pads[2 * d + 1] for d, n in enumerate(x))


def roll_shape(x: Shape, shifts) -> Shape:
    if len(shifts) != len(x) or any(not 0 <= s < max(n, 1) for s, n in zip(shifts, x, strict=True)):
        raise ValueError(f"Roll takes a shift in [0, size) per axis of {list(x)}, got {shifts}")
    return tuple(x)


def result_dtype(row: ot.Op, dtypes: list[str], attrs: tuple) -> str:
    if row.name == "Cast":
        return attrs[0]
    if row.out_dtype:
        return row.out_dtype
    if row.category == ot.REDUCTION and row.name in ("Sum", "Prod") and not ot.is_float(dtypes[0]):
        return "i64"  # integer (and bool) sums accumulate and return int64, as PyTorch
    if row.name == "Where":
        if dtypes[0] != "bool":
            raise ValueError("Where's condition must be bool")
        if dtypes[1] != dtypes[2]:
            raise ValueError(f"Where's branches have dtypes {dtypes[1]} and {dtypes[2]}")
        return dtypes[1]
    if row.name == "Take":
        if dtypes[1] not in ot.INDEX_DTYPES:
            raise ValueError(f"Take's index must be i32 or i64, got {dtypes[1]}")
        return dtypes[0]
    if row.name == "IndexAdd":
        if dtypes[1] not in ot.INDEX_DTYPES:
            raise ValueError(f"IndexAdd's index must be i32 or i64, got {dtypes[1]}")
        if dtypes[2] != dtypes[0]:
            raise ValueError(f"IndexAdd adds {dtypes[2]} values into a {dtypes[0]} table")
        return dtypes[0]
    if (
        row.category in (ot.ELEMENTWISE, ot.MATMUL, ot.CONVOLUTION, ot.COPY)
        and len(set(dtypes)) > 1
    ):
        raise ValueError(f"operand dtypes {dtypes} differ (insert a Cast)")
    if row.name in ot.FLOAT_OPERANDS and not ot.is_float(dtypes[0]):
        raise ValueError(f"{row.name} needs a float operand, got {dtypes[0]}")
    return dtypes[0]


def shape_of(row: ot.Op, shapes: list[Shape], attrs: tuple) -> Shape:
    rule = row.shape
    if rule == "same":
        return shapes[0]
    if rule == "scalar":
        return ()
    if rule == "arange":
        return (attrs[2],)
    if rule == "broadcast":
        return broadcast(*shapes)
    if rule == "reduce":
        dims, keepdim = attrs[0], attrs[-1]
        for d in dims:
            if not -len(shapes[0]) <= d < max(len(shapes[0]), 1):
                raise ValueError(f"dim {d} out of range for rank {len(shapes[0])}")
        return reduce_shape(shapes[0], dims, keepdim)
    if rule == "view":
        return view_shape(shapes[0], attrs[0])
    if rule == "permute":
        perm = attrs[0]
        if sorted(p % len(shapes[0]) for p in perm) != list(range(len(shapes[0]))):
            raise ValueError(f"{list(perm)} is not a permutation of rank {len(shapes[0])}")
        return tuple(shapes[0][p] for p in perm)
    if rule == "expand":
        return expand_shape(shapes[0], attrs[0])
    if rule == "slice":
        dim, start, end, step = attrs
        shape = list(shapes[0])
        if not 0 <= dim < len(shape) or step < 1 or not 0 <= start <= end <= shape[dim]:
            raise ValueError(f"slice dim {dim} [{start}:{end}:{step}] of {shapes[0]}")
        shape[dim] = (end - start + step - 1) // step
        return tuple(shape)
    if rule in ("matmul", "addmm"):
        a, b = shapes[-2], shapes[-1]
        if len(a) != 2 or len(b) != 2 or a[1] != b[0]:
            raise ValueError(f"mm of {list(a)} and {list(b)}")
        out = (a[0], b[1])
        if rule == "addmm":
            broadcast(shapes[0], out)
        return out
    if rule == "bmm":
        a, b = shapes
        if len(a) != 3 or len(b) != 3 or a[0] != b[0] or a[2] != b[1]:
            raise ValueError(f"bmm of {list(a)} and {list(b)}")
        return (a[0], a[1], b[2])
    if rule == "conv2d":
        return conv_shape(shapes[0], shapes[1], *attrs)
    if rule == "conv_input_grad":
        return conv_grad_shape(shapes[0], tuple(attrs[0]), shapes[1], *attrs[1:], True)
    if rule == "conv_weight_grad":
        return conv_grad_shape(shapes[0], shapes[1], tuple(attrs[0]), *attrs[1:], False)
    if rule == "take":
        return take_shape(shapes[0], shapes[1])
    if rule == "index_add":
        return index_add_shape(shapes[0], shapes[1], shapes[2])
    if rule == "cat":
        return cat_shape(shapes[0], shapes[1], attrs[0])
    if rule == "pad":
        return pad_shape(shapes[0], attrs[0])
    if rule == "roll":
        return roll_shape(shapes[0], attrs[0])
    raise ValueError(f"no shape rule {rule!r}")


def infer(graph, node) -> tuple[str, Shape]:
    """dtype and shape of ``node`` (a graph.Node) from its operands in ``graph``."""
    row = ot.BY_NAME[node.op]
    if node.op in ("Input", "Param"):
        return node.dtype, node.shape
    if node.op == "Scalar":
        return node.attrs[1], ()
    if node.op == "Arange":
        start, step, n, dtype = node.attrs
        if not ot.arange_exact(start, step, n, dtype):
            raise GraphError(
                f"Arange: {n} values from {start} by {step} not exact in {dtype}", node.loc
            )
        return dtype, (n,)
    operands = [graph.nodes[a] for a in node.args]
    try:
        dtype = result_dtype(row, [o.dtype for o in operands], node.attrs)
        shape = shape_of(row, [o.shape for o in operands], node.attrs)
        if row.name in ot.CONSTANT_DIVISOR and not ot.is_float(dtype):
            _constant_divisor(row.name, operands[1], dtype)
    except (ValueError, IndexError) as e:
        raise GraphError(f"{node.op}: {e}", node.loc) from None
    return dtype, shape


def _constant_divisor(op: str, divisor, dtype: str) -> None:
    """An integer Remainder, FloorDiv or Fmod divides by a Scalar the op table admits."""
    value = bits_float(divisor.attrs[0]) if divisor.op == "Scalar" else None
    if value is None or not ot.constant_divisor(value, dtype):
        raise ValueError(
            f"{op} of {dtype} needs a Scalar divisor b, 1 <= b <= 2^53, that fits {dtype}"
            " (an integer zero divisor raises in PyTorch)"
        )
