"""The operation table: every fact about every operation saturn knows, in one place.

A row gives the term-language name, the ATen spellings that import to it, the category,
the tensor arity and the attributes, the scalar expression the kernel emitters write for
an elementwise op (with its device-level ``E*`` constructor), the dtypes the device runs,
the shape rule, and the numpy reference used by the evaluator. The egglog schema
(``rules/schema.egg``) and the generated placement rules (``rules/placement.egg``) are
written from this table by ``saturn.eqsat.schema``; a test fails when they drift.

The rows are in ``op_rows``; what they are written with (dtypes, categories, ``Op``, numpy
references) in ``op_base``. This module is the table's one entry: every name is read from
here.
"""

from __future__ import annotations

from .op_base import (  # noqa: F401 (the table's vocabulary, read as optable.NAME)
    ALL,
    ATTR_SORTS,
    CATEGORIES,
    CONSTANT_DIVISOR,
    CONVOLUTION,
    COPY,
    CUSTOM,
    DEVICE_ALL,
    DEVICE_FLOATS,
    DEVICE_NUMERIC,
    ELEMENTWISE,
    FLOAT_OPERANDS,
    FLOATS,
    GATHER,
    HALF_CONVS,
    HALF_GEMMS,
    HALVES,
    INDEX_DTYPES,
    INTS,
    ITEMSIZE,
    LEAF,
    MATMUL,
    MAX_DIVISOR,
    MOVED,
    MOVEMENT,
    NORMALIZATION,
    NUMPY_DTYPE,
    REDUCTION,
    SCATTER,
    SIGNED,
    WIDE_FLOATS,
    Op,
    arange_exact,
    arange_values,
    constant_divisor,
    is_float,
)
from .op_rows import OPS

BY_NAME: dict[str, Op] = {op.name: op for op in OPS}
BY_ATEN: dict[str, Op] = {a: op for op in OPS for a in op.aten}

# Leaves whose values the compiler knows: made once where the program reads them (a device
# copy made once, not a crossing per call).
CONSTANTS = ("Scalar", "Arange")
REDUCE_KINDS = {"Sum": "sum", "Mean": "mean", "Amax": "max", "Amin": "min", "Prod": "prod"}
GEMM_EPILOGUES = ("none", "bias", "relu_bias", "gelu_bias")


def op(name: str) -> Op:
    try:
        return BY_NAME[name]
    except KeyError:
        raise KeyError(f"no operation named {name!r} in the op table") from None


def elementwise() -> list[Op]:
    return [o for o in OPS if o.category == ELEMENTWISE]


def rounded_halves() -> list[Op]:
    """Elementwise ops a GPU target runs on half types by computing in float32 and rounding
    (those it runs on float32); Cast converts to and from them directly."""
    return [o for o in elementwise() if "f32" in o.dtypes and o.name != "Cast"]
