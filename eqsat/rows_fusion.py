"""Rows kernels formed on a lowered GPU program (``fuse_rows``): a loop and the last-axis
reductions it reads per row become one kernel, which also writes the per-row values other
steps read (a training layer norm's mean and reciprocal deviation, kept for the backward)
as row statistics (``kinds/row_stat.py``)."""

from __future__ import annotations

import math

from .kernel_fusion import _remap, _users
from .kinds import Kind
from .program import (
    ROW_FLOATS,
    ROWS_MAX,
    Expr,
    Kernel,
    Operand,
    Program,
    Stage,
    Step,
    StepKind,
    moved,
)


def _row_stage(s: Step | None, domain: tuple[int, ...]) -> bool:
    """Whether ``s`` is a reduction a rows kernel over ``domain`` can compute: along the
    last axis only, kept as a size-1 axis, float accumulation."""
    k = s.kernel if s is not None else None
    return (
        k is not None
        and k.kind == Kind.REDUCE
        and tuple(k.domain) == domain
        and list(k.attrs["dims"]) == [len(domain) - 1]
        and k.attrs["keepdim"] == 1
        and k.attrs.get("acc_dtype", k.dtype) in ROW_FLOATS
        and k.dtype in ROW_FLOATS
    )


def _per_row_loop(s: Step | None, group: set[str], domain: tuple[int, ...]) -> bool:
    """Whether ``s`` is a loop over one value per row that reads only the reductions of
    ``group`` (a layer norm's reciprocal deviation from its variance): the rows kernel can
    compute it from its stages and write it as a statistic."""
    k = s.kernel if s is not None else None
    rows = (*domain[:-1], 1)
    return (
        k is not None
        and k.kind == Kind.LOOP
        and tuple(k.domain) == rows
        and tuple(k.shape) == rows
        and bool(k.inputs)
        and all(o.value in group and tuple(o.shape) == rows for o in k.inputs)
    )


def _stat_step(rows: Step, j: int, was: Step) -> Step:
    """The step of statistic ``j`` of rows step ``rows``, standing for step ``was`` (named
    as its value, covering its graph nodes)."""
    k = Kernel(
        Kind.ROW_STAT,
        was.output,
        was.dtype,
        tuple(was.shape),
        [Operand(rows.output, rows.dtype, tuple(rows.shape), "same")],
        attrs={"stat": j},
        covers=list(was.kernel.covers),
    )
    return Step(
        StepKind.KERNEL,
        was.output,
        Kind.ROW_STAT,
        (rows.output,),
        dtype=was.dtype,
        shape=tuple(was.shape),
        place=was.place,
        kernel=k,
        covers=k.covers,
    )


def _rows_step(
    s: Step, order: list[Step], written: list[Step], loops: list[Step]
) -> tuple[Step, list[Step]]:
    """The rows kernel computing loop step ``s`` with the reductions ``order`` as stages,
    writing those of ``written`` and the per-row ``loops`` as statistics; and the
    statistics' steps."""
    k = s.kernel
    stage_of = {st.output: j for j, st in enumerate(order)}
    operands: list[Operand] = []
    slot: dict[str, int] = {}

    def table(kern: Kernel) -> dict[int, Expr]:
        t = {}
        for i, o in enumerate(kern.inputs):
            if o.value in stage_of:
                t[i] = ("stage", stage_of[o.value])
                continue
            if o.value not in slot:
                slot[o.value] = len(operands)
                operands.append(Operand(o.value, o.dtype, o.shape, o.indexing))
            t[i] = ("in", slot[o.value])
        return t

    stages, inside = [], list(k.fused)
    kept = {w.output for w in written}
    for st in order:
        r = st.kernel
        acc = r.attrs.get("acc_dtype", r.dtype)
        stages.append(Stage(r.attrs["reduce"], _remap(r.body, table(r)), r.epilogue, acc, r.dtype))
        inside += r.fused if st.output in kept else r.covers + r.fused
    stats = [(("stage", stage_of[w.output]), w.dtype) for w in written]
    stats += [(_remap(p.kernel.body, table(p.kernel)), p.dtype) for p in loops]
    inside += [n for p in loops for n in p.kernel.fused]
    body = _remap(k.body, table(k))
    rows = Kernel(
        Kind.ROWS,
        s.output,
        k.dtype,
        k.shape,
        operands,
        body,
        k.domain,
        {"stats": tuple(stats)} if stats else {},  # the stages reduce the domain's last axis
        list(k.covers),
        inside,
        stages=stages,
    )
    args = tuple(o.value for o in operands)
    step = Step(
        StepKind.KERNEL,
        s.output,
        Kind.ROWS,
        args,
        dtype=s.dtype,
        shape=s.shape,
        place=s.place,
        kernel=rows,
        covers=rows.covers,
    )
    return step, [_stat_step(step, j, w) for j, w in enumerate([*written, *loops])]


