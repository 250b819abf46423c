"""Loops written in the layout a copying reshape reads them in, on a lowered GPU program.

Attention splits its heads with a reshape, a permute and a reshape that merges the batch
and head axes for its batched products: ``[B, S, H*D] -> [B, S, H, D] -> [B, H, S, D] ->
[B*H, S, D]``. The last reshape cannot view the permuted value, so the runner copies it at
every call (``GpuRunner._view``, a cost no kernel count shows). Where the value is a
loop's (the query and key scaled by ``sqrt(scale)`` in PyTorch's math attention, a
gradient scaled in its backward), the loop writes its row-major output, and the copy reads
it back and writes it again: 18 of DistilBERT's 48 copying views a training step.

Here such a loop runs over the reshape's source shape instead, reading each operand
through the same views, so that what it writes lies packed in the order the reshape needs
and the reshape is a view. The axis the loop's output was contiguous along stays the last
one it runs over (a key transposed for ``q @ k.T`` is written ``[B, H, S, D]`` and read
through a transposing permute, which a product takes as a transposed operand), so the new
loop reads its operands along the same contiguous axis as before. Exact: every element is
computed by the same body from the same operand elements in the same types; only where it
is stored changes. A loop read by anything else, or a chain of views with a broadcasting
expand or a slice, is left alone.
"""

from __future__ import annotations

import itertools
from dataclasses import replace

from .channels_last import Emitter, Layouts, operand_in_order, packed_like, relaid_step
from .kernel_fusion import _users
from .kinds import Kind
from .program import (
    Operand,
    Program,
    Step,
    StepKind,
    packed_strides,
    renumber,
    validate,
    view_strides,
)

_MOVES = frozenset({"View", "Permute", "Expand"})


def write_through_copies(prog: Program) -> Program:
    """Each loop read only through a copying reshape, written in the reshape's order
    (module docstring)."""
    lay = Layouts()
    for s in prog.steps:
        lay.add(s)
    users = _users(prog)
    outputs = set(prog.outputs)
    by_output = {s.output: s for s in prog.steps}
    plans: dict[str, list[Step]] = {}  # a loop's output -> the steps that replace it
    gone: set[str] = set()
    for s in prog.steps:
        if not _copies(s, lay):
            continue
        found = _chain(s, by_output, users, outputs)
        if found is None:
            continue
        loop, chain = found
        steps = _rewritten(loop, chain, s, lay)
        if steps is not None:
            plans[loop.output] = steps
            gone |= {v.output for v in chain} | {s.output}
            continue
        steps = _permuted(loop, chain, s, lay)
        if steps is not None:  # the views stay: they now view the permuted loop's memory
            plans[loop.output] = steps
    if not plans:
        return prog
    out: list[Step] = []
    for s in prog.steps:
        if s.output in plans:
            out += plans[s.output]
        elif s.output not in gone:
            out.append(s)
    new = renumber(Program(out, prog.outputs, prog.inputs))
    validate(new)
    return new


def _copies(s: Step, lay: Layouts) -> bool:
    """Whether ``s`` is a reshape of a value of known layout that cannot view it."""
    return (
        s.kind == StepKind.VIEW
        and s.op == "View"
        and lay.strides.get(s.args[0]) is not None
        and lay.strides.get(s.output) is None
    )


def _chain(s: Step, by_output: dict, users: dict, outputs: set) -> tuple[Step, list[Step]] | None:
    """The loop under reshape ``s`` and the views between them (the loop's first), where
    each is read by the next alone and none is a program output."""
    chain: list[Step] = []
    at, reader = s.args[0], s.output
    while True:
        step = by_output[at]
        if at in outputs or users.get(at) != {reader}:
            return None
        if step.kind != StepKind.VIEW:
            break
        if step.op not in _MOVES:
            return None
        if step.op == "Expand" and tuple(step.shape) != tuple(by_output[step.args[0]].shape):
            return None  # a broadcast: the loop would compute each element several times
        chain.append(step)
        at, reader = step.args[0], at
    k = step.kernel
    if k is None or k.kind != Kind.LOOP or tuple(k.shape) != tuple(k.domain) or not chain:
        return None
    return step, chain[::-1]


