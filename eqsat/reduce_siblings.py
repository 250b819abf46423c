"""Sibling reductions in one kernel (``merge_siblings``): reductions of a lowered GPU
program over the same domain, axes and kind that read a common operand are computed by one
reduce kernel, each in an accumulator of its own, so the operand is read once. A batch
norm's backward sums the output gradient and its product with the normalized input over
the same axes; a layer norm's backward sums both over the rows for its weight and bias.
The first is the kernel's output; each other is written beside it, as a statistic
(``kinds/row_stat.py``), whose step keeps its value's name."""

from __future__ import annotations

from .extract import DEVICE
from .kernel_fusion import _remap, _users
from .kinds import Kind
from .program import Expr, Kernel, Operand, Program, Step, StepKind, renumber, validate
from .rows_fusion import _stat_step

SIBLINGS_MAX = 4  # reductions one kernel accumulates (registers and shared memory each)
OPERANDS_MAX = 12  # operands of the merged kernel


def _mergeable(s: Step) -> bool:
    k = s.kernel
    return (
        k is not None
        and k.kind == Kind.REDUCE
        and s.place == DEVICE
        and "stats" not in k.attrs
        and k.body is not None
    )


def _key(k: Kernel) -> tuple:
    """What siblings share: all but the body and the operands (the same accumulator, grid
    and epilogue, so each is reduced in the order it would be alone)."""
    attrs = tuple(sorted((a, repr(v)) for a, v in k.attrs.items()))
    return (tuple(k.domain), k.dtype, tuple(k.shape), attrs, k.epilogue)


def _reads(k: Kernel) -> set[tuple]:
    return {(o.value, o.dtype, tuple(o.shape), o.indexing) for o in k.inputs}


class _Group:
    """Reductions to merge, emitted at position ``at`` of the program."""

    def __init__(self, s: Step, at: int) -> None:
        self.members, self.at = [s], at
        self.reads = _reads(s.kernel)


def _merged(members: list[Step]) -> tuple[Step, list[Step]]:
    """The reduce step computing ``members`` (the first as its output, the others as its
    statistics, in order) and the statistics' steps."""
    operands: list[Operand] = []
    slot: dict[tuple, int] = {}

    def table(k: Kernel) -> dict[int, Expr]:
        t = {}
        for i, o in enumerate(k.inputs):
            key = (o.value, o.dtype, tuple(o.shape), o.indexing)
            if key not in slot:
                slot[key] = len(operands)
                operands.append(Operand(o.value, o.dtype, tuple(o.shape), o.indexing))
            t[i] = ("in", slot[key])
        return t

    lead = members[0]
    k = lead.kernel
    body = _remap(k.body, table(k))
    stats = tuple((_remap(m.kernel.body, table(m.kernel)), m.dtype) for m in members[1:])
    kernel = Kernel(
        Kind.REDUCE,
        lead.output,
        k.dtype,
        tuple(k.shape),
        operands,
        body,
        tuple(k.domain),
        {**k.attrs, "stats": stats},
        list(k.covers),
        [n for m in members for n in m.kernel.fused],
        epilogue=k.epilogue,
    )
    step = Step(
        StepKind.KERNEL,
        lead.output,
        Kind.REDUCE,
        tuple(o.value for o in operands),
        dtype=lead.dtype,
        shape=tuple(lead.shape),
        place=lead.place,
        kernel=kernel,
        covers=kernel.covers,
    )
    return step, [_stat_step(step, j, m) for j, m in enumerate(members[1:])]


def merge_siblings(prog: Program) -> Program:
    """Merge reductions that read a common operand over the same domain, axes, kind,
    accumulator and epilogue into one reduce kernel (up to ``SIBLINGS_MAX``). Exact: each
    keeps its own accumulator, folded over the same elements in the same order by the
    same grid (threads, blocks, split chunks) as its own kernel would, so special values
    take the same path (NaN through max and min, infinities through sums). The merged
    kernel runs where the first of them did when the others' operands are ready by then,
    or where the last did when nothing reads the earlier ones before it; otherwise a
    reduction stays apart. GPU programs only (the CPU emitter has no statistics)."""
    steps = prog.steps
    pos = {s.output: i for i, s in enumerate(steps)}
    users = _users(prog)
    outputs = set(prog.outputs)

    def first_read(v: str) -> float:
        return min((pos[u] for u in users.get(v, ()) if u in pos), default=float("inf"))

    groups: dict[tuple, list[_Group]] = {}
    for i, s in enumerate(steps):
        if not _mergeable(s):
            continue
        k = s.kernel
        reads = _reads(k)
        ready = max((pos.get(v, -1) for v, *_ in reads), default=-1)
        for g in groups.setdefault(_key(k), []):
            if len(g.members) >= SIBLINGS_MAX or not reads & g.reads:
                continue
            if len(reads | g.reads) > OPERANDS_MAX:
                continue
            if ready < g.at:  # its operands are ready where the group runs
                g.members.append(s)
                g.reads |= reads
                break
            if all(first_read(m.output) > i for m in g.members):  # the group can run here
                g.members.append(s)
                g.reads |= reads
                g.at = i
                break
        else:
            groups[_key(k)].append(_Group(s, i))
    merged = [g for gs in groups.values() for g in gs if len(g.members) > 1]
    if not merged:
        return prog
    gone = {m.output for g in merged for m in g.members}
    at: dict[int, list[Step]] = {}
    for g in merged:
        step, stats = _merged(g.members)
        at.setdefault(g.at, []).extend([step, *stats])
    out_steps: list[Step] = []
    for i, s in enumerate(steps):
        if s.output not in gone:
            out_steps.append(s)
        out_steps += at.get(i, [])
    assert outputs <= {s.output for s in out_steps}
    out = renumber(Program(out_steps, prog.outputs, prog.inputs))
    validate(out)
    return out
