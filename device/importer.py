"""FX (after AOTAutograd) to a graph in saturn's term language.

Types (dtype, shape, strides) come from the fake tensor on each node; a node without one
is refused. Non-tensor arguments become attributes or scalar constants; mixed dtypes get
explicit casts, as PyTorch promotes; ops with no row (or with an argument a kernel would
ignore, such as ``alpha`` in add) become opaque host nodes that call the original op.
Tuple results are read through getitem. The output spec keeps ``None`` positions.
"""

from __future__ import annotations

import math
import operator
import threading
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.fx

from saturn.eqsat import optable as ot
from saturn.eqsat.graph import Graph, Node, bits_float, float_bits
from saturn.eqsat.program import packed_strides
from saturn.eqsat.types import broadcast

from .dtypes import DTYPES, TORCH_DTYPES, HostCall


class UnsupportedError(Exception):
    """The graph cannot be represented; it runs uncompiled and the reason is logged."""


SIZE = "<size>"  # the env entry of an FX node that computes a size (kept on the host)


@dataclass
class Imported:
    graph: Graph
    inputs: list[str | None]  # graph node name per placeholder (None: a size input)
    input_meta: list[tuple[str, tuple[int, ...], tuple[int, ...]]]  # dtype, shape, strides
    outputs: list  # graph node name per output position, None, or ("size", value)
    # (dtype, shape, strides) per position; ("size", ()) for a size, None for None
    output_meta: list[tuple | None]
    host_calls: dict[str, HostCall] = field(default_factory=dict)
    fx_names: dict[str, str] = field(default_factory=dict)  # graph node -> FX node
    custom_nodes: dict[str, int] = field(default_factory=dict)  # placed as Custom kernels
    symbols: dict[str, int] = field(default_factory=dict)  # symbolic size -> its marker
    # sizes used as values: a leading int64 0-d input each (in ``inputs``), made per call
    # from its expression over the symbols (saturn.symbolic)
    size_values: list[tuple[str, object]] = field(default_factory=list)


def _meta(node: torch.fx.Node):
    val = node.meta.get("val")
    if val is None:
        raise UnsupportedError(f"node {node.name} ({node.target}) has no fake tensor value")
    return val


# Symbolic sizes. A graph whose shapes hold symbols (s0, s1, ...) is imported once with each
# symbol standing for a marker: a distinct prime far above any real extent. Every size in the
# imported graph, the e-graph and the program is then an integer whose factors say which
# symbols it is a product of (saturn.symbolic substitutes the call's sizes).
MARKERS = (1000003, 1000033, 1000037, 1000039, 1000081, 1000099, 1000117, 1000121)
_symbols = threading.local()


def _marker_of(sym) -> int:
    table = _symbols.table
    if sym not in table:
        if len(table) == len(MARKERS):
            raise UnsupportedError(f"more than {len(MARKERS)} symbolic sizes")
        table[sym] = MARKERS[len(table)]
    return table[sym]


def _symbolic(v: int) -> bool:
    """``v`` is an imported extent holding a symbol (a multiple of a marker)."""
    return v >= min(MARKERS) and any(v % m == 0 for m in MARKERS)


def _monomial(expr) -> bool:
    """``expr`` is an integer times a product of symbols (powers included)."""
    import sympy

    if len(sympy.Add.make_args(expr)) != 1:
        return False
    for f in sympy.Mul.make_args(expr):
        base, exp = f.as_base_exp()
        if not (f.is_Integer or (base.is_Symbol and exp.is_Integer and exp > 0)):
            return False
    return True


def concrete(x) -> int:
    """An int, or a SymInt with each symbol replaced by its marker."""
    if isinstance(x, int):
        return x
    if isinstance(x, torch.SymInt):
        expr = x.node.expr
        table = getattr(_symbols, "table", None)
        if table is None:
            raise UnsupportedError(f"symbolic size {x} outside an import")
        if not _monomial(expr):
            # substitution replaces marker factors: a sum or a quotient of symbols would
            # keep a marker-sized extent at the call
            raise UnsupportedError(f"size {x} is not a product of symbols and integers")
        subs = {sym: _marker_of(sym) for sym in sorted(expr.free_symbols, key=str)}
        v = expr.subs(subs)
        if not v.is_Integer:
            raise UnsupportedError(f"size {x} is not an integer expression")
        return int(v)
    raise UnsupportedError(f"size {x!r} of type {type(x).__name__}")


def _tensor_type(node: torch.fx.Node, val=None) -> tuple[str, tuple[int, ...]]:
    val = _meta(node) if val is None else val
    if not isinstance(val, torch.Tensor):
        raise UnsupportedError(f"node {node.name} produces {type(val).__name__}, not a tensor")
    if val.dtype not in DTYPES:
        raise UnsupportedError(f"node {node.name} has dtype {val.dtype}, which saturn does not run")
    return DTYPES[val.dtype], tuple(concrete(s) for s in val.shape)


