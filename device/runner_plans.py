"""The GPU runner's library plans (a mixin of ``GpuRunner``): nvmath/cuBLASLt matrix products
and cuDNN convolutions planned at the first call for the layouts it sees, custom ops'
operands, and the workspaces they share (one per runner, the largest any plan asked for).
"""

from __future__ import annotations

import logging

import torch

from saturn.codegen.conv import ConvError, ConvParams, ConvPlan, SplitConvPlan
from saturn.codegen.conv_grad import ConvGradPlan
from saturn.codegen.cublaslt import WORKSPACE_BYTES, LtPlan, offer_blas
from saturn.codegen.gemm import GemmError, GemmPlan, Layout, time_on_stream
from saturn.codegen.gemm_tuning import CONV_PLANS, alignment
from saturn.eqsat.kinds import Kind
from saturn.eqsat.optable import HALVES

from .dtypes import DTYPES
from .eager_kernels import strided_copy

log = logging.getLogger("saturn")


def layout(t: torch.Tensor) -> Layout:
    return Layout(DTYPES[t.dtype], tuple(t.shape), tuple(t.stride()))


def channels_last_view(t: torch.Tensor) -> torch.Tensor:
    """``t`` with PyTorch's channels-last strides where it is channels-last contiguous: the
    same memory, strides of size-1 axes made canonical (a packed [K, C, 1, 1] weight lies
    NHWC with NCHW strides; cuDNN reads a layout off the strides)."""
    if t.dim() != 4 or not t.is_contiguous(memory_format=torch.channels_last):
        return t
    _, c, h, w = t.shape
    return t.as_strided(t.shape, (h * w * c, 1, w * c, c))


