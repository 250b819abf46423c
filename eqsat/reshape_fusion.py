"""Loops fused through a reshape, on a lowered GPU program.

A loop over a finer grid than its reader's, read through a reshape (a ``View`` step that
splits the reader's axes: ``[.., 2, d/2]`` read as ``[.., d]``), is computed inside the
reader, the reader running over the finer grid. Rotary embeddings make this shape:
``rotate_half(x) = cat(-x2, x1)`` selects on a ``[.., 2, d/2]`` grid, and the
``q * cos + rotate_half(q) * sin`` that reads it runs over ``[.., d]``; kept apart they are
two kernels per query and per key in every layer, the rotated copy written and read back.

The reader's grid is refined instead: splitting an axis keeps the flat order of every
packed value, so the reader's own output, the producer's output and every operand read
whole ("same") are the same memory read the same way; a broadcast or strided operand is
read through a view split the same way (splitting an axis is always a view, whatever its
stride). The reader's output is then a ``View`` back to its own shape, under its own name.

Exact: the producer's body is the scalar expression its kernel stored, computed in the
same types. A float32 or float64 producer stores what its body computes; a narrower one is
taken only where its body's value already has the stored type (it ends in the rounding to
it, or only selects values of that type: a where, a negation), so storing it rounds
nothing. A producer read by several loops is inlined into each only where its body only
selects (no arithmetic to repeat). GPU programs, after the rows passes (a rows kernel's
last axis is its row: a loop with per-row operands is left alone).
"""

from __future__ import annotations

from .grids import refinement, split_shape
from .kernel_fusion import Operands, _remap, _users, stores_its_value
from .kinds import Kind
from .program import (
    Expr,
    Kernel,
    Operand,
    Program,
    Step,
    StepKind,
    indexing,
    renumber,
    validate,
)

_SELECT = frozenset({"where", "neg", "eq", "ne", "lt", "le", "gt", "ge", "and", "or", "not"})


def _selects_only(e: Expr) -> bool:
    stack = [e]
    while stack:
        x = stack.pop()
        if x[0] in ("in", "const"):
            continue
        if x[0] == "cast":
            stack.append(x[1])
        elif x[0] in _SELECT:
            stack += list(x[1:])
        else:
            return False
    return True


def _producer(v: str, by_output: dict, users: dict, outputs: set) -> Step | None:
    """The loop step behind reshape step ``v`` that a reader may compute inside itself."""
    view = by_output.get(v)
    if view is None or view.kind != StepKind.VIEW or view.op != "View" or v in outputs:
        return None
    p = by_output.get(view.args[0])
    k = p.kernel if p is not None else None
    if (
        k is None
        or k.kind != Kind.LOOP
        or p.output in outputs
        or users.get(p.output) != {v}
        or tuple(k.shape) != tuple(k.domain)
        or not stores_its_value(k)
    ):
        return None
    readers = users.get(v, set())
    if len(readers) > 1 and not _selects_only(k.body):
        return None
    return p


def inline_through_reshapes(prog: Program) -> Program:
    """Compute each loop read through a splitting reshape inside its loop readers (module
    docstring)."""
    users = _users(prog)
    outputs = set(prog.outputs)
    by_output = {s.output: s for s in prog.steps}
    taken: dict[str, set[str]] = {}  # reshape step -> readers that inlined its producer
    plans: dict[str, tuple[Step, int, Step]] = {}  # reader -> (producer, operand, reshape)
    for s in prog.steps:
        k = s.kernel
        if k is None or k.kind != Kind.LOOP or tuple(k.shape) != tuple(k.domain):
            continue
        if any(o.indexing == "leading" for o in k.inputs):
            continue  # a candidate for a rows kernel's per-row operands: its grid stays
        for i, o in enumerate(k.inputs):
            if o.indexing != "same" or sum(x.value == o.value for x in k.inputs) > 1:
                continue
            p = _producer(o.value, by_output, users, outputs)
            if p is None or refinement(tuple(p.kernel.domain), tuple(k.domain)) is None:
                continue
            plans[s.output] = (p, i, by_output[o.value])
            taken.setdefault(o.value, set()).add(s.output)
            break
    # a reshape is gone only when every reader inlined it; otherwise keep its producer
    whole = {v for v, rs in taken.items() if rs == users.get(v, set())}
    plans = {r: pl for r, pl in plans.items() if pl[2].output in whole}
    if not plans:
        return prog
    gone = {pl[2].output for pl in plans.values()} | {pl[0].output for pl in plans.values()}
    steps: list[Step] = []
    for s in prog.steps:
        if s.output in gone:
            continue
        if s.output in plans:
            steps += _refined(s, *plans[s.output])
        else:
            steps.append(s)
    out = renumber(Program(steps, prog.outputs, prog.inputs))
    validate(out)
    return out


def _refined(s: Step, p: Step, slot: int, reshape: Step) -> list[Step]:
    """Reader ``s`` over producer ``p``'s grid with ``p``'s body in place of operand
    ``slot``: the operand views it needs, the kernel, and the reshape back to its shape."""
    k, pk = s.kernel, p.kernel
    dom, fine = tuple(k.domain), tuple(pk.domain)
    groups = refinement(fine, dom)
    new: list[Step] = []
    operands = Operands()
    add = operands.add

    def view(src: str, op: str, attrs: tuple, dtype: str, shape) -> str:
        name = f"{s.output}_{op.lower()}{len(new)}"
        new.append(Step(StepKind.VIEW, name, op, (src,), attrs, dtype, tuple(shape), s.place))
        return name

    table: dict[int, Expr] = {}
    for i, o in enumerate(k.inputs):
        if i == slot:
            table[i] = _remap(pk.body, {j: add(po) for j, po in enumerate(pk.inputs)})
        elif o.indexing == "scalar":
            table[i] = add(o)
        elif o.indexing == "same":  # packed over the reader's grid: the same memory, split
            table[i] = add(
                Operand(view(o.value, "View", (fine,), o.dtype, fine), o.dtype, fine, "same")
            )
        else:
            shape = split_shape(tuple(o.shape), dom, groups)
            name = o.value
            if shape != tuple(o.shape):
                name = view(name, "View", (shape,), o.dtype, shape)
            how = indexing(shape, fine)
            if o.indexing == "strided" or how == "strided":
                if shape != fine:  # a strided read covers the grid: broadcast by a view
                    name = view(name, "Expand", (fine,), o.dtype, fine)
                    shape = fine
                how = "strided"
            table[i] = add(Operand(name, o.dtype, shape, how))
    kernel = Kernel(
        Kind.LOOP,
        f"{s.output}_fine",
        k.dtype,
        fine,
        operands.list,
        _remap(k.body, table),
        fine,
        dict(k.attrs),
        k.covers,
        [*k.fused, *pk.covers, *pk.fused, *reshape.covers],
    )
    run = Step(
        StepKind.KERNEL,
        kernel.output,
        s.op,
        tuple(o.value for o in operands.list),
        s.attrs,
        k.dtype,
        fine,
        s.place,
        kernel,
        s.covers,
    )
    back = Step(
        StepKind.VIEW,
        s.output,
        "View",
        (run.output,),
        (tuple(s.shape),),
        s.dtype,
        tuple(s.shape),
        s.place,
    )
    return [*new, run, back]
