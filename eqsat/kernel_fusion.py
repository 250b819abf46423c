"""Kernel fusion on a lowered GPU program: passes from a Program to a Program that join
kernels the e-graph's terms keep apart. A loop whose only reader is a rows kernel runs
inside it, a kernel re-reads what another already wrote instead of recomputing it, a take
feeding a rows kernel becomes its row index, and concatenation trees become one kernel.
Each pass keeps the program's values (checked by ``validate`` and the evaluator's tests)."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import replace

from saturn.eqsat import optable as ot

from .grids import refinement, regridded, unpadded
from .kinds import Kind
from .program import (
    MAX_CONCAT,
    ROW_FLOATS,
    TAKE_TABLES,
    Expr,
    Kernel,
    Operand,
    Program,
    Step,
    StepKind,
    renumber,
    validate,
)


def merge_concats(prog: Program) -> Program:
    """A concatenation kernel that reads another along the same axis copies that one's
    pieces itself (up to MAX_CONCAT pieces), and one that nothing reads any more (nor is an
    output) is dropped: the balanced tree of two-operand concatenations a many-piece
    ``cat`` imports as (decision 0039) becomes one kernel that copies each element once,
    where the tree copied it once per level (DenseNet's growing feature maps: four or five
    times). A piece shared by several trees is read by each from its own pieces: the same
    bytes as reading it. Exact: each output element is still a copy of the same input
    element."""
    by_output = {st.output: st for st in prog.steps}
    merged: list[tuple[Kernel, Kernel]] = []  # (reader, the concatenation it copied from)
    for st in prog.steps:  # producers first: a merged piece is already flat
        k = st.kernel
        if k is None or k.kind != Kind.CONCAT:
            continue
        pieces: list[Operand] = []
        for i, o in enumerate(k.inputs):
            src = by_output.get(o.value)
            inner = src.kernel if src is not None else None
            rest = len(k.inputs) - i - 1
            if (
                inner is not None
                and inner.kind == Kind.CONCAT
                and inner.attrs["dim"] == k.attrs["dim"]
                and o.indexing == "strided"
                and tuple(o.shape) == tuple(inner.shape)
                and len(pieces) + len(inner.inputs) + rest <= MAX_CONCAT
            ):
                pieces += [replace(p) for p in inner.inputs]  # inner may stay: copies
                merged.append((k, inner))
            else:
                pieces.append(o)
        if len(pieces) != len(k.inputs):
            k.inputs = pieces
            st.args = tuple(o.value for o in pieces)
    if not merged:
        return prog
    used = set(prog.outputs)
    kept: list[Step] = []
    for st in reversed(prog.steps):  # readers first: a dropped one frees its pieces
        k = st.kernel
        if k is not None and k.kind == Kind.CONCAT and st.output not in used:
            continue
        used.update(st.args)
        kept.append(st)
    for k, inner in merged:  # what a dropped one wrote is now computed inside its reader
        if inner.output not in used:
            k.fused += [n for n in inner.covers + inner.fused if n not in k.fused]
    out = renumber(Program(kept[::-1], prog.outputs, prog.inputs))
    validate(out)
    return out


def reuse_written(prog: Program) -> Program:
    """A loop or reduction whose body recomputes, element for element, what an earlier loop
    writes (same body over the same operands, read the same way, over the same domain)
    reads that loop's output instead, where that reads fewer bytes. Extraction pays each
    shared value once per program, so it sees re-reading a loop's operands inside another
    kernel as free and inlines the producer again (the encoder's second layer norm
    recomputing the first); this pass undoes that after the fact. Exact: the written value
    is the graph's value for that node, the one the recomputation approximates. It also
    frees the producer's own reductions (read now by the producer alone) for ``fuse_rows``.
    GPU programs (run before ``fuse_rows``). Float32 and float64 producers, and narrower
    ones whose body ends in the rounding to their own type (the half types' ops, placed
    with their rounding): any other narrower output is rounded when written, which a
    recomputation would not be."""
    patterns: dict[tuple, Step] = {}  # (domain, canonical body) -> the loop writing it
    for s in prog.steps:
        k = s.kernel
        if k is None:
            continue
        if k.kind in (Kind.LOOP, Kind.REDUCE) and patterns:
            _read_written(s, patterns)
        if (
            k.kind == Kind.LOOP
            and (k.dtype in ("f32", "f64") or (k.body[0] == "cast" and k.body[2] == k.dtype))
            and k.body[0] not in ("in", "stage", "const")
            and tuple(k.shape) == tuple(k.domain)
        ):
            patterns.setdefault((tuple(k.domain), _canonical(k)), s)
    return prog


def _canonical(k: Kernel) -> Expr:
    """The body with each operand leaf replaced by what it reads: (value, indexing)."""
    return _remap(k.body, {i: ("ref", o.value, o.indexing) for i, o in enumerate(k.inputs)})


def _read_written(s: Step, patterns: dict[tuple, Step]) -> None:
    k = s.kernel
    dom = tuple(k.domain)
    found: list[Step] = []

    def sub(e: Expr) -> Expr:
        p = patterns.get((dom, e))
        if p is not None and p.output != s.output:
            found.append(p)
            return ("ref", p.output, "same")
        if e[0] in ("ref", "const", "stage"):
            return e
        if e[0] == "cast":
            return ("cast", sub(e[1]), e[2])
        return (e[0], *(sub(c) for c in e[1:]))

    body = sub(_canonical(k))
    if not found:
        return
    refs: list[tuple[str, str]] = []

    def collect(e: Expr) -> None:
        if e[0] == "ref":
            if (e[1], e[2]) not in refs:
                refs.append((e[1], e[2]))
        elif e[0] == "cast":
            collect(e[1])
        elif e[0] not in ("const", "stage"):
            for c in e[1:]:
                collect(c)

    collect(body)
    old = {(o.value, o.indexing): o for o in k.inputs}
    written = {p.output: p for p in found}
    operands = [
        old.get(r) or Operand(r[0], written[r[0]].kernel.dtype, written[r[0]].kernel.shape, "same")
        for r in refs
    ]
    if _operand_bytes(operands) >= _operand_bytes(k.inputs):
        return
    table = {r: ("in", i) for i, r in enumerate(refs)}

    def bind(e: Expr) -> Expr:
        if e[0] == "ref":
            return table[(e[1], e[2])]
        if e[0] in ("const", "stage"):
            return e
        if e[0] == "cast":
            return ("cast", bind(e[1]), e[2])
        return (e[0], *(bind(c) for c in e[1:]))

    inside = {n for p in found for n in p.kernel.covers + p.kernel.fused}
    k.body = bind(body)
    k.inputs = operands
    k.fused = [n for n in k.fused if n not in inside]
    s.args = tuple(o.value for o in operands)


class Operands:
    """A kernel's operands gathered while bodies are remapped onto it: each distinct read
    (value, indexing, shape) once, ``add`` answering the body leaf that reads it."""

    def __init__(self) -> None:
        self.list: list[Operand] = []
        self._slot: dict[tuple, int] = {}

    def add(self, o: Operand) -> Expr:
        key = (o.value, o.indexing, tuple(o.shape))
        if key not in self._slot:
            self._slot[key] = len(self.list)
            self.list.append(replace(o))
        return ("in", self._slot[key])


def _operand_bytes(ops: list[Operand]) -> int:
    seen = {(o.value, o.indexing): o for o in ops}
    return sum(math.prod(o.shape) * ot.ITEMSIZE[o.dtype] for o in seen.values())


def _remap(e: Expr, table: dict[int, Expr]) -> Expr:
    if e[0] == "in":
        return table[e[1]]
    if e[0] in ("const", "stage"):
        return e
    if e[0] == "cast":
        return ("cast", _remap(e[1], table), e[2])
    return (e[0], *(_remap(c, table) for c in e[1:]))


def _users(prog: Program) -> dict[str, set[str]]:
    """value -> the steps that read it."""
    users: dict[str, set[str]] = {}
    for s in prog.steps:
        for v in s.args:
            users.setdefault(v, set()).add(s.output)
    return users


def inline_row_producers(prog: Program) -> Program:
    """A loop over a rows kernel's own domain, read by that rows kernel alone (a residual
    add before a layer norm), is computed inside it instead of written and read back: its
    body replaces the operand in every stage and in the body, over its own operands (read
    the same way, the domains being equal). Where the row fits in registers the rows
    kernel loads those operands once per row (``codegen.cuda.row_cache``); the loop's
    output never goes through memory. The loop may be read through reshapes that give back
    its own shape (``_through_reshapes``). Exact: the body is the same scalar expression
    the loop stored, in the same type (``stores_its_value``: float32 and float64 loops, and
    half loops whose body's value already has their type; another half loop rounds when it
    stores, which the inlined value would not). GPU programs (after ``fuse_rows``)."""
    return _into_rows(prog, _inline_into)


def _into_rows(prog: Program, absorb: Callable[..., set[str]]) -> Program:
    """Let ``absorb(step, by_output, users, outputs)`` take producers into each rows step
    (what reads each value, and the program's outputs, as they were before the pass); the
    producers it returns are dropped."""
    users = _users(prog)
    outputs = set(prog.outputs)
    by_output = {s.output: s for s in prog.steps}
    gone: set[str] = set()
    for s in prog.steps:
        if s.kernel is not None and s.kernel.kind == Kind.ROWS:
            gone |= absorb(s, by_output, users, outputs)
    if not gone:
        return prog
    out = renumber(
        Program([s for s in prog.steps if s.output not in gone], prog.outputs, prog.inputs)
    )
    validate(out)
    return out


def _inline_into(s: Step, by_output: dict, users: dict, outputs: set) -> set[str]:
    """Inline into rows step ``s`` the loops only it reads (``inline_row_producers``), and
    then the loops only those read, until none is left; the inlined steps' outputs."""
    k = s.kernel
    mine = {s.output}  # this step and what it computes inside now: their reads are its
    gone: set[str] = set()
    while True:
        candidates = {}  # operand slot -> (loop step, the views between)
        for i, o in enumerate(k.inputs):
            p, chain = _through_reshapes(o.value, mine, by_output, users, outputs)
            pk = p.kernel if p is not None else None
            if (
                o.indexing == "same"
                and pk is not None
                and pk.kind == Kind.LOOP
                and stores_its_value(pk)
                and tuple(pk.shape) == tuple(pk.domain)
            ):
                candidates[i] = (p, chain)
        for p, _ in candidates.values():  # a loop over a finer grid: the rows kernel takes it
            fine = _finer_rows_grid(k, tuple(p.kernel.domain))
            if fine is not None:
                coarse, k.domain = tuple(k.domain), fine
                k.inputs = [regridded(q, coarse, fine) for q in k.inputs]
                break
        dom = tuple(k.domain)
        operands = Operands()
        add = operands.add
        table: dict[int, Expr] = {}
        inlined: list[Step] = []
        for i, o in enumerate(k.inputs):  # one entry per value (``Operands``): none twice
            p, chain = candidates.get(i, (None, []))
            reads = _loop_reads(p.kernel, dom) if p is not None else None
            if reads is not None:
                table[i] = _remap(p.kernel.body, {j: add(po) for j, po in enumerate(reads)})
                inlined.append(p)
                gone |= {p.output, *(v.output for v in chain)}
            else:
                table[i] = add(o)
        if not inlined:
            return gone
        k.stages = [replace(st, body=_remap(st.body, table)) for st in k.stages]
        k.body = _remap(k.body, table)
        k.inputs = operands.list
        k.fused = [*k.fused, *(n for p in inlined for n in p.kernel.covers + p.kernel.fused)]
        s.args = tuple(o.value for o in operands.list)
        mine |= {p.output for p in inlined}


def _finer_rows_grid(k: Kernel, pd: tuple[int, ...]) -> tuple[int, ...] | None:
    """``pd`` where a loop over it (read through reshapes) splits rows kernel ``k``'s axes
    other than its row (Swin's mask added per image and window, (32, 64, 3, 49, 49), read by
    a softmax over (2048, 3, 49, 49)) and every operand of ``k`` reads the same over it;
    else None."""
    dom = tuple(k.domain)
    if unpadded(pd) == unpadded(dom):
        return None
    groups = refinement(pd, dom)
    if groups is None or groups[-1] != [dom[-1]] or "take" in k.attrs:
        return None
    if any(regridded(q, dom, pd) is None for q in k.inputs):
        return None
    return pd


def _loop_reads(pk: Kernel, dom: tuple[int, ...]) -> list[Operand] | None:
    """Loop ``pk``'s operands as a rows kernel over ``dom`` reads them: as they are over
    the same grid (up to leading unit axes), regridded where ``dom`` splits ``pk``'s axes
    other than the row; None where the grids differ otherwise, or an operand needs a view
    (or, read by channel, has more axes than the rows: its run length would differ)."""
    pd = tuple(pk.domain)
    if any(q.indexing == "middle" and len(q.shape) > len(dom) for q in pk.inputs):
        return None
    if unpadded(pd) == unpadded(dom):
        return list(pk.inputs)
    groups = refinement(dom, pd)
    if groups is None or groups[-1] != [pd[-1]]:
        return None
    reads = [regridded(q, pd, dom) for q in pk.inputs]
    return None if any(r is None for r in reads) else reads


def stores_its_value(k: Kernel) -> bool:
    """Whether a loop's body is the value it stores, so that a reader computing the body
    itself gets the same bits: float32 and float64 loops, and half loops whose body's value
    already has their type (``typed_as``: the store rounds nothing)."""
    return k.dtype in ROW_FLOATS or (k.body is not None and typed_as(k.body, k.dtype, k.inputs))


def typed_as(e: Expr, dtype: str, inputs: list[Operand]) -> bool:
    """Whether body ``e``'s value already has type ``dtype`` (storing it rounds nothing)."""
    stack = [e]
    while stack:
        x = stack.pop()
        if x[0] == "in":
            if inputs[x[1]].dtype != dtype:
                return False
        elif x[0] == "const":
            if x[2] != dtype:
                return False
        elif x[0] == "where":
            stack += [x[2], x[3]]
        elif x[0] == "neg":
            stack.append(x[1])
        elif x[0] != "cast" or x[2] != dtype:
            return False
    return True


def _through_reshapes(
    value: str, readers: set[str], by_output: dict, users: dict, outputs: set
) -> tuple[Step | None, list[Step]]:
    """The step that makes ``value`` for ``readers`` alone, seen through reshapes (Swin's
    shifted-window mask is added over (images, windows, heads, n, n) and the softmax reads
    (images * windows, heads, n, n)): a packed value's flat order is kept by a reshape, so
    reading the last view at flat index i reads the step's element i. ``value`` is read by
    ``readers`` alone (a rows step and the loops it computes inside), each value on the way
    by the next view alone, and none of them is a program output; (None, []) when that
    fails. The caller compares the grids."""
    chain: list[Step] = []
    allowed = readers
    while True:
        if value in outputs or not users.get(value) or not users[value] <= allowed:
            return None, []
        p = by_output.get(value)
        if p is None or p.kind != StepKind.VIEW:
            break
        if p.op != "View":
            return None, []
        chain.append(p)
        allowed, value = {p.output}, p.args[0]
    if chain and p is None:
        return None, []
    return p, chain


def fuse_row_takes(prog: Program) -> Program:
    """A row take (an embedding's token rows) read by one rows kernel alone is read inside
    it: the rows kernel reads row ``index[row]`` of the table where it read the taken
    tensor, so the taken rows never go through memory and the take's launch is gone.
    The operand becomes the table (indexing ``table``) and the index joins as an operand
    read once per row (``rowindex``); ``attrs["take"]`` names both slots. An index out of
    range reads nothing: the row's values are zeros and the kernel sets the error word,
    as the take kernel does. Moves bits exactly as the take would have (both zeros,
    infinities and NaN payloads), so the rows kernel computes what it computed before.
    Only where the table and the index are packed (not views: a view's layout is known
    only at the call), the table has the row's length and the index one entry per row.
    GPU programs (after ``inline_row_producers``); one take per rows kernel."""
    return _into_rows(prog, _take_into)


def _take_into(s: Step, by_output: dict, users: dict, outputs: set) -> set[str]:
    """Read in rows step ``s`` the first take only it reads (``fuse_row_takes``); the
    take's step, or nothing."""
    k = s.kernel
    if "take" in k.attrs or not k.domain:
        return set()
    for i, o in enumerate(k.inputs):
        p = by_output.get(o.value)
        if o.indexing != "same" or p is None or not _fusable_take(p, k, by_output):
            continue
        if o.value in outputs or users.get(o.value) != {s.output}:
            continue
        table, index = p.kernel.inputs
        k.inputs[i] = Operand(table.value, table.dtype, tuple(table.shape), "table")
        k.inputs.append(Operand(index.value, index.dtype, tuple(index.shape), "rowindex"))
        k.attrs = {**k.attrs, "take": (i, len(k.inputs) - 1)}
        k.fused = [*k.fused, *p.kernel.covers, *p.kernel.fused]
        s.args = tuple(dict.fromkeys(op.value for op in k.inputs))
        return {p.output}
    return set()


def _fusable_take(p: Step, k: Kernel, by_output: dict) -> bool:
    """Whether gather step ``p`` can be read inside rows kernel ``k`` (``fuse_row_takes``)."""
    pk = p.kernel
    if pk is None or pk.kind != Kind.GATHER:
        return False
    table, index = pk.inputs
    dom = tuple(k.domain)
    made = ("input", "kernel", "crossing", "const")  # packed, unlike a view
    packed = all(
        by_output.get(v) is not None and by_output[v].kind in made
        for v in (table.value, index.value)
    )
    return (
        packed
        and table.dtype in TAKE_TABLES
        and len(table.shape) == 2
        and table.shape[1] == dom[-1]
        and math.prod(index.shape) == math.prod(dom[:-1])
        and tuple(pk.shape) == dom
    )
