"""cuBLAS's own choice of kernel for a plain product, a candidate beside cuBLASLt's.

cuBLASLt's heuristic lists candidates for a product and a plan times the first few; cuBLAS
(the classic API PyTorch's ``mm`` calls) picks its kernel by a heuristic of its own, which
can be a kernel that list does not hold. Timed on one H100 (``bench/gemm_candidates.py``,
float32), Mistral's gate/up and down products took 9.47 and 9.29 ms through PyTorch's
cuBLAS call and 9.95 and 9.83 ms by the best of cuBLASLt's first 8 to 32 candidates. So a
product with no epilogue also times cuBLAS's ``cublasGemmStridedBatchedEx`` with its default
algorithm, and keeps it where it is the fastest.

The call is the same column-major problem as cuBLASLt's (``cublaslt.lt_problem``: nothing is
copied), computes in float32 for float32 and half inputs (``COMPUTE_32F``: no TF32) and in
float64 for float64, and forbids reduced-precision reductions, so half products are
accumulated in float32 and rounded once, as the cuBLASLt plans' are. The handle's workspace
is the caller's fixed buffer, so a call allocates nothing and can be captured in a CUDA
graph.
"""

from __future__ import annotations

import numpy as np

from .cublaslt import COMPUTE, COMPUTE_32F, DATA_TYPE, Problem

DEFAULT_ALGO = -1  # CUBLAS_GEMM_DEFAULT
# CUBLAS_DEFAULT_MATH | CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION
MATH_MODE = 0 | 16

_HANDLES: dict[int, int] = {}  # CUDA context -> cublas handle


def _handle() -> int:
    from cuda.bindings import driver
    from nvmath.bindings import cublas

    _, ctx = driver.cuCtxGetCurrent()
    key = int(ctx)
    if key not in _HANDLES:
        h = cublas.create()
        cublas.set_math_mode(h, MATH_MODE)
        _HANDLES[key] = h
    return _HANDLES[key]


class BlasGemm:
    """``out = a @ b`` of ``problem`` (``cublaslt.lt_problem``'s mapping) by cuBLAS's default
    algorithm on ``stream``, with ``workspace`` (pointer, bytes) as cuBLAS's workspace."""

    def __init__(self, problem: Problem, dtype: str, stream: int, workspace: tuple[int, int]):
        self.problem = problem
        self.type = DATA_TYPE[dtype]
        compute, _, scalar = COMPUTE.get(dtype, COMPUTE_32F)
        self.compute = compute
        self.stream = stream
        self.workspace = workspace
        self._scalars = np.array([1.0, 0.0], dtype=scalar)  # alpha, beta (host memory)
        self.handle = _handle()

    def run(self, ptrs: tuple[int, ...]) -> None:
        """``ptrs``: saturn's a, b and out (cuBLAS's b, a and c)."""
        from nvmath.bindings import cublas

        p, h = self.problem, self.handle
        cublas.set_stream(h, self.stream)
        cublas.set_workspace(h, self.workspace[0], self.workspace[1])
        s = self._scalars.ctypes.data
        cublas.gemm_strided_batched_ex(
            h,
            p.a.op,
            p.b.op,
            p.m,
            p.n,
            p.k,
            s,
            ptrs[1],
            self.type,
            p.a.ld,
            p.a.batch_stride,
            ptrs[0],
            self.type,
            p.b.ld,
            p.b.batch_stride,
            s + self._scalars.itemsize,  # beta
            ptrs[2],
            self.type,
            p.d.ld,
            p.d.batch_stride,
            p.batch,
            self.compute,
            DEFAULT_ALGO,
        )
