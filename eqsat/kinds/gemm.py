"""GEMM kernels: a matrix product (rank 2, or rank 3 batched) with an epilogue, run by
cuBLASLt through nvmath (``codegen/gemm.py`` plans it, the GPU runner calls it)."""

from __future__ import annotations

import numpy as np

from .. import optable as ot
from .. import types as tyr
from ..numpy_ops import np_dtype
from .spec import KindSpec, library_call


def _type(attrs: tuple, kids: list) -> tuple:
    (da, a), (_, b) = kids[0], kids[1]
    return (da, tyr.shape_of(ot.op("BatchMatMul" if len(a) == 3 else "MatMul"), [a, b], ()))


def _cost(m, t, kids) -> float:
    a, b = kids[0], kids[1]
    return library_call(m, t, a, b, a[1][-1])


def _lower(en, library, lw):
    ops = [k for k in en.kids if not lw.is_nobias(k)]
    return library("gemm", ops, {"epilogue": en.attrs[0]})


def _reference(k, operands: list[np.ndarray]) -> np.ndarray:
    a, b = operands[0], operands[1]
    r = np.matmul(a, b)
    if k.attrs["epilogue"] != "none":
        r = r + operands[2]
    if k.attrs["epilogue"] == "relu_bias":
        r = ot.op("Relu").numpy(r.astype(np_dtype(k.dtype)))
    elif k.attrs["epilogue"] == "gelu_bias":
        r = ot.op("GeluTanh").numpy(r.astype(np_dtype(k.dtype)))
    return np.asarray(r).astype(np_dtype(k.dtype))


SPEC = KindSpec(
    name="gemm",
    order=3,
    term="Gemm",
    declare=(
        ";; a GEMM (rank 2, or rank 3 batched): a, b, bias (or NoBias), epilogue",
        "(constructor Gemm (Tensor Tensor Tensor String) Tensor)",
        "(constructor NoBias () Tensor)",
    ),
    typed_kids=2,  # the bias may be NoBias
    type_of=_type,
    cost=_cost,
    lower=_lower,
    reference=_reference,
    describe="cuBLASLt through nvmath",
)
