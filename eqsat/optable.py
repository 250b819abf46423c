"""The operation table: every fact about every operation saturn knows, in one place.

A row gives the term-language name, the ATen spellings that import to it, the category,
the tensor arity and the attributes, the scalar expression the kernel emitters write for
an elementwise op (with its device-level ``E*`` constructor), the dtypes the device runs,
the shape rule, and the numpy reference used by the evaluator. The egglog schema
(``rules/schema.egg``) and the generated placement rules (``rules/placement.egg``) are
written from this table by ``saturn.eqsat.schema``; a test fails when they drift.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from .bits import bits_float

# --- dtypes --------------------------------------------------------------------------

FLOATS = ("f16", "bf16", "f32", "f64")
SIGNED = ("i8", "i16", "i32", "i64")
INTS = ("u8", *SIGNED)
ALL = ("bool", *INTS, *FLOATS)
# What the generated kernels compute in: float32/float64 and the integer types.
DEVICE_FLOATS = ("f32", "f64")
DEVICE_NUMERIC = ("f32", "f64", "i32", "i64")
DEVICE_ALL = ("bool", "f32", "f64", "i32", "i64")
# Computed in the type itself: no rounding to a narrower storage type between two ops, so
# rules that merge ops (an epilogue, a pattern, a decomposition) keep every value.
WIDE_FLOATS = ("f32", "f64")
# Half-precision storage types, run on GPU targets only (decision 0032): an elementwise op
# computes in float32 and rounds its result to the type, as PyTorch's GPU kernels do, so a
# fused chain rounds after every op where eager would; products accumulate in float32
# (cuBLASLt) and round once.
HALVES = ("f16", "bf16")
HALF_GEMMS = ("MatMul", "BatchMatMul", "Addmm")
# convolutions on half operands: cuDNN, float32 accumulation (the fact covers Conv2dNoBias)
HALF_CONVS = ("Conv2d",)

NUMPY_DTYPE = {
    "bool": np.bool_,
    "u8": np.uint8,
    "i8": np.int8,
    "i16": np.int16,
    "i32": np.int32,
    "i64": np.int64,
    "f16": np.float16,
    "f32": np.float32,
    "f64": np.float64,
}
ITEMSIZE = {
    "bool": 1,
    "u8": 1,
    "i8": 1,
    "i16": 2,
    "i32": 4,
    "i64": 8,
    "f16": 2,
    "bf16": 2,
    "f32": 4,
    "f64": 8,
}


# Ops defined on floating operands only (an integer operand is a type error in a graph;
# the importer leaves such an ATen call as PyTorch's op).
FLOAT_OPERANDS = frozenset(
    (
        "Mean",
        "Div",
        "Exp",
        "Expm1",
        "Log",
        "Log1p",
        "Sin",
        "Cos",
        "Atan2",
        "Floor",
        "Ceil",
        "Trunc",
        "Round",
        "Sqrt",
        "Rsqrt",
        "Tanh",
        "Sigmoid",
        "Erf",
        "Gelu",
        "GeluTanh",
        "Silu",
        "Softmax",
        "LogSoftmax",
        "LayerNorm",
    )
)


# Ops that take integer operands only with a constant divisor b, 1 <= b <= 2^53, that fits
# the dtype. PyTorch raises on an integer zero divisor, which a kernel cannot do; with such a
# b no op can raise, overflow or round (floored division of integers, PyTorch's rule: the
# remainder has the divisor's sign, here in [0, b); fmod truncates, C's %: the remainder
# has the dividend's sign, in (-b, b)), and b is exact as the float64 a Scalar holds.
# Anything else of integers stays PyTorch's op.
CONSTANT_DIVISOR = frozenset(("Remainder", "FloorDiv", "Fmod"))
MAX_DIVISOR = 2**53


def constant_divisor(value: int | float, dtype: str) -> bool:
    """Whether ``value`` (a Python int, or a Scalar's float) is a divisor the
    ``CONSTANT_DIVISOR`` ops take for integer ``dtype``. An int is compared as itself: 2^53 + 1
    would round to 2^53 as a float."""
    if dtype not in INTS:
        return False
    if isinstance(value, float):
        if not value.is_integer():  # fractions, infinities, NaN
            return False
        value = int(value)
    return 1 <= value <= min(MAX_DIVISOR, int(np.iinfo(NUMPY_DTYPE[dtype]).max))


def is_float(dtype: str) -> bool:
    return dtype in FLOATS


# --- categories and attribute kinds ----------------------------------------------------

ELEMENTWISE = "elementwise"
REDUCTION = "reduction"
MOVEMENT = "movement"
MATMUL = "matmul"
CONVOLUTION = "convolution"
NORMALIZATION = "normalization"  # composite ops that decompose (softmax, layer norm, ...)
COPY = "copy"
GATHER = "gather"  # rows of a table picked by an index tensor
SCATTER = "scatter"  # rows added into a table at an index tensor's rows
CUSTOM = "custom"
LEAF = "leaf"
CATEGORIES = (
    ELEMENTWISE,
    REDUCTION,
    MOVEMENT,
    MATMUL,
    CONVOLUTION,
    NORMALIZATION,
    COPY,
    GATHER,
    SCATTER,
    CUSTOM,
    LEAF,
)

# attribute kind -> egglog sort
ATTR_SORTS = {"int": "i64", "float": "f64", "ints": "IVec", "str": "String", "bits": "i64"}


@dataclass(frozen=True)
class Op:
    name: str  # term-language constructor, e.g. "Add"
    category: str
    arity: int  # tensor operands
    attrs: tuple[tuple[str, str], ...] = ()  # (name, kind)
    aten: tuple[str, ...] = ()  # ATen overloads that import to this row
    expr: str | None = None  # scalar expression template over {0}, {1}, ... (elementwise)
    numpy: Callable | None = None  # reference semantics for the evaluator
    dtypes: tuple[str, ...] = ()  # dtypes the device runs; () = host only
    shape: str = "same"  # shape rule name (see saturn.eqsat.types)
    out_dtype: str | None = None  # fixed result dtype ("bool" for comparisons)
    flops: int = 1  # arithmetic per output element, for the cost model
    doc: str = ""
    tags: frozenset[str] = field(default_factory=frozenset)
    # scalar expression for integer operands, where it differs from ``expr``: arithmetic
    # that wraps in the operands' type as PyTorch's does (``add_i32`` ..., codegen.expr's
    # helpers; Numba would widen int32 to int64 and fold int64 overflow away), and the
    # CONSTANT_DIVISOR ops' Python-floored ``%`` and ``//``
    int_expr: str | None = None

    @property
    def device_expr(self) -> str:
        """The device-level Expr constructor of an elementwise op (``Add`` -> ``EAdd``)."""
        return "E" + self.name


def arange_values(start: int, step: int, n: int, dtype: str) -> np.ndarray:
    """``Arange``'s values: ``start + i * step`` for ``i < n``, computed exactly in int64."""
    return (np.arange(n, dtype=np.int64) * step + start).astype(NUMPY_DTYPE[dtype])


def arange_exact(start: int, step: int, n: int, dtype: str) -> bool:
    """Every value of the Arange is representable in ``dtype`` (what the importer checks)."""
    if n < 0 or dtype not in NUMPY_DTYPE or dtype == "bool":
        return False
    ends = (start, start + step * max(n - 1, 0))
    if dtype in FLOATS:
        limit = 2 ** {"f16": 11, "f32": 24, "f64": 53}[dtype]
        return all(abs(v) <= limit for v in ends)
    info = np.iinfo(NUMPY_DTYPE[dtype])
    return all(info.min <= v <= info.max for v in ends)


def _fma(a: np.ndarray, b: np.ndarray, c: np.ndarray) -> np.ndarray:
    """float32: in float64, one rounding of the sum (the kernel's formula); other dtypes
    (host only): product and sum in the dtype, as PyTorch's CPU prims.fma."""
    a, b, c = np.asarray(a), np.asarray(b), np.asarray(c)
    if a.dtype != np.float32:
        return a * b + c
    f8 = np.float64
    return (a.astype(f8) * b.astype(f8) + c.astype(f8)).astype(np.float32)


def _erf(x: np.ndarray) -> np.ndarray:
    return np.vectorize(math.erf, otypes=[x.dtype])(x).astype(x.dtype)


def _relu(x: np.ndarray) -> np.ndarray:
    # torch: x if not x < 0 else 0 (keeps -0.0 and NaN)
    return np.where(x < 0, np.zeros((), x.dtype), x).astype(x.dtype)


def _sigmoid(x: np.ndarray) -> np.ndarray:
    one = x.dtype.type(1)
    with np.errstate(over="ignore"):
        return (one / (one + np.exp(-x))).astype(x.dtype)


def _gelu(x: np.ndarray) -> np.ndarray:
    half, one, r2 = (x.dtype.type(v) for v in (0.5, 1.0, 1 / math.sqrt(2)))
    return (x * half * (one + _erf(x * r2))).astype(x.dtype)


def _gelu_tanh(x: np.ndarray) -> np.ndarray:
    t = x.dtype.type
    inner = t(math.sqrt(2 / math.pi)) * (x + t(0.044715) * x * x * x)
    return (t(0.5) * x * (t(1) + np.tanh(inner))).astype(x.dtype)


def _silu(x: np.ndarray) -> np.ndarray:
    return (x * _sigmoid(x)).astype(x.dtype)


def _div(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.true_divide(a, b).astype(np.result_type(a, b))


def _max(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.maximum(a, b)  # propagates NaN, as torch.maximum


def _min(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.minimum(a, b)


def _clamp_min(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    # torch.clamp: std::max(x, lo) keeps x unless x < lo (so -0.0 stays -0.0 against 0.0)
    # and a NaN bound makes NaN
    b = np.broadcast_to(b, np.broadcast_shapes(a.shape, b.shape))
    return np.where((a < b) | (b != b), b, a).astype(a.dtype)


def _clamp_max(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    b = np.broadcast_to(b, np.broadcast_shapes(a.shape, b.shape))
    return np.where((a > b) | (b != b), b, a).astype(a.dtype)


def _remainder(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """PyTorch's float remainder: numpy's gives a zero the divisor's sign, PyTorch keeps
    fmod's (the dividend's)."""
    m = np.fmod(a, b)
    move = (m != 0) & ((b < 0) != (m < 0))
    return np.where(move, m + b, m).astype(m.dtype)


def _floordiv(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """PyTorch's div_floor_floating: the quotient of a - fmod(a, b), one less where the
    signs differ, floored with a correction past .5, a zero carrying the sign of a / b,
    and a / b where b is 0. Integers (a constant divisor >= 1): numpy's floored division,
    exact."""
    if np.issubdtype(np.result_type(a, b), np.integer):
        return np.floor_divide(a, b)
    q = np.true_divide(a, b)
    m = np.fmod(a, b)
    d = (a - m) / b
    d = np.where((m != 0) & ((b < 0) != (m < 0)), d - 1, d)
    f = np.floor(d)
    f = np.where(d - f > 0.5, f + 1, f)
    f = np.where(d == 0, np.copysign(np.zeros_like(q), q), f)
    return np.where(b == 0, q, f).astype(q.dtype)


# Ops that only move bits (takes, concatenations, pads) run on every type the device
# stores; halves on GPU targets only (schema.half_facts)
MOVED = ("bool", "u8", "i8", "i16", "i32", "i64", "f32", "f64")
INDEX_DTYPES = ("i32", "i64")  # what a Take's index may be (PyTorch's index ops take these)


def _take(table: np.ndarray, index: np.ndarray) -> np.ndarray:
    """Rows of a 2-D table: ``out[i..., :] = table[index[i...], :]``. An index outside
    [0, rows) raises IndexError, as PyTorch's embedding and index_select do (neither takes
    negative indices)."""
    index = np.asarray(index)
    bad = (index < 0) | (index >= table.shape[0])
    if bad.any():
        raise IndexError(
            f"index {int(index[bad].flat[0])} is out of range for a table of {table.shape[0]} rows"
        )
    return table[index]


def _index_add(base: np.ndarray, index: np.ndarray, values: np.ndarray) -> np.ndarray:
    """``base`` with ``values[i, :]`` added to row ``index[i]`` for every i, in order (a
    negative index counts from the end, as PyTorch's index_put); an index outside
    [-rows, rows) raises IndexError, as PyTorch's does."""
    index = np.asarray(index).astype(np.int64)
    rows = base.shape[0]
    bad = (index < -rows) | (index >= rows)
    if bad.any():
        raise IndexError(
            f"index {int(index[bad].flat[0])} is out of range for a table of {rows} rows"
        )
    out = base.copy()
    with np.errstate(all="ignore"):
        np.add.at(out, np.where(index < 0, index + rows, index), values)
    return out


def _cat(a: np.ndarray, b: np.ndarray, dim: int) -> np.ndarray:
    return np.concatenate([a, b], axis=dim)


def _pad(x: np.ndarray, pads: tuple, value_bits: int) -> np.ndarray:
    widths = [(pads[2 * d], pads[2 * d + 1]) for d in range(x.ndim)]
    value = np.asarray(bits_float(value_bits)).astype(x.dtype)
    return np.pad(x, widths, constant_values=value)


def _unary(fn: Callable) -> Callable:
    def run(x: np.ndarray) -> np.ndarray:
        with np.errstate(all="ignore"):
            return fn(x).astype(x.dtype)

    return run


def _binary(fn: Callable) -> Callable:
    def run(a: np.ndarray, b: np.ndarray) -> np.ndarray:
        with np.errstate(all="ignore"):
            return fn(a, b)

    return run


def _ew(
    name,
    arity,
    expr,
    numpy,
    dtypes=DEVICE_FLOATS,
    aten=(),
    flops=1,
    out_dtype=None,
    doc="",
    int_expr=None,
):
    return Op(
        name,
        ELEMENTWISE,
        arity,
        (),
        tuple(aten),
        expr,
        numpy,
        tuple(dtypes),
        "broadcast" if arity > 1 else "same",
        out_dtype,
        flops,
        doc,
        int_expr=int_expr,
    )


OPS: tuple[Op, ...] = (
    # leaves
    Op("Input", LEAF, 0, (("name", "str"),), doc="a graph input"),
    Op("Param", LEAF, 0, (("name", "str"),), doc="a parameter (weight) input"),
    Op(
        "Scalar",
        LEAF,
        0,
        (("bits", "bits"), ("dtype", "str")),
        shape="scalar",
        doc="a rank-0 constant; the value is the float64 bit pattern (keeps -0.0 apart)",
    ),
    Op(
        "Arange",
        LEAF,
        0,
        (("start", "int"), ("step", "int"), ("n", "int"), ("dtype", "str")),
        aten=("aten.arange.default", "aten.arange.start", "aten.arange.start_step"),
        numpy=arange_values,
        shape="arange",
        doc="the constant [start, start + step, ...] (n values); integer start and step, "
        "every value exact in dtype",
    ),
    # elementwise, unary
    _ew(
        "Neg",
        1,
        "-{0}",
        _unary(np.negative),
        DEVICE_NUMERIC,
        ("aten.neg.default",),
        int_expr="neg_{it}({0})",
    ),
    _ew(
        "Abs",
        1,
        "abs({0})",
        _unary(np.abs),
        DEVICE_NUMERIC,
        ("aten.abs.default",),
        int_expr="abs_{it}({0})",
    ),
    _ew("Exp", 1, "math.exp({0})", _unary(np.exp), aten=("aten.exp.default",), flops=4),
    _ew("Log", 1, "math.log({0})", _unary(np.log), aten=("aten.log.default",), flops=4),
    _ew("Sqrt", 1, "math.sqrt({0})", _unary(np.sqrt), aten=("aten.sqrt.default",), flops=2),
    _ew(
        "Rsqrt",
        1,
        "{one} / math.sqrt({0})",
        _unary(lambda x: x.dtype.type(1) / np.sqrt(x)),
        aten=("aten.rsqrt.default",),
        flops=3,
    ),
    _ew(
        "Reciprocal",
        1,
        "{one} / {0}",
        _unary(lambda x: x.dtype.type(1) / x),
        aten=("aten.reciprocal.default",),
        flops=2,
    ),
    _ew("Log1p", 1, "math.log1p({0})", _unary(np.log1p), aten=("aten.log1p.default",), flops=5),
    _ew("Sin", 1, "math.sin({0})", _unary(np.sin), aten=("aten.sin.default",), flops=8),
    _ew("Cos", 1, "math.cos({0})", _unary(np.cos), aten=("aten.cos.default",), flops=8),
    _ew("Expm1", 1, "math.expm1({0})", _unary(np.expm1), aten=("aten.expm1.default",), flops=5),
    _ew("Tanh", 1, "math.tanh({0})", _unary(np.tanh), aten=("aten.tanh.default",), flops=6),
    # rounding to integral values: -0.0, infinities and NaN kept; Round is half to even
    # (PyTorch's round: nearbyint); integer operands stay PyTorch's (no device dtype)
    _ew("Floor", 1, "floor_{ft}({0})", _unary(np.floor), aten=("aten.floor.default",)),
    _ew("Ceil", 1, "ceil_{ft}({0})", _unary(np.ceil), aten=("aten.ceil.default",)),
    _ew("Trunc", 1, "trunc_{ft}({0})", _unary(np.trunc), aten=("aten.trunc.default",)),
    _ew("Round", 1, "rint_{ft}({0})", _unary(np.rint), aten=("aten.round.default",)),
    _ew("Erf", 1, "math.erf({0})", _erf, aten=("aten.erf.default",), flops=8),
    _ew(
        "Sigmoid",
        1,
        "{one} / ({one} + math.exp(-{0}))",
        _sigmoid,
        aten=("aten.sigmoid.default",),
        flops=6,
    ),
    _ew(
        "Relu",
        1,
        "({zero} if {0} < {zero} else {0})",
        _relu,
        DEVICE_NUMERIC,
        ("aten.relu.default",),
    ),
    _ew(
        "Gelu",
        1,
        "{0} * {half} * ({one} + math.erf({0} * {rsqrt2}))",
        _gelu,
        aten=("aten.gelu.default",),
        flops=12,
        doc="exact (erf) GELU",
    ),
    _ew(
        "GeluTanh",
        1,
        "{half} * {0} * ({one} + math.tanh({sqrt2pi} * ({0} + {c0447} * {0} * {0} * {0})))",
        _gelu_tanh,
        aten=("aten.gelu.default:tanh",),
        flops=12,
        doc="tanh-approximated GELU",
    ),
    _ew("Silu", 1, "{0} / ({one} + math.exp(-{0}))", _silu, aten=("aten.silu.default",), flops=7),
    # elementwise, binary
    _ew(
        "Add",
        2,
        "{0} + {1}",
        _binary(np.add),
        DEVICE_NUMERIC,
        ("aten.add.Tensor", "aten.add.Scalar"),
        int_expr="add_{it}({0}, {1})",
    ),
    _ew(
        "Sub",
        2,
        "{0} - {1}",
        _binary(np.subtract),
        DEVICE_NUMERIC,
        ("aten.sub.Tensor", "aten.sub.Scalar", "aten.rsub.Scalar"),
        int_expr="sub_{it}({0}, {1})",
    ),
    _ew(
        "Mul",
        2,
        "{0} * {1}",
        _binary(np.multiply),
        DEVICE_NUMERIC,
        ("aten.mul.Tensor", "aten.mul.Scalar"),
        int_expr="mul_{it}({0}, {1})",
    ),
    _ew(
        "Div", 2, "{0} / {1}", _div, DEVICE_FLOATS, ("aten.div.Tensor", "aten.div.Scalar"), flops=2
    ),
    # PyTorch's float fmod, remainder and floor division (expr.helpers spells them per
    # target); integer operands by a constant divisor only (CONSTANT_DIVISOR: a zero
    # divisor raises in PyTorch)
    _ew(
        "Fmod",
        2,
        "fmod_{ft}({0}, {1})",
        _binary(np.fmod),
        DEVICE_NUMERIC,  # integers by a constant divisor only (CONSTANT_DIVISOR)
        aten=("aten.fmod.Tensor", "aten.fmod.Scalar"),
        flops=8,
        int_expr="wrap_{it}(fmod_int({0}, {1}))",
    ),
    _ew(
        "Remainder",
        2,
        "remainder_{ft}({0}, {1})",
        _binary(_remainder),
        DEVICE_NUMERIC,  # integers by a constant divisor only (CONSTANT_DIVISOR)
        aten=("aten.remainder.Tensor", "aten.remainder.Scalar"),
        flops=10,
        int_expr="wrap_{it}({0} % {1})",
    ),
    _ew(
        "FloorDiv",
        2,
        "floordiv_{ft}({0}, {1})",
        _binary(_floordiv),
        DEVICE_NUMERIC,  # integers by a constant divisor only (CONSTANT_DIVISOR)
        aten=("aten.floor_divide.default",),
        flops=14,
        int_expr="wrap_{it}({0} // {1})",
    ),
    _ew(
        "Atan2",
        2,
        "math.atan2({0}, {1})",
        _binary(np.arctan2),
        aten=("aten.atan2.default",),
        flops=10,
    ),
    _ew(
        "Maximum", 2, "max_nan({0}, {1})", _binary(_max), DEVICE_NUMERIC, ("aten.maximum.default",)
    ),
    _ew(
        "Minimum", 2, "min_nan({0}, {1})", _binary(_min), DEVICE_NUMERIC, ("aten.minimum.default",)
    ),
    # torch.clamp's bounds (x, then the bound): x is kept on a tie, unlike maximum and
    # minimum, whose zero ties PyTorch's own kernels resolve differently per path
    _ew(
        "ClampMin",
        2,
        "({1} if ({0} < {1} or {1} != {1}) else {0})",
        _binary(_clamp_min),
        DEVICE_NUMERIC,
        flops=2,
    ),
    _ew(
        "ClampMax",
        2,
        "({1} if ({0} > {1} or {1} != {1}) else {0})",
        _binary(_clamp_max),
        DEVICE_NUMERIC,
        flops=2,
    ),
    _ew(
        "Pow",
        2,
        "{0} ** {1}",
        _binary(np.power),
        DEVICE_FLOATS,
        ("aten.pow.Tensor_Scalar", "aten.pow.Tensor_Tensor", "aten.pow.Scalar"),
        flops=8,
    ),
    _ew(
        "Gt",
        2,
        "{0} > {1}",
        _binary(np.greater),
        DEVICE_NUMERIC,
        ("aten.gt.Tensor", "aten.gt.Scalar"),
        out_dtype="bool",
    ),
    _ew(
        "Lt",
        2,
        "{0} < {1}",
        _binary(np.less),
        DEVICE_NUMERIC,
        ("aten.lt.Tensor", "aten.lt.Scalar"),
        out_dtype="bool",
    ),
    _ew(
        "Ge",
        2,
        "{0} >= {1}",
        _binary(np.greater_equal),
        DEVICE_NUMERIC,
        ("aten.ge.Tensor", "aten.ge.Scalar"),
        out_dtype="bool",
    ),
    _ew(
        "Le",
        2,
        "{0} <= {1}",
        _binary(np.less_equal),
        DEVICE_NUMERIC,
        ("aten.le.Tensor", "aten.le.Scalar"),
        out_dtype="bool",
    ),
    _ew(
        "Eq",
        2,
        "{0} == {1}",
        _binary(np.equal),
        DEVICE_ALL,
        ("aten.eq.Tensor", "aten.eq.Scalar"),
        out_dtype="bool",
    ),
    _ew(
        "Ne",
        2,
        "{0} != {1}",
        _binary(np.not_equal),
        DEVICE_ALL,
        ("aten.ne.Tensor", "aten.ne.Scalar"),
        out_dtype="bool",
    ),
    # elementwise, ternary
    # fused multiply-add (what PyTorch's addcmul/lerp decompositions emit): float32 operands
    # in float64, where the product is exact (24 + 24 bits < 53) and cannot overflow, one
    # rounding of the sum, one to float32. That is fma(a, b, c) but for a tie of the second
    # rounding (1 ulp); infinities and NaN as fma's: a * b that would overflow float32 does
    # not, so a finite huge product plus -inf is -inf, as fused. float32 only.
    _ew(
        "Fma",
        3,
        "np.float32(np.float64({0}) * np.float64({1}) + np.float64({2}))",
        _fma,
        ("f32",),
        ("prims.fma.default",),
        flops=2,
    ),
    _ew(
        "Where",
        3,
        "({1} if {0} else {2})",
        lambda c, a, b: np.where(c, a, b),
        DEVICE_ALL,
        ("aten.where.self",),
    ),
    Op(
        "Cast",
        ELEMENTWISE,
        1,
        (("dtype", "str"),),
        ("aten._to_copy.default",),
        "{cast}({0})",
        None,
        DEVICE_ALL,
        "same",
        None,
        1,
        "dtype conversion",
    ),
    # reductions: (x, dims, keepdim)
    Op(
        "Sum",
        REDUCTION,
        1,
        (("dims", "ints"), ("keepdim", "int")),
        ("aten.sum.dim_IntList",),
        None,
        np.sum,
        ("bool", *DEVICE_NUMERIC),  # bools sum to int64, as in PyTorch
        "reduce",
    ),
    Op(
        "Mean",
        REDUCTION,
        1,
        (("dims", "ints"), ("keepdim", "int")),
        ("aten.mean.dim",),
        None,
        np.mean,
        DEVICE_FLOATS,
        "reduce",
    ),
    Op(
        "Amax",
        REDUCTION,
        1,
        (("dims", "ints"), ("keepdim", "int")),
        ("aten.amax.default",),
        None,
        np.max,
        DEVICE_NUMERIC,
        "reduce",
    ),
    Op(
        "Amin",
        REDUCTION,
        1,
        (("dims", "ints"), ("keepdim", "int")),
        ("aten.amin.default",),
        None,
        np.min,
        DEVICE_NUMERIC,
        "reduce",
    ),
    Op(
        "Prod",
        REDUCTION,
        1,
        (("dims", "ints"), ("keepdim", "int")),
        ("aten.prod.dim_int",),
        None,
        np.prod,
        DEVICE_NUMERIC,
        "reduce",
    ),
    Op(
        "Var",
        REDUCTION,
        1,
        (("dims", "ints"), ("correction", "int"), ("keepdim", "int")),
        ("aten.var.correction",),
        None,
        None,
        (),
        "reduce",
        doc="variance; decomposes into Mean and elementwise ops",
    ),
    # composite ops that decompose into the ones above
    Op("Softmax", NORMALIZATION, 1, (("dim", "int"),), ("aten._softmax.default",)),
    Op("LogSoftmax", NORMALIZATION, 1, (("dim", "int"),), ("aten._log_softmax.default",)),
    Op(
        "LayerNorm",
        NORMALIZATION,
        3,
        (("dims", "ints"), ("eps", "bits")),
        ("aten.native_layer_norm.default",),
        doc="x, weight, bias; normalised over dims",
    ),
    Op(
        "BatchNormInf",
        NORMALIZATION,
        5,
        (("eps", "bits"),),
        ("aten._native_batch_norm_legit_no_training.default",),
        doc="x, weight, bias, running mean, running var; channels on axis 1",
    ),
    # movement: views of their operand
    Op(
        "View",
        MOVEMENT,
        1,
        (("shape", "ints"),),
        ("aten.view.default", "aten._unsafe_view.default", "aten.reshape.default"),
        shape="view",
    ),
    Op("Permute", MOVEMENT, 1, (("perm", "ints"),), ("aten.permute.default",), shape="permute"),
    Op("Expand", MOVEMENT, 1, (("shape", "ints"),), ("aten.expand.default",), shape="expand"),
    Op(
        "Slice",
        MOVEMENT,
        1,
        (("dim", "int"), ("start", "int"), ("end", "int"), ("step", "int")),
        ("aten.slice.Tensor",),
        shape="slice",
        doc="x[start:end:step] along dim (a view)",
    ),
    # library calls
    Op("MatMul", MATMUL, 2, (), ("aten.mm.default",), dtypes=DEVICE_FLOATS, shape="matmul"),
    Op("BatchMatMul", MATMUL, 2, (), ("aten.bmm.default",), dtypes=DEVICE_FLOATS, shape="bmm"),
    Op(
        "Addmm",
        MATMUL,
        3,
        (),
        ("aten.addmm.default",),
        dtypes=DEVICE_FLOATS,
        shape="addmm",
        doc="bias + a @ b with alpha = beta = 1 (other values stay opaque)",
    ),
    Op(
        "Conv2d",
        CONVOLUTION,
        3,
        (("stride", "ints"), ("padding", "ints"), ("dilation", "ints"), ("groups", "int")),
        ("aten.convolution.default",),
        dtypes=DEVICE_FLOATS,
        shape="conv2d",
    ),
    Op(
        "Conv2dNoBias",
        CONVOLUTION,
        2,
        (("stride", "ints"), ("padding", "ints"), ("dilation", "ints"), ("groups", "int")),
        (),
        dtypes=DEVICE_FLOATS,
        shape="conv2d",
    ),
    # rows of a table (embedding, index_select along the first axis, x[index])
    Op(
        "Take",
        GATHER,
        2,
        (),
        (),
        numpy=_take,
        dtypes=MOVED,
        shape="take",
        doc="table[index] along a 2-D table's first axis; an index out of range raises",
    ),
    # rows added into a table (index_put with accumulate: an embedding's gradient)
    Op(
        "IndexAdd",
        SCATTER,
        3,
        (),
        (),
        numpy=_index_add,
        dtypes=("i32", "i64", "f32", "f64"),
        shape="index_add",
        doc="base with values[i] added to row index[i] (a negative index from the end); "
        "an index out of range raises",
    ),
    Op(
        "Cat",
        COPY,
        2,
        (("dim", "int"),),
        (),
        numpy=_cat,
        dtypes=MOVED,
        shape="cat",
        doc="a and b joined along dim (the importer folds longer concatenations)",
    ),
    Op(
        "Pad",
        COPY,
        1,
        (("pads", "ints"), ("value", "bits")),
        (),
        numpy=_pad,
        dtypes=MOVED,
        shape="pad",
        doc="x with (before, after) elements of value around each axis, axis 0 first",
    ),
    # custom ops found by opt-in patterns
    Op(
        "RMSNorm",
        CUSTOM,
        2,
        (("eps", "bits"),),
        (),
        # the device kernel (saturn::rmsnorm, device/library) is float32; float64 stays
        # the written-out ops
        dtypes=("f32",),
        shape="same",
        doc="x * rsqrt(mean(x*x, -1) + eps) * weight",
    ),
)

BY_NAME: dict[str, Op] = {op.name: op for op in OPS}
BY_ATEN: dict[str, Op] = {a: op for op in OPS for a in op.aten}

# Device-level constructors (kernels, crossings); not rows of graph-level ops but named here
# so the schema and the consumers agree on them.
KERNEL_KINDS = (
    "Loop",
    "Reduce",
    "Gemm",
    "Conv",
    "Gather",
    "ScatterAdd",
    "Concat",
    "PadCopy",
    "Custom",
)
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
