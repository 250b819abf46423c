"""Scatter kernels: rows added into a copy of a table at an index (``ScatterAdd``, atomic
adds), emitted and launched by ``codegen/scatter_add.py``; an index out of range raises
after the call."""

from __future__ import annotations

from .. import optable as ot
from .. import types as tyr
from .spec import KindFacts, KindSpec, nbytes


def _cost(m, t, kids) -> float:  # copies the table, then reads the values and adds them
    values = kids[2]
    moved = 2 * nbytes(t) + 2 * nbytes(values) + nbytes(kids[1])
    return 2 * m.launch_us + moved / m.device_bytes_per_us


SPEC = KindSpec(
    name="scatter",
    order=6,
    facts=KindFacts(indices=True),
    index_error=(
        "a row add (index_put with accumulate: every index in [-rows, rows); "
        "scatter and scatter_add: in [0, size) along their dim)"
    ),
    term="ScatterAdd",
    declare=(
        ";; rows added into a copy of a table at an index (atomic adds)",
        "(constructor ScatterAdd (Tensor Tensor Tensor) Tensor)",
    ),
    type_of=lambda attrs, kids: (
        kids[0][0],
        tyr.index_add_shape(kids[0][1], kids[1][1], kids[2][1]),
    ),
    cost=_cost,
    lower=lambda en, library, lw: library("scatter", list(en.kids), {}),
    reference=lambda k, ops: ot.op("IndexAdd").numpy(*ops),
    host=lambda k, ops, run: run("IndexAdd", ops, ()),
    emitter="saturn.codegen.scatter_add",
    describe="saturn's add-at kernel",
)
