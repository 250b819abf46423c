"""The bits of a float32 as a uint32 and back, for CUDA kernels that keep bfloat16 in
memory: ``f32_bits(x)`` and ``bits_f32(u)`` are one LLVM bitcast each (no instruction).

Numba has no bfloat16 type and no bitcast between float and integer scalars. A bfloat16
is the upper half of a float32, so a kernel loads its 16 bits as a uint16 and widens them
with ``bits_f32(u << 16)``, and stores a float32 rounded to nearest even through
``f32_bits``. Under Numba's CUDA simulator (CI, no GPU) the same names are numpy views.
"""

from __future__ import annotations

import numpy as np
from numba import config

__all__ = ["bits_f32", "f32_bits"]


def _simulated():
    def f32_bits(x):
        return np.array([x], dtype=np.float32).view(np.uint32)[0]

    def bits_f32(u):
        return np.array([int(u) & 0xFFFFFFFF], dtype=np.uint32).view(np.float32)[0]

    return f32_bits, bits_f32


def _compiled():
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

    return (
        bitcast(types.Float, types.float32, types.uint32),
        bitcast(types.Integer, types.uint32, types.float32),
    )


f32_bits, bits_f32 = _simulated() if config.ENABLE_CUDASIM else _compiled()
