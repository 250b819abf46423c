"""Matrix multiplies through cuBLASLt's C API (nvmath-python's bindings), with raw pointers.

nvmath's ``Matmul`` takes CuPy arrays over saturn's memory (``gemm.GemmPlan``, which compiled
graphs use for its float32 options), but CuPy has no bfloat16, and rebinding its operands
costs tens of microseconds of host time per call. So eager products (and every float16 and
bfloat16 product) are planned here directly: matrix layouts, a matmul descriptor and
heuristic algorithms, called with pointers on saturn's stream. float16 and bfloat16 inputs
are read in their type, products accumulate in float32 (``COMPUTE_32F``, as PyTorch's GPU
GEMMs for these types), and the result is rounded once to the output type; float32 computes
in float32 (no TF32) and float64 in float64.

cuBLASLt is column-major. A row-major ``out = a @ b`` (``m x n``) is computed as the
column-major ``out^T = b^T @ a^T``: ``out``'s memory seen column-major is ``out^T``
(``n x m``, leading dimension ``out``'s row stride), so nothing is copied, and each operand
is used as laid out (row-major memory is its transpose column-major, read with ``N``;
column-major memory is read with ``T``). The bias epilogue adds ``bias[row]`` of the
column-major result, which is the output feature here: a linear layer's bias.
``lt_problem`` does this mapping and ``simulate`` runs it on numpy buffers (for tests with
no GPU); ``LtPlan`` runs it on the device.

cuBLAS's own choice (decision 0131). cuBLASLt's heuristic lists candidates and a plan times
the first few; cuBLAS's classic API (what PyTorch's ``mm`` calls) picks its kernel by a
heuristic of its own, which can be one that list does not hold: on an H100, Mistral's
float32 gate/up product took 9.46 ms through it and 10.02 ms by the best of cuBLASLt's
first 8 candidates (``bench/gemm_candidates.py``). So a product with no epilogue also times
``BlasGemm`` (``cublasGemmStridedBatchedEx``, default algorithm, the same column-major
problem: nothing copied) and keeps it where it is the fastest: ``LtPlan`` as one more
candidate, a float32 ``gemm.GemmPlan`` through ``offer_blas``. It computes in float32 for
float32 and half inputs (no TF32) and in float64 for float64, with reduced-precision
reductions forbidden, so half products accumulate in float32 and are rounded once, as the
cuBLASLt plans' are. Its workspace is the caller's fixed buffer (``cublasSetWorkspace``),
so a call allocates nothing and can be captured in a CUDA graph.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .gemm import GemmError, GemmPlan, Layout, check_epilogue, time_on_stream
from .gemm_tuning import TUNINGS, alignment

# cudaDataType: CUDA_R_16F, CUDA_R_16BF, CUDA_R_32F, CUDA_R_64F
DATA_TYPE = {"f16": 2, "bf16": 14, "f32": 0, "f64": 1}
# (cublasComputeType_t, scale cudaDataType, numpy type of alpha and beta) per dtype
COMPUTE = {"f64": (70, 1, np.float64)}  # COMPUTE_64F
COMPUTE_32F = (68, 0, np.float32)  # every other dtype: COMPUTE_32F, float32 scalars
EPILOGUE_CODE = {"none": 1, "bias": 4, "relu_bias": 6, "gelu_bias": 36}  # cublasLtEpilogue_t
_N, _T = 0, 1  # cublasOperation_t
WORKSPACE_BYTES = 32 << 20  # what cuBLASLt's documentation recommends on Hopper
# whether a product with no epilogue may run by cuBLAS's own choice (``BlasGemm``): timed
# against cuBLASLt's plan and kept where faster, never, or always (for tests)
BLAS_CHOICES = ("timed", "never", "always")
BLAS_DEFAULT_ALGO = -1  # CUBLAS_GEMM_DEFAULT
# CUBLAS_DEFAULT_MATH | CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION
BLAS_MATH_MODE = 0 | 16


@dataclass(frozen=True)
class Matrix:
    """One stored column-major matrix as cuBLASLt describes it."""

    op: int  # _N or _T: how the product reads it
    rows: int
    cols: int
    ld: int
    batch_stride: int  # elements between batches


@dataclass(frozen=True)
class Problem:
    """``d = op(a) @ op(b)`` column-major (``m x n``, ``k`` deep), ``batch`` times."""

    m: int
    n: int
    k: int
    batch: int
    a: Matrix
    b: Matrix
    d: Matrix


def _stored(rows: int, cols: int, s_row: int, s_col: int, batch_stride: int) -> Matrix | None:
    """A row-major-indexed ``rows x cols`` operand (element ``[i, j]`` at ``i * s_row + j *
    s_col``) as a stored column-major matrix: its transpose read with ``N`` when it is
    row-major in memory, itself read with ``T`` when column-major. None when neither (a
    broadcast or gathered layout). A unit axis's stride is free (PyTorch may give any)."""
    if (s_col == 1 or cols == 1) and (rows == 1 or s_row >= max(cols, 1)):
        return Matrix(_N, cols, rows, max(s_row if rows > 1 else cols, 1), batch_stride)
    if (s_row == 1 or rows == 1) and (cols == 1 or s_col >= max(rows, 1)):
        return Matrix(_T, rows, cols, max(s_col if cols > 1 else rows, 1), batch_stride)
    return None


