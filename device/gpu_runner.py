"""The executor of a recipe on a GPU: an arena laid out by the memory plan, library plans,
and CUDA-graph replay.

Every kernel output lives at a fixed offset in one arena (``saturn.eqsat.memory``), so the
addresses a call uses are the same from call to call. The first call runs step by step (it
loads kernels and builds the nvmath and cuDNN plans for the layouts it sees). When replay is
on and the program is capturable (device steps only, no crossing other than the boundary
inputs), the second call captures the whole call's device work on saturn's stream as a CUDA
graph and later calls replay it: one launch. Inputs are read where they lie; an input that
arrives at a new address is staged: it gets a buffer of its own, the graph is captured once
more reading from there, and each later call copies the input into it before the replay.
An input whose shape or strides differ from the recipe's never reaches this point (the
recipe checks and packs inputs first). Outputs are copied out of the arena, because the next
call overwrites it.

Rule for replay (documented in docs/decisions/0013): on for recipes whose shapes are all
static, off when the option ``replay`` is False, when the program has host steps or
crossings, or when a capture saw the allocator hand out memory (the graph would then
write memory it does not own); each refusal is logged once with its reason.
"""

from __future__ import annotations

import logging
import threading

import torch

from saturn.codegen import cuda as cg
from saturn.codegen.conv import ConvError, ConvParams, ConvPlan, SplitConvPlan
from saturn.codegen.gemm import GemmPlan, Layout, time_on_stream
from saturn.codegen.reshape import gemm_copy_order
from saturn.eqsat.memory import plan_memory
from saturn.eqsat.program import Step

from .eager_kernels import cuda_driver as _driver
from .eager_kernels import strided_copy
from .host_ops import run_host
from .importer import DTYPES, TORCH_DTYPES
from .recipe import check_operands, const_tensor

log = logging.getLogger("saturn")


def layout(t: torch.Tensor) -> Layout:
    return Layout(DTYPES[t.dtype], tuple(t.shape), tuple(t.stride()))


