"""The extracted program: host steps, crossings, views and kernel descriptions, in order.

This is what ``saturn.codegen`` and the executor consume. A kernel description says what
the kernel reads and how it indexes each operand, what it writes, and its body (a scalar
expression tree over its operands); no pointer into the e-graph survives here. ``validate``
checks the invariants after lowering: every value defined before use, every operand of a
kernel typed, outputs defined.
"""

from __future__ import annotations

import math
from collections.abc import Collection
from dataclasses import dataclass, field, replace

from . import optable as ot
from .egraph import EGraphView, ENode
from .errors import ValidationError
from .extract import DEVICE, KERNELS, MOVEMENT, Choice, Type
from .graph import Graph, bits_float, fmt_float, fmt_ints

Expr = tuple  # ("in", i) | ("stage", j) | ("const", bits, dtype) | (op, *children)


@dataclass
class Operand:
    value: str
    dtype: str
    shape: tuple[int, ...]
    # same | scalar | trailing | leading | middle | strided (see indexing()); a rows kernel
    # with a fused take (fuse_row_takes) also: table | rowindex
    indexing: str


@dataclass
class Stage:
    """One per-row reduction inside a ``rows`` kernel: ``reduce`` of ``body`` along the
    domain's last axis, then ``epilogue`` (leaf ("in", 0) is the reduced value). Later
    bodies read the result as the leaf ("stage", j)."""

    reduce: str
    body: Expr
    epilogue: Expr | None
    acc_dtype: str  # what the reduction accumulates
    dtype: str  # the stage's value after the epilogue


@dataclass
class Kernel:
    kind: str  # loop | reduce | rows | gemm | conv | gather | scatter | concat | pad | custom
    output: str
    dtype: str
    shape: tuple[int, ...]
    inputs: list[Operand]
    body: Expr | None = None  # loop and reduce
    domain: tuple[int, ...] = ()  # iteration shape of the body (the reduce input for reduce)
    attrs: dict = field(default_factory=dict)
    covers: list[str] = field(default_factory=list)  # graph nodes whose value it writes
    fused: list[str] = field(default_factory=list)  # graph nodes computed inside, not written
    # reduce: an elementwise function of the reduced value (its leaf is ("in", 0)), applied
    # before the write; the reduction itself then produces attrs["acc_dtype"]
    epilogue: Expr | None = None
    # rows: per-row reductions computed, in order, before the body (see fuse_rows)
    stages: list[Stage] = field(default_factory=list)


@dataclass
class Step:
    kind: str  # input | host | crossing | view | kernel | const
    output: str
    op: str = ""
    args: tuple[str, ...] = ()
    attrs: tuple = ()
    dtype: str = ""
    shape: tuple[int, ...] = ()
    place: str = "host"
    kernel: Kernel | None = None
    covers: list[str] = field(default_factory=list)


@dataclass
class Program:
    steps: list[Step]
    outputs: list[str]
    inputs: dict[str, str]  # graph input name -> value

    @property
    def kernels(self) -> list[Kernel]:
        return [s.kernel for s in self.steps if s.kernel is not None]

    def count(self, kind: str) -> int:
        return sum(1 for s in self.steps if s.kind == kind)

    def to_text(self) -> str:
        lines = []
        for s in self.steps:
            lines.append(format_step(s))
        lines.append(f"(output {' '.join(self.outputs)})")
        return "\n".join(lines) + "\n"


def format_expr(e: Expr) -> str:
    if e[0] == "in":
        return f"in{e[1]}"
    if e[0] == "stage":
        return f"s{e[1]}"
    if e[0] == "const":
        return f"{fmt_float(bits_float(e[1]))}:{e[2]}"
    if e[0] == "cast":
        return f"(cast {format_expr(e[1])} {e[2]})"
    return "(" + " ".join([e[0], *(format_expr(c) for c in e[1:])]) + ")"


def format_step(s: Step) -> str:
    typ = f"{s.dtype}{fmt_ints(s.shape)}"
    if s.kind == "input":
        return f"{s.output} = input {s.op} : {typ}"
    if s.kind == "kernel":
        k = s.kernel
        ins = ", ".join(f"in{i}={o.value}/{o.indexing}" for i, o in enumerate(k.inputs))
        attrs = "".join(
            f" {a}={fmt_attr_value(v)}" for a, v in sorted(k.attrs.items()) if a != "acc_dtype"
        )
        body = f" body {format_expr(k.body)}" if k.body is not None else ""
        if k.epilogue is not None:
            body += f" then {format_expr(k.epilogue).replace('in0', 'acc')}"
        if k.stages:
            body = f" stages [{'; '.join(format_stage(st) for st in k.stages)}]" + body
        return f"{s.output} = kernel {k.kind}({ins}){attrs}{body} : {typ}"
    args = " ".join(s.args)
    attrs = "".join(f" {fmt_attr_value(a)}" for a in s.attrs)
    where = f" @{s.place}" if s.kind in ("view", "const") else ""
    return f"{s.output} = {s.kind} {s.op} {args}{attrs}{where} : {typ}".replace("  ", " ")


