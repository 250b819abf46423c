"""Recipes for graphs whose shapes hold symbols: one compile serves every size.

The importer compiles a symbolic graph once with each symbol standing for a marker (a
distinct large prime, ``importer.MARKERS``): the e-graph, extraction and lowering see plain
integers, and every extent in the program is a product of a static cofactor and markers.
At a call, the sizes are read from the call's inputs (a size input, or a tensor dimension
that is exactly one symbol), each marker factor is replaced by its size, and the program's
extents, view shapes and input and output types are rewritten; the kernels need no new
code (their source depends on ranks and dtypes, their extents are launch arguments, and
every launch checks operand sizes). The concrete recipe for a size tuple is prepared once
and kept (most recent ``KEEP``), so on a GPU each size seen gets its own memory plan and its
own CUDA graph: replay is per shape seen.

A size used as a value in arithmetic on tensors (``x * x.shape[0]``, ``x.sum(1) / n``) is
an int64 0-d input of the program, made at each call from the size's expression.

Limits (the graph then runs uncompiled, with the reason logged): a size passed to an op
kept as a host call, more symbols than markers, a symbol that no input carries alone. A
Python int used as an extent that arrives below 2 runs that one call uncompiled.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from collections import OrderedDict

import torch

from saturn.eqsat.program import Operand, Program, StepKind

from .importer import MARKERS, UnsupportedError
from .recipe import InputSpec, Recipe

log = logging.getLogger("saturn")
KEEP = 16  # concrete recipes kept per symbolic recipe
_LOWEST = min(MARKERS)


def substitute(v: int, sizes: dict[int, int]) -> int:
    """``v`` with each marker factor replaced by that marker's size."""
    if not isinstance(v, int) or isinstance(v, bool) or v < _LOWEST:
        return v
    rest, factor = v, 1
    for marker, size in sizes.items():
        while rest % marker == 0:
            rest //= marker
            factor *= size
    return v if rest == v else rest * factor


def _ints(x, sizes):
    if isinstance(x, tuple):
        return tuple(_ints(e, sizes) for e in x)
    if isinstance(x, list):
        return [_ints(e, sizes) for e in x]
    return substitute(x, sizes)


def instantiate(program: Program, sizes: dict[int, int]) -> Program:
    """The program with the call's sizes in place of the markers (constants untouched)."""

    def shape(s):
        return tuple(substitute(d, sizes) for d in s)

    steps = []
    for s in program.steps:
        k = s.kernel
        if k is not None:
            k = dataclasses.replace(
                k,
                shape=shape(k.shape),
                domain=shape(k.domain),
                inputs=[Operand(o.value, o.dtype, shape(o.shape), o.indexing) for o in k.inputs],
            )
            if "segments" in k.attrs:  # a loop group's other loops' domains
                segments = tuple(shape(d) for d in k.attrs["segments"])
                k = dataclasses.replace(k, attrs={**k.attrs, "segments": segments})
        # a view's shape and an Arange's length hold markers; other constants do not
        sized = s.kind == StepKind.VIEW or (s.kind == StepKind.CONST and s.op == "Arange")
        attrs = _ints(s.attrs, sizes) if sized else s.attrs
        steps.append(dataclasses.replace(s, shape=shape(s.shape), attrs=attrs, kernel=k))
    return Program(steps, list(program.outputs), dict(program.inputs))


@dataclasses.dataclass(frozen=True)
class SizeSource:
    symbol: str
    marker: int
    position: int  # the call argument that carries it
    dim: int | None  # None: the argument is the size itself; else a tensor dimension


def size_sources(gm: torch.fx.GraphModule, symbols: dict[str, int]) -> list[SizeSource]:
    """Where each symbol's value is read at a call: a size input or a tensor dimension that
    is exactly that symbol."""
    found: dict[str, SizeSource] = {}
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    for i, node in enumerate(placeholders):
        val = node.meta.get("val")
        if isinstance(val, torch.SymInt) and val.node.expr.is_Symbol:
            name = str(val.node.expr)
            if name in symbols:
                found.setdefault(name, SizeSource(name, symbols[name], i, None))
        elif isinstance(val, torch.Tensor):
            for d, s in enumerate(val.shape):
                if isinstance(s, torch.SymInt) and s.node.expr.is_Symbol:
                    name = str(s.node.expr)
                    if name in symbols:
                        found.setdefault(name, SizeSource(name, symbols[name], i, d))
    missing = sorted(set(symbols) - set(found))
    if missing:
        raise UnsupportedError(f"no input carries symbolic size(s) {missing} by itself")
    return [found[s] for s in sorted(found)]


def extent_markers(recipe: Recipe) -> set[int]:
    """The markers that are a factor of some extent of the recipe: a shape, a domain, a
    view's or an Arange's sizes, an input's or an output's type, a size it returns. A
    symbol whose marker is in none is used only as a value (``x * k`` for a Python int k)."""
    found: set[int] = set()

    def note(x) -> None:
        if isinstance(x, tuple | list):
            for e in x:
                note(e)
        elif isinstance(x, int) and not isinstance(x, bool) and x >= _LOWEST:
            found.update(m for m in MARKERS if x % m == 0)

    for st in recipe.program.steps:
        note(st.shape)
        if st.kind == StepKind.VIEW or (st.kind == StepKind.CONST and st.op == "Arange"):
            note(st.attrs)
        if st.kernel is not None:
            note((st.kernel.shape, st.kernel.domain, [o.shape for o in st.kernel.inputs]))
            note(st.kernel.attrs.get("segments", ()))
    for spec in [*recipe.inputs, *recipe.output_types]:
        if spec is not None:
            note((spec.shape, spec.strides or ()))
    note([o[1] for o in recipe.output_spec if isinstance(o, tuple)])
    return found


