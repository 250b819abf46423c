"""Convolution gradient kernels: a 2-d convolution's input gradient (cuDNN's backward-data)
or weight gradient (backward-filter), run by cuDNN (``codegen/conv_grad.py``'s
``ConvGradPlan``) as eager CUDA's ``convolution_backward`` runs them. ``ConvGrad`` is made by
``rules/gemm.egg`` from the graph ops ``ConvInputGrad`` and ``ConvWeightGrad``; its last
attribute says which (0: the input's, 1: the weight's)."""

from __future__ import annotations

import math

import numpy as np

from ..numpy_ops import conv2d_input_grad, conv2d_weight_grad
from .spec import KindSpec, nbytes

OF = ("input", "weight")  # ConvGrad's last attribute indexes this


def _type(attrs: tuple, kids: list) -> tuple:
    return (kids[0][0], tuple(attrs[0]))


def _cost(m, t, kids) -> float:
    """A library call moving its operands and result and computing the forward's
    multiply-adds: the output's gradient times (input channels per group x window), read
    off the weight. The weight is the operand (the input's gradient) or the result (the
    weight's): the one whose first extent is the gradient's channel count; where both
    are (batch = channels), the smaller product, a bound either way (the cost only ranks
    cuDNN against running the op on the host)."""
    g, other = kids[0], kids[1]
    weights = [w for w in (other, t) if w[1][0] == g[1][1]] or [other, t]
    flops = 2 * math.prod(g[1]) * min(math.prod(w[1][1:]) for w in weights)
    return (
        m.library_call_us
        + flops / m.gemm_flops_per_us
        + (nbytes(g) + nbytes(other) + nbytes(t)) / m.device_bytes_per_us
    )


def _lower(en, library, lw):
    shape, st, pa, di, g, of = en.attrs
    return library(
        "conv_grad",
        list(en.kids),
        {
            "of": OF[of],
            "shape": tuple(shape),
            "stride": tuple(st),
            "padding": tuple(pa),
            "dilation": tuple(di),
            "groups": g,
        },
    )


def _args(a: dict) -> tuple:
    return (a["shape"], a["stride"], a["padding"], a["dilation"], a["groups"])


def _reference(k, operands: list[np.ndarray]) -> np.ndarray:
    grad = conv2d_input_grad if k.attrs["of"] == "input" else conv2d_weight_grad
    return grad(operands[0], operands[1], *_args(k.attrs))


def _host(k, operands, run):
    op = "ConvInputGrad" if k.attrs["of"] == "input" else "ConvWeightGrad"
    return run(op, operands, _args(k.attrs))


SPEC = KindSpec(
    name="conv_grad",
    order=11,
    term="ConvGrad",
    declare=(
        ";; a 2-D convolution's gradient: the output's gradient, the weight (of=0: the",
        ";; input's gradient) or the input (of=1: the weight's), the gradient's shape,",
        ";; stride, padding, dilation, groups, of",
        "(constructor ConvGrad (Tensor Tensor IVec IVec IVec IVec i64 i64) Tensor)",
    ),
    type_of=_type,
    cost=_cost,
    lower=_lower,
    reference=_reference,
    host=_host,
    describe="cuDNN",
)
