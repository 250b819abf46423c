"""Importer handlers for views and copies that move data: reshapes, permutes, expands,
strided views, slices, selects, splits, flips, repeats, padding, and the creation ops
``full`` and ``arange`` (concatenation and slice scatter: ``import_joins``).
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.fx

from saturn.eqsat import optable as ot
from saturn.eqsat.graph import Node, float_bits
from saturn.eqsat.program import packed_strides

from .dtypes import DTYPES
from .import_core import (
    MARKERS,
    Importer,
    UnsupportedError,
    concrete,
    fake_value,
    handles,
    is_symbolic,
    tensor_type,
)
from .import_indexing import take_rows


def _h_shape_view(imp: Importer, node: torch.fx.Node):
    """view, reshape, unsqueeze, squeeze: a View to the result's (known) shape."""
    dtype, shape = tensor_type(node)
    return imp.add(
        Node(node.name, "View", (imp.env[node.args[0].name],), (shape,), dtype, shape), node.name
    )


def _h_as_strided(imp: Importer, node: torch.fx.Node):
    """as_strided(x, size, stride, 0) that only re-describes x's elements in their order: a
    View. That holds where, leaving out extents of 1 (whose strides address nothing), the
    result's extents and strides are x's (a pool's ``[N, C, 1, 1]`` result given
    channels-last strides), or x is packed and the result's strides are the packed ones of
    its shape (a reshape). Any other layout (overlapping, offset, reordered) stays
    PyTorch's op."""
    x, size, stride = node.args[:3]
    offset = node.args[3] if len(node.args) > 3 else node.kwargs.get("storage_offset")
    if offset not in (None, 0) or not isinstance(x, torch.fx.Node):
        return None
    val = fake_value(x)
    if not isinstance(val, torch.Tensor) or val.storage_offset() != 0:
        return None
    if not all(type(v) is int for v in (*size, *stride, *val.shape, *val.stride())):
        return None

    def kept(extents, strides):
        return [(n, s) for n, s in zip(extents, strides, strict=True) if n != 1]

    mine = kept(size, stride)
    same = mine == kept(val.shape, val.stride())
    reshaped = val.is_contiguous() and mine == kept(size, packed_strides(tuple(size)))
    if math.prod(size) != val.numel() or not (same or reshaped):
        return None
    dtype, shape = tensor_type(node)
    return imp.add(Node(node.name, "View", (imp.env[x.name],), (shape,), dtype, shape), node.name)


def _h_permute(imp: Importer, node: torch.fx.Node):
    xn = imp.g.nodes[imp.env[node.args[0].name]]
    rank = len(xn.shape)
    if node.target == torch.ops.aten.permute.default:
        perm = tuple(p % rank for p in node.args[1])
    elif node.target == torch.ops.aten.t.default:
        perm = (1, 0) if rank == 2 else tuple(range(rank))
    else:  # transpose.int
        d0, d1 = (d % rank for d in node.args[1:3])
        perm = list(range(rank))
        perm[d0], perm[d1] = perm[d1], perm[d0]
        perm = tuple(perm)
    dtype, shape = tensor_type(node)
    return imp.add(Node(node.name, "Permute", (xn.name,), (perm,), dtype, shape), node.name)


def _h_expand(imp: Importer, node: torch.fx.Node):
    if node.kwargs.get("implicit"):
        return None
    dtype, shape = tensor_type(node)
    return imp.add(
        Node(node.name, "Expand", (imp.env[node.args[0].name],), (shape,), dtype, shape), node.name
    )


def _h_flip(imp: Importer, node: torch.fx.Node):
    """flip(x, dims): along each flipped axis of more than one element, a take of x's
    slices by the constant index n-1, ..., 0 (axis first through a permute, as
    index_select does). A constant index is in range by construction: no call-time check."""
    x, dims = node.args[:2]
    xn = imp.g.nodes[imp.env[x.name]]
    rank = len(xn.shape)
    dtype, shape = tensor_type(node)
    if rank == 0 or not all(type(d) is int and -rank <= d < rank for d in dims):
        return None
    axes = sorted({d % rank for d in dims if xn.shape[d % rank] > 1})
    if not axes:  # nothing moves: the same values
        return imp.add(
            Node(node.name, "View", (xn.name,), (tuple(shape),), dtype, tuple(shape)), node.name
        )
    return flip_axes(imp, xn.name, axes, node.name)


