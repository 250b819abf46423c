"""What the operation table (``eqsat/optable.py``) is written with: the dtypes and their
facts (numpy types, sizes, which ops take floats only or a constant divisor), the categories
and attribute kinds, the row type ``Op``, and the numpy references rows point at.
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
# convolutions on half operands: cuDNN, float32 accumulation (the fact covers Conv2dNoBias),
# and their gradients (cuDNN's backward-data and backward-filter, as eager CUDA's)
HALF_CONVS = ("Conv2d", "ConvInputGrad", "ConvWeightGrad")

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


def _roll(x: np.ndarray, shifts: tuple) -> np.ndarray:
    """``x`` rolled by ``shifts[d]`` along every axis d (``out[i] = x[(i - s) mod n]``)."""
    return np.roll(x, tuple(shifts), axis=tuple(range(x.ndim))) if x.ndim else x.copy()


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
