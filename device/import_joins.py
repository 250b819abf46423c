"""Importer handlers that join tensors along an axis: concatenation and slice scatter,
as selections among views a loop reads (one kernel with their readers) where few pieces
make them, else two-operand ``Cat`` nodes or a padded copy.
"""

from __future__ import annotations

import math

import torch
import torch.fx

from saturn.eqsat.graph import Node, float_bits

from .import_core import MARKERS, Importer, handles, tensor_type
from .import_indexing import select_by_position
from .import_movement import pad_or_crop

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
    names = [imp.cast(n.name, dtype) for n in nodes]
    joined = cat_by_position(imp, names, dim, dtype, tuple(shape), node.name)
    return joined or _cat_tree(imp, names, dim, node.name)


def cat_by_position(
    imp: Importer, names: list[str], dim: int, dtype: str, shape: tuple, name: str
) -> str | None:
    """The pieces ``names`` (``dtype``, none empty) joined along ``dim`` as views a loop
    reads: each cut into chunks of their lengths' greatest common divisor, the chunk
    picked by its position (an arange compared; a Where per chunk), the last node named
    ``name``. None past ``CAT_CHUNKS`` chunks (each output element reads every chunk)."""
    lengths = [imp.g.nodes[n].shape[dim] for n in names]
    g, k = _chunks(lengths)
    if k > CAT_CHUNKS:
        return None
    rank = len(shape)
    piece = tuple(g if d == dim else s for d, s in enumerate(shape))
    wide = (*shape[:dim], 1, g, *shape[dim + 1 :])
    grid = (*shape[:dim], k, g, *shape[dim + 1 :])
    pieces = []
    for src, length in zip(names, lengths, strict=True):
        for start in range(0, length, g):
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
    return imp.add(Node(name, "View", (out,), (shape,), dtype, shape), name)


def _chunks(lengths: list[int]) -> tuple[int, int]:
    """The chunk length pieces of ``lengths`` are cut into (their greatest common divisor)
    and how many chunks that makes."""
    g = math.gcd(*lengths)
    return g, sum(n // g for n in lengths)


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


def _h_slice_scatter(imp: Importer, node: torch.fx.Node):
    """slice_scatter(base, src, dim, start, end, 1): base with ``[start:end]`` along ``dim``
    replaced by src (a slice assignment, functionalised: Bart's shifted decoder ids, Swin's
    window masks, the slices' gradients in a rotary embedding's backward). Base's parts
    before and after with src between, joined as ``cat`` joins (``cat_by_position``:
    views its readers' loop reads); where that takes more than ``CAT_CHUNKS`` chunks, src
    padded to base's shape (a kernel), then selected where ``start <= i < end`` along
    ``dim`` (an arange compared, broadcast). Data movement and selects, exact for every
    value. Bounds are Python's slice bounds (clamped); a step of k > 1 spreads src
    (``_strided_slice_scatter``); symbolic sizes or bounds stay PyTorch's op."""
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
    # base's parts before and after, and src, joined: views a loop reads, where the padded
    # src below is a kernel of its own (a rotary embedding's backward: 8 a layer)
    parts = [p for p in ((0, lo), None, (hi, n)) if p is None or p[0] < p[1]]
    if _chunks([m if p is None else p[1] - p[0] for p in parts])[1] <= CAT_CHUNKS:
        names = [
            sn.name
            if p is None
            else imp.add(
                Node(
                    imp.fresh("scatter_part"),
                    "Slice",
                    (bn.name,),
                    (dim, *p, 1),
                    dtype,
                    tuple(p[1] - p[0] if d == dim else shape[d] for d in range(rank)),
                )
            )
            for p in parts
        ]
        return cat_by_position(imp, names, dim, dtype, tuple(shape), node.name)
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


handles(
    {
        "aten.cat.default": _h_cat,
        "aten.slice_scatter.default": _h_slice_scatter,
    }
)