def flip_axes(imp: Importer, x: str, axes: list[int], fx: str | None = None) -> str:
    """``x`` reversed along ``axes`` (each of more than one element): per axis, a take of
    its slices by the constant index n-1, ..., 0, the axis brought first and back. ``fx``:
    the FX node the last step stands for (it takes that name)."""
    xn = imp.g.nodes[x]
    rank, dtype, shape = len(xn.shape), xn.dtype, tuple(xn.shape)
    cur = x
    for i, dim in enumerate(axes):
        n, last = xn.shape[dim], i == len(axes) - 1 and fx is not None
        rev = imp.add(
            Node(imp.fresh("flip_index"), "Arange", (), (n - 1, -1, n, "i64"), "i64", (n,))
        )
        if dim == 0:
            name = fx if last else imp.fresh("flip")
            cur = take_rows(imp, cur, rev, name, shape, fx if last else None)
            continue
        perm = (dim, *(d for d in range(rank) if d != dim))
        moved = tuple(xn.shape[d] for d in perm)
        p = imp.add(Node(imp.fresh("flip_first"), "Permute", (cur,), (perm,), dtype, moved))
        t = take_rows(imp, p, rev, imp.fresh("flip"), moved)
        back = tuple(sorted(range(rank), key=perm.__getitem__))
        name = fx if last else imp.fresh("flip_back")
        cur = imp.add(Node(name, "Permute", (t,), (back,), dtype, shape), fx if last else None)
    return cur


def _h_repeat(imp: Importer, node: torch.fx.Node):
    """x.repeat(r0, ..., rm): each axis tiled, out[.., i, ..] = x[.., i % n, ..]: x viewed
    with a unit axis before each of its axes (and leading ones for new axes), expanded to
    the repeat counts, merged pairwise by a View. Copies of x's elements (exact)."""
    xn = imp.g.nodes[imp.env[node.args[0].name]]
    reps = list(node.args[1])
    dtype, shape = tensor_type(node)
    if not all(type(r) is int and r >= 1 for r in reps) or len(reps) < len(xn.shape):
        return None
    sizes = [1] * (len(reps) - len(xn.shape)) + list(xn.shape)
    if any(n >= min(MARKERS) for n in sizes):
        return None
    split = tuple(v for n in sizes for v in (1, n))
    grid = tuple(v for r, n in zip(reps, sizes, strict=True) for v in (r, n))
    v = imp.add(Node(imp.fresh("tile_split"), "View", (xn.name,), (split,), dtype, split))
    e = imp.add(Node(imp.fresh("tile"), "Expand", (v,), (grid,), dtype, grid))
    return imp.add(Node(node.name, "View", (e,), (tuple(shape),), dtype, tuple(shape)), node.name)


def _h_full(imp: Importer, node: torch.fx.Node):
    """full(size, value) and full_like(x, value): the scalar broadcast to the result's
    (known) shape, in the result's dtype (full_like reads only x's shape)."""
    value = node.args[1]
    if not isinstance(value, int | float | bool):
        return None
    dtype, shape = tensor_type(node)
    if dtype not in ot.FLOATS + ot.INTS + ("bool",):
        return None
    c = imp.scalar(bool(value) if dtype == "bool" else value, dtype)
    return imp.add(Node(node.name, "Expand", (c,), (shape,), dtype, shape), node.name)


def _h_arange(imp: Importer, node: torch.fx.Node):
    """arange(end) / arange(start, end[, step]) with integer bounds: an ``Arange`` constant
    (made once where the program reads it), when every value is exact in the result's
    dtype. A symbolic length is taken for ``arange(n)`` of one symbol in int32, int64,
    float32 or float64 (its marker in the length, replaced per call size like every extent;
    a float one as the cast of the int64 one); fractional
    bounds and other symbolic forms stay the op's own call."""
    bounds = list(node.args)
    if len(bounds) == 1:
        bounds = [0, bounds[0]]
    if len(bounds) == 2:
        bounds.append(1)
    val = fake_value(node)
    if len(bounds) != 3 or not isinstance(val, torch.Tensor) or val.dtype not in DTYPES:
        return None
    if val.dim() != 1:
        return None
    start, end, step = bounds
    dtype, length = DTYPES[val.dtype], val.shape[0]
    if isinstance(length, torch.SymInt):  # arange(s): 0, 1, ..., s - 1
        if not (length.node.expr.is_Symbol and (start, step) == (0, 1)):
            return None
        if not isinstance(end, torch.fx.Node | torch.SymInt):
            return None
        n = concrete(length)
        if dtype in ("i32", "i64"):
            return imp.add(Node(node.name, "Arange", (), (0, 1, n, dtype), dtype, (n,)), node.name)
        if dtype not in ("f32", "f64"):
            return None
        # float positions (rotary tables): PyTorch computes start + i * step in double and
        # rounds once to the dtype, for i = 0..s-1 that is i rounded once, what the cast of
        # the exact integer gives for every s; half types (rounded from a float32 position
        # in PyTorch) are not taken
        ints = imp.add(Node(imp.fresh("arange"), "Arange", (), (0, 1, n, "i64"), "i64", (n,)))
        return imp.add(Node(node.name, "Cast", (ints,), (dtype,), dtype, (n,)), node.name)
    if not all(type(v) is int for v in bounds) or step == 0:
        return None
    n = length
    if n != len(range(start, end, step)) or not ot.arange_exact(start, step, n, dtype):
        return None
    return imp.add(Node(node.name, "Arange", (), (start, step, n, dtype), dtype, (n,)), node.name)


