"""2-D convolutions through cuDNN's graph API (the vendor's Python frontend), planned once.

A plan is built at compile time for one set of layouts: cross-correlation (as PyTorch), with
stride, padding, dilation and groups (cuDNN reads the group count from the weight's channel
extent), the bias added in the same graph. cuDNN infers the output extents; the plan is
refused when they differ from PyTorch's. float32 engines that use tensor cores (TF32) are
deselected unless TF32 is allowed, so float32 convolutions compute in float32. ``run`` takes
the pointers of each call and runs on saturn's stream through the plan's cuDNN handle.

``SplitConvPlan`` is the ``tf32x3`` form (as for GEMMs, ``codegen/gemm.py``): the image and
the weight are split into TF32 halves, channels-last (the tensor cores' layout), and two TF32
convolutions compute ``conv(x_hi, w_hi)`` and the corrections ``x_lo w_hc + x_hc w_lo`` (one
convolution over twice the input channels); products of TF32 values are exact and
accumulate in float32, and one kernel adds the two into the output.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

from .gemm import SPLIT_DEVICE, Layout, span, time_on_stream
from .gemm_tuning import CONV_TUNINGS


class ConvError(RuntimeError):
    """A convolution the cuDNN plan cannot take (the graph then runs uncompiled)."""


_HANDLES: dict[int, object] = {}


@functools.cache
def cudnn_unavailable() -> str | None:
    """Why cuDNN plans cannot be made here (None when they can): its Python frontend is an
    optional package, so a GPU graph with a convolution is declined at compile time rather
    than failing at its first call."""
    try:
        import cudnn  # noqa: F401
    except ImportError as e:
        return f"cuDNN's Python frontend (the nvidia-cudnn-frontend package) is missing: {e}"
    return None


def depthwise(w_shape: tuple[int, ...], groups: int) -> bool:
    """Whether a grouped convolution's weight [K, C / groups, kh, kw] takes one input
    channel a group (MobileNet's, EfficientNet's, ConvNeXt's)."""
    return groups > 1 and len(w_shape) == 4 and w_shape[1] == 1


DTYPES = ("f32", "f64", "f16", "bf16")  # what cuDNN plans here take (``_cudnn_types``)


@functools.cache
def _cudnn_types() -> dict:
    import cudnn

    return {
        "f32": cudnn.data_type.FLOAT,
        "f64": cudnn.data_type.DOUBLE,
        "f16": cudnn.data_type.HALF,
        "bf16": cudnn.data_type.BFLOAT16,
    }


# which engines a plan's list holds, part of every tuning key: a choice is an index into
# that list, so a choice stored (on disk) under another filter names another engine
ENGINES = "no transforms"


def _transforms() -> list:
    """The numerical notes of engines that transform their operands (FFT, Winograd): a
    transform mixes positions, so an infinity or NaN reaches outputs whose products never
    read it (a bfloat16 backward-data engine gave -inf where PyTorch gives -0.25), and a
    large finite value can overflow inside it. Their plans are never made: every plan
    sums the products themselves, as the rules placing convolutions state."""
    import cudnn

    names = ("FFT", "WINOGRAD", "WINOGRAD_TILE_4x4", "WINOGRAD_TILE_6x6", "WINOGRAD_TILE_13x13")
    return [getattr(cudnn.numerical_note, n) for n in names if hasattr(cudnn.numerical_note, n)]


def _handle(stream: int):
    import cudnn

    h = _HANDLES.get(stream)
    if h is None:
        h = _HANDLES[stream] = cudnn.create_handle()
        cudnn.set_stream(handle=h, stream=stream)
    return h


def torch_output_extent(n: int, k: int, stride: int, pad: int, dil: int) -> int:
    return (n + 2 * pad - dil * (k - 1) - 1) // stride + 1


@dataclass(frozen=True)
class ConvParams:
    stride: tuple[int, int]
    padding: tuple[int, int]
    dilation: tuple[int, int]
    groups: int


def output_extents(x: Layout, w: Layout, p: ConvParams) -> tuple[int, ...]:
    """The output's extents PyTorch gives ``conv2d(x, w)``, after the checks a cuDNN plan
    makes before it asks cuDNN anything (each refusal a ``ConvError`` naming it)."""
    if x.dtype not in DTYPES:
        raise ConvError(f"no cuDNN convolution plan for dtype {x.dtype}")
    if len(x.shape) != 4 or len(w.shape) != 4:
        raise ConvError("cuDNN plans here are 2-D convolutions (rank-4 operands)")
    if x.shape[1] != w.shape[1] * p.groups or w.shape[0] % p.groups:
        raise ConvError(
            f"{x.shape[1]} input channels do not match weight {list(w.shape)} "
            f"with {p.groups} groups"
        )
    hw = (
        torch_output_extent(
            x.shape[2 + i], w.shape[2 + i], p.stride[i], p.padding[i], p.dilation[i]
        )
        for i in range(2)
    )
    return (x.shape[0], w.shape[0], *hw)


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
        runtime_compiled: bool | None = None,
    ):
        """``tf32`` lets cuDNN pick TF32 engines where they are fastest; ``tensor_cores``
        keeps only TF32 tensor-core engines (the split plan's, whose operands are exact in
        TF32). ``runtime_compiled`` admits engines that cuDNN compiles at plan-building time
        (NVRTC): building one takes a fraction of a second to seconds, and the half types
        rank many of them first, so they are left out unless no precompiled engine takes
        the convolution; by default (None) they are admitted where it is depthwise (one
        input channel a group): there the compiled engines ran 1.5-14 times as fast as the
        precompiled ones, in both layouts and both dtypes (decision 0111)."""
        want = output_extents(x, w, p)
        if tuple(out.shape) != want:
            raise ConvError(f"output {list(out.shape)} is not PyTorch's {list(want)}")
        self._plan(
            lambda t, acc: self._graph(x, w, bias, out, p, t, acc, want),
            x.dtype,
            depthwise(w.shape, p.groups),
            tf32,
            tensor_cores,
            runtime_compiled,
            stream,
        )
        self.problem = self._problem("cudnn", x, w, bias, out, p, tf32, tensor_cores)

    def _problem(self, what: str, a, b, bias, out, p: ConvParams, tf32, tensor_cores) -> tuple:
        """What cuDNN was asked (after ``_plan``): a timed choice of plan is shared by every
        plan asked the same (``CONV_TUNINGS``), under the same engine filter."""
        conv = (p.stride, p.padding, p.dilation, p.groups)
        return (what, ENGINES, a, b, bias, out, conv, tf32, tensor_cores, self.runtime_compiled)

    def _plan(
        self, graph, dtype: str, compiled_first: bool, tf32, tensor_cores, runtime_compiled, stream
    ) -> None:
        """Build ``graph(io type, accumulator type)``'s plans (the graph and its tensors in
        ``run``'s order), with TF32 and runtime-compiled engines admitted as ``__init__``
        says; ``compiled_first``: where ``runtime_compiled`` is None, try the compiled
        engines first (a depthwise convolution's)."""
        import cudnn

        t = _cudnn_types()[dtype]
        # half operands accumulate in float32 and round once (as eager's cuDNN call does)
        acc = cudnn.data_type.FLOAT if dtype in ("f16", "bf16") else t
        self.stream = stream
        self.handle = _handle(stream)
        # the tries in order, compiled engines admitted or not (a depthwise convolution's
        # plan falls back to precompiled ones should runtime compilation fail)
        if runtime_compiled is None:
            tries = (True, False) if compiled_first else (False, True)
        else:
            tries = (True,) if runtime_compiled else (False, True)
        for n, admit_compiled in enumerate(tries):
            try:
                g, tensors = graph(t, acc)
                g.create_execution_plans([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
                if dtype == "f32" and tensor_cores:
                    g.select_numeric_notes([cudnn.numerical_note.TENSOR_CORE])
                off = _transforms()
                if dtype == "f32" and not tf32 and not tensor_cores:
                    off.append(cudnn.numerical_note.TENSOR_CORE)
                g.deselect_numeric_notes(off)
                if not admit_compiled:
                    g.deselect_behavior_notes([cudnn.behavior_note.RUNTIME_COMPILATION])
                g.check_support()
                g.build_plans()
                break
            except ConvError:
                raise
            except Exception as e:
                if n == len(tries) - 1:
                    raise ConvError(f"cuDNN could not plan this convolution: {e}") from e
        self.runtime_compiled = admit_compiled
        self.graph = g
        self.uids = tuple(tt.get_uid() for tt in tensors)
        self.workspace_size = int(g.get_workspace_size())
        self.tuned: tuple[float, int, int] | None = None  # (ms per call, plan index, workspace)
        self.candidates = 0  # plans the last autotune timed
        self.reused = False  # the choice came from a plan of the same problem (CONV_TUNINGS)
        self.timings: dict[str, float] = {}  # ms per call, when tf32x3 was timed against it

    def _graph(self, x: Layout, w: Layout, bias, out: Layout, p: ConvParams, t, acc, want):
        """The operation graph (validated, built) and its tensors in ``run``'s order."""
        import cudnn

        g = cudnn.pygraph(
            io_data_type=t, intermediate_data_type=acc, compute_data_type=acc, handle=self.handle
        )
        gx = g.tensor(name="x", dim=list(x.shape), stride=list(x.strides), data_type=t)
        gw = g.tensor(name="w", dim=list(w.shape), stride=list(w.strides), data_type=t)
        gy = g.conv_fprop(
            image=gx,
            weight=gw,
            padding=list(p.padding),
            stride=list(p.stride),
            dilation=list(p.dilation),
            compute_data_type=acc,
        )
        tensors = [gx, gw]
        if bias is not None:
            gb = g.tensor(
                name="b", dim=[1, w.shape[0], 1, 1], stride=[w.shape[0], 1, 1, 1], data_type=t
            )
            gy = g.add(a=gy, b=gb, compute_data_type=acc)
            tensors.append(gb)
        gy.set_output(True).set_data_type(t)
        inferred = tuple(gy.get_dim()) if gy.get_dim() else want
        if inferred != want:
            raise ConvError(f"cuDNN's output {list(inferred)} is not PyTorch's {list(want)}")
        gy.set_dim(list(out.shape)).set_stride(list(out.strides))
        tensors.append(gy)
        g.validate()
        g.build_operation_graph()
        return g, tensors

    def autotune(self, ptrs: tuple[int, ...], workspace_for, candidates: int = 8) -> None:
        """Time the first ``candidates`` ranked plans that build on this call's own buffers
        (the output is overwritten by the real run that follows) and keep the fastest.
        Plans the numeric notes deselected (TF32 engines in a float32 plan) do not build
        and are not counted. Each candidate's device time (``time_on_stream``) is taken
        twice, in ranked and then in reverse order, and the two summed: a GPU whose clock is
        still rising would otherwise favour the last ones. ``workspace_for(nbytes)`` returns
        a device address with that many bytes (the largest request is allocated before any
        timing). A plan of the same problem timed before in this process
        (``CONV_TUNINGS``) takes its choice without timing."""
        g = self.graph
        key = CONV_TUNINGS.key(ptrs, *self.problem, candidates)
        chosen = CONV_TUNINGS.get(key)
        if chosen is not None:
            _, i, need = chosen
            try:
                g.select_plan(i)
                g.build_plans()
                self.workspace_size, self.tuned, self.candidates = need, chosen, 0
                self.reused = True
                return
            except Exception:  # the index does not build here after all: time candidates
                pass
        built: list[tuple[int, int]] = []  # (plan index, workspace bytes)
        for i in range(g.get_execution_plan_count()):
            if len(built) == candidates:
                break
            try:
                g.build_plan_at_index(i)
                built.append((i, int(g.get_workspace_size_plan_at_index(i))))
            except Exception:  # a plan that declines these operands is not a candidate
                continue
        pack = tuple(_Ptr(p) for p in ptrs)
        ws = _Ptr(workspace_for(max((need for _, need in built), default=0)))

        def once(i: int) -> None:
            g.execute_plan_at_index(pack, ws, index=i, handle=self.handle, tensor_uids=self.uids)

        runnable = []
        for i, need in built:
            try:
                once(i)  # warm
            except Exception:
                continue
            runnable.append((i, need))
        self.candidates = len(runnable)
        total = {i: 0.0 for i, _ in runnable}
        for order in (runnable, runnable[::-1]):
            for i, _ in order:
                total[i] += time_on_stream(lambda i=i: once(i), self.stream, reps=3)
        if runnable:
            i, need = min(runnable, key=lambda r: total[r[0]])
            g.select_plan(i)
            g.build_plans()
            self.workspace_size, self.reused = need, False
            self.tuned = (total[i] / 2, i, need)  # ms per call
            CONV_TUNINGS.put(key, self.tuned)

    def run(self, ptrs: tuple[int, ...], workspace: int) -> None:
        """``ptrs``: x, w, [bias,] out, in the plan's order."""
        self.graph.execute(
            tuple(_Ptr(p) for p in ptrs), _Ptr(workspace), handle=self.handle, tensor_uids=self.uids
        )


# Both kernels are tiled transposes (32x32 tiles through shared memory, blocks of 32 x 8
# threads) between an NCHW-indexed tensor of any strides and packed channels-last buffers,
# coalesced on both sides.
#
# split_tf32_nhwc: x[n, c, h, w] to hi[n, h, w, c] and rest[n, h, w, 2C], channel c of group g
# going to rest's g*2Cg + slot*Cg + c%Cg, slots (lo, hc) for the image and (hc, lo) for the
# weight (``swap``), so that the sum over rest's channels is x_lo w_hc + x_hc w_lo. Writes are
# 16 bytes at a time where the channels per group are a multiple of 4 (the buffers are
# 16-byte aligned), reads where ``packed`` says the source's h, w are packed and aligned.
#
# add_nhwc: out[n, k, h, w] (any strides) = a[n, h, w, k] + b[n, h, w, k], read 16 bytes at
# a time where K is a multiple of 4.
_NHWC_SOURCE = r"""
extern "C" __global__ void split_tf32_nhwc(const float* x, float* hi_out, float* rest_out,
                                           int C, int H, int W, int cg, int swap,
                                           int packed, long long sn, long long sc,
                                           long long sh, long long sw) {
  __shared__ float tile[32][33];
  int hw0 = blockIdx.x * 32, c0 = blockIdx.y * 32, HW = H * W;
  long long n = blockIdx.z;
  if (packed) {  // h, w packed, 16-byte aligned: four positions per thread
    int t = threadIdx.y * 32 + threadIdx.x, cl = t / 8, hl = (t % 8) * 4;
    int c = c0 + cl, hw = hw0 + hl;
    if (c < C && hw < HW) {
      float4 v = *(const float4*)(x + n * sn + c * sc + hw);
      tile[cl][hl] = v.x;
      tile[cl][hl + 1] = v.y;
      tile[cl][hl + 2] = v.z;
      tile[cl][hl + 3] = v.w;
    }
  } else {
    for (int j = threadIdx.y; j < 32; j += blockDim.y) {
      int c = c0 + j, hw = hw0 + threadIdx.x;
      if (c < C && hw < HW) {
        int h = hw / W, w = hw - h * W;
        tile[j][threadIdx.x] = x[n * sn + c * sc + h * sh + w * sw];
      }
    }
  }
  __syncthreads();
  if (cg % 4 == 0) {  // four channels of one position per thread
    int t = threadIdx.y * 32 + threadIdx.x, hw = hw0 + t / 8, c = c0 + (t % 8) * 4;
    if (c < C && hw < HW) {
      float4 hi, lo, hc;
      const float* v = &tile[c - c0][hw - hw0];
      tf32_split(v[0], hi.x, lo.x, hc.x);
      tf32_split(v[33], hi.y, lo.y, hc.y);
      tf32_split(v[66], hi.z, lo.z, hc.z);
      tf32_split(v[99], hi.w, lo.w, hc.w);
      long long p = n * HW + hw;
      float* r = rest_out + p * 2 * C + (c / cg) * 2 * cg + c % cg;
      *(float4*)(hi_out + p * C + c) = hi;
      *(float4*)r = swap ? hc : lo;
      *(float4*)(r + cg) = swap ? lo : hc;
    }
    return;
  }
  for (int j = threadIdx.y; j < 32; j += blockDim.y) {
    int hw = hw0 + j, c = c0 + threadIdx.x;
    if (c < C && hw < HW) {
      float hi, lo, hc;
      tf32_split(tile[threadIdx.x][j], hi, lo, hc);
      long long p = n * HW + hw;
      float* r = rest_out + p * 2 * C + (c / cg) * 2 * cg + c % cg;
      hi_out[p * C + c] = hi;
      r[0] = swap ? hc : lo;
      r[cg] = swap ? lo : hc;
    }
  }
}

extern "C" __global__ void add_nhwc(const float* a, const float* b, float* out, int K, int H,
                                    int W, long long sn, long long sk, long long sh,
                                    long long sw) {
  __shared__ float tile[32][33];
  int hw0 = blockIdx.x * 32, k0 = blockIdx.y * 32, HW = H * W;
  long long n = blockIdx.z;
  if (K % 4 == 0) {  // four channels of one position per thread, read 16 bytes at a time
    int t = threadIdx.y * 32 + threadIdx.x, hl = t / 8, kl = (t % 8) * 4;
    int hw = hw0 + hl, k = k0 + kl;
    if (k < K && hw < HW) {
      long long i = (n * HW + hw) * K + k;
      float4 x = *(const float4*)(a + i), y = *(const float4*)(b + i);
      tile[kl][hl] = x.x + y.x;
      tile[kl + 1][hl] = x.y + y.y;
      tile[kl + 2][hl] = x.z + y.z;
      tile[kl + 3][hl] = x.w + y.w;
    }
  } else {
    for (int j = threadIdx.y; j < 32; j += blockDim.y) {
      int hw = hw0 + j, k = k0 + threadIdx.x;
      if (k < K && hw < HW) {
        long long i = (n * HW + hw) * K + k;
        tile[threadIdx.x][j] = a[i] + b[i];
      }
    }
  }
  __syncthreads();
  for (int j = threadIdx.y; j < 32; j += blockDim.y) {
    int k = k0 + j, hw = hw0 + threadIdx.x;
    if (k < K && hw < HW) {
      int h = hw / W, w = hw - h * W;
      out[n * sn + k * sk + h * sh + w * sw] = tile[j][threadIdx.x];
    }
  }
}
"""


def _nhwc_kernel(name: str):
    from .gemm import raw_kernel

    return raw_kernel(SPLIT_DEVICE + _NHWC_SOURCE, name)


def _grid(lay: Layout) -> tuple[int, int, int]:
    n, c, h, w = lay.shape
    if 0 in lay.shape:
        raise ConvError(f"tf32x3 convolutions: empty operand {list(lay.shape)}")
    if n > 65535 or c > 65535 * 32 or h * w >= 2**31:
        raise ConvError(f"tf32x3 convolutions: operand {list(lay.shape)} is too large")
    return ((h * w + 31) // 32, (c + 31) // 32, n)


def channels_last(shape: tuple[int, ...]) -> Layout:
    """A packed channels-last float32 layout of an NCHW-indexed shape."""
    _, c, h, w = shape
    return Layout("f32", tuple(shape), (h * w * c, 1, w * c, c))


class _ChannelsLastSplit:
    """An operand's TF32 halves, channels-last, in buffers of the plan's own: ``hi`` and
    ``rest`` (the other two side by side along the channels, per group); refreshed from
    the operand on every call."""

    def __init__(self, lay: Layout, groups: int, swap: bool, alloc):
        n, c, h, w = lay.shape
        self.grid = _grid(lay)
        self.hi_layout = channels_last(lay.shape)
        self.rest_layout = channels_last((n, 2 * c, h, w))
        self.hi, self.rest = alloc(n * c * h * w * 4), alloc(n * c * h * w * 8)
        if (self.hi.data_ptr() | self.rest.data_ptr()) % 16:  # 16-byte writes
            raise ConvError("tf32x3 convolutions need 16-byte aligned buffers")
        self.src_span = span(lay)
        sn, sc, sh, sw = lay.strides
        # reads 16 bytes at a time from a source whose h, w are packed (and 16-byte aligned)
        self.packable = sw == 1 and sh == w and (h * w) % 4 == sc % 4 == sn % 4 == 0
        self.head = (
            _flat_f32(self.hi.data_ptr(), n * c * h * w),
            _flat_f32(self.rest.data_ptr(), 2 * n * c * h * w),
            *(np.int32(a) for a in (c, h, w, c // groups, int(swap))),
        )
        self.strides = tuple(np.int64(a) for a in lay.strides)
        self._src: tuple[int, tuple] | None = None  # the last source pointer, its arguments

    def run(self, src: int, stream: int) -> None:
        import cupy

        if self._src is None or self._src[0] != src:
            packed = np.int32(self.packable and src % 16 == 0)
            args = (_flat_f32(src, self.src_span), *self.head, packed, *self.strides)
            self._src = (src, args)
        with cupy.cuda.ExternalStream(stream):
            _nhwc_kernel("split_tf32_nhwc")(self.grid, (32, 8), self._src[1])


class SplitConvPlan:
    """A float32 convolution on TF32 tensor cores with float32-level accuracy (``tf32x3``):
    the operands are split into TF32 halves (channels-last, the tensor cores' layout) and
    two TF32 convolutions run, ``main = conv(x_hi, w_hi) [+ bias]`` and
    ``corr = conv([x_lo, x_hc], [w_hc, w_lo])`` (the two corrections as one convolution
    over twice the input channels), both into channels-last buffers; one kernel writes
    ``out = main + corr`` in ``out``'s layout. Products of TF32 values are exact and
    accumulate in float32.

    Why not one convolution over ``[x_hi, x_lo, x_hc]``: it measured eight times
    float32's error (3.9e-5 vs 4.7e-6, 8x64x56x56, 3x3), the two-convolution form 1.8x;
    consistent with the tensor cores' float32 accumulation truncating at each step and
    three times as many steps on the main sum (docs/decisions/0017).

    The same ``autotune``/``run`` interface as ``ConvPlan``; ``alloc(nbytes)`` gives device
    memory the plan keeps (the halves and the two results)."""

    def __init__(self, x, w, bias, out, p: ConvParams, stream: int, alloc):
        if x.dtype != "f32" or w.dtype != "f32":
            raise ConvError("tf32x3 convolutions are float32")
        if len(x.shape) != 4 or len(w.shape) != 4 or len(out.shape) != 4:
            raise ConvError("cuDNN plans here are 2-D convolutions (rank-4 operands)")
        self.stream = stream
        self.sx = _ChannelsLastSplit(x, p.groups, False, alloc)
        self.sw = _ChannelsLastSplit(w, 1, True, alloc)
        y = channels_last(out.shape)
        self.main = ConvPlan(
            self.sx.hi_layout, self.sw.hi_layout, bias, y, p, stream, tensor_cores=True
        )
        self.corr = ConvPlan(
            self.sx.rest_layout, self.sw.rest_layout, None, y, p, stream, tensor_cores=True
        )
        n, k, h, wd = out.shape
        self.y = [alloc(n * k * h * wd * 4) for _ in range(2)]  # main, corr
        self.grid = _grid(out)
        self.add_args = (
            *(_flat_f32(b.data_ptr(), n * k * h * wd) for b in self.y),
            *(np.int32(a) for a in (k, h, wd)),
            *(np.int64(a) for a in out.strides),
        )
        self.out_span = span(out)
        self._out: tuple[int, object] | None = None  # the last output pointer and its array
        self.workspace_size = max(self.main.workspace_size, self.corr.workspace_size)
        self.timings: dict[str, float] = {}  # ms per call: tf32x3 and, when chosen, fp32

    def _calls(self, ptrs: tuple[int, ...]) -> list[tuple[ConvPlan, tuple[int, ...]]]:
        sx, sw = self.sx, self.sw
        bias = ptrs[2:-1]
        return [
            (self.main, (sx.hi.data_ptr(), sw.hi.data_ptr(), *bias, self.y[0].data_ptr())),
            (self.corr, (sx.rest.data_ptr(), sw.rest.data_ptr(), self.y[1].data_ptr())),
        ]

    def autotune(self, ptrs: tuple[int, ...], workspace_for, candidates: int = 8) -> None:
        self.sx.run(ptrs[0], self.stream)
        self.sw.run(ptrs[1], self.stream)
        for plan, p in self._calls(ptrs):
            plan.autotune(p, workspace_for, candidates)
        self.workspace_size = max(self.main.workspace_size, self.corr.workspace_size)

    def run(self, ptrs: tuple[int, ...], workspace: int) -> None:
        """``ptrs``: x, w, [bias,] out."""
        import cupy

        self.sx.run(ptrs[0], self.stream)
        self.sw.run(ptrs[1], self.stream)
        for plan, p in self._calls(ptrs):
            plan.run(p, workspace)
        if self._out is None or self._out[0] != ptrs[-1]:
            self._out = (ptrs[-1], _flat_f32(ptrs[-1], self.out_span))
        a, b, *rest = self.add_args
        with cupy.cuda.ExternalStream(self.stream):
            _nhwc_kernel("add_nhwc")(self.grid, (32, 8), (a, b, self._out[1], *rest))


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
