"""Importer handlers for views and copies that move data: reshapes, permutes, expands,
strided views, slices, selects, splits, flips, concatenation, repeats, padding, slice
scatter, and the creation ops ``full`` and ``arange``.
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
from .import_indexing import select_by_position, take_rows


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


CAT_CHUNKS = 4  # most pieces a concatenation is cut into (each output element reads one per piece)


def _h_cat(imp: Importer, node: torch.fx.Node):
    """cat(tensors, dim) as a selection among equal pieces: every input cut along ``dim``
    into pieces of g = gcd of the lengths (Slice views), each viewed with a new axis of
    length K (the piece count) before ``dim`` (a broadcast), ``Where(piece == j, ...)``
    picking piece j at position j of that axis, and a View merging the two axes. Each
    output element is a copy of one input element (exact for every value), read through
    views only: no read outside any input, and it fuses into the readers. Past CAT_CHUNKS
    pieces (each output element would load every piece), a tree of two-operand ``Cat``
    nodes (``_cat_tree``). Declined for empty inputs and symbolic lengths."""
    tensors = node.args[0]
    dim = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim", 0)
    dtype, shape = tensor_type(node)
    if not isinstance(tensors, list | tuple) or type(dim) is not int:
        return None
    nodes = [imp.g.nodes[imp.env[t.name]] for t in tensors]
    rank = len(shape)
    if rank == 0:
        return None
    dim %= rank
    # Empty pieces contribute no element (their dtypes still promote: ``dtype`` is the
    # result's): a piece of length 0 along ``dim``, and PyTorch's legacy 1-D empty tensor,
    # which cat accepts beside any shape (a key/value cache before its first step).
    nodes = [
        n
        for n in nodes
        if not (n.shape == (0,) and rank != 1) and not (len(n.shape) == rank and n.shape[dim] == 0)
    ]
    if not nodes or any(len(n.shape) != rank for n in nodes):
        return None
    if len(nodes) == 1:  # a copy of the one piece with elements, in the result's dtype
        x = nodes[0].name  # (a Cast, as clone: cat's result never shares the piece's memory)
        return imp.add(Node(node.name, "Cast", (x,), (dtype,), dtype, tuple(shape)), node.name)
    lengths = [n.shape[dim] for n in nodes]
    if any(n <= 0 or n >= min(MARKERS) for n in lengths):
        return None
    g = math.gcd(*lengths)
    k = sum(n // g for n in lengths)
    if k > CAT_CHUNKS:
        return _cat_tree(imp, [imp.cast(n.name, dtype) for n in nodes], dim, node.name)
    piece = tuple(g if d == dim else s for d, s in enumerate(shape))
    wide = (*shape[:dim], 1, g, *shape[dim + 1 :])
    grid = (*shape[:dim], k, g, *shape[dim + 1 :])
    pieces = []
    for n in nodes:
        src = imp.cast(n.name, dtype)
        for start in range(0, n.shape[dim], g):
            sl = imp.add(
                Node(
                    imp.fresh("cat_piece"),
                    "Slice",
                    (src,),
                    (dim, start, start + g, 1),
                    dtype,
                    piece,
                )
            )
            v = imp.add(Node(imp.fresh("cat_axis"), "View", (sl,), (wide,), dtype, wide))
            pieces.append(
                imp.add(Node(imp.fresh("cat_wide"), "Expand", (v,), (grid,), dtype, grid))
            )
    at = tuple(k if d == dim else 1 for d in range(rank + 1))
    iota = imp.add(Node(imp.fresh("cat_iota"), "Arange", (), (0, 1, k, "i64"), "i64", (k,)))
    iota = imp.add(Node(imp.fresh("cat_iota_view"), "View", (iota,), (at,), "i64", at))
    out = pieces[-1]
    for j in range(k - 2, -1, -1):
        sel = imp.add(
            Node(imp.fresh("cat_sel"), "Eq", (iota, imp.scalar(j, "i64")), (), "bool", at)
        )
        out = imp.add(Node(imp.fresh("cat_where"), "Where", (sel, pieces[j], out), (), dtype, grid))
    return imp.add(Node(node.name, "View", (out,), (tuple(shape),), dtype, tuple(shape)), node.name)


def _cat_tree(imp: Importer, names: list[str], dim: int, name: str) -> str:
    """``names`` joined along ``dim`` by two-operand ``Cat`` nodes in a balanced tree, the
    root named ``name``: each element is copied once per level (log2 of the count), a
    single copy for two inputs (a cache grown by one step, a class token before patches)."""

    def join(part: list[str], out: str | None) -> str:
        if len(part) == 1:
            return part[0]
        mid = len(part) // 2
        a, b = join(part[:mid], None), join(part[mid:], None)
        na, nb = imp.g.nodes[a], imp.g.nodes[b]
        shape = tuple(
            x + y if d == dim else x
            for d, (x, y) in enumerate(zip(na.shape, nb.shape, strict=True))
        )
        return imp.add(Node(out or imp.fresh("cat"), "Cat", (a, b), (dim,), na.dtype, shape), out)

    return join(names, name)


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


def _h_slice_scatter(imp: Importer, node: torch.fx.Node):
    """slice_scatter(base, src, dim, start, end, 1): base with ``[start:end]`` along ``dim``
    replaced by src (a slice assignment, functionalised: Bart's shifted decoder ids, Swin's
    window masks). src padded to base's shape, then selected where ``start <= i < end``
    along ``dim`` (an arange compared, broadcast): data movement and selects, exact for
    every value. Bounds are Python's slice bounds (clamped); a step other than 1, and
    symbolic sizes or bounds, stay PyTorch's op."""
    args = [*node.args, *[None] * (6 - len(node.args))]
    names = ("self", "src", "dim", "start", "end", "step")
    base, src, dim, start, end, step = (
        node.kwargs.get(k, a) if a is None else a for k, a in zip(names, args, strict=True)
    )
    dim = 0 if dim is None else dim
    step = 1 if step is None else step
    if not all(v is None or type(v) is int for v in (dim, start, end, step)) or step < 1:
        return None
    bn, sn = imp.g.nodes[imp.env[base.name]], imp.g.nodes[imp.env[src.name]]
    dtype, shape = tensor_type(node)
    rank = len(shape)
    if rank == 0 or bn.dtype != dtype or sn.dtype != dtype or tuple(bn.shape) != tuple(shape):
        return None
    dim %= rank
    n = shape[dim]
    if any(v in MARKERS for v in shape) or any(v in MARKERS for v in sn.shape):
        return None
    lo, hi, _ = slice(start, end, step).indices(n)
    hi = max(hi, lo)
    m = len(range(lo, hi, step))
    want = tuple(m if d == dim else shape[d] for d in range(rank))
    if tuple(sn.shape) != want:
        return None
    if step > 1 and m > 1:
        return _strided_slice_scatter(imp, node, bn.name, sn.name, dim, lo, m, step)
    hi = lo + m  # one element (or none) at a step: the same as a step of 1
    if (lo, hi) == (0, n) or lo == hi:  # the whole of base (src's values), or none of it
        whole = sn.name if lo < hi else bn.name
        return imp.add(Node(node.name, "Cast", (whole,), (dtype,), dtype, shape), node.name)
    pads = [0] * (2 * rank)
    pads[2 * dim], pads[2 * dim + 1] = lo, n - hi
    fill = float_bits(0.0)
    padded = imp.add(
        Node(imp.fresh("scatter_pad"), "Pad", (sn.name,), (tuple(pads), fill), dtype, shape)
    )
    axis = tuple(n if d == dim else 1 for d in range(rank))
    idx = imp.add(Node(imp.fresh("scatter_i"), "Arange", (), (0, 1, n, "i64"), "i64", (n,)))
    idx = imp.add(Node(imp.fresh("scatter_iv"), "View", (idx,), (axis,), "i64", axis))
    tests = [("Lt", idx, hi)] if hi != n else []
    tests += [("Ge", idx, lo)] if lo != 0 else []
    return select_by_position(imp, padded, bn.name, idx, tests, dtype, shape, node.name)