class _Importer:
    def __init__(self, gm: torch.fx.GraphModule, replacements: bool = False):
        self.gm = gm
        self.replacements = replacements  # custom ops replacing ATen ops (GPU targets)
        self.gpu = replacements  # a GPU target: its kernels decide edge-case semantics
        self.g = Graph()
        self.env: dict[str, str] = {}  # FX node name -> graph node name
        self.host_calls: dict[str, HostCall] = {}
        self.fx_names: dict[str, str] = {}
        self.custom_nodes: dict[str, int] = {}  # node -> tensor operands (device custom ops)
        self.results: dict[str, tuple[str, ...]] = {}  # a multi-result node -> each result
        self.size_values: dict[str, object] = {}  # graph input -> its size expression
        self.constants: dict[str, object] = {}  # FX node -> its value, where constant
        self.count = 0

    def fresh(self, stem: str) -> str:
        self.count += 1
        return f"{stem}.{self.count}"

    def add(self, node: Node, fx: str | None = None) -> str:
        self.g.add(node)
        if fx:
            self.fx_names[node.name] = fx
        return node.name

    def scalar(self, value, dtype: str) -> str:
        if isinstance(value, bool):
            value = float(value)
        if dtype in ot.INTS and not isinstance(value, bool):
            info = np.iinfo(ot.NUMPY_DTYPE[dtype])
            if not info.min <= value <= info.max:
                # PyTorch wraps it in some ops and raises in others: run the graph as it is
                raise UnsupportedError(f"constant {value} does not fit {dtype}")
        return self.add(
            Node(self.fresh("const"), "Scalar", (), (float_bits(float(value)), dtype), dtype, ())
        )

    def cast(self, name: str, dtype: str) -> str:
        n = self.g.nodes[name]
        if n.dtype == dtype:
            return name
        if n.op == "Scalar":
            return self.add(Node(self.fresh("const"), "Scalar", (), (n.attrs[0], dtype), dtype, ()))
        return self.add(Node(self.fresh("cast"), "Cast", (name,), (dtype,), dtype, n.shape))

    def size_value(self, node: torch.fx.Node) -> str:
        """A size used as a value (``x * x.shape[0]``): an int64 0-d graph input the call
        makes from the size's expression (PyTorch rounds the Python int once into the
        op's dtype, as the cast does)."""
        val = _meta(node)
        if isinstance(val, int):
            return self.scalar(val, "i64")
        expr = val.node.expr
        for sym in expr.free_symbols:
            _marker_of(sym)  # each symbol must be read from an input at call time
        name = f"size_{node.name}"
        if name not in self.g.nodes:
            self.add(Node(name, "Input", (), (name,), "i64", ()))
            self.size_values[name] = expr
        return name

    def operand(self, a, dtype: str) -> str:
        """A tensor or Python-number operand, converted to ``dtype``."""
        if isinstance(a, torch.fx.Node) and self.env.get(a.name) == SIZE:
            return self.cast(self.size_value(a), dtype)
        if isinstance(a, torch.fx.Node):
            return self.cast(self.env[a.name], dtype)
        if isinstance(a, int | float | bool):
            return self.scalar(a, dtype)
        raise UnsupportedError(f"operand {a!r} of type {type(a).__name__}")

    def opaque(self, node: torch.fx.Node) -> str:
        """Keep ``node`` as a host call of the original op."""
        slots: list[str] = []

        def conv(a):
            if isinstance(a, torch.fx.Node) and self.env.get(a.name) == SIZE:
                raise UnsupportedError(f"{node.name} takes size {a.name} as an argument")
            if isinstance(a, torch.fx.Node):
                if a.name not in self.env:
                    raise UnsupportedError(f"{node.name} reads {a.name}, which has no value")
                slots.append(self.env[a.name])
                return ("t", len(slots) - 1)
            if isinstance(a, list | tuple):
                return type(a)(conv(x) for x in a)
            if isinstance(a, torch._ops.OpOverload):  # the op a functionalized call runs
                return ("op", str(a))
            if (
                isinstance(
                    a,
                    torch.dtype
                    | torch.device
                    | torch.layout
                    | torch.memory_format
                    | int
                    | float
                    | bool
                    | str,
                )
                or a is None
            ):
                return ("c", a)
            raise UnsupportedError(f"{node.name}: argument {a!r} cannot be kept")

        args = tuple(conv(a) for a in node.args)
        kwargs = {k: conv(v) for k, v in node.kwargs.items()}
        target = node.target
        spelled = (
            f"higher_order.{target.name()}.__call__"
            if isinstance(target, torch._ops.HigherOrderOperator)
            else str(target)
        )
        name = f"{spelled}#{node.name}"
        self.host_calls[name] = HostCall(spelled, args, kwargs)
        val = _meta(node)
        first = val
        if isinstance(val, list | tuple):
            # the step's own type is its first tensor's; an entry may be None (a gradient
            # the graph does not need), its readers' Items carry their types
            first = next((t for t in val if isinstance(t, torch.Tensor)), None)
            if first is None:
                raise UnsupportedError(f"{node.name} returns a tuple without a tensor")
        dtype, shape = _tensor_type(node, first)
        return self.add(Node(node.name, "Opaque", tuple(slots), (name,), dtype, shape), node.name)

    # --- the node kinds --------------------------------------------------------------

    def placeholder(self, node: torch.fx.Node) -> None:
        val = _meta(node)
        if isinstance(val, int | torch.SymInt):  # a size input: read at call time
            self.env[node.name] = SIZE
            return
        dtype, shape = _tensor_type(node)
        self.env[node.name] = self.add(
            Node(node.name, "Input", (), (node.name,), dtype, shape), node.name
        )

    def call(self, node: torch.fx.Node) -> None:
        target = node.target
        if isinstance(node.meta.get("val"), int | torch.SymInt):
            # size arithmetic stays on the host: sizes reach ops through their result types
            self.env[node.name] = SIZE
            return
        if target is operator.getitem:
            self.env[node.name] = self.getitem(node)
            return
        if isinstance(target, torch._ops.HigherOrderOperator) and target.name() in _MUTATIONS:
            # a functionalized call of an op that writes its arguments: one host step that
            # runs the op on fresh copies of the bases and returns (result, *new bases)
            self.env[node.name] = self.opaque(node)
            return
        if not isinstance(target, torch._ops.OpOverload):
            raise UnsupportedError(f"{node.name} calls {target}, not an ATen op")
        handler = _HANDLERS.get(str(target))
        name = None
        from .custom_ops import by_target, library_op, replacement_for

        custom = by_target(str(target)) or library_op(target)
        if custom is not None:
            self.env[node.name] = self.custom(node, custom)
            return
        custom = replacement_for(str(target)) if self.replacements else None
        if custom is not None and self.replaceable(node, custom):
            # the replacing op's kernel stands in for the ATen op (its decomposition steps aside)
            name = self.opaque(node)
            self.custom_nodes[name] = len(self.g.nodes[name].args)
            self.env[node.name] = name
            return
        if handler is not None:
            name = handler(self, node)
        if name is None:
            row = ot.BY_ATEN.get(str(target))
            if row is not None and row.category == ot.ELEMENTWISE and not node.kwargs:
                name = self.elementwise(node, row)
        self.env[node.name] = name if name is not None else self.opaque(node)

    def replaceable(self, node: torch.fx.Node, op) -> bool:
        """A replaced ATen op takes the custom kernel when its dtypes, its arguments (the op's
        ``when``) and its output type (the first tensor operand's) allow."""
        tensors = [a for a in node.args if isinstance(a, torch.fx.Node)]
        if not tensors or node.kwargs:
            return False
        types = [_tensor_type(a) for a in tensors]
        if any(TORCH_DTYPES[d] not in op.dtypes for d, _ in types):
            return False
        if _tensor_type(node) != types[0]:
            return False
        if op.when is not None:
            sample = [_meta(a) if isinstance(a, torch.fx.Node) else a for a in node.args]
            if not op.when(*sample):
                return False
        return True

    def custom(self, node: torch.fx.Node, op) -> str:
        """A saturn custom op: an expression is inlined (it fuses with its neighbours); a
        kernel or host op whose dtypes it takes and whose output is typed like its first
        tensor operand becomes a node the compiler places on the device as one ``Custom``
        kernel; anything else stays an opaque call of the op (its reference on the host)."""
        tensors = [a for a in node.args if isinstance(a, torch.fx.Node)]
        types = [_tensor_type(a) for a in tensors]
        dtype, shape = _tensor_type(node)
        taken = all(TORCH_DTYPES[d] in op.dtypes for d, _ in types if d in ot.FLOATS)
        if op.kind == "expression" and taken and len(tensors) == len(node.args):
            sub = op.expression_graph(types)
            mapped = {}
            for n in sub.nodes.values():
                if n.op == "Input":
                    mapped[n.name] = self.env[tensors[op.tensor_args.index(n.name)].name]
                    continue
                new = Node(
                    self.fresh(f"{node.name}.{n.op.lower()}"),
                    n.op,
                    tuple(mapped[a] for a in n.args),
                    n.attrs,
                    n.dtype,
                    n.shape,
                )
                mapped[n.name] = self.add(new)
            out = mapped[sub.outputs[0]]
            self.fx_names[out] = node.name
            return out
        name = self.opaque(node)
        if op.kind != "expression" and taken and types and (dtype, shape) == types[0]:
            self.custom_nodes[name] = len(self.g.nodes[name].args)
        return name

    def getitem(self, node: torch.fx.Node) -> str:
        src, index = node.args
        if src.name in self.results:  # lowered to one graph node per result
            return self.results[src.name][index]
        base = self.env[src.name]
        b = self.g.nodes[base]
        if b.op != "Opaque":  # a row op whose result 0 is the only one read (layer/batch norm)
            if index != 0:
                raise UnsupportedError(f"{node.name} reads result {index} of {src.name}")
            return base
        dtype, shape = _tensor_type(node)
        return self.add(Node(node.name, "Item", (base,), (index,), dtype, shape), node.name)

    def elementwise(self, node: torch.fx.Node, row: ot.Op) -> str | None:
        dtype, shape = _tensor_type(node)
        operands = list(node.args)
        if len(operands) != row.arity:
            return None
        if row.name in ("Floor", "Ceil", "Trunc", "Round") and dtype not in ot.FLOATS:
            # rounding an integer tensor gives its values (PyTorch returns a copy; in a
            # functional graph the same value)
            src = self.env[operands[0].name]
            return src if self.g.nodes[src].dtype == dtype else None
        if row.name in ot.FLOAT_OPERANDS and dtype not in ot.FLOATS:
            # an integer result of a float-only row (integer fmod, where a zero divisor
            # raises): PyTorch's op
            return None
        if row.name in ot.CONSTANT_DIVISOR and dtype not in ot.FLOATS:
            if not _constant_divisor(operands, dtype):
                return None
        if row.out_dtype == "bool":
            probes = [
                torch.empty(1, dtype=TORCH_DTYPES[self.g.nodes[self.env[a.name]].dtype])
                if isinstance(a, torch.fx.Node)
                else a
                for a in operands
            ]
            common = DTYPES.get(torch.result_type(*probes))
            if common is None:
                return None
        else:
            common = dtype
        if row.name == "Where":
            c = self.operand(operands[0], "bool")
            args = [c, self.operand(operands[1], common), self.operand(operands[2], common)]
        else:
            args = [self.operand(a, common) for a in operands]
        return self.add(Node(node.name, row.name, tuple(args), (), dtype, shape), node.name)


