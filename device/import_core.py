"""The importer's core: the ``Importer`` that turns FX nodes (after AOTAutograd) into
graph nodes, the types it reads from fake tensors, symbolic sizes as markers, and the
registry of handlers by ATen op (``HANDLERS``), which the ``import_*`` family modules fill.

An op with a handler is imported by it (a handler may return None: the op then stays
PyTorch's); an elementwise op of the op table without one is imported by its row; anything
else becomes an opaque host node that calls the original op.
"""

from __future__ import annotations

import operator
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.fx

from saturn.eqsat import optable as ot
from saturn.eqsat.graph import Graph, Node, float_bits

from .dtypes import DTYPES, TORCH_DTYPES, HostCall
from .input_windows import Window, window_of


class UnsupportedError(Exception):
    """The graph cannot be represented; it runs uncompiled and the reason is logged."""


Handler = Callable[["Importer", torch.fx.Node], "str | None"]
# ATen overload (as str) -> its handler; the import_* family modules register theirs
HANDLERS: dict[str, Handler] = {}


def handles(table: dict[str, Handler]) -> None:
    """Register a family's handlers (an op handled twice is a mistake, not an override)."""
    for target, handler in table.items():
        if target in HANDLERS:
            raise ValueError(f"{target} has two importer handlers")
        HANDLERS[target] = handler


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
    # a node a custom op replaces -> the op-table node it stands in for (not in the graph)
    replaced: dict[str, Node] = field(default_factory=dict)
    symbols: dict[str, int] = field(default_factory=dict)  # symbolic size -> its marker
    # per placeholder: the window a call's tensor is read through (input_windows), or None
    input_windows: list[Window | None] = field(default_factory=list)
    # sizes used as values: a leading int64 0-d input each (in ``inputs``), made per call
    # from its expression over the symbols (saturn.symbolic)
    size_values: list[tuple[str, object]] = field(default_factory=list)


def fake_value(node: torch.fx.Node):
    val = node.meta.get("val")
    if val is None:
        raise UnsupportedError(f"node {node.name} ({node.target}) has no fake tensor value")
    return val


# Symbolic sizes. A graph whose shapes hold symbols (s0, s1, ...) is imported once with each
# symbol standing for a marker: a distinct prime far above any real extent. Every size in the
# imported graph, the e-graph and the program is then an integer whose factors say which
# symbols it is a product of (saturn.symbolic substitutes the call's sizes).
MARKERS = (1000003, 1000033, 1000037, 1000039, 1000081, 1000099, 1000117, 1000121)


symbol_table = threading.local()


def _marker_of(sym) -> int:
    table = symbol_table.table
    if sym not in table:
        if len(table) == len(MARKERS):
            raise UnsupportedError(f"more than {len(MARKERS)} symbolic sizes")
        table[sym] = MARKERS[len(table)]
    return table[sym]


def is_symbolic(v: int) -> bool:
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
        table = getattr(symbol_table, "table", None)
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


def tensor_type(node: torch.fx.Node, val=None) -> tuple[str, tuple[int, ...]]:
    val = fake_value(node) if val is None else val
    if not isinstance(val, torch.Tensor):
        raise UnsupportedError(f"node {node.name} produces {type(val).__name__}, not a tensor")
    if val.dtype not in DTYPES:
        raise UnsupportedError(f"node {node.name} has dtype {val.dtype}, which saturn does not run")
    return DTYPES[val.dtype], tuple(concrete(s) for s in val.shape)


