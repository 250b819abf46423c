"""Roll kernels: a tensor rolled along its axes, one shift in [0, size) per axis
(``RollCopy``, made by ``rules/gather.egg`` from the graph op ``Roll``), emitted and
launched by ``codegen/roll.py``. One kernel for every rolled axis, reading its operand
at any strides: PyTorch's decomposition is a permute copy and a row take per axis."""

from __future__ import annotations

from .. import optable as ot
from .spec import KindSpec, copied


def _permuted(attrs: dict, order: tuple[int, ...]) -> dict:
    shifts = attrs["shifts"]
    return {**attrs, "shifts": tuple(shifts[a] for a in order)}


SPEC = KindSpec(
    name="roll",
    order=10,
    term="RollCopy",
    declare=(
        ";; x rolled along every axis d by shifts[d] in [0, size)",
        "(constructor RollCopy (Tensor IVec) Tensor)",
    ),
    type_of=lambda attrs, kids: kids[0],
    cost=copied,
    lower=lambda en, library, lw: library("roll", list(en.kids), {"shifts": tuple(en.attrs[0])}),
    reference=lambda k, ops: ot.op("Roll").numpy(ops[0], k.attrs["shifts"]),
    host=lambda k, ops, run: run("Roll", ops, (k.attrs["shifts"],)),
    emitter="saturn.codegen.roll",
    describe="saturn's roll kernel",
    permuted=_permuted,
)
