"""Importer handlers for reductions and row ops: sums, means, extremes, variance,
arg-extremes, ``any``, ``cumsum`` (a masked sum), softmax and the layer, batch and group norms.
"""

from __future__ import annotations

import math

import torch
import torch.fx

from saturn.eqsat import optable as ot
from saturn.eqsat.graph import Node, float_bits

from .import_core import MARKERS, Importer, fake_value, handles, tensor_type
from .import_elementwise import ew_node
from .import_library import only_first_result_used


def _dims(node: torch.fx.Node, rank: int, dims) -> tuple[int, ...]:
    if dims is None or dims == []:
        return tuple(range(rank))
    if isinstance(dims, int):
        dims = [dims]
    return tuple(d % rank if rank else 0 for d in dims)


def _reduction(imp, op: str, xn: Node, axes, keepdim, attrs, dtype: str, shape, name: str) -> str:
    """``op`` over ``axes`` of ``xn`` (its attributes ``attrs(axes, keepdim)`` beyond the
    operand), named ``name``. Axes that are not one run (``x.sum((0, 2))``) are the
    lowering's to permute (``eqsat/program.py: _adjacent_axes``), for text graphs too."""
    axes = tuple(sorted(axes))
    return imp.add(Node(name, op, (xn.name,), attrs(axes, int(bool(keepdim))), dtype, shape), name)


def _h_reduce(row_name: str):
    def h(imp: Importer, node: torch.fx.Node):
        x = node.args[0]
        xn = imp.g.nodes[imp.env[x.name]]
        dims = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim")
        keepdim = node.args[2] if len(node.args) > 2 else node.kwargs.get("keepdim", False)
        if node.kwargs.get("dtype") is not None:
            return None
        if not xn.shape:
            return None
        dtype, shape = tensor_type(node)
        axes = _dims(node, len(xn.shape), dims)
        return _reduction(
            imp, row_name, xn, axes, keepdim, lambda a, k: (a, k), dtype, shape, node.name
        )

    return h


def _h_reduce_all(row_name: str):
    """sum(x) and mean(x) over every axis (a loss's ``.mean()``, ``.sum()``): one
    reduction over all of x's axes to a scalar."""

    def h(imp: Importer, node: torch.fx.Node):
        if node.kwargs.get("dtype") is not None:
            return None
        xn = imp.g.nodes[imp.env[node.args[0].name]]
        if not xn.shape:
            return None
        dtype, shape = tensor_type(node)
        axes = (tuple(range(len(xn.shape))), 0)
        return imp.add(Node(node.name, row_name, (xn.name,), axes, dtype, shape), node.name)

    return h


def _h_var(imp: Importer, node: torch.fx.Node):
    xn = imp.g.nodes[imp.env[node.args[0].name]]
    dims = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim")
    corr = node.kwargs.get("correction", 1)
    keepdim = node.kwargs.get("keepdim", False)
    if not isinstance(corr, int | float) or int(corr) != corr or not xn.shape:
        return None
    dtype, shape = tensor_type(node)
    axes = _dims(node, len(xn.shape), dims)
    count = math.prod(xn.shape[d] for d in axes)
    if corr != 0 and dtype in ot.WIDE_FLOATS and all(xn.shape[d] < min(MARKERS) for d in axes):
        # sum((x - mean)^2) / max(N - correction, 0), PyTorch's definition (its divisor is
        # clamped at 0, so too few elements give inf or NaN, as here); the e-graph's Var
        # holds no element count, so a corrected variance is written out where N is known
        mshape = tuple(1 if d in axes else n for d, n in enumerate(xn.shape))
        mean = _reduction(
            imp, "Mean", xn, axes, True, lambda a, k: (a, k), dtype, mshape, imp.fresh("vmean")
        )
        c = ew_node(imp, "Sub", (xn.name, mean), dtype, xn.shape)
        sq = imp.g.nodes[ew_node(imp, "Mul", (c, c), dtype, xn.shape)]
        total = _reduction(
            imp, "Sum", sq, axes, keepdim, lambda a, k: (a, k), dtype, shape, imp.fresh("vsum")
        )
        out = ew_node(imp, "Div", (total, float(max(count - int(corr), 0))), dtype, shape)
        imp.fx_names[out] = node.name
        return out
    return _reduction(
        imp, "Var", xn, axes, keepdim, lambda a, k: (a, int(corr), k), dtype, shape, node.name
    )


