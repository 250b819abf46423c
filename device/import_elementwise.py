"""Importer handlers for elementwise ops whose ATen form is not one row of the op table:
``alpha`` arguments, rounding division, powers, clamps, logical and bitwise ops, casts and
copies, and the optimizers' ``_foreach`` ops (one node per tensor of the list).
"""

from __future__ import annotations

import numpy as np
import torch
import torch.fx

from saturn.eqsat import optable as ot
from saturn.eqsat.graph import Node

from .import_core import Importer, divisor_is_constant, fake_value, handles, tensor_type


def _h_binary_alpha(row_name: str):
    """add/sub(a, b, alpha) = a +/- alpha * b (an optimizer's ``p.add_(g, alpha=-lr)``).
    The product is rounded before the sum, where PyTorch's CPU kernel fuses the two (one
    rounding less; the same values but the last bit, as the decompositions' note says).
    Alpha that is not a number of the op's kind (a float alpha for integers) is declined."""

    def h(imp: Importer, node: torch.fx.Node):
        alpha = node.kwargs.get("alpha", 1)
        if set(node.kwargs) - {"alpha"} or len(node.args) != 2:
            return None
        dtype, shape = tensor_type(node)
        if not _alpha_ok(alpha, dtype):
            return None
        a, b = node.args
        args = (imp.operand(a, dtype), _scaled(imp, b, alpha, dtype))
        return imp.add(Node(node.name, row_name, args, (), dtype, shape), node.name)

    return h


def _alpha_ok(alpha, dtype: str) -> bool:
    """add/sub's alpha: a number of the op's kind (a float alpha for integers declines)."""
    return type(alpha) is int or (type(alpha) is float and dtype in ot.FLOATS)


def _scaled(imp: Importer, b, alpha, dtype: str) -> str:
    """``b * alpha`` in b's own shape (it may broadcast against the other operand)."""
    name = b if isinstance(b, str) else imp.operand(b, dtype)
    if alpha == 1:
        return name
    return ew_node(imp, "Mul", (name, alpha), dtype, imp.g.nodes[name].shape)


def _h_rsub(imp: Importer, node: torch.fx.Node):
    if node.kwargs.get("alpha", 1) != 1 or len(node.args) > 2:
        return None
    dtype, shape = tensor_type(node)
    x, other = node.args
    return imp.add(
        Node(
            node.name, "Sub", (imp.operand(other, dtype), imp.operand(x, dtype)), (), dtype, shape
        ),
        node.name,
    )


def _h_gelu(imp: Importer, node: torch.fx.Node):
    approx = node.kwargs.get("approximate", node.args[1] if len(node.args) > 1 else "none")
    dtype, shape = tensor_type(node)
    op = {"none": "Gelu", "tanh": "GeluTanh"}.get(approx)
    if op is None:
        return None
    return imp.add(Node(node.name, op, (imp.env[node.args[0].name],), (), dtype, shape), node.name)


def _h_div_mode(imp: Importer, node: torch.fx.Node):
    """div(a, b, rounding_mode): None is Div, "floor" PyTorch's floor division (FloorDiv),
    "trunc" the truncated quotient trunc(a / b), as PyTorch's kernel computes it. Floats,
    and the floor mode of integers by a constant divisor (``divisor_is_constant``; an integer
    zero divisor raises in PyTorch)."""
    a, b = node.args[:2]
    mode = node.kwargs.get("rounding_mode", node.args[2] if len(node.args) > 2 else None)
    dtype, shape = tensor_type(node)
    if dtype not in ot.FLOATS and not (mode == "floor" and divisor_is_constant([a, b], dtype)):
        return None
    if mode not in (None, "floor", "trunc"):
        return None
    if mode == "floor":
        out = ew_node(imp, "FloorDiv", (a, b), dtype, shape)
    else:
        out = ew_node(imp, "Div", (a, b), dtype, shape)
        if mode == "trunc":
            out = imp.add(Node(imp.fresh("trunc"), "Trunc", (out,), (), dtype, shape))
    imp.fx_names[out] = node.name
    return out


