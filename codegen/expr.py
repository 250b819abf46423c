"""Rendering kernel bodies as scalar code, shared by the CPU and CUDA emitters.

Each body node becomes one statement assigning a local named after the value it holds
(``exp_3 = math.exp(sub_2)``); constants are written in the kernel's element type
(``np.float32(0.5)``), so a float32 kernel has no double-precision arithmetic.
"""

from __future__ import annotations

import math

from saturn.eqsat import optable as ot
from saturn.eqsat.graph import bits_float

NUMBA_TYPE = {
    "bool": "np.bool_",
    "u8": "np.uint8",
    "i8": "np.int8",
    "i16": "np.int16",
    "i32": "np.int32",
    "i64": "np.int64",
    "f16": "np.float16",
    "f32": "np.float32",
    "f64": "np.float64",
}

# Named constants the op table's templates use, by value.
NAMED = {
    "one": 1.0,
    "zero": 0.0,
    "half": 0.5,
    "rsqrt2": 1 / math.sqrt(2),
    "sqrt2pi": math.sqrt(2 / math.pi),
    "c0447": 0.044715,
}


# Rounding to an integral value, spelled per target (the op table writes ``floor_f32(x)``
# and the like). Numba's ``math.floor`` returns an integer on the CPU (Python's rule) but a
# float on CUDA, and CUDA device code has no numpy ufuncs; the CUDA simulator runs Python's
# math, whose floor of NaN raises. Every spelling keeps -0.0, infinities and NaN, and
# rint rounds halves to even (PyTorch's round: nearbyint).
ROUNDING = ("floor", "ceil", "trunc", "rint")
_NUMPY_ROUNDING = {r: f"np.{r}(x)" for r in ROUNDING}
_CUDA_ROUNDING = {
    "f32": {
        "floor": "math.floor(x)",
        "ceil": "math.ceil(x)",
        "trunc": "math.trunc(x)",
        "rint": "libdevice.rintf(x)",
    },
    "f64": {
        "floor": "math.floor(x)",
        "ceil": "math.ceil(x)",
        "trunc": "math.trunc(x)",
        "rint": "libdevice.rint(x)",
    },
}


# Float to integer conversion, as each platform's eager PyTorch does it where the value
# does not fit (C++ leaves it undefined, and so does LLVM's fptosi, whose result Numba
# would hand on as poison): written out with comparisons, so the result is the same
# whatever the optimiser does. "x86" (saturn:0, PyTorch's CPU kernels): truncation, and
# the integer indefinite (the lowest int32, or int64) for NaN and out-of-range values;
# int8, int16 and uint8 go through int32 and keep its low bits. "cuda" (PyTorch's CUDA
# kernels, cvt.rzi): saturation to the type's range, NaN to 0 (float32 to int32) or to
# the lowest int (float64 to int32, either to int64); the narrow types go through int32
# and keep its low bits (measured on the H200 against eager CUDA, decision 0051).
INT_RANGE = {"i32": (-(2**31), 2**31 - 1), "i64": (-(2**63), 2**63 - 1)}
NARROW_INTS = ("u8", "i8", "i16")


def float_to_int(target_dtype: str, ft: str) -> str:
    """The helper converting a float of compute type ``ft`` to ``target_dtype``."""
    return f"to_{target_dtype}_{ft}"


def cast_helpers(decorator: str, semantics: str) -> str:
    out = []
    for ft in ("f32", "f64"):
        t = NUMBA_TYPE[ft]
        for it in ("i32", "i64"):
            lo, hi = INT_RANGE[it]
            it_t = NUMBA_TYPE[it]
            # the range test in the compute type: 2^31 and 2^63 are exact in both, and
            # -2^31 - 1 exists only in float64 (in float32 the test is x >= -2^31)
            above = f"x < {t}({float(hi + 1)!r})"
            below = (
                f"x > {t}({float(lo - 1)!r})"
                if it == "i32" and ft == "f64"
                else f"x >= {t}({float(lo)!r})"
            )
            if semantics == "x86":
                body = (
                    f"    if {below} and {above}:\n        return {it_t}(x)\n"
                    f"    return {it_t}({lo})\n"
                )
            else:
                # NaN: 0 from float32 to int32, the lowest int from float64 to int32 and
                # from either to int64 (eager CUDA, measured on the H200)
                nan = 0 if (it, ft) == ("i32", "f32") else lo
                body = (
                    f"    if x != x:\n        return {it_t}({nan})\n"
                    f"    if not {above}:\n        return {it_t}({hi})\n"
                    f"    if not {below}:\n        return {it_t}({lo})\n"
                    f"    return {it_t}(x)\n"
                )
            out.append(f"\n{decorator}\ndef {float_to_int(it, ft)}(x):\n{body}")
        for nt in NARROW_INTS:
            out.append(
                f"\n{decorator}\ndef {float_to_int(nt, ft)}(x):\n"
                f"    return {NUMBA_TYPE[nt]}({float_to_int('i32', ft)}(x))\n"
            )
    return "".join(out)