def format_stage(st: Stage) -> str:
    text = f"{st.reduce} {format_expr(st.body)}"
    if st.epilogue is not None:
        text += f" then {format_expr(st.epilogue).replace('in0', 'acc')}"
    return text


def packed_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    out, step = [], 1
    for n in reversed(shape):
        out.append(step)
        step *= max(n, 1)
    return tuple(reversed(out))


def view_strides(
    shape: tuple[int, ...], strides: tuple[int, ...], new: tuple[int, ...]
) -> tuple[int, ...] | None:
    """The strides of a reshape of a strided tensor that is a view, None where it must copy
    (PyTorch's rule: each run of new axes spans a run of old axes that is contiguous within
    itself)."""
    if math.prod(shape) == 0:
        return packed_strides(new)
    out = [0] * len(new)
    view_d = len(new) - 1
    chunk = strides[-1] if strides else 1
    tensor_numel, view_numel = 1, 1
    for d in range(len(shape) - 1, -1, -1):
        tensor_numel *= shape[d]
        if d == 0 or (shape[d - 1] != 1 and strides[d - 1] != tensor_numel * chunk):
            while view_d >= 0 and (view_numel < tensor_numel or new[view_d] == 1):
                out[view_d] = view_numel * chunk
                view_numel *= new[view_d]
                view_d -= 1
            if view_numel != tensor_numel:
                return None
            if d > 0:
                chunk = strides[d - 1]
                tensor_numel, view_numel = 1, 1
    return tuple(out) if view_d == -1 else None


def fmt_attr_value(v) -> str:
    if isinstance(v, tuple | list):
        return fmt_ints(v)
    return str(v)


def indexing(shape: tuple[int, ...], domain: tuple[int, ...]) -> str:
    if tuple(shape) == tuple(domain):
        return "same"
    if math.prod(shape) == 1:
        return "scalar"
    padded = (1,) * (len(domain) - len(shape)) + tuple(shape)
    k = next((i for i, s in enumerate(padded) if s != 1), len(padded))
    if padded[k:] == tuple(domain[k:]):
        return "trailing"  # varies along a trailing block of axes: index % numel
    j = max((i for i, s in enumerate(padded) if s != 1), default=-1)
    if padded[: j + 1] == tuple(domain[: j + 1]) and all(s == 1 for s in padded[j + 1 :]):
        return "leading"  # varies along a leading block: index // (rest)
    if padded[k : j + 1] == tuple(domain[k : j + 1]):
        return "middle"  # varies along an inner block (a channel): (index // rest) % numel
    return "strided"


MAX_BODY_DEPTH = 128  # nested ops in one kernel body (see _Lowering._inline_cut)
# distinct tensors a kernel reads before it reads a fused producer that is in memory anyway
# instead of recomputing it (see _Lowering._inline_cut)
MAX_FUSED_READS = 16
RECOMPUTE_WALK = 256  # body nodes _leaves walks for _inline_cut before answering "more"