def _h_pow(imp: Importer, node: torch.fx.Node):
    """x ** e. A number exponent PyTorch's kernels special-case (CPU and CUDA alike) is
    imported as what they compute, which is not C's pow at the edges: 0.5 is sqrt
    ((-inf) ** 0.5 is NaN, (-0.0) ** 0.5 is -0.0), -0.5 is rsqrt, 2 and 3 are products, -1
    the reciprocal, -2 the reciprocal of the square. Which dtypes, per target (measured on
    torch's CPU kernels; CUDA's pow_tensor_scalar_kernel from its source): the GPU
    special-cases every float dtype; the CPU float32, float64 and bfloat16, but computes
    C's pow for float16."""
    dtype, shape = tensor_type(node)
    if dtype not in ot.FLOATS:
        return None
    x, e = node.args
    special = type(e) in (int, float) and e in _POW_AS and (imp.gpu or dtype != "f16")
    if isinstance(x, torch.fx.Node) and special:
        xn = imp.operand(x, dtype)

        def ew(op, *args):
            return imp.add(Node(imp.fresh(op.lower()), op, args, (), dtype, shape))

        out = {
            0.5: lambda: ew("Sqrt", xn),
            -0.5: lambda: ew("Rsqrt", xn),
            2: lambda: ew("Mul", xn, xn),
            3: lambda: ew("Mul", ew("Mul", xn, xn), xn),
            -1: lambda: ew("Reciprocal", xn),
            -2: lambda: ew("Reciprocal", ew("Mul", xn, xn)),
        }[e]()
        imp.fx_names[out] = node.name
        return out
    return imp.add(
        Node(node.name, "Pow", (imp.operand(x, dtype), imp.operand(e, dtype)), (), dtype, shape),
        node.name,
    )


_POW_AS = (0.5, -0.5, 2, 3, -1, -2)


def _h_copy(imp: Importer, node: torch.fx.Node):
    """copy(dst, src), the functional form of ``dst.copy_(src)``: src's values in dst's
    dtype, broadcast to dst's shape (a cast and a view: exact, or PyTorch's own cast)."""
    if len(node.args) != 2 or set(node.kwargs) - {"non_blocking"}:
        return None
    dtype, shape = tensor_type(node)
    src = imp.env[node.args[1].name] if isinstance(node.args[1], torch.fx.Node) else None
    if src is None:
        return None
    out = imp.cast(src, dtype)
    if imp.g.nodes[out].shape != shape:
        out = imp.add(Node(imp.fresh("copy"), "Expand", (out,), (shape,), dtype, shape))
    if out != src:
        imp.fx_names[out] = node.name
    return out


def ew_node(imp: Importer, op: str, args, dtype: str, shape) -> str:
    """One elementwise node over built names (str), fx tensors or Python numbers."""
    names = tuple(a if isinstance(a, str) else imp.operand(a, dtype) for a in args)
    return imp.add(Node(imp.fresh(op.lower()), op, names, (), dtype, shape))


def _foreach_one(kind: str, args: list, kwargs: dict, dtype: str, shape, imp) -> str | None:
    """The value at one position of ``_foreach_<kind>``: the single-tensor op's formula."""

    def ew(op, *xs):
        return ew_node(imp, op, xs, dtype, shape)

    if kind in ("add", "sub"):
        a, b = args[:2]
        alpha = kwargs.get("alpha", args[2] if len(args) > 2 else 1)
        if not _alpha_ok(alpha, dtype):
            return None
        return ew("Add" if kind == "add" else "Sub", a, _scaled(imp, b, alpha, dtype))
    if kind in ("mul", "div", "maximum", "minimum"):
        op = {"mul": "Mul", "div": "Div", "maximum": "Maximum", "minimum": "Minimum"}[kind]
        return ew(op, *args[:2])
    if kind in ("neg", "sqrt", "reciprocal", "exp", "abs"):
        return ew(kind.capitalize(), args[0])
    if kind == "pow":
        return ew("Pow", *args[:2])
    if kind in ("addcmul", "addcdiv"):  # self + value * (t1 op t2): fused, as the one-tensor op
        x, t1, t2 = args[:3]
        value = kwargs.get("value", args[3] if len(args) > 3 else 1)
        if type(value) not in (int, float) or dtype not in ot.FLOATS:
            return None
        prod = ew("Mul" if kind == "addcmul" else "Div", t1, t2)
        if dtype == "f32":
            return ew("Fma", prod, value, x)
        return ew("Add", x, ew("Mul", prod, value))
    if kind == "lerp":  # PyTorch's lerp: from the nearer end (the weight is a number here)
        x, end, w = args[:3]
        if type(w) not in (int, float) or dtype not in ot.FLOATS:
            return None
        diff = ew("Sub", end, x)
        if abs(w) < 0.5:
            return ew("Add", x, ew("Mul", w, diff))
        one_minus = float(np.float32(1) - np.float32(w)) if dtype == "f32" else 1.0 - w
        return ew("Sub", end, ew("Mul", diff, one_minus))
    return None


