"""Kernels merged side by side on a lowered GPU program, each merged kernel writing one
value as its output and the others beside it, as statistics (``kinds/row_stat.py``) whose
steps keep their values' names.

- Sibling reductions (``merge_siblings``): reductions over the same domain, axes and kind
  that read a common operand, each in an accumulator of its own, so the operand is read
  once. A batch norm's backward sums the output gradient and its product with the
  normalized input over the same axes; a layer norm's backward sums both over the rows
  for its weight and bias.
- Grouped loops (``group_loops``): small elementwise loops run by one launch, each over
  its own domain (an optimizer's update of every small parameter)."""

from __future__ import annotations

import math
from collections.abc import Callable

from .extract import DEVICE
from .kernel_fusion import _remap, _users
from .kinds import Kind
from .program import Expr, Kernel, Operand, Program, Step, StepKind, moved
from .rows_fusion import _stat_step

SIBLINGS_MAX = 4  # reductions one kernel accumulates (registers and shared memory each)
OPERANDS_MAX = 12  # operands of a merged reduction
GROUP_MAX = 16  # loops one launch runs
GROUP_OPERANDS_MAX = 48  # operands of a loop group (a launch's parameters stay small)
# larger loops keep kernels of their own (vector accesses, a grid sized for them)
GROUP_NUMEL_MAX = 1 << 20


def _reads(k: Kernel) -> set[tuple]:
    return {(o.value, o.dtype, tuple(o.shape), o.indexing) for o in k.inputs}


class _Group:
    """Kernel steps to merge, emitted at position ``at`` of the program."""

    def __init__(self, s: Step, at: int, read_at: float) -> None:
        self.members, self.at = [s], at
        self.reads = _reads(s.kernel)
        self.outputs = {s.output}
        self.read_at = read_at  # where a step first reads a member's value


def _groups(
    prog: Program,
    candidate: Callable[[Step], bool],
    key: Callable[[Kernel], tuple],
    shares: bool,
    most: int,
    operands: int,
) -> list[_Group]:
    """Groups of candidate steps of equal ``key`` (those reading a common operand where
    ``shares``; at most ``most`` steps and ``operands`` operands each) that one kernel can
    compute where it runs: where the first ran when the others' operands are ready by then,
    or where the last ran when nothing reads the earlier ones before it. Programs are in
    SSA form (no step writes another's value), so moving a kernel changes no value it
    reads; a step that reads a member's value never joins its group, and a value's
    readiness is where its group now runs (``now``), not where its step was."""
    pos = {s.output: i for i, s in enumerate(prog.steps)}
    now: dict[str, int] = {}  # a member's value -> where its group runs
    users = _users(prog)

    def first_read(v: str) -> float:
        return min((pos[u] for u in users.get(v, ()) if u in pos), default=math.inf)

    open_: dict[tuple, list[_Group]] = {}  # groups that may still take a member
    done: list[_Group] = []
    for i, s in enumerate(prog.steps):
        if not candidate(s):
            continue
        reads = _reads(s.kernel)
        ready = max((now.get(v, pos.get(v, -1)) for v, *_ in reads), default=-1)
        groups = open_.setdefault(key(s.kernel), [])
        for g in groups:
            if shares and not reads & g.reads:
                continue
            if any(v in g.outputs for v, *_ in reads):  # computed by the same launch
                continue
            if len(reads | g.reads) > operands:
                continue
            if ready < g.at:  # its operands are ready where the group runs
                pass
            elif g.read_at > i:  # nothing read a member yet: the group can run here
                g.at = i
            else:
                continue
            g.members.append(s)
            g.reads |= reads
            g.outputs.add(s.output)
            g.read_at = min(g.read_at, first_read(s.output))
            now.update((m.output, g.at) for m in g.members)
            if len(g.members) == most:
                groups.remove(g)
                done.append(g)
            break
        else:
            groups.append(_Group(s, i, first_read(s.output)))
    every = done + [g for gs in open_.values() for g in gs]
    return [g for g in every if len(g.members) > 1]


