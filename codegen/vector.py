"""Vector loads and stores for CUDA kernels: ``vload{2,4,8}(ptr, i)`` reads elements
``i .. i+L-1`` of a typed pointer as one ``ld.global.v{L}`` instruction, ``vstore{2,4,8}(ptr,
i, *values)`` writes them as one ``st.global.v{L}``. Eight 2-byte elements (the half types'
16 bytes) move as four 32-bit words, two elements each (the lower address in the low half:
the GPU is little-endian), since LLVM splits an eight-lane 16-bit vector into two 8-byte
accesses.

Numba loads arrays, records and its vector types element by element and cannot declare a
pointer's alignment, so a float32 kernel never issues a 16-byte access. These intrinsics emit
the LLVM vector load with the alignment stated (L x element size); the caller guarantees it
(the launcher checks every pointer and index before choosing a vector kernel).

Under Numba's CUDA simulator (CI, no GPU) the same names are plain Python functions over
arrays, so generated kernels run unchanged there.
"""

from __future__ import annotations

from numba import config

__all__ = ["vload2", "vload4", "vload8", "vstore2", "vstore4", "vstore8"]


def _simulated():
    def vload2(a, i):
        return a[i], a[i + 1]

    def vload4(a, i):
        return a[i], a[i + 1], a[i + 2], a[i + 3]

    def vstore2(a, i, v0, v1):
        a[i] = v0
        a[i + 1] = v1

    def vstore4(a, i, v0, v1, v2, v3):
        a[i] = v0
        a[i + 1] = v1
        a[i + 2] = v2
        a[i + 3] = v3

    def vload8(a, i):
        return tuple(a[i + k] for k in range(8))

    def vstore8(a, i, *v):
        for k in range(8):
            a[i + k] = v[k]

    return vload2, vload4, vload8, vstore2, vstore4, vstore8


def _compiled():
    from llvmlite import ir
    from numba import types
    from numba.cuda.extending import intrinsic

    def _vector_ptr(context, builder, ptr_ty, ptr, idx, lanes):
        elem = context.get_value_type(ptr_ty.dtype)
        at = builder.gep(ptr, [idx])
        return builder.bitcast(at, ir.VectorType(elem, lanes).as_pointer()), elem

    def make_load(lanes: int):
        @intrinsic
        def vload(typingctx, ptr, idx):
            if not isinstance(ptr, types.CPointer) or not isinstance(idx, types.Integer):
                return None
            ret = types.UniTuple(ptr.dtype, lanes)

            def codegen(context, builder, sig, args):
                p, i = args
                i = context.cast(builder, i, sig.args[1], types.int64)
                elem = context.get_value_type(sig.args[0].dtype)
                size = context.get_abi_sizeof(elem)
                if lanes == 8 and size == 2:
                    vals = _load_words(builder, p, i, elem)
                else:
                    vp, _ = _vector_ptr(context, builder, sig.args[0], p, i, lanes)
                    vec = builder.load(vp, align=lanes * size)
                    vals = [
                        builder.extract_element(vec, ir.Constant(ir.IntType(32), k))
                        for k in range(lanes)
                    ]
                return context.make_tuple(builder, sig.return_type, vals)

            return ret(ptr, idx), codegen

        return vload

    i32 = ir.IntType(32)

    def _load_words(builder, p, i, elem):
        """Eight 16-bit elements as one 16-byte load of four words."""
        vp = builder.bitcast(builder.gep(p, [i]), ir.VectorType(i32, 4).as_pointer())
        vec = builder.load(vp, align=16)
        vals = []
        for k in range(4):
            w = builder.extract_element(vec, ir.Constant(i32, k))
            vals.append(builder.trunc(w, elem))
            vals.append(builder.trunc(builder.lshr(w, ir.Constant(i32, 16)), elem))
        return vals

    def _store_words(builder, p, i, vals):
        vp = builder.bitcast(builder.gep(p, [i]), ir.VectorType(i32, 4).as_pointer())
        vec = ir.Constant(ir.VectorType(i32, 4), ir.Undefined)
        for k in range(4):
            lo = builder.zext(vals[2 * k], i32)
            hi = builder.shl(builder.zext(vals[2 * k + 1], i32), ir.Constant(i32, 16))
            vec = builder.insert_element(vec, builder.or_(lo, hi), ir.Constant(i32, k))
        builder.store(vec, vp, align=16)

    def store_codegen(lanes: int):
        def codegen(context, builder, sig, args):
            p, i, vals = args[0], args[1], args[2:]
            i = context.cast(builder, i, sig.args[1], types.int64)
            elem = context.get_value_type(sig.args[0].dtype)
            if lanes == 8 and context.get_abi_sizeof(elem) == 2:
                cast = [
                    context.cast(builder, v, t, sig.args[0].dtype)
                    for v, t in zip(vals, sig.args[2:], strict=True)
                ]
                _store_words(builder, p, i, cast)
                return context.get_dummy_value()
            vp, elem = _vector_ptr(context, builder, sig.args[0], p, i, lanes)
            vec = ir.Constant(ir.VectorType(elem, lanes), ir.Undefined)
            for k, (v, t) in enumerate(zip(vals, sig.args[2:], strict=True)):
                v = context.cast(builder, v, t, sig.args[0].dtype)
                vec = builder.insert_element(vec, v, ir.Constant(ir.IntType(32), k))
            builder.store(vec, vp, align=lanes * context.get_abi_sizeof(elem))
            return context.get_dummy_value()

        return codegen

    def _store_ok(ptr, idx) -> bool:
        return isinstance(ptr, types.CPointer) and isinstance(idx, types.Integer)

    @intrinsic
    def vstore2(typingctx, ptr, idx, v0, v1):
        if not _store_ok(ptr, idx):
            return None
        return types.none(ptr, idx, v0, v1), store_codegen(2)

    @intrinsic
    def vstore4(typingctx, ptr, idx, v0, v1, v2, v3):
        if not _store_ok(ptr, idx):
            return None
        return types.none(ptr, idx, v0, v1, v2, v3), store_codegen(4)

    @intrinsic
    def vstore8(typingctx, ptr, idx, v0, v1, v2, v3, v4, v5, v6, v7):
        if not _store_ok(ptr, idx):
            return None
        return types.none(ptr, idx, v0, v1, v2, v3, v4, v5, v6, v7), store_codegen(8)

    return make_load(2), make_load(4), make_load(8), vstore2, vstore4, vstore8


vload2, vload4, vload8, vstore2, vstore4, vstore8 = (
    _simulated() if config.ENABLE_CUDASIM else _compiled()
)
