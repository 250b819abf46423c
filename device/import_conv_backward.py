"""Importer handler for ``convolution_backward`` (a training graph's). On a GPU target the
input's and the weight's gradients are the ops ``ConvInputGrad`` and ``ConvWeightGrad``
(cuDNN's backward-data and backward-filter, as eager CUDA runs them; decision 0125). For
saturn:0, each gradient in terms the device already runs, so no convolution's backward
crosses to the host:

- The input's gradient is a convolution: the output's gradient spread by the stride (zeros
  between its rows and columns), padded by the kernel's extent less the padding, with the
  weight's channels swapped and its window flipped (one take of its elements), at the
  forward's dilation and stride 1.
- The weight's gradient is one matrix product per group (a batch of them): the output's
  gradient, channels by (batch, rows, columns), times the input's windows (one strided
  slice of the padded input per kernel position), (batch, rows, columns) by (channels,
  kernel positions). Where that product has few output tiles (float32 and float64), one
  product per image and group instead, summed over the images; for a depthwise
  convolution, one reduction of the gradient times the windows (decision 0123).
- The bias's gradient is the output's gradient summed over batch, rows and columns.

2-D convolutions, grouped and depthwise too; transposed convolutions and symbolic sizes
stay PyTorch's op.
"""

from __future__ import annotations

import math

import torch
import torch.fx

from saturn.eqsat import optable as ot
from saturn.eqsat.graph import Node, float_bits

from .import_core import MARKERS, Importer, handles
from .import_indexing import take_rows
from .import_movement import pad_or_crop


def _spread(imp: Importer, g: str, axis: int, step: int) -> str:
    """``g`` with ``step - 1`` zeros after each element along ``axis`` but the last: a
    zero Pad of a new axis of ``step`` after it, merged, the trailing zeros cut."""
    gn = imp.g.nodes[g]
    shape, dtype = tuple(gn.shape), gn.dtype
    n = shape[axis]
    split = (*shape[: axis + 1], 1, *shape[axis + 1 :])
    v = imp.add(Node(imp.fresh("spread_v"), "View", (g,), (split,), dtype, split))
    pads = [0] * (2 * len(split))
    pads[2 * (axis + 1) + 1] = step - 1
    wide = (*shape[: axis + 1], step, *shape[axis + 1 :])
    p = imp.add(Node(imp.fresh("spread"), "Pad", (v,), (tuple(pads), float_bits(0.0)), dtype, wide))
    merged = (*shape[:axis], n * step, *shape[axis + 1 :])
    m = imp.add(Node(imp.fresh("spread_m"), "View", (p,), (merged,), dtype, merged))
    cut = (*shape[:axis], (n - 1) * step + 1, *shape[axis + 1 :])
    return imp.add(
        Node(imp.fresh("spread_cut"), "Slice", (m,), (axis, 0, (n - 1) * step + 1, 1), dtype, cut)
    )


def input_gradient(
    imp, g: str, w: str, in_shape, stride, padding, dilation, groups, flip: bool = True
) -> str:
    """The transposed convolution of the output's gradient ``g`` by the weight ``w`` (an
    average pool's backward too: ``flip`` False for a weight every window position holds
    alike)."""
    gn, wn = imp.g.nodes[g], imp.g.nodes[w]
    dtype = gn.dtype
    (kh, kw), (ho, wo) = wn.shape[2:], gn.shape[2:]
    for axis, s in ((2, stride[0]), (3, stride[1])):
        if s > 1:
            g = _spread(imp, g, axis, s)
    pads = [0, 0, 0, 0]
    for size, out, k, s, p, d in (
        (in_shape[2], ho, kh, stride[0], padding[0], dilation[0]),
        (in_shape[3], wo, kw, stride[1], padding[1], dilation[1]),
    ):
        # padded to size + d (k - 1), so that a stride-1 convolution gives ``size`` back
        pads += [d * (k - 1) - p, size - ((out - 1) * s + 1) + p]
    g = pad_or_crop(imp, g, pads, float_bits(0.0), dtype)
    wt = _swapped_weight(imp, w, groups, flip)
    attrs = ((1, 1), (0, 0), tuple(dilation), groups)
    return imp.add(Node(imp.fresh("dgrad"), "Conv2dNoBias", (g, wt), attrs, dtype, tuple(in_shape)))


