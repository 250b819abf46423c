"""Pad kernels: a tensor with a constant border, (before, after) per axis (``PadCopy``,
made by ``rules/gather.egg`` from the graph op ``Pad``), emitted and launched by
``codegen/pad.py``."""

from __future__ import annotations

from .. import optable as ot
from .. import types as tyr
from .spec import KindSpec, copied


def _lower(en, library, lw):
    pads, value = en.attrs
    return library("pad", list(en.kids), {"pads": tuple(pads), "value_bits": value})


def _permuted(attrs: dict, order: tuple[int, ...]) -> dict:
    pads = attrs["pads"]
    return {**attrs, "pads": tuple(p for a in order for p in pads[2 * a : 2 * a + 2])}


SPEC = KindSpec(
    name="pad",
    order=8,
    term="PadCopy",
    declare=(
        ";; x padded with a constant (float bits): (before, after) per axis",
        "(constructor PadCopy (Tensor IVec i64) Tensor)",
    ),
    type_of=lambda attrs, kids: (kids[0][0], tyr.pad_shape(kids[0][1], attrs[0])),
    cost=copied,
    lower=_lower,
    reference=lambda k, ops: ot.op("Pad").numpy(ops[0], k.attrs["pads"], k.attrs["value_bits"]),
    host=lambda k, ops, run: run("Pad", ops, (k.attrs["pads"], k.attrs["value_bits"])),
    emitter="saturn.codegen.pad",
    describe="saturn's pad kernel",
    permuted=_permuted,
)