def _h_foreach(kind: str):
    """``_foreach_<kind>`` (an optimizer's default, multi-tensor form): the single-tensor
    op at each position, read by the getitems that follow; declined as a whole when any
    position is (then the call runs on the host)."""

    def handler(imp: Importer, node: torch.fx.Node):
        metas = fake_value(node)
        if not isinstance(metas, list | tuple) or not metas:
            return None
        lists = [a for a in node.args if isinstance(a, list | tuple)]
        if not lists or any(len(a) != len(metas) for a in lists):
            return None
        names = []
        for i, meta in enumerate(metas):
            args = [a[i] if isinstance(a, list | tuple) else a for a in node.args]
            dtype, shape = tensor_type(node, meta)
            name = _foreach_one(kind, args, dict(node.kwargs), dtype, shape, imp)
            if name is None:
                return None  # nodes built so far are read by nothing
            imp.fx_names[name] = f"{node.name}[{i}]"
            names.append(name)
        imp.results[node.name] = tuple(names)
        return names[0]

    return handler


_FOREACH = {
    "add": ("Scalar", "List"),
    "sub": ("Scalar", "List"),
    "mul": ("Scalar", "List", "Tensor"),
    "div": ("Scalar", "List", "Tensor"),
    "maximum": ("List",),
    "minimum": ("List",),
    "neg": ("default",),
    "sqrt": ("default",),
    "reciprocal": ("default",),
    "exp": ("default",),
    "abs": ("default",),
    "pow": ("ScalarAndTensor", "Scalar", "List"),
    "addcmul": ("Scalar",),
    "addcdiv": ("Scalar",),
    "lerp": ("Scalar",),
}


def _h_logical_not(imp: Importer, node: torch.fx.Node):
    """logical_not(x) = (x == 0): true exactly for false, +0.0 and -0.0 (NaN is truthy, and
    NaN == 0 is false; infinities are nonzero)."""
    xn = imp.g.nodes[imp.env[node.args[0].name]]
    dtype, shape = tensor_type(node)
    if dtype != "bool" or node.kwargs:
        return None
    zero = imp.scalar(0, xn.dtype)
    return imp.add(Node(node.name, "Eq", (xn.name, zero), (), dtype, shape), node.name)


def _truth(imp: Importer, a) -> str | None:
    """A bool tensor operand as is; any other tensor as ``a != 0`` (NaN is truthy, both
    zeros are false: PyTorch's truthiness). None for a non-tensor."""
    if not isinstance(a, torch.fx.Node):
        return None
    an = imp.g.nodes[imp.env[a.name]]
    if an.dtype == "bool":
        return an.name
    zero = imp.scalar(0, an.dtype)
    return imp.add(Node(imp.fresh("truth"), "Ne", (an.name, zero), (), "bool", an.shape))


def _h_logical(kind: str, bool_only: bool):
    """logical_and / logical_or (and bitwise_and / bitwise_or of booleans) as a Where over
    the operands' truth: ``a and b = b if a else false``, ``a or b = true if a else b``.
    Exact for every value; bitwise ops of integers are declined."""

    def handler(imp: Importer, node: torch.fx.Node):
        if len(node.args) != 2 or node.kwargs:
            return None
        dtype, shape = tensor_type(node)
        a, b = (_truth(imp, v) for v in node.args)
        if dtype != "bool" or a is None or b is None:
            return None
        if bool_only and any(imp.g.nodes[imp.env[v.name]].dtype != "bool" for v in node.args):
            return None
        if kind == "and":
            args = (a, b, imp.scalar(False, "bool"))
        else:
            args = (a, imp.scalar(True, "bool"), b)
        return imp.add(Node(node.name, "Where", args, (), dtype, shape), node.name)

    return handler


def _h_bitwise_not(imp: Importer, node: torch.fx.Node):
    """bitwise_not of booleans is logical_not: ``x == false``. Integers are declined."""
    xn = imp.g.nodes[imp.env[node.args[0].name]]
    if xn.dtype != "bool" or node.kwargs:
        return None
    false = imp.scalar(False, "bool")
    return imp.add(Node(node.name, "Eq", (xn.name, false), (), "bool", xn.shape), node.name)


