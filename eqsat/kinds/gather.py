"""Gather kernels: rows of a 2-d table taken at an index tensor (``Gather``), emitted and
launched by ``codegen/take.py``; an index out of range raises after the call."""

from __future__ import annotations

from .. import optable as ot
from .. import types as tyr
from .spec import KindFacts, KindSpec, nbytes


def _cost(m, t, kids) -> float:  # reads the rows it writes and the index
    moved = 2 * nbytes(t) + nbytes(kids[1])
    return m.launch_us + moved / m.device_bytes_per_us


SPEC = KindSpec(
    name="gather",
    order=5,
    facts=KindFacts(indices=True),
    index_error=(
        "a row take (embedding, index_select or indexing along the first "
        "axis: every index in [0, rows); gather: in [0, size) along its dim)"
    ),
    term="Gather",
    declare=(
        ";; rows of a 2-D table picked by an index tensor: table, index",
        "(constructor Gather (Tensor Tensor) Tensor)",
    ),
    type_of=lambda attrs, kids: (kids[0][0], tyr.take_shape(kids[0][1], kids[1][1])),
    cost=_cost,
    lower=lambda en, library, lw: library("gather", list(en.kids), {}),
    reference=lambda k, ops: ot.op("Take").numpy(ops[0], ops[1]),
    # PyTorch's index_select raises out of range
    host=lambda k, ops, run: run("Take", ops, ()),
    emitter="saturn.codegen.take",
    describe="saturn's take kernel",
)
