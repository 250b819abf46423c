"""Importer handlers for the ops that become library calls or windows: matrix products
(``mm``, ``bmm``, ``addmm``), convolution, and max and average pooling (as library calls or
as slices folded with ``Maximum``/``Add``).
"""

from __future__ import annotations

import math
import operator

import torch
import torch.fx

from saturn.eqsat import optable as ot
from saturn.eqsat.graph import Node, float_bits

from .import_core import MARKERS, Importer, fake_value, handles, tensor_type


def _h_matmul(row_name: str):
    def h(imp: Importer, node: torch.fx.Node):
        dtype, shape = tensor_type(node)
        args = [imp.env[a.name] for a in node.args[:2]]
        if any(imp.g.nodes[a].dtype != dtype for a in args):
            return None
        return imp.add(Node(node.name, row_name, args, (), dtype, shape), node.name)

    return h


def _h_addmm(imp: Importer, node: torch.fx.Node):
    if node.kwargs.get("beta", 1) != 1 or node.kwargs.get("alpha", 1) != 1:
        return None  # the epilogue would ignore alpha and beta
    dtype, shape = tensor_type(node)
    args = [imp.env[a.name] for a in node.args[:3]]
    return imp.add(Node(node.name, "Addmm", tuple(args), (), dtype, shape), node.name)


def only_first_result_used(node: torch.fx.Node) -> bool:
    return all(u.target is operator.getitem and u.args[1] == 0 for u in node.users)


def _pool_windows(imp: Importer, x: str, kernel, stride, padding, ceil_mode, out) -> str | None:
    """The windows of a 2-D pool that tile the image (stride = kernel, no padding, floor
    mode) as ``[N, C, Ho, Wo, kh, kw]`` views: the image cut to whole windows, viewed with
    the window split out, the window's axes permuted last (the GPU's reductions take
    adjacent axes). None for any other pool (overlapping or padded windows)."""
    kernel, stride, padding = ([*v] * 2 if len(v) == 1 else [*v] for v in (kernel, stride, padding))
    xn = imp.g.nodes[x]
    if len(xn.shape) != 4 or stride != kernel or any(padding) or ceil_mode:
        return None
    n, c, h, w = xn.shape
    (kh, kw), dtype = kernel, xn.dtype
    ho, wo = h // kh, w // kw
    if out != (n, c, ho, wo) or ho == 0 or wo == 0:
        return None
    cut, extent = xn.name, [n, c, h, w]
    for dim, whole in ((2, ho * kh), (3, wo * kw)):  # floor mode: the partial windows go
        if whole != extent[dim]:
            extent[dim] = whole
            cut = imp.add(
                Node(
                    imp.fresh("pool_cut"), "Slice", (cut,), (dim, 0, whole, 1), dtype, tuple(extent)
                )
            )
    windows = (n, c, ho, kh, wo, kw)
    view = imp.add(Node(imp.fresh("pool_windows"), "View", (cut,), (windows,), dtype, windows))
    last = (n, c, ho, wo, kh, kw)
    return imp.add(
        Node(imp.fresh("pool_perm"), "Permute", (view,), ((0, 1, 2, 4, 3, 5),), dtype, last)
    )


def _h_max_pool2d(imp: Importer, node: torch.fx.Node):
    """max_pool2d over windows that tile the image, read only for its values (inference):
    the maximum over each window (``_pool_windows``). NaN propagates as in PyTorch's
    pooling; where a window's maximum is a zero held as both -0.0 and +0.0 the sign may
    differ (PyTorch keeps the first; a reduction's order is its own). Overlapping, padded
    or dilated windows: a maximum of strided slices (``_pool_slices``). The indices (a
    training forward's) are declined. Ceil mode's last, partial windows read -inf past the
    image's end, which never wins a maximum (every window holds an element of the image or
    of its padding, PyTorch's output size rule)."""
    x, kernel = node.args[0], list(node.args[1])
    rest = list(node.args[2:]) + [None] * 4
    stride = list(rest[0]) if rest[0] else kernel
    padding = list(rest[1]) if rest[1] is not None else [0]
    dilation = list(rest[2]) if rest[2] is not None else [1]
    ceil_mode = bool(rest[3]) if rest[3] is not None else False
    if node.kwargs or not only_first_result_used(node):
        return None
    dtype, shape = tensor_type(node, fake_value(node)[0])
    win = None
    if all(d == 1 for d in dilation):
        win = _pool_windows(imp, imp.env[x.name], kernel, stride, padding, ceil_mode, shape)
    if win is None:
        x = imp.env[x.name]
        return _pool_slices(
            imp, "max", node.name, x, kernel, stride, padding, dilation, shape, ceil_mode
        )
    return imp.add(Node(node.name, "Amax", (win,), ((4, 5), 0), dtype, shape), node.name)