def _strided_slice_scatter(
    imp: Importer, node: torch.fx.Node, base: str, src: str, dim: int, lo: int, m: int, step: int
):
    """base with every ``step``-th element along ``dim`` from ``lo`` (``m`` of them)
    replaced by src (the backward of a strided slice: Swin's patch merging takes
    ``x[:, 0::2]``): src spread ``step`` apart (a View, a zero Pad of a new axis, a View),
    placed at ``lo`` (padded, cropped where it passes the end), then selected where
    ``i >= lo``, ``i - lo < (m - 1) * step + 1`` and ``(i - lo) % step == 0`` along ``dim``
    (an arange compared, broadcast). Data movement and selects: exact for every value."""
    dtype, shape = tensor_type(node)
    rank, n = len(shape), shape[dim]
    src_shape = imp.g.nodes[src].shape
    zero = float_bits(0.0)
    one = (*src_shape[:dim], m, 1, *src_shape[dim + 1 :])
    x = imp.add(Node(imp.fresh("spread_v"), "View", (src,), (one,), dtype, one))
    pads = [0] * (2 * rank + 2)
    pads[2 * dim + 3] = step - 1
    wide = (*src_shape[:dim], m, step, *src_shape[dim + 1 :])
    x = imp.add(Node(imp.fresh("spread_p"), "Pad", (x,), (tuple(pads), zero), dtype, wide))
    spread = (*src_shape[:dim], m * step, *src_shape[dim + 1 :])
    x = imp.add(Node(imp.fresh("spread"), "View", (x,), (spread,), dtype, spread))
    place = [0] * (2 * rank)
    place[2 * dim], place[2 * dim + 1] = lo, n - lo - m * step
    x = pad_or_crop(imp, x, place, zero, dtype)
    axis = tuple(n if d == dim else 1 for d in range(rank))
    idx = imp.add(Node(imp.fresh("spread_i"), "Arange", (), (-lo, 1, n, "i64"), "i64", (n,)))
    idx = imp.add(Node(imp.fresh("spread_iv"), "View", (idx,), (axis,), "i64", axis))
    rem = imp.add(
        Node(imp.fresh("spread_r"), "Remainder", (idx, imp.scalar(step, "i64")), (), "i64", axis)
    )
    tests = [("Eq", rem, 0)]
    if lo > 0:
        tests.append(("Ge", idx, 0))
    if lo + (m - 1) * step + 1 < n:
        tests.append(("Lt", idx, (m - 1) * step + 1))
    return select_by_position(imp, x, base, idx, tests, dtype, shape, node.name)


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
        "aten.cat.default": _h_cat,
        "aten.repeat.default": _h_repeat,
        "aten.flip.default": _h_flip,
        "aten.constant_pad_nd.default": _h_constant_pad,
        "aten.slice_scatter.default": _h_slice_scatter,
        "aten.as_strided.default": _h_as_strided,
    }
)