def _swapped_weight(imp, w: str, groups: int, flip: bool) -> str:
    """Each group's weight [K/g, C/g, kh, kw] with its channels swapped, [C/g, K/g, kh, kw]
    (the groups kept in order), its window flipped where ``flip``: one take of the weight's
    elements by a constant index (each element's position in the weight), so the
    convolution reads it packed as it is made. Swapping and flipping through views instead
    took two transposing copies and two row takes a convolution (ResNet-18's training
    step, full size on an H100: 17 of its 52 ms of device time in those copies)."""
    wn = imp.g.nodes[w]
    dtype = wn.dtype
    k_out, c_in, kh, kw = wn.shape  # c_in: channels per group
    kg, taps, total = k_out // groups, kh * kw, math.prod(wn.shape)
    index = "i32" if total < 2**31 else "i64"
    out = (groups, c_in, kg, kh, kw)
    # (axis, first position, step) of the weight's memory order along each output axis
    walks = [(0, 0, kg * c_in * taps), (1, 0, taps), (2, 0, c_in * taps)]
    walks += [(3, (kh - 1) * kw, -kw), (4, kw - 1, -1)] if flip else [(3, 0, kw), (4, 0, 1)]
    at = None
    for axis, first, step in walks:
        n = out[axis]
        a = imp.add(Node(imp.fresh("dgrad_at"), "Arange", (), (first, step, n, index), index, (n,)))
        shape = tuple(n if d == axis else 1 for d in range(5))
        a = imp.add(Node(imp.fresh("dgrad_axis"), "View", (a,), (shape,), index, shape))
        if at is not None:
            shape = tuple(out[d] if d <= axis else 1 for d in range(5))
            a = imp.add(Node(imp.fresh("dgrad_index"), "Add", (at, a), (), index, shape))
        at = a
    at = imp.add(Node(imp.fresh("dgrad_flat"), "View", (at,), ((total,),), index, (total,)))
    table = imp.add(Node(imp.fresh("dgrad_table"), "View", (w,), ((total, 1),), dtype, (total, 1)))
    taken = take_rows(imp, table, at, imp.fresh("dgrad_w"), (total, 1))
    merged = (groups * c_in, kg, kh, kw)
    return imp.add(Node(imp.fresh("dgrad_wm"), "View", (taken,), (merged,), dtype, merged))


def _windows(imp, x: str, ho: int, wo: int, kh: int, kw: int, stride, padding, dilation, axis):
    """The padded input's window at each kernel position (one strided slice each), joined
    along a new axis ``axis`` of [N, C, Ho, Wo]: the taps in row-major kernel order."""
    xn = imp.g.nodes[x]
    dtype, (n, c) = xn.dtype, xn.shape[:2]
    (sh, sw), (dh, dw) = stride, dilation
    src = pad_or_crop(
        imp, x, [0, 0, 0, 0, padding[0], padding[0], padding[1], padding[1]], float_bits(0.0), dtype
    )
    wp = imp.g.nodes[src].shape[3]
    whole = (n, c, ho, wo)
    window = (*whole[:axis], 1, *whole[axis:])
    cols = None
    for i in range(kh):
        rows = (2, i * dh, i * dh + sh * (ho - 1) + 1, sh)
        r = imp.add(Node(imp.fresh("wgrad_rows"), "Slice", (src,), rows, dtype, (n, c, ho, wp)))
        for j in range(kw):
            at = (3, j * dw, j * dw + sw * (wo - 1) + 1, sw)
            s = imp.add(Node(imp.fresh("wgrad_at"), "Slice", (r,), at, dtype, (n, c, ho, wo)))
            s = imp.add(Node(imp.fresh("wgrad_col"), "View", (s,), (window,), dtype, window))
            if cols is None:
                cols = s
                continue
            have = imp.g.nodes[cols].shape
            joined = (*have[:axis], have[axis] + 1, *have[axis + 1 :])
            cols = imp.add(Node(imp.fresh("wgrad_cat"), "Cat", (cols, s), (axis,), dtype, joined))
    return cols


# below this many 128 x 128 output tiles, one product over (images, rows, columns) leaves
# most of a GPU idle (an H100 has 132 SMs): the products run image by image instead
BATCHED_BELOW_TILES = 128