POOL_WINDOW_LIMIT = 64  # most window elements a pool reads per output as separate slices


# kind -> (pad value, fold op): a padded element never wins a maximum and adds nothing
_POOL_FOLDS = {"max": (float("-inf"), "Maximum"), "avg": (0.0, "Add")}


def _pair(v) -> list[int]:
    return [*v] * 2 if len(v) == 1 else [*v]


def _pool_slices(imp, kind: str, name, x, kernel, stride, padding, dilation, out, ceil=False):
    """A 2-D pool whose windows overlap, are padded or dilated: the image padded (-inf for
    a max, zeros for an average that counts the padding, as PyTorch's pooling pads), one
    strided Slice per window position, and the positions folded in row-major order by
    ``Maximum`` (NaN-propagating) or ``Add`` then divided by the window's size: one fused
    loop. Floor mode only (every window inside the padded image, so every window holds an
    element of the image and an average's divisor is the window's size). Where a max
    window's maximum is a zero held as both -0.0 and +0.0 the sign may differ, as in
    ``_h_max_pool2d``; an average sums in float32 where PyTorch's CPU kernel sums in
    float64 (within float32's rounding)."""
    kernel, stride, padding, dilation = map(_pair, (kernel, stride, padding, dilation))
    xn = imp.g.nodes[x]
    dtype = xn.dtype
    if len(xn.shape) != 4 or dtype not in ot.FLOATS or len(out) != 4:
        return None
    if math.prod(kernel) > POOL_WINDOW_LIMIT or any(n >= min(MARKERS) for n in xn.shape):
        return None
    (kh, kw), (sh, sw), (ph, pw), (dh, dw) = kernel, stride, padding, dilation
    n, c, ho, wo = out = tuple(out)
    h, w = xn.shape[2] + 2 * ph, xn.shape[3] + 2 * pw
    # ceil mode (max only): the last windows may run past the padded image; pad its end
    # with the fill so they fit (a max's fill never wins)
    eh = max(0, (kh - 1) * dh + sh * (ho - 1) + 1 - h) if ceil and kind == "max" else 0
    ew = max(0, (kw - 1) * dw + sw * (wo - 1) + 1 - w) if ceil and kind == "max" else 0
    if ceil and (
        kind != "max" or sh * (ho - 1) >= xn.shape[2] + ph or sw * (wo - 1) >= xn.shape[3] + pw
    ):
        return None  # a window holding only padding: PyTorch's output size never has one
    h, w = h + eh, w + ew
    if ho <= 0 or wo <= 0 or (kh - 1) * dh + sh * (ho - 1) >= h:
        return None
    if (kw - 1) * dw + sw * (wo - 1) >= w:
        return None
    fill, fold = _POOL_FOLDS[kind]
    src = x
    if ph or pw or eh or ew:
        attrs = ((0, 0, 0, 0, ph, ph + eh, pw, pw + ew), float_bits(fill))
        src = imp.add(Node(imp.fresh("pool_pad"), "Pad", (x,), attrs, dtype, (n, c, h, w)))
    slices = []
    for i in range(kh):
        for j in range(kw):
            r0, c0 = i * dh, j * dw
            rows = (2, r0, r0 + sh * (ho - 1) + 1, sh)
            r = imp.add(Node(imp.fresh("pool_rows"), "Slice", (src,), rows, dtype, (n, c, ho, w)))
            cols = (3, c0, c0 + sw * (wo - 1) + 1, sw)
            slices.append(imp.add(Node(imp.fresh("pool_at"), "Slice", (r,), cols, dtype, out)))
    if len(slices) == 1:  # a 1x1 window: the strided slice itself
        if kind == "max":
            return imp.add(Node(name, "View", (slices[0],), (out,), dtype, out), name)
    acc = slices[0]
    for k, at in enumerate(slices[1:], 2):
        last = kind == "max" and k == len(slices)  # the result itself: no View after it
        node = Node(name if last else imp.fresh("pool"), fold, (acc, at), (), dtype, out)
        acc = imp.add(node, name if last else None)
    if kind == "avg":
        size = imp.scalar(float(kh * kw), dtype)
        return imp.add(Node(name, "Div", (acc, size), (), dtype, out), name)
    return acc