def _constant_divisor(operands: list, dtype: str) -> bool:
    """An integer remainder or floor division of a tensor by a Python int the op table
    admits (``ot.constant_divisor``: 1 <= b <= 2^53, fitting the dtype), which cannot
    raise or overflow; a tensor, zero or negative divisor stays PyTorch's op (a zero
    divisor raises there)."""
    a, b = operands
    return isinstance(a, torch.fx.Node) and type(b) is int and ot.constant_divisor(b, dtype)


# --- per-op handlers: return a graph node name, or None to keep the node opaque -------------


def _h_binary_alpha(row_name: str):
    """add/sub(a, b, alpha) = a +/- alpha * b (an optimizer's ``p.add_(g, alpha=-lr)``).
    The product is rounded before the sum, where PyTorch's CPU kernel fuses the two (one
    rounding less; the same values but the last bit, as the decompositions' note says).
    Alpha that is not a number of the op's kind (a float alpha for integers) is declined."""

    def h(imp: _Importer, node: torch.fx.Node):
        alpha = node.kwargs.get("alpha", 1)
        if set(node.kwargs) - {"alpha"} or len(node.args) != 2:
            return None
        dtype, shape = _tensor_type(node)
        if not _alpha_ok(alpha, dtype):
            return None
        a, b = node.args
        args = (imp.operand(a, dtype), _scaled(imp, b, alpha, dtype))
        return imp.add(Node(node.name, row_name, args, (), dtype, shape), node.name)

    return h


def _alpha_ok(alpha, dtype: str) -> bool:
    """add/sub's alpha: a number of the op's kind (a float alpha for integers declines)."""
    return type(alpha) is int or (type(alpha) is float and dtype in ot.FLOATS)


def _scaled(imp: _Importer, b, alpha, dtype: str) -> str:
    """``b * alpha`` in b's own shape (it may broadcast against the other operand)."""
    name = b if isinstance(b, str) else imp.operand(b, dtype)
    if alpha == 1:
        return name
    return _ew_node(imp, "Mul", (name, alpha), dtype, imp.g.nodes[name].shape)


def _h_rsub(imp: _Importer, node: torch.fx.Node):
    if node.kwargs.get("alpha", 1) != 1 or len(node.args) > 2:
        return None
    dtype, shape = _tensor_type(node)
    x, other = node.args
    return imp.add(
        Node(
            node.name, "Sub", (imp.operand(other, dtype), imp.operand(x, dtype)), (), dtype, shape
        ),
        node.name,
    )


def _h_gelu(imp: _Importer, node: torch.fx.Node):
    approx = node.kwargs.get("approximate", node.args[1] if len(node.args) > 1 else "none")
    dtype, shape = _tensor_type(node)
    op = {"none": "Gelu", "tanh": "GeluTanh"}.get(approx)
    if op is None:
        return None
    return imp.add(Node(node.name, op, (imp.env[node.args[0].name],), (), dtype, shape), node.name)


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
    def h(imp: _Importer, node: torch.fx.Node):
        x = node.args[0]
        xn = imp.g.nodes[imp.env[x.name]]
        dims = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim")
        keepdim = node.args[2] if len(node.args) > 2 else node.kwargs.get("keepdim", False)
        if node.kwargs.get("dtype") is not None:
            return None
        if not xn.shape:
            return None
        dtype, shape = _tensor_type(node)
        axes = _dims(node, len(xn.shape), dims)
        return _reduction(
            imp, row_name, xn, axes, keepdim, lambda a, k: (a, k), dtype, shape, node.name
        )

    return h


def _h_sum_all(imp: _Importer, node: torch.fx.Node):
    if node.kwargs.get("dtype") is not None:
        return None
    xn = imp.g.nodes[imp.env[node.args[0].name]]
    if not xn.shape:
        return None
    dtype, shape = _tensor_type(node)
    return imp.add(
        Node(node.name, "Sum", (xn.name,), (tuple(range(len(xn.shape))), 0), dtype, shape),
        node.name,
    )


def _h_var(imp: _Importer, node: torch.fx.Node):
    xn = imp.g.nodes[imp.env[node.args[0].name]]
    dims = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim")
    corr = node.kwargs.get("correction", 1)
    keepdim = node.kwargs.get("keepdim", False)
    if not isinstance(corr, int | float) or int(corr) != corr or not xn.shape:
        return None
    dtype, shape = _tensor_type(node)
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
        c = _ew_node(imp, "Sub", (xn.name, mean), dtype, xn.shape)
        sq = imp.g.nodes[_ew_node(imp, "Mul", (c, c), dtype, xn.shape)]
        total = _reduction(
            imp, "Sum", sq, axes, keepdim, lambda a, k: (a, k), dtype, shape, imp.fresh("vsum")
        )
        out = _ew_node(imp, "Div", (total, float(max(count - int(corr), 0))), dtype, shape)
        imp.fx_names[out] = node.name
        return out
    return _reduction(
        imp, "Var", xn, axes, keepdim, lambda a, k: (a, int(corr), k), dtype, shape, node.name
    )


def _h_shape_view(imp: _Importer, node: torch.fx.Node):
    """view, reshape, unsqueeze, squeeze: a View to the result's (known) shape."""
    dtype, shape = _tensor_type(node)
    return imp.add(
        Node(node.name, "View", (imp.env[node.args[0].name],), (shape,), dtype, shape), node.name
    )


def _h_as_strided(imp: _Importer, node: torch.fx.Node):
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
    val = _meta(x)
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
    dtype, shape = _tensor_type(node)
    return imp.add(Node(node.name, "View", (imp.env[x.name],), (shape,), dtype, shape), node.name)


def _h_permute(imp: _Importer, node: torch.fx.Node):
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
    dtype, shape = _tensor_type(node)
    return imp.add(Node(node.name, "Permute", (xn.name,), (perm,), dtype, shape), node.name)