def int_helpers(decorator: str) -> str:
    """Integer arithmetic that wraps in its type, two's complement, as PyTorch's does:
    8-, 16- and 32-bit operands are widened to int64, where no sum, difference or product
    of two of them overflows, and truncated back (LLVM's trunc: the low bits); int64 goes
    through uint64, whose overflow is defined (modulo 2^64), and back. ``wrap_<t>`` is the
    truncation alone (a floored ``%`` or ``//`` computed wider). ``fmod_int`` is C's
    truncating remainder from the floored one, for a divisor b >= 1 (the only integer
    divisors the op table admits): a negative dividend with a nonzero floored remainder r
    has the truncated remainder r - b."""
    out = [
        f"\n{decorator}\ndef fmod_int(a, b):\n    r = a % b\n"
        "    return r - b if r != 0 and a < 0 else r\n"
    ]
    for it in ("u8", "i8", "i16", "i32", "i64"):
        t = NUMBA_TYPE[it]
        w = "np.uint64" if it == "i64" else "np.int64"
        for name, op in (("add", "+"), ("sub", "-"), ("mul", "*")):
            out.append(
                f"\n{decorator}\ndef {name}_{it}(a, b):\n    return {t}({w}(a) {op} {w}(b))\n"
            )
        out.append(f"\n{decorator}\ndef neg_{it}(a):\n    return {t}({w}(0) - {w}(a))\n")
        out.append(
            f"\n{decorator}\ndef abs_{it}(a):\n    return a if a >= {t}(0) else neg_{it}(a)\n"
        )
        out.append(f"\n{decorator}\ndef wrap_{it}(a):\n    return {t}(a)\n")
    return "".join(out)


def helpers(decorator: str, target: str = "numpy", casts: str = "x86") -> str:
    """NaN-propagating max and min (as torch.maximum/minimum), the rounding functions
    (``floor_f32`` ... ``rint_f64``) and float-to-integer conversions (``to_i32_f32`` ...,
    with ``casts`` semantics: "x86" or "cuda"), as functions under ``decorator`` (a Numba
    njit or CUDA device-function decorator line). ``target`` "cuda" spells rounding for
    CUDA device code, "numpy" for the CPU and the CUDA simulator."""
    out = [cast_helpers(decorator, casts), int_helpers(decorator)]
    for name, cmp in (("max_nan", ">"), ("min_nan", "<")):
        out.append(
            f"\n{decorator}\ndef {name}(a, b):\n    if a != a:\n        return a\n"
            f"    if b != b:\n        return b\n    return a if a {cmp} b else b\n"
        )
    if target == "cuda":
        out.append("\nfrom numba.cuda import libdevice\n")
    for ft in ("f32", "f64"):
        for r in ROUNDING:
            expr = _CUDA_ROUNDING[ft][r] if target == "cuda" else _NUMPY_ROUNDING[r]
            out.append(f"\n{decorator}\ndef {r}_{ft}(x):\n    return {expr}\n")
        fmod = "math.fmod(a, b)" if target == "cuda" else "np.fmod(a, b)"
        out.append(_division_helpers(decorator, ft, fmod))
    return "\n".join(out)