def _h_avg_pool2d(imp: Importer, node: torch.fx.Node):
    """avg_pool2d over windows that tile the image: the mean of each window. Overlapping or
    padded windows (padding counted, PyTorch's default): a sum of strided slices divided
    by the window's size (``_pool_slices``). A divisor override, ceil mode and padding
    left out of the count are declined. NaN and infinities as in PyTorch's pooling (a sum
    of the window, divided)."""
    x, kernel = node.args[0], list(node.args[1])
    rest = list(node.args[2:]) + [None] * 5
    stride = list(rest[0]) if rest[0] else kernel
    padding = list(rest[1]) if rest[1] is not None else [0]
    ceil_mode = bool(rest[2]) if rest[2] is not None else False
    if node.kwargs or rest[4] is not None:  # divisor_override
        return None
    dtype, shape = tensor_type(node)
    if dtype not in ot.FLOATS:
        return None
    win = _pool_windows(imp, imp.env[x.name], kernel, stride, padding, ceil_mode, shape)
    if win is None:
        include_pad = rest[3] is None or bool(rest[3])
        if ceil_mode or (any(padding) and not include_pad):
            return None  # partial windows, or a divisor that counts only the image
        x = imp.env[x.name]
        return _pool_slices(imp, "avg", node.name, x, kernel, stride, padding, [1], shape)
    return imp.add(Node(node.name, "Mean", (win,), ((4, 5), 0), dtype, shape), node.name)


def _h_convolution(imp: Importer, node: torch.fx.Node):
    """A 2-D convolution. A half one with a bias on a GPU target is the product rounded to
    the half type, plus the bias, rounded again: how eager CUDA computes it (cuDNN's
    convolution, then an add), so the add is an elementwise op that fuses."""
    x, w, b, stride, padding, dilation, transposed, _out_pad, groups = node.args
    if transposed or len(stride) != 2:
        return None
    dtype, shape = tensor_type(node)
    attrs = (tuple(stride), tuple(padding), tuple(dilation), int(groups))
    if b is None or (imp.gpu and dtype in ot.HALVES):
        name = node.name if b is None else imp.fresh("conv")
        conv = imp.add(
            Node(name, "Conv2dNoBias", (imp.env[x.name], imp.env[w.name]), attrs, dtype, shape),
            name if b is None else None,
        )
        if b is None:
            return conv
        bn = imp.g.nodes[imp.env[b.name]]
        tail = (shape[1],) + (1,) * (len(shape) - 2)
        bias = imp.add(Node(imp.fresh("conv_bias"), "View", (bn.name,), (tail,), bn.dtype, tail))
        return imp.add(Node(node.name, "Add", (conv, bias), (), dtype, shape), node.name)
    return imp.add(
        Node(
            node.name,
            "Conv2d",
            (imp.env[x.name], imp.env[w.name], imp.env[b.name]),
            attrs,
            dtype,
            shape,
        ),
        node.name,
    )


handles(
    {
        "aten.mm.default": _h_matmul("MatMul"),
        "aten.bmm.default": _h_matmul("BatchMatMul"),
        "aten.addmm.default": _h_addmm,
        "aten.convolution.default": _h_convolution,
        "aten.max_pool2d_with_indices.default": _h_max_pool2d,
        "aten.avg_pool2d.default": _h_avg_pool2d,
    }
)