class SymbolicRecipe:
    """A recipe over markers; calls run a concrete recipe for the call's sizes.

    Dynamo hands a graph over symbols only sizes of 2 or more for tensor dimensions (it
    specialises 0 and 1), but a Python int (an argument, a closure cell) can take any
    value: a symbol used only as a value takes any int; one that is also an extent and
    arrives below 2 runs that call through ``fallback`` (the graph uncompiled), where
    broadcasting and empty tensors follow PyTorch's own rules."""

    def __init__(
        self,
        template: Recipe,
        sources: list[SizeSource],
        size_values: list[tuple[str, object]] = (),
        fallback=None,
    ):
        self.template = template
        self.sources = sources
        self.fallback = fallback  # boxed call of the uncompiled graph
        self.fallback_calls = 0
        self.extents = extent_markers(template)
        # sizes used as values: leading inputs, an expression over the symbols each
        self.size_values = [expr for _, expr in size_values]
        self.markers = {s.symbol: s.marker for s in sources}
        # size tuple -> the leading size-value tensors (made once per size, as the recipe)
        self.value_inputs: dict[tuple, list[torch.Tensor]] = {}
        self.concrete: OrderedDict[tuple, Recipe] = OrderedDict()
        self.built = 0  # concrete recipes prepared (sizes seen)
        self.lock = threading.Lock()
        self.latest: Recipe | None = None

    def sizes(self, args: list) -> dict[int, int] | None:
        """The call's value of each symbol; None where an extent's symbol is below 2."""
        out = {}
        for src in self.sources:
            a = args[src.position]
            v = a if src.dim is None else a.shape[src.dim]
            v = int(v)
            if v < 2 and src.marker in self.extents:
                return None
            out[src.marker] = v
        return out

    def for_sizes(self, sizes: dict[int, int]) -> Recipe:
        key = tuple(sorted(sizes.items()))
        with self.lock:
            r = self.concrete.get(key)
            if r is not None:
                self.concrete.move_to_end(key)
                return r
        t = self.template

        def spec(s: InputSpec | None) -> InputSpec | None:
            if s is None or s.dtype is None:
                return s
            strides = None if s.strides is None else tuple(substitute(d, sizes) for d in s.strides)
            shape = tuple(substitute(d, sizes) for d in s.shape)
            return InputSpec(s.dtype, shape, strides, s.window)

        r = Recipe(
            program=instantiate(t.program, sizes),
            device=t.device,
            io_on_device=t.io_on_device,
            inputs=[spec(s) for s in t.inputs],
            output_spec=[
                (o[0], substitute(o[1], sizes)) if isinstance(o, tuple) else o
                for o in t.output_spec
            ],
            output_types=[spec(s) for s in t.output_types],
            host_calls=t.host_calls,
            input_names=list(t.input_names),
            resolve_custom=t.resolve_custom,
            replay=t.replay,
            precision=t.precision,
            ownership=t.ownership,
            rerun=t.rerun,
            writes=t.writes,
        )
        r.prepare()
        with self.lock:
            self.concrete[key] = r
            self.built += 1
            while len(self.concrete) > KEEP:
                old, _ = self.concrete.popitem(last=False)
                self.value_inputs.pop(old, None)
        return r

    def values(self, sizes: dict[int, int]) -> list[torch.Tensor]:
        """The leading inputs: each size used as a value, as an int64 0-d tensor where the
        recipe's inputs live; evaluated and made once per size tuple (the recipe reads its
        inputs only, and a replayed call finds them at the same address)."""
        key = tuple(sorted(sizes.items()))
        with self.lock:
            out = self.value_inputs.get(key)
        if out is not None:
            return out
        out = []
        device = self.template.device if self.template.io_on_device else torch.device("cpu")
        for expr in self.size_values:
            v = expr.subs({sym: sizes[self.markers[str(sym)]] for sym in expr.free_symbols})
            out.append(torch.tensor(int(v), dtype=torch.int64, device=device))
        with self.lock:
            self.value_inputs[key] = out
        return out

    def __call__(self, args: list) -> list:
        want = len(self.template.inputs) - len(self.size_values)
        if len(args) != want:
            raise RuntimeError(f"saturn recipe takes {want} inputs, got {len(args)}")
        sizes = self.sizes(args)
        if sizes is None:
            if self.fallback is None:
                raise RuntimeError("saturn: a symbolic extent below 2 and no uncompiled graph")
            if not self.fallback_calls:
                log.info("saturn: a size below 2 in an extent: this call runs uncompiled")
            self.fallback_calls += 1
            return list(self.fallback(*args))
        r = self.for_sizes(sizes)
        self.latest = r
        return r([*self.values(sizes), *args] if self.size_values else args)

    # what tests and explain read from a recipe
    @property
    def program(self) -> Program:
        return self.template.program

    @property
    def output_spec(self):
        return self.template.output_spec

    @property
    def output_types(self):
        return self.template.output_types

    @property
    def device(self):
        return self.template.device

    @property
    def last(self):
        return self.latest.last if self.latest else self.template.last

    @property
    def runner(self):
        return self.latest.runner if self.latest else None