def lt_problem(a: Layout, b: Layout, out: Layout) -> Problem:
    """The column-major problem computing ``out = a @ b`` (2-D, or 3-D batched) in place,
    or GemmError naming what cuBLASLt cannot take as laid out."""
    if not (len(a.shape) == len(b.shape) == len(out.shape) and len(a.shape) in (2, 3)):
        raise GemmError(f"GEMM operands of ranks {len(a.shape)}, {len(b.shape)}, {len(out.shape)}")
    m, k = a.shape[-2:]
    k2, n = b.shape[-2:]
    if k != k2 or out.shape[-2:] != (m, n):
        raise GemmError(f"GEMM shapes {list(a.shape)} @ {list(b.shape)} -> {list(out.shape)}")
    batch = a.shape[0] if len(a.shape) == 3 else 1
    if len(a.shape) == 3 and not (b.shape[0] == out.shape[0] == batch):
        raise GemmError("batched GEMM with different batch sizes")

    def bstride(lay: Layout) -> int:
        return lay.strides[0] if len(lay.shape) == 3 and batch > 1 else 0

    # out^T (n x m) = b^T (n x k) @ a^T (k x m)
    d = _stored(m, n, out.strides[-2], out.strides[-1], bstride(out))
    if d is None or d.op != _N:
        raise GemmError(f"GEMM output strides {list(out.strides)}: rows must be packed")
    if batch > 1 and d.batch_stride < m * n and not (m * n == 0):
        raise GemmError(f"GEMM output batches overlap (strides {list(out.strides)})")
    lb = _stored(k, n, b.strides[-2], b.strides[-1], bstride(b))
    la = _stored(m, k, a.strides[-2], a.strides[-1], bstride(a))
    if lb is None or la is None:
        which = "b" if lb is None else "a"
        raise GemmError(f"GEMM operand {which} is neither row- nor column-major")
    if min(la.batch_stride, lb.batch_stride) < 0:
        raise GemmError("GEMM operand with a negative batch stride")
    return Problem(n, m, k, batch, lb, la, d)


def simulate(p: Problem, a: np.ndarray, b: np.ndarray, d: np.ndarray, bias=None, relu=False):
    """What cuBLASLt computes for ``p`` on flat numpy buffers (the column-major reading of
    each buffer, op applied), written into ``d``; for tests of ``lt_problem`` with no GPU."""

    def view(buf: np.ndarray, mat: Matrix) -> np.ndarray:
        it = buf.itemsize
        x = np.lib.stride_tricks.as_strided(
            buf,
            (p.batch, mat.rows, mat.cols),
            (mat.batch_stride * it, it, mat.ld * it),
            writeable=buf is d,
        )
        return x.transpose(0, 2, 1) if mat.op == _T else x

    acc = view(a, p.a).astype(np.float64) @ view(b, p.b).astype(np.float64)
    if bias is not None:
        acc = acc + bias.astype(np.float64)[None, :, None]
    if relu:
        acc = np.maximum(acc, 0)
    view(d, p.d)[...] = acc.astype(d.dtype)


_HANDLES: dict[int, int] = {}  # CUDA context -> cublasLt handle


