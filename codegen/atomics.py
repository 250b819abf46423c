"""An atomic add through a typed pointer for CUDA kernels: ``atomic_add(ptr, i, v)`` adds
``v`` to element ``i`` of ``ptr`` as one atomic read-modify-write (``atom.global.add``).

Numba's ``cuda.atomic.add`` takes arrays; saturn's kernels take raw typed pointers (so a
launch passes addresses, not array descriptors). This intrinsic emits the same
instructions Numba's own lowering does: NVVM's atomic float add for float32 and float64
(native on sm_60 and later), an LLVM ``atomicrmw add`` for integers.

Under Numba's CUDA simulator (CI, no GPU) it is a plain add on the array, which is what the
simulator's serial threads need.
"""

from __future__ import annotations

from numba import config

__all__ = ["atomic_add"]


def _simulated():
    def atomic_add(a, i, v):
        a[i] += v

    return atomic_add


def _compiled():
    from numba import types
    from numba.cuda import nvvmutils
    from numba.cuda.extending import intrinsic

    @intrinsic
    def atomic_add(typingctx, ptr, idx, val):
        if not isinstance(ptr, types.CPointer) or not isinstance(idx, types.Integer):
            return None
        dtype = ptr.dtype
        if dtype not in (types.float32, types.float64, types.int32, types.int64):
            return None

        def codegen(context, builder, sig, args):
            p, i, v = args
            i = context.cast(builder, i, sig.args[1], types.int64)
            v = context.cast(builder, v, sig.args[2], dtype)
            at = builder.gep(p, [i])
            if dtype == types.float32:
                builder.call(nvvmutils.declare_atomic_add_float32(builder.module), (at, v))
            elif dtype == types.float64:
                builder.call(nvvmutils.declare_atomic_add_float64(builder.module), (at, v))
            else:
                builder.atomic_rmw("add", at, v, "monotonic")
            return context.get_dummy_value()

        return types.void(ptr, idx, val), codegen

    return atomic_add


atomic_add = _simulated() if config.ENABLE_CUDASIM else _compiled()
