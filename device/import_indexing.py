"""Importer handlers for indexing: embeddings, ``index_select``, advanced ``index`` (one
index tensor or several), ``index_put``, indices that repeat rows (nearest upsampling) and
rolls; constant indices are evaluated at import where they are small.
"""

from __future__ import annotations

import math

import torch
import torch.fx

from saturn.eqsat import optable as ot
from saturn.eqsat.graph import Node, bits_float, float_bits
from saturn.eqsat.program import packed_strides
from saturn.eqsat.types import broadcast

from .import_core import Importer, handles, is_symbolic, tensor_type

_CONST_LIMIT = 1 << 20  # elements: larger constants are not evaluated at import


class _ReadsInputError(Exception):
    """An FX node's value depends on a graph input (not a constant)."""


def _constant(node, memo: dict):
    """The value of an FX node computed from constants alone (no graph input), evaluated on
    the CPU with PyTorch's own ops; None where it reads an input, draws random numbers or
    is large. Index tensors PyTorch's decompositions build (arange, scaled, cast) are."""
    if not isinstance(node, torch.fx.Node):
        return node
    if node.name in memo:
        return memo[node.name]
    memo[node.name] = None
    target = node.target
    if node.op != "call_function" or not isinstance(target, torch._ops.OpOverload):
        return None
    if target._schema.is_mutable or torch.Tag.nondeterministic_seeded in target.tags:
        return None

    def conv(a):
        if isinstance(a, torch.fx.Node):
            v = _constant(a, memo)
            if v is None:
                raise _ReadsInputError
            return v
        if isinstance(a, list | tuple):
            return type(a)(conv(x) for x in a)
        if isinstance(a, torch.device):
            return torch.device("cpu")
        return a

    try:
        args = conv(node.args)
        kwargs = {k: conv(v) for k, v in node.kwargs.items()}
    except _ReadsInputError:
        return None
    val = node.meta.get("val")
    if not isinstance(val, torch.Tensor) or val.numel() > _CONST_LIMIT:
        return None
    memo[node.name] = target(*args, **kwargs)
    return memo[node.name]