def _h_expand(imp: _Importer, node: torch.fx.Node):
    if node.kwargs.get("implicit"):
        return None
    dtype, shape = _tensor_type(node)
    return imp.add(
        Node(node.name, "Expand", (imp.env[node.args[0].name],), (shape,), dtype, shape), node.name
    )


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


def _h_index_repeat(imp: _Importer, node: torch.fx.Node):
    """x[..., i_h, i_w] with constant indices that repeat each element k times along their
    axes (i = arange(k * n) // k: nearest upsampling by an integer factor, as PyTorch's
    decomposition writes it): a View splitting each axis, an Expand of the new unit axes to
    k, a View merging them. The indices are evaluated and compared exactly; anything else
    stays the op."""
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    x, indices = node.args[:2]
    xn = imp.g.nodes[imp.env[x.name]]
    dtype, shape = _tensor_type(node)
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


def _take_rows(
    imp: _Importer, table: str, index: str, name: str, shape: tuple, fx: str | None = None
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


def _h_embedding(imp: _Importer, node: torch.fx.Node):
    """embedding(weight, indices, ...): weight's rows (padding_idx and the gradient options
    change only the backward)."""
    weight, indices = (imp.env[a.name] for a in node.args[:2])
    if len(imp.g.nodes[weight].shape) != 2:
        return None
    return _take_rows(imp, weight, indices, node.name, _tensor_type(node)[1], node.name)


def _h_index_select(imp: _Importer, node: torch.fx.Node):
    """index_select(x, dim, index): along the first axis a take; along another, the take
    of x permuted to bring ``dim`` first, permuted back (both permutes are views)."""
    x, dim, index = node.args[:3]
    xn, inn = imp.g.nodes[imp.env[x.name]], imp.g.nodes[imp.env[index.name]]
    rank = len(xn.shape)
    dtype, shape = _tensor_type(node)
    if rank == 0 or type(dim) is not int or len(inn.shape) > 1:
        return None
    dim %= rank
    if dim == 0:
        return _take_rows(imp, xn.name, inn.name, node.name, shape, node.name)
    if len(inn.shape) != 1 or inn.dtype not in ot.INDEX_DTYPES:
        return None  # (checked before any node is added: nothing is left behind)
    perm = (dim, *(d for d in range(rank) if d != dim))
    moved = tuple(xn.shape[d] for d in perm)
    p = imp.add(Node(imp.fresh("take_first"), "Permute", (xn.name,), (perm,), dtype, moved))
    t = _take_rows(imp, p, inn.name, imp.fresh("take_moved"), (*inn.shape, *moved[1:]))
    back = tuple(sorted(range(rank), key=perm.__getitem__))
    return imp.add(Node(node.name, "Permute", (t,), (back,), dtype, tuple(shape)), node.name)


def _h_index(imp: _Importer, node: torch.fx.Node):
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
    return _take_rows(imp, table, index, node.name, _tensor_type(node)[1], node.name)


def _index_several(imp: _Importer, node: torch.fx.Node) -> str | None:
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
    return _take_rows(imp, table, flat, node.name, _tensor_type(node)[1], node.name)


CUMSUM_MAX_LENGTH = 4096  # longest axis scanned as a masked sum (work grows with its square)
CUMSUM_MAX_TERMS = 1 << 26  # elements x axis length, the masked sum's terms


def _h_cumsum(imp: _Importer, node: torch.fx.Node):
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
    dtype, shape = _tensor_type(node)
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


def _static_range(imp: _Importer, name: str) -> tuple[int, int] | None:
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


def _wrapped(imp: _Importer, index: str, rows: int) -> str:
    """Advanced indexing's index with negatives counted from the end (``x[-1]`` is the last
    row): ``where(i < 0, i + rows, i)``. An index below ``-rows`` stays negative and the take
    raises, as PyTorch does; ``embedding`` and ``index_select`` do not wrap and skip this."""
    n = imp.g.nodes[index]
    if n.op == "Arange" and n.attrs[0] >= 0 and n.attrs[1] >= 0:
        return index  # no negative entry (a Slice view when in range: see _take_rows)
    dtype, shape = n.dtype, n.shape
    zero, size = imp.scalar(0, dtype), imp.scalar(rows, dtype)
    neg = imp.add(Node(imp.fresh("negative"), "Lt", (index, zero), (), "bool", shape))
    up = imp.add(Node(imp.fresh("from_end"), "Add", (index, size), (), dtype, shape))
    return imp.add(Node(imp.fresh("wrapped"), "Where", (neg, up, index), (), dtype, shape))


def _h_index_put(imp: _Importer, node: torch.fx.Node):
    """index_put(x, [index], values, accumulate=True) with one integer index on the first
    axis (how an embedding's gradient is built): x viewed as rows x the rest, the index
    flattened, values broadcast to a row per index, an IndexAdd, viewed back. Without
    accumulate (the last write of a repeated index wins) it stays PyTorch's op."""
    x, indices, values = node.args[:3]
    accumulate = node.args[3] if len(node.args) > 3 else node.kwargs.get("accumulate", False)
    if accumulate is not True or len(indices) != 1 or not isinstance(indices[0], torch.fx.Node):
        return None
    if not isinstance(values, torch.fx.Node):
        return None
    xn = imp.g.nodes[imp.env[x.name]]
    inn = imp.g.nodes[imp.env[indices[0].name]]
    vn = imp.g.nodes[imp.env[values.name]]
    dtype, shape = _tensor_type(node)
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
    if flat == tuple(shape):
        return imp.add(Node(node.name, "IndexAdd", (base, index, vals), (), dtype, flat), node.name)
    t = imp.add(Node(imp.fresh("index_add"), "IndexAdd", (base, index, vals), (), dtype, flat))
    return imp.add(Node(node.name, "View", (t,), (tuple(shape),), dtype, tuple(shape)), node.name)


def _h_flip(imp: _Importer, node: torch.fx.Node):
    """flip(x, dims): along each flipped axis of more than one element, a take of x's
    slices by the constant index n-1, ..., 0 (axis first through a permute, as
    index_select does). A constant index is in range by construction: no call-time check."""
    x, dims = node.args[:2]
    xn = imp.g.nodes[imp.env[x.name]]
    rank = len(xn.shape)
    dtype, shape = _tensor_type(node)
    if rank == 0 or not all(type(d) is int and -rank <= d < rank for d in dims):
        return None
    axes = sorted({d % rank for d in dims if xn.shape[d % rank] > 1})
    cur = xn.name
    if not axes:  # nothing moves: the same values
        return imp.add(
            Node(node.name, "View", (cur,), (tuple(shape),), dtype, tuple(shape)), node.name
        )
    for i, dim in enumerate(axes):
        n, last = xn.shape[dim], i == len(axes) - 1
        rev = imp.add(
            Node(imp.fresh("flip_index"), "Arange", (), (n - 1, -1, n, "i64"), "i64", (n,))
        )
        if dim == 0:
            name = node.name if last else imp.fresh("flip")
            cur = _take_rows(imp, cur, rev, name, tuple(shape), node.name if last else None)
            continue
        perm = (dim, *(d for d in range(rank) if d != dim))
        moved = tuple(xn.shape[d] for d in perm)
        p = imp.add(Node(imp.fresh("flip_first"), "Permute", (cur,), (perm,), dtype, moved))
        t = _take_rows(imp, p, rev, imp.fresh("flip"), moved)
        back = tuple(sorted(range(rank), key=perm.__getitem__))
        name = node.name if last else imp.fresh("flip_back")
        cur = imp.add(
            Node(name, "Permute", (t,), (back,), dtype, tuple(shape)), node.name if last else None
        )
    return cur


CAT_CHUNKS = 4  # most pieces a concatenation is cut into (each output element reads one per piece)


def _h_cat(imp: _Importer, node: torch.fx.Node):
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
    dtype, shape = _tensor_type(node)
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


def _cat_tree(imp: _Importer, names: list[str], dim: int, name: str) -> str:
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


def _h_repeat(imp: _Importer, node: torch.fx.Node):
    """x.repeat(r0, ..., rm): each axis tiled, out[.., i, ..] = x[.., i % n, ..]: x viewed
    with a unit axis before each of its axes (and leading ones for new axes), expanded to
    the repeat counts, merged pairwise by a View. Copies of x's elements (exact)."""
    xn = imp.g.nodes[imp.env[node.args[0].name]]
    reps = list(node.args[1])
    dtype, shape = _tensor_type(node)
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


def _h_full(imp: _Importer, node: torch.fx.Node):
    """full(size, value) and full_like(x, value): the scalar broadcast to the result's
    (known) shape, in the result's dtype (full_like reads only x's shape)."""
    value = node.args[1]
    if not isinstance(value, int | float | bool):
        return None
    dtype, shape = _tensor_type(node)
    if dtype not in ot.FLOATS + ot.INTS + ("bool",):
        return None
    c = imp.scalar(bool(value) if dtype == "bool" else value, dtype)
    return imp.add(Node(node.name, "Expand", (c,), (shape,), dtype, shape), node.name)


def _h_arange(imp: _Importer, node: torch.fx.Node):
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
    val = _meta(node)
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


def _h_alias(imp: _Importer, node: torch.fx.Node):
    """alias(x) is x: in a functional graph the same value."""
    return imp.env[node.args[0].name]


def _h_scalar_tensor(imp: _Importer, node: torch.fx.Node):
    """scalar_tensor(v): a rank-0 tensor holding v, in the result's dtype."""
    value = node.args[0]
    if not isinstance(value, int | float | bool):
        return None
    dtype, shape = _tensor_type(node)
    if shape != () or dtype not in ot.FLOATS + ot.INTS:
        return None
    c = imp.scalar(value, dtype)
    return imp.add(Node(node.name, "Expand", (c,), ((),), dtype, ()), node.name)


def _size_arg(imp: _Importer, v):
    """An int argument that may be a size node or a SymInt: its marker value."""
    if isinstance(v, torch.fx.Node):
        return concrete(_meta(v))
    if isinstance(v, torch.SymInt):
        return concrete(v)
    return v


def _h_slice(imp: _Importer, node: torch.fx.Node):
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
        symbolic_v, symbolic_size = _symbolic(v), _symbolic(size)
        if (symbolic_v and v != size) or (symbolic_size and not symbolic_v and not 0 <= v <= 2):
            # a clamp whose outcome depends on the sizes (a symbolic extent is at least 2)
            raise UnsupportedError(f"{node.name}: slice bound {v} of an extent {size}")
        v = v + size if v < 0 else v
        return min(max(v, 0), size)

    start, end = clamp(start, 0), clamp(end, size)
    end = max(end, start)
    dtype, shape = _tensor_type(node)
    return imp.add(
        Node(node.name, "Slice", (xn.name,), (dim, start, end, step), dtype, shape), node.name
    )


def _h_clone(imp: _Importer, node: torch.fx.Node):
    if node.kwargs.get("memory_format") not in (
        None,
        torch.contiguous_format,
        torch.preserve_format,
    ):
        return None
    dtype, shape = _tensor_type(node)
    x = imp.env[node.args[0].name]
    return imp.add(Node(node.name, "Cast", (x,), (dtype,), dtype, shape), node.name)


def _h_to_copy(imp: _Importer, node: torch.fx.Node):
    allowed = {"dtype", "device", "layout", "memory_format", "pin_memory"}
    if set(node.kwargs) - allowed or len(node.args) != 1:
        return None
    src = _meta(node.args[0])
    val = _meta(node)
    if val.device != src.device or node.kwargs.get("memory_format") not in (
        None,
        torch.preserve_format,
        torch.contiguous_format,
    ):
        return None
    dtype, shape = _tensor_type(node)
    return imp.add(
        Node(node.name, "Cast", (imp.env[node.args[0].name],), (dtype,), dtype, shape), node.name
    )


def _h_matmul(row_name: str):
    def h(imp: _Importer, node: torch.fx.Node):
        dtype, shape = _tensor_type(node)
        args = [imp.env[a.name] for a in node.args[:2]]
        if any(imp.g.nodes[a].dtype != dtype for a in args):
            return None
        return imp.add(Node(node.name, row_name, args, (), dtype, shape), node.name)

    return h


def _h_addmm(imp: _Importer, node: torch.fx.Node):
    if node.kwargs.get("beta", 1) != 1 or node.kwargs.get("alpha", 1) != 1:
        return None  # the epilogue would ignore alpha and beta
    dtype, shape = _tensor_type(node)
    args = [imp.env[a.name] for a in node.args[:3]]
    return imp.add(Node(node.name, "Addmm", tuple(args), (), dtype, shape), node.name)


def _h_softmax(row_name: str):
    def h(imp: _Importer, node: torch.fx.Node):
        x, dim, half_to_float = node.args
        if half_to_float:
            return None
        xn = imp.g.nodes[imp.env[x.name]]
        dtype, shape = _tensor_type(node)
        return imp.add(
            Node(node.name, row_name, (xn.name,), (dim % max(len(xn.shape), 1),), dtype, shape),
            node.name,
        )

    return h


def _only_first_result_used(node: torch.fx.Node) -> bool:
    return all(u.target is operator.getitem and u.args[1] == 0 for u in node.users)


def _pool_windows(imp: _Importer, x: str, kernel, stride, padding, ceil_mode, out) -> str | None:
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


def _h_max_pool2d(imp: _Importer, node: torch.fx.Node):
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
    if node.kwargs or not _only_first_result_used(node):
        return None
    dtype, shape = _tensor_type(node, _meta(node)[0])
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


def _h_constant_pad(imp: _Importer, node: torch.fx.Node):
    """constant_pad_nd(x, pad, value): a Pad (pad lists the last axis first). Declined for
    negative pads (crops) and for a value the dtype cannot hold exactly (PyTorch would
    convert it; saturn does not guess how)."""
    x, pad = node.args[0], list(node.args[1])
    value = node.args[2] if len(node.args) > 2 else node.kwargs.get("value", 0)
    xn = imp.g.nodes[imp.env[x.name]]
    dtype, shape = _tensor_type(node)
    rank = len(xn.shape)
    if len(pad) % 2 or len(pad) > 2 * rank or any(type(p) is not int or p < 0 for p in pad):
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
    attrs = (tuple(pads), float_bits(float(value)))
    return imp.add(Node(node.name, "Pad", (xn.name,), attrs, dtype, shape), node.name)


def _h_slice_scatter(imp: _Importer, node: torch.fx.Node):
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
    if not all(v is None or type(v) is int for v in (dim, start, end)) or step != 1:
        return None
    bn, sn = imp.g.nodes[imp.env[base.name]], imp.g.nodes[imp.env[src.name]]
    dtype, shape = _tensor_type(node)
    rank = len(shape)
    if rank == 0 or bn.dtype != dtype or sn.dtype != dtype or tuple(bn.shape) != tuple(shape):
        return None
    dim %= rank
    n = shape[dim]
    if any(v in MARKERS for v in shape) or any(v in MARKERS for v in sn.shape):
        return None
    lo, hi, _ = slice(start, end).indices(n)
    hi = max(hi, lo)
    want = tuple(hi - lo if d == dim else shape[d] for d in range(rank))
    if tuple(sn.shape) != want:
        return None
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
    out = padded
    for op, bound, edge in (("Lt", hi, n), ("Ge", lo, 0)):
        if bound == edge:  # the slice reaches this end: no test
            continue
        inside = imp.add(
            Node(imp.fresh("scatter_in"), op, (idx, imp.scalar(bound, "i64")), (), "bool", axis)
        )
        last = op == "Ge" or lo == 0
        name = node.name if last else imp.fresh("scatter_sel")
        out = imp.add(
            Node(name, "Where", (inside, out, bn.name), (), dtype, shape), name if last else None
        )
    return out


def _h_avg_pool2d(imp: _Importer, node: torch.fx.Node):
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
    dtype, shape = _tensor_type(node)
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


def _h_layer_norm(imp: _Importer, node: torch.fx.Node):
    """native_layer_norm(x, shape, w, b, eps) -> (y, mean, rstd). y is a LayerNorm node. When
    mean or rstd is read too (a training forward saves them for the backward), they are
    ``Mean(x)`` and ``Rsqrt(Var(x, correction 0) + eps)`` over the normalized dims, kept,
    exactly PyTorch's definitions (biased variance); the layer norm's decomposition builds
    the same terms, so the e-graph shares them. Declined where PyTorch computes the
    statistics in another dtype than x's (half precision inputs). A missing weight or bias
    is the scalar 1 or -0.0: ``y * 1`` and ``y + -0.0`` are y for every y (both zeros and
    NaN included; ``+0.0`` would turn a -0.0 into +0.0)."""
    x, normalized, w, b, eps = node.args
    xn = imp.g.nodes[imp.env[x.name]]
    rank = len(xn.shape)
    dims = tuple(range(rank - len(normalized), rank))
    dtype, shape = _tensor_type(node, _meta(node)[0])
    extra = not _only_first_result_used(node)
    if extra:
        stats = [_tensor_type(node, v) for v in _meta(node)[1:]]
        if dtype not in ot.FLOATS or any(d != dtype for d, _ in stats):
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
        mean = imp.add(Node(imp.fresh("ln_mean"), "Mean", (xn.name,), (dims, 1), dtype, mshape))
        var = imp.add(Node(imp.fresh("ln_var"), "Var", (xn.name,), (dims, 0, 1), dtype, rshape))
        shifted = imp.add(
            Node(imp.fresh("ln_var_eps"), "Add", (var, imp.scalar(eps, dtype)), (), dtype, rshape)
        )
        rstd = imp.add(Node(imp.fresh("ln_rstd"), "Rsqrt", (shifted,), (), dtype, rshape))
        imp.results[node.name] = (y, mean, rstd)
    return y


def _h_batch_norm(imp: _Importer, node: torch.fx.Node):
    x, w, b, rm, rv, _momentum, eps = node.args
    if not _only_first_result_used(node):
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
    dtype, shape = _tensor_type(node, _meta(node)[0])
    return imp.add(
        Node(node.name, "BatchNormInf", (xn.name, *views), (float_bits(eps),), dtype, shape),
        node.name,
    )


def _h_div_mode(imp: _Importer, node: torch.fx.Node):
    """div(a, b, rounding_mode): None is Div, "floor" PyTorch's floor division (FloorDiv),
    "trunc" the truncated quotient trunc(a / b), as PyTorch's kernel computes it. Floats,
    and the floor mode of integers by a constant divisor (``_constant_divisor``; an integer
    zero divisor raises in PyTorch)."""
    a, b = node.args[:2]
    mode = node.kwargs.get("rounding_mode", node.args[2] if len(node.args) > 2 else None)
    dtype, shape = _tensor_type(node)
    if dtype not in ot.FLOATS and not (mode == "floor" and _constant_divisor([a, b], dtype)):
        return None
    if mode not in (None, "floor", "trunc"):
        return None
    if mode == "floor":
        out = _ew_node(imp, "FloorDiv", (a, b), dtype, shape)
    else:
        out = _ew_node(imp, "Div", (a, b), dtype, shape)
        if mode == "trunc":
            out = imp.add(Node(imp.fresh("trunc"), "Trunc", (out,), (), dtype, shape))
    imp.fx_names[out] = node.name
    return out


def _h_group_norm(imp: _Importer, node: torch.fx.Node):
    """native_group_norm(x, w, b, N, C, HxW, G, eps), only its output read: x viewed as
    [N, G, C/G * HxW], a layer norm without affine over the last axis (PyTorch's statistics:
    biased variance per group), viewed back, times w and plus b per channel. float32 and
    float64 (PyTorch computes a half group norm in float32 and rounds once; written out,
    each op would round)."""
    x, w, b, n, c, hw, groups, eps = node.args
    xn = imp.g.nodes[imp.env[x.name]]
    dtype, shape = _tensor_type(node, _meta(node)[0])
    if not _only_first_result_used(node) or dtype not in ot.WIDE_FLOATS or len(xn.shape) < 2:
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


def _h_convolution(imp: _Importer, node: torch.fx.Node):
    """A 2-D convolution. A half one with a bias on a GPU target is the product rounded to
    the half type, plus the bias, rounded again: how eager CUDA computes it (cuDNN's
    convolution, then an add), so the add is an elementwise op that fuses."""
    x, w, b, stride, padding, dilation, transposed, _out_pad, groups = node.args
    if transposed or len(stride) != 2:
        return None
    dtype, shape = _tensor_type(node)
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


def _h_pow(imp: _Importer, node: torch.fx.Node):
    """x ** e. A number exponent PyTorch's kernels special-case (CPU and CUDA alike) is
    imported as what they compute, which is not C's pow at the edges: 0.5 is sqrt
    ((-inf) ** 0.5 is NaN, (-0.0) ** 0.5 is -0.0), -0.5 is rsqrt, 2 and 3 are products, -1
    the reciprocal, -2 the reciprocal of the square. Which dtypes, per target (measured on
    torch's CPU kernels; CUDA's pow_tensor_scalar_kernel from its source): the GPU
    special-cases every float dtype; the CPU float32, float64 and bfloat16, but computes
    C's pow for float16."""
    dtype, shape = _tensor_type(node)
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


def _h_copy(imp: _Importer, node: torch.fx.Node):
    """copy(dst, src), the functional form of ``dst.copy_(src)``: src's values in dst's
    dtype, broadcast to dst's shape (a cast and a view: exact, or PyTorch's own cast)."""
    if len(node.args) != 2 or set(node.kwargs) - {"non_blocking"}:
        return None
    dtype, shape = _tensor_type(node)
    src = imp.env[node.args[1].name] if isinstance(node.args[1], torch.fx.Node) else None
    if src is None:
        return None
    out = imp.cast(src, dtype)
    if imp.g.nodes[out].shape != shape:
        out = imp.add(Node(imp.fresh("copy"), "Expand", (out,), (shape,), dtype, shape))
    if out != src:
        imp.fx_names[out] = node.name
    return out


def _ew_node(imp: _Importer, op: str, args, dtype: str, shape) -> str:
    """One elementwise node over built names (str), fx tensors or Python numbers."""
    names = tuple(a if isinstance(a, str) else imp.operand(a, dtype) for a in args)
    return imp.add(Node(imp.fresh(op.lower()), op, names, (), dtype, shape))


def _foreach_one(kind: str, args: list, kwargs: dict, dtype: str, shape, imp) -> str | None:
    """The value at one position of ``_foreach_<kind>``: the single-tensor op's formula."""

    def ew(op, *xs):
        return _ew_node(imp, op, xs, dtype, shape)

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

    def handler(imp: _Importer, node: torch.fx.Node):
        metas = _meta(node)
        if not isinstance(metas, list | tuple) or not metas:
            return None
        lists = [a for a in node.args if isinstance(a, list | tuple)]
        if not lists or any(len(a) != len(metas) for a in lists):
            return None
        names = []
        for i, meta in enumerate(metas):
            args = [a[i] if isinstance(a, list | tuple) else a for a in node.args]
            dtype, shape = _tensor_type(node, meta)
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


def _h_select(imp: _Importer, node: torch.fx.Node):
    """select(x, dim, i): the slice [i, i + 1) along dim, viewed without that axis (views,
    exact for every value). A negative or symbolic index is declined (kept as the call)."""
    xn = imp.g.nodes[imp.env[node.args[0].name]]
    dim, index = node.args[1], node.args[2]
    if not isinstance(dim, int) or not isinstance(index, int) or not xn.shape:
        return None
    dim %= len(xn.shape)
    if not 0 <= index < xn.shape[dim]:
        return None
    dtype, shape = _tensor_type(node)
    one = (*xn.shape[:dim], 1, *xn.shape[dim + 1 :])
    sliced = imp.add(
        Node(imp.fresh("select"), "Slice", (xn.name,), (dim, index, index + 1, 1), dtype, one)
    )
    return imp.add(Node(node.name, "View", (sliced,), (shape,), dtype, shape), node.name)


def _h_logical_not(imp: _Importer, node: torch.fx.Node):
    """logical_not(x) = (x == 0): true exactly for false, +0.0 and -0.0 (NaN is truthy, and
    NaN == 0 is false; infinities are nonzero)."""
    xn = imp.g.nodes[imp.env[node.args[0].name]]
    dtype, shape = _tensor_type(node)
    if dtype != "bool" or node.kwargs:
        return None
    zero = imp.scalar(0, xn.dtype)
    return imp.add(Node(node.name, "Eq", (xn.name, zero), (), dtype, shape), node.name)


def _truth(imp: _Importer, a) -> str | None:
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

    def handler(imp: _Importer, node: torch.fx.Node):
        if len(node.args) != 2 or node.kwargs:
            return None
        dtype, shape = _tensor_type(node)
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


def _h_bitwise_not(imp: _Importer, node: torch.fx.Node):
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

    def handler(imp: _Importer, node: torch.fx.Node):
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


def _clamped(imp: _Importer, node: torch.fx.Node, xn: Node, lo, hi) -> str | None:
    """ClampMax(ClampMin(x, lo), hi) for number bounds (either may be None), named for
    ``node``; None where a bound is a tensor, changes the dtype or lies outside it."""
    dtype, shape = _tensor_type(node)
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
            out = _ew_node(imp, op, (out, v), dtype, shape)
    imp.fx_names[out] = node.name
    return out


def _h_hardtanh(imp: _Importer, node: torch.fx.Node):
    """hardtanh(x, lo=-1, hi=1) is PyTorch's clamp(x, lo, hi) (its kernel calls clamp):
    NaN stays NaN, -0.0 stays -0.0."""
    args = list(node.args) + [None] * 2
    lo = args[1] if args[1] is not None else node.kwargs.get("min_val", -1.0)
    hi = args[2] if args[2] is not None else node.kwargs.get("max_val", 1.0)
    return _clamped(imp, node, imp.g.nodes[imp.env[node.args[0].name]], lo, hi)


def _h_sign(imp: _Importer, node: torch.fx.Node):
    """sign(x) = (0 < x) - (x < 0), as PyTorch's CPU kernel: 0 for NaN and for both zeros
    (+0.0, the difference of two zeros), 1 for +inf, -1 for -inf."""
    xn = imp.g.nodes[imp.env[node.args[0].name]]
    dtype, shape = _tensor_type(node)
    if dtype != xn.dtype or dtype not in ot.FLOATS + ot.SIGNED:
        return None
    zero = imp.scalar(0, dtype)
    pos = imp.add(Node(imp.fresh("lt"), "Lt", (zero, xn.name), (), "bool", shape))
    neg = imp.add(Node(imp.fresh("lt"), "Lt", (xn.name, zero), (), "bool", shape))
    return imp.add(
        Node(node.name, "Sub", (imp.cast(pos, dtype), imp.cast(neg, dtype)), (), dtype, shape),
        node.name,
    )


def _h_isnan(imp: _Importer, node: torch.fx.Node):
    """isnan(x) = x != x: true for every NaN and nothing else (integers: never)."""
    xn = imp.g.nodes[imp.env[node.args[0].name]]
    if xn.dtype not in ot.FLOATS:
        return None
    _, shape = _tensor_type(node)
    return imp.add(Node(node.name, "Ne", (xn.name, xn.name), (), "bool", shape), node.name)


def _h_elu(imp: _Importer, node: torch.fx.Node):
    """elu(x, alpha, scale, input_scale) as PyTorch's CPU kernel computes it: x <= 0 ?
    expm1(x * input_scale) * (alpha * scale) : x * scale, the coefficient product taken in
    the op's compute type (float32 for float32 and the half types). NaN takes the second
    branch (NaN); -0.0 the first (expm1(-0.0) = -0.0)."""
    args = list(node.args) + [None] * 3
    x = node.args[0]
    alpha, scale, iscale = (v if v is not None else 1.0 for v in args[1:4])
    xn = imp.g.nodes[imp.env[x.name]]
    dtype, shape = _tensor_type(node)
    if node.kwargs or dtype != xn.dtype or dtype not in ot.FLOATS:
        return None
    if not all(type(v) in (int, float) for v in (alpha, scale, iscale)):
        return None
    op_t = np.float64 if dtype == "f64" else np.float32
    negcoef = float(op_t(alpha) * op_t(scale))
    zero = imp.scalar(0, dtype)
    le = imp.add(Node(imp.fresh("le"), "Le", (xn.name, zero), (), "bool", shape))
    inner = _ew_node(imp, "Mul", (xn.name, float(op_t(iscale))), dtype, shape)
    em1 = imp.add(Node(imp.fresh("expm1"), "Expm1", (inner,), (), dtype, shape))
    neg = _ew_node(imp, "Mul", (em1, negcoef), dtype, shape)
    pos = _ew_node(imp, "Mul", (xn.name, float(op_t(scale))), dtype, shape)
    return imp.add(Node(node.name, "Where", (le, neg, pos), (), dtype, shape), node.name)


def _h_split(imp: _Importer, node: torch.fx.Node):
    """split / split_with_sizes along a dim: one Slice per piece (views; no copy), read by
    the getitems that follow."""
    xn = imp.g.nodes[imp.env[node.args[0].name]]
    args = list(node.args) + [None] * 3
    dim = args[2] if args[2] is not None else node.kwargs.get("dim", 0)
    if not xn.shape or type(dim) is not int:
        return None
    dim %= len(xn.shape)
    size, pieces = xn.shape[dim], _meta(node)
    if not isinstance(pieces, list | tuple):
        return None
    names, start = [], 0
    for i, piece in enumerate(pieces):
        dtype, shape = _tensor_type(node, piece)
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


def _above_neg_inf(imp: _Importer, xn: Node) -> str | None:
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

    def handler(imp: _Importer, node: torch.fx.Node):
        xn = imp.g.nodes[imp.env[node.args[0].name]]
        args = list(node.args) + [None] * 2
        dim = args[1] if args[1] is not None else node.kwargs.get("dim")
        keepdim = bool(args[2] if args[2] is not None else node.kwargs.get("keepdim", False))
        dtype, shape = _tensor_type(node)
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


def _h_any(imp: _Importer, node: torch.fx.Node):
    """any(x, dims, keepdim) over booleans = (number of trues > 0), the count an int64 Sum
    (exact: no reduction holds 2^63 elements). Other dtypes are declined."""
    xn = imp.g.nodes[imp.env[node.args[0].name]]
    if xn.dtype != "bool" or not xn.shape:
        return None
    dims = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim")
    keepdim = node.args[2] if len(node.args) > 2 else node.kwargs.get("keepdim", False)
    dtype, shape = _tensor_type(node)
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


_HANDLERS = {
    "aten.select.int": _h_select,
    "aten.logical_not.default": _h_logical_not,
    "aten.any.dim": _h_any,
    "aten.any.dims": _h_any,
    "aten.full_like.default": _h_full,
    "aten.add.Tensor": _h_binary_alpha("Add"),
    "aten.add.Scalar": _h_binary_alpha("Add"),
    "aten.sub.Tensor": _h_binary_alpha("Sub"),
    "aten.sub.Scalar": _h_binary_alpha("Sub"),
    "aten.rsub.Scalar": _h_rsub,
    "aten.rsub.Tensor": _h_rsub,
    "aten.gelu.default": _h_gelu,
    "aten.sum.dim_IntList": _h_reduce("Sum"),
    "aten.sum.default": _h_sum_all,
    "aten.mean.dim": _h_reduce("Mean"),
    "aten.amax.default": _h_reduce("Amax"),
    "aten.argmax.default": _h_argext("max"),
    "aten.argmin.default": _h_argext("min"),
    "aten.amin.default": _h_reduce("Amin"),
    "aten.var.correction": _h_var,
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
    "aten.clone.default": _h_clone,
    "aten.lift_fresh_copy.default": _h_clone,  # a copy of a tensor constant
    "aten.slice.Tensor": _h_slice,
    "aten.full.default": _h_full,
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
    "aten.split.Tensor": _h_split,
    "aten.split_with_sizes.default": _h_split,
    "aten.arange.default": _h_arange,
    "aten.arange.start": _h_arange,
    "aten.arange.start_step": _h_arange,
    "aten.alias.default": _h_alias,
    "aten.scalar_tensor.default": _h_scalar_tensor,
    "aten._to_copy.default": _h_to_copy,
    "aten.mm.default": _h_matmul("MatMul"),
    "aten.bmm.default": _h_matmul("BatchMatMul"),
    "aten.addmm.default": _h_addmm,
    "aten._softmax.default": _h_softmax("Softmax"),
    "aten._log_softmax.default": _h_softmax("LogSoftmax"),
    "aten.native_layer_norm.default": _h_layer_norm,
    "aten._native_batch_norm_legit_no_training.default": _h_batch_norm,
    "aten.native_group_norm.default": _h_group_norm,
    "aten.cat.default": _h_cat,
    "aten.repeat.default": _h_repeat,
    "aten._unsafe_index.Tensor": _h_index_repeat,
    "aten.index.Tensor": _h_index,
    "aten.cumsum.default": _h_cumsum,
    "aten.embedding.default": _h_embedding,
    "aten.index_select.default": _h_index_select,
    "aten.index_put.default": _h_index_put,
    "aten.flip.default": _h_flip,
    "aten.div.Tensor_mode": _h_div_mode,
    "aten.div.Scalar_mode": _h_div_mode,
    "aten.convolution.default": _h_convolution,
    "aten.pow.Tensor_Scalar": _h_pow,
    "aten.pow.Scalar": _h_pow,
    "aten.copy.default": _h_copy,
    "aten.max_pool2d_with_indices.default": _h_max_pool2d,
    "aten.avg_pool2d.default": _h_avg_pool2d,
    "aten.constant_pad_nd.default": _h_constant_pad,
    "aten.slice_scatter.default": _h_slice_scatter,
    "aten.as_strided.default": _h_as_strided,
    **{
        f"aten._foreach_{kind}.{overload}": _h_foreach(kind)
        for kind, overloads in _FOREACH.items()
        for overload in overloads
    },
}


# higher-order ops AOTAutograd wraps around a call of an op that mutates its arguments
_MUTATIONS = ("auto_functionalized", "auto_functionalized_v2")


def import_graph(gm: torch.fx.GraphModule, replacements: bool = False) -> Imported:
    """``replacements``: let custom ops that replace ATen ops take their nodes (on GPU
    targets, where their kernels run)."""
    _symbols.table = {}
    try:
        imported = _import(gm, replacements)
    finally:
        table, _symbols.table = _symbols.table, None
    imported.symbols = {str(sym): marker for sym, marker in table.items()}
    return imported


def _import(gm: torch.fx.GraphModule, replacements: bool) -> Imported:
    imp = _Importer(gm, replacements)
    inputs, meta, outputs, out_meta = [], [], [], []
    for node in gm.graph.nodes:
        if node.op == "placeholder":
            imp.placeholder(node)
            val = _meta(node)
            if imp.env[node.name] == SIZE:
                inputs.append(None)
                meta.append(("size", (), ()))
                continue
            inputs.append(imp.env[node.name])
            meta.append(
                (
                    DTYPES[val.dtype],
                    tuple(concrete(s) for s in val.shape),
                    tuple(concrete(s) for s in val.stride()),
                )
            )
        elif node.op == "call_function":
            imp.call(node)
        elif node.op == "output":
            for o in node.args[0]:
                if o is None:
                    outputs.append(None)
                    out_meta.append(None)
                elif isinstance(o, torch.fx.Node) and imp.env.get(o.name) == SIZE:
                    # a size the backward needs: returned as an int (markers substituted)
                    outputs.append(("size", concrete(_meta(o))))
                    out_meta.append(("size", ()))
                elif isinstance(o, torch.fx.Node):
                    outputs.append(imp.env[o.name])
                    # eager's strides: an output the program views is laid out as eager's
                    strides = tuple(concrete(s) for s in _meta(o).stride())
                    out_meta.append((*_tensor_type(o), strides))
                elif isinstance(o, int):
                    outputs.append(("size", o))
                    out_meta.append(("size", ()))
                else:
                    raise UnsupportedError(f"output {o!r} is not a tensor")
        else:
            raise UnsupportedError(f"FX node kind {node.op} ({node.name})")
    imp.g.outputs = [o for o in outputs if isinstance(o, str)]
    if not imp.g.outputs:
        raise UnsupportedError("the graph returns no tensor")
    sized = list(imp.size_values)
    return Imported(
        imp.g,
        [*sized, *inputs],
        [*(("i64", (), ()) for _ in sized), *meta],
        outputs,
        out_meta,
        imp.host_calls,
        imp.fx_names,
        imp.custom_nodes,
        size_values=list(imp.size_values.items()),
    )
