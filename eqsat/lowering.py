"""Lowering: the extracted choice becomes a ``Program`` (``eqsat/program.py``). Classes are
visited in post-order with an explicit stack (nothing recurses over producers); each becomes
a host step, a crossing, a view or a kernel (``eqsat/kernel_bodies.py`` builds a kernel's
description), reductions get their elementwise epilogues, and the program is validated.
"""

from __future__ import annotations

from . import optable as ot
from .egraph import EGraphView, ENode
from .errors import ValidationError
from .extract import DEVICE, KERNELS, MOVEMENT, Choice, Type
from .graph import Graph
from .kernel_bodies import KernelBodies
from .kinds import Kind
from .program import (
    Program,
    Step,
    StepKind,
    leaves,
    renumber,
    validate,
)


class _Lowering(KernelBodies):
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
                    StepKind.INPUT,
                    out,
                    en.attrs[0],
                    dtype=dtype,
                    shape=shape,
                    place=DEVICE if self.io_on_device else "host",
                )
            )
        if en.op in ot.CONSTANTS:
            return self.emit(
                Step(StepKind.CONST, out, en.op, attrs=en.attrs, dtype=dtype, shape=shape)
            )
        if en.op == "ToDev" and self._constant(en.kids[0]):
            return self.device_constant(en.kids[0], out, dtype, shape)
        if en.op in ("ToDev", "ToHost"):
            src = self.value(en.kids[0])
            if self.io_on_device and en.op == "ToDev" and self._leaf(en.kids[0]):
                return src  # inputs already live on the device
            return self.emit(
                Step(
                    StepKind.CROSSING,
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
                    StepKind.VIEW,
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
                    StepKind.KERNEL,
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
            return self.emit(
                Step(StepKind.HOST, out, en.attrs[0], args, (), dtype, shape, covers=covers)
            )
        if en.op == "Item":
            return self.emit(
                Step(
                    StepKind.HOST,
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
        return self.emit(
            Step(StepKind.HOST, out, en.op, args, en.attrs, dtype, shape, covers=covers)
        )

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
                    StepKind.CROSSING,
                    f"h{cid}",
                    "ToHost",
                    (name,),
                    dtype=dtype,
                    shape=shape,
                    place="host",
                )
            )
        return self.done_extra[key]

    def _leaf(self, cid: int) -> bool:
        return any(e.op in ("Input", "Param") for e in self.view.classes[cid])

    def device_constant(self, cid: int, out: str, dtype: str, shape: tuple) -> str:
        """Constant class ``cid`` made on the device once, not copied there on every call."""
        kid = self.best[cid].enode
        return self.emit(
            Step(
                StepKind.CONST, out, kid.op, attrs=kid.attrs, dtype=dtype, shape=shape, place=DEVICE
            )
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
                            StepKind.CROSSING,
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
            and k.kind == Kind.LOOP
            and len(k.inputs) == 1
            and k.inputs[0].indexing == "same"
            and leaves(k.body) == {("in", 0)}
        ):
            src = by_output.get(k.inputs[0].value)
            r = src.kernel if src is not None else None
            if (
                r is not None
                and r.kind == Kind.REDUCE
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