def _repeat_factors(imp, xn: Node, indices, axes: list[int], shape) -> dict | None:
    """{axis: k} where each index of ``axes`` is the constant arange(k * n) // k laid out
    along its own output axis; None otherwise."""
    memo = imp.constants
    factors = {}
    for d in axes:
        t = _constant(indices[d], memo)
        if not isinstance(t, torch.Tensor) or t.dtype not in (torch.int64, torch.int32):
            return None
        n, out = xn.shape[d], shape[d]
        if n <= 0 or out % n or t.dim() > len(axes):
            return None
        k = out // n
        layout = [out if e == d else 1 for e in axes][len(axes) - t.dim() :]
        want = (torch.arange(out) // k).view(*layout)
        if t.shape != want.shape or not torch.equal(t.to(torch.int64), want):
            return None
        factors[d] = k
    return factors


def _h_index_repeat(imp: Importer, node: torch.fx.Node):
    """x[..., i_h, i_w] with constant indices that repeat each element k times along their
    axes (i = arange(k * n) // k: nearest upsampling by an integer factor, as PyTorch's
    decomposition writes it): a View splitting each axis, an Expand of the new unit axes to
    k, a View merging them. The indices are evaluated and compared exactly; anything else
    stays the op."""
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    x, indices = node.args[:2]
    xn = imp.g.nodes[imp.env[x.name]]
    dtype, shape = tensor_type(node)
    axes = [d for d, t in enumerate(indices) if t is not None]
    if not axes or axes != list(range(axes[0], axes[-1] + 1)) or len(indices) > len(xn.shape):
        return None
    if len(shape) != len(xn.shape):
        return None
    with unset_fake_temporarily():  # backends run under the tracer's fake mode
        factors = _repeat_factors(imp, xn, indices, axes, shape)
    if factors is None:
        return None
    split, expanded = [], []
    for d, n in enumerate(xn.shape):
        split.append(n)
        expanded.append(n)
        if d in factors:
            split.append(1)
            expanded.append(factors[d])
    split, expanded = tuple(split), tuple(expanded)
    v = imp.add(Node(imp.fresh("repeat_split"), "View", (xn.name,), (split,), dtype, split))
    e = imp.add(Node(imp.fresh("repeat"), "Expand", (v,), (expanded,), dtype, expanded))
    return imp.add(Node(node.name, "View", (e,), (tuple(shape),), dtype, tuple(shape)), node.name)


def take_rows(
    imp: Importer, table: str, index: str, name: str, shape: tuple, fx: str | None = None
) -> str | None:
    """``table``'s slices along its first axis picked by ``index``, as graph node ``name``
    of ``shape`` (index shape + the table's trailing shape): the table viewed as 2-D (rows x
    the rest), a Take, and a View to ``shape``; an evenly spaced constant index in range
    (``arange``) a Slice. None where the index is not i32/i64 (a bool mask selects, not
    takes) or the shapes disagree."""
    tn, xn = imp.g.nodes[table], imp.g.nodes[index]
    dtype = tn.dtype
    if xn.dtype not in ot.INDEX_DTYPES or not tn.shape:
        return None
    rest = tuple(tn.shape[1:])
    if tuple(shape) != (*xn.shape, *rest):
        return None
    if xn.op == "Arange" and len(xn.shape) == 1:
        # rows start, start + step, ...: a Slice view (position embeddings), where every
        # index is in range; out of range, the take raises at the call as PyTorch does
        start, step, n, _ = xn.attrs
        if n > 0 and step >= 1 and start >= 0 and start + step * (n - 1) < tn.shape[0]:
            end = start + step * (n - 1) + 1
            return imp.add(Node(name, "Slice", (table,), (0, start, end, step), dtype, shape), fx)
    flat = (tn.shape[0], math.prod(rest))
    if tuple(tn.shape) != flat:
        table = imp.add(Node(imp.fresh("take_table"), "View", (table,), (flat,), dtype, flat))
    taken = (*xn.shape, flat[1])
    if taken == tuple(shape):
        return imp.add(Node(name, "Take", (table, index), (), dtype, taken), fx)
    t = imp.add(Node(imp.fresh("take"), "Take", (table, index), (), dtype, taken))
    return imp.add(Node(name, "View", (t,), (tuple(shape),), dtype, tuple(shape)), fx)


def _h_embedding(imp: Importer, node: torch.fx.Node):
    """embedding(weight, indices, ...): weight's rows (padding_idx and the gradient options
    change only the backward)."""
    weight, indices = (imp.env[a.name] for a in node.args[:2])
    if len(imp.g.nodes[weight].shape) != 2:
        return None
    return take_rows(imp, weight, indices, node.name, tensor_type(node)[1], node.name)


def _h_index_select(imp: Importer, node: torch.fx.Node):
    """index_select(x, dim, index): along the first axis a take; along another, the take
    of x permuted to bring ``dim`` first, permuted back (both permutes are views)."""
    x, dim, index = node.args[:3]
    xn, inn = imp.g.nodes[imp.env[x.name]], imp.g.nodes[imp.env[index.name]]
    rank = len(xn.shape)
    dtype, shape = tensor_type(node)
    if rank == 0 or type(dim) is not int or len(inn.shape) > 1:
        return None
    dim %= rank
    if dim == 0:
        return take_rows(imp, xn.name, inn.name, node.name, shape, node.name)
    if len(inn.shape) != 1 or inn.dtype not in ot.INDEX_DTYPES:
        return None  # (checked before any node is added: nothing is left behind)
    perm = (dim, *(d for d in range(rank) if d != dim))
    moved = tuple(xn.shape[d] for d in perm)
    p = imp.add(Node(imp.fresh("take_first"), "Permute", (xn.name,), (perm,), dtype, moved))
    t = take_rows(imp, p, inn.name, imp.fresh("take_moved"), (*inn.shape, *moved[1:]))
    back = tuple(sorted(range(rank), key=perm.__getitem__))
    return imp.add(Node(node.name, "Permute", (t,), (back,), dtype, tuple(shape)), node.name)


def _h_index(imp: Importer, node: torch.fx.Node):
    """x[index] with one integer index on the first axis: a take. Constant indices that
    repeat elements (nearest upsampling) are views instead (``_h_index_repeat``)."""
    done = _h_index_repeat(imp, node)
    if done is not None:
        return done
    x, indices = node.args[:2]
    if len(indices) > 1:
        return _index_several(imp, node)
    if len(indices) != 1 or not isinstance(indices[0], torch.fx.Node):
        return None
    table, index = imp.env[x.name], imp.env[indices[0].name]
    tn, inn = imp.g.nodes[table], imp.g.nodes[index]
    if not tn.shape or inn.dtype not in ot.INDEX_DTYPES:
        return None
    index = _wrapped(imp, index, tn.shape[0])
    return take_rows(imp, table, index, node.name, tensor_type(node)[1], node.name)


def _index_several(imp: Importer, node: torch.fx.Node) -> str | None:
    """x[i0, i1, ..., ik-1] with index tensors on the first k axes (a mask built from
    broadcast aranges, as Hugging Face's mask functions do): one take of x viewed as
    (x.shape[0] * ... * x.shape[k-1]) rows by the flat index ``((i0 * s1) + i1) * s2 ...``
    of the broadcast indices. Only where every index is known in range at compile time
    (an arange, shifted by constants, through views): a flat index in range does not mean
    each is, so an index read at the call would not raise as PyTorch does, per axis and
    with its own value. Others stay PyTorch's op."""
    x, indices = node.args[:2]
    if not all(isinstance(i, torch.fx.Node) for i in indices):
        return None  # a None entry: an axis taken whole before an indexed one
    xn = imp.g.nodes[imp.env[x.name]]
    k = len(indices)
    names = [imp.env[i.name] for i in indices]
    if len(xn.shape) < k or any(imp.g.nodes[n].dtype not in ot.INDEX_DTYPES for n in names):
        return None
    for n, size in zip(names, xn.shape[:k], strict=False):
        bounds = _static_range(imp, n)
        if bounds is None or bounds[0] < 0 or bounds[1] >= size:
            return None
    flat = imp.cast(names[0], "i64")
    for n, size in zip(names[1:], xn.shape[1:k], strict=True):
        a, b = imp.g.nodes[flat], imp.g.nodes[n]
        shape = broadcast(a.shape, b.shape)
        scaled = imp.add(
            Node(imp.fresh("index_row"), "Mul", (flat, imp.scalar(size, "i64")), (), "i64", a.shape)
        )
        flat = imp.add(
            Node(imp.fresh("index_flat"), "Add", (scaled, imp.cast(n, "i64")), (), "i64", shape)
        )
    rows = (math.prod(xn.shape[:k]), *xn.shape[k:])
    table = imp.add(Node(imp.fresh("index_table"), "View", (xn.name,), (rows,), xn.dtype, rows))
    return take_rows(imp, table, flat, node.name, tensor_type(node)[1], node.name)


def _static_range(imp: Importer, name: str) -> tuple[int, int] | None:
    """The least and greatest element of an integer value known at compile time: an
    arange, through views (which only rearrange or repeat its elements) and additions or
    subtractions of integer constants (``2 - arange(3)``); None for anything else. The
    value is kept as ``sign * n + shift`` of the node ``n`` reached so far."""
    sign, shift, n = 1, 0, imp.g.nodes[name]
    while True:
        if n.op == "Arange":
            start, step, count, _ = n.attrs
            if count <= 0:
                return None
            ends = [sign * e + shift for e in (start, start + step * (count - 1))]
            return min(ends), max(ends)
        if n.row is not None and n.row.category == ot.MOVEMENT:
            n = imp.g.nodes[n.args[0]]
            continue
        if n.op in ("Add", "Sub") and len(n.args) == 2:
            a, b = (imp.g.nodes[v] for v in n.args)
            const = [c.op == "Scalar" and c.dtype in ot.INTS for c in (a, b)]
            if const[1]:  # a + c, a - c
                c = int(bits_float(b.attrs[0]))
                shift += sign * (c if n.op == "Add" else -c)
                n = a
                continue
            if const[0]:  # c + b, c - b
                shift += sign * int(bits_float(a.attrs[0]))
                sign = sign if n.op == "Add" else -sign
                n = b
                continue
        return None


def _wrapped(imp: Importer, index: str, rows: int) -> str:
    """Advanced indexing's index with negatives counted from the end (``x[-1]`` is the last
    row): ``where(i < 0, i + rows, i)``. An index below ``-rows`` stays negative and the take
    raises, as PyTorch does; ``embedding`` and ``index_select`` do not wrap and skip this."""
    n = imp.g.nodes[index]
    if n.op == "Arange" and n.attrs[0] >= 0 and n.attrs[1] >= 0:
        return index  # no negative entry (a Slice view when in range: see take_rows)
    dtype, shape = n.dtype, n.shape
    zero, size = imp.scalar(0, dtype), imp.scalar(rows, dtype)
    neg = imp.add(Node(imp.fresh("negative"), "Lt", (index, zero), (), "bool", shape))
    up = imp.add(Node(imp.fresh("from_end"), "Add", (index, size), (), dtype, shape))
    return imp.add(Node(imp.fresh("wrapped"), "Where", (neg, up, index), (), dtype, shape))


def _h_index_put(imp: Importer, node: torch.fx.Node):
    """index_put(x, [index], values, accumulate=True) with one integer index on the first
    axis (how an embedding's gradient is built): x viewed as rows x the rest, the index
    flattened, values broadcast to a row per index, an IndexAdd, viewed back. Without
    accumulate (the last write of a repeated index wins) it stays PyTorch's op. Half types
    for a GPU add in float32 and round once (the row add has no half form): PyTorch's CUDA
    kernel rounds to the half type after each add, repeated indices in an order it leaves
    unspecified, so the two agree within that rounding, not bit for bit. saturn:0 keeps the
    op in its own type (its CPU kernel's)."""
    x, indices, values = node.args[:3]
    accumulate = node.args[3] if len(node.args) > 3 else node.kwargs.get("accumulate", False)
    if accumulate is not True or len(indices) != 1 or not isinstance(indices[0], torch.fx.Node):
        return None
    if not isinstance(values, torch.fx.Node):
        return None
    xn = imp.g.nodes[imp.env[x.name]]
    inn = imp.g.nodes[imp.env[indices[0].name]]
    vn = imp.g.nodes[imp.env[values.name]]
    dtype, shape = tensor_type(node)
    if not xn.shape or inn.dtype not in ot.INDEX_DTYPES or vn.dtype != dtype:
        return None
    rest = tuple(xn.shape[1:])
    full = (*inn.shape, *rest)
    lead = len(full) - len(vn.shape)
    if lead < 0 or any(v not in (1, f) for v, f in zip(vn.shape, full[lead:], strict=True)):
        return None  # values that do not broadcast to a row per index
    n, width = math.prod(inn.shape), math.prod(rest)
    flat, rows = (xn.shape[0], width), (n, width)
    base = xn.name
    if tuple(xn.shape) != flat:
        base = imp.add(Node(imp.fresh("add_table"), "View", (base,), (flat,), dtype, flat))
    index = inn.name
    if tuple(inn.shape) != (n,):
        index = imp.add(Node(imp.fresh("add_index"), "View", (index,), ((n,),), inn.dtype, (n,)))
    vals = vn.name
    if tuple(vn.shape) != full:
        vals = imp.add(Node(imp.fresh("add_values"), "Expand", (vals,), (full,), dtype, full))
    if full != rows:
        vals = imp.add(Node(imp.fresh("add_rows"), "View", (vals,), (rows,), dtype, rows))
    acc = dtype
    if imp.gpu and dtype in ot.HALVES:  # CUDA's accumulation: float32, rounded once
        acc = "f32"
        base = imp.add(Node(imp.fresh("add_wide"), "Cast", (base,), (acc,), acc, flat))
        vals = imp.add(Node(imp.fresh("add_vwide"), "Cast", (vals,), (acc,), acc, rows))
    if flat == tuple(shape) and acc == dtype:
        return imp.add(Node(node.name, "IndexAdd", (base, index, vals), (), dtype, flat), node.name)
    t = imp.add(Node(imp.fresh("index_add"), "IndexAdd", (base, index, vals), (), acc, flat))
    if acc != dtype:
        last = flat == tuple(shape)
        name = node.name if last else imp.fresh("add_round")
        t = imp.add(Node(name, "Cast", (t,), (dtype,), dtype, flat), node.name if last else None)
        if last:
            return t
    return imp.add(Node(node.name, "View", (t,), (tuple(shape),), dtype, tuple(shape)), node.name)


def select_by_position(
    imp: Importer,
    x: str,
    base: str,
    positions: str,
    tests: list[tuple[str, str, int]],
    dtype: str,
    shape: tuple[int, ...],
    name: str | None = None,
) -> str:
    """x where every test ``(op, value, bound)`` holds of ``op(value, bound)`` (``value`` an
    integer node broadcast against x, usually ``positions``, an arange of the positions
    along one axis), base elsewhere: a chain of Wheres, the last one named ``name``. What
    slice assignments (strided too) and ``as_strided_scatter`` are once src is padded to
    base's shape: selects, exact for every value."""
    axis = imp.g.nodes[positions].shape
    out = x
    for k, (op, value, bound) in enumerate(tests):
        inside = imp.add(
            Node(imp.fresh("pos_in"), op, (value, imp.scalar(bound, "i64")), (), "bool", axis)
        )
        last = k == len(tests) - 1
        node = name if last and name else imp.fresh("pos_sel")
        out = imp.add(
            Node(node, "Where", (inside, out, base), (), dtype, shape), name if last else None
        )
    return out


def _h_as_strided_scatter(imp: Importer, node: torch.fx.Node):
    """as_strided_scatter(base, src, size, stride, offset) where size and stride lay src out
    packed (its elements in order) from ``offset`` of a packed base: the backward of an
    ``as_strided`` that only re-describes (Swin's flatten). src viewed as base's shape where
    it covers base whole; otherwise base's flat elements [offset, offset + numel) replaced
    (a flat pad of src, selected by position). Moves bits: exact for every value. Any
    other layout (overlapping, reordered) stays PyTorch's op."""
    base, src, size, stride = node.args[:4]
    offset = node.args[4] if len(node.args) > 4 else node.kwargs.get("storage_offset")
    offset = 0 if offset is None else offset
    bval, sval = (b.meta.get("val") if isinstance(b, torch.fx.Node) else None for b in (base, src))
    if not isinstance(bval, torch.Tensor) or not isinstance(sval, torch.Tensor):
        return None
    ints = (*size, *stride, offset, *bval.shape, *sval.shape)
    if not all(type(v) is int for v in ints) or not bval.is_contiguous():
        return None
    size = tuple(size)
    packed = [(n, st) for n, st in zip(size, stride, strict=True) if n != 1]
    if tuple(sval.shape) != size or packed != [
        (n, st) for n, st in zip(size, packed_strides(size), strict=True) if n != 1
    ]:
        return None
    dtype, shape = tensor_type(node)
    n, k = math.prod(shape), math.prod(size)
    if offset < 0 or offset + k > n or sval.dtype != bval.dtype:
        return None
    sn, bn = imp.env[src.name], imp.env[base.name]
    flat = imp.add(Node(imp.fresh("strided_src"), "View", (sn,), ((k,),), dtype, (k,)))
    if k == n:
        return imp.add(Node(node.name, "View", (flat,), (shape,), dtype, shape), node.name)
    pads = ((offset, n - offset - k), float_bits(0.0))
    padded = imp.add(Node(imp.fresh("strided_pad"), "Pad", (flat,), pads, dtype, (n,)))
    idx = imp.add(Node(imp.fresh("strided_i"), "Arange", (), (0, 1, n, "i64"), "i64", (n,)))
    flat_base = imp.add(Node(imp.fresh("strided_b"), "View", (bn,), ((n,),), dtype, (n,)))
    tests = [("Lt", idx, offset + k)] if offset + k != n else []
    tests += [("Ge", idx, offset)] if offset else []
    out = select_by_position(imp, padded, flat_base, idx, tests, dtype, (n,))
    return imp.add(Node(node.name, "View", (out,), (shape,), dtype, shape), node.name)


def _h_roll(imp: Importer, node: torch.fx.Node):
    """roll(x, shifts, dims): one ``Roll`` with a shift in [0, size) per axis (shifts on one
    axis add up, as PyTorch applies them one after another); with no dims, the flattened
    tensor rolled and viewed back. Nothing moves (every shift a multiple of its size): a
    copy (``Cast`` to its own dtype: roll's result never shares x's memory). Declined where
    a rolled axis is symbolic (the shift modulo its size is unknown here)."""
    x = node.args[0]
    shifts = node.args[1] if len(node.args) > 1 else node.kwargs.get("shifts")
    dims = node.args[2] if len(node.args) > 2 else node.kwargs.get("dims", ())
    shifts = [shifts] if isinstance(shifts, int) else list(shifts or ())
    dims = [dims] if isinstance(dims, int) else list(dims or ())
    xn = imp.g.nodes[imp.env[x.name]]
    dtype, shape = tensor_type(node)
    rank, src = len(xn.shape), xn.name
    if not all(type(v) is int for v in (*shifts, *dims)) or not shifts or rank == 0:
        return None
    if not dims:  # the flattened tensor rolled
        if len(shifts) != 1:
            return None
        flat = (math.prod(xn.shape),)
        src = imp.add(Node(imp.fresh("roll_flat"), "View", (src,), (flat,), dtype, flat))
        dims, rank = [0], 1
    if len(dims) != len(shifts) or not all(-rank <= d < rank for d in dims):
        return None
    sizes = imp.g.nodes[src].shape
    per_axis = [0] * rank
    for s, d in zip(shifts, dims, strict=True):
        if is_symbolic(sizes[d % rank]):
            return None
        per_axis[d % rank] += s
    per_axis = tuple(s % n if n else 0 for s, n in zip(per_axis, sizes, strict=True))
    flat = src != xn.name
    name = imp.fresh("roll") if flat else node.name
    op, attrs = ("Roll", (per_axis,)) if any(per_axis) else ("Cast", (dtype,))
    out = imp.add(Node(name, op, (src,), attrs, dtype, sizes), None if flat else node.name)
    if not flat:
        return out
    return imp.add(Node(node.name, "View", (out,), (tuple(shape),), dtype, tuple(shape)), node.name)


handles(
    {
        "aten.roll.default": _h_roll,
        "aten._unsafe_index.Tensor": _h_index_repeat,
        "aten.index.Tensor": _h_index,
        "aten.embedding.default": _h_embedding,
        "aten.index_select.default": _h_index_select,
        "aten.index_put.default": _h_index_put,
        "aten.as_strided_scatter.default": _h_as_strided_scatter,
    }
)