class _Lowering:
    def __init__(
        self,
        graph: Graph,
        view: EGraphView,
        best: dict[int, Choice],
        types: dict[int, Type],
        place: dict[int, str],
        io_on_device: bool,
        layout: dict[int, str],
    ):
        self.layout = layout
        self.graph, self.view, self.best = graph, view, best
        self.types, self.place, self.io_on_device = types, place, io_on_device
        self.steps: list[Step] = []
        self.done: dict[int, str] = {}
        self.done_extra: dict[tuple, str] = {}
        self.visiting: set[int] = set()
        # loops written to memory whatever their readers do (read through an Ld from
        # outside any body, or by a library op, host op or output); None until known
        self.materialized: set[int] | None = None
        self._body: set[int] = set()  # what the body being lowered reads (_body_reads)
        self.names_of: dict[int, list[str]] = {}
        for name, cid in view.named.items():
            self.names_of.setdefault(cid, []).append(name)
        self.to_host: dict[int, list[int]] = {}  # device class -> host classes holding it
        for cid, enodes in view.classes.items():
            for en in enodes:
                if en.op == "ToHost":
                    self.to_host.setdefault(en.kids[0], []).append(cid)

    def host_twin_names(self, device_cid: int) -> list[str]:
        """Graph nodes whose value a device class holds (through ToDev or ToHost twins)."""
        out = list(self.names_of.get(device_cid, []))
        for en in self.view.classes[device_cid]:
            if en.op == "ToDev":
                out += self.names_of.get(en.kids[0], [])
        for host in self.to_host.get(device_cid, []):
            out += self.names_of.get(host, [])
        return list(dict.fromkeys(out))

    def value(self, cid: int) -> str:
        if cid in self.done:
            return self.done[cid]
        if cid in self.visiting:
            raise ValidationError(f"lowering: the extracted program has a cycle at class {cid}")
        self.visiting.add(cid)
        choice = self.best.get(cid)
        if choice is None:
            raise ValidationError(f"lowering: class {cid} has no extracted choice")
        name = self.lower(cid, choice.enode)
        en = choice.enode
        if en.op == "Slice" and self._packed_slice(cid, en):
            self.layout[cid] = "packed"  # a run of whole rows: an offset, packed strides
        elif en.op in ("Permute", "Expand", "Slice"):
            self.layout[cid] = "strided"
        elif en.op in ("View", "ToDev", "ToHost") and en.kids:
            self.layout[cid] = self.layout.get(en.kids[0], "packed")
        else:
            self.layout[cid] = "packed"
        self.visiting.discard(cid)
        self.done[cid] = name
        return name

    def _packed_slice(self, cid: int, en: ENode) -> bool:
        """A step-1 slice of a packed value along an axis with only unit axes before it
        (rows start..end of a table) is itself packed."""
        dim, _, _, step = en.attrs
        src = en.kids[0]
        shape = self.types[src][1] if src in self.types else None
        return (
            step == 1
            and shape is not None
            and all(n == 1 for n in shape[:dim])
            and self.layout.get(src, "packed") == "packed"
        )

    def typ(self, cid: int) -> Type:
        return self.types[cid]

    def emit(self, step: Step) -> str:
        self.steps.append(step)
        return step.output

    def lower(self, cid: int, en: ENode) -> str:
        out = f"v{cid}"
        dtype, shape = self.typ(cid) if cid in self.types else ("", ())
        covers = self.host_twin_names(cid) if cid in self.view.classes else []
        if en.op in ("Input", "Param"):
            return self.emit(
                Step(
                    "input",
                    out,
                    en.attrs[0],
                    dtype=dtype,
                    shape=shape,
                    place=DEVICE if self.io_on_device else "host",
                )
            )
        if en.op in ot.CONSTANTS:
            return self.emit(Step("const", out, en.op, attrs=en.attrs, dtype=dtype, shape=shape))
        if en.op == "ToDev" and self._constant(en.kids[0]):
            return self.device_constant(en.kids[0], out, dtype, shape)
        if en.op in ("ToDev", "ToHost"):
            src = self.value(en.kids[0])
            if self.io_on_device and en.op == "ToDev" and self._leaf(en.kids[0]):
                return src  # inputs already live on the device
            return self.emit(
                Step(
                    "crossing",
                    out,
                    en.op,
                    (src,),
                    dtype=dtype,
                    shape=shape,
                    place=DEVICE if en.op == "ToDev" else "host",
                )
            )
        if en.op in MOVEMENT:
            src = self.value(en.kids[0])
            return self.emit(
                Step(
                    "view",
                    out,
                    en.op,
                    (src,),
                    en.attrs,
                    dtype,
                    shape,
                    place=self.place.get(cid, "host"),
                    covers=covers,
                )
            )
        if en.op in KERNELS:
            k = self.kernel(cid, en, out, dtype, shape)
            return self.emit(
                Step(
                    "kernel",
                    out,
                    k.kind,
                    tuple(o.value for o in k.inputs),
                    dtype=dtype,
                    shape=shape,
                    place=DEVICE,
                    kernel=k,
                    covers=k.covers,
                )
            )
        if en.op == "Opaque":
            args = tuple(self.host_value(c) for c in self.tlist(en.kids[0]))
            return self.emit(Step("host", out, en.attrs[0], args, (), dtype, shape, covers=covers))
        if en.op == "Item":
            return self.emit(
                Step(
                    "host",
                    out,
                    "Item",
                    (self.value(en.kids[0]),),
                    en.attrs,
                    dtype,
                    shape,
                    covers=covers,
                )
            )
        args = tuple(self.host_value(k) for k in en.kids)
        return self.emit(Step("host", out, en.op, args, en.attrs, dtype, shape, covers=covers))

    def host_value(self, cid: int) -> str:
        """A host op's operand: an input living on the device crosses first (once)."""
        name = self.value(cid)
        if not (self.io_on_device and self._leaf(cid)):
            return name
        key = ("to-host", cid)
        if key not in self.done_extra:
            dtype, shape = self.typ(cid)
            self.done_extra[key] = self.emit(
                Step(
                    "crossing", f"h{cid}", "ToHost", (name,), dtype=dtype, shape=shape, place="host"
                )
            )
        return self.done_extra[key]

    def _leaf(self, cid: int) -> bool:
        return any(e.op in ("Input", "Param") for e in self.view.classes[cid])

    def device_constant(self, cid: int, out: str, dtype: str, shape: tuple) -> str:
        """Constant class ``cid`` made on the device once, not copied there on every call."""
        kid = self.best[cid].enode
        return self.emit(
            Step("const", out, kid.op, attrs=kid.attrs, dtype=dtype, shape=shape, place=DEVICE)
        )

    def _constant(self, cid: int) -> bool:
        choice = self.best.get(cid)
        return choice is not None and choice.enode.op in ot.CONSTANTS

    def tlist(self, cid: int) -> list[int]:
        out = []
        while True:
            en = next(e for e in self.view.classes[cid] if e.op in ("TCons", "TNil"))
            if en.op == "TNil":
                return out
            out.append(en.kids[0])
            cid = en.kids[1]

    def kernel(self, cid: int, en: ENode, out: str, dtype: str, shape) -> Kernel:
        covers = self.host_twin_names(cid)
        fused: list[str] = []
        if en.op in ("Loop", "Reduce"):
            body_cid = en.kids[0]
            domain = self.types[body_cid][1]
            leaves: list[int] = []
            self._body = self._body_reads(body_cid)
            body = self.expr(body_cid, leaves, fused)
            inputs = [self._operand(c, domain, fused) for c in leaves]
            fused = [n for n in fused if n not in covers]
            if en.op == "Loop":
                return Kernel("loop", out, dtype, shape, inputs, body, domain, {}, covers, fused)
            kind, dims, kd = en.attrs
            dims = tuple(sorted(d % len(domain) for d in dims)) if domain else ()
            packed = self._in_memory_order(leaves, inputs, dims, domain)
            if packed is not None:
                inputs, domain, dims = packed
            apart = self._adjacent_axes(inputs, dims, domain)
            if apart is not None:
                inputs, domain, dims = apart
            return Kernel(
                "reduce",
                out,
                dtype,
                shape,
                inputs,
                body,
                domain,
                {"reduce": kind, "dims": dims, "keepdim": kd},
                covers,
                fused,
            )

        def library(kind: str, operands: list[int], attrs: dict) -> Kernel:
            # library calls read their operands through strides, as they lie
            inputs = [Operand(self.value(c), *self.typ(c), "strided") for c in operands]
            return Kernel(kind, out, dtype, shape, inputs, None, shape, attrs, covers)

        if en.op == "Gemm":
            ops = [k for k in en.kids if not self._nobias(k)]
            return library("gemm", ops, {"epilogue": en.attrs[0]})
        if en.op == "Conv":
            ops = [k for k in en.kids if not self._nobias(k)]
            st, pa, di, g = en.attrs
            return library(
                "conv",
                ops,
                {"stride": st, "padding": pa, "dilation": di, "groups": g, "bias": len(ops) == 3},
            )
        if en.op == "Gather":
            return library("gather", list(en.kids), {})
        if en.op == "ScatterAdd":
            return library("scatter", list(en.kids), {})
        if en.op == "Concat":
            return library("concat", list(en.kids), {"dim": en.attrs[0]})
        if en.op == "PadCopy":
            pads, value = en.attrs
            return library("pad", list(en.kids), {"pads": tuple(pads), "value_bits": value})
        if en.op == "Custom":
            return library(
                "custom", self.tlist(en.kids[0]), {"name": en.attrs[0], "eps_bits": en.attrs[1]}
            )
        raise ValidationError(f"lowering: unknown kernel {en.op}")

    def _broadcast_scalar(self, cid: int) -> tuple | None:
        """(bits, dtype) of the scalar constant a value broadcasts (``Expand`` of a
        ``Scalar``, on either side of a crossing), None for anything else. Reading it in a
        kernel is reading the constant at every index."""
        expanded = False
        while True:
            choice = self.best.get(cid)
            if choice is None:
                return None
            en = choice.enode
            if en.op == "Scalar":
                return tuple(en.attrs) if expanded else None
            if en.op == "Expand":
                expanded = True
            elif en.op not in ("ToDev", "ToHost"):
                return None
            cid = en.kids[0]

    def strides(self, cid: int) -> tuple[int, ...] | None:
        """The element strides a value has at run time, where the program decides them: a
        kernel's or an input's packed output, permutes of one, and reshapes (views by
        PyTorch's rule, or packed copies where no view exists); None where unknown."""
        choice = self.best.get(cid)
        if choice is None or cid not in self.types:
            return None
        en, shape = choice.enode, tuple(self.types[cid][1])
        if en.op in ("Permute", "View", "ToDev", "ToHost") and en.kids:
            kid = self.strides(en.kids[0])
            if kid is None:
                return None
            if en.op == "Permute":
                return tuple(kid[d] for d in en.attrs[0])
            if en.op == "View":  # a reshape that is no view copies into a packed buffer
                src = tuple(self.types[en.kids[0]][1])
                return view_strides(src, kid, shape) or packed_strides(shape)
            return kid if en.op == "ToDev" and self.io_on_device else packed_strides(shape)
        if en.op in MOVEMENT:
            return None
        return packed_strides(shape)

    def _operand(self, c: int, domain, fused: list[str]) -> Operand:
        """How a loop or reduction over ``domain`` reads class ``c``: at a division of its
        flat index when its shape broadcasts to the domain (``indexing``), through strides
        when it is a strided view. An expand of a packed value is read as that value
        broadcast (an expanded scalar, a per-row statistic): every element of the expand
        is the element of its source that broadcasting picks, so the values are the same,
        and a strided read would divide the index once per axis. The expand then needs no
        view step of its own: its graph nodes join ``fused`` (computed inside the kernel)."""
        choice = self.best.get(c)
        if choice is not None and choice.enode.op == "Expand":  # a view: strided
            src = choice.enode.kids[0]
            name = self.value(src)  # lowered first: its layout is known after
            how = indexing(self.typ(src)[1], domain)
            if self.layout.get(src) == "packed" and how != "strided":
                fused += [n for n in self.host_twin_names(c) if n not in fused]
                return Operand(name, *self.typ(src), how)
        name = self.value(c)  # sets the layout read here
        if self.layout.get(c) != "strided":
            return Operand(name, *self.typ(c), indexing(self.typ(c)[1], domain))
        return Operand(name, *self.typ(c), "strided")

    def _in_memory_order(self, leaves: list[int], inputs: list[Operand], dims, domain):
        """A reduction whose operands all lie packed in memory in one order of the domain's
        axes reads them as packed: in the domain's order (a reshape's copy) as they are, in
        another (a bias gradient summed over a transposed gradient) through a permute view
        of each, the reduction running over the axes in that order: (operands, domain,
        dims), or None. Each output reduces the same elements,
        in another order (as between any two reduction kernels); the kept axes keep their
        order, so the output is laid out as before. Read through strides, every element's
        address takes a division per axis: such reductions ran four times slower than the
        bytes they move (H200)."""
        identity = list(range(len(domain)))
        order = None
        for c, o in zip(leaves, inputs, strict=True):
            if o.indexing == "scalar":
                continue
            axes = identity  # packed or broadcast operands are read in the domain's order
            if o.indexing == "strided":
                st = self.strides(c)
                if st is None or len(st) != len(domain):
                    return None
                # its axes by decreasing stride (size-1 axes where they stand): packed?
                axes = sorted(identity, key=lambda a: (-st[a] if domain[a] > 1 else 0, a))
                if packed_strides(tuple(domain[a] for a in axes)) != tuple(st[a] for a in axes):
                    return None
            if order not in (None, axes):
                return None
            order = axes
        if order is None or all(o.indexing != "strided" for o in inputs):
            return None
        if order == identity:  # packed already (a reshape's copy): read without strides
            same = [replace(o, indexing="same") if o.indexing == "strided" else o for o in inputs]
            return same, domain, dims
        if any(o.indexing not in ("strided", "scalar") for o in inputs):
            return None  # a broadcast operand's index would not follow the new order
        if tuple(dims) == (len(domain) - 1,):
            return None  # a last-axis reduction may join a rows kernel (fuse_rows) as it is
        new_dims = tuple(sorted(order.index(d) for d in dims))
        kept = [order.index(a) for a in range(len(domain)) if a not in dims]
        if kept != sorted(kept) or new_dims != tuple(range(new_dims[0], new_dims[-1] + 1)):
            return None
        new_domain = tuple(domain[a] for a in order)
        ops = []
        for o in inputs:
            if o.indexing == "scalar":
                ops.append(o)
                continue
            key = ("in-order", o.value, tuple(order))
            name = self.done_extra.get(key)
            if name is None:
                name = self._view_step(o.value, "Permute", (tuple(order),), o.dtype, new_domain)
                self.done_extra[key] = name
            ops.append(Operand(name, o.dtype, new_domain, "same"))
        return ops, new_domain, new_dims

    def _adjacent_axes(self, inputs: list[Operand], dims, domain):
        """A reduction over axes that are not adjacent (``x.sum((0, 2))``), which the
        emitters take as one run of axes: the operands are read through views of the
        domain permuted to the kept axes (in order) followed by the reduced ones: a
        broadcast operand expanded to the domain first (stride 0), then each permuted.
        (operands, domain, dims), or None where the axes are adjacent. Each output
        reduces the same elements (in another order, as between any two reduction
        kernels); the kept axes keep their order, so the output is laid out as before."""
        if not dims or tuple(dims) == tuple(range(dims[0], dims[-1] + 1)):
            return None
        rank = len(domain)
        order = (*(a for a in range(rank) if a not in dims), *dims)
        new_domain = tuple(domain[a] for a in order)
        ops = []
        for o in inputs:
            if o.indexing == "scalar":
                ops.append(o)
                continue
            key = ("apart", o.value, order)
            name = self.done_extra.get(key)
            if name is None:
                name = o.value
                if tuple(o.shape) != tuple(domain):  # broadcast: expanded (a view) first
                    padded = (1,) * (rank - len(o.shape)) + tuple(o.shape)
                    if len(o.shape) != rank:
                        name = self._view_step(name, "View", (padded,), o.dtype, padded)
                    name = self._view_step(name, "Expand", (tuple(domain),), o.dtype, domain)
                name = self._view_step(name, "Permute", (order,), o.dtype, new_domain)
                self.done_extra[key] = name
            ops.append(Operand(name, o.dtype, new_domain, "strided"))
        return ops, new_domain, tuple(range(rank - len(dims), rank))

    def _view_step(self, src: str, op: str, attrs: tuple, dtype: str, shape) -> str:
        return self.emit(
            # named by position: two reductions may view one operand in different orders
            Step(
                "view",
                f"{src}_{op.lower()}{len(self.steps)}",
                op,
                (src,),
                attrs,
                dtype,
                tuple(shape),
                DEVICE,
            )
        )

    def _nobias(self, cid: int) -> bool:
        return any(e.op == "NoBias" for e in self.view.classes[cid])

    def _inline_cut(self, cid: int, depth: int, reads: Collection[int]) -> int | None:
        """The loop an ``Inline`` at ``depth``, in a body that reads ``reads`` so far,
        reads instead of recomputing. Extraction pays a shared producer once however many
        bodies recompute it, so without a cut a residual stream (ResNet's adds, a
        transformer's) is inlined into every later block's kernel, each re-reading every
        earlier block's tensors. So a body reads the loop's output (the same values) where
        the loop is written to memory anyway and recomputing it would read at least as
        many bytes the body does not read otherwise (a broadcast operand is read at its
        own size; reading saves the arithmetic too);
        and, whatever the loop, where the body is MAX_BODY_DEPTH deep (bounded Python
        stacks here and in the code generators, bodies Numba compiles in reasonable time)
        or reads MAX_FUSED_READS tensors already and the loop has an extracted choice."""
        loop = self._loop_of(cid)
        if loop is None or loop not in self.best:
            return None
        if depth >= MAX_BODY_DEPTH or len(reads) >= MAX_FUSED_READS:
            return loop
        if self.materialized is not None and loop in self.materialized:
            new = self._leaves(self.best[cid].enode.kids[0], RECOMPUTE_WALK) - self._body
            if -1 in new or sum(self._nbytes(c) for c in new) >= self._nbytes(loop):
                return loop
        return None

    def _nbytes(self, cid: int) -> int:
        dtype, shape = self.types[cid]
        return math.prod(shape) * ot.ITEMSIZE[dtype]

    def _loop_of(self, cid: int) -> int | None:
        """The loop whose output an ``Inline`` class holds (its ``Ld`` twin's loop)."""
        return next((t.kids[0] for t in self.view.classes[cid] if t.op == "Ld"), None)

    def _leaves(self, root: int, limit: int | None = None) -> set[int]:
        """What a body (or an inlined part of one) reads with every ``Inline`` of a loop
        written to memory anyway read from there: its ``Ld`` operands and those loops.
        Past ``limit`` nodes, a set no body holds (-1: "reads more than it can show")."""
        out: set[int] = set()
        stack, seen = [root], set()
        while stack:
            c = stack.pop()
            if c in seen:
                continue
            seen.add(c)
            if limit is not None and len(seen) > limit:
                return {-1}
            e = self.best[c].enode
            if e.op == "Ld":
                if self._broadcast_scalar(e.kids[0]) is None:
                    out.add(e.kids[0])
            elif e.op == "Inline":
                loop = self._loop_of(c)
                if self.materialized and loop in self.materialized:
                    out.add(loop)
                else:
                    stack.append(e.kids[0])
            elif e.op != "ESc":
                stack += e.kids
        return out

    def _body_reads(self, root: int) -> set[int]:
        """What the body at ``root`` reads, every recomputable loop written to memory
        anyway read from there (``_inline_cut`` recomputes one only if its own reads are
        among these)."""
        return self._leaves(root) if self.materialized else set()

    def _leaf_reads(self, t: int) -> list[int]:
        """What reading loop operand ``t`` lowers first (see ``_operand``)."""
        if self._broadcast_scalar(t) is not None:
            return []
        choice = self.best.get(t)
        return [choice.enode.kids[0]] if choice and choice.enode.op == "Expand" else [t]

    def deps(self, cid: int) -> list[int]:
        """The classes ``value(cid)`` lowers before its own step: what ``lower`` and
        ``kernel`` read, walked without recursion. ``lower`` (the function) lowers them in
        post-order first, so no ``value`` call nests another."""
        en = self.best[cid].enode
        op = en.op
        if op in ("Input", "Param") or op in ot.CONSTANTS:
            return []
        if op == "ToDev" and self._constant(en.kids[0]):
            return []
        if op in ("Loop", "Reduce"):
            out: list[int] = []
            read: set[int] = set()  # ``expr``'s leaves, in the same (pre-)order
            self._body = self._body_reads(en.kids[0])
            stack = [(en.kids[0], 0)]
            while stack:
                c, depth = stack.pop()
                e = self.best[c].enode
                if e.op == "Ld":
                    out += self._leaf_reads(e.kids[0])
                    if self._broadcast_scalar(e.kids[0]) is None:
                        read.add(e.kids[0])
                elif e.op == "Inline":
                    cut = self._inline_cut(c, depth, read)
                    if cut is not None:
                        out += self._leaf_reads(cut)
                        if self._broadcast_scalar(cut) is None:
                            read.add(cut)
                    else:
                        stack.append((e.kids[0], depth + 1))
                elif e.op != "ESc":  # kids in order, as ``expr`` reads them
                    stack += [(k, depth + 1) for k in reversed(e.kids)]
            return out
        if op in ("Opaque", "Custom"):
            return self.tlist(en.kids[0])
        return [k for k in en.kids if k in self.best and not self._nobias(k)]

    def expr(self, cid: int, leaves: list[int], covers: list[str], depth: int = 0) -> Expr:
        en = self.best[cid].enode
        if en.op == "Inline":
            cut = self._inline_cut(cid, depth, leaves)
            if cut is not None:  # read the loop's output: a leaf, like an Ld
                if self._broadcast_scalar(cut) is None:
                    if cut not in leaves:
                        leaves.append(cut)
                    return ("in", leaves.index(cut))
        if en.op == "Ld":
            t = en.kids[0]
            c = self._broadcast_scalar(t)
            if c is not None:  # every element is the constant: no operand to read
                return ("const", *c)
            if t not in leaves:
                leaves.append(t)
            return ("in", leaves.index(t))
        if en.op == "Inline":
            for twin in self.view.classes[cid]:  # the loop this body was inlined from
                if twin.op == "Ld":
                    covers += [n for n in self.host_twin_names(twin.kids[0]) if n not in covers]
            return self.expr(en.kids[0], leaves, covers, depth + 1)
        if en.op == "ESc":
            return ("const", en.attrs[0], en.attrs[1])
        if en.op == "ECast":
            return ("cast", self.expr(en.kids[0], leaves, covers, depth + 1), en.attrs[0])
        name = en.op[1:].lower()
        return (name, *[self.expr(k, leaves, covers, depth + 1) for k in en.kids])