def _h_softmax(row_name: str):
    def h(imp: Importer, node: torch.fx.Node):
        x, dim, half_to_float = node.args
        if half_to_float:
            return None
        xn = imp.g.nodes[imp.env[x.name]]
        dtype, shape = tensor_type(node)
        return imp.add(
            Node(node.name, row_name, (xn.name,), (dim % max(len(xn.shape), 1),), dtype, shape),
            node.name,
        )

    return h


def _h_layer_norm(imp: Importer, node: torch.fx.Node):
    """native_layer_norm(x, shape, w, b, eps) -> (y, mean, rstd). y is a LayerNorm node. When
    mean or rstd is read too (a training forward saves them for the backward), they are
    ``Mean(x)`` and ``Rsqrt(Var(x, correction 0) + eps)`` over the normalized dims, kept,
    exactly PyTorch's definitions (biased variance); the layer norm's decomposition builds
    the same terms, so the e-graph shares them. A half input whose statistics PyTorch keeps
    in float32 (CUDA's layer norm: Welford in float32) gets them from x widened (exact), in
    float32; other dtype pairs are declined. A missing weight or bias
    is the scalar 1 or -0.0: ``y * 1`` and ``y + -0.0`` are y for every y (both zeros and
    NaN included; ``+0.0`` would turn a -0.0 into +0.0)."""
    x, normalized, w, b, eps = node.args
    xn = imp.g.nodes[imp.env[x.name]]
    rank = len(xn.shape)
    dims = tuple(range(rank - len(normalized), rank))
    dtype, shape = tensor_type(node, fake_value(node)[0])
    extra = not only_first_result_used(node)
    stat = dtype  # the statistics' dtype
    if extra:
        stats = [tensor_type(node, v) for v in fake_value(node)[1:]]
        stat = stats[0][0]
        wide = dtype in ot.HALVES and stat == "f32"
        if dtype not in ot.FLOATS or any(d != stat for d, _ in stats):
            return None
        if stat != dtype and not wide:
            return None
    wn = imp.scalar(1.0, dtype) if w is None else imp.env[w.name]
    bn = imp.scalar(-0.0, dtype) if b is None else imp.env[b.name]
    y = imp.add(
        Node(
            node.name,
            "LayerNorm",
            (xn.name, wn, bn),
            (dims, float_bits(eps)),
            dtype,
            shape,
        ),
        node.name,
    )
    if extra:
        (_, mshape), (_, rshape) = stats
        src = xn.name
        if stat != dtype:  # widened: exact
            src = imp.add(Node(imp.fresh("ln_wide"), "Cast", (src,), (stat,), stat, xn.shape))
        mean = imp.add(Node(imp.fresh("ln_mean"), "Mean", (src,), (dims, 1), stat, mshape))
        var = imp.add(Node(imp.fresh("ln_var"), "Var", (src,), (dims, 0, 1), stat, rshape))
        shifted = imp.add(
            Node(imp.fresh("ln_var_eps"), "Add", (var, imp.scalar(eps, stat)), (), stat, rshape)
        )
        rstd = imp.add(Node(imp.fresh("ln_rstd"), "Rsqrt", (shifted,), (), stat, rshape))
        imp.results[node.name] = (y, mean, rstd)
    return y


def _h_batch_norm(imp: Importer, node: torch.fx.Node):
    x, w, b, rm, rv, _momentum, eps = node.args
    if not only_first_result_used(node):
        return None
    xn = imp.g.nodes[imp.env[x.name]]
    if len(xn.shape) < 2:
        return None
    c = xn.shape[1]
    tail = (c,) + (1,) * (len(xn.shape) - 2)
    views = []
    for t, missing in ((w, 1.0), (b, -0.0), (rm, None), (rv, None)):
        if t is None:  # no affine weight or bias (running statistics are never missing
            # here): the exact identities, as in layer norm
            views.append(imp.scalar(missing, xn.dtype))
            continue
        tn = imp.g.nodes[imp.env[t.name]]
        views.append(
            imp.add(Node(imp.fresh("bnview"), "View", (tn.name,), (tail,), tn.dtype, tail))
        )
    dtype, shape = tensor_type(node, fake_value(node)[0])
    return imp.add(
        Node(node.name, "BatchNormInf", (xn.name, *views), (float_bits(eps),), dtype, shape),
        node.name,
    )


