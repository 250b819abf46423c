"""Graphs in the term language: the compiler's input, from text or from the FX importer.

A graph is a list of nodes in definition order. Each node has a name, an op (a row of the
op table, or ``Opaque``), tensor operands (names of earlier nodes), attributes typed by the
op's row, and a type (dtype, shape) computed by ``saturn.eqsat.types`` or given for opaque
nodes. The text form (``.graph`` files) is s-expressions::

    ;; a comment
    (input x f32 [4 8])
    (param w f32 [8])
    (let y (Relu (Add x w)))            ; nested terms are flattened into nodes
    (let s (Sum y [1] 0))               ; attributes follow the operands, as in the op table
    (let c (Mul y (Scalar -0.0 f32)))   ; scalars: a float literal and a dtype
    (let o (Opaque "aten.cumsum" y [1]) f32 [4 8])   ; opaque nodes carry their type
    (output s c)
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

from . import optable as ot
from .bits import bits_float, float_bits
from .errors import GraphError, SourceLoc
from .types import infer

__all__ = ["bits_float", "float_bits"]  # re-exported: the bit patterns live in .bits


@dataclass
class Node:
    name: str
    op: str
    args: tuple[str, ...] = ()
    attrs: tuple = ()
    dtype: str = ""
    shape: tuple[int, ...] = ()
    loc: SourceLoc | None = None

    @property
    def row(self) -> ot.Op | None:
        return ot.BY_NAME.get(self.op)


@dataclass
class Graph:
    nodes: dict[str, Node] = field(default_factory=dict)
    outputs: list[str] = field(default_factory=list)

    def add(self, node: Node) -> Node:
        if node.name in self.nodes:
            raise GraphError(f"{node.name!r} is defined twice", node.loc)
        for a in node.args:
            if a not in self.nodes:
                raise GraphError(f"{node.op}: operand {a!r} is not defined before use", node.loc)
        self.nodes[node.name] = node
        return node

    def inputs(self) -> list[Node]:
        return [n for n in self.nodes.values() if n.op in ("Input", "Param")]

    def users(self) -> dict[str, list[str]]:
        out: dict[str, list[str]] = {n: [] for n in self.nodes}
        for n in self.nodes.values():
            for a in n.args:
                out[a].append(n.name)
        return out

    def to_text(self) -> str:
        lines = []
        for n in self.nodes.values():
            if n.op in ("Input", "Param"):
                kind = "input" if n.op == "Input" else "param"
                lines.append(f"({kind} {n.name} {n.dtype} {fmt_ints(n.shape)})")
                continue
            attrs = [fmt_attr(n, i, a) for i, a in enumerate(n.attrs)]
            parts = (
                [n.op, attrs[0], *n.args, *attrs[1:]]
                if n.op == "Opaque"
                else [n.op, *n.args, *attrs]
            )
            term = " ".join(parts)
            typ = f" {n.dtype} {fmt_ints(n.shape)}" if n.op in ("Opaque", "Item") else ""
            lines.append(f"(let {n.name} ({term}){typ})")
        lines.append(f"(output {' '.join(self.outputs)})")
        return "\n".join(lines) + "\n"


def fmt_ints(v) -> str:
    return "[" + " ".join(str(int(x)) for x in v) + "]"


def fmt_float(x: float) -> str:
    if math.isnan(x):
        return "nan"
    if math.isinf(x):
        return "inf" if x > 0 else "-inf"
    return repr(float(x))


def fmt_attr(node: Node, i: int, a) -> str:
    row = node.row
    kind = row.attrs[i][1] if row and i < len(row.attrs) else None
    if node.op == "Opaque" and i == 0:
        return f'"{a}"'
    if kind == "bits":
        return fmt_float(bits_float(a))
    if isinstance(a, tuple | list):
        return fmt_ints(a)
    if isinstance(a, float):
        return fmt_float(a)
    return str(a)


# --- s-expression reader -----------------------------------------------------------------


@dataclass
class Tok:
    text: str
    loc: SourceLoc
    quoted: bool = False


def tokenize(text: str, file: str) -> list[Tok]:
    toks: list[Tok] = []
    line, col, i = 1, 1, 0
    while i < len(text):
        c = text[i]
        if c == "\n":
            line, col, i = line + 1, 1, i + 1
            continue
        if c.isspace():
            col, i = col + 1, i + 1
            continue
        if c == ";":
            while i < len(text) and text[i] != "\n":
                i += 1
            continue
        loc = SourceLoc(file, line, col)
        if c in "()[]":
            toks.append(Tok(c, loc))
            col, i = col + 1, i + 1
            continue
        if c == '"':
            j = text.find('"', i + 1)
            if j < 0:
                raise GraphError("unterminated string", loc)
            toks.append(Tok(text[i + 1 : j], loc, quoted=True))
            col, i = col + (j - i + 1), j + 1
            continue
        j = i
        while j < len(text) and not text[j].isspace() and text[j] not in '()[];"':
            j += 1
        toks.append(Tok(text[i:j], loc))
        col, i = col + (j - i), j
    return toks


def read_sexprs(text: str, file: str) -> list:
    """Parse into nested lists; brackets give ('[', items) tuples. Tokens keep locations."""
    toks = tokenize(text, file)
    pos = 0

    def read():
        nonlocal pos
        if pos >= len(toks):
            raise GraphError("unexpected end of file", toks[-1].loc if toks else SourceLoc(file))
        t = toks[pos]
        pos += 1
        if t.text in ("(", "[") and not t.quoted:
            close = ")" if t.text == "(" else "]"
            items = []
            while True:
                if pos >= len(toks):
                    raise GraphError(f"missing {close!r} for the {t.text!r} opened here", t.loc)
                if toks[pos].text == close and not toks[pos].quoted:
                    pos += 1
                    break
                if toks[pos].text in (")", "]") and not toks[pos].quoted:
                    raise GraphError(f"unexpected {toks[pos].text!r}", toks[pos].loc)
                items.append(read())
            return (t, items) if t.text == "(" else ("[", t, items)
        if t.text in (")", "]") and not t.quoted:
            raise GraphError(f"unexpected {t.text!r}", t.loc)
        return t

    out = []
    while pos < len(toks):
        out.append(read())
    return out


# --- graph reader --------------------------------------------------------------------------


def parse_float(t: Tok) -> float:
    try:
        return float(t.text)
    except ValueError:
        raise GraphError(f"expected a number, got {t.text!r}", t.loc) from None


def parse_int(t) -> int:
    if not isinstance(t, Tok):
        raise GraphError("expected an integer", _loc(t))
    try:
        return int(t.text)
    except ValueError:
        raise GraphError(f"expected an integer, got {t.text!r}", t.loc) from None


def parse_ints(x) -> tuple[int, ...]:
    if not (isinstance(x, tuple) and x[0] == "["):
        raise GraphError("expected a list of integers like [1 2]", _loc(x))
    return tuple(parse_int(t) for t in x[2])


def _loc(x) -> SourceLoc | None:
    if isinstance(x, Tok):
        return x.loc
    if isinstance(x, tuple):
        return x[1].loc if x[0] == "[" else x[0].loc
    return None


def _dtype(t) -> str:
    if not isinstance(t, Tok) or t.text not in ot.ITEMSIZE:
        raise GraphError(
            f"unknown dtype {getattr(t, 'text', t)!r}; one of {sorted(ot.ITEMSIZE)}", _loc(t)
        )
    return t.text


class _Reader:
    def __init__(self, file: str):
        self.graph = Graph()
        self.file = file
        self.fresh = 0

    def name(self) -> str:
        self.fresh += 1
        return f"%{self.fresh}"

    def term(self, x, name: str | None = None, typ: tuple | None = None) -> str:
        """Add the node(s) for term ``x``; return the name of its value."""
        if isinstance(x, Tok):
            if x.text not in self.graph.nodes:
                raise GraphError(f"{x.text!r} is not defined before use", x.loc)
            if name is not None:
                raise GraphError("a let must bind a term, not a name", x.loc)
            return x.text
        if not (isinstance(x, tuple) and x[0] != "[" and x[1]):
            raise GraphError("expected a term like (Op operand ...)", _loc(x))
        head, items = x[1][0], x[1][1:]
        loc = head.loc
        op = head.text
        if op == "Scalar":
            if len(items) != 2:
                raise GraphError("Scalar takes a value and a dtype: (Scalar 0.5 f32)", loc)
            node = Node(
                name or self.name(),
                "Scalar",
                (),
                (float_bits(parse_float(items[0])), _dtype(items[1])),
                loc=loc,
            )
            return self._add(node, typ)
        if op == "Opaque":
            if not items or not isinstance(items[0], Tok) or not items[0].quoted:
                raise GraphError('Opaque needs an op name string: (Opaque "aten.x" ...)', loc)
            if typ is None:
                raise GraphError(
                    "an Opaque node needs its type: (let y (Opaque ...) f32 [2 3])", loc
                )
            args, attrs = [], [items[0].text]
            for it in items[1:]:
                if isinstance(it, tuple) and it[0] == "[":
                    attrs.append(parse_ints(it))
                else:
                    args.append(self.term(it))
            return self._add(
                Node(name or self.name(), "Opaque", tuple(args), tuple(attrs), loc=loc), typ
            )
        if op == "Item":  # one result of a host op returning several: typed as Opaque is
            if len(items) != 2 or typ is None:
                raise GraphError(
                    "Item takes a host op's result and an index, with the result's type: "
                    "(let y (Item op 0) f32 [2 3])",
                    loc,
                )
            node = Node(
                name or self.name(), "Item", (self.term(items[0]),), (parse_int(items[1]),), loc=loc
            )
            return self._add(node, typ)
        row = ot.BY_NAME.get(op)
        if row is None or (row.category == ot.LEAF and op != "Arange"):
            raise GraphError(f"unknown operation {op!r} (see eqsat/optable.py)", loc)
        want = row.arity + len(row.attrs)
        if len(items) != want:
            sig = " ".join(["t"] * row.arity + [a for a, _ in row.attrs])
            raise GraphError(f"{op} takes {want} arguments ({op} {sig}), got {len(items)}", loc)
        args = tuple(self.term(it) for it in items[: row.arity])
        attrs = []
        for (aname, kind), it in zip(row.attrs, items[row.arity :], strict=True):
            if kind == "ints":
                attrs.append(parse_ints(it))
            elif kind == "int":
                attrs.append(parse_int(it))
            elif kind == "float":
                attrs.append(parse_float(it))
            elif kind == "bits":
                attrs.append(float_bits(parse_float(it)))
            elif kind == "str":
                if not isinstance(it, Tok):
                    raise GraphError(f"{op}: attribute {aname} must be a word", _loc(it))
                attrs.append(it.text)
        return self._add(Node(name or self.name(), op, args, tuple(attrs), loc=loc), typ)

    def _add(self, node: Node, typ: tuple | None) -> str:
        self.graph.add(node)
        if typ is not None:
            node.dtype, node.shape = typ
        if node.op not in ("Opaque", "Item"):
            dtype, shape = infer(self.graph, node)
            if typ is not None and (dtype, shape) != typ:
                raise GraphError(
                    f"{node.op}: declared type {typ} but the op gives {(dtype, shape)}", node.loc
                )
            node.dtype, node.shape = dtype, shape
        return node.name

    def statement(self, x) -> None:
        if not (isinstance(x, tuple) and x[0] != "[" and x[1] and isinstance(x[1][0], Tok)):
            raise GraphError(
                "expected (input ...), (param ...), (let ...) or (output ...)", _loc(x)
            )
        head, items = x[1][0], x[1][1:]
        kw = head.text
        if kw in ("input", "param"):
            if len(items) != 3 or not isinstance(items[0], Tok):
                raise GraphError(f"({kw} NAME DTYPE [SHAPE])", head.loc)
            node = Node(
                items[0].text,
                "Input" if kw == "input" else "Param",
                attrs=(items[0].text,),
                dtype=_dtype(items[1]),
                shape=parse_ints(items[2]),
                loc=head.loc,
            )
            if any(s < 0 for s in node.shape):
                raise GraphError("shapes must be non-negative", head.loc)
            self.graph.add(node)
        elif kw == "let":
            if len(items) not in (2, 4) or not isinstance(items[0], Tok):
                raise GraphError("(let NAME TERM) or (let NAME TERM DTYPE [SHAPE])", head.loc)
            typ = (_dtype(items[2]), parse_ints(items[3])) if len(items) == 4 else None
            self.term(items[1], items[0].text, typ)
        elif kw == "output":
            if not items:
                raise GraphError("(output NAME ...) needs at least one name", head.loc)
            for it in items:
                if not isinstance(it, Tok):
                    raise GraphError(
                        "(output NAME ...) takes names: bind a term with let", _loc(it)
                    )
                if it.text not in self.graph.nodes:
                    raise GraphError(f"output {it.text!r} is not defined", _loc(it))
                self.graph.outputs.append(it.text)
        else:
            raise GraphError(f"unknown statement {kw!r}", head.loc)


def parse_graph(text: str, file: str = "<graph>") -> Graph:
    """Read a graph from its text form; errors name the file and line."""
    reader = _Reader(file)
    for x in read_sexprs(text, file):
        reader.statement(x)
    if not reader.graph.outputs:
        raise GraphError("the graph has no (output ...)", SourceLoc(file, 1, 1))
    return reader.graph


def load_graph(path: str | Path) -> Graph:
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as e:
        raise GraphError(f"cannot read graph: {e.strerror}", SourceLoc(str(path))) from None
    return parse_graph(text, str(path))