def _division_helpers(decorator: str, ft: str, fmod: str) -> str:
    """fmod, PyTorch's float remainder (the sign of the divisor: fmod's result moved by b
    where the signs differ, a zero result keeping fmod's sign) and floor division (its
    div_floor_floating: the quotient of a - fmod(a, b), one less where the signs differ,
    floored with a correction past .5, a zero quotient carrying the sign of a / b; b = 0
    gives a / b). Constants in the compute type, so float32 stays float32."""
    t = NUMBA_TYPE[ft]
    zero, one, half = (f"{t}({v})" for v in (0.0, 1.0, 0.5))
    return f"""
{decorator}
def fmod_{ft}(a, b):
    return {fmod}


{decorator}
def remainder_{ft}(a, b):
    m = fmod_{ft}(a, b)
    if m != {zero} and ((b < {zero}) != (m < {zero})):
        m = m + b
    return m


{decorator}
def floordiv_{ft}(a, b):
    if b == {zero}:
        return a / b
    m = fmod_{ft}(a, b)
    d = (a - m) / b
    if m != {zero} and ((b < {zero}) != (m < {zero})):
        d = d - {one}
    if d == {zero}:
        return math.copysign({zero}, a / b)
    f = floor_{ft}(d)
    if d - f > {half}:
        f = f + {one}
    return f
"""


def literal(value: float, dtype: str) -> str:
    """A constant in ``dtype``: never a bare Python float in a float32 kernel."""
    if dtype in ("f16", "bf16"):  # half values are held in float32 inside kernels
        dtype = "f32"
    t = NUMBA_TYPE[dtype]
    if dtype == "bool":
        return f"{t}({bool(value)})"
    if dtype in ot.FLOATS:
        if math.isnan(value):
            return f"{t}(np.nan)"
        if math.isinf(value):
            return f"{t}({'' if value > 0 else '-'}np.inf)"
        return f"{t}({float(value)!r})"
    return f"{t}({int(value)})"


class BodyWriter:
    """Turns a body tree into statements; ``operand(i)`` names how operand i is read."""

    def __init__(self, operand, dtype_of_operand, tag: str = "", stage=None):
        self.operand = operand
        self.dtype_of_operand = dtype_of_operand
        self.stage = stage  # j -> (variable, dtype) of a rows kernel's stage j
        self.tag = tag  # suffix that keeps names apart when one kernel writes a body twice
        self.lines: list[str] = []
        self.count = 0
        self.memo: dict[tuple, tuple[str, str]] = {}

    def fresh(self, stem: str) -> str:
        self.count += 1
        return f"{stem}_{self.count}{self.tag}"

    def emit(self, e: tuple) -> tuple[str, str]:
        """Statements for ``e``; returns (variable, dtype). Equal subtrees are computed once."""
        if e in self.memo:
            return self.memo[e]
        out = self._emit(e)
        self.memo[e] = out
        return out

    def _emit(self, e: tuple) -> tuple[str, str]:
        if e[0] == "in":
            return self.operand(e[1]), self.dtype_of_operand(e[1])
        if e[0] == "stage":
            return self.stage(e[1])
        if e[0] == "const":
            return literal(bits_float(e[1]), e[2]), e[2]
        if e[0] == "cast":
            v, src = self.emit(e[1])
            name = self.fresh("cast")
            if e[2] in ("f16", "bf16"):  # held in float32, rounded to the half type
                self.lines.append(f"{name} = {e[2]}_round({v})")
                return name, "f32"
            if src in ot.FLOATS and e[2] in ot.INTS:  # defined where it does not fit
                ft = "f64" if src == "f64" else "f32"
                self.lines.append(f"{name} = {float_to_int(e[2], ft)}({v})")
            else:
                self.lines.append(f"{name} = {NUMBA_TYPE[e[2]]}({v})")
            return name, e[2]
        row = ot.op({o.name.lower(): o.name for o in ot.elementwise()}[e[0]])
        args = [self.emit(c) for c in e[1:]]
        dtype = row.out_dtype or args[1 if row.name == "Where" else 0][1]
        const_t = args[1 if row.name == "Where" else 0][1]
        consts = {k: literal(v, const_t) for k, v in NAMED.items()}
        ft = "f64" if const_t == "f64" else "f32"  # the compute type's rounding helpers
        template = row.int_expr if row.int_expr and const_t in ot.INTS else row.expr
        code = template.format(*[a for a, _ in args], **consts, cast="", ft=ft, it=const_t)
        name = self.fresh(row.name.lower())
        self.lines.append(f"{name} = {code}")
        return name, dtype