def _h_group_norm(imp: Importer, node: torch.fx.Node):
    """native_group_norm(x, w, b, N, C, HxW, G, eps), only its output read: x viewed as
    [N, G, C/G * HxW], a layer norm without affine over the last axis (PyTorch's statistics:
    biased variance per group), viewed back, times w and plus b per channel. float32 and
    float64 (PyTorch computes a half group norm in float32 and rounds once; written out,
    each op would round)."""
    x, w, b, n, c, hw, groups, eps = node.args
    xn = imp.g.nodes[imp.env[x.name]]
    dtype, shape = tensor_type(node, fake_value(node)[0])
    if not only_first_result_used(node) or dtype not in ot.WIDE_FLOATS or len(xn.shape) < 2:
        return None
    if not all(type(v) is int for v in (n, c, hw, groups)) or c % groups:
        return None
    grouped = (n, groups, (c // groups) * hw)
    v = imp.add(Node(imp.fresh("gn_view"), "View", (xn.name,), (grouped,), dtype, grouped))
    one, nzero = imp.scalar(1.0, dtype), imp.scalar(-0.0, dtype)
    y = imp.add(
        Node(imp.fresh("gn"), "LayerNorm", (v, one, nzero), ((2,), float_bits(eps)), dtype, grouped)
    )
    out = imp.add(Node(imp.fresh("gn_back"), "View", (y,), (shape,), dtype, shape))
    tail = (c,) + (1,) * (len(shape) - 2)
    for t, op in ((w, "Mul"), (b, "Add")):
        if t is not None:
            tn = imp.g.nodes[imp.env[t.name]]
            tv = imp.add(Node(imp.fresh("gn_param"), "View", (tn.name,), (tail,), tn.dtype, tail))
            out = imp.add(Node(imp.fresh(op.lower()), op, (out, tv), (), dtype, shape))
    imp.fx_names[out] = node.name
    return out


def _above_neg_inf(imp: Importer, xn: Node) -> str | None:
    """``y`` where node ``xn`` is ``y != -inf`` (or ``logical_not(y == -inf)``) of a float
    ``y`` of the same shape, else None."""

    def neg_inf(name: str, dtype: str) -> bool:
        n = imp.g.nodes[name]
        return n.op == "Scalar" and n.attrs == (float_bits(float("-inf")), dtype)

    if xn.op == "Eq" and imp.g.nodes[xn.args[1]].op == "Scalar":
        if imp.g.nodes[xn.args[1]].attrs != (0, "bool"):
            return None
        xn = imp.g.nodes[xn.args[0]]  # logical_not(m) = (m == false)
        if xn.op != "Eq":
            return None
    elif xn.op != "Ne":
        return None
    y, c = xn.args
    yn = imp.g.nodes[y]
    ok = yn.dtype in ot.FLOATS and yn.shape == xn.shape and neg_inf(c, yn.dtype)
    return y if ok else None


def _h_argext(kind: str):
    """argmax/argmin(x, dim, keepdim): the first index holding the row's extreme, NaN
    counting as the extreme (PyTorch returns the first NaN's index). Written as the
    extreme m (Amax/Amin, NaN-propagating), the positions where x == m or x is NaN (with a
    NaN in the row, m is NaN and only NaN positions match; without, no position is NaN),
    their indices (others n), and the least of them. Ties (both zeros included) give the
    first index, as PyTorch's strict comparison does."""
    ext = "Amax" if kind == "max" else "Amin"

    def handler(imp: Importer, node: torch.fx.Node):
        xn = imp.g.nodes[imp.env[node.args[0].name]]
        args = list(node.args) + [None] * 2
        dim = args[1] if args[1] is not None else node.kwargs.get("dim")
        keepdim = bool(args[2] if args[2] is not None else node.kwargs.get("keepdim", False))
        dtype, shape = tensor_type(node)
        if xn.dtype not in ot.DEVICE_NUMERIC or dtype != "i64" or not xn.shape:
            return None
        x = xn.name
        if dim is None:
            if keepdim:
                return None
            flat = (math.prod(xn.shape),)
            x = imp.add(Node(imp.fresh("arg_flat"), "View", (x,), (flat,), xn.dtype, flat))
            xshape, d = flat, 0
        else:
            xshape, d = xn.shape, dim % len(xn.shape)
        n = xshape[d]
        if n <= 0 or n >= min(MARKERS):
            return None
        kept = tuple(1 if e == d else v for e, v in enumerate(xshape))
        m = imp.add(Node(imp.fresh("arg_ext"), ext, (x,), ((d,), 1), xn.dtype, kept))
        hit = imp.add(Node(imp.fresh("arg_hit"), "Eq", (x, m), (), "bool", xshape))
        if xn.dtype in ot.FLOATS:
            nan = imp.add(Node(imp.fresh("arg_nan"), "Ne", (x, x), (), "bool", xshape))
            hit = imp.add(
                Node(
                    imp.fresh("arg_pick"),
                    "Where",
                    (hit, imp.scalar(True, "bool"), nan),
                    (),
                    "bool",
                    xshape,
                )
            )
        at = tuple(n if e == d else 1 for e in range(len(xshape)))
        iota = imp.add(Node(imp.fresh("arg_iota"), "Arange", (), (0, 1, n, "i64"), "i64", (n,)))
        iota = imp.add(Node(imp.fresh("arg_iota_view"), "View", (iota,), (at,), "i64", at))
        idx = imp.add(
            Node(
                imp.fresh("arg_idx"), "Where", (hit, iota, imp.scalar(n, "i64")), (), "i64", xshape
            )
        )
        return imp.add(
            Node(node.name, "Amin", (idx,), ((d,), int(keepdim)), "i64", shape), node.name
        )

    return handler


def _h_any(imp: Importer, node: torch.fx.Node):
    """any(x, dims, keepdim) over booleans = (number of trues > 0), the count an int64 Sum
    (exact: no reduction holds 2^63 elements). Other dtypes are declined."""
    xn = imp.g.nodes[imp.env[node.args[0].name]]
    if xn.dtype != "bool" or not xn.shape:
        return None
    dims = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim")
    keepdim = node.args[2] if len(node.args) > 2 else node.kwargs.get("keepdim", False)
    dtype, shape = tensor_type(node)
    reduced = _dims(node, len(xn.shape), dims)
    y = _above_neg_inf(imp, xn)
    if y is not None and all(xn.shape[d] > 0 for d in reduced):
        # any(y != -inf) = (max(y) != -inf) over a non-empty axis: a row all -inf has max
        # -inf; any other element (finite, +inf, NaN) makes the max above -inf or NaN
        # (max propagates NaN, and NaN != -inf), as it makes the any true. This is the
        # mask of PyTorch's safe softmax, whose own max (of the same row) then gives it.
        yn = imp.g.nodes[y]
        top = imp.add(
            Node(imp.fresh("any_max"), "Amax", (y,), (reduced, int(bool(keepdim))), yn.dtype, shape)
        )
        ninf = imp.scalar(float("-inf"), yn.dtype)
        return imp.add(Node(node.name, "Ne", (top, ninf), (), dtype, shape), node.name)
    count = imp.add(
        Node(
            imp.fresh("any_count"),
            "Sum",
            (xn.name,),
            (_dims(node, len(xn.shape), dims), int(bool(keepdim))),
            "i64",
            shape,
        )
    )
    return imp.add(
        Node(node.name, "Gt", (count, imp.scalar(0, "i64")), (), dtype, shape), node.name
    )


CUMSUM_MAX_LENGTH = 4096  # longest axis scanned as a masked sum (work grows with its square)


CUMSUM_MAX_TERMS = 1 << 26  # elements x axis length, the masked sum's terms


def _h_cumsum(imp: Importer, node: torch.fx.Node):
    """cumsum (position ids from a padding mask, integer or float as OPT's; the mask
    functions' packed-sequence check): ``out[..., j] = sum(x[..., k] for k <= j)``, a masked
    sum over a (j, k) grid of the axis moved last. Integers sum in int64 and wrap to the
    result's dtype the same in any order: PyTorch's bits. Floats sum in PyTorch's CPU
    accumulator: float64 for float32 and float64 (its CUDA kernel scans float32 in
    float32), where the sum of an axis in another order is within float64 rounding of the
    running one, so a float32 result is PyTorch's CPU value but for a rounding tie and
    float64 agrees to its last bits; float32 for the half types (as both of PyTorch's
    kernels), rounded to the half type at the end, where a sum in another order can round
    differently in float32 and, where a running sum passes float32's largest value,
    overflow at another position. NaN, infinities and zeros as the running sum (the
    masked-out terms are +0.0, PyTorch's running sum starts at +0.0). Axes too long for a
    quadratic sum stay PyTorch's op."""
    x, dim = node.args[0], node.args[1] if len(node.args) > 1 else node.kwargs.get("dim")
    xn = imp.g.nodes[imp.env[x.name]]
    dtype, shape = tensor_type(node)
    if type(dim) is not int or xn.dtype not in (*ot.INTS, *ot.FLOATS, "bool"):
        return None
    if dtype not in ot.INTS and not (dtype in ot.FLOATS and xn.dtype in ot.FLOATS):
        return None
    if not xn.shape:
        return None
    rank = len(xn.shape)
    dim %= rank
    n = xn.shape[dim]
    if n in MARKERS or n > CUMSUM_MAX_LENGTH or math.prod(xn.shape) * n > CUMSUM_MAX_TERMS:
        return None
    if n <= 1:
        return imp.add(Node(node.name, "Cast", (xn.name,), (dtype,), dtype, shape), node.name)
    perm = (*(d for d in range(rank) if d != dim), dim)
    # an integer Sum is int64 (as PyTorch's), the result's dtype wraps the same; floats sum
    # in PyTorch's CPU accumulator
    acc = "i64" if dtype in ot.INTS else "f32" if dtype in ot.HALVES else "f64"
    cur = imp.cast(xn.name, acc)
    moved = tuple(xn.shape[d] for d in perm)
    if dim != rank - 1:
        cur = imp.add(Node(imp.fresh("scan_last"), "Permute", (cur,), (perm,), acc, moved))
    row = (*moved[:-1], 1, n)  # each row once per output position j
    cur = imp.add(Node(imp.fresh("scan_row"), "View", (cur,), (row,), acc, row))
    j = imp.add(Node(imp.fresh("scan_j"), "Arange", (), (0, 1, n, "i64"), "i64", (n,)))
    j = imp.add(Node(imp.fresh("scan_jv"), "View", (j,), ((n, 1),), "i64", (n, 1)))
    k = imp.add(Node(imp.fresh("scan_k"), "Arange", (), (0, 1, n, "i64"), "i64", (n,)))
    upto = imp.add(Node(imp.fresh("scan_upto"), "Le", (k, j), (), "bool", (n, n)))
    grid = (*moved[:-1], n, n)
    zero = imp.scalar(0, acc)
    terms = imp.add(Node(imp.fresh("scan_terms"), "Where", (upto, cur, zero), (), acc, grid))
    last = dim == rank - 1 and dtype == acc
    name = node.name if last else imp.fresh("scan_sum")
    total = imp.add(Node(name, "Sum", (terms,), ((rank,), 0), acc, moved), name if last else None)
    if last:
        return total
    if dim != rank - 1:
        back = tuple(perm.index(d) for d in range(rank))
        total = imp.add(Node(imp.fresh("scan_back"), "Permute", (total,), (back,), acc, shape))
    return imp.add(Node(node.name, "Cast", (total,), (dtype,), dtype, shape), node.name)


handles(
    {
        "aten.any.dim": _h_any,
        "aten.any.dims": _h_any,
        "aten.sum.dim_IntList": _h_reduce("Sum"),
        "aten.sum.default": _h_reduce_all("Sum"),
        "aten.mean.dim": _h_reduce("Mean"),
        "aten.mean.default": _h_reduce_all("Mean"),
        "aten.amax.default": _h_reduce("Amax"),
        "aten.argmax.default": _h_argext("max"),
        "aten.argmin.default": _h_argext("min"),
        "aten.amin.default": _h_reduce("Amin"),
        "aten.var.correction": _h_var,
        "aten._softmax.default": _h_softmax("Softmax"),
        "aten._log_softmax.default": _h_softmax("LogSoftmax"),
        "aten.native_layer_norm.default": _h_layer_norm,
        "aten._native_batch_norm_legit_no_training.default": _h_batch_norm,
        "aten.native_group_norm.default": _h_group_norm,
        "aten.cumsum.default": _h_cumsum,
    }
)
