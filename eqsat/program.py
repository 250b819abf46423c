"""The extracted program: host steps, crossings, views and kernel descriptions, in order.

This is what ``saturn.codegen`` and the executor consume. A kernel description says what
the kernel reads and how it indexes each operand, what it writes, and its body (a scalar
expression tree over its operands); no pointer into the e-graph survives here. ``validate``
checks the invariants after lowering: every value defined before use, every operand of a
kernel typed, outputs defined.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from enum import StrEnum

from . import optable as ot
from .errors import ValidationError
from .graph import bits_float, fmt_float, fmt_ints

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


class StepKind(StrEnum):
    """What a step of a program is; a member equals (and prints as) its program text."""

    INPUT = "input"  # a boundary input
    CONST = "const"  # a value the compiler knows (a scalar, an arange), made once
    CROSSING = "crossing"  # a copy between host and device
    VIEW = "view"  # a reshape, permute, expand or slice of another step's value
    HOST = "host"  # an op run on the host
    KERNEL = "kernel"  # a device kernel (``Kernel``)

    def __repr__(self) -> str:
        return repr(self.value)  # as its string: digests and cache keys are unchanged


@dataclass
class Step:
    kind: str  # a StepKind (or the string a program's text holds)
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
    if s.kind == StepKind.INPUT:
        return f"{s.output} = input {s.op} : {typ}"
    if s.kind == StepKind.KERNEL:
        k = s.kernel
        ins = ", ".join(f"in{i}={o.value}/{o.indexing}" for i, o in enumerate(k.inputs))
        attrs = "".join(
            f" {a}={fmt_attr_value(v)}"
            for a, v in sorted(k.attrs.items())
            if a not in ("acc_dtype", "stats", "segments")
        )
        if k.attrs.get("stats"):  # values written beside the output (kinds/row_stat.py)
            attrs += f" stats [{'; '.join(f'{format_expr(e)}:{t}' for e, t in k.attrs['stats'])}]"
        if k.attrs.get("segments"):  # a loop group's other loops' domains
            attrs += f" segments [{' '.join(fmt_ints(d) for d in k.attrs['segments'])}]"
        body = f" body {format_expr(k.body)}" if k.body is not None else ""
        if k.epilogue is not None:
            body += f" then {format_expr(k.epilogue).replace('in0', 'acc')}"
        if k.stages:
            body = f" stages [{'; '.join(format_stage(st) for st in k.stages)}]" + body
            if tuple(k.domain) != tuple(k.shape):  # a grid that splits its axes
                body = f" over {fmt_ints(k.domain)}" + body
        return f"{s.output} = kernel {k.kind}({ins}){attrs}{body} : {typ}"
    args = " ".join(s.args)
    attrs = "".join(f" {fmt_attr_value(a)}" for a in s.attrs)
    where = f" @{s.place}" if s.kind in (StepKind.VIEW, StepKind.CONST) else ""
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


def leaves(e: Expr) -> set:
    """The operand and stage leaves of a body."""
    if e[0] in ("in", "stage", "const"):
        return set() if e[0] == "const" else {e}
    return set().union(*(leaves(c) for c in e[1:] if isinstance(c, tuple)))


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


def moved(prog: Program, gone: set[str], after: dict[int, list[Step]]) -> Program:
    """``prog`` without the steps whose values are in ``gone`` and with ``after[i]`` right
    after its step ``i`` (``after[-1]`` before the first): where a pass places the kernels
    it made. Renumbered and validated (a step placed before what it reads raises)."""
    steps = list(after.get(-1, []))
    for i, s in enumerate(prog.steps):
        if s.output not in gone:
            steps.append(s)
        steps += after.get(i, [])
    out = renumber(Program(steps, prog.outputs, prog.inputs))
    validate(out)
    return out


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
        if s.kind != StepKind.CONST and not s.dtype:
            raise ValidationError(f"lower: {s.output} has no type")
        defined.add(s.output)
    for o in prog.outputs:
        if o not in defined:
            raise ValidationError(f"lower: output {o} is never defined")


def elementwise_ops() -> dict[str, ot.Op]:
    """Body node name (lower-case op) -> op-table row, for emitters and evaluators."""
    return {o.name.lower(): o for o in ot.elementwise()}