def _per_image(k: int, cg: int, taps: int, groups: int, dtype: str) -> bool:
    """Whether the weight's gradient is a batch of per-image products summed over the
    images, rather than one product over (images, rows, columns). Float32 and float64
    only: a half type's batched products would each be rounded before the sum, where
    PyTorch rounds once."""
    tiles = groups * -(-(k // groups) // 128) * -(-(cg * taps) // 128)
    return dtype in ("f32", "f64") and tiles < BATCHED_BELOW_TILES


def _weight_gradient(imp, g: str, x: str, w_shape, stride, padding, dilation, groups) -> str:
    """The output's gradient ``g`` contracted with the input's windows: one product, or
    one per image summed (``_per_image``)."""
    gn, xn = imp.g.nodes[g], imp.g.nodes[x]
    dtype = gn.dtype
    n, k, ho, wo = gn.shape
    c, (kh, kw) = xn.shape[1], w_shape[2:]
    taps, kg, cg = kh * kw, k // groups, c // groups
    if cg == 1 and groups > 1:
        return _weight_gradient_depthwise(imp, g, x, w_shape, stride, padding, dilation, groups)
    if _per_image(k, cg, taps, groups, dtype):
        return _weight_gradient_per_image(imp, g, x, w_shape, stride, padding, dilation, groups)
    cols = _windows(imp, x, ho, wo, kh, kw, stride, padding, dilation, 4)
    # per group: [K/g, (N, Ho, Wo)] @ [(N, Ho, Wo), (C/g, taps)], a batch of one product
    split = (n, groups, cg, ho, wo, taps)
    cols = imp.add(Node(imp.fresh("wgrad_split"), "View", (cols,), (split,), dtype, split))
    moved = (groups, n, ho, wo, cg, taps)
    cols = imp.add(
        Node(imp.fresh("wgrad_perm"), "Permute", (cols,), ((1, 0, 3, 4, 2, 5),), dtype, moved)
    )
    flat = (groups, n * ho * wo, cg * taps)
    cols = imp.add(Node(imp.fresh("wgrad_cols"), "View", (cols,), (flat,), dtype, flat))
    gsplit = (n, groups, kg, ho, wo)
    gt = imp.add(Node(imp.fresh("wgrad_gs"), "View", (g,), (gsplit,), dtype, gsplit))
    gmoved = (groups, kg, n, ho, wo)
    gt = imp.add(Node(imp.fresh("wgrad_g"), "Permute", (gt,), ((1, 2, 0, 3, 4),), dtype, gmoved))
    gflat = (groups, kg, n * ho * wo)
    gm = imp.add(Node(imp.fresh("wgrad_gm"), "View", (gt,), (gflat,), dtype, gflat))
    prod_shape = (groups, kg, cg * taps)
    if groups == 1:  # one product
        gm = imp.add(Node(imp.fresh("wgrad_g2"), "View", (gm,), (gflat[1:],), dtype, gflat[1:]))
        cols = imp.add(Node(imp.fresh("wgrad_c2"), "View", (cols,), (flat[1:],), dtype, flat[1:]))
        prod = imp.add(Node(imp.fresh("wgrad"), "MatMul", (gm, cols), (), dtype, prod_shape[1:]))
    else:
        prod = imp.add(Node(imp.fresh("wgrad"), "BatchMatMul", (gm, cols), (), dtype, prod_shape))
    shape = (k, cg, kh, kw)
    return imp.add(Node(imp.fresh("wgrad_view"), "View", (prod,), (shape,), dtype, shape))


def _weight_gradient_per_image(imp, g: str, x: str, w_shape, stride, padding, dilation, groups):
    """Per image and group, the gradient [K/g, (Ho, Wo)] times the windows' transpose
    [(Ho, Wo), (C/g, taps)], summed over the images: the same sum as one product over
    (images, rows, columns), grouped by image (float32 summation order aside, as a split
    reduction's). Both operands are views of what the graph computes (the windows joined
    along a taps axis before the rows), so nothing is copied into a product's layout, and
    the batch of products fills the GPU where one long product would not."""
    gn, xn = imp.g.nodes[g], imp.g.nodes[x]
    dtype = gn.dtype
    n, k, ho, wo = gn.shape
    c, (kh, kw) = xn.shape[1], w_shape[2:]
    taps, kg, cg = kh * kw, k // groups, c // groups
    cols = _windows(imp, x, ho, wo, kh, kw, stride, padding, dilation, 2)  # [N, C, taps, Ho, Wo]
    flat = (n * groups, cg * taps, ho * wo)
    cols = imp.add(Node(imp.fresh("wgrad_cols"), "View", (cols,), (flat,), dtype, flat))
    across = (n * groups, ho * wo, cg * taps)
    cols = imp.add(Node(imp.fresh("wgrad_colt"), "Permute", (cols,), ((0, 2, 1),), dtype, across))
    gflat = (n * groups, kg, ho * wo)
    gm = imp.add(Node(imp.fresh("wgrad_gm"), "View", (g,), (gflat,), dtype, gflat))
    each = (n * groups, kg, cg * taps)
    prod = imp.add(Node(imp.fresh("wgrad_each"), "BatchMatMul", (gm, cols), (), dtype, each))
    split = (n, groups * kg, cg * taps)
    prod = imp.add(Node(imp.fresh("wgrad_images"), "View", (prod,), (split,), dtype, split))
    total = (k, cg * taps)
    prod = imp.add(Node(imp.fresh("wgrad"), "Sum", (prod,), ((0,), 0), dtype, total))
    shape = (k, cg, kh, kw)
    return imp.add(Node(imp.fresh("wgrad_view"), "View", (prod,), (shape,), dtype, shape))


# GPU targets take the input's and the weight's gradients from cuDNN; False writes them out
# as on saturn:0 (an A/B of the two, and the tests of the written-out form's GPU program)
LIBRARY_GRADIENTS = True


def _h_convolution_backward(imp: Importer, node: torch.fx.Node):
    """``convolution_backward(grad, input, weight, bias_sizes, stride, padding, dilation,
    transposed, output_padding, groups, output_mask)``: the gradients ``output_mask`` asks
    for, each as the module's docstring says. A 2-D convolution of floats (half types as
    the forward's: products rounded once, on a GPU where its facts place them); symbolic
    sizes and transposed convolutions decline."""
    grad, x, w = node.args[:3]
    stride, padding, dilation, transposed, _out_pad, groups, mask = node.args[4:11]
    if transposed or len(stride) != 2 or node.kwargs or not any(mask):
        return None
    if not all(isinstance(a, torch.fx.Node) for a in (grad, x, w)):
        return None
    gn, xn, wn = (imp.g.nodes[imp.env[a.name]] for a in (grad, x, w))
    dtype = xn.dtype
    if gn.dtype != dtype or wn.dtype != dtype or dtype not in ot.FLOATS:
        return None
    if any(len(t.shape) != 4 for t in (gn, xn, wn)):
        return None
    if any(v >= min(MARKERS) for t in (gn, xn, wn) for v in t.shape):
        return None
    groups = int(groups)
    if groups < 1 or xn.shape[1] % groups or wn.shape[0] % groups:
        return None
    stride, padding, dilation = (tuple(int(v) for v in a) for a in (stride, padding, dilation))
    results: list[str | None] = [None, None, None]
    conv = (stride, padding, dilation, groups)
    if imp.gpu and LIBRARY_GRADIENTS:  # cuDNN's backward-data and backward-filter (0125)
        for i, op, other, shape in (
            (0, "ConvInputGrad", wn, xn.shape),
            (1, "ConvWeightGrad", xn, wn.shape),
        ):
            if mask[i]:
                attrs = (tuple(shape), *conv)
                results[i] = imp.add(
                    Node(imp.fresh(op), op, (gn.name, other.name), attrs, dtype, tuple(shape))
                )
    else:  # written out (saturn:0)
        if mask[0]:
            results[0] = input_gradient(imp, gn.name, wn.name, tuple(xn.shape), *conv)
        if mask[1]:
            results[1] = _weight_gradient(imp, gn.name, xn.name, tuple(wn.shape), *conv)
    if mask[2]:
        k = gn.shape[1]
        results[2] = imp.add(
            Node(imp.fresh("bgrad"), "Sum", (gn.name,), ((0, 2, 3), 0), dtype, (k,))
        )
    imp.results[node.name] = tuple(results)
    return next(r for r in results if r is not None)


handles({"aten.convolution_backward.default": _h_convolution_backward})


def _weight_gradient_depthwise(imp, g: str, x: str, w_shape, stride, padding, dilation, groups):
    """One input channel a group (a depthwise convolution, with or without a channel
    multiplier): each weight element's gradient is the sum over (images, rows, columns) of
    the gradient times the window, one reduction of their product, not a batch of one-row
    matrix products (whose operands no matrix layout describes: they were packed at every
    call). Half types multiply and sum in float32, rounded once, as PyTorch's gradient is
    (widening is exact); float32 sums in another order, as any reduction."""
    gn = imp.g.nodes[g]
    dtype = gn.dtype
    n, k, ho, wo = gn.shape
    kh, kw = w_shape[2:]
    taps, kg = kh * kw, k // groups
    acc = "f32" if dtype in ot.HALVES else dtype
    cols = _windows(imp, x, ho, wo, kh, kw, stride, padding, dilation, 2)  # [N, G, taps, Ho, Wo]
    cols, g = imp.cast(cols, acc), imp.cast(g, acc)
    at = (n, groups, 1, taps, ho * wo)
    cols = imp.add(Node(imp.fresh("wgrad_cols"), "View", (cols,), (at,), acc, at))
    gat = (n, groups, kg, 1, ho * wo)
    gv = imp.add(Node(imp.fresh("wgrad_gm"), "View", (g,), (gat,), acc, gat))
    each = (n, groups, kg, taps, ho * wo)
    prod = imp.add(Node(imp.fresh("wgrad_each"), "Mul", (gv, cols), (), acc, each))
    total = (groups, kg, taps)
    prod = imp.add(Node(imp.fresh("wgrad"), "Sum", (prod,), ((0, 4), 0), acc, total))
    shape = (k, 1, kh, kw)
    view = imp.add(Node(imp.fresh("wgrad_view"), "View", (prod,), (shape,), acc, shape))
    return imp.cast(view, dtype)
