"""Vector loads and stores for CUDA kernels: ``vload{2,4}(ptr, i)`` reads elements
``i .. i+L-1`` of a typed pointer as one ``ld.global.v{L}`` instruction, ``vstore{2,4}(ptr,
i, *values)`` writes them as one ``st.global.v{L}``.

Numba loads arrays, records and its vector types element by element and cannot declare a
pointer's alignment, so a float32 kernel never issues a 16-byte access. These intrinsics emit
the LLVM vector load with the alignment stated (L x element size); the caller guarantees it
(the launcher checks every pointer and index before choosing a vector kernel).

Under Numba's CUDA simulator (CI, no GPU) the same names are plain Python functions over
arrays, so generated kernels run unchanged there.
"""

from __future__ import annotations

from numba import config

__all__ = ["vload2", "vload4", "vstore2", "vstore4"]


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

    return vload2, vload4, vstore2, vstore4


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
                vp, elem = _vector_ptr(context, builder, sig.args[0], p, i, lanes)
                size = context.get_abi_sizeof(elem)
                vec = builder.load(vp, align=lanes * size)
                vals = [
                    builder.extract_element(vec, ir.Constant(ir.IntType(32), k))
                    for k in range(lanes)
                ]
                return context.make_tuple(builder, sig.return_type, vals)

            return ret(ptr, idx), codegen

        return vload

    def store_codegen(lanes: int):
        def codegen(context, builder, sig, args):
            p, i, vals = args[0], args[1], args[2:]
            i = context.cast(builder, i, sig.args[1], types.int64)
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

    return make_load(2), make_load(4), vstore2, vstore4


vload2, vload4, vstore2, vstore4 = _simulated() if config.ENABLE_CUDASIM else _compiled()
