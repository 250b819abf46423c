"""2-D convolutions through cuDNN's graph API (the vendor's Python frontend), planned once.

A plan is built at compile time for one set of layouts: cross-correlation (as PyTorch), with
stride, padding, dilation and groups (cuDNN reads the group count from the weight's channel
extent), the bias added in the same graph. cuDNN infers the output extents; the plan is
refused when they differ from PyTorch's. float32 engines that use tensor cores (TF32) are
deselected unless TF32 is allowed, so float32 convolutions compute in float32. ``run`` takes
the pointers of each call and runs on saturn's stream through the plan's cuDNN handle.

``SplitConvPlan`` is the ``tf32x3`` form (as for GEMMs, ``codegen/gemm.py``): the image and
the weight are split into TF32 halves and the convolution is
``conv(x_hi, w_hi) + (conv(x_lo, w_hc) + conv(x_hc, w_lo))``, three TF32 convolutions whose
products of TF32 values are exact and accumulate in float32; the corrections are added by
one small kernel.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .gemm import Layout


class ConvError(RuntimeError):
    """A convolution the cuDNN plan cannot take (the graph then runs uncompiled)."""


_HANDLES: dict[int, object] = {}


def _handle(stream: int):
    import cudnn

    h = _HANDLES.get(stream)
    if h is None:
        h = _HANDLES[stream] = cudnn.create_handle()
        cudnn.set_stream(handle=h, stream=stream)
    return h


def torch_output_extent(n: int, k: int, stride: int, pad: int, dil: int) -> int:
    return (n + 2 * pad - dil * (k - 1) - 1) // stride + 1


@dataclass
class ConvParams:
    stride: tuple[int, int]
    padding: tuple[int, int]
    dilation: tuple[int, int]
    groups: int


class ConvPlan:
    """``out = conv2d(x, w) [+ bias]`` for fixed layouts; ``run`` takes pointers."""

    def __init__(
        self,
        x: Layout,
        w: Layout,
        bias: Layout | None,
        out: Layout,
        p: ConvParams,
        stream: int,
        tf32: bool = False,
        tensor_cores: bool = False,
    ):
        """``tf32`` lets cuDNN pick TF32 engines where they are fastest; ``tensor_cores``
        keeps only TF32 tensor-core engines (the split plan's, whose operands are exact in
        TF32)."""
        import cudnn

        types = {"f32": cudnn.data_type.FLOAT, "f64": cudnn.data_type.DOUBLE}
        if x.dtype not in types:
            raise ConvError(f"no cuDNN convolution plan for dtype {x.dtype}")
        if len(x.shape) != 4 or len(w.shape) != 4:
            raise ConvError("cuDNN plans here are 2-D convolutions (rank-4 operands)")
        if x.shape[1] != w.shape[1] * p.groups:
            raise ConvError(
                f"{x.shape[1]} input channels do not match weight {list(w.shape)} "
                f"with {p.groups} groups"
            )
        want = (
            x.shape[0],
            w.shape[0],
            *(
                torch_output_extent(
                    x.shape[2 + i], w.shape[2 + i], p.stride[i], p.padding[i], p.dilation[i]
                )
                for i in range(2)
            ),
        )
        if tuple(out.shape) != want:
            raise ConvError(f"output {list(out.shape)} is not PyTorch's {list(want)}")
        t = types[x.dtype]
        self.stream = stream
        self.handle = _handle(stream)
        try:
            g = cudnn.pygraph(
                io_data_type=t, intermediate_data_type=t, compute_data_type=t, handle=self.handle
            )
            gx = g.tensor(name="x", dim=list(x.shape), stride=list(x.strides), data_type=t)
            gw = g.tensor(name="w", dim=list(w.shape), stride=list(w.strides), data_type=t)
            gy = g.conv_fprop(
                image=gx,
                weight=gw,
                padding=list(p.padding),
                stride=list(p.stride),
                dilation=list(p.dilation),
                compute_data_type=t,
            )
            tensors = [gx, gw]
            if bias is not None:
                gb = g.tensor(
                    name="b", dim=[1, w.shape[0], 1, 1], stride=[w.shape[0], 1, 1, 1], data_type=t
                )
                gy = g.add(a=gy, b=gb, compute_data_type=t)
                tensors.append(gb)
            gy.set_output(True).set_data_type(t)
            inferred = tuple(gy.get_dim()) if gy.get_dim() else want
            if inferred != want:
                raise ConvError(f"cuDNN's output {list(inferred)} is not PyTorch's {list(want)}")
            gy.set_dim(list(out.shape)).set_stride(list(out.strides))
            tensors.append(gy)
            g.validate()
            g.build_operation_graph()
            g.create_execution_plans([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
            if x.dtype == "f32" and tensor_cores:
                g.select_numeric_notes([cudnn.numerical_note.TENSOR_CORE])
            elif x.dtype == "f32" and not tf32:
                g.deselect_numeric_notes([cudnn.numerical_note.TENSOR_CORE])
            g.check_support()
            g.build_plans()
        except ConvError:
            raise
        except Exception as e:
            raise ConvError(f"cuDNN could not plan this convolution: {e}") from e
        self.graph = g
        self.uids = tuple(tt.get_uid() for tt in tensors)
        self.workspace_size = int(g.get_workspace_size())
        self.tuned: tuple[float, int, int] | None = None  # (ms for 3 runs, plan index, workspace)
        self.candidates = 0  # plans the last autotune timed
        self.timings: dict[str, float] = {}  # ms per call, when tf32x3 was timed against it

    def autotune(self, ptrs: tuple[int, ...], workspace_for, candidates: int = 8) -> None:
        """Time the first ``candidates`` ranked plans that build on this call's own buffers
        (the output is overwritten by the real run that follows) and keep the fastest.
        Plans the numeric notes deselected (TF32 engines in a float32 plan) do not build
        and are not counted. ``workspace_for(nbytes)`` returns a device address with that
        many bytes."""
        from cuda.bindings import driver as drv

        g = self.graph
        start, stop = drv.cuEventCreate(0)[1], drv.cuEventCreate(0)[1]
        best: tuple[float, int, int] | None = None
        self.candidates = 0
        try:
            for i in range(g.get_execution_plan_count()):
                if self.candidates == candidates:
                    break
                try:
                    g.build_plan_at_index(i)
                    need = int(g.get_workspace_size_plan_at_index(i))
                    pack = tuple(_Ptr(p) for p in ptrs)
                    ws = _Ptr(workspace_for(need))

                    def once(i=i, pack=pack, ws=ws):
                        g.execute_plan_at_index(
                            pack, ws, index=i, handle=self.handle, tensor_uids=self.uids
                        )

                    once()  # warm
                except Exception:  # a plan that declines these operands is not a candidate
                    continue
                self.candidates += 1
                drv.cuEventRecord(start, self.stream)
                for _ in range(3):
                    once()
                drv.cuEventRecord(stop, self.stream)
                drv.cuEventSynchronize(stop)
                ms = drv.cuEventElapsedTime(start, stop)[1]
                if best is None or ms < best[0]:
                    best = (ms, i, need)
        finally:
            drv.cuEventDestroy(start)
            drv.cuEventDestroy(stop)
        if best is not None:
            g.select_plan(best[1])
            g.build_plans()
            self.workspace_size = best[2]
            self.tuned = best

    def run(self, ptrs: tuple[int, ...], workspace: int) -> None:
        """``ptrs``: x, w, [bias,] out, in the plan's order."""
        self.graph.execute(
            tuple(_Ptr(p) for p in ptrs), _Ptr(workspace), handle=self.handle, tensor_uids=self.uids
        )


