"""Matrix multiplies through nvmath-python's cuBLASLt ``Matmul``, planned once.

A plan is made for one set of operand layouts (shapes, strides in elements, dtype) and an
epilogue (cuBLASLt's heuristic candidates timed on the first call's operands, keeping the
fastest), and executed on saturn's stream with the pointers of each call; a pointer that
changed since the last call is rebound with ``reset_operands`` (the executor's memory plan
keeps intermediates at fixed addresses, so in steady state nothing is rebound). The product
is written in place into the output buffer (``inplace`` with beta = 0: cuBLASLt does not
read C when beta is zero), so nvmath allocates nothing per call and the call can be
captured in a CUDA graph.

Epilogues: cuBLASLt's bias epilogue adds ``bias[row]`` (measured), and a linear layer's bias
belongs to the output feature, the column of ``out = a @ b``. So a bias epilogue computes the
transposed product ``out^T = b^T @ a^T`` into ``out`` seen column-major: the same memory, no
copy, weights used as stored. Its GELU is the tanh approximation.

cuBLASLt runs its float32 GELU+bias epilogue as a separate pass after the product, slower
than an elementwise kernel at memory bandwidth (155 against 125 us at 16384x4096, measured).
So a float32 ``gelu_bias`` plan is made both ways, the library's epilogue and the bias
epilogue followed by saturn's own tanh-GELU pass over the output in place
(``GELU_SOURCE``: the formula of the op table's ``GeluTanh``), each timed on the first
call's operands, and the faster kept (``gelu="timed"``; ``"fused"``/``"separate"`` force one).

float32 computes in float32 (``COMPUTE_32F``) by default. ``precision="tf32"`` lets cuBLASLt
round the inputs to TF32 (10-bit mantissa). ``precision="tf32x3"`` keeps float32-level
accuracy on the tensor cores: each operand is split as ``x = hi + lo`` with ``hi`` = x rounded
to TF32 and ``lo`` = the rest rounded to TF32, and the product is
``a_lo @ b_hc + a_hc @ b_lo + a_hi @ b_hi`` (three TF32 GEMMs accumulating into the output in
float32, the epilogue on the last; ``hc`` is ``hi`` without infinities and NaN, see below).
The dropped ``a_lo @ b_lo`` and the rounding of ``lo`` are each about 2^-22 of a product.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass

import numpy as np

from saturn.eqsat import optable as ot

from .gemm_tuning import TUNINGS

# cuBLASLt's heuristic candidates a float32 plan times (nvmath's default)
CANDIDATES = 8


class GemmError(RuntimeError):
    """An operand layout or epilogue the library plan cannot take."""


@dataclass(frozen=True)
class Layout:
    dtype: str
    shape: tuple[int, ...]
    strides: tuple[int, ...]  # elements

    def t(self) -> Layout:
        """The last two axes swapped (a view: same memory)."""
        s, st = list(self.shape), list(self.strides)
        s[-1], s[-2] = s[-2], s[-1]
        st[-1], st[-2] = st[-2], st[-1]
        return Layout(self.dtype, tuple(s), tuple(st))


def device_array(ptr: int, lay: Layout):
    """A CuPy array over device memory saturn owns (no copy, no ownership)."""
    import cupy

    dt = np.dtype(ot.NUMPY_DTYPE[lay.dtype])
    nbytes = max(span(lay), 1) * dt.itemsize
    mem = cupy.cuda.UnownedMemory(ptr, nbytes, None)
    return cupy.ndarray(
        lay.shape,
        dt,
        cupy.cuda.MemoryPointer(mem, 0),
        strides=tuple(s * dt.itemsize for s in lay.strides),
    )


EPILOGUES = ("none", "bias", "relu_bias", "gelu_bias")


def check_epilogue(epilogue: str, bias: Layout | None, out: Layout) -> None:
    """GemmError unless ``epilogue`` is known, has a bias exactly when it needs one, and
    that bias is one value per output feature of a 2-D product."""
    if epilogue not in EPILOGUES:
        raise GemmError(f"unknown GEMM epilogue {epilogue!r}")
    if (bias is None) != (epilogue == "none"):
        raise GemmError(f"epilogue {epilogue!r} with{'out' if bias is None else ''} a bias")
    if bias is not None and (len(out.shape) != 2 or bias.shape != (out.shape[1],)):
        raise GemmError(
            f"bias epilogue needs a 2-D product and a bias per output feature, got "
            f"output {list(out.shape)} and bias {list(bias.shape)}"
        )


PRECISIONS = ("fp32", "tf32", "tf32x3")

# hi = x rounded to TF32 (to nearest, ties away: cvt.rna), lo = (x - hi) rounded likewise
# (x - hi is exact in float32), hc = hi with infinities and NaN replaced by zero. The main
# product hi @ hi carries infinities and NaN as a TF32 product does (rounding keeps signs
# and zeros); the corrections lo @ hc and hc @ lo never see them (an infinity times a zero
# lo would be NaN). A finite x that rounds up to infinity is truncated instead.
SPLIT_DEVICE = r"""
__device__ __forceinline__ void tf32_split(float v, float& hi, float& lo, float& hc) {
  unsigned int h, l;
  asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(h) : "f"(v));
  float fh = __uint_as_float(h);
  if (isinf(fh) && !isinf(v)) fh = __uint_as_float(__float_as_uint(v) & 0xffffe000u);
  bool fin = isfinite(v);
  float r = fin ? v - fh : 0.0f;
  asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(l) : "f"(r));
  hi = fin ? fh : v;
  lo = __uint_as_float(l);
  hc = fin ? fh : 0.0f;
}
"""

_SPLIT_SOURCE = r"""
extern "C" __global__ void split_tf32(const float* x, float* hi, float* lo, float* hc,
                                      long long n) {
  long long step = (long long)gridDim.x * blockDim.x;
  for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += step)
    tf32_split(x[i], hi[i], lo[i], hc[i]);
}
"""


@functools.cache
def raw_kernel(source: str, name: str):
    """A CuPy kernel compiled from CUDA C source, once per process."""
    import cupy

    return cupy.RawKernel(source, name)


# Busy-waits on the device for ``ns`` nanoseconds (the global timer).
_SPIN_SOURCE = r"""
extern "C" __global__ void spin(long long ns) {
  long long t0, t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
  do {
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  } while (t - t0 < ns);
}
"""


def time_on_stream(run, stream: int, reps: int = 5) -> float:
    """Device milliseconds per call of ``run()`` on ``stream`` (CUDA events, after two warm
    calls). The stream is first held busy by a spin kernel for longer than the host takes to
    enqueue the calls, so that a call whose launches cost more host time than device time
    (small convolutions through cuDNN's Python frontend) is timed by its device work, which
    is what a replayed graph pays, and not by the host's."""
    import time

    import cupy

    s = cupy.cuda.ExternalStream(stream)
    run()
    t0 = time.perf_counter()
    run()
    host = time.perf_counter() - t0
    s.synchronize()
    spin_ns = int(min(2 * (reps + 1) * host, 0.05) * 1e9) + 200_000
    start, end = cupy.cuda.Event(), cupy.cuda.Event()
    with s:
        raw_kernel(_SPIN_SOURCE, "spin")((1,), (1,), (np.int64(spin_ns),))
    start.record(s)
    for _ in range(reps):
        run()
    end.record(s)
    end.synchronize()
    return cupy.cuda.get_elapsed_time(start, end) / reps


# tanh-GELU in place over a dense float32 buffer, the op table's formula operation for
# operation (GeluTanh: 0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 * x * x * x)))), so
# infinities and NaN come out as PyTorch's: gelu(inf) = inf, gelu(-inf) = NaN. 16-byte
# accesses when the buffer is 16-byte aligned.
GELU_SOURCE = r"""
__device__ __forceinline__ float gelu_t(float v) {
  return 0.5f * v * (1.0f + tanhf(0.7978845608028654f * (v + 0.044715f * v * v * v)));
}
extern "C" __global__ void gelu_tanh_inplace(float* x, long long n) {
  // one float4 per thread (as many loads in flight as the grid has threads); the last
  // n % 4 elements by the first threads; an unaligned buffer element by element
  long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if ((((unsigned long long)x) & 15ull) == 0) {
    long long n4 = n >> 2;
    if (i < n4) {
      float4* v = reinterpret_cast<float4*>(x);
      float4 a = v[i];
      a.x = gelu_t(a.x); a.y = gelu_t(a.y); a.z = gelu_t(a.z); a.w = gelu_t(a.w);
      v[i] = a;
    }
    long long t = (n4 << 2) + i;
    if (t < n) x[t] = gelu_t(x[t]);
  } else {
    long long step = (long long)gridDim.x * blockDim.x;
    for (long long j = i; j < n; j += step) x[j] = gelu_t(x[j]);
  }
}
"""
GELU_CHOICES = ("timed", "fused", "separate")


def _gelu_kernel():
    return raw_kernel(GELU_SOURCE, "gelu_tanh_inplace")


def dense(lay: Layout) -> bool:
    """Every element of the span is one of the layout's (an in-place pass may sweep it)."""
    return span(lay) == int(np.prod(lay.shape)) and min(lay.strides, default=1) >= 0


def _split_kernel():
    return raw_kernel(SPLIT_DEVICE + _SPLIT_SOURCE, "split_tf32")


def span(lay: Layout) -> int:
    """Elements from an operand's first to its last (what a split reads and writes)."""
    return 1 + sum((n - 1) * s for n, s in zip(lay.shape, lay.strides, strict=True))


class _Split:
    """An operand's TF32 halves in buffers of its own span and strides (so the halves are
    read with the operand's layout); refreshed from the operand on every call."""

    def __init__(self, lay: Layout, alloc):
        self.n = span(lay)
        self.flat = Layout("f32", (self.n,), (1,))
        self.bufs = [alloc(self.n * 4) for _ in range(3)]  # keep them alive
        self.hi, self.lo, self.hc = (b.data_ptr() for b in self.bufs)
        self.mem = [device_array(p, self.flat) for p in (self.hi, self.lo, self.hc)]
        self._src: tuple[int, object] | None = None  # the last source pointer and its array

    def run(self, src: int, stream: int) -> None:
        import cupy

        if self._src is None or self._src[0] != src:
            self._src = (src, device_array(src, self.flat))
        blocks = min(max(1, (self.n + 255) // 256), 132 * 16)
        with cupy.cuda.ExternalStream(stream):
            _split_kernel()((blocks,), (256,), (self._src[1], *self.mem, np.int64(self.n)))


def _kept(algorithm):
    """A copy of an nvmath ``Algorithm`` in a buffer of its own (the plan that found it
    may be freed while other plans of the same product still take it)."""
    from nvmath.bindings import cublasLt as lt  # noqa: N813
    from nvmath.linalg.advanced import Algorithm

    buf = lt.MatmulHeuristicResult(1)
    buf[0] = algorithm.algorithm._data
    return Algorithm(buf[0])


# How a plan's candidates are timed: "nvmath" (nvmath's autotune: each candidate alone, the
# L2 cache flushed from host memory between runs, median of three; the default until the
# other way is measured on a GPU, decision 0144) or "back_to_back" (``time_on_stream``: five
# calls of each candidate queued behind a spin kernel, operands warm in L2, as a replayed
# graph runs them and as ``cublaslt.LtPlan`` times its own)
TUNE = os.environ.get("SATURN_GEMM_TUNE", "nvmath")
if TUNE not in ("nvmath", "back_to_back"):
    raise GemmError(f"SATURN_GEMM_TUNE={TUNE!r}: one of 'nvmath', 'back_to_back'")


def fastest(mm, stream: int):
    """The fastest of a planned ``Matmul``'s candidates, timed as ``TUNE`` says, as an
    algorithm of its own (``_kept``)."""
    if TUNE == "nvmath":
        mm.autotune(iterations=3, stream=stream)
        return _kept(mm.algorithms[0])
    algs = mm.algorithms
    if len(algs) == 1:
        return _kept(algs[0])
    times = [
        time_on_stream(lambda a=a: mm.execute(algorithm=a, stream=stream), stream, 5) for a in algs
    ]
    return _kept(algs[int(np.argmin(times))])


class GemmPlan:
    """``out = epilogue(a @ b [+ bias])`` for fixed layouts; ``run`` takes pointers."""

    def __init__(
        self,
        a: Layout,
        b: Layout,
        out: Layout,
        epilogue: str,
        bias: Layout | None,
        ptrs: tuple[int, ...],
        stream: int,
        precision: str = "fp32",
        autotune: bool = True,
        alloc=None,
        choose: bool = True,
        gelu: str = "timed",
        candidates: int = CANDIDATES,
    ):
        """``alloc(nbytes)``: device memory the plan keeps (an object with ``data_ptr()``),
        needed by ``tf32x3`` for the operands' halves. With ``choose``, a ``tf32x3`` plan is
        timed against the float32 one on the first call's operands and the faster kept
        (both give float32-level results; small products lose to the extra launches).
        ``gelu``: how a float32 ``gelu_bias`` epilogue runs (see the module's docstring).
        ``cublaslt.offer_blas`` may then give a product with no epilogue cuBLAS's own
        choice instead (``blas``)."""
        if precision not in PRECISIONS:
            raise GemmError(f"unknown GEMM precision {precision!r}; one of {PRECISIONS}")
        if gelu not in GELU_CHOICES:
            raise GemmError(f"unknown GELU epilogue choice {gelu!r}; one of {GELU_CHOICES}")
        check_epilogue(epilogue, bias, out)
        for lay in (a, b, out):
            if len(lay.shape) not in (2, 3):
                raise GemmError(f"GEMM operand of rank {len(lay.shape)}")
        self.layouts = (a, b, out, bias)
        self.epilogue = epilogue
        self.stream = stream
        self.precision = precision if out.dtype == "f32" else "fp32"
        self.autotune = autotune  # time the candidates on the first call's own operands
        self.candidates = candidates  # how many of cuBLASLt's heuristic candidates
        self.transposed = bias is not None
        self._ptrs: tuple[int, ...] | None = None
        # the GELU applied by saturn's pass after a bias epilogue (instead of cuBLASLt's)
        self.gelu_separate = False
        self._gelu_out: tuple[int, object] | None = None  # output pointer and its array
        self.splits: tuple[_Split, _Split] | None = None
        self.blas = None  # a cublaslt.BlasGemm that runs the product instead (offer_blas)
        if self.precision == "tf32x3":
            if alloc is None:
                raise GemmError("tf32x3 needs an allocator for the operands' halves")
            self.splits = (_Split(a, alloc), _Split(b, alloc))
        self._build(ptrs)
        self.timings: dict[str, float] = {}  # ms per product, when chosen by timing
        if self.splits is not None and choose:
            split, self.timings["tf32x3"] = (self.splits, self.mms), self._time(ptrs)
            self.splits = None
            self._build(ptrs)
            self.timings["fp32"] = self._time(ptrs)
            if self.timings["tf32x3"] < self.timings["fp32"]:
                self.splits, self.mms = split
                self.mm = self.mms[-1]
                self._ptrs = None  # rebind the kept plans on the next call
            else:
                self.precision = "fp32"
        if epilogue == "gelu_bias" and out.dtype == "f32" and dense(out) and gelu != "fused":
            fused = self.mms
            if gelu == "timed":
                self.timings["gelu_fused"] = self._time(ptrs)
            self.gelu_separate = True
            self._build(ptrs)
            if gelu == "timed":
                self.timings["gelu_separate"] = self._time(ptrs)
                if self.timings["gelu_fused"] <= self.timings["gelu_separate"]:
                    self.gelu_separate = False
                    self.mms, self.mm, self._ptrs = fused, fused[-1], None

    def _time(self, ptrs: tuple[int, ...], reps: int = 5) -> float:
        return time_on_stream(lambda: self.run(ptrs), self.stream, reps)

    def _operands(self, ptrs: tuple[int, ...]):
        a, b, out, bias = self.layouts
        pa, pb, po = ptrs[:3]
        if self.transposed:  # out^T = b^T @ a^T, written to out's memory column-major
            ops = [device_array(pb, b.t()), device_array(pa, a.t()), device_array(po, out.t())]
        else:
            ops = [device_array(pa, a), device_array(pb, b), device_array(po, out)]
        epi = {"bias": device_array(ptrs[3], bias)} if bias is not None else None
        return ops, epi

    def _products(self, ptrs: tuple[int, ...]) -> list[tuple[tuple[int, ...], float, bool]]:
        """(pointers, beta, with the epilogue) of each cuBLASLt call making the product."""
        if self.splits is None:
            return [(ptrs, 0.0, True)]
        sa, sb = self.splits
        rest = ptrs[2:]
        return [
            ((sa.lo, sb.hc, *rest), 0.0, False),
            ((sa.hc, sb.lo, *rest), 1.0, False),
            ((sa.hi, sb.hi, *rest), 1.0, True),
        ]

    def _build(self, ptrs: tuple[int, ...]) -> None:
        from nvmath.linalg import ComputeType
        from nvmath.linalg.advanced import Matmul, MatmulEpilog, MatmulOptions

        dtype = self.layouts[2].dtype
        fast = self.precision == "tf32" or self.splits is not None
        compute = {
            "f32": ComputeType.COMPUTE_32F_FAST_TF32 if fast else ComputeType.COMPUTE_32F,
            "f64": ComputeType.COMPUTE_64F,
        }.get(dtype)
        if compute is None:
            raise GemmError(f"no GEMM plan for dtype {dtype}")
        epilog = {
            "none": None,
            "bias": MatmulEpilog.BIAS,
            "relu_bias": MatmulEpilog.RELU_BIAS,
            "gelu_bias": MatmulEpilog.BIAS if self.gelu_separate else MatmulEpilog.GELU_BIAS,
        }[self.epilogue]
        self.mms = []
        try:
            if self.splits is not None:  # the halves the plans are tuned on
                self.splits[0].run(ptrs[0], self.stream)
                self.splits[1].run(ptrs[1], self.stream)
            for p, beta, last in self._products(ptrs):
                (x, y, c), epi = self._operands(p)
                mm = Matmul(
                    x,
                    y,
                    c=c,
                    beta=beta,
                    options=MatmulOptions(inplace=True, compute_type=compute),
                    stream=self.stream,
                )
                # cuBLASLt's heuristic candidates, timed on these operands, unless a plan
                # of the same product was timed before (gemm_tuning)
                kw = {"epilog": epilog, "epilog_inputs": epi} if last else {}
                key = TUNINGS.key(
                    p,
                    "nvmath",
                    TUNE,
                    self.layouts,
                    self.epilogue,
                    self.gelu_separate,
                    compute,
                    beta,
                    self.candidates,
                )
                best = TUNINGS.get(key) if self.autotune else None
                if best is not None:
                    try:
                        mm.plan(algorithms=[best], stream=self.stream, **kw)
                    except Exception:  # a stored choice this library does not take
                        TUNINGS.forget(key)
                        best = None
                if best is None:
                    mm.plan(preferences={"limit": self.candidates}, stream=self.stream, **kw)
                    if self.autotune:
                        best = fastest(mm, self.stream)
                        TUNINGS.put(key, best)
                        if TUNE == "back_to_back":  # nvmath's autotune put it first
                            mm.plan(algorithms=[best], stream=self.stream, **kw)
                self.mms.append(mm)
        except GemmError:
            raise
        except Exception as e:  # nvmath's own message says which layout it refused
            raise GemmError(f"nvmath could not plan this GEMM: {e}") from e
        self.mm = self.mms[-1]
        self._ptrs = tuple(ptrs)

    def run(self, ptrs: tuple[int, ...]) -> None:
        ptrs = tuple(ptrs)
        if self.blas is not None:
            self.blas.run(ptrs)
            return
        if self.splits is not None:
            self.splits[0].run(ptrs[0], self.stream)
            self.splits[1].run(ptrs[1], self.stream)
        if ptrs != self._ptrs:
            # layouts are unchanged by construction, so the checked form's work is not needed
            for mm, (p, _, last) in zip(self.mms, self._products(ptrs), strict=True):
                (x, y, c), epi = self._operands(p)
                mm.reset_operands_unchecked(
                    a=x, b=y, c=c, epilog_inputs=epi if last else None, stream=self.stream
                )
            self._ptrs = ptrs
        for mm in self.mms:
            mm.execute(stream=self.stream)
        if self.gelu_separate:
            self._gelu(ptrs[2])

    def _gelu(self, po: int) -> None:
        import cupy

        n = span(self.layouts[2])
        if self._gelu_out is None or self._gelu_out[0] != po:
            self._gelu_out = (po, device_array(po, Layout("f32", (n,), (1,))))
        blocks = max(1, ((n + 3) // 4 + 255) // 256)
        with cupy.cuda.ExternalStream(self.stream):
            _gelu_kernel()((blocks,), (256,), (self._gelu_out[1], np.int64(n)))
