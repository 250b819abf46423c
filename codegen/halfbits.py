"""The bits of a float32 as a uint32 and back, for CUDA kernels that keep bfloat16 in
memory: ``f32_bits(x)`` and ``bits_f32(u)`` are one LLVM bitcast each (no instruction).

Numba has no bfloat16 type and no bitcast between float and integer scalars. A bfloat16
is the upper half of a float32, so a kernel loads its 16 bits as a uint16 and widens them
with ``bits_f32(u << 16)``, and stores a float32 rounded to nearest even through
``f32_bf16``. Under Numba's CUDA simulator (CI, no GPU) the same names are numpy views.

``f32_bf16(x)`` is the bits of the bfloat16 nearest a float32 (ties to even; any NaN to
0x7FFF, as PyTorch's CUDA conversion stores it). From compute capability 8.0 it is the
hardware's one conversion, ``cvt.rn.bf16.f32``, as inline PTX (libNVVM has no bfloat16
intrinsic); for an older target, and under the simulator, the same in 32-bit integer arithmetic
(written in Python, Numba widens it to 64 bits: a bfloat16 GELU-and-add loop was 713 PTX
instructions against 393 in float32, decision 0114).
"""

from __future__ import annotations

import numpy as np
from numba import config

__all__ = ["bits_f32", "f32_bf16", "f32_bits"]

NAN = 0x7FFF  # the bfloat16 NaN cvt.rn.bf16.f32 stores (PyTorch's CPU conversion: 0xFFFF)


def _simulated():
    def f32_bits(x):
        return np.array([x], dtype=np.float32).view(np.uint32)[0]

    def bits_f32(u):
        return np.array([int(u) & 0xFFFFFFFF], dtype=np.uint32).view(np.float32)[0]

    def f32_bf16(x):
        b = int(f32_bits(np.float32(x)))
        if (b & 0x7FFFFFFF) > 0x7F800000:
            return np.uint16(NAN)
        return np.uint16((b + 0x7FFF + ((b >> 16) & 1)) >> 16)

    return f32_bits, bits_f32, f32_bf16


def _hardware_bf16() -> bool:
    """Whether the kernel being built has ``cvt.rn.bf16.f32``: its target as ``cubins.ptx``
    builds it (every generated kernel is built there); a build outside it is taken to be
    for 8.0 or newer, as every GPU saturn runs on is."""
    from .cubins import HARDWARE_BF16, _building

    cc = getattr(_building, "cc", None)
    return cc is None or cc >= HARDWARE_BF16


def _compiled():
    from llvmlite import ir
    from numba import types
    from numba.cuda.extending import intrinsic

    def bitcast(kind, src, dst):
        """An intrinsic taking any ``kind`` scalar (converted to ``src`` first, as Numba's
        integer arithmetic widens to 64 bits) and returning its bits as ``dst``."""

        @intrinsic
        def cast(typingctx, x):
            if not isinstance(x, kind):
                return None

            def codegen(context, builder, sig, args):
                v = context.cast(builder, args[0], sig.args[0], src)
                return builder.bitcast(v, context.get_value_type(dst))

            return dst(x), codegen

        return cast

    @intrinsic
    def f32_bf16(typingctx, x):
        if not isinstance(x, types.Float):
            return None

        def codegen(context, builder, sig, args):
            v = context.cast(builder, args[0], sig.args[0], types.float32)
            i16, i32 = ir.IntType(16), ir.IntType(32)
            if _hardware_bf16():
                fn = ir.FunctionType(i16, [ir.FloatType()])
                return builder.call(ir.InlineAsm(fn, "cvt.rn.bf16.f32 $0, $1;", "=h,f"), [v])
            b = builder.bitcast(v, i32)
            odd = builder.and_(builder.lshr(b, ir.Constant(i32, 16)), ir.Constant(i32, 1))
            up = builder.add(builder.add(b, ir.Constant(i32, 0x7FFF)), odd)
            bits = builder.trunc(builder.lshr(up, ir.Constant(i32, 16)), i16)
            nan = builder.fcmp_unordered("uno", v, v)
            return builder.select(nan, ir.Constant(i16, NAN), bits)

        return types.uint16(x), codegen

    return (
        bitcast(types.Float, types.float32, types.uint32),
        bitcast(types.Integer, types.uint32, types.float32),
        f32_bf16,
    )


f32_bits, bits_f32, f32_bf16 = _simulated() if config.ENABLE_CUDASIM else _compiled()
