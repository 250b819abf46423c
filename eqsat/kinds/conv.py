"""Convolution kernels: a 2-d convolution with an optional bias, run by cuDNN (the GPU
runner's plans, ``codegen/conv.py``)."""

from __future__ import annotations

import math

import numpy as np

from .. import types as tyr
from ..numpy_ops import conv2d
from .spec import KindSpec, library_call


def _type(attrs: tuple, kids: list) -> tuple:
    return (kids[0][0], tyr.conv_shape(kids[0][1], kids[1][1], *attrs))


def _cost(m, t, kids) -> float:
    a, b = kids[0], kids[1]
    return library_call(m, t, a, b, math.prod(b[1][1:]))


def _lower(en, library, lw):
    ops = [k for k in en.kids if not lw.is_nobias(k)]
    st, pa, di, g = en.attrs
    return library(
        "conv",
        ops,
        {"stride": st, "padding": pa, "dilation": di, "groups": g, "bias": len(ops) == 3},
    )


def _reference(k, operands: list[np.ndarray]) -> np.ndarray:
    a = k.attrs
    b = operands[2] if a["bias"] else None
    x, w = operands[0], operands[1]
    y = conv2d(x, w, b, a["stride"], a["padding"], a["dilation"], a["groups"])
    # channels-last (eqsat/channels_last.py): the kernel's value is NHWC memory
    return np.ascontiguousarray(y.transpose(0, 2, 3, 1)) if a.get("channels_last") else y


SPEC = KindSpec(
    name="conv",
    order=4,
    term="Conv",
    declare=(
        ";; a 2-D convolution: x, weight, bias (or NoBias), stride, padding, dilation, groups",
        "(constructor Conv (Tensor Tensor Tensor IVec IVec IVec i64) Tensor)",
    ),
    typed_kids=2,  # the bias may be NoBias
    type_of=_type,
    cost=_cost,
    lower=_lower,
    reference=_reference,
    describe="cuDNN",
)
