"""Reduce kernels: a body reduced along some axes, then an epilogue (the e-graph's
``Reduce``), lowered by ``kernel_bodies.py``, emitted by ``codegen/cuda_reduce.py``."""

from __future__ import annotations

import numpy as np

from .. import optable as ot
from .. import types as tyr
from ..numpy_ops import eval_expr, np_dtype, reduce
from .spec import KindFacts, KindSpec, streamed


def _type(attrs: tuple, kids: list) -> tuple:
    kind, dims, kd = attrs
    dtype, shape = kids[0]
    if kind in ("sum", "prod") and not ot.is_float(dtype):
        dtype = "i64"
    return (dtype, tyr.reduce_shape(shape, dims, kd))


def _reduced(k, body, operands: list[np.ndarray]) -> np.ndarray:
    v = np.broadcast_to(eval_expr(body, operands), k.domain)
    acc = reduce(
        k.attrs["reduce"],
        v,
        k.attrs["dims"],
        k.attrs["keepdim"],
        k.attrs.get("acc_dtype", k.dtype),
    )
    # a reduction over a permuted domain (kept axes first) keeps its dims at the end:
    # the same elements in the same order as the output's shape
    acc = np.reshape(acc, k.shape)
    if k.epilogue is None:
        return acc
    return np.asarray(eval_expr(k.epilogue, [acc])).astype(np_dtype(k.dtype))


def _reference(k, operands: list[np.ndarray]) -> np.ndarray:
    return _reduced(k, k.body, operands)


def siblings(k, operands: list[np.ndarray]) -> list[np.ndarray]:
    """The reductions a reduce kernel computes beside its output (``attrs["stats"]``: a
    body over its operands and the dtype each, reduced as the output is;
    ``horizontal.py``)."""
    return [_reduced(k, body, operands) for body, _ in k.attrs.get("stats", ())]


SPEC = KindSpec(
    name="reduce",
    order=1,
    facts=KindFacts(body=True),
    term="Reduce",
    declare=(
        ";; a reduction: kind, body over the input's shape, dims, keepdim",
        "(constructor Reduce (String Expr IVec i64) Tensor)",
    ),
    type_of=_type,
    cost=streamed,
    reference=_reference,
    side_values=siblings,
)