def _h_clamp(kind: str):
    """clamp(x, lo, hi) / clamp_min / clamp_max with number bounds = ClampMax(ClampMin(x,
    lo), hi): x kept on a tie (-0.0 stays -0.0), NaN-propagating like PyTorch's clamp;
    lo > hi gives hi everywhere, as PyTorch. Declined when a bound is a tensor or would
    change the result's dtype."""

    def handler(imp: Importer, node: torch.fx.Node):
        xn = imp.g.nodes[imp.env[node.args[0].name]]
        rest, kw = list(node.args[1:]), dict(node.kwargs)
        if kind == "clamp":
            rest += [None] * (2 - len(rest))
            lo = rest[0] if rest[0] is not None else kw.pop("min", None)
            hi = rest[1] if rest[1] is not None else kw.pop("max", None)
        elif kind == "min":
            lo, hi = (rest[0] if rest else kw.pop("min", None)), None
        else:
            lo, hi = None, (rest[0] if rest else kw.pop("max", None))
        return None if kw else _clamped(imp, node, xn, lo, hi)

    return handler


def _clamped(imp: Importer, node: torch.fx.Node, xn: Node, lo, hi) -> str | None:
    """ClampMax(ClampMin(x, lo), hi) for number bounds (either may be None), named for
    ``node``; None where a bound is a tensor, changes the dtype or lies outside it."""
    dtype, shape = tensor_type(node)
    if dtype != xn.dtype or (lo is None and hi is None):
        return None
    if not all(v is None or type(v) in (int, float) for v in (lo, hi)):
        return None
    if dtype in ot.INTS:  # a bound outside the dtype: PyTorch raises (the call does too)
        info = np.iinfo(ot.NUMPY_DTYPE[dtype])
        if not all(v is None or info.min <= v <= info.max for v in (lo, hi)):
            return None
    out = xn.name
    for v, op in ((lo, "ClampMin"), (hi, "ClampMax")):
        if v is not None:
            out = ew_node(imp, op, (out, v), dtype, shape)
    imp.fx_names[out] = node.name
    return out


def _h_hardtanh(imp: Importer, node: torch.fx.Node):
    """hardtanh(x, lo=-1, hi=1) is PyTorch's clamp(x, lo, hi) (its kernel calls clamp):
    NaN stays NaN, -0.0 stays -0.0."""
    args = list(node.args) + [None] * 2
    lo = args[1] if args[1] is not None else node.kwargs.get("min_val", -1.0)
    hi = args[2] if args[2] is not None else node.kwargs.get("max_val", 1.0)
    return _clamped(imp, node, imp.g.nodes[imp.env[node.args[0].name]], lo, hi)


def _h_sign(imp: Importer, node: torch.fx.Node):
    """sign(x) = (0 < x) - (x < 0), as PyTorch's CPU kernel: 0 for NaN and for both zeros
    (+0.0, the difference of two zeros), 1 for +inf, -1 for -inf."""
    xn = imp.g.nodes[imp.env[node.args[0].name]]
    dtype, shape = tensor_type(node)
    if dtype != xn.dtype or dtype not in ot.FLOATS + ot.SIGNED:
        return None
    zero = imp.scalar(0, dtype)
    pos = imp.add(Node(imp.fresh("lt"), "Lt", (zero, xn.name), (), "bool", shape))
    neg = imp.add(Node(imp.fresh("lt"), "Lt", (xn.name, zero), (), "bool", shape))
    return imp.add(
        Node(node.name, "Sub", (imp.cast(pos, dtype), imp.cast(neg, dtype)), (), dtype, shape),
        node.name,
    )


def _h_isnan(imp: Importer, node: torch.fx.Node):
    """isnan(x) = x != x: true for every NaN and nothing else (integers: never)."""
    xn = imp.g.nodes[imp.env[node.args[0].name]]
    if xn.dtype not in ot.FLOATS:
        return None
    _, shape = tensor_type(node)
    return imp.add(Node(node.name, "Ne", (xn.name, xn.name), (), "bool", shape), node.name)