# out += a + b, the corrections summed first (they are about 2^-11 of out)
_ADD_SOURCE = r"""
extern "C" __global__ void add_corrections(float* out, const float* a, const float* b,
                                           long long n) {
  long long step = (long long)gridDim.x * blockDim.x;
  for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += step)
    out[i] = out[i] + (a[i] + b[i]);
}
"""


def _add_kernel():
    from .gemm import raw_kernel

    return raw_kernel(_ADD_SOURCE, "add_corrections")


class SplitConvPlan:
    """A float32 convolution as three TF32 ones of split operands (``tf32x3``); the same
    ``autotune``/``run`` interface as ``ConvPlan``. The output must be packed (the
    corrections are summed element by element); ``alloc(nbytes)`` gives device memory the
    plan keeps (the halves and the two corrections)."""

    def __init__(self, x, w, bias, out, p: ConvParams, stream: int, alloc):
        import math

        from .gemm import _Split

        if x.dtype != "f32" or w.dtype != "f32":
            raise ConvError("tf32x3 convolutions are float32")
        packed = tuple(
            math.prod(out.shape[d + 1 :]) for d in range(len(out.shape))
        )  # row-major strides
        if tuple(out.strides) != packed:
            raise ConvError("tf32x3 convolutions write a packed output")
        self.stream = stream
        self.sx, self.sw = _Split(x, alloc), _Split(w, alloc)
        self.n = math.prod(out.shape)
        self.corr_out = [alloc(self.n * 4) for _ in range(2)]
        self.corr = ConvPlan(x, w, None, out, p, stream, tensor_cores=True)
        self.main = (
            ConvPlan(x, w, bias, out, p, stream, tensor_cores=True) if bias is not None else None
        )
        self.bias = bias is not None
        self.workspace_size = max(self.corr.workspace_size, self._main().workspace_size)
        self.timings: dict[str, float] = {}  # ms per call: tf32x3 and, when chosen, fp32
        self._corr_arrays = [_flat_f32(b.data_ptr(), self.n) for b in self.corr_out]
        self._out: tuple[int, object] | None = None  # the last output pointer and its array

    def _main(self) -> ConvPlan:
        return self.main if self.main is not None else self.corr

    def _calls(self, ptrs: tuple[int, ...]) -> list[tuple[ConvPlan, tuple[int, ...]]]:
        sx, sw = self.sx, self.sw
        c0, c1 = (b.data_ptr() for b in self.corr_out)
        rest = ptrs[2:]  # [bias,] out
        return [
            (self.corr, (sx.lo, sw.hc, c0)),
            (self.corr, (sx.hc, sw.lo, c1)),
            (self._main(), (sx.hi, sw.hi, *rest)),
        ]

    def autotune(self, ptrs: tuple[int, ...], workspace_for, candidates: int = 8) -> None:
        self.sx.run(ptrs[0], self.stream)
        self.sw.run(ptrs[1], self.stream)
        calls = self._calls(ptrs)
        self.corr.autotune(calls[0][1], workspace_for, candidates)
        if self.main is not None:
            self.main.autotune(calls[2][1], workspace_for, candidates)
        self.workspace_size = max(self.corr.workspace_size, self._main().workspace_size)

    def run(self, ptrs: tuple[int, ...], workspace: int) -> None:
        """``ptrs``: x, w, [bias,] out."""
        import cupy

        self.sx.run(ptrs[0], self.stream)
        self.sw.run(ptrs[1], self.stream)
        for plan, p in self._calls(ptrs):
            plan.run(p, workspace)
        if self._out is None or self._out[0] != ptrs[-1]:
            self._out = (ptrs[-1], _flat_f32(ptrs[-1], self.n))
        blocks = min(max(1, (self.n + 255) // 256), 132 * 16)
        with cupy.cuda.ExternalStream(self.stream):
            _add_kernel()((blocks,), (256,), (self._out[1], *self._corr_arrays, np.int64(self.n)))


def _flat_f32(ptr: int, n: int):
    from .gemm import Layout, device_array

    return device_array(ptr, Layout("f32", (n,), (1,)))


class _Ptr:
    """A device address for the frontend, which asks buffers for ``data_ptr()``."""

    __slots__ = ("p",)

    def __init__(self, p: int):
        self.p = p

    def data_ptr(self) -> int:
        return self.p