def _handle() -> int:
    from cuda.bindings import driver
    from nvmath.bindings import cublasLt

    _, ctx = driver.cuCtxGetCurrent()
    key = int(ctx)
    if key not in _HANDLES:
        _HANDLES[key] = cublasLt.create()
    return _HANDLES[key]


class LtPlan:
    """``out = epilogue(a @ b [+ bias])`` for fixed layouts of one dtype; ``run`` takes
    pointers. ``workspace``: (pointer, bytes) of device memory the plan may use on every
    call (shared by plans that run on one stream; kept alive by the caller). With
    ``autotune``, cuBLASLt's heuristic candidates are timed on the first call's operands
    and the fastest kept; a product with no epilogue also times cuBLAS's own choice
    (``BlasGemm``, with the same workspace) as one more candidate (``blas``: one of
    ``BLAS_CHOICES``). Pointers less aligned than the planned ones re-plan."""

    def __init__(
        self,
        a: Layout,
        b: Layout,
        out: Layout,
        epilogue: str,
        bias: Layout | None,
        ptrs: tuple[int, ...],
        stream: int,
        workspace: tuple[int, int],
        autotune: bool = True,
        candidates: int = 8,
        blas: str = "timed",
    ):
        check_epilogue(epilogue, bias, out)
        if blas not in BLAS_CHOICES:
            raise GemmError(f"unknown cuBLAS choice {blas!r}; one of {BLAS_CHOICES}")
        dtypes = {lay.dtype for lay in (a, b, out, bias) if lay is not None}
        if len(dtypes) != 1 or next(iter(dtypes)) not in DATA_TYPE:
            raise GemmError(f"no GEMM plan for dtypes {sorted(dtypes)}")
        self.problem = lt_problem(a, b, out)
        if bias is not None and bias.strides != (1,) and bias.shape != (1,):
            raise GemmError(f"the bias epilogue reads a packed bias, got strides {bias.strides}")
        self.layouts = (a, b, out, bias)
        self.dtype = out.dtype
        self.epilogue = epilogue
        self.stream = stream
        self.workspace = workspace
        self.autotune = autotune
        self.candidates = candidates
        self.blas_choice = blas
        self.blas = None  # a BlasGemm that runs the product instead, when chosen
        self.timings: dict[int, float] = {}  # candidate index -> ms, when timed
        self.compute, self.scale, scalar = COMPUTE.get(self.dtype, COMPUTE_32F)
        self._scalars = np.array([1.0, 0.0], dtype=scalar)  # alpha, beta (host memory)
        self._bias = np.zeros(1, dtype=np.int64)  # the bias pointer attribute's buffer
        self._descs: list[tuple[str, int]] = []
        try:
            self._build(tuple(ptrs))
        except GemmError:
            self.free()
            raise

    # -- planning -------------------------------------------------------------------------

    def _set(self, setter, obj: int, attr: int, value, dtype) -> None:
        buf = np.array([value], dtype=dtype)
        setter(obj, attr, buf.ctypes.data, buf.itemsize)

    def _layout(self, mat: Matrix) -> int:
        from nvmath.bindings import cublasLt as lt  # noqa: N813

        layout = lt.matrix_layout_create(DATA_TYPE[self.dtype], mat.rows, mat.cols, mat.ld)
        self._descs.append(("layout", layout))
        if self.problem.batch > 1:
            attr = lt.MatrixLayoutAttribute
            self._set(
                lt.matrix_layout_set_attribute,
                layout,
                attr.BATCH_COUNT,
                self.problem.batch,
                np.int32,
            )
            self._set(
                lt.matrix_layout_set_attribute,
                layout,
                attr.STRIDED_BATCH_OFFSET,
                mat.batch_stride,
                np.int64,
            )
        return layout

    def _build(self, ptrs: tuple[int, ...]) -> None:
        from nvmath.bindings import cublasLt as lt  # noqa: N813

        p = self.problem
        self.handle = _handle()
        desc = lt.matmul_desc_create(self.compute, self.scale)
        self._descs.append(("desc", desc))
        attr = lt.MatmulDescAttribute
        self._set(lt.matmul_desc_set_attribute, desc, attr.TRANSA, p.a.op, np.int32)
        self._set(lt.matmul_desc_set_attribute, desc, attr.TRANSB, p.b.op, np.int32)
        self._set(
            lt.matmul_desc_set_attribute,
            desc,
            attr.EPILOGUE,
            EPILOGUE_CODE[self.epilogue],
            np.uint32,
        )
        self.desc = desc
        self.la, self.lb, self.ld = (self._layout(x) for x in (p.a, p.b, p.d))
        pref = lt.matmul_preference_create()
        self._descs.append(("pref", pref))
        pattr = lt.MatmulPreferenceAttribute
        self._set(
            lt.matmul_preference_set_attribute,
            pref,
            pattr.MAX_WORKSPACE_BYTES,
            self.workspace[1],
            np.uint64,
        )
        # cuBLASLt assumes 256-byte aligned operands unless told; the product's a and b
        # are saturn's b and a
        self.align = tuple(alignment(x) for x in ptrs)
        for which, ptr in (("A", ptrs[1]), ("B", ptrs[0]), ("C", ptrs[2]), ("D", ptrs[2])):
            self._set(
                lt.matmul_preference_set_attribute,
                pref,
                getattr(pattr, f"MIN_ALIGNMENT_{which}_BYTES"),
                alignment(ptr),
                np.uint32,
            )
        if self.epilogue != "none":
            self._bias[0] = ptrs[3]
            lt.matmul_desc_set_attribute(desc, attr.BIAS_POINTER, self._bias.ctypes.data, 8)
        self.results = lt.MatmulHeuristicResult(self.candidates)
        count = np.zeros(1, dtype=np.int32)
        try:
            lt.matmul_algo_get_heuristic(
                self.handle,
                desc,
                self.la,
                self.lb,
                self.ld,
                self.ld,
                pref,
                self.candidates,
                self.results.ptr,
                count.ctypes.data,
            )
        except Exception as e:  # cuBLASLt's status names what it refused
            raise GemmError(f"cuBLASLt has no algorithm for this GEMM: {e}") from e
        step = lt.matmul_heuristic_result_dtype.itemsize
        self.algos = [
            (self.results.ptr + i * step, int(self.results[i].workspace_size))
            for i in range(int(count[0]))
            if int(self.results[i].state) == 0
            and int(self.results[i].workspace_size) <= self.workspace[1]
        ]
        if not self.algos:
            raise GemmError("cuBLASLt has no algorithm for this GEMM")
        self.algo = self.algos[0][0]
        self.blas = self._blas_candidate()
        if self.blas is not None and self.blas_choice == "always":
            return
        n = len(self.algos) + (self.blas is not None)  # index len(algos): cuBLAS's choice
        if self.autotune and n > 1:
            # the heuristic lists the same candidates for the same product: the index a plan
            # of it timed before is this one's choice too (gemm_tuning)
            key = TUNINGS.key(ptrs, "lt", self.layouts, self.epilogue, self.workspace[1], n)
            best = TUNINGS.get(key)
            if best is not None and not (type(best) is int and 0 <= best < n):
                TUNINGS.forget(key)  # a stored choice of another form: timed again
                best = None
            if best is None:
                blas, self.blas = self.blas, None
                for i, (algo, _) in enumerate(self.algos):
                    self.algo = algo
                    self.timings[i] = time_on_stream(lambda: self.run(ptrs), self.stream, 3)
                if blas is not None:
                    try:
                        t = time_on_stream(lambda: blas.run(ptrs), self.stream, 3)
                        self.timings[len(self.algos)] = t
                    except Exception:  # cuBLAS's status names what it refused
                        pass
                best = min(self.timings, key=self.timings.__getitem__)
                TUNINGS.put(key, best)
                self.blas = blas
            if best == len(self.algos):
                return
            self.algo = self.algos[best][0]
        self.blas = None

    def _blas_candidate(self):
        """cuBLAS's own choice for a product with no epilogue (None where it is not asked
        for or cannot be made: cuBLASLt's candidates run it)."""
        if self.epilogue != "none" or self.blas_choice == "never":
            return None
        try:
            return BlasGemm(self.problem, self.dtype, self.stream, self.workspace)
        except Exception:  # no handle: cuBLASLt runs it
            return None

    def free(self) -> None:
        from nvmath.bindings import cublasLt as lt  # noqa: N813

        destroy = {
            "layout": lt.matrix_layout_destroy,
            "desc": lt.matmul_desc_destroy,
            "pref": lt.matmul_preference_destroy,
        }
        while self._descs:
            kind, obj = self._descs.pop()
            destroy[kind](obj)

    def __del__(self):
        try:
            self.free()
        except Exception:  # interpreter shutdown: the library may be gone
            pass

    # -- execution ------------------------------------------------------------------------

    def run(self, ptrs: tuple[int, ...]) -> None:
        from nvmath.bindings import cublasLt as lt  # noqa: N813

        if any(x % al for x, al in zip(ptrs, self.align, strict=False)):
            self.free()  # a less aligned operand than planned for: plan again for it
            self._build(tuple(ptrs))
        if self.blas is not None:
            self.blas.run(ptrs)
            return
        if self.epilogue != "none" and self._bias[0] != ptrs[3]:
            self._bias[0] = ptrs[3]
            lt.matmul_desc_set_attribute(
                self.desc, lt.MatmulDescAttribute.BIAS_POINTER, self._bias.ctypes.data, 8
            )
        s = self._scalars.ctypes.data
        lt.matmul(
            self.handle,
            self.desc,
            s,
            ptrs[1],
            self.la,
            ptrs[0],
            self.lb,
            s + self._scalars.itemsize,  # beta
            ptrs[2],
            self.ld,
            ptrs[2],
            self.ld,
            self.algo,
            self.workspace[0],
            self.workspace[1],
            self.stream,
        )