def _rewritten(loop: Step, chain: list[Step], s: Step, lay: Layouts) -> list[Step] | None:
    """The operand views, the loop over the reshape's source order and the views back to
    ``s`` under its name; None where the reshape would still copy or an operand has no
    view through the chain."""
    k = loop.kernel
    shape = tuple(chain[-1].shape)  # what the reshape reads
    strides = lay.strides[chain[-1].output]
    moving = [i for i, n in enumerate(shape) if n > 1]
    inner = min(moving, key=lambda i: strides[i], default=None)
    if inner is None or strides[inner] != 1:
        return None
    order = tuple([i for i in range(len(shape)) if i != inner] + [inner])
    dom = tuple(shape[i] for i in order)
    if view_strides(shape, _laid_out(shape, order), tuple(s.shape)) is None:
        return None
    steps: list[Step] = []
    emit, emitted_view = Emitter(lay, steps, loop.output).helpers()

    def view(src: str, op: str, attrs: tuple, dtype: str, to) -> str:
        return emitted_view(src, op, attrs, dtype, to, loop.place)

    domain = tuple(k.domain)
    ops = []
    for o in k.inputs:
        if o.indexing == "scalar":
            ops.append(o)
            continue
        name, have = o.value, tuple(o.shape)
        if have != domain:  # a broadcast operand: expanded over the loop first
            padded = (1,) * (len(domain) - len(have)) + have
            if padded != have:
                name = view(name, "View", (padded,), o.dtype, padded)
            name = view(name, "Expand", (domain,), o.dtype, domain)
        for v in chain:
            name = view(name, v.op, v.attrs, o.dtype, v.shape)
        if order != tuple(range(len(order))):
            name = view(name, "Permute", (order,), o.dtype, dom)
        got = lay.strides.get(name)
        if got is None:
            return None
        ops.append(Operand(name, o.dtype, dom, "same" if packed_like(dom, got) else "strided"))
    name = f"{loop.output}_relaid"
    fused = [*k.fused, *(c for v in chain for c in v.covers)]
    kernel = replace(k, output=name, shape=dom, domain=dom, inputs=ops, fused=fused)
    args = tuple(o.value for o in ops)
    run = Step(StepKind.KERNEL, name, loop.op, args, loop.attrs, k.dtype, dom, loop.place, kernel)
    run.covers = list(loop.covers)
    emit(run)
    if order != tuple(range(len(order))):
        inverse = tuple(sorted(range(len(order)), key=order.__getitem__))
        name = view(name, "Permute", (inverse,), k.dtype, shape)
    steps.append(replace(s, args=(name,)))
    return steps


MAX_PERMUTED_RANK = 6  # the orders tried: (rank - 1)! (the last axis stays last)


def _permuted(loop: Step, chain: list[Step], s: Step, lay: Layouts) -> list[Step] | None:
    """The loop over its own domain permuted (its last axis kept last) so that the chain
    and the reshape view what it writes: the order of fewest swapped pairs that does, as
    ``channels_last`` relays a loop (operands read through the permute, a permuted view
    back under the loop's name); None where no order does. What this takes that
    ``_rewritten`` cannot: a concatenation loop (GPT-NeoX's gradient of its fused query,
    key and value), whose pieces broadcast along the axis the chain merges away."""
    k = loop.kernel
    dom = tuple(k.domain)
    rank = len(dom)
    if not 2 < rank <= MAX_PERMUTED_RANK:
        return None
    best: tuple[int, tuple[int, ...]] | None = None
    for rest in itertools.permutations(range(rank - 1)):
        order = (*rest, rank - 1)
        swaps = sum(a > b for a, b in itertools.combinations(order, 2))
        if swaps and (best is None or swaps < best[0]) and _views_all(order, loop, chain, s):
            best = (swaps, order)
    if best is None:
        return None
    order = best[1]
    steps: list[Step] = []
    emit, view = Emitter(lay, steps, loop.output).helpers()
    ops = [operand_in_order(o, dom, lay, view, loop.place, order) for o in k.inputs]
    relaid_step(loop, k, ops, dict(k.attrs), emit, order)
    return steps


def _views_all(order: tuple[int, ...], loop: Step, chain: list[Step], s: Step) -> bool:
    """Whether every view of the chain and the reshape ``s`` view the loop's memory when
    the loop writes it packed in ``order``."""
    dom = tuple(loop.kernel.domain)
    sim = Layouts()
    sim.shapes[loop.output], sim.strides[loop.output] = dom, _laid_out(dom, order)
    for v in [*chain, s]:
        sim.add(v)
        if sim.strides[v.output] is None:
            return False
    return True


def _laid_out(shape: tuple[int, ...], order: tuple[int, ...]) -> tuple[int, ...]:
    """The strides of ``shape`` whose memory is packed with its axes in ``order``."""
    packed = packed_strides(tuple(shape[a] for a in order))
    strides = [0] * len(shape)
    for i, a in enumerate(order):
        strides[a] = packed[i]
    return tuple(strides)
