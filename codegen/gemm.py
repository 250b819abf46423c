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

float32 computes in float32 (``COMPUTE_32F``) unless TF32 is allowed by option.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from saturn.eqsat import optable as ot


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
    span = 1 + sum((n - 1) * s for n, s in zip(lay.shape, lay.strides, strict=True))
    nbytes = max(span, 1) * dt.itemsize
    mem = cupy.cuda.UnownedMemory(ptr, nbytes, None)
    return cupy.ndarray(
        lay.shape,
        dt,
        cupy.cuda.MemoryPointer(mem, 0),
        strides=tuple(s * dt.itemsize for s in lay.strides),
    )


EPILOGUES = ("none", "bias", "relu_bias", "gelu_bias")


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
        tf32: bool = False,
        autotune: bool = True,
    ):
        if epilogue not in EPILOGUES:
            raise GemmError(f"unknown GEMM epilogue {epilogue!r}")
        if (bias is None) != (epilogue == "none"):
            raise GemmError(f"epilogue {epilogue!r} with{'out' if bias is None else ''} a bias")
        if bias is not None and (len(out.shape) != 2 or bias.shape != (out.shape[1],)):
            raise GemmError(
                f"bias epilogue needs a 2-D product and a bias per output feature, got "
                f"output {list(out.shape)} and bias {list(bias.shape)}"
            )
        for lay in (a, b, out):
            if len(lay.shape) not in (2, 3):
                raise GemmError(f"GEMM operand of rank {len(lay.shape)}")
        self.layouts = (a, b, out, bias)
        self.epilogue = epilogue
        self.stream = stream
        self.tf32 = tf32
        self.autotune = autotune  # time the candidates on the first call's own operands
        self.transposed = bias is not None
        self._ptrs: tuple[int, ...] | None = None
        self._build(ptrs)

    def _operands(self, ptrs: tuple[int, ...]):
        a, b, out, bias = self.layouts
        pa, pb, po = ptrs[:3]
        if self.transposed:  # out^T = b^T @ a^T, written to out's memory column-major
            ops = [device_array(pb, b.t()), device_array(pa, a.t()), device_array(po, out.t())]
        else:
            ops = [device_array(pa, a), device_array(pb, b), device_array(po, out)]
        epi = {"bias": device_array(ptrs[3], bias)} if bias is not None else None
        return ops, epi

    def _build(self, ptrs: tuple[int, ...]) -> None:
        from nvmath.linalg import ComputeType
        from nvmath.linalg.advanced import Matmul, MatmulEpilog, MatmulOptions

        (x, y, c), epi = self._operands(ptrs)
        dtype = self.layouts[2].dtype
        compute = {
            "f32": ComputeType.COMPUTE_32F_FAST_TF32 if self.tf32 else ComputeType.COMPUTE_32F,
            "f64": ComputeType.COMPUTE_64F,
        }.get(dtype)
        if compute is None:
            raise GemmError(f"no GEMM plan for dtype {dtype}")
        try:
            self.mm = Matmul(
                x,
                y,
                c=c,
                beta=0.0,
                options=MatmulOptions(inplace=True, compute_type=compute),
                stream=self.stream,
            )
            epilog = {
                "none": None,
                "bias": MatmulEpilog.BIAS,
                "relu_bias": MatmulEpilog.RELU_BIAS,
                "gelu_bias": MatmulEpilog.GELU_BIAS,
            }[self.epilogue]
            # a few candidate algorithms from cuBLASLt's heuristics, timed on these operands
            self.mm.plan(epilog=epilog, epilog_inputs=epi, stream=self.stream)
            if self.autotune:
                self.mm.autotune(iterations=3, stream=self.stream)
        except GemmError:
            raise
        except Exception as e:  # nvmath's own message says which layout it refused
            raise GemmError(f"nvmath could not plan this GEMM: {e}") from e
        self._ptrs = tuple(ptrs)

    def run(self, ptrs: tuple[int, ...]) -> None:
        ptrs = tuple(ptrs)
        if ptrs != self._ptrs:
            (x, y, c), epi = self._operands(ptrs)
            # layouts are unchanged by construction, so the checked form's work is not needed
            self.mm.reset_operands_unchecked(a=x, b=y, c=c, epilog_inputs=epi, stream=self.stream)
            self._ptrs = ptrs
        self.mm.execute(stream=self.stream)