def _h_elu(imp: Importer, node: torch.fx.Node):
    """elu(x, alpha, scale, input_scale) as PyTorch's CPU kernel computes it: x <= 0 ?
    expm1(x * input_scale) * (alpha * scale) : x * scale, the coefficient product taken in
    the op's compute type (float32 for float32 and the half types). NaN takes the second
    branch (NaN); -0.0 the first (expm1(-0.0) = -0.0)."""
    args = list(node.args) + [None] * 3
    x = node.args[0]
    alpha, scale, iscale = (v if v is not None else 1.0 for v in args[1:4])
    xn = imp.g.nodes[imp.env[x.name]]
    dtype, shape = tensor_type(node)
    if node.kwargs or dtype != xn.dtype or dtype not in ot.FLOATS:
        return None
    if not all(type(v) in (int, float) for v in (alpha, scale, iscale)):
        return None
    op_t = np.float64 if dtype == "f64" else np.float32
    negcoef = float(op_t(alpha) * op_t(scale))
    zero = imp.scalar(0, dtype)
    le = imp.add(Node(imp.fresh("le"), "Le", (xn.name, zero), (), "bool", shape))
    inner = ew_node(imp, "Mul", (xn.name, float(op_t(iscale))), dtype, shape)
    em1 = imp.add(Node(imp.fresh("expm1"), "Expm1", (inner,), (), dtype, shape))
    neg = ew_node(imp, "Mul", (em1, negcoef), dtype, shape)
    pos = ew_node(imp, "Mul", (xn.name, float(op_t(scale))), dtype, shape)
    return imp.add(Node(node.name, "Where", (le, neg, pos), (), dtype, shape), node.name)


def _h_clone(imp: Importer, node: torch.fx.Node):
    if node.kwargs.get("memory_format") not in (
        None,
        torch.contiguous_format,
        torch.preserve_format,
    ):
        return None
    dtype, shape = tensor_type(node)
    x = imp.env[node.args[0].name]
    return imp.add(Node(node.name, "Cast", (x,), (dtype,), dtype, shape), node.name)


def _h_to_copy(imp: Importer, node: torch.fx.Node):
    allowed = {"dtype", "device", "layout", "memory_format", "pin_memory"}
    if set(node.kwargs) - allowed or len(node.args) != 1:
        return None
    src = fake_value(node.args[0])
    val = fake_value(node)
    if val.device != src.device or node.kwargs.get("memory_format") not in (
        None,
        torch.preserve_format,
        torch.contiguous_format,
    ):
        return None
    dtype, shape = tensor_type(node)
    return imp.add(
        Node(node.name, "Cast", (imp.env[node.args[0].name],), (dtype,), dtype, shape), node.name
    )


def _h_alias(imp: Importer, node: torch.fx.Node):
    """alias(x) is x: in a functional graph the same value."""
    return imp.env[node.args[0].name]


def _h_scalar_tensor(imp: Importer, node: torch.fx.Node):
    """scalar_tensor(v): a rank-0 tensor holding v, in the result's dtype."""
    value = node.args[0]
    if not isinstance(value, int | float | bool):
        return None
    dtype, shape = tensor_type(node)
    if shape != () or dtype not in ot.FLOATS + ot.INTS:
        return None
    c = imp.scalar(value, dtype)
    return imp.add(Node(node.name, "Expand", (c,), ((),), dtype, ()), node.name)


handles(
    {
        "aten.logical_not.default": _h_logical_not,
        "aten.add.Tensor": _h_binary_alpha("Add"),
        "aten.add.Scalar": _h_binary_alpha("Add"),
        "aten.sub.Tensor": _h_binary_alpha("Sub"),
        "aten.sub.Scalar": _h_binary_alpha("Sub"),
        "aten.rsub.Scalar": _h_rsub,
        "aten.rsub.Tensor": _h_rsub,
        "aten.gelu.default": _h_gelu,
        "aten.clone.default": _h_clone,
        "aten.lift_fresh_copy.default": _h_clone,  # a copy of a tensor constant
        "aten.logical_and.default": _h_logical("and", False),
        "aten.logical_or.default": _h_logical("or", False),
        "aten.bitwise_and.Tensor": _h_logical("and", True),
        "aten.bitwise_or.Tensor": _h_logical("or", True),
        "aten.bitwise_not.default": _h_bitwise_not,
        "aten.clamp.default": _h_clamp("clamp"),
        "aten.hardtanh.default": _h_hardtanh,
        "aten.sign.default": _h_sign,
        "aten.isnan.default": _h_isnan,
        "aten.elu.default": _h_elu,
        "aten.clamp_min.default": _h_clamp("min"),
        "aten.clamp_max.default": _h_clamp("max"),
        "aten.alias.default": _h_alias,
        "aten.scalar_tensor.default": _h_scalar_tensor,
        "aten._to_copy.default": _h_to_copy,
        "aten.div.Tensor_mode": _h_div_mode,
        "aten.div.Scalar_mode": _h_div_mode,
        "aten.pow.Tensor_Scalar": _h_pow,
        "aten.pow.Scalar": _h_pow,
        "aten.copy.default": _h_copy,
        **{
            f"aten._foreach_{kind}.{overload}": _h_foreach(kind)
            for kind, overloads in _FOREACH.items()
            for overload in overloads
        },
    }
)