def lower(
    graph: Graph,
    view: EGraphView,
    best: dict[int, Choice],
    types: dict[int, Type],
    place: dict[int, str],
    roots: list[int],
    io_on_device: bool = False,
) -> Program:
    low = _Lowering(graph, view, best, types, place, io_on_device, {})
    for name in graph.nodes:
        if graph.nodes[name].op in ("Input", "Param"):
            low.value(view.named[name])
    # each value's operands before it, so no value() call nests another; a constant root
    # the caller wants on the device is made there (below), not lowered on the host
    wanted = [
        r
        for r in roots
        if not (io_on_device and place.get(r) == "host" and not low._leaf(r) and low._constant(r))
    ]
    low.materialized = _written(low, wanted)
    for c in _post_order(low, wanted):
        low.value(c)
    outputs = []
    for r in roots:
        # the caller expects device outputs; an input returned as an output already is one
        if io_on_device and place.get(r) == "host" and not low._leaf(r):
            key = ("to-dev-out", r)
            if key not in low.done_extra:
                dtype, shape = types[r]
                if low._constant(r):
                    low.done_extra[key] = low.device_constant(r, f"o{r}", dtype, shape)
                else:
                    low.done_extra[key] = low.emit(
                        Step(
                            "crossing",
                            f"o{r}",
                            "ToDev",
                            (low.value(r),),
                            dtype=dtype,
                            shape=shape,
                            place=DEVICE,
                        )
                    )
            outputs.append(low.done_extra[key])
            continue
        outputs.append(low.value(r))
    inputs = {n.name: low.done[view.named[n.name]] for n in graph.inputs()}
    prog = renumber(fuse_reduce_epilogues(Program(low.steps, outputs, inputs)))
    validate(prog)
    return prog