def _merged(members: list[Step], attrs: Callable[[list[Step], list], dict]) -> list[Step]:
    """The step computing ``members`` (the first as its output, the others beside it, in
    order: ``attrs`` gets the members and their bodies over the merged operands) and the
    statistics' steps."""
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
    bodies = [_remap(m.kernel.body, table(m.kernel)) for m in members]
    kernel = Kernel(
        k.kind,
        lead.output,
        k.dtype,
        tuple(k.shape),
        operands,
        bodies[0],
        tuple(k.domain),
        {**k.attrs, **attrs(members, bodies)},
        list(k.covers),
        [n for m in members for n in m.kernel.fused],
        epilogue=k.epilogue,
    )
    step = Step(
        StepKind.KERNEL,
        lead.output,
        k.kind,
        tuple(o.value for o in operands),
        dtype=lead.dtype,
        shape=tuple(lead.shape),
        place=lead.place,
        kernel=kernel,
        covers=kernel.covers,
    )
    return [step, *(_stat_step(step, j, m) for j, m in enumerate(members[1:]))]


def _rebuilt(prog: Program, groups: list[_Group], attrs) -> Program:
    if not groups:
        return prog
    gone = {m.output for g in groups for m in g.members}
    at: dict[int, list[Step]] = {}
    for g in groups:
        at.setdefault(g.at, []).extend(_merged(g.members, attrs))
    return moved(prog, gone, at)


# --- sibling reductions ----------------------------------------------------------------


def _reduction(s: Step) -> bool:
    k = s.kernel
    return (
        k is not None
        and k.kind == Kind.REDUCE
        and s.place == DEVICE
        and "stats" not in k.attrs
        and k.body is not None
    )


def _reduction_key(k: Kernel) -> tuple:
    """What siblings share: all but the body and the operands (the same accumulator, grid
    and epilogue, so each is reduced in the order it would be alone)."""
    attrs = tuple(sorted((a, repr(v)) for a, v in k.attrs.items()))
    return (tuple(k.domain), k.dtype, tuple(k.shape), attrs, k.epilogue)


def _sibling_attrs(members: list[Step], bodies: list) -> dict:
    return {"stats": tuple((b, m.dtype) for m, b in zip(members[1:], bodies[1:], strict=True))}


def merge_siblings(prog: Program) -> Program:
    """Merge reductions that read a common operand over the same domain, axes, kind,
    accumulator and epilogue into one reduce kernel (up to ``SIBLINGS_MAX``): the first is
    its output, each other ``attrs["stats"]`` (its body over the merged operands, its
    dtype). Exact: each keeps its own accumulator, folded over the same elements in the
    same order by the same grid (threads, blocks, split chunks) as its own kernel would,
    so special values take the same path (NaN through max and min, infinities through
    sums). GPU programs only (the CPU emitter has no statistics)."""
    groups = _groups(prog, _reduction, _reduction_key, True, SIBLINGS_MAX, OPERANDS_MAX)
    return _rebuilt(prog, groups, _sibling_attrs)


# --- grouped loops ---------------------------------------------------------------------


def _small_loop(s: Step) -> bool:
    """A loop reading each operand at its own index (packed, its domain's shape), small
    enough that its launch costs about what its work does."""
    k = s.kernel
    if k is None or k.kind != Kind.LOOP or s.place != DEVICE or k.attrs or k.stages:
        return False
    dom = tuple(k.domain)
    return (
        k.body is not None
        and bool(k.inputs)
        and tuple(k.shape) == dom
        and 0 < math.prod(dom) <= GROUP_NUMEL_MAX
        and all(o.indexing == "same" and tuple(o.shape) == dom for o in k.inputs)
    )


def _group_attrs(members: list[Step], bodies: list) -> dict:
    return {
        **_sibling_attrs(members, bodies),
        "segments": tuple(tuple(m.kernel.domain) for m in members[1:]),
    }


def group_loops(prog: Program) -> Program:
    """Run small elementwise loops (``_small_loop``) by one launch, up to ``GROUP_MAX``:
    the first loop's kernel also computes each other over its own domain (``attrs``
    ``"stats"``, its body over the merged operands and dtype, and ``"segments"``, its
    domain), one after the other in each thread. Each element is computed by the same
    scalar body from the same operands as in its own kernel, so values are unchanged. GPU
    programs only."""
    groups = _groups(prog, _small_loop, lambda k: (), False, GROUP_MAX, GROUP_OPERANDS_MAX)
    return _rebuilt(prog, groups, _group_attrs)