_BLAS_HANDLES: dict[int, int] = {}  # CUDA context -> cublas handle


def _blas_handle() -> int:
    from cuda.bindings import driver
    from nvmath.bindings import cublas

    _, ctx = driver.cuCtxGetCurrent()
    key = int(ctx)
    if key not in _BLAS_HANDLES:
        h = cublas.create()
        cublas.set_math_mode(h, BLAS_MATH_MODE)
        _BLAS_HANDLES[key] = h
    return _BLAS_HANDLES[key]


class BlasGemm:
    """``out = a @ b`` of ``problem`` (``lt_problem``'s mapping) by cuBLAS's default
    algorithm on ``stream``, with ``workspace`` (pointer, bytes) as cuBLAS's workspace."""

    def __init__(self, problem: Problem, dtype: str, stream: int, workspace: tuple[int, int]):
        self.problem = problem
        self.type = DATA_TYPE[dtype]
        self.compute, _, scalar = COMPUTE.get(dtype, COMPUTE_32F)
        self.stream = stream
        self.workspace = workspace
        self._scalars = np.array([1.0, 0.0], dtype=scalar)  # alpha, beta (host memory)
        self.handle = _blas_handle()

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
            BLAS_DEFAULT_ALGO,
        )


def offer_blas(
    plan: GemmPlan, ptrs: tuple[int, ...], workspace: tuple[int, int], blas: str = "timed"
) -> None:
    """Give a float32 or float64 ``plan`` with no epilogue cuBLAS's own choice where it is
    faster on these operands (timed against the plan; the answer kept with the other
    tunings), or as ``blas`` forces (``BLAS_CHOICES``). A TF32 or split plan, a
    layout or a call cuBLAS refuses leaves the plan as it is."""
    if blas not in BLAS_CHOICES:
        raise GemmError(f"unknown cuBLAS choice {blas!r}; one of {BLAS_CHOICES}")
    a, b, out, _ = plan.layouts
    if blas == "never" or plan.epilogue != "none" or plan.precision != "fp32":
        return
    try:
        cand = BlasGemm(lt_problem(a, b, out), out.dtype, plan.stream, workspace)
    except Exception:  # a layout cuBLAS cannot take, or no handle: cuBLASLt runs it
        return
    key = TUNINGS.key(ptrs, "cublas", plan.layouts, plan.precision, plan.candidates)
    use = True if blas == "always" else TUNINGS.get(key) if plan.autotune else False
    if not isinstance(use, bool | None):
        TUNINGS.forget(key)  # a stored choice of another form: timed again
        use = None
    if use is None:
        try:
            plan.timings["cublas"] = time_on_stream(lambda: cand.run(ptrs), plan.stream, 5)
        except Exception:  # cuBLAS's status names what it refused: cuBLASLt runs it
            return
        plan.timings["cublaslt"] = time_on_stream(lambda: plan.run(ptrs), plan.stream, 5)
        use = plan.timings["cublas"] < plan.timings["cublaslt"]
        TUNINGS.put(key, use)
    if use:
        plan.blas = cand