def _written(low: _Lowering, roots: list[int]) -> set[int]:
    """The loops the extracted program writes to memory whatever bodies recompute: those
    the roots need from outside any body (an output, a library or host op's operand, an
    ``Ld`` of a body), with every ``Inline`` recomputed. One walk, each class visited at
    most once outside and once inside bodies (what a class reaches does not depend on
    the body it is reached from)."""
    top: set[int] = set()
    inside: set[int] = set()
    stack = [(r, False) for r in roots if r in low.best]
    while stack:
        c, in_body = stack.pop()
        seen = inside if in_body else top
        if c in seen or c not in low.best:
            continue
        seen.add(c)
        en = low.best[c].enode
        if not in_body:
            if en.op in ("Loop", "Reduce"):
                stack.append((en.kids[0], True))
            elif not (en.op in ("Input", "Param") or en.op in ot.CONSTANTS):
                stack += [(k, False) for k in low.deps(c)]
        elif en.op == "Ld":
            stack += [(t, False) for t in low._leaf_reads(en.kids[0])]
        elif en.op == "Inline":
            stack.append((en.kids[0], True))
        elif en.op != "ESc":
            stack += [(k, True) for k in en.kids]
    return {c for c in top if low.best[c].enode.op == "Loop"}


def _post_order(low: _Lowering, roots: list[int]) -> list[int]:
    """Classes the roots need, each after what it reads (an explicit stack: graphs are
    thousands of values deep). A cycle is left for ``value`` to report."""
    order: list[int] = []
    state: dict[int, int] = {}  # 1 = open, 2 = done
    for r in roots:
        if r in state or r not in low.best:
            continue
        stack = [(r, iter(low.deps(r)))]
        state[r] = 1
        while stack:
            c, kids = stack[-1]
            k = next(kids, None)
            if k is None:
                stack.pop()
                state[c] = 2
                order.append(c)
            elif k not in state and k in low.best:
                state[k] = 1
                stack.append((k, iter(low.deps(k))))
    return order