class GpuRunner:
    # tf32x3 GEMMs are kept only where faster than float32 (tests turn the choice off)
    choose_precision = True
    gelu_epilogue = "timed"  # codegen.gemm.GELU_CHOICES; tests force one way

    def __init__(self, recipe, replay: bool = True, precision: str = "fp32"):
        self.r = recipe
        self.device = recipe.device
        self.precision = precision
        prog = recipe.program
        self.memory = plan_memory(prog)
        cc = torch.saturn.get_device_capability(self.device)
        self.stream = torch.saturn.stream_handle(self.device)
        self.custom: dict[str, tuple] = {}  # step -> (custom op, argument builder)
        with torch.saturn.device(self.device):
            self.kernels: dict[str, cg.CudaKernel] = {}
            for s in prog.steps:
                if s.kind == "kernel" and s.kernel.kind in ("loop", "reduce", "rows"):
                    self.kernels[s.output] = cg.CudaKernel(s.kernel, cc)
                elif s.kind == "kernel" and s.kernel.kind == "custom":
                    from .custom_ops import resolve

                    try:
                        self.custom[s.output] = resolve(s.kernel.attrs["name"], recipe.host_calls)
                    except RuntimeError as e:  # e.g. the built-in "rmsnorm" pattern's kernel
                        raise NotImplementedError(str(e)) from None
                elif s.kind == "kernel" and s.kernel.kind not in ("gemm", "conv"):
                    raise NotImplementedError(f"{s.kernel.kind} kernels have no GPU runner yet")
        # device memory is made at the first call: compilation runs under fake tensors
        self.arena: torch.Tensor | None = None
        self.buffers: dict[str, torch.Tensor] = {}
        self.consts: dict[str, torch.Tensor] = {}
        self.plans: dict[str, tuple[tuple, object]] = {}  # step -> (layout key, plan)
        self.workspaces: dict[str, torch.Tensor] = {}
        # reshapes that copy -> (their buffer, the source's axis order it was copied in)
        self.view_copies: dict[str, tuple[torch.Tensor, tuple[int, ...] | None]] = {}
        self.gemm_read = _read_only_by_gemms(prog)
        self._scratch: torch.Tensor | None = None
        why = self._not_capturable()
        self.replay = replay and why is None
        if replay and why:
            log.info("saturn: CUDA-graph replay off for this graph: %s", why)
        self.calls = 0
        self.exec_ = None  # the instantiated graph
        self.captured_outs: list[torch.Tensor] = []
        self.out_specs: list[tuple | None] = []  # _packed of each captured output
        self.captured_ptrs: tuple[int, ...] = ()  # input addresses the graph was captured with
        self.staged: dict[int, torch.Tensor] = {}  # inputs read from a buffer of their own
        self.captures = 0
        self.replays = 0
        self._ok = _driver().CUresult.CUDA_SUCCESS
        self.lock = threading.Lock()

    def _materialize(self) -> None:
        """The arena with every kernel output's view at its planned offset, and constants."""
        prog = self.r.program
        with torch.saturn.device(self.device):
            self.arena = torch.empty(
                max(self.memory.size, 1), dtype=torch.uint8, device=self.device
            )
            for v, slot in self.memory.slots.items():
                s = next(st for st in prog.steps if st.output == v)
                raw = self.arena[slot.offset : slot.offset + slot.nbytes]
                self.buffers[v] = raw.view(TORCH_DTYPES[s.dtype]).view(s.shape)
            self.consts = {
                s.output: const_tensor(s).to(self.device if s.place == "device" else "cpu")
                for s in prog.steps
                if s.kind == "const"
            }

    def _not_capturable(self) -> str | None:
        inputs = set(self.r._position)
        for s in self.r.program.steps:
            if s.kind == "host":
                return f"host step {s.op}"
            if s.kind == "crossing" and s.args[0] not in inputs:
                return f"a crossing ({s.op}) inside the graph"
            if s.kind == "crossing":
                return "inputs cross to the device on every call"
        return None

    # --- running steps -------------------------------------------------------------------

    def _steps(self, prepared: list[torch.Tensor], stats) -> dict:
        env: dict[str, object] = {}
        position = self.r._position
        for s in self.r.program.steps:
            if s.kind == "input":
                i = position[s.output]
                env[s.output] = self.staged.get(i, prepared[i])
            elif s.kind == "const":
                env[s.output] = self.consts[s.output]
            elif s.kind == "view":
                env[s.output] = self._view(s, env[s.args[0]])
            elif s.kind == "kernel":
                stats.launches += 1
                self._kernel(s, env)
                env[s.output] = self.buffers[s.output]
            else:  # crossings and host steps (never captured: see _not_capturable)
                env[s.output] = self.r._step(s, env, stats)
        return env

    def _view(self, s: Step, src: torch.Tensor) -> torch.Tensor:
        """A view step. A reshape that cannot view its source copies it: the first call
        keeps the buffer that copy made, and later calls copy into it again (a captured
        call must not allocate). A reshape only GEMMs read is copied in the order that
        keeps the source's fastest axis fastest where that makes the GEMM read a transposed
        matrix (``gemm_copy_order``): a row copy instead of a tiled transpose."""
        have = self.view_copies.get(s.output)
        if have is not None:
            (buf, out), order = have
            strided_copy(src if order is None else src.permute(order), buf)
            return out
        order = None
        if s.op == "View" and s.output in self.gemm_read and _on(src, self.device):
            order = gemm_copy_order(tuple(src.shape), src.stride(), tuple(s.attrs[0]))
        if order is not None:
            moved = src.permute(order)
            buf = torch.empty(moved.shape, dtype=src.dtype, device=self.device)
            strided_copy(moved, buf)
            inverse = sorted(range(len(order)), key=order.__getitem__)
            out = buf.permute(inverse).view(tuple(s.attrs[0]))
            self.view_copies[s.output] = ((buf, out), order)
            return out
        out = run_host(s.op, [src], s.attrs, {})
        if (
            isinstance(src, torch.Tensor)
            and src.device == self.device
            and out.numel()
            and out.untyped_storage().data_ptr() != src.untyped_storage().data_ptr()
        ):
            self.view_copies[s.output] = ((out.view(src.shape), out), None)
        return out

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

    def _kernel(self, s: Step, env: dict) -> None:
        k = s.kernel
        ops = [env[o.value] for o in k.inputs]
        out = self.buffers[s.output]
        check_operands(s, ops)
        if k.kind in ("loop", "reduce", "rows"):
            ops = [
                t if o.indexing == "strided" or t.is_contiguous() else t.contiguous()
                for o, t in zip(k.inputs, ops, strict=True)
            ]
            self.kernels[s.output].launch(
                self.stream,
                out.data_ptr(),
                [t.data_ptr() for t in ops],
                [tuple(t.shape) for t in ops],
                [tuple(t.stride()) for t in ops],
                workspace=lambda n: self._kernel_workspace(s.output, n),
            )
            return
        if k.kind == "custom":
            op, build = self.custom[s.output]
            op.run_into(out, build(ops, k.attrs["eps_bits"]))
            return
        key = tuple(layout(t) for t in ops)
        have = self.plans.get(s.output)
        ptrs = tuple(t.data_ptr() for t in ops)
        if k.kind == "gemm":
            if have is None or have[0] != key:
                bias = key[2] if len(key) == 3 else None
                plan = GemmPlan(
                    key[0],
                    key[1],
                    layout(out),
                    k.attrs["epilogue"],
                    bias,
                    (*ptrs[:2], out.data_ptr(), *ptrs[2:]),
                    self.stream,
                    self.precision,
                    alloc=lambda n: self._workspace(n, keep=False),
                    choose=self.choose_precision,
                    gelu=self.gelu_epilogue,
                )
                have = self.plans[s.output] = (key, plan)
            have[1].run((*ptrs[:2], out.data_ptr(), *ptrs[2:]))
            return
        # conv
        if have is None or have[0] != key:
            have = self.plans[s.output] = (key, self._conv_plan(k, key, (*ptrs, out.data_ptr())))
        have[1].run((*ptrs, out.data_ptr()), self.workspaces[s.output].data_ptr())

    def _conv_plan(self, k, key: tuple, ptrs: tuple[int, ...]):
        """The convolution's plan, tuned on this call's operands. With ``tf32x3`` the split
        plan is timed against the float32 one and kept only where faster (as for GEMMs)."""
        a = k.attrs
        x, w, bias = key[0], key[1], key[2] if a["bias"] else None
        out_lay = layout(self.buffers[k.output])
        params = ConvParams(
            tuple(a["stride"]), tuple(a["padding"]), tuple(a["dilation"]), a["groups"]
        )
        plan = ConvPlan(x, w, bias, out_lay, params, self.stream, self.precision == "tf32")
        plan.autotune(ptrs, self._workspace)
        self._scratch = None
        ws = self._workspace(plan.workspace_size, keep=False)
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
                sws = self._workspace(split.workspace_size, keep=False)
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
        self.workspaces[k.output] = ws
        return plan

    # --- a call ------------------------------------------------------------------------------

    def __call__(self, prepared: list[torch.Tensor], stats) -> list[torch.Tensor]:
        with self.lock:
            if self.arena is None:
                self._materialize()
            self.calls += 1
            if not self.replay or self.calls == 1:
                env = self._steps(prepared, stats)
                outs = [env[v] for v in self.r.program.outputs]
                # the arena is overwritten by the next call: hand out copies of its values
                return [self._copy_out(t) if self._in_arena(t) else t for t in outs]
            outs = self._replayed(prepared, stats)
            if outs is self.captured_outs:  # fixed memory: one device copy out each
                stats.replayed = True
                return [self._copy_out(t, p) for t, p in zip(outs, self.out_specs, strict=True)]
            return [self._copy_out(t) for t in outs]

    def _packed(self, t: torch.Tensor) -> tuple | None:
        """(shape, dtype, address, bytes) of a packed device tensor; None for anything else."""
        if t.device != self.device or not t.is_contiguous():
            return None
        return (t.shape, t.dtype, t.data_ptr(), t.numel() * t.element_size())

    def _copy_out(self, t: torch.Tensor, packed: tuple | None = None) -> torch.Tensor:
        """A fresh tensor with ``t``'s values: one asynchronous device copy when packed
        (``packed``: what ``_packed`` says of ``t``, when already known)."""
        packed = packed or self._packed(t)
        if packed is None:
            return t.clone()
        shape, dtype, src, nbytes = packed
        out = torch.empty(shape, dtype=dtype, device=self.device)
        if nbytes:
            (err,) = _driver().cuMemcpyDtoDAsync(out.data_ptr(), src, nbytes, self.stream)
            if err != self._ok:
                self._check((err,), "cuMemcpyDtoDAsync")
        return out

    def _in_arena(self, t: torch.Tensor) -> bool:
        return t.device == self.device and t.untyped_storage().data_ptr() == self.arena.data_ptr()

    def _replayed(self, prepared: list[torch.Tensor], stats) -> list[torch.Tensor]:
        drv = _driver()
        # size inputs (symbolic graphs) are fixed for this recipe: only tensors can move
        ptrs = tuple(t.data_ptr() if isinstance(t, torch.Tensor) else None for t in prepared)
        if self.exec_ is not None and self.captured_ptrs != ptrs:
            moved = [
                i
                for i, (a, b) in enumerate(zip(self.captured_ptrs, ptrs, strict=True))
                if a != b and i not in self.staged
            ]
            if moved:
                for i in moved:
                    self.staged[i] = torch.empty_like(prepared[i])
                self._release()  # capture again, reading the staged copies
        for i, buf in self.staged.items():
            buf.copy_(prepared[i])
        if self.exec_ is None:
            if not self._capture(prepared, stats):
                self.replay = False
                env = self._steps(prepared, stats)
                return [env[v] for v in self.r.program.outputs]
            self.captured_ptrs = ptrs
        (err,) = drv.cuGraphLaunch(self.exec_, self.stream)
        if err != self._ok:
            self._check((err,), "cuGraphLaunch")
        self.replays += 1
        stats.launches += 1
        return self.captured_outs

    def _release(self) -> None:
        drv = _driver()
        if self.exec_ is not None:
            drv.cuGraphExecDestroy(self.exec_)
        self.exec_, self.captured_outs, self.captured_ptrs = None, [], ()
        self.out_specs = []

    def _capture(self, prepared, stats) -> bool:
        """Capture one call's device work as a graph; False when it is not safe to replay."""
        drv = _driver()

        before = torch.saturn.memory_stats(self.device)
        mode = drv.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_THREAD_LOCAL
        self._check(drv.cuStreamBeginCapture(self.stream, mode), "cuStreamBeginCapture")
        try:
            env = self._steps(prepared, stats)
        finally:
            err, graph = drv.cuStreamEndCapture(self.stream)
        self._check((err,), "cuStreamEndCapture")
        after = torch.saturn.memory_stats(self.device)
        allocated = (after["hits"] + after["misses"]) - (before["hits"] + before["misses"])
        if allocated:
            log.warning(
                "saturn: CUDA-graph replay off for this graph: %d allocation(s) during capture",
                allocated,
            )
            drv.cuGraphDestroy(graph)
            return False
        err, exec_ = drv.cuGraphInstantiate(graph, 0)
        self._check((err,), "cuGraphInstantiate")
        drv.cuGraphDestroy(graph)
        self.captures += 1
        self.exec_ = exec_
        self.captured_outs = [env[v] for v in self.r.program.outputs]
        self.out_specs = [self._packed(t) for t in self.captured_outs]
        return True

    @staticmethod
    def _check(res, what: str) -> None:
        drv = _driver()
        err = res[0] if isinstance(res, tuple) else res
        if err != drv.CUresult.CUDA_SUCCESS:
            raise RuntimeError(f"saturn: {what} failed: {err}")


def _read_only_by_gemms(prog) -> set[str]:
    """View steps whose every reader is a GEMM (which takes any operand layout it can read
    as a matrix, so the view's buffer may be laid out for the copy's sake)."""
    readers: dict[str, list[Step]] = {}
    for s in prog.steps:
        args = [o.value for o in s.kernel.inputs] if s.kind == "kernel" else list(s.args)
        for a in args:
            readers.setdefault(a, []).append(s)
    outputs = set(prog.outputs)
    return {
        s.output
        for s in prog.steps
        if s.kind == "view"
        and s.output not in outputs
        and readers.get(s.output)
        and all(r.kind == "kernel" and r.kernel.kind == "gemm" for r in readers[s.output])
    }


def _on(t, device) -> bool:
    return isinstance(t, torch.Tensor) and t.device == device