def fuse_rows(prog: Program) -> Program:
    """Merge a loop with the last-axis reductions it reads per row (softmax's max and sum,
    layer norm's mean and variance) into one ``rows`` kernel: a warp or a block takes a row,
    computes the reductions in order and then the loop's body, so the row is read from memory once
    and the reduced values never are. Exact: each reduction runs the same scalar body over
    the same elements and combines them in one of the orders a reduction kernel may use;
    the loop then reads those values. A reduction that is an output, or that steps outside
    the group read, is written by the rows kernel as a statistic (``kinds/row_stat.py``),
    as are loops over one value per row reading only the group's reductions (a layer norm's
    reciprocal deviation, computed from the stage by the same scalar expression the loop
    runs on the value it would read). The rows kernel runs as early as its operands allow
    (right after the last of them, not where the loop was), and a statistic is ready
    after it: a reduction stays out of the group when a step before that point reads it.
    Special values take the same path as in separate kernels (max and min propagate NaN;
    sums of infinities give what the same additions give). Float stages only: integer
    reductions keep their own kernels, which widen as PyTorch does. GPU programs only (the
    CPU emitter has no rows kernel)."""
    users = _users(prog)
    outputs = set(prog.outputs)
    by_output = {s.output: s for s in prog.steps}
    # where each value is ready: its step's position, or for a rows kernel and its
    # statistics, half past the last of its operands (it runs as early as they allow)
    placed: dict[str, float] = {s.output: i for i, s in enumerate(prog.steps)}
    gone: set[str] = set()
    fused: set[str] = set()
    anchored: dict[int, list[Step]] = {}  # position -> rows steps and statistics after it
    for s in prog.steps:
        k = s.kernel
        if k is None or k.kind != Kind.LOOP or not k.domain or k.domain[-1] > ROWS_MAX:
            continue
        if s.output in gone:  # a per-row loop an earlier rows kernel writes
            continue
        dom = tuple(k.domain)
        group: set[str] = set()
        todo = [o.value for o in k.inputs if o.indexing == "leading"]
        while todo:
            v = todo.pop()
            r = by_output.get(v)
            if v in group or v in gone or not _row_stage(r, dom):
                continue
            group.add(v)
            todo += [o.value for o in r.kernel.inputs if o.indexing == "leading"]
        if not group:  # no row reduction to compute (an input-free loop reads nothing)
            continue
        loops: set[str] = set()
        at = 0.0
        changed = True
        while changed:  # drop reductions read before the rows kernel could run
            changed = False
            reads = {o.value for r in (s, *(by_output[v] for v in group)) for o in r.kernel.inputs}
            # (reading nothing but what it computes, input-free: just before the loop)
            at = max((placed[v] for v in reads - group), default=placed[s.output] - 1)

            def later(v: str, inside: set[str], at: float = at) -> bool:  # read after it only
                return all(placed[u] > at for u in users.get(v, set()) - inside)

            loops = {
                u
                for v in group
                for u in users.get(v, set())
                if u not in gone and _per_row_loop(by_output[u], group, dom) and later(u, set())
            }
            inside = group | loops | {s.output}
            for v in sorted(group):
                if not later(v, inside):
                    group.discard(v)
                    changed = True
        if not group:
            continue
        inside = group | loops | {s.output}
        order = [by_output[v] for v in sorted(group, key=placed.__getitem__)]
        written = [r for r in order if r.output in outputs or users.get(r.output, set()) - inside]
        per_row = [by_output[u] for u in sorted(loops, key=placed.__getitem__)]
        rows, stats = _rows_step(s, order, written, per_row)
        anchored.setdefault(math.floor(at), []).extend([rows, *stats])
        for v in (s.output, *group, *loops):  # what it computes runs there (or is gone)
            placed[v] = math.floor(at) + 0.5
        fused.add(s.output)
        gone |= group | loops
    if not fused:
        return prog
    return moved(prog, gone | fused, anchored)