def leaves(e: Expr) -> set:
    """The operand and stage leaves of a body."""
    if e[0] in ("in", "stage", "const"):
        return set() if e[0] == "const" else {e}
    return set().union(*(leaves(c) for c in e[1:] if isinstance(c, tuple)))


def fuse_reduce_epilogues(prog: Program) -> Program:
    """Fold a loop that reads only a reduction's result (at the same index) into that
    reduction, as its epilogue: one launch and one round trip through memory fewer. Exact:
    the same scalar operations run on the same values. Applied after extraction, where the
    program is final; it declines when the reduced value is read anywhere else."""
    users: dict[str, int] = {}
    for s in prog.steps:
        for v in s.args:  # a kernel step's args are its operands
            users[v] = users.get(v, 0) + 1
    for v in prog.outputs:
        users[v] = users.get(v, 0) + 1
    by_output = {s.output: s for s in prog.steps}
    steps = []
    for s in prog.steps:
        k = s.kernel
        if (
            k is not None
            and k.kind == "loop"
            and len(k.inputs) == 1
            and k.inputs[0].indexing == "same"
            and leaves(k.body) == {("in", 0)}
        ):
            src = by_output.get(k.inputs[0].value)
            r = src.kernel if src is not None else None
            if (
                r is not None
                and r.kind == "reduce"
                and r.epilogue is None
                and users.get(src.output, 0) == 1
                and tuple(r.shape) == tuple(k.shape)
            ):
                r.epilogue = k.body
                r.attrs["acc_dtype"] = r.dtype
                r.dtype = src.dtype = k.dtype
                r.covers += k.covers
                r.fused += k.fused
                src.covers = r.covers
                # the reduction now writes the loop's value, under the loop's name
                r.output = src.output = s.output
                continue
        steps.append(s)
    return Program(steps, prog.outputs, prog.inputs)