def _size_arg(imp: Importer, v):
    """An int argument that may be a size node or a SymInt: its marker value."""
    if isinstance(v, torch.fx.Node):
        return concrete(fake_value(v))
    if isinstance(v, torch.SymInt):
        return concrete(v)
    return v


def _h_slice(imp: Importer, node: torch.fx.Node):
    xn = imp.g.nodes[imp.env[node.args[0].name]]
    args = list(node.args) + [None] * (5 - len(node.args))
    dim = args[1] if args[1] is not None else node.kwargs.get("dim", 0)
    start, end = (_size_arg(imp, v) for v in args[2:4])
    step = args[4] if args[4] is not None else node.kwargs.get("step", 1)
    if not all(isinstance(v, int | type(None)) for v in (dim, start, end, step)) or not xn.shape:
        return None
    dim %= len(xn.shape)
    size = xn.shape[dim]

    def clamp(v, default):
        if v is None:
            return default
        if v >= 1 << 62:  # "to the end" (sys.maxsize): past any extent
            return size
        symbolic_v, symbolic_size = is_symbolic(v), is_symbolic(size)
        if (symbolic_v and v != size) or (symbolic_size and not symbolic_v and not 0 <= v <= 2):
            # a clamp whose outcome depends on the sizes (a symbolic extent is at least 2)
            raise UnsupportedError(f"{node.name}: slice bound {v} of an extent {size}")
        v = v + size if v < 0 else v
        return min(max(v, 0), size)

    start, end = clamp(start, 0), clamp(end, size)
    end = max(end, start)
    dtype, shape = tensor_type(node)
    return imp.add(
        Node(node.name, "Slice", (xn.name,), (dim, start, end, step), dtype, shape), node.name
    )


def pad_or_crop(
    imp: Importer, x: str, pads: list[int], value_bits: int, dtype: str, name: str | None = None
) -> str:
    """``x`` padded by (before, after) per axis, axis 0 first: a negative amount crops
    (a Slice per cropped axis, views), a positive one pads (one Pad); ``name``: the last
    node's. Exact for every value: bits are moved, the constant is written outside."""
    shape = list(imp.g.nodes[x].shape)
    crops = [d for d in range(len(shape)) if pads[2 * d] < 0 or pads[2 * d + 1] < 0]
    grow = any(p > 0 for p in pads)
    for k, d in enumerate(crops):
        lo, hi = max(0, -pads[2 * d]), shape[d] - max(0, -pads[2 * d + 1])
        shape[d] = hi - lo
        last = k == len(crops) - 1 and not grow
        x = imp.add(
            Node(
                name if last and name else imp.fresh("crop"),
                "Slice",
                (x,),
                (d, lo, hi, 1),
                dtype,
                tuple(shape),
            ),
            name if last else None,
        )
    if grow:
        pos = tuple(max(0, p) for p in pads)
        out = tuple(n + pos[2 * d] + pos[2 * d + 1] for d, n in enumerate(shape))
        x = imp.add(
            Node(name or imp.fresh("pad"), "Pad", (x,), (pos, value_bits), dtype, out), name
        )
    return x


