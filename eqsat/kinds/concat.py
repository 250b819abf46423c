"""Concatenation kernels: two or more pieces joined along one axis (``Concat`` joins two;
``kernel_fusion.py`` merges chains into one kernel), emitted and launched by
``codegen/concat.py``."""

from __future__ import annotations

import numpy as np

from .. import optable as ot
from .. import types as tyr
from .spec import KindSpec, copied


def _reference(k, operands: list[np.ndarray]) -> np.ndarray:
    """Two or more pieces, joined two at a time."""
    r = operands[0]
    for piece in operands[1:]:
        r = ot.op("Cat").numpy(r, piece, k.attrs["dim"])
    return r


def _host(k, operands, run):
    r = operands[0]  # two or more pieces, joined two at a time
    for piece in operands[1:]:
        r = run("Cat", [r, piece], (k.attrs["dim"],))
    return r


SPEC = KindSpec(
    name="concat",
    order=7,
    term="Concat",
    declare=(";; a and b joined along a dim", "(constructor Concat (Tensor Tensor i64) Tensor)"),
    type_of=lambda attrs, kids: (kids[0][0], tyr.cat_shape(kids[0][1], kids[1][1], attrs[0])),
    cost=copied,
    lower=lambda en, library, lw: library("concat", list(en.kids), {"dim": en.attrs[0]}),
    reference=_reference,
    host=_host,
    emitter="saturn.codegen.concat",
    describe="saturn's concatenation kernel",
)