MAX_CONCAT = 32  # pieces one concatenation kernel copies (its parameters stay small)


ROWS_MAX = 4096  # rows kernels re-read a row per stage from cache: rows no longer than this
ROW_FLOATS = ("f32", "f64")  # the stages rows kernels take (softmax's, the norms')


TAKE_TABLES = (*ROW_FLOATS, *ot.HALVES)  # a fused take's tables: halves read into f32


def renumber(prog: Program) -> Program:
    """Name values v0, v1, ... in definition order, so printed programs are stable."""
    new = {s.output: f"v{i}" for i, s in enumerate(prog.steps)}
    for s in prog.steps:
        s.output = new[s.output]
        s.args = tuple(new[a] for a in s.args)
        if s.kernel is not None:
            s.kernel.output = s.output
            for o in s.kernel.inputs:
                o.value = new[o.value]
    return Program(
        prog.steps, [new[o] for o in prog.outputs], {k: new[v] for k, v in prog.inputs.items()}
    )


def validate(prog: Program) -> None:
    defined: set[str] = set()
    for s in prog.steps:
        uses = list(s.args)
        if s.kernel is not None:
            uses += [o.value for o in s.kernel.inputs]
            for o in s.kernel.inputs:
                if not o.dtype:
                    raise ValidationError(f"lower: kernel {s.output} operand {o.value} untyped")
        for u in uses:
            if u not in defined:
                raise ValidationError(f"lower: {s.output} uses {u} before it is defined")
        if s.output in defined:
            raise ValidationError(f"lower: {s.output} defined twice")
        if s.kind != "const" and not s.dtype:
            raise ValidationError(f"lower: {s.output} has no type")
        defined.add(s.output)
    for o in prog.outputs:
        if o not in defined:
            raise ValidationError(f"lower: output {o} is never defined")


def elementwise_ops() -> dict[str, ot.Op]:
    """Body node name (lower-case op) -> op-table row, for emitters and evaluators."""
    return {o.name.lower(): o for o in ot.elementwise()}