def _h_constant_pad(imp: Importer, node: torch.fx.Node):
    """constant_pad_nd(x, pad, value): a Pad (pad lists the last axis first); negative
    amounts crop (F.pad's backward): Slices first. Declined for a value the dtype cannot
    hold exactly (PyTorch would convert it; saturn does not guess how) and for a crop
    past an axis's extent."""
    x, pad = node.args[0], list(node.args[1])
    value = node.args[2] if len(node.args) > 2 else node.kwargs.get("value", 0)
    xn = imp.g.nodes[imp.env[x.name]]
    dtype, shape = tensor_type(node)
    rank = len(xn.shape)
    if len(pad) % 2 or len(pad) > 2 * rank or any(type(p) is not int for p in pad):
        return None
    if not isinstance(value, int | float) or dtype != xn.dtype:
        return None
    if dtype not in ot.FLOATS:
        if float(value) != int(value):
            return None
        if dtype == "bool" and value not in (0, 1):
            return None
        if dtype != "bool":
            info = np.iinfo(ot.NUMPY_DTYPE[dtype])
            if not info.min <= int(value) <= info.max:
                return None
    pads = [0] * (2 * rank)
    for k in range(len(pad) // 2):  # pair k pads axis rank - 1 - k
        d = rank - 1 - k
        pads[2 * d], pads[2 * d + 1] = pad[2 * k], pad[2 * k + 1]
    if any(max(0, -pads[2 * d]) + max(0, -pads[2 * d + 1]) > n for d, n in enumerate(xn.shape)):
        return None  # cropped past its extent: PyTorch raises
    if any(p < 0 for p in pads) and any(v in MARKERS for v in xn.shape):
        return None  # a crop of a symbolic extent
    if not any(pads):  # F.pad by sizes that came out zero (Swin's window multiple): a copy
        return imp.add(Node(node.name, "Cast", (xn.name,), (dtype,), dtype, shape), node.name)
    attrs = (tuple(pads), float_bits(float(value)))
    if all(p >= 0 for p in pads):
        return imp.add(Node(node.name, "Pad", (xn.name,), attrs, dtype, shape), node.name)
    return pad_or_crop(imp, xn.name, pads, attrs[1], dtype, node.name)


def _h_select(imp: Importer, node: torch.fx.Node):
    """select(x, dim, i): the slice [i, i + 1) along dim, viewed without that axis (views,
    exact for every value). A negative or symbolic index is declined (kept as the call)."""
    xn = imp.g.nodes[imp.env[node.args[0].name]]
    dim, index = node.args[1], node.args[2]
    if not isinstance(dim, int) or not isinstance(index, int) or not xn.shape:
        return None
    dim %= len(xn.shape)
    if not 0 <= index < xn.shape[dim]:
        return None
    dtype, shape = tensor_type(node)
    one = (*xn.shape[:dim], 1, *xn.shape[dim + 1 :])
    sliced = imp.add(
        Node(imp.fresh("select"), "Slice", (xn.name,), (dim, index, index + 1, 1), dtype, one)
    )
    return imp.add(Node(node.name, "View", (sliced,), (shape,), dtype, shape), node.name)


def _h_split(imp: Importer, node: torch.fx.Node):
    """split / split_with_sizes along a dim: one Slice per piece (views; no copy), read by
    the getitems that follow."""
    xn = imp.g.nodes[imp.env[node.args[0].name]]
    args = list(node.args) + [None] * 3
    dim = args[2] if args[2] is not None else node.kwargs.get("dim", 0)
    if not xn.shape or type(dim) is not int:
        return None
    dim %= len(xn.shape)
    size, pieces = xn.shape[dim], fake_value(node)
    if not isinstance(pieces, list | tuple):
        return None
    names, start = [], 0
    for i, piece in enumerate(pieces):
        dtype, shape = tensor_type(node, piece)
        end = start + shape[dim]
        names.append(
            imp.add(
                Node(f"{node.name}.{i}", "Slice", (xn.name,), (dim, start, end, 1), dtype, shape)
            )
        )
        start = end
    if start != size:
        return None
    imp.results[node.name] = tuple(names)
    return names[0]


handles(
    {
        "aten.select.int": _h_select,
        "aten.full_like.default": _h_full,
        "aten.view.default": _h_shape_view,
        "aten._unsafe_view.default": _h_shape_view,
        "aten.reshape.default": _h_shape_view,
        "aten.unsqueeze.default": _h_shape_view,
        "aten.squeeze.dim": _h_shape_view,
        "aten.squeeze.dims": _h_shape_view,
        "aten.permute.default": _h_permute,
        "aten.t.default": _h_permute,
        "aten.transpose.int": _h_permute,
        "aten.expand.default": _h_expand,
        "aten.slice.Tensor": _h_slice,
        "aten.full.default": _h_full,
        "aten.split.Tensor": _h_split,
        "aten.split_with_sizes.default": _h_split,
        "aten.arange.default": _h_arange,
        "aten.arange.start": _h_arange,
        "aten.arange.start_step": _h_arange,
        "aten.repeat.default": _h_repeat,
        "aten.flip.default": _h_flip,
        "aten.constant_pad_nd.default": _h_constant_pad,
        "aten.as_strided.default": _h_as_strided,
    }
)