class Importer:
    def __init__(self, gm: torch.fx.GraphModule, replacements: bool = False):
        self.gm = gm
        self.replacements = replacements  # custom ops replacing ATen ops (GPU targets)
        self.gpu = replacements  # a GPU target: its kernels decide edge-case semantics
        self.g = Graph()
        self.env: dict[str, str] = {}  # FX node name -> graph node name
        self.host_calls: dict[str, HostCall] = {}
        self.fx_names: dict[str, str] = {}
        self.custom_nodes: dict[str, int] = {}  # node -> tensor operands (device custom ops)
        self.replaced: dict[str, Node] = {}  # a replaced node -> the op-table node it replaces
        self.results: dict[str, tuple[str, ...]] = {}  # a multi-result node -> each result
        self.size_values: dict[str, object] = {}  # graph input -> its size expression
        self.constants: dict[str, object] = {}  # FX node -> its value, where constant
        self.count = 0
        # placeholders that must be read packed as they are (inputs the recipe writes)
        self.keep_packed: set[str] = set()
        self.input_nodes: dict[str, str] = {}  # placeholder -> its Input node
        self.input_windows: dict[str, Window] = {}  # placeholder -> its window

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
        val = fake_value(node)
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
        val = fake_value(node)
        first = val
        if isinstance(val, list | tuple):
            # the step's own type is its first tensor's; an entry may be None (a gradient
            # the graph does not need), its readers' Items carry their types
            first = next((t for t in val if isinstance(t, torch.Tensor)), None)
            if first is None:
                raise UnsupportedError(f"{node.name} returns a tuple without a tensor")
        dtype, shape = tensor_type(node, first)
        return self.add(Node(node.name, "Opaque", tuple(slots), (name,), dtype, shape), node.name)

    # --- the node kinds --------------------------------------------------------------

    def placeholder(self, node: torch.fx.Node) -> None:
        val = fake_value(node)
        if isinstance(val, int | torch.SymInt):  # a size input: read at call time
            self.env[node.name] = SIZE
            return
        dtype, shape = tensor_type(node)
        window = None if node.name in self.keep_packed else window_of(val)
        if window is None:
            self.env[node.name] = self.input_nodes[node.name] = self.add(
                Node(node.name, "Input", (), (node.name,), dtype, shape), node.name
            )
            return
        # a window of a packed region (a saved transposed weight, attention's heads): the
        # program reads the region and views the window, instead of a copy at every call
        base = self.add(Node(node.name, "Input", (), (node.name,), dtype, window.region), node.name)
        self.input_nodes[node.name], self.input_windows[node.name] = base, window
        x, now = base, list(window.region)
        for axis, index in window.gaps:
            now[axis] = 1
            x = self._view_node(node, "Slice", x, (axis, index, index + 1, 1), dtype, now)
        if window.gaps:
            gap_axes = {axis for axis, _ in window.gaps}
            now = [n for j, n in enumerate(window.region) if j not in gap_axes]
            x = self._view_node(node, "View", x, (tuple(now),), dtype, now)
        if window.order != tuple(range(len(window.order))):
            now = [now[p] for p in window.order]
            x = self._view_node(node, "Permute", x, (window.order,), dtype, now)
        if tuple(now) != tuple(shape):
            x = self._view_node(node, "View", x, (tuple(shape),), dtype, shape)
        self.env[node.name] = x

    def _view_node(self, node, op: str, x: str, attrs: tuple, dtype: str, shape) -> str:
        view = Node(self.fresh(node.name), op, (x,), attrs, dtype, tuple(shape))
        return self.add(view, node.name)

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
        handler = HANDLERS.get(str(target))
        name = None
        from .custom_ops import by_target, library_op, replacement_for

        custom = by_target(str(target)) or library_op(target)
        if custom is not None:
            self.env[node.name] = self.custom(node, custom)
            return
        custom = replacement_for(str(target)) if self.replacements else None
        if custom is not None and self.replaceable(node, custom):
            # the replacing op's kernel stands in for the ATen op (its decomposition steps aside)
            shadow = self.shadow(node, handler) if handler is not None else None
            name = self.opaque(node)
            self.custom_nodes[name] = len(self.g.nodes[name].args)
            if shadow is not None:
                self.replaced[name] = shadow
            self.env[node.name] = name
            return
        if handler is not None:
            name = handler(self, node)
        if name is None:
            row = ot.BY_ATEN.get(str(target))
            if row is not None and row.category == ot.ELEMENTWISE and not node.kwargs:
                name = self.elementwise(node, row)
        self.env[node.name] = name if name is not None else self.opaque(node)

    def shadow(self, node: torch.fx.Node, handler: Handler) -> Node | None:
        """The one op-table node ``handler`` would import ``node`` as, left out of the graph:
        the term a replacing custom op stands in for, so that rules recognising a larger
        computation (attention.egg) see through the replacement. None where the handler
        declines or builds more than one node."""
        nodes, names = dict(self.g.nodes), dict(self.fx_names)
        try:
            made = handler(self, node)
        except UnsupportedError:
            made = None
        new = [n for n in self.g.nodes if n not in nodes]
        node_made = self.g.nodes.get(made) if made is not None else None
        self.g.nodes, self.fx_names = nodes, names
        if node_made is None or new != [made] or node_made.row is None:
            return None
        return node_made

    def replaceable(self, node: torch.fx.Node, op) -> bool:
        """A replaced ATen op takes the custom kernel when its dtypes, its arguments (the op's
        ``when``) and its output type (the first tensor operand's) allow."""
        tensors = [a for a in node.args if isinstance(a, torch.fx.Node)]
        if not tensors or node.kwargs:
            return False
        types = [tensor_type(a) for a in tensors]
        if any(TORCH_DTYPES[d] not in op.dtypes for d, _ in types):
            return False
        if tensor_type(node) != types[0]:
            return False
        if op.when is not None:
            sample = [fake_value(a) if isinstance(a, torch.fx.Node) else a for a in node.args]
            if not op.when(*sample):
                return False
        return True

    def custom(self, node: torch.fx.Node, op) -> str:
        """A saturn custom op: an expression is inlined (it fuses with its neighbours); a
        kernel or host op whose dtypes it takes and whose output is typed like its first
        tensor operand becomes a node the compiler places on the device as one ``Custom``
        kernel; anything else stays an opaque call of the op (its reference on the host)."""
        tensors = [a for a in node.args if isinstance(a, torch.fx.Node)]
        types = [tensor_type(a) for a in tensors]
        dtype, shape = tensor_type(node)
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
        dtype, shape = tensor_type(node)
        return self.add(Node(node.name, "Item", (base,), (index,), dtype, shape), node.name)

    def elementwise(self, node: torch.fx.Node, row: ot.Op) -> str | None:
        dtype, shape = tensor_type(node)
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
            if not divisor_is_constant(operands, dtype):
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


def divisor_is_constant(operands: list, dtype: str) -> bool:
    """An integer remainder or floor division of a tensor by a Python int the op table
    admits (``ot.constant_divisor``: 1 <= b <= 2^53, fitting the dtype), which cannot
    raise or overflow; a tensor, zero or negative divisor stays PyTorch's op (a zero
    divisor raises there)."""
    a, b = operands
    return isinstance(a, torch.fx.Node) and type(b) is int and ot.constant_divisor(b, dtype)


# higher-order ops AOTAutograd wraps around a call of an op that mutates its arguments
_MUTATIONS = ("auto_functionalized", "auto_functionalized_v2")