class LibraryPlans:
    def _workspace(self, nbytes: int, keep: bool = True):
        """Scratch device memory for tuning (one buffer, grown as needed; its address) or,
        with ``keep=False``, a buffer of a plan's own (the tensor)."""
        if not keep:
            return torch.empty(max(nbytes, 1), dtype=torch.uint8, device=self.device)
        if self._scratch is None or self._scratch.numel() < nbytes:
            self._scratch = torch.empty(max(nbytes, 1), dtype=torch.uint8, device=self.device)
        return self._scratch.data_ptr()

    def _kernel_workspace(self, step: str, nbytes: int) -> int:
        """A kernel's own scratch memory (a split reduction's partials): made at the first
        call, at the same address in every later one (replay captures it)."""
        ws = self.workspaces.get(step)
        if ws is None or ws.numel() < nbytes:
            ws = self.workspaces[step] = self._workspace(nbytes, keep=False)
        return ws.data_ptr()

    def _custom_operands(self, step: str, op, ops: list[torch.Tensor]) -> list[torch.Tensor]:
        """A custom step's operands with those the op reads packed copied, where they are
        strided views, into buffers of the step's own: made at the first call (never
        captured), so a captured call copies without allocating."""
        want = op.packed_positions
        if not want:
            return ops
        bufs = self.custom_packs.setdefault(step, {})
        ops = list(ops)
        for i in want:
            t = ops[i]
            if t.is_contiguous():
                continue
            buf = bufs.get(i)
            if buf is None or buf.shape != t.shape or buf.dtype != t.dtype:
                buf = bufs[i] = torch.empty(t.shape, dtype=t.dtype, device=t.device)
            strided_copy(t, buf)
            ops[i] = buf
        return ops

    def _library_plan(self, k, key: tuple, out: torch.Tensor, ops: list[torch.Tensor]):
        """The product's or convolution's plan for the operands' layouts; where the library
        takes no plan for them (a layout cuBLASLt or cuDNN declines: a row stride it does
        not take, a misaligned slice), the plan for packed copies of the operands that are
        not packed, made at every call before the plan runs (the copies' buffers are the
        step's own, at fixed addresses, so replay captures them). A library that declines
        packed operands too raises: the call then runs uncompiled (decision 0050)."""
        self.packs.pop(k.output, None)

        def plan(operands):
            if nhwc:
                operands = [channels_last_view(t) for t in operands]
            ptrs = tuple(t.data_ptr() for t in operands)
            lays = tuple(layout(t) for t in operands)
            if k.kind == Kind.GEMM:
                return self._gemm_plan(k, lays, out, ptrs)
            return self._conv_plan(k, lays, (*ptrs, out.data_ptr()))

        # a channels-last convolution (eqsat/channels_last.py) takes NHWC memory as it lies
        nhwc = k.kind == Kind.CONV and k.attrs.get("channels_last", False)

        def dense(t: torch.Tensor) -> bool:
            return t.is_contiguous() or (
                nhwc and t.dim() == 4 and t.is_contiguous(memory_format=torch.channels_last)
            )

        def packed_copies() -> dict[int, torch.Tensor]:
            return {
                i: torch.empty(t.shape, dtype=t.dtype, device=t.device)
                for i, t in enumerate(ops)
                if not dense(t)
            }

        if k.kind in (Kind.CONV, Kind.CONV_GRAD):
            # cuDNN takes strided operands without complaint but, handed a convolution
            # backward's swapped weight (a permuted view), computed wrong values on the
            # H200: a convolution's operands are planned packed, never strided
            packs = packed_copies()
            if not packs:
                return plan(ops)
        else:
            try:
                return plan(ops)
            except GemmError as e:
                packs = packed_copies()
                if not packs:
                    raise
                log.info(
                    "saturn: %s %s: %s; planned on packed copies of operands %s",
                    k.kind,
                    k.output,
                    str(e).splitlines()[0][:200],
                    sorted(packs),
                )
        for i, buf in packs.items():
            strided_copy(ops[i], buf)
        made = plan([packs.get(i, t) for i, t in enumerate(ops)])
        self.packs[k.output] = packs
        return made

    def _gemm_plan(self, k, key: tuple, out: torch.Tensor, ptrs: tuple[int, ...]):
        """The product's plan, tuned on this call's operands. float16/bfloat16 products are
        cuBLASLt plans of their own (float32 accumulation, one rounding); they and cuBLAS's
        own choice where a product takes it share one workspace: they run one after
        another on the stream, and the workspace's fixed address is what replay captures."""
        bias = key[2] if len(key) == 3 else None
        args = (key[0], key[1], layout(out), k.attrs["epilogue"], bias)
        ptrs = (*ptrs[:2], out.data_ptr(), *ptrs[2:])
        if self._lt_workspace is None:
            self._lt_workspace = self._workspace(WORKSPACE_BYTES, keep=False)
        ws = (self._lt_workspace.data_ptr(), WORKSPACE_BYTES)
        if key[0].dtype in HALVES:
            return LtPlan(*args, ptrs, self.stream, ws)
        plan = GemmPlan(
            *args,
            ptrs,
            self.stream,
            self.precision,
            alloc=lambda n: self._workspace(n, keep=False),
            choose=self.choose_precision,
            gelu=self.gelu_epilogue,
        )
        offer_blas(plan, ptrs, ws)
        return plan

    def _conv_plan(self, k, key: tuple, ptrs: tuple[int, ...]):
        """The convolution's plan, tuned on this call's operands. With ``tf32x3`` the split
        plan is timed against the float32 one and kept only where faster (as for GEMMs)."""
        a = k.attrs
        if k.kind == Kind.CONV_GRAD:
            return self._conv_grad_plan(k, key, ptrs)
        x, w, bias = key[0], key[1], key[2] if a["bias"] else None
        out = self.buffers[k.output]
        if a.get("channels_last"):  # NHWC memory, handed to cuDNN with its NCHW extents
            out = out.permute(0, 3, 1, 2)
        out_lay = layout(out)
        params = ConvParams(
            tuple(a["stride"]), tuple(a["padding"]), tuple(a["dilation"]), a["groups"]
        )
        tf32 = self.precision == "tf32"
        problem = (Kind.CONV, x, w, bias, out_lay, params, tf32)
        plan = self._shared_conv(
            problem, ptrs, lambda: ConvPlan(x, w, bias, out_lay, params, self.stream, tf32)
        )
        ws = self._conv_workspace(plan.workspace_size)
        if self.precision == "tf32x3" and x.dtype == "f32":
            try:
                split = SplitConvPlan(
                    x, w, bias, out_lay, params, self.stream, lambda n: self._workspace(n, False)
                )
            except ConvError as e:
                log.info("saturn: convolution %s stays float32: %s", k.output, e)
                split = None
            if split is not None:
                split.autotune(ptrs, self._workspace)
                self._scratch = None
                sws = self._conv_workspace(split.workspace_size)
                split.timings = {
                    "tf32x3": time_on_stream(lambda: split.run(ptrs, sws.data_ptr()), self.stream)
                }
                if self.choose_precision:
                    split.timings["fp32"] = time_on_stream(
                        lambda: plan.run(ptrs, ws.data_ptr()), self.stream
                    )
                if not self.choose_precision or split.timings["tf32x3"] < split.timings["fp32"]:
                    plan, ws = split, sws
                else:
                    plan.timings = split.timings
        return self._keep_conv_workspace(k, plan, ws)

    def _conv_grad_plan(self, k, key: tuple, ptrs: tuple[int, ...]):
        """A convolution gradient's plan (cuDNN's backward-data or backward-filter), tuned
        on this call's operands, sharing the convolutions' workspace. ``tf32x3`` has no
        split form here: its gradients compute in float32."""
        a = k.attrs
        params = ConvParams(
            tuple(a["stride"]), tuple(a["padding"]), tuple(a["dilation"]), a["groups"]
        )
        out = layout(self.buffers[k.output])
        tf32 = self.precision == "tf32"
        problem = (Kind.CONV_GRAD, a["of"], key[0], key[1], out, params, tf32)
        plan = self._shared_conv(
            problem, ptrs, lambda: ConvGradPlan(a["of"], *key[:2], out, params, self.stream, tf32)
        )
        return self._keep_conv_workspace(k, plan, self._conv_workspace(plan.workspace_size))

    def _shared_conv(self, problem: tuple, ptrs: tuple[int, ...], make):
        """The cuDNN plan of ``problem`` on this stream for pointers aligned as ``ptrs``:
        one built and tuned on this call's operands, or the one another step of the process
        built for the same (``CONV_PLANS``, decision 0143)."""

        def built():
            plan = make()
            plan.autotune(ptrs, self._workspace)
            self._scratch = None
            return plan

        aligned = tuple(alignment(p) for p in ptrs)
        return CONV_PLANS.get_or_make((*problem, self.stream, aligned), built)

    def _keep_conv_workspace(self, k, plan, ws: torch.Tensor):
        """One buffer for every convolution step, grown as plans need more
        (``_share_conv_workspaces``); returns ``plan``."""
        if self._conv_ws is None or self._conv_ws.numel() < ws.numel():
            self._conv_ws = ws
        self.workspaces[k.output] = self._conv_ws
        self.conv_steps.add(k.output)
        return plan

    def _conv_workspace(self, nbytes: int) -> torch.Tensor:
        """The shared convolution workspace where it is large enough, else a new buffer."""
        if self._conv_ws is not None and self._conv_ws.numel() >= max(nbytes, 1):
            return self._conv_ws
        return self._workspace(nbytes, keep=False)

    def _share_conv_workspaces(self) -> None:
        """After the first call, which made every plan: every convolution step's workspace
        is the largest one. The steps run one after another on saturn's stream, so none
        reads scratch another wrote (the half products share one already); a buffer per
        step added up (ResNet-152 in float32 peaked at 8.5 GB on the H200, eager at 0.6 GB).
        During the first call the shared buffer grows as plans need more (steps planned
        before a growth keep the smaller one until now). This runs before replay captures,
        so the captured graph reads the shared buffer; a plan made later either fits it or
        takes the larger buffer it needs (the steps captured before keep theirs)."""
        for n in self.conv_steps:
            self.workspaces[n] = self._conv_ws
        self.conv_steps.clear()
