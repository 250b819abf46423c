"""Importer handlers for pooling: max and average pools as windows reduced (pools that
tile the image) or strided slices folded with ``Maximum``/``Add``; a max pool whose indices
are read (a training forward) folded with its indices, and its backward as a row add at
flat positions.
"""

from __future__ import annotations

import math

import torch
import torch.fx

from saturn.eqsat import optable as ot
from saturn.eqsat.graph import Node, float_bits

from .import_conv_backward import input_gradient
from .import_core import MARKERS, Importer, fake_value, handles, tensor_type
from .import_library import only_first_result_used
from .import_movement import pad_or_crop


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
    or dilated windows: a maximum of strided slices (``_pool_slices``; PyTorch's bit for
    bit, both zeros included). With its indices
    read (a training forward's): ``_max_pool_indices``. Ceil mode's last, partial windows
    read -inf past the image's end, which never wins a maximum (every window holds an
    element of the image or of its padding, PyTorch's output size rule)."""
    x, kernel = node.args[0], list(node.args[1])
    rest = list(node.args[2:]) + [None] * 4
    stride = list(rest[0]) if rest[0] else kernel
    padding = list(rest[1]) if rest[1] is not None else [0]
    dilation = list(rest[2]) if rest[2] is not None else [1]
    ceil_mode = bool(rest[3]) if rest[3] is not None else False
    if node.kwargs:
        return None
    if not only_first_result_used(node):
        return _max_pool_indices(
            imp, node, imp.env[x.name], kernel, stride, padding, dilation, ceil_mode
        )
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
    strided Slice per window position, and the positions folded by ``Maximum``
    (NaN-propagating; last to first, so a tie keeps the first element, as PyTorch's
    pooling does) or, in row-major order, ``Add`` then divided by the window's size: one
    fused loop. Floor mode (and ceil mode for a max): every window inside the padded
    image, so every window holds an element of the image and an average's divisor is the
    window's size. An average sums in float32 where PyTorch's CPU kernel sums in float64
    (within float32's rounding)."""
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
    if kind == "max":
        # last to first: Maximum keeps its second operand on a tie (``op_rows``), so the
        # first of equal maxima wins, -0.0 and +0.0 alike: PyTorch's pooling, bit for bit
        # (a NaN's payload aside)
        slices.reverse()
    acc = slices[0]
    for k, at in enumerate(slices[1:], 2):
        last = kind == "max" and k == len(slices)  # the result itself: no View after it
        node = Node(name if last else imp.fresh("pool"), fold, (acc, at), (), dtype, out)
        acc = imp.add(node, name if last else None)
    if kind == "max":
        return acc
    size = imp.scalar(float(kh * kw), dtype)
    return imp.add(Node(name, "Div", (acc, size), (), dtype, out), name)


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


def _axis(imp: Importer, start: int, step: int, n: int, inside: int | None = None) -> str:
    """``start + step * k`` for k < n, int64; with ``inside`` (a dilation), an entry below
    zero becomes the first element of its window inside the image (``_first_inside``)."""
    ar = imp.add(Node(imp.fresh("pool_ar"), "Arange", (), (start, step, n, "i64"), "i64", (n,)))
    if inside is None or start >= 0:
        return ar
    neg = imp.add(Node(imp.fresh("pool_neg"), "Lt", (ar, imp.scalar(0, "i64")), (), "bool", (n,)))
    mod = imp.add(
        Node(imp.fresh("pool_mod"), "Remainder", (ar, imp.scalar(inside, "i64")), (), "i64", (n,))
    )
    return imp.add(Node(imp.fresh("pool_in"), "Where", (neg, mod, ar), (), "i64", (n,)))


def _plane_positions(imp: Importer, rows: str, cols: str, w: int) -> str:
    """``row * w + col`` over the output grid (rows ``[Ho]``, cols ``[Wo]``): int64 [Ho, Wo]."""
    ho, wo = imp.g.nodes[rows].shape[0], imp.g.nodes[cols].shape[0]
    r = imp.add(Node(imp.fresh("pool_row"), "Mul", (rows, imp.scalar(w, "i64")), (), "i64", (ho,)))
    r = imp.add(Node(imp.fresh("pool_rv"), "View", (r,), ((ho, 1),), "i64", (ho, 1)))
    return imp.add(Node(imp.fresh("pool_pos"), "Add", (r, cols), (), "i64", (ho, wo)))


def _first_inside(start: int, step: int, size: int) -> int | None:
    """The first of ``start, start + step, ...`` at or past 0 (a window's first row or
    column inside the image), None when it lies past the image's end."""
    first = start if start >= 0 else start % step
    return first if first < size else None


def _max_pool_indices(
    imp: Importer, node: torch.fx.Node, x: str, kernel, stride, padding, dilation, ceil_mode: bool
):
    """max_pool2d with its indices read (a training forward saves them for the backward).
    PyTorch folds each window from -inf at its first element inside the image, taking an
    element greater than the maximum so far or NaN: the maximum is the inference pool's
    (``_pool_slices``, bit for bit), and the index, an element's position in its image
    plane (row * W + col), is where the maximum m is first found, found from m rather than
    folded beside it: the first element equal to m (ties, -0.0 and +0.0 alike, keep the
    first), the last NaN where m is NaN, and the window's first element inside the image
    where m is -inf (nothing is taken; padding reads -inf too, so it is not searched
    for). Each search is a chain of ``Where`` over the window reading m, the window's
    elements and one position tensor: one loop beside the maximum's, where a fold that
    carried both made extraction write every element's comparison to memory (ResNet's
    stem pool: 17 boolean tensors and 8 partial maxima a step)."""
    xn = imp.g.nodes[x]
    vals = fake_value(node)
    dtype, out = tensor_type(node, vals[0])
    kernel, stride, padding, dilation = map(_pair, (kernel, stride, padding, dilation))
    if len(xn.shape) != 4 or len(out) != 4 or dtype not in ot.FLOATS or xn.dtype != dtype:
        return None
    if math.prod(kernel) > POOL_WINDOW_LIMIT or any(v >= min(MARKERS) for v in xn.shape):
        return None
    n, c, h, w = xn.shape
    (kh, kw), (sh, sw), (ph, pw), (dh, dw) = kernel, stride, padding, dilation
    ho, wo = out[2], out[3]
    if ho <= 0 or wo <= 0:
        return None
    top, left = -ph, -pw
    if any(_first_inside(top + sh * k, dh, h) is None for k in range(ho)):
        return None  # a window of padding alone: PyTorch's output size never makes one
    if any(_first_inside(left + sw * k, dw, w) is None for k in range(wo)):
        return None
    eh = max(0, (kh - 1) * dh + sh * (ho - 1) + 1 - (h + 2 * ph))
    ew = max(0, (kw - 1) * dw + sw * (wo - 1) + 1 - (w + 2 * pw))
    if (eh or ew) and not ceil_mode:
        return None
    full = (n, c, ho, wo)
    m = _pool_slices(imp, "max", node.name, x, kernel, stride, padding, dilation, full, ceil_mode)
    if m is None:
        return None
    src, pw_ = x, w + 2 * pw + ew
    if ph or pw or eh or ew:  # the same pad as the maximum's (one class in the e-graph)
        attrs = ((0, 0, 0, 0, ph, ph + eh, pw, pw + ew), float_bits(float("-inf")))
        padded = (n, c, h + 2 * ph + eh, pw_)
        src = imp.add(Node(imp.fresh("pool_pad"), "Pad", (src,), attrs, dtype, padded))
    first = _plane_positions(
        imp, _axis(imp, top, sh, ho, inside=dh), _axis(imp, left, sw, wo, inside=dw), w
    )
    # each window element's position: its window's corner's (row * w + col, negative or
    # past the row's end for a corner in the padding) plus a constant, exact wherever the
    # element lies inside the image, the only elements either search can find
    corner = _plane_positions(imp, _axis(imp, top, sh, ho), _axis(imp, left, sw, wo), w)
    window = []
    for i in range(kh):
        rows = (2, i * dh, i * dh + sh * (ho - 1) + 1, sh)
        r = imp.add(Node(imp.fresh("pool_rows"), "Slice", (src,), rows, dtype, (n, c, ho, pw_)))
        for j in range(kw):
            cols = (3, j * dw, j * dw + sw * (wo - 1) + 1, sw)
            v = imp.add(Node(imp.fresh("pool_at"), "Slice", (r,), cols, dtype, full))
            step = imp.scalar(i * dh * w + j * dw, "i64")
            at = imp.add(Node(imp.fresh("pool_pos"), "Add", (corner, step), (), "i64", (ho, wo)))
            window.append((v, at))

    def search(test: str, order, rhs) -> str:
        index = first
        for v, at in order:
            hit = imp.add(Node(imp.fresh("pool_hit"), test, (v, rhs(v)), (), "bool", full))
            index = imp.add(Node(imp.fresh("pool_idx"), "Where", (hit, at, index), (), "i64", full))
        return index

    equal = search("Eq", reversed(window), lambda v: m)  # last to first: the first wins
    nan = search("Ne", window, lambda v: v)  # first to last: the last NaN wins
    empty = imp.add(
        Node(imp.fresh("pool_none"), "Eq", (m, imp.scalar(float("-inf"), dtype)), (), "bool", full)
    )
    index = imp.add(Node(imp.fresh("pool_idx"), "Where", (empty, first, equal), (), "i64", full))
    is_nan = imp.add(Node(imp.fresh("pool_nan"), "Ne", (m, m), (), "bool", full))
    index = imp.add(Node(imp.fresh("pool_idx"), "Where", (is_nan, nan, index), (), "i64", full))
    imp.results[node.name] = (m, index)
    return m


def _h_max_pool2d_backward(imp: Importer, node: torch.fx.Node):
    """max_pool2d_with_indices_backward: each output's gradient added at its index in its
    image plane (a row add of one-element rows at flat positions, decision 0047), into
    zeros of the input's shape. Half types add in float32, rounded once, as PyTorch's CUDA
    kernel accumulates. An index outside its plane lands in the next one, or past the
    last and raises IndexError: only the forward's indices are meant."""
    grad = node.args[0]
    indices = node.args[7] if len(node.args) > 7 else node.kwargs.get("indices")
    if not isinstance(indices, torch.fx.Node) or not isinstance(grad, torch.fx.Node):
        return None
    gn = imp.g.nodes[imp.env[grad.name]]
    inn = imp.g.nodes[imp.env[indices.name]]
    dtype, shape = tensor_type(node)
    if len(shape) != 4 or dtype not in ot.FLOATS or gn.dtype != dtype or inn.dtype != "i64":
        return None
    if tuple(inn.shape) != tuple(gn.shape) or len(gn.shape) != 4:
        return None
    if any(v >= min(MARKERS) for v in (*shape, *gn.shape)):
        return None
    n, c, h, w = shape
    rows = math.prod(gn.shape)
    acc = dtype if dtype in ("f32", "f64") else "f32"
    planes = imp.add(
        Node(imp.fresh("unpool_plane"), "Arange", (), (0, h * w, n * c, "i64"), "i64", (n * c,))
    )
    planes = imp.add(
        Node(imp.fresh("unpool_pv"), "View", (planes,), ((n, c, 1, 1),), "i64", (n, c, 1, 1))
    )
    flat = imp.add(Node(imp.fresh("unpool_at"), "Add", (inn.name, planes), (), "i64", gn.shape))
    flat = imp.add(Node(imp.fresh("unpool_idx"), "View", (flat,), ((rows,),), "i64", (rows,)))
    vals = gn.name
    if acc != dtype:
        vals = imp.add(Node(imp.fresh("unpool_up"), "Cast", (vals,), (acc,), acc, gn.shape))
    vals = imp.add(Node(imp.fresh("unpool_rows"), "View", (vals,), ((rows, 1),), acc, (rows, 1)))
    table = (n * c * h * w, 1)
    zero = imp.add(
        Node(imp.fresh("unpool_zero"), "Expand", (imp.scalar(0.0, acc),), (table,), acc, table)
    )
    added = imp.add(Node(imp.fresh("unpool_add"), "IndexAdd", (zero, flat, vals), (), acc, table))
    shape = tuple(shape)
    if acc == dtype:
        return imp.add(Node(node.name, "View", (added,), (shape,), dtype, shape), node.name)
    up = imp.add(Node(imp.fresh("unpool_view"), "View", (added,), (shape,), acc, shape))
    return imp.add(Node(node.name, "Cast", (up,), (dtype,), dtype, shape), node.name)


def _unpool_tiles(imp: Importer, g: str, kernel, shape: tuple[int, ...]) -> str:
    """Windows that tile the image (kernel = stride, no padding; DenseNet's transitions):
    each element lies in one window or none, so its gradient is its window's share, with
    no sum. The share expanded over each window's rows and columns, merged into the
    image's, and zeros past the last whole window (floor mode): a loop reading the shares,
    where the general form was a spread, a pad and a convolution."""
    gn = imp.g.nodes[g]
    n, c, ho, wo = gn.shape
    (kh, kw), dtype = kernel, gn.dtype
    split = (n, c, ho, 1, wo, 1)
    v = imp.add(Node(imp.fresh("unavg_split"), "View", (g,), (split,), dtype, split))
    wide = (n, c, ho, kh, wo, kw)
    e = imp.add(Node(imp.fresh("unavg_tiles"), "Expand", (v,), (wide,), dtype, wide))
    merged = (n, c, ho * kh, wo * kw)
    out = imp.add(Node(imp.fresh("unavg_merged"), "View", (e,), (merged,), dtype, merged))
    rest = [0, 0, 0, 0, 0, shape[2] - ho * kh, 0, shape[3] - wo * kw]
    return pad_or_crop(imp, out, rest, float_bits(0.0), dtype) if any(rest) else out


def _h_avg_pool2d_backward(imp: Importer, node: torch.fx.Node):
    """avg_pool2d_backward for the pools ``_h_avg_pool2d`` takes (padding counted, floor
    mode, no divisor override): each output's gradient divided by the window's size, then
    added to every element of its window: the transposed convolution of the quotient by a
    window of ones per channel (``import_conv_backward.input_gradient``). PyTorch's kernels
    divide first and add the quotients too (in float32 for half types, rounded once: so
    here). Windows that tile the image need no sum (``_unpool_tiles``). Other pools stay
    PyTorch's op."""
    grad, _x, kernel, stride, padding, ceil_mode, include_pad, divisor = node.args[:8]
    if node.kwargs or ceil_mode or divisor is not None or not isinstance(grad, torch.fx.Node):
        return None
    kernel = _pair(list(kernel))
    stride = _pair(list(stride)) if stride else kernel
    padding = _pair(list(padding))
    if any(padding) and not include_pad:
        return None
    gn = imp.g.nodes[imp.env[grad.name]]
    dtype, shape = tensor_type(node)
    if dtype not in ot.FLOATS or gn.dtype != dtype or len(shape) != 4 or len(gn.shape) != 4:
        return None
    if any(v >= min(MARKERS) for v in (*shape, *gn.shape)):
        return None
    acc = "f32" if dtype in ot.HALVES else dtype
    g = gn.name
    if acc != dtype:
        g = imp.add(Node(imp.fresh("unavg_wide"), "Cast", (g,), (acc,), acc, gn.shape))
    size = imp.scalar(float(kernel[0] * kernel[1]), acc)
    g = imp.add(Node(imp.fresh("unavg_share"), "Div", (g, size), (), acc, gn.shape))
    if tuple(kernel) == tuple(stride) and not any(padding):
        out = _unpool_tiles(imp, g, kernel, tuple(shape))
    else:
        c = shape[1]
        ones = (c, 1, *kernel)
        w = imp.add(
            Node(imp.fresh("unavg_ones"), "Expand", (imp.scalar(1.0, acc),), (ones,), acc, ones)
        )
        out = input_gradient(imp, g, w, tuple(shape), stride, padding, (1, 1), c, flip=False)
    if acc != dtype:
        out = imp.add(Node(imp.fresh("unavg_round"), "Cast", (out,), (dtype,), dtype, tuple(shape)))
    return out


handles(
    {
        "aten.avg_pool2d_backward.default": _h_avg_pool2d_backward,
        "aten.max_pool2d_with_indices.default": _h_max_pool2d,
        "aten.max_pool2d_with_indices_backward.default": _h_max_pool2d_backward,
        "aten.avg_pool2d.default": _h_avg_pool2d,
    }
)
